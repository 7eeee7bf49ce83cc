/* End to end on the CPU with the tiny-a checkpoint: scripts/launch.sh starts both
 * stages from a deploy file written here (unique MM3_SHM_PREFIX, port 0), and the
 * tests talk HTTP to it:
 *   - a song equals, byte for byte, the standalone pipeline (mm3-stage0 --frames-out
 *     then mm3-stage1 --frames), so its length is the crop rule's and its samples the
 *     reference's; streamed = whole; the same request twice = the same audio; 32 kHz;
 *   - 4 concurrent requests each equal their single-request result;
 *   - a prompt over 5000 tokens is a 400 naming the field;
 *   - a client that disconnects mid-stream cancels its request in both stages and
 *     frees its rows; a kill -9 of stage 1 mid-song fails that request, stage 0
 *     stays up, the launcher restarts stage 1, the next request works; with
 *     api.journal_dir set the song survives it (held, re-sent from the journal,
 *     the audio equal to the uninterrupted song's) and its journals end DONE;
 *   - streams past the real-time capacity preroll and then play the same audio;
 *   - async_chunk: false with raw (not pre-mixed) frames gives the same audio, and
 *     codec_streaming: false refuses stream: true;
 *   - a frozen stage 1 (SIGSTOP) makes /health/ready 503 within 10 s while
 *     /health/live stays 200, and ready again after SIGCONT;
 *   - SIGTERM to the launcher stops both stages and leaves no segment.
 * Skips (77) without the golden directory or the programs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/http_client.h"
#include "stage0/recovery/journal.h"
#include "support/test_replica.h"
#include "support/test_support.h"

struct e2e {
    char *tmp;
    char ckpt[1024];
    struct test_replica a;
    uint8_t *ref; /* data bytes of the standalone pipeline's song (seed 5, 3 s, 2 steps) */
    size_t ref_len;
};

/* The deploy file of a replica with these settings (caller frees), or NULL. */
static char *deploy_text(const char *ckpt, int async_chunk, int codec_streaming, const char *journal_dir)
{
    return test_replica_cpu_deploy(ckpt, async_chunk, codec_streaming, journal_dir, 8, 4, 120, 6000, 3000);
}

/* Start a replica on the deploy file of these settings; 0 once it printed READY. */
static int replica_start_journal(struct test_replica *r, const char *tmp, const char *tag, const char *ckpt,
                                 int async_chunk, int codec_streaming, int raw_frames, const char *journal_dir)
{
    char *yaml = deploy_text(ckpt, async_chunk, codec_streaming, journal_dir);
    const char *env[] = {"MM3_STAGE0_RAW_FRAMES", raw_frames ? "1" : NULL, NULL};
    int rc = yaml ? test_replica_start(r, tmp, tag, "e2e", yaml, env) : -1;
    free(yaml);
    return rc;
}

static int replica_start(struct test_replica *r, const char *tmp, const char *tag, const char *ckpt, int async_chunk,
                         int codec_streaming, int raw_frames)
{
    return replica_start_journal(r, tmp, tag, ckpt, async_chunk, codec_streaming, raw_frames, NULL);
}

static int post(const struct test_replica *r, const char *json, struct http_client_response *resp)
{
    return test_replica_post(r, json, 120000, resp);
}

static char *get_text(const struct test_replica *r, const char *path, int *status)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", r->url, path);
    struct http_client_response resp;
    int rc =
        http_client_request(&(struct http_client_request){.url = url, .method = "GET", .timeout_ms = 10000}, &resp);
    char *body = NULL;
    *status = rc < 0 ? -1 : resp.status;
    if (rc == 0 && resp.body) body = strdup(resp.body);
    http_client_response_free(&resp);
    return body;
}

/* Value of a metric line "name value" (exact name incl. labels), -1 if absent. */
static double metric(const struct test_replica *r, const char *name)
{
    int st;
    char *m = get_text(r, "/metrics", &st);
    double v = -1;
    size_t n = strlen(name);
    for (char *l = m; l && *l;) {
        if (!strncmp(l, name, n) && l[n] == ' ') {
            v = atof(l + n + 1);
            break;
        }
        char *nl = strchr(l, '\n');
        l = nl ? nl + 1 : NULL;
    }
    free(m);
    return v;
}

