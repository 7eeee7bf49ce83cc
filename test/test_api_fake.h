/* A fake engine for the API tests: produces a deterministic stereo signal from
 * one thread per job, or refuses / fails / runs forever on request; plus a
 * fixture that runs the HTTP server on an ephemeral loopback port. */
#ifndef MM3_TEST_API_FAKE_H
#define MM3_TEST_API_FAKE_H

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/http_client.h"
#include "common/wav.h"
#include "stage0/api/http_server.h"

enum fake_mode {
    FAKE_OK = 0,     /* n_chunks chunks, then END */
    FAKE_EAGAIN,     /* submit: queue full */
    FAKE_EINVAL,     /* submit: prompt too long */
    FAKE_FAIL_MID,   /* two chunks, then an error */
    FAKE_FAIL_EARLY, /* an error before any audio */
    FAKE_ENDLESS,    /* chunks until cancelled */
    FAKE_NO_SONG,    /* submit: a continue_from the engine does not know (404 naming the field) */
};

#define FAKE_MAX_THREADS 64

struct fake_engine {
    enum fake_mode mode;
    int n_chunks;
    size_t chunk_frames;
    int delay_ms;
    bool ready;
    _Atomic int submits, cancels;
    pthread_mutex_t mu;
    struct mm3_job_params last; /* the last submitted job's params (strings not kept), under mu */
    pthread_t threads[FAKE_MAX_THREADS];
    int n_threads;
};

struct fixture {
    struct fake_engine fe;
    struct api_engine engine;
    struct http_server *srv;
    char base[64];
};

/* Deterministic test signal, exactly representable after the PCM16 rounding
 * rule: value k/1000 * 0.9 with k in [-1000, 1000]. */
static float fake_sample(size_t frame, int ch)
{
    int k = (int)((frame * 7 + (size_t)ch * 13) % 2001) - 1000;
    return (float)k / 1000.0f * 0.9f;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

struct fake_run {
    struct fake_engine *fe;
    struct mm3_job *job;
};

static void *fake_thread(void *arg)
{
    struct fake_run *run = arg;
    struct fake_engine *fe = run->fe;
    struct mm3_job *job = run->job;
    free(run);
    mm3_job_set_running(job);
    float *pcm = malloc(fe->chunk_frames * 2 * sizeof *pcm);
    size_t frame = 0;
    for (int i = 0; fe->mode == FAKE_ENDLESS || i < fe->n_chunks; i++) {
        if (fe->mode == FAKE_FAIL_EARLY) break;
        if (fe->mode == FAKE_FAIL_MID && i == 2) break;
        if (fe->delay_ms) sleep_ms(fe->delay_ms);
        for (size_t f = 0; f < fe->chunk_frames; f++)
            for (int c = 0; c < 2; c++)
                pcm[f * 2 + c] = fake_sample(frame + f, c);
        int rc;
        do
            rc = mm3_job_push_pcm(job, pcm, fe->chunk_frames, 200);
        while (rc == -ETIMEDOUT);
        if (rc == -ECANCELED) break;
        if (rc != 0) abort(); /* no cmocka asserts off the main thread */
        frame += fe->chunk_frames;
        mm3_job_progress_add(job, 100, 1);
    }
    if (fe->mode == FAKE_FAIL_MID || fe->mode == FAKE_FAIL_EARLY)
        mm3_job_fail(job, 500, "fake engine: stage 1 died");
    else
        mm3_job_finish(job); /* after a cancel this is refused, harmlessly */
    free(pcm);
    mm3_job_unref(job);
    return NULL;
}

static int fake_submit(void *ctx, struct mm3_job *job)
{
    struct fake_engine *fe = ctx;
    pthread_mutex_lock(&fe->mu);
    fe->last = job->params;
    fe->last.lyrics = fe->last.caption = fe->last.replay_file = NULL;
    fe->last.journal = NULL;
    pthread_mutex_unlock(&fe->mu);
    atomic_fetch_add(&fe->submits, 1);
    if (fe->mode == FAKE_EAGAIN) return -EAGAIN;
    if (fe->mode == FAKE_NO_SONG) {
        mm3_job_set_error_param(job, 404, "continue_from", "continue_from: no finished song %s on this server",
                                job->params.continue_from);
        return -EINVAL;
    }
    if (fe->mode == FAKE_EINVAL) {
        mm3_job_set_error(job, 400, "field 'input': prompt is 6000 tokens, the limit is 5000");
        return -EINVAL;
    }
    struct fake_run *run = malloc(sizeof *run);
    run->fe = fe;
    run->job = job;
    mm3_job_ref(job);
    pthread_mutex_lock(&fe->mu);
    if (fe->n_threads == FAKE_MAX_THREADS || pthread_create(&fe->threads[fe->n_threads++], NULL, fake_thread, run) != 0)
        abort();
    pthread_mutex_unlock(&fe->mu);
    return 0;
}

static void fake_cancel(void *ctx, struct mm3_job *job)
{
    struct fake_engine *fe = ctx;
    atomic_fetch_add(&fe->cancels, 1);
}

static void fake_health(void *ctx, struct api_health *h)
{
    struct fake_engine *fe = ctx;
    h->n_stages = 2;
    snprintf(h->stages[0].name, sizeof h->stages[0].name, "stage0");
    snprintf(h->stages[1].name, sizeof h->stages[1].name, "stage1");
    h->stages[0].state = API_STAGE_READY;
    h->stages[1].state = fe->ready ? API_STAGE_READY : API_STAGE_STARTING;
    h->queue_depth = 3;
    h->active_rows = 4;
}

/* Optional: adjust the server configuration of the next fixture_start. */
static void (*fixture_tweak)(struct http_server_config *cfg);

static struct fixture *fixture_start(enum fake_mode mode, unsigned max_requests)
{
    struct fixture *fx = calloc(1, sizeof *fx);
    fx->fe.mode = mode;
    fx->fe.n_chunks = 5;
    fx->fe.chunk_frames = 4410;
    fx->fe.ready = true;
    pthread_mutex_init(&fx->fe.mu, NULL);
    fx->engine = (struct api_engine){&fx->fe, fake_submit, fake_cancel, fake_health};
    struct http_server_config cfg;
    http_server_config_default(&cfg);
    cfg.port = 0;
    cfg.max_body_bytes = 4096;
    cfg.max_requests = max_requests;
    cfg.poll_ms = 20;
    cfg.job_queue_chunks = 2;
    if (fixture_tweak) fixture_tweak(&cfg);
    fixture_tweak = NULL;
    assert_int_equal(http_server_start(&fx->srv, &cfg, &fx->engine), 0);
    snprintf(fx->base, sizeof fx->base, "http://127.0.0.1:%u", http_server_port(fx->srv));
    return fx;
}

static void fixture_stop(struct fixture *fx)
{
    http_server_stop(fx->srv);
    for (int i = 0; i < fx->fe.n_threads; i++)
        pthread_join(fx->fe.threads[i], NULL);
    pthread_mutex_destroy(&fx->fe.mu);
    free(fx);
}

__attribute__((unused)) static int do_request(struct fixture *fx, const char *method, const char *path,
                                              const char *body, struct http_client_response *resp)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", fx->base, path);
    struct http_client_request rq = {
        .url = url,
        .method = method,
        .body = body,
        .body_len = body ? strlen(body) : 0,
        .timeout_ms = 10000,
    };
    return http_client_request(&rq, resp);
}

#endif
