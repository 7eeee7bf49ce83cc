/* Several stage-1 workers behind one stage 0, end to end on the CPU with the tiny-a
 * checkpoint: two replicas through scripts/launch.sh, "one" with one stage-1 worker and
 * "two" with `replicas: 2` and a journal, and the tests talk HTTP to them:
 *   - 8 concurrent songs on "two" each equal, byte for byte, the same song from "one",
 *     and both workers rendered some of them (stage 0 logs each binding);
 *   - /metrics has both workers' series and the vLLM / vLLM-Omni names;
 *   - kill -9 of a worker while 4 songs (2 streamed, 2 whole-file) play loses none:
 *     each completes, equal to the song from "one"; the launcher restarts the worker,
 *     and a song after the kill succeeds.
 * Skips (77) without the golden directory or the programs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/http_client.h"
#include "support/test_replica.h"
#include "support/test_support.h"

#define N_SONGS 8
/* Streams and whole-file songs alternating; no more than one worker's max_num_seqs, so
 * the live worker takes all of them at once when the other dies. */
#define N_KILL_SONGS 4

struct fixture {
    char *tmp;
    char ckpt[1024];
    struct test_replica one, two;
    char journal[1200];
};

static const char *k_lyrics = "[verse]\\nhello world\\n[chorus]\\nsing with me\\n";

/* The CPU test deploy file with stage 1 given `replicas: workers` (caller frees). */
static char *deploy_with_workers(const char *ckpt, const char *journal_dir, int workers)
{
    /* Stage 0 waits up to 120 s for a song's next audio: under sanitizers a whole-file
     * song can wait that long behind streams in stage 1's deadline order, and a dead
     * worker is found by its process, not by this wait. */
    char *base = test_replica_cpu_deploy(ckpt, 1, 1, journal_dir, 16, 4, 300, 12000, 12000);
    if (!base) return NULL;
    const char *anchor = "  - stage_id: 1\n";
    char *at = strstr(base, anchor);
    char *text = NULL;
    if (at &&
        asprintf(&text, "%.*s%s    replicas: %d\n%s", (int)(at - base), base, anchor, workers, at + strlen(anchor)) < 0)
        text = NULL;
    free(base);
    return text;
}

static int group_setup(void **state)
{
    const char *g = test_golden_dir();
    if (!g) return 0;
    struct fixture *f = calloc(1, sizeof *f);
    snprintf(f->ckpt, sizeof f->ckpt, "%s/checkpoint", g);
    f->tmp = test_make_tmpdir("e2e-workers");
    snprintf(f->journal, sizeof f->journal, "%s/journal", f->tmp);
    mkdir(f->journal, 0755);
    char *one = deploy_with_workers(f->ckpt, NULL, 1), *two = deploy_with_workers(f->ckpt, f->journal, 2);
    int rc = one && two ? 0 : -1;
    if (rc == 0 && test_replica_start(&f->one, f->tmp, "one", "ew", one, NULL) < 0) {
        fprintf(stderr, "replica one did not start\n");
        rc = -1;
    }
    if (rc == 0 && test_replica_start(&f->two, f->tmp, "two", "ew", two, NULL) < 0) {
        fprintf(stderr, "replica two did not start\n");
        rc = -1;
    }
    free(one);
    free(two);
    *state = f;
    return rc;
}

/* Stop a replica; with two workers also check that worker 1 is gone. */
static int replica_stop(struct test_replica *r)
{
    pid_t w1 = test_replica_pid(r, "stage1-1.pid");
    int rc = test_replica_stop(r);
    if (rc == 0 && w1 > 0 && kill(w1, 0) == 0) rc = -3;
    return rc;
}

static int group_teardown(void **state)
{
    struct fixture *f = *state;
    if (!f) return 0;
    if (f->one.launcher) replica_stop(&f->one);
    if (f->two.launcher) replica_stop(&f->two);
    test_remove_tree(f->tmp);
    free(f->tmp);
    free(f);
    return 0;
}

enum song_kind { SONG_WHOLE, SONG_STREAM, SONG_STREAM_STALLS };

/* SONG_STREAM_STALLS accepts stalls: admission never prerolls it, so its audio comes from
 * the first window however slow the machine is. */
static void song_json(char *buf, size_t cap, int seed, double seconds, enum song_kind kind)
{
    snprintf(buf, cap,
             "{\"caption\":\"a bright synth pop song\",\"lyrics\":\"%s\",\"duration_s\":%g,\"seed\":%d,"
             "\"num_inference_steps\":2,\"stream\":%s,\"allow_stall\":%s}",
             k_lyrics, seconds, seed, kind != SONG_WHOLE ? "true" : "false",
             kind == SONG_STREAM_STALLS ? "true" : "false");
}

