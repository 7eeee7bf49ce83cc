#include "stage0/engine.h"
#include "stage0/engine_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/frame_mix.h"
#include "common/log.h"
#include "common/metrics.h"
#include "pipe/pipe_channel.h"
#include "pipe/pipe_proto.h"
#include "shmconn/shmconn.h"
#include "stage0/admission.h"
#include "stage0/generate.h"
#include "stage0/playback.h"
#include "stage0/recovery/frame_spool.h"
#include "stage0/recovery/journal_sweep.h"
#include "stage0/scheduler.h"
#include "stage0/teacher_force.h"

/* ---- api_engine ---- */

static int api_submit(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    const struct mm3_connector_config *k = mm3_deploy_edge_connector(e->d);
    if (job->params.stream && !k->codec_streaming) {
        mm3_job_set_error_kind(job, MM3_FAIL_BAD_REQUEST,
                               "stream: streamed answers need codec_streaming: true in the deploy file");
        return -EINVAL;
    }
    if (!engine_stage1_up(e)) {
        mm3_job_set_error_kind(job, MM3_FAIL_UNAVAILABLE, "stage 1 unavailable");
        return -EAGAIN;
    }
    int cont = job->params.continue_from[0] || job->params.journal;
    int rc = cont ? eng_continue_submit(e, job) : sched_submit(e->sched, job);
    if (rc == -EAGAIN)
        mm3_job_set_error_kind(job, MM3_FAIL_UNAVAILABLE, "server busy: generation queue full, retry later");
    if (rc == -ESHUTDOWN) {
        mm3_job_set_error_kind(job, MM3_FAIL_UNAVAILABLE, "server shutting down");
        return -EAGAIN;
    }
    return rc;
}

static void api_cancel(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    (void)job; /* cancel_requested is set: the step loop frees the rows and tells stage 1 */
    sched_wake(e->sched);
}

/* The health of one stage-1 worker. */
static void worker_health(struct s1_worker *w, enum api_stage_state *state, char *detail, size_t cap)
{
    int up = atomic_load(&w->up);
    double beat = -1;
    if (up) {
        pthread_rwlock_rdlock(&w->conn_mu);
        beat = w->in ? shmconn_peer_heartbeat_age(w->in) : -1;
        pthread_rwlock_unlock(&w->conn_mu);
    }
    if (!up) {
        *state = API_STAGE_DOWN;
        snprintf(detail, cap, "not attached: waiting for mm3-stage1 (requests get 503)");
    } else if (beat < 0) {
        *state = API_STAGE_STARTING;
        snprintf(detail, cap, "attached, no heartbeat yet");
    } else if (beat > PIPE_HEARTBEAT_DEADLINE_S) {
        *state = API_STAGE_DOWN;
        snprintf(detail, cap, "attached, but no heartbeat for %.1f s (stopped or stuck; its songs wait)", beat);
    } else {
        *state = API_STAGE_READY;
        snprintf(detail, cap, "attached, heartbeat %.1f s ago", beat);
    }
}

