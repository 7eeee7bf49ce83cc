/* Two replicas behind a real nginx, end to end on the CPU with the tiny-a checkpoint.
 * Each replica is a whole mm3 pair started by scripts/launch.sh (its own port, shared-
 * memory prefix and journal); nginx runs as the test's user with the configuration
 * made from the shipped deploy/nginx/mm3.conf (test/support/test_nginx.h):
 *   - the configuration keeps every shipped directive and only replaces the replica
 *     addresses and the port (checked without nginx too);
 *   - 8 concurrent songs through nginx all succeed and both replicas served some
 *     (each replica's /metrics and nginx's access log agree on who served what);
 *   - kill -9 of one replica's stage 0 while a stream plays on it and whole-file songs
 *     render on both: the stream that already had audio ends cut (200, then the
 *     connection closes before the last chunk); every whole-file song completes, equal
 *     to the same song before, those that were on the killed replica re-sent by nginx
 *     to the other (the access log lists both); the killed replica's launcher exits 1
 *     and leaves no segment; new songs succeed through the other replica, and the cut
 *     stream asked again gives the same song, the part the client had as its start.
 * Skips (77) without the golden directory, the programs or an nginx binary (Debian's
 * `nginx` package; $MM3_NGINX names another). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/http_client.h"
#include "support/test_nginx.h"
#include "support/test_replica.h"
#include "support/test_support.h"

#define N_SPREAD 8 /* songs in the spread test; the even ones are whole-file */
#define N_CUT 4    /* whole-file songs in flight when a replica is killed */
#define N_AFTER 2  /* whole-file songs after the kill, beside the cut stream asked again */
#define CUT_STREAM_S 24

struct song {
    const char *base; /* nginx's URL */
    char uri[64];     /* /v1/audio/speech?song=NAME: names the request in the access log */
    char json[512];
    uint8_t *buf;
    size_t len, cap;
    atomic_size_t received;
    struct http_client_response resp;
    int rc;
};

struct fixture {
    char *tmp;
    char *shipped; /* deploy/nginx/mm3.conf */
    struct test_replica rep[2];
    char addr[2][160]; /* host:port of each replica, as nginx's upstream_addr names it */
    struct test_nginx ng;
    struct song spread[N_SPREAD];
};

static const char *k_lyrics = "[verse]\\nhello world\\n[chorus]\\nsing with me\\n";

static char *shipped_conf(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/deploy/nginx/mm3.conf", test_source_dir());
    return test_file_read(path, NULL);
}

/* ---- the configuration made from the shipped file (no nginx needed) ---- */

static void test_site_conf_keeps_shipped_directives(void **state)
{
    (void)state;
    char *shipped = shipped_conf();
    assert_non_null(shipped);
    const char *up[] = {"127.0.0.1:1111", "127.0.0.1:2222"};
    char *site = NULL, why[200] = "";
    assert_int_equal(test_nginx_site_conf(shipped, up, 2, 3333, &site, why, sizeof why), 0);
    assert_non_null(strstr(site, "\n    server 127.0.0.1:1111 max_fails=1 fail_timeout=10s;\n"));
    assert_non_null(strstr(site, "\n    server 127.0.0.1:2222 max_fails=1 fail_timeout=10s;\n"));
    assert_non_null(strstr(site, "\n    listen 127.0.0.1:3333;\n"));
    assert_null(strstr(site, "10.0.0.1"));
    assert_null(strstr(site, "listen 8080"));
    /* every other line is the shipped one: the routing policy under test is the shipped policy */
    const char *kept[] = {"least_conn;",
                          "keepalive 32;",
                          "keepalive_timeout 50s;",
                          "proxy_buffering off;",
                          "client_body_buffer_size 1m;",
                          "proxy_read_timeout 1800s;",
                          "proxy_connect_timeout 5s;",
                          "proxy_next_upstream error timeout http_503 non_idempotent;",
                          "proxy_next_upstream_tries 2;",
                          "proxy_set_header Connection \"\";"};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        assert_non_null(strstr(shipped, kept[i]));
        assert_non_null(strstr(site, kept[i]));
    }
    /* Unbuffered request bodies would make a POST's retry depend on whether its body
     * came in the same read as its headers. */
    assert_null(strstr(shipped, "proxy_request_buffering off;"));
    free(site);
    free(shipped);
}

