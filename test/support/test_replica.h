/* One served replica for end-to-end tests: scripts/launch.sh started on a deploy
 * file the test writes, with its own /dev/shm prefix and run directory, stopped
 * with SIGTERM and checked to leave nothing behind.
 *
 *     struct test_replica r;
 *     const char *env[] = {"MM3_ALLOW_REPLAY", "1", NULL};
 *     assert_int_equal(test_replica_start(&r, tmp, "a", "e2e", deploy_yaml_text, env), 0);
 *     ... test_replica_post(&r, json, 120000, &resp) ...
 *     assert_int_equal(test_replica_stop(&r), 0);
 *
 * Header only (static inline): test/CMakeLists.txt links just test_support.c into
 * each test, and only the end-to-end tests need this. */
#ifndef MM3_TEST_REPLICA_H
#define MM3_TEST_REPLICA_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/http_client.h"
#include "support/test_shm.h"
#include "support/test_support.h"

struct test_replica {
    pid_t launcher; /* 0: not running */
    char dir[1024]; /* deploy.yaml, launch.out, launch.err, run/ (MM3_RUN_DIR) */
    char url[160];  /* from the launcher's READY line */
    char prefix[32];
};

/* The pid the launcher wrote to run/<name> ("stage0.pid", "stage1.pid"), or 0. */
static inline pid_t test_replica_pid(const struct test_replica *r, const char *name)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/run/%s", r->dir, name);
    char *s = test_file_read(path, NULL);
    pid_t p = s ? (pid_t)atoi(s) : 0;
    free(s);
    return p;
}

/* The launcher's stderr (both stages' logs) as a string (caller frees), NULL if unread. */
static inline char *test_replica_log(const struct test_replica *r)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/launch.err", r->dir);
    return test_file_read(path, NULL);
}

/* Whether the launcher's stderr holds needle. */
static inline int test_replica_log_contains(const struct test_replica *r, const char *needle)
{
    char *s = test_replica_log(r);
    int found = s && strstr(s, needle);
    free(s);
    return found;
}

/* Writes deploy_yaml to tmp/tag/deploy.yaml and starts the launcher on it with the
 * shm prefix <stem><pid><tag>- and env (name, value pairs ending in NULL; a NULL
 * value unsets the name). 0 once it printed READY (within 120 s), else -1. */