struct wav {
    int channels, rate, bits;
    const uint8_t *data;
    size_t data_len;
};

static uint32_t le32(const uint8_t *p)
{
    return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Canonical 44-byte header (whole: sizes set; streamed: 0xFFFFFFFF). */
static int wav_parse(const uint8_t *b, size_t n, struct wav *w)
{
    if (n < 44 || memcmp(b, "RIFF", 4) || memcmp(b + 8, "WAVE", 4) || memcmp(b + 36, "data", 4)) return -1;
    w->channels = b[22] | b[23] << 8;
    w->rate = (int)le32(b + 24);
    w->bits = b[34] | b[35] << 8;
    w->data = b + 44;
    w->data_len = n - 44;
    uint32_t ds = le32(b + 40);
    if (ds != 0xFFFFFFFFu && ds != w->data_len) return -1;
    return 0;
}

/* Whole answer of a request; asserts 200 and a complete body. */
static void generate(const struct test_replica *r, const char *json, struct http_client_response *resp)
{
    assert_int_equal(post(r, json, resp), 0);
    if (resp->status != 200) fprintf(stderr, "%d: %s\n", resp->status, resp->body ? resp->body : "");
    assert_int_equal(resp->status, 200);
    assert_true(resp->complete);
}

static void check_song(const struct http_client_response *resp, int rate, struct wav *w)
{
    assert_int_equal(wav_parse((const uint8_t *)resp->body, resp->body_len, w), 0);
    assert_int_equal(w->channels, 2);
    assert_int_equal(w->rate, rate);
    assert_int_equal(w->bits, 16);
    assert_true(w->data_len > 0 && w->data_len % 4 == 0);
    /* not silent (16-bit samples are inside [-1, 1] by construction) */
    const int16_t *s = (const int16_t *)w->data;
    int loud = 0;
    for (size_t i = 0; i < w->data_len / 2; i++)
        if (s[i] > 64 || s[i] < -64) loud++;
    assert_true(loud > 100);
}

static const char *k_lyrics = "[verse]\\nhello world\\n[chorus]\\nsing with me\\n";
static const char *k_lyrics_raw = "[verse]\nhello world\n[chorus]\nsing with me\n";

static int group_setup(void **state)
{
    const char *g = test_golden_dir();
    if (!g) return 0;
    struct e2e *e = calloc(1, sizeof *e);
    snprintf(e->ckpt, sizeof e->ckpt, "%s/checkpoint", g);
    e->tmp = test_make_tmpdir("e2e");
    /* The reference song through the standalone programs. */
    char cmd[8192], ly[1200], wav[1200];
    snprintf(ly, sizeof ly, "%s/lyrics.txt", e->tmp);
    snprintf(wav, sizeof wav, "%s/ref.wav", e->tmp);
    FILE *f = fopen(ly, "w");
    fputs(k_lyrics_raw, f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "'%s/mm3-stage0' --model '%s' --caption 'a bright synth pop song' --lyrics-file '%s' --duration 3 "
             "--seed 5 --frames-out '%s/ref.st' 2>/dev/null && "
             "'%s/mm3-stage1' --model '%s' --frames '%s/ref.st' --seed 5 --steps 2 --guidance 1.7 -o '%s' 2>/dev/null",
             test_bin_dir(), e->ckpt, ly, e->tmp, test_bin_dir(), e->ckpt, e->tmp, wav);
    if (system(cmd) != 0) {
        fprintf(stderr, "standalone reference failed: %s\n", cmd);
        return -1;
    }
    size_t n;
    char *b = test_file_read(wav, &n);
    struct wav w;
    if (!b || wav_parse((uint8_t *)b, n, &w) < 0) return -1;
    e->ref = malloc(w.data_len);
    memcpy(e->ref, w.data, w.data_len);
    e->ref_len = w.data_len;
    free(b);
    if (replica_start(&e->a, e->tmp, "a", e->ckpt, 1, 1, 0) < 0) {
        fprintf(stderr, "replica a did not start\n");
        return -1;
    }
    *state = e;
    return 0;
}

static int group_teardown(void **state)
{
    struct e2e *e = *state;
    if (!e) return 0;
    if (e->a.launcher) test_replica_stop(&e->a);
    test_remove_tree(e->tmp);
    free(e->tmp);
    free(e->ref);
    free(e);
    return 0;
}

static void song_json(char *buf, size_t cap, int seed, double seconds, int stream, int rate)
{
    snprintf(buf, cap,
             "{\"caption\":\"a bright synth pop song\",\"lyrics\":\"%s\",\"duration_s\":%g,\"seed\":%d,"
             "\"num_inference_steps\":2,\"stream\":%s,\"sample_rate\":%d}",
             k_lyrics, seconds, seed, stream ? "true" : "false", rate);
}

static void test_song_equals_standalone(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    char json[1024];
    struct http_client_response whole, streamed, again;
    struct wav w1, w2, w3;
    song_json(json, sizeof json, 5, 3, 0, 44100);
    generate(&e->a, json, &whole);
    check_song(&whole, 44100, &w1);
    assert_int_equal(w1.data_len, e->ref_len);
    assert_memory_equal(w1.data, e->ref, e->ref_len);
    song_json(json, sizeof json, 5, 3, 1, 44100);
    generate(&e->a, json, &streamed);
    assert_true(streamed.chunked);
    check_song(&streamed, 44100, &w2);
    assert_int_equal(w2.data_len, e->ref_len);
    assert_memory_equal(w2.data, e->ref, e->ref_len);
    song_json(json, sizeof json, 5, 3, 0, 44100);
    generate(&e->a, json, &again);
    check_song(&again, 44100, &w3);
    assert_int_equal(w3.data_len, w1.data_len);
    assert_memory_equal(w3.data, w1.data, w1.data_len);
    /* 32 kHz: the resampled song, 320/441 as long */
    struct http_client_response r32;
    struct wav w4;
    song_json(json, sizeof json, 5, 3, 0, 32000);
    generate(&e->a, json, &r32);
    check_song(&r32, 32000, &w4);
    double want = (double)(w1.data_len / 4) * 320.0 / 441.0, got = (double)(w4.data_len / 4);
    assert_true(got > want - 2 && got < want + 2);
    /* stage 1's fp16 rerun count reaches /metrics with each song's end (none on the CPU) */
    assert_true(metric(&e->a, "mm3_stage1_fp16_rescues") == 0);
    http_client_response_free(&whole);
    http_client_response_free(&streamed);
    http_client_response_free(&again);
    http_client_response_free(&r32);
}

/* A request with flow_shift 2.5 is the standalone render of the same frames with --shift 2.5,
 * byte for byte, and not the unshifted song. */
static void test_flow_shift_equals_standalone(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    char cmd[4096], wav[1200];
    snprintf(wav, sizeof wav, "%s/ref-shift.wav", e->tmp);
    snprintf(cmd, sizeof cmd,
             "'%s/mm3-stage1' --model '%s' --frames '%s/ref.st' --seed 5 --steps 2 --guidance 1.7 --shift 2.5 "
             "-o '%s' 2>/dev/null",
             test_bin_dir(), e->ckpt, e->tmp, wav);
    assert_int_equal(system(cmd), 0);
    size_t n;
    char *b = test_file_read(wav, &n);
    struct wav ref, w;
    assert_non_null(b);
    assert_int_equal(wav_parse((uint8_t *)b, n, &ref), 0);
    char json[1024];
    snprintf(json, sizeof json,
             "{\"caption\":\"a bright synth pop song\",\"lyrics\":\"%s\",\"duration_s\":3,\"seed\":5,"
             "\"num_inference_steps\":2,\"flow_shift\":2.5}",
             k_lyrics);
    struct http_client_response resp;
    generate(&e->a, json, &resp);
    check_song(&resp, 44100, &w);
    assert_int_equal(w.data_len, ref.data_len);
    assert_memory_equal(w.data, ref.data, ref.data_len);
    assert_int_equal(w.data_len, e->ref_len);
    assert_true(memcmp(w.data, e->ref, e->ref_len) != 0);
    http_client_response_free(&resp);
    free(b);
}

struct conc {
    const struct test_replica *r;
    char json[1024];
    struct http_client_response resp;
    int rc;
};

static void *conc_run(void *arg)
{
    struct conc *c = arg;
    c->rc = post(c->r, c->json, &c->resp);
    return NULL;
}

/* Each request of c[0..n) (at most 4) alone on `ref`, one after another, then all at once on
 * their own replicas (c[i].r): every concurrent answer equals its single one byte for byte. */
static void concurrent_equals_single(const struct test_replica *ref, struct conc *c, int n)
{
    struct http_client_response single[4];
    pthread_t t[4];
    assert_true(n <= 4);
    for (int i = 0; i < n; i++)
        generate(ref, c[i].json, &single[i]);
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, conc_run, &c[i]);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < n; i++) {
        assert_int_equal(c[i].rc, 0);
        assert_int_equal(c[i].resp.status, 200);
        assert_true(c[i].resp.complete);
        struct wav a, b;
        check_song(&single[i], 44100, &a);
        check_song(&c[i].resp, 44100, &b);
        assert_int_equal(a.data_len, b.data_len);
        assert_memory_equal(a.data, b.data, a.data_len);
        http_client_response_free(&single[i]);
        http_client_response_free(&c[i].resp);
    }
}