static void test_site_conf_refuses_other_shapes(void **state)
{
    (void)state;
    const char *up[] = {"127.0.0.1:1111"};
    char *site = NULL, why[200] = "";
    assert_int_equal(test_nginx_site_conf("server {\n    listen 80;\n}\n", up, 1, 1, &site, why, sizeof why), -1);
    assert_non_null(strstr(why, "upstream mm3"));
    assert_int_equal(test_nginx_site_conf("upstream mm3 {\n    least_conn;\n}\nserver {\n    listen 80;\n}\n", up, 1, 1,
                                          &site, why, sizeof why),
                     -1);
    assert_non_null(strstr(why, "server ADDR"));
    assert_int_equal(test_nginx_site_conf("upstream mm3 {\n    server a:1;\n}\nserver {\n    # listen 80;\n}\n", up, 1,
                                          1, &site, why, sizeof why),
                     -1);
    assert_non_null(strstr(why, "listen"));
    /* the upstream's own block ends at its brace: a later `server` block is not one of its lines */
    assert_int_equal(test_nginx_site_conf("upstream mm3 {\n    server a:1 max_fails=2;\n    server b:2;\n}\n"
                                          "server {\n    listen 80;\n}\n",
                                          up, 1, 9, &site, why, sizeof why),
                     0);
    assert_string_equal(site, "upstream mm3 {\n    server 127.0.0.1:1111 max_fails=2;\n}\n"
                              "server {\n    listen 127.0.0.1:9;\n}\n");
    free(site);
}

/* ---- two replicas behind nginx ---- */

/* The replicas' deploy file: the CPU test file with the journal in dir/journal. */
static char *replica_deploy(const char *ckpt, const char *dir)
{
    char journal[1300];
    snprintf(journal, sizeof journal, "%s/journal", dir);
    mkdir(dir, 0755);
    mkdir(journal, 0755);
    /* Stage 0 waits up to 120 s for a song's next audio: two replicas share the CPU
     * with the test, slower still under sanitizers, and no case here waits for it. */
    char *base = test_replica_cpu_deploy(ckpt, 1, 1, journal, 16, 4, 300, 12000, 12000);
    /* behind a router every connection has the router's address (docs/operations.md) */
    const char *anchor = "  port: 0\n";
    char *at = base ? strstr(base, anchor) : NULL, *text = NULL;
    if (at && asprintf(&text, "%.*s%s  max_connections_per_client: 0\n%s", (int)(at - base), base, anchor,
                       at + strlen(anchor)) < 0)
        text = NULL;
    free(base);
    return text;
}

static void song_free(struct song *s)
{
    free(s->buf);
    s->buf = NULL;
    http_client_response_free(&s->resp);
}

static int group_teardown(void **state)
{
    struct fixture *f = *state;
    if (!f) return 0;
    test_nginx_stop(&f->ng);
    for (int i = 0; i < 2; i++)
        if (f->rep[i].launcher) test_replica_stop(&f->rep[i]);
    for (int i = 0; i < N_SPREAD; i++)
        song_free(&f->spread[i]);
    if (f->tmp) test_remove_tree(f->tmp);
    free(f->tmp);
    free(f->shipped);
    free(f);
    return 0;
}

/* Starts both replicas and nginx; 0, or -1 leaving what did start to group_teardown. */
static int start_all(struct fixture *f)
{
    f->tmp = test_make_tmpdir("e2e-router");
    f->shipped = shipped_conf();
    if (!f->tmp || !f->shipped) return -1;
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint", test_golden_dir());
    const char *tags[2] = {"a", "b"};
    for (int i = 0; i < 2; i++) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/%s", f->tmp, tags[i]);
        char *deploy = replica_deploy(ckpt, dir);
        int rc = deploy ? test_replica_start(&f->rep[i], f->tmp, tags[i], "er", deploy, NULL) : -1;
        free(deploy);
        if (rc < 0) {
            fprintf(stderr, "replica %s did not start\n", tags[i]);
            return -1;
        }
        const char *hp = strstr(f->rep[i].url, "://");
        snprintf(f->addr[i], sizeof f->addr[i], "%s", hp ? hp + 3 : f->rep[i].url);
    }
    const char *up[2] = {f->addr[0], f->addr[1]};
    if (test_nginx_start(&f->ng, test_nginx_binary(), f->tmp, f->shipped, up, 2) < 0) return -1;
    return 0;
}

static int group_setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    *state = f;
    if (!f) return -1;
    if (start_all(f) == 0) return 0;
    group_teardown(state); /* stop what did start; a teardown cmocka may still call sees NULL */
    *state = NULL;
    return -1;
}