/* One request on its own thread; with kill_pid set the collector kills that process
 * once kill_after bytes arrived. */
struct song {
    const struct test_replica *r;
    char json[1024];
    struct test_collect body;
    struct http_client_response resp;
    int rc;
};

static void *song_run(void *arg)
{
    struct song *s = arg;
    s->rc = test_replica_post_stream(s->r, s->json, 600000, test_collect_body, &s->body, &s->resp);
    return NULL;
}

static void run_concurrently(struct song *s, int n)
{
    pthread_t t[N_SONGS];
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&t[i], NULL, song_run, &s[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

static void assert_complete(const struct song *s)
{
    assert_int_equal(s->rc, 0);
    if (s->resp.status != 200) fprintf(stderr, "%d: %.*s\n", s->resp.status, (int)s->body.len, (char *)s->body.buf);
    assert_int_equal(s->resp.status, 200);
    assert_true(s->resp.complete);
    assert_true(s->body.len > 44 + 4 * 1000);
}

static void song_free(struct song *s)
{
    free(s->body.buf);
    http_client_response_free(&s->resp);
}

/* Lines of the replica's log saying stage 0 bound a song to worker k. */
static int bindings(const struct test_replica *r, int k)
{
    char *log = test_replica_log(r), needle[64];
    snprintf(needle, sizeof needle, ": stage-1 worker %d\n", k);
    int n = 0;
    for (char *p = log; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    free(log);
    return n;
}

/* The metrics text of a replica (caller frees). */
static char *metrics_text(const struct test_replica *r)
{
    char url[256];
    snprintf(url, sizeof url, "%s/metrics", r->url);
    struct http_client_response resp;
    int rc =
        http_client_request(&(struct http_client_request){.url = url, .method = "GET", .timeout_ms = 10000}, &resp);
    char *text = rc == 0 && resp.status == 200 && resp.body ? strdup(resp.body) : NULL;
    http_client_response_free(&resp);
    return text;
}

static void test_songs_equal_one_worker(void **state)
{
    struct fixture *f = *state;
    if (!f) skip();
    static struct song one[N_SONGS], two[N_SONGS];
    memset(one, 0, sizeof one);
    memset(two, 0, sizeof two);
    for (int i = 0; i < N_SONGS; i++) {
        one[i].r = &f->one;
        two[i].r = &f->two;
        song_json(one[i].json, sizeof one[i].json, 31 + i, 2 + i % 3, i % 2 ? SONG_STREAM : SONG_WHOLE);
        memcpy(two[i].json, one[i].json, sizeof one[i].json);
    }
    run_concurrently(one, N_SONGS);
    run_concurrently(two, N_SONGS);
    for (int i = 0; i < N_SONGS; i++) {
        assert_complete(&one[i]);
        assert_complete(&two[i]);
        /* the whole answer, header included: the same request gets the same bytes */
        assert_int_equal(two[i].body.len, one[i].body.len);
        assert_memory_equal(two[i].body.buf, one[i].body.buf, one[i].body.len);
    }
    int w0 = bindings(&f->two, 0), w1 = bindings(&f->two, 1);
    printf("songs bound: worker 0 %d, worker 1 %d\n", w0, w1);
    assert_int_equal(w0 + w1, N_SONGS);
    /* Spread: the least loaded worker takes the next song. Songs run one after another
     * would tie at zero load and all go to worker 0, so both having some also shows the
     * 8 were in flight together. */
    assert_true(w0 >= 2 && w1 >= 2);
    assert_int_equal(bindings(&f->one, 0), 0); /* one worker: no binding to log */
    for (int i = 0; i < N_SONGS; i++) {
        song_free(&one[i]);
        song_free(&two[i]);
    }
}

static void test_metrics_name_workers(void **state)
{
    struct fixture *f = *state;
    if (!f) skip();
    char *m = metrics_text(&f->two);
    assert_non_null(m);
    assert_non_null(strstr(m, "\nmm3_stage1_workers 2\n"));
    assert_non_null(strstr(m, "\nmm3_stage1_worker_up{worker=\"0\"} 1\n"));
    assert_non_null(strstr(m, "\nmm3_stage1_worker_up{worker=\"1\"} 1\n"));
    assert_non_null(strstr(m, "\nmm3_stage1_worker_windows_queued{worker=\"1\"} "));
    assert_non_null(strstr(m, "\nvllm:num_requests_waiting 0\n"));
    assert_non_null(strstr(m, "\nvllm:num_requests_running 0\n"));
    assert_non_null(strstr(m, "\nvllm:kv_cache_usage_perc 0.000000\n"));
    assert_non_null(strstr(m, "\nvllm_omni:audio_ttfp_s_count "));
    assert_non_null(strstr(m, "\nvllm_omni:audio_rtf_bucket{le=\"+Inf\"} "));
    assert_non_null(strstr(m, "\nvllm_omni:audio_frames_total "));
    assert_null(strstr(m, "worker=\"2\""));
    free(m);
    m = metrics_text(&f->one);
    assert_non_null(m);
    assert_non_null(strstr(m, "\nmm3_stage1_workers 1\n"));
    free(m);
}

/* kill -9 of worker 1 while songs play on both: its songs are re-sent to worker 0
 * from the frame spool and every song, streamed or whole-file, completes, equal to the
 * one-worker song. */
static void test_kill_worker_loses_no_song(void **state)
{
    struct fixture *f = *state;
    if (!f) skip();
    static struct song ref[N_KILL_SONGS], cut[N_KILL_SONGS];
    memset(ref, 0, sizeof ref);
    memset(cut, 0, sizeof cut);
    for (int i = 0; i < N_KILL_SONGS; i++) {
        ref[i].r = &f->one;
        cut[i].r = &f->two;
        /* several windows; song 0, whose first audio triggers the kill, is never prerolled,
         * and song 2 is a counted stream that may preroll when the machine is slow */
        enum song_kind kind = i == 0 ? SONG_STREAM_STALLS : i == 2 ? SONG_STREAM : SONG_WHOLE;
        song_json(ref[i].json, sizeof ref[i].json, 51 + i, 20, kind);
        memcpy(cut[i].json, ref[i].json, sizeof ref[i].json);
    }
    run_concurrently(ref, N_KILL_SONGS);
    pid_t w1 = test_replica_pid(&f->two, "stage1-1.pid");
    assert_true(w1 > 0);
    /* The first stream to get audio kills worker 1 (by then all songs are bound). */
    for (int i = 0; i < N_KILL_SONGS; i++) {
        cut[i].body.kill_pid = i == 0 ? w1 : 0;
        cut[i].body.kill_after = 44 + 4096;
    }
    run_concurrently(cut, N_KILL_SONGS);
    assert_int_equal(cut[0].body.kill_pid, 0); /* it was killed mid-song */
    for (int i = 0; i < N_KILL_SONGS; i++) {
        assert_complete(&ref[i]);
        assert_complete(&cut[i]);
        assert_int_equal(cut[i].body.len, ref[i].body.len);
        assert_memory_equal(cut[i].body.buf, ref[i].body.buf, ref[i].body.len);
    }
    if (!test_replica_log_contains(&f->two, "stage-1 worker 1 lost") ||
        !test_replica_log_contains(&f->two, "re-sent to stage-1 worker 0 (was on 1)")) {
        char *log = test_replica_log(&f->two);
        fprintf(stderr, "%s\n", log ? log : "(no log)");
        free(log);
    }
    assert_true(test_replica_log_contains(&f->two, "stage-1 worker 1 lost"));
    assert_true(test_replica_log_contains(&f->two, "re-sent to stage-1 worker 0 (was on 1)"));
    /* the launcher restarts the worker; a new song succeeds meanwhile or after */
    struct song after = {.r = &f->two};
    song_json(after.json, sizeof after.json, 77, 2, SONG_WHOLE);
    song_run(&after);
    assert_complete(&after);
    song_free(&after);
    pid_t again = 0;
    for (int i = 0; i < 300 && (again <= 0 || again == w1); i++) {
        again = test_replica_pid(&f->two, "stage1-1.pid");
        if (again <= 0 || again == w1) test_sleep_ms(100);
    }
    assert_true(again > 0 && again != w1);
    assert_true(test_replica_log_contains(&f->two, "stage-1 worker 1 died"));
    for (int i = 0; i < N_KILL_SONGS; i++) {
        song_free(&ref[i]);
        song_free(&cut[i]);
    }
}

static void test_stop_leaves_nothing(void **state)
{
    struct fixture *f = *state;
    if (!f) skip();
    assert_int_equal(replica_stop(&f->two), 0);
    assert_int_equal(replica_stop(&f->one), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_songs_equal_one_worker),
        cmocka_unit_test(test_metrics_name_workers),
        cmocka_unit_test(test_kill_worker_loses_no_song),
        cmocka_unit_test(test_stop_leaves_nothing),
    };
    if (!test_golden_dir()) return 77;
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