static void test_concurrent_equal_single(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    struct conc c[4];
    for (int i = 0; i < 4; i++) {
        c[i].r = &e->a;
        song_json(c[i].json, sizeof c[i].json, 11 + i, 2 + i, i % 2, 44100);
    }
    concurrent_equals_single(&e->a, c, 4);
}

static void test_prompt_too_long(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    /* Digits are one token each: 8000 characters, under the 20000-character limit. */
    size_t n = 8000;
    char *json = malloc(n + 256);
    int k = sprintf(json, "{\"caption\":\"pop\",\"lyrics\":\"");
    for (size_t i = 0; i < n; i++)
        json[k++] = (char)('0' + i % 10);
    sprintf(json + k, "\",\"duration_s\":2}");
    struct http_client_response resp;
    assert_int_equal(post(&e->a, json, &resp), 0);
    assert_int_equal(resp.status, 400);
    assert_non_null(resp.body);
    assert_non_null(strstr(resp.body, "lyrics"));
    assert_non_null(strstr(resp.body, "5000"));
    http_client_response_free(&resp);
    free(json);
}

struct abort_ctx {
    size_t got;
    pid_t kill_pid; /* > 0: kill -9 it at the first audio bytes, keep reading */
};

static int abort_on_body(void *user, const void *data, size_t n)
{
    (void)data;
    struct abort_ctx *a = user;
    a->got += n;
    if (a->got <= 44) return 0; /* the header alone may come before audio */
    if (a->kill_pid > 0) {
        kill(a->kill_pid, SIGKILL);
        a->kill_pid = 0;
        return 0;
    }
    return a->kill_pid == 0 ? 0 : -ECONNABORTED;
}