static void song_init(struct song *s, const char *base, const char *name, int seed, double seconds, int stream)
{
    memset(s, 0, sizeof *s);
    s->base = base;
    snprintf(s->uri, sizeof s->uri, "/v1/audio/speech?song=%s", name);
    snprintf(s->json, sizeof s->json,
             "{\"caption\":\"a bright synth pop song\",\"lyrics\":\"%s\",\"duration_s\":%g,\"seed\":%d,"
             "\"num_inference_steps\":2,\"stream\":%s}",
             k_lyrics, seconds, seed, stream ? "true" : "false");
}

/* The same request again, under another name. */
static void song_again(struct song *s, const struct song *from, const char *name)
{
    memset(s, 0, sizeof *s);
    s->base = from->base;
    snprintf(s->uri, sizeof s->uri, "/v1/audio/speech?song=%s", name);
    memcpy(s->json, from->json, sizeof s->json);
}

static int song_body(void *user, const void *data, size_t n)
{
    struct song *s = user;
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1 << 16;
        while (cap < s->len + n)
            cap *= 2;
        uint8_t *b = realloc(s->buf, cap);
        if (!b) return -ENOMEM;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    atomic_store(&s->received, s->len);
    return 0;
}

static void *song_run(void *arg)
{
    struct song *s = arg;
    char url[256];
    snprintf(url, sizeof url, "%s%s", s->base, s->uri);
    s->rc = http_client_request(&(struct http_client_request){.url = url,
                                                              .method = "POST",
                                                              .body = s->json,
                                                              .body_len = strlen(s->json),
                                                              .timeout_ms = 120000,
                                                              .on_body = song_body,
                                                              .user = s},
                                &s->resp);
    return NULL;
}

static void songs_start(pthread_t *t, struct song *s, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&t[i], NULL, song_run, &s[i]), 0);
}

static void songs_join(pthread_t *t, int n)
{
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

static void assert_complete(const struct song *s)
{
    if (s->rc != 0 || s->resp.status != 200 || !s->resp.complete)
        fprintf(stderr, "%s: rc %d, status %d, complete %d, %zu bytes: %.*s\n", s->uri, s->rc, s->resp.status,
                (int)s->resp.complete, s->len, s->resp.status == 200 ? 0 : (int)s->len, (const char *)s->buf);
    assert_int_equal(s->rc, 0);
    assert_int_equal(s->resp.status, 200);
    assert_true(s->resp.complete);
    assert_true(s->len > 44 + 4 * 1000);
}

static void assert_same_song(const struct song *s, const struct song *ref)
{
    assert_int_equal(s->len, ref->len);
    assert_memory_equal(s->buf, ref->buf, ref->len);
}

/* A sample's value from a replica's /metrics ("name" or `name{labels}`), -1 if absent. */
static double metric(const struct test_replica *r, const char *name)
{
    char url[256], needle[128];
    snprintf(url, sizeof url, "%s/metrics", r->url);
    snprintf(needle, sizeof needle, "\n%s ", name);
    struct http_client_response resp;
    double v = -1;
    if (http_client_request(&(struct http_client_request){.url = url, .method = "GET", .timeout_ms = 10000}, &resp) ==
            0 &&
        resp.status == 200 && resp.body) {
        const char *at = strstr(resp.body, needle);
        if (at) v = strtod(at + strlen(needle), NULL);
    }
    http_client_response_free(&resp);
    return v;
}

/* nginx's access-log fields of a request: "status|upstream_addr|upstream_status|bytes"
 * without the URI (caller frees); fails the test when nginx logged no such request. */
static char *logged(const struct fixture *f, const struct song *s)
{
    /* nginx logs a request after its last byte went out: the client may be first. */
    char *line = NULL;
    for (int i = 0; i < 100 && !(line = test_nginx_access_line(&f->ng, s->uri)); i++)
        test_sleep_ms(50);
    if (!line) fprintf(stderr, "no access-log line for %s in %s/access.log\n", s->uri, f->ng.dir);
    assert_non_null(line);
    char *rest = strdup(line + strlen(s->uri) + 1);
    free(line);
    return rest;
}

/* The upstream_addr field of a logged request (caller frees). */
static char *logged_upstreams(const struct fixture *f, const struct song *s)
{
    char *l = logged(f, s);
    char *a = strchr(l, '|'), *b = a ? strchr(a + 1, '|') : NULL;
    assert_non_null(b);
    char *up = strndup(a + 1, (size_t)(b - a - 1));
    free(l);
    return up;
}

static void test_songs_spread_over_replicas(void **state)
{
    struct fixture *f = *state;
    pthread_t t[N_SPREAD];
    for (int i = 0; i < N_SPREAD; i++) {
        char name[16];
        snprintf(name, sizeof name, "spread%d", i);
        song_init(&f->spread[i], f->ng.url, name, 11 + i, 6 + i % 4, i % 2);
    }
    songs_start(t, f->spread, N_SPREAD);
    songs_join(t, N_SPREAD);
    int served[2] = {0, 0};
    for (int i = 0; i < N_SPREAD; i++) {
        assert_complete(&f->spread[i]);
        char *l = logged(f, &f->spread[i]);
        int k = -1;
        for (int r = 0; r < 2; r++) {
            char want[256];
            snprintf(want, sizeof want, "200|%s|200|", f->addr[r]);
            if (strncmp(l, want, strlen(want)) == 0) k = r;
        }
        if (k < 0) fprintf(stderr, "%s: logged %s\n", f->spread[i].uri, l);
        free(l);
        assert_true(k >= 0); /* one replica, no retry */
        served[k]++;
    }
    double ok_a = metric(&f->rep[0], "mm3_requests_total{outcome=\"ok\"}");
    double ok_b = metric(&f->rep[1], "mm3_requests_total{outcome=\"ok\"}");
    printf("songs served: replica a %d (its /metrics: %.0f), replica b %d (%.0f)\n", served[0], ok_a, served[1], ok_b);
    assert_true(served[0] >= 1 && served[1] >= 1);
    assert_int_equal((int)ok_a, served[0]);
    assert_int_equal((int)ok_b, served[1]);
}

/* nginx's error log on stderr: why it answered a request itself. */
static void dump_nginx_errors(const struct fixture *f)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/error.log", f->ng.dir);
    char *log = test_file_read(path, NULL);
    fprintf(stderr, "--- %s:\n%s--- end\n", path, log ? log : "(unreadable)\n");
    free(log);
}