static void api_health(void *ctx, struct api_health *h)
{
    struct engine *e = ctx;
    memset(h, 0, sizeof *h);
    h->n_stages = 2;
    snprintf(h->stages[0].name, sizeof h->stages[0].name, "stage0");
    h->stages[0].state = API_STAGE_READY;
    int q, rows;
    sched_counts(e->sched, &q, &rows);
    snprintf(h->stages[0].detail, sizeof h->stages[0].detail, "%d rows in use, %d queued", rows, q);
    /* Stage 0 answers when its receiver and step loop keep turning. Each may block on
     * purpose for a while (a send waits up to the steady deadline for room in the ring,
     * a PCM push up to PCM_PUSH_TIMEOUT_MS for a slow client), so one slow client must
     * not make the replica unready: the limit is the longest such wait, plus slack. */
    int64_t now = mm3_job_now_ns();
    double rx_age = 0;
    for (int k = 0; k < e->n_workers; k++) {
        double age = (double)(now - atomic_load(&e->workers[k].rx_turn_ns)) * 1e-9;
        if (age > rx_age) rx_age = age;
    }
    double step_age = (double)(now - atomic_load(&e->step_turn_ns)) * 1e-9;
    double stall = e->workers[0].cfg_in.steady_deadline_s;
    if (stall < PCM_PUSH_TIMEOUT_MS * 1e-3) stall = PCM_PUSH_TIMEOUT_MS * 1e-3;
    stall += PIPE_HEARTBEAT_DEADLINE_S;
    if (rx_age > stall || step_age > stall) {
        h->stages[0].state = API_STAGE_DOWN;
        snprintf(h->stages[0].detail, sizeof h->stages[0].detail,
                 "stuck: receiver last turned %.1f s ago, step loop %.1f s ago", rx_age, step_age);
    }
    snprintf(h->stages[1].name, sizeof h->stages[1].name, "stage1");
    if (e->n_workers == 1) {
        worker_health(&e->workers[0], &h->stages[1].state, h->stages[1].detail, sizeof h->stages[1].detail);
    } else {
        /* Ready while any worker is: the others' songs go to it. */
        int ready = 0, starting = 0;
        for (int k = 0; k < e->n_workers; k++) {
            enum api_stage_state one;
            char detail[128];
            worker_health(&e->workers[k], &one, detail, sizeof detail);
            ready += one == API_STAGE_READY;
            starting += one == API_STAGE_STARTING;
        }
        h->stages[1].state = ready ? API_STAGE_READY : starting ? API_STAGE_STARTING : API_STAGE_DOWN;
        snprintf(h->stages[1].detail, sizeof h->stages[1].detail, "%d of %d workers ready%s", ready, e->n_workers,
                 ready ? "" : " (requests get 503)");
    }
    h->queue_depth = q;
    h->active_rows = rows;
}

/* ---- life cycle ---- */