static void short_song_works(const struct test_replica *r)
{
    char json[1024];
    struct http_client_response resp;
    struct wav w;
    song_json(json, sizeof json, 3, 2, 0, 44100);
    generate(r, json, &resp);
    check_song(&resp, 44100, &w);
    http_client_response_free(&resp);
}

static void test_client_disconnect_cancels(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    double before = metric(&e->a, "mm3_requests_total{outcome=\"cancelled\"}");
    char json[1024];
    song_json(json, sizeof json, 21, 40, 1, 44100);
    struct abort_ctx a = {0, -1}; /* -1: abort at the first audio */
    struct http_client_response resp;
    test_replica_post_stream(&e->a, json, 60000, abort_on_body, &a, &resp);
    http_client_response_free(&resp);
    assert_true(a.got > 44);
    int ok = 0;
    for (int i = 0; i < 600 && !ok; i++) { /* generous: sanitizer builds are slow */
        ok = metric(&e->a, "mm3_requests_total{outcome=\"cancelled\"}") > before &&
             metric(&e->a, "mm3_active_rows") == 0 &&
             test_replica_log_contains(&e->a, "client went away; cancelled in both stages") &&
             (test_replica_log_contains(&e->a, "cancelled by stage 0; freeing it") ||
              test_replica_log_contains(&e->a, "stage 0 cancelled it"));
        if (!ok) test_sleep_ms(100);
    }
    assert_true(ok);
    short_song_works(&e->a); /* rows are free again */
}