/* Waits for the launcher of r to exit; its exit status, or -1 after 30 s. */
static int launcher_exit(struct test_replica *r)
{
    for (int i = 0; i < 300; i++) {
        int st;
        if (waitpid(r->launcher, &st, WNOHANG) == r->launcher) {
            r->launcher = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        test_sleep_ms(100);
    }
    return -1;
}

static void test_replica_killed_midrun(void **state)
{
    struct fixture *f = *state;
    static struct song stream, cut[N_CUT], after[N_AFTER + 1];
    const struct song *ref[N_CUT];
    for (int i = 0; i < N_CUT; i++) {
        ref[i] = &f->spread[2 * i]; /* the whole-file songs of the spread test */
        assert_non_null(ref[i]->buf);
    }
    /* A long stream first: with nothing else open, the replica it went to is the one
     * with a request in flight. */
    song_init(&stream, f->ng.url, "cut-stream", 90, CUT_STREAM_S, 1);
    pthread_t ts, tc[N_CUT];
    songs_start(&ts, &stream, 1);
    for (int i = 0; i < 1200 && atomic_load(&stream.received) < 44 + 4096; i++)
        test_sleep_ms(50);
    assert_true(atomic_load(&stream.received) >= 44 + 4096);
    double in_flight[2] = {metric(&f->rep[0], "mm3_requests_in_flight"), metric(&f->rep[1], "mm3_requests_in_flight")};
    assert_true((in_flight[0] == 1 && in_flight[1] == 0) || (in_flight[0] == 0 && in_flight[1] == 1));
    int v = in_flight[0] == 1 ? 0 : 1, o = 1 - v;
    /* Whole-file songs: least_conn gives the other replica the first, then spreads them
     * evenly, so some land on the victim. Kill once one of them is in flight there. */
    for (int i = 0; i < N_CUT; i++) {
        char name[16];
        snprintf(name, sizeof name, "cut%d", i);
        song_again(&cut[i], ref[i], name);
    }
    songs_start(tc, cut, N_CUT);
    double victim_in_flight = 0;
    for (int i = 0; i < 500 && victim_in_flight < 2; i++) {
        victim_in_flight = metric(&f->rep[v], "mm3_requests_in_flight");
        if (victim_in_flight < 2) test_sleep_ms(20);
    }
    assert_true(victim_in_flight >= 2);
    pid_t s0 = test_replica_pid(&f->rep[v], "stage0.pid");
    assert_true(s0 > 0);
    assert_int_equal(kill(s0, SIGKILL), 0);
    size_t had = atomic_load(&stream.received);
    songs_join(&ts, 1);
    songs_join(tc, N_CUT);
    int launcher_rc = launcher_exit(&f->rep[v]);
    for (int i = 0; i < N_CUT; i++)
        if (cut[i].resp.status != 200) dump_nginx_errors(f);

    /* The stream on the killed replica had audio: it ends cut, and nginx did not retry it. */
    printf("cut stream: %zu bytes at the kill, %zu in the end, of %d s\n", had, stream.len, CUT_STREAM_S);
    assert_int_equal(stream.rc, 0);
    assert_int_equal(stream.resp.status, 200);
    assert_false(stream.resp.complete);
    assert_true(stream.len < (size_t)CUT_STREAM_S * 44100 * 4);
    char *up = logged_upstreams(f, &stream);
    assert_string_equal(up, f->addr[v]);
    free(up);
    /* Every whole-file song completes, equal to the same song before; those that were
     * rendering on the killed replica were sent again, to the other, by nginx. */
    int retried = 0;
    char both[400];
    snprintf(both, sizeof both, "%s, %s", f->addr[v], f->addr[o]);
    for (int i = 0; i < N_CUT; i++) {
        assert_complete(&cut[i]);
        assert_same_song(&cut[i], ref[i]);
        char *l = logged(f, &cut[i]);
        printf("%s: %s\n", cut[i].uri, l);
        free(l);
        up = logged_upstreams(f, &cut[i]);
        if (strcmp(up, both) == 0)
            retried++;
        else
            assert_string_equal(up, f->addr[o]);
        free(up);
    }
    assert_true(retried >= 1);
    /* The launcher stops the rest of the killed replica and exits 1, leaving no segment. */
    assert_int_equal(launcher_rc, 1);
    assert_int_equal(test_shm_segments_left(f->rep[v].prefix), 0);
    assert_true(test_replica_log_contains(&f->rep[v], "stage 0 died"));

    /* New songs keep succeeding, through the live replica; the cut stream asked again
     * is the same song, the part the client had as its start. */
    pthread_t ta[N_AFTER + 1];
    for (int i = 0; i < N_AFTER; i++) {
        char name[16];
        snprintf(name, sizeof name, "after%d", i);
        song_again(&after[i], ref[i], name);
    }
    song_again(&after[N_AFTER], &stream, "after-stream");
    songs_start(ta, after, N_AFTER + 1);
    songs_join(ta, N_AFTER + 1);
    for (int i = 0; i <= N_AFTER; i++) {
        assert_complete(&after[i]);
        if (i < N_AFTER) assert_same_song(&after[i], ref[i]);
        up = logged_upstreams(f, &after[i]);
        size_t ul = strlen(up), ol = strlen(f->addr[o]);
        if (ul < ol || strcmp(up + ul - ol, f->addr[o]) != 0) fprintf(stderr, "%s: went to %s\n", after[i].uri, up);
        assert_true(ul >= ol && strcmp(up + ul - ol, f->addr[o]) == 0); /* answered by the live one */
        free(up);
    }
    assert_true(after[N_AFTER].len > stream.len);
    assert_memory_equal(after[N_AFTER].buf, stream.buf, stream.len);
    song_free(&stream);
    for (int i = 0; i < N_CUT; i++)
        song_free(&cut[i]);
    for (int i = 0; i <= N_AFTER; i++)
        song_free(&after[i]);
}

static void test_stop_leaves_nothing(void **state)
{
    struct fixture *f = *state;
    for (int i = 0; i < 2; i++)
        if (f->rep[i].launcher) assert_int_equal(test_replica_stop(&f->rep[i]), 0);
    assert_int_equal(test_nginx_stop(&f->ng), 0);
}

int main(void)
{
    const struct CMUnitTest conf_tests[] = {
        cmocka_unit_test(test_site_conf_keeps_shipped_directives),
        cmocka_unit_test(test_site_conf_refuses_other_shapes),
    };
    const struct CMUnitTest router_tests[] = {
        cmocka_unit_test(test_songs_spread_over_replicas),
        cmocka_unit_test(test_replica_killed_midrun),
        cmocka_unit_test(test_stop_leaves_nothing),
    };
    int rc = cmocka_run_group_tests_name("nginx configuration", conf_tests, NULL, NULL);
    if (rc != 0) return rc;
    if (!test_golden_dir()) {
        printf("no golden directory: the router tests are skipped\n");
        return 77;
    }
    if (!test_nginx_binary()) {
        printf("no nginx binary (Debian's `nginx` package, or $MM3_NGINX): the router tests are skipped\n");
        return 77;
    }
    return cmocka_run_group_tests_name("replicas behind nginx", router_tests, group_setup, group_teardown);
}