int engine_create(struct engine **out, const struct mm3_deploy *d, const struct talker *lm, const struct depth *dd,
                  const struct tokenizer *tok, const char *ckpt_root, const struct pipe_run *run)
{
    *out = NULL;
    struct engine *e = calloc(1, sizeof *e);
    if (!e) return mm3_errorf(-ENOMEM, "engine: out of memory");
    e->d = d;
    e->created_unix = time(NULL);
    snprintf(e->prefix, sizeof e->prefix, "%s", run && run->prefix[0] ? run->prefix : SHMCONN_DEFAULT_PREFIX);
    int rc = frame_mix_load(&e->mix, ckpt_root);
    if (rc < 0) goto fail;
    e->raw_width = dd->cfg.n_codebooks * lm->cfg.hidden;
    if (frame_mix_raw_width(&e->mix) != e->raw_width) {
        rc = mm3_errorf(-EINVAL,
                        "%s/condition_encoder: %d layers x %d hidden = %d floats per frame, but stage 0 produces %d "
                        "(%d codebooks x %d hidden)",
                        ckpt_root, e->mix.n_layers, e->mix.hidden, frame_mix_raw_width(&e->mix), e->raw_width,
                        dd->cfg.n_codebooks, lm->cfg.hidden);
        goto fail;
    }
    const char *raw = getenv("MM3_STAGE0_RAW_FRAMES");
    e->raw = raw && !strcmp(raw, "1");
    e->width = e->raw ? e->raw_width : e->mix.hidden;
    if (e->raw) LOG_WARN("MM3_STAGE0_RAW_FRAMES=1: sending raw frames of %d floats (not pre-mixed)", e->raw_width);
    if (!(e->mixed = malloc(sizeof(float) * HELD_FRAMES_PER_MSG * e->width))) {
        rc = mm3_errorf(-ENOMEM, "engine: out of memory");
        goto fail;
    }
    e->n_workers = mm3_deploy_stage1_workers(d);
    if (!(e->workers = calloc((size_t)e->n_workers, sizeof *e->workers))) {
        rc = mm3_errorf(-ENOMEM, "engine: out of memory");
        goto fail;
    }
    for (int k = 0; k < e->n_workers; k++) {
        struct s1_worker *w = &e->workers[k];
        w->e = e;
        w->index = k;
        pipe_worker_channel_config(d, PIPE_CHANNEL_S0_TO_S1, k, e->prefix, &w->cfg_out);
        pipe_worker_channel_config(d, PIPE_CHANNEL_S1_TO_S0, k, e->prefix, &w->cfg_in);
        if (run) {
            pipe_run_apply(run, &w->cfg_out);
            pipe_run_apply(run, &w->cfg_in);
        }
        pthread_rwlock_init(&w->conn_mu, NULL);
    }
    if (!e->workers[0].cfg_out.run_id[0])
        LOG_WARN("MM3_RUN_ID / MM3_RUN_TOKEN not set: segment names are predictable (%s...); start the replica "
                 "with scripts/launch.sh, which gives both stages a random run id and token",
                 e->prefix);
    e->send_timeout_s = e->workers[0].cfg_out.steady_deadline_s;
    e->await_limit_s = e->workers[0].cfg_out.first_chunk_deadline_s;
    metrics_gauge_set(&mm3_metrics.stage1_workers, e->n_workers);
    if ((rc = generate_frame_rate(ckpt_root, &e->fps)) < 0) goto fail;
    e->adm.share = d->api.stream_capacity_share;
    eng_capacity_publish(-1);
    const struct mm3_stage_config *s0 = mm3_deploy_stage(d, 0);
    struct sched_config sc = {.max_rows = s0->max_num_seqs,
                              .max_ctx = s0->max_model_len,
                              .max_batched_tokens = s0->max_num_batched_tokens,
                              .max_queue = d->api.max_queue_depth,
                              .journal_dir = d->api.journal_dir,
                              .replay_dir = d->api.replay_dir};
    e->max_song_frames = (int)(s0->max_tokens - MM3_DEPLOY_EXTRA_AR_STEPS); /* as the HTTP limits (main.c) */
    e->n_codebooks = dd->cfg.n_codebooks;
    e->audio_vocab = dd->cfg.audio_vocab;
    if (e->max_song_frames > GENERATE_MAX_FRAMES) e->max_song_frames = GENERATE_MAX_FRAMES;
    if (d->api.continue_max_songs > 0) {
        struct song_store_limits sl = {d->api.continue_max_songs, d->api.continue_max_bytes, d->api.continue_max_age_s};
        if ((rc = song_store_create(&e->songs, &sl)) < 0) goto fail;
        sc.keep_codes = 1;
    }
    for (int i = 0; i < s0->n_lora_modules; i++)
        if ((rc = talker_lora_set_add(&e->lora, &lm->cfg, s0->lora_modules[i].name, s0->lora_modules[i].path,
                                      s0->lora_modules[i].scale)) < 0) {
            mm3_error_prefix(rc, "%s: stages[0].lora_modules[%d]: ", d->source, i);
            goto fail;
        }
    sc.lora = &e->lora;
    sc.backend = d->backend == MM3_BACKEND_CUDA ? TALKER_BACKEND_CUDA : TALKER_BACKEND_CPU;
    sc.kv_dtype = s0->kv_cache_dtype;
    if (!s0->enforce_eager && s0->compilation.cudagraph_mode == MM3_CUDAGRAPH_FULL_DECODE_ONLY) {
        sc.n_capture_sizes = s0->compilation.n_capture_sizes;
        sc.capture_sizes = s0->compilation.capture_sizes;
        sc.graph_warmups = s0->compilation.cudagraph_num_of_warmups;
    }
    /* Size the KV cache from the deploy file and refuse at start-up, with the
     * numbers, what the device cannot hold (never an allocation failure later). */
    struct talker_backend_plan plan;
    talker_backend_plan_compute_kv(sc.backend, sc.kv_dtype, lm, dd, sched_backend_rows(&sc), sc.max_ctx, &plan);
    plan.adapter_bytes = talker_lora_set_bytes(&e->lora);
    plan.total_bytes += plan.adapter_bytes;
    if ((rc = talker_backend_plan_check(sc.backend, &plan, s0->gpu_memory_utilization)) < 0) goto fail;
    e->max_per_worker = mm3_deploy_stage(d, 1)->max_num_seqs + s0->max_num_seqs;
    metrics_gauge_set(&mm3_metrics.kv_rows, s0->max_num_seqs);
    struct sched_sink sink;
    eng_sink_fill(e, &sink);
    if ((rc = sched_create(&e->sched, &sc, lm, dd, tok, &sink)) < 0) goto fail;
    pthread_mutex_init(&e->mu, NULL);
    e->api = (struct api_engine){.ctx = e, .submit = api_submit, .cancel = api_cancel, .health = api_health};
    *out = e;
    return 0;
fail:
    talker_lora_set_free(&e->lora);
    song_store_destroy(e->songs);
    for (int k = 0; e->workers && k < e->n_workers; k++)
        pthread_rwlock_destroy(&e->workers[k].conn_mu);
    free(e->workers);
    free(e->mixed);
    free(e);
    return rc;
}