static void test_stage1_killed_mid_song(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    pid_t s1 = test_replica_pid(&e->a, "stage1.pid");
    assert_true(s1 > 0);
    char json[1024];
    song_json(json, sizeof json, 22, 40, 1, 44100);
    struct abort_ctx a = {0, s1};
    struct http_client_response resp;
    int rc = test_replica_post_stream(&e->a, json, 60000, abort_on_body, &a, &resp);
    assert_int_equal(a.kill_pid, 0); /* it was killed mid-song */
    assert_true(rc < 0 || resp.status != 200 || !resp.complete);
    http_client_response_free(&resp);
    /* stage 0 is still there and says so; the launcher brings stage 1 back */
    int st, back = 0;
    char *h = get_text(&e->a, "/health", &st);
    assert_non_null(h);
    assert_non_null(strstr(h, "\"stage0\":{\"state\":\"ready\""));
    free(h);
    for (int i = 0; i < 300 && test_replica_pid(&e->a, "stage1.pid") == s1; i++)
        test_sleep_ms(100);
    assert_true(test_replica_pid(&e->a, "stage1.pid") != s1);
    for (int i = 0; i < 300 && !back; i++) {
        h = get_text(&e->a, "/health", &st);
        back = st == 200 && h && strstr(h, "\"stage1\":{\"state\":\"ready\"");
        free(h);
        if (!back) test_sleep_ms(100);
    }
    assert_true(back);
    assert_true(test_replica_log_contains(&e->a, "stage 1 died mid-song"));
    short_song_works(&e->a);
}

/* Polls path every 100 ms for up to limit_s: 1 once its status is `want` (and the body
 * holds needle, when given), 0 at the limit. */
static int status_within(const struct test_replica *r, const char *path, int want, const char *needle, double limit_s)
{
    for (int i = 0; i <= (int)(limit_s * 10); i++) {
        int st;
        char *b = get_text(r, path, &st);
        int ok = st == want && (!needle || (b && strstr(b, needle)));
        free(b);
        if (ok) return 1;
        test_sleep_ms(100);
    }
    return 0;
}

/* A frozen stage 1 (SIGSTOP) makes the replica not ready within 10 s, through the
 * heartbeat over the ring, while liveness stays 200; SIGCONT makes it ready again. */
static void test_stage1_frozen_not_ready(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    assert_true(status_within(&e->a, "/health/ready", 200, NULL, 30));
    pid_t s1 = test_replica_pid(&e->a, "stage1.pid");
    assert_true(s1 > 0);
    assert_int_equal(kill(s1, SIGSTOP), 0);
    int not_ready = status_within(&e->a, "/health/ready", 503, "no heartbeat", 10);
    int health_too = status_within(&e->a, "/health", 503, NULL, 1);
    int live = status_within(&e->a, "/health/live", 200, "\"live\":true", 1);
    kill(s1, SIGCONT); /* before any assertion: a stopped stage 1 would hold the teardown */
    assert_true(not_ready);
    assert_true(health_too);
    assert_true(live);
    assert_true(status_within(&e->a, "/health/ready", 200, "\"stage1\":{\"state\":\"ready\"", 10));
    assert_int_equal(test_replica_pid(&e->a, "stage1.pid"), s1); /* the same process, not a restart */
    short_song_works(&e->a);
}

static int stream_song(const struct test_replica *r, const char *json, struct test_collect *c)
{
    struct http_client_response resp;
    int rc = test_replica_post_stream(r, json, 120000, test_collect_body, c, &resp);
    int ok = rc == 0 && resp.status == 200 && resp.complete;
    http_client_response_free(&resp);
    return ok ? 0 : -1;
}

/* Count the journals of dir by end status. */
static void journal_counts(const char *dir, int *done, int *other)
{
    *done = *other = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strstr(de->d_name, JOURNAL_SUFFIX)) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct journal_record rec;
        if (journal_read(path, &rec) < 0) {
            (*other)++;
            continue;
        }
        if (rec.status == JOURNAL_DONE && rec.n_steps == rec.n_frames + 1)
            (*done)++;
        else
            (*other)++;
        journal_record_free(&rec);
    }
    closedir(d);
}