static inline int test_replica_start(struct test_replica *r, const char *tmp, const char *tag, const char *stem,
                                     const char *deploy_yaml, const char *const *env)
{
    memset(r, 0, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s/%s", tmp, tag);
    mkdir(r->dir, 0755);
    snprintf(r->prefix, sizeof r->prefix, "%s%d%s-", stem, (int)getpid(), tag);
    char deploy[1200], out[1200], err[1200], run[1200], launch[1200];
    snprintf(deploy, sizeof deploy, "%s/deploy.yaml", r->dir);
    snprintf(out, sizeof out, "%s/launch.out", r->dir);
    snprintf(err, sizeof err, "%s/launch.err", r->dir);
    snprintf(run, sizeof run, "%s/run", r->dir);
    snprintf(launch, sizeof launch, "%s/scripts/launch.sh", test_source_dir());
    FILE *f = fopen(deploy, "w");
    if (!f) return -1;
    fputs(deploy_yaml, f);
    if (fclose(f) != 0) return -1;
    pid_t p = fork();
    if (p < 0) return -1;
    if (p == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        setenv("MM3_SHM_PREFIX", r->prefix, 1);
        setenv("MM3_RUN_DIR", run, 1);
        setenv("MM3_BIN_DIR", test_bin_dir(), 1);
        setenv("MM3_LAUNCH_TIMEOUT_S", "120", 1);
        for (int i = 0; env && env[i]; i += 2) {
            if (env[i + 1])
                setenv(env[i], env[i + 1], 1);
            else
                unsetenv(env[i]);
        }
        execl("/bin/bash", "bash", launch, deploy, (char *)NULL);
        _exit(127);
    }
    r->launcher = p;
    for (int i = 0; i < 1200; i++) {
        char *s = test_file_read(out, NULL);
        char *at = s ? strstr(s, "READY ") : NULL;
        if (at && strchr(at, '\n')) {
            sscanf(at + 6, "%159s", r->url);
            free(s);
            return 0;
        }
        free(s);
        int st;
        if (waitpid(p, &st, WNOHANG) == p) {
            r->launcher = 0;
            fprintf(stderr, "launcher exited while starting; see %s\n", err);
            return -1;
        }
        test_sleep_ms(100);
    }
    return -1;
}

/* SIGTERM the launcher. 0 when it exits 0 within 60 s with both stages gone, no
 * segment left and no sanitizer report in the log; else -1 (killed after 60 s),
 * -2 (bad exit), -3 (a stage still runs), -4 (segment left), -5 (sanitizer). */
static inline int test_replica_stop(struct test_replica *r)
{
    if (!r->launcher) return 0;
    pid_t s0 = test_replica_pid(r, "stage0.pid"), s1 = test_replica_pid(r, "stage1.pid");
    kill(r->launcher, SIGTERM);
    int st = -1;
    for (int i = 0; i < 600; i++) {
        if (waitpid(r->launcher, &st, WNOHANG) == r->launcher) break;
        test_sleep_ms(100);
        st = -1;
    }
    if (st == -1) {
        kill(r->launcher, SIGKILL);
        waitpid(r->launcher, &st, 0);
        r->launcher = 0;
        return -1;
    }
    r->launcher = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return -2;
    if ((s0 > 0 && kill(s0, 0) == 0) || (s1 > 0 && kill(s1, 0) == 0)) return -3;
    if (test_shm_segments_left(r->prefix)) return -4;
    /* Under sanitizers the stages report into the launcher's log. */
    if (test_replica_log_contains(r, "Sanitizer") || test_replica_log_contains(r, "runtime error:")) {
        fprintf(stderr, "sanitizer report in %s/launch.err\n", r->dir);
        return -5;
    }
    return 0;
}

/* POST json to the replica's /v1/audio/speech; with on_body the response body
 * streams into it (as http_client_request does) instead of resp->body. */
static inline int test_replica_post_stream(const struct test_replica *r, const char *json, int timeout_ms,
                                           int (*on_body)(void *user, const void *data, size_t n), void *user,
                                           struct http_client_response *resp)
{
    char url[256];
    snprintf(url, sizeof url, "%s/v1/audio/speech", r->url);
    return http_client_request(&(struct http_client_request){.url = url,
                                                             .method = "POST",
                                                             .body = json,
                                                             .body_len = strlen(json),
                                                             .timeout_ms = timeout_ms,
                                                             .on_body = on_body,
                                                             .user = user},
                               resp);
}

static inline int test_replica_post(const struct test_replica *r, const char *json, int timeout_ms,
                                    struct http_client_response *resp)
{
    return test_replica_post_stream(r, json, timeout_ms, NULL, NULL, resp);
}

/* The deploy file of a served test on the tiny CPU model (caller frees), or NULL:
 * stage 0 with s0_seqs rows, stage 1 with s1_seqs, two flow steps, fp32; journal_dir
 * NULL or "" for none; first_wait_polls / steady_wait_polls:
 * connector_get_max_wait_first_chunk / connector_get_max_wait (polls of 10 ms a stage
 * waits for a request's first message / each later one; 6000 = 60 s). */
static inline char *test_replica_cpu_deploy(const char *ckpt, int async_chunk, int codec_streaming,
                                            const char *journal_dir, int s0_seqs, int s1_seqs, int request_timeout_s,
                                            int first_wait_polls, int steady_wait_polls)
{
    char *text;
    if (asprintf(&text,
                 "pipeline: minimax_music3\n"
                 "async_chunk: %s\n"
                 "model: %s\n"
                 "backend: cpu\n"
                 "api:\n  host: 127.0.0.1\n  port: 0\n  max_queue_depth: 8\n  request_timeout_s: %d\n"
                 "  journal_dir: \"%s\"\n"
                 "connectors:\n  shm:\n    name: SharedMemoryConnector\n    extra:\n"
                 "      codec_streaming: %s\n      connector_get_sleep_s: 0.01\n"
                 "      connector_get_max_wait_first_chunk: %d\n      connector_get_max_wait: %d\n"
                 "stages:\n"
                 "  - stage_id: 0\n    max_num_seqs: %d\n    dtype: float32\n    max_model_len: 4096\n"
                 "    max_num_batched_tokens: 64\n    enforce_eager: true\n"
                 "    output_connectors:\n      to_stage_1: shm\n"
                 "    default_sampling_params:\n      max_tokens: 4002\n"
                 "  - stage_id: 1\n    max_num_seqs: %d\n    dtype: float32\n    enforce_eager: true\n"
                 "    max_num_batched_tokens: 4\n    input_connectors:\n      from_stage_0: shm\n"
                 "    matmul_precision: fp32\n    num_inference_steps: 2\n",
                 async_chunk ? "true" : "false", ckpt, request_timeout_s, journal_dir ? journal_dir : "",
                 codec_streaming ? "true" : "false", first_wait_polls, steady_wait_polls, s0_seqs, s1_seqs) < 0)
        return NULL;
    return text;
}

/* A streamed answer's body, growing; with kill_pid > 0 that process gets SIGKILL once
 * more than kill_after bytes arrived (and on_kill(on_kill_ctx) runs), reading on. */
struct test_collect {
    uint8_t *buf;
    size_t len, cap;
    pid_t kill_pid;
    size_t kill_after;
    void (*on_kill)(void *ctx);
    void *on_kill_ctx;
};

/* The body callback of test_replica_post_stream for a struct test_collect. */
static inline int test_collect_body(void *user, const void *data, size_t n)
{
    struct test_collect *c = (struct test_collect *)user;
    if (c->len + n > c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 1 << 16;
        while (cap < c->len + n)
            cap *= 2;
        uint8_t *b = (uint8_t *)realloc(c->buf, cap);
        if (!b) return -ENOMEM;
        c->buf = b;
        c->cap = cap;
    }
    memcpy(c->buf + c->len, data, n);
    c->len += n;
    if (c->kill_pid > 0 && c->len > c->kill_after) {
        kill(c->kill_pid, SIGKILL);
        c->kill_pid = 0;
        if (c->on_kill) c->on_kill(c->on_kill_ctx);
    }
    return 0;
}

#endif