static int attached_workers(struct engine *e)
{
    int n = 0;
    for (int k = 0; k < e->n_workers; k++)
        n += atomic_load(&e->workers[k].up);
    return n;
}

int engine_start(struct engine *e, double wait_s)
{
    int n = shmconn_reclaim_stale(e->prefix);
    if (n > 0) LOG_INFO("reclaimed %d stale segment(s) with prefix %s", n, e->prefix);
    if (e->d->api.journal_dir[0]) { /* what a stage 0 that died left there */
        struct journal_sweep_result sw;
        if (journal_dir_prepare(e->d->api.journal_dir) < 0) return mm3_error_prefix(-EINVAL, "api.journal_dir: ");
        if (journal_sweep_orphans(e->d->api.journal_dir, (long long)e->created_unix, &sw) < 0)
            LOG_WARN("journal sweep: %s", mm3_last_error());
        else if (sw.closed || sw.spools_removed)
            LOG_INFO("journal_dir %s: %d journal(s) of a stopped stage 0 marked interrupted, %d frame spool(s) removed",
                     e->d->api.journal_dir, sw.closed, sw.spools_removed);
    }
    for (int k = 0; k < e->n_workers; k++) {
        struct s1_worker *w = &e->workers[k];
        int rc = shmconn_create(&w->out, &w->cfg_out);
        if (rc < 0) return rc;
        atomic_store(&w->rx_turn_ns, mm3_job_now_ns());
        if ((rc = pthread_create(&w->rx, NULL, eng_rx_thread, w)))
            return mm3_errorf(-rc, "engine: receiver thread of stage-1 worker %d: %s", k, strerror(rc));
        w->rx_started = 1;
    }
    atomic_store(&e->step_turn_ns, mm3_job_now_ns());
    int rc = sched_start(e->sched);
    if (rc < 0) return rc;
    char seg[160];
    LOG_INFO("waiting up to %g s for stage 1 to attach (%s%s)", wait_s,
             pipe_segment_name(&e->workers[0].cfg_in, seg, sizeof seg),
             e->n_workers > 1 ? " and the other workers' channels" : "");
    int64_t t0 = mm3_job_now_ns();
    while (attached_workers(e) < e->n_workers && (mm3_job_now_ns() - t0) < (int64_t)(wait_s * 1e9)) {
        struct timespec t = {0, 20 * 1000000L};
        nanosleep(&t, NULL);
    }
    n = attached_workers(e);
    if (n == 0)
        LOG_WARN("stage 1 not attached after %g s: serving anyway (/health says stage1 down, requests get 503)",
                 wait_s);
    else if (n < e->n_workers)
        LOG_WARN("%d of %d stage-1 workers attached after %g s: serving with those", n, e->n_workers, wait_s);
    return 0;
}

int engine_stage1_up(struct engine *e)
{
    return attached_workers(e) > 0;
}

struct api_engine *engine_api(struct engine *e)
{
    return &e->api;
}

void engine_destroy(struct engine *e)
{
    if (!e) return;
    /* The step loop goes first: its on_abort sends CANCEL while the channel is up. */
    sched_destroy(e->sched, "server shutting down");
    atomic_store(&e->stopping, 1);
    for (int k = 0; k < e->n_workers; k++)
        if (e->workers[k].rx_started) pthread_join(e->workers[k].rx, NULL);
    eng_fail_all(e, "server shutting down");
    for (int k = 0; k < e->n_workers; k++) {
        struct s1_worker *w = &e->workers[k];
        pthread_rwlock_wrlock(&w->conn_mu);
        shmconn_close(w->in);
        shmconn_close(w->out);
        w->in = w->out = NULL;
        pthread_rwlock_unlock(&w->conn_mu);
        pthread_rwlock_destroy(&w->conn_mu);
    }
    free(e->workers);
    pthread_mutex_destroy(&e->mu);
    song_store_destroy(e->songs);
    talker_lora_set_free(&e->lora);
    free(e->mixed);
    free(e);
}