/* With api.journal_dir set a kill -9 of stage 1 mid-song does not fail the song:
 * stage 0 holds it, the launcher restarts stage 1, the journaled frames are re-sent
 * (teacher forcing), the PCM the client already has is skipped, and the client gets
 * the song complete, equal to the uninterrupted one; both journals end DONE. */
static void test_stage1_killed_song_completes(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    struct test_replica b;
    char jdir[1200];
    snprintf(jdir, sizeof jdir, "%s/journal", e->tmp);
    mkdir(jdir, 0755);
    assert_int_equal(replica_start_journal(&b, e->tmp, "j", e->ckpt, 1, 1, 0, jdir), 0);
    char json[1024];
    song_json(json, sizeof json, 24, 12, 1, 44100);
    struct test_collect whole = {0}, cut = {0};
    assert_int_equal(stream_song(&b, json, &whole), 0);
    assert_true(whole.len > 44 + 4 * 44100);
    pid_t s1 = test_replica_pid(&b, "stage1.pid");
    assert_true(s1 > 0);
    cut.kill_pid = s1;
    cut.kill_after = 44 + 4096; /* mid-song: some audio delivered, most not */
    int rc = stream_song(&b, json, &cut);
    assert_int_equal(cut.kill_pid, 0); /* it was killed mid-song */
    assert_int_equal(rc, 0);
    assert_true(test_replica_log_contains(&b, "journaled, waiting up to"));
    assert_true(test_replica_log_contains(&b, "stage 1 is back: re-sent"));
    assert_true(test_replica_log_contains(&b, "from the frame spool"));
    assert_int_equal(cut.len, whole.len);
    /* The frames go out again from the spool as first sent: the same song to the bit. */
    size_t diff = 0;
    int maxd = 0;
    for (size_t i = 44; i + 1 < whole.len; i += 2) {
        int16_t a = (int16_t)(whole.buf[i] | whole.buf[i + 1] << 8), c = (int16_t)(cut.buf[i] | cut.buf[i + 1] << 8);
        int d = a > c ? a - c : c - a;
        if (d) diff++;
        if (d > maxd) maxd = d;
    }
    printf("interrupted vs whole: %zu of %zu samples differ, max %d\n", diff, (whole.len - 44) / 2, maxd);
    assert_memory_equal(cut.buf, whole.buf, 44);
    assert_int_equal(maxd, 0);
    int done = 0, other = 0;
    for (int i = 0; i < 100 && done < 2; i++) {
        journal_counts(jdir, &done, &other);
        if (done < 2) test_sleep_ms(100);
    }
    assert_int_equal(done, 2);
    assert_int_equal(other, 0);
    free(whole.buf);
    free(cut.buf);
    assert_int_equal(test_replica_stop(&b), 0);
}

/* async_chunk: false + raw frames: the same song; codec_streaming: false refuses streams. */
static void test_held_raw_frames_same_audio(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    struct test_replica b;
    assert_int_equal(replica_start(&b, e->tmp, "b", e->ckpt, 0, 0, 1), 0);
    char json[1024];
    struct http_client_response resp;
    struct wav w;
    song_json(json, sizeof json, 5, 3, 0, 44100);
    generate(&b, json, &resp);
    check_song(&resp, 44100, &w);
    assert_int_equal(w.data_len, e->ref_len);
    assert_memory_equal(w.data, e->ref, e->ref_len);
    http_client_response_free(&resp);
    song_json(json, sizeof json, 5, 3, 1, 44100);
    assert_int_equal(post(&b, json, &resp), 0);
    assert_int_equal(resp.status, 400);
    assert_non_null(strstr(resp.body, "stream"));
    http_client_response_free(&resp);
    assert_true(test_replica_log_contains(&b, "MM3_STAGE0_RAW_FRAMES=1"));
    assert_int_equal(test_replica_stop(&b), 0);
}

/* api.stream_capacity_share so small that no second stream fits: three streams started
 * together all preroll (their audio kept in stage 0) until they are complete, the first
 * too (alone at START, it is judged at its first audio, when the others have come); every
 * song still equals its single-request result byte for byte, and the metrics and log say
 * so. A stream alone from START to its first audio plays at once. */
static void test_prerolled_streams_same_audio(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    char *yaml = deploy_text(e->ckpt, 1, 1, NULL), *with = NULL;
    assert_non_null(yaml);
    char *api = strstr(yaml, "api:\n");
    assert_non_null(api);
    assert_true(asprintf(&with, "%.*sapi:\n  stream_capacity_share: 0.001\n%s", (int)(api - yaml), yaml,
                         api + strlen("api:\n")) > 0);
    struct test_replica b;
    assert_int_equal(test_replica_start(&b, e->tmp, "preroll", "e2e", with, NULL), 0);
    free(yaml);
    free(with);
    struct conc c[3];
    for (int i = 0; i < 3; i++) {
        c[i].r = &b;
        song_json(c[i].json, sizeof c[i].json, 21 + i, 3, 1, 44100);
    }
    concurrent_equals_single(&e->a, c, 3);
    assert_true(metric(&b, "mm3_streams_prerolled_total") == 3);
    assert_true(metric(&b, "mm3_streams_prerolling") == 0);
    assert_true(test_replica_log_contains(&b, "job 1: stream prerolls"));
    assert_true(test_replica_log_contains(&b, "stream plays after prerolling"));
    char json[1024];
    song_json(json, sizeof json, 24, 3, 1, 44100);
    struct test_collect alone = {0}, ref = {0};
    assert_int_equal(stream_song(&b, json, &alone), 0);
    assert_int_equal(stream_song(&e->a, json, &ref), 0);
    assert_true(metric(&b, "mm3_streams_prerolled_total") == 3);
    assert_int_equal(alone.len, ref.len);
    assert_memory_equal(alone.buf, ref.buf, ref.len);
    free(alone.buf);
    free(ref.buf);
    assert_int_equal(test_replica_stop(&b), 0);
}

struct inflight {
    const struct test_replica *r;
    char json[1024];
    int rc;
    struct http_client_response resp;
};

static void *inflight_run(void *p)
{
    struct inflight *f = p;
    f->rc = post(f->r, f->json, &f->resp);
    return NULL;
}

/* A whole-file song in flight at SIGTERM is answered: the song (it finished
 * within api.drain_timeout_s) or 503 "server shutting down", never an empty reply. */
static void test_sigterm_stops_everything(void **state)
{
    struct e2e *e = *state;
    if (!e) skip();
    struct inflight f = {.r = &e->a};
    song_json(f.json, sizeof f.json, 25, 40, 0, 44100);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, inflight_run, &f), 0);
    int running = 0;
    for (int i = 0; i < 600 && !running; i++) { /* generous: sanitizer builds are slow */
        running = metric(&e->a, "mm3_requests_in_flight") > 0;
        if (!running) test_sleep_ms(50);
    }
    assert_true(running);
    assert_int_equal(test_replica_stop(&e->a), 0);
    pthread_join(t, NULL);
    if (f.rc < 0) fail_msg("the song in flight got no answer: %s", mm3_last_error());
    if (f.resp.status == 503) {
        assert_non_null(strstr(f.resp.body, "server shutting down"));
    } else {
        assert_int_equal(f.resp.status, 200);
        assert_true(f.resp.complete);
    }
    assert_true(test_replica_log_contains(&e->a, "http: draining"));
    http_client_response_free(&f.resp);
}

int main(void)
{
    if (!test_golden_dir()) return 77;
    char p[1200];
    snprintf(p, sizeof p, "%s/mm3-stage1", test_bin_dir());
    if (access(p, X_OK) != 0) return 77;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_song_equals_standalone),
        cmocka_unit_test(test_flow_shift_equals_standalone),
        cmocka_unit_test(test_concurrent_equal_single),
        cmocka_unit_test(test_prompt_too_long),
        cmocka_unit_test(test_client_disconnect_cancels),
        cmocka_unit_test(test_stage1_killed_mid_song),
        cmocka_unit_test(test_stage1_frozen_not_ready),
        cmocka_unit_test(test_stage1_killed_song_completes),
        cmocka_unit_test(test_held_raw_frames_same_audio),
        cmocka_unit_test(test_prerolled_streams_same_audio),
        cmocka_unit_test(test_sigterm_stops_everything),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
