/* The stage-1 server process: deploy file, models, the two channels, the scheduling loop,
 * stage-0 loss and restart, shutdown (stage1/server.h). */
#include "stage1/server.h"

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/lora_merge.h"
#include "stage1/server_internal.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#endif

/* Seconds between "still waiting for stage 0" lines. */
#define S1_WAIT_LOG_EVERY_S 10.0
/* One bounded attempt to open s0_to_s1; the loop retries until stage 0 is there. */
#define S1_OPEN_ATTEMPT_S 0.25

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

/* ---- start-up ---- */

static int server_load(struct s1_server *s, const struct s1_server_options *o)
{
    int rc;
    if ((rc = mm3_deploy_load(&s->d, o->config)) < 0) return rc;
    if (o->model && (rc = mm3_deploy_set_model(&s->d, o->model)) < 0) return rc;
#ifdef MM3_HAVE_CUDA
    bool gpu = cuda_device_count_safe() > 0;
#else
    bool gpu = false;
    if (s->d.backend == MM3_BACKEND_CUDA)
        return mm3_errorf(-ENOTSUP,
                          "%s: backend: cuda: this mm3-stage1 is built without CUDA (configure with -DMM3_CUDA=ON); "
                          "use backend: cpu (or auto, which picks the CPU here)",
                          s->d.source);
#endif
    if ((rc = mm3_deploy_resolve_backend(&s->d, gpu)) < 0) return rc;
    if (!s->d.model[0])
        return mm3_errorf(-EINVAL, "%s: model: no checkpoint directory; set `model:` or pass --model", s->d.source);
    if ((rc = pipe_run_from_env(&s->run)) < 0) return rc;
    snprintf(s->prefix, sizeof s->prefix, "%s", s->run.prefix);

    s->st = mm3_deploy_stage(&s->d, 1);
    const struct mm3_connector_config *e = mm3_deploy_edge_connector(&s->d);
    s->max_active = s->st->max_num_seqs;
    s->max_reqs = s->max_active + mm3_deploy_stage(&s->d, 0)->max_num_seqs;
    s->codec_streaming = e->codec_streaming;
    s->send_timeout_s = mm3_connector_steady_deadline_s(e);
    if ((rc = pipe_worker_from_env(mm3_deploy_stage1_workers(&s->d), &s->worker)) < 0) return rc;
    pipe_worker_channel_config(&s->d, PIPE_CHANNEL_S0_TO_S1, s->worker, s->prefix, &s->in_cfg);
    pipe_worker_channel_config(&s->d, PIPE_CHANNEL_S1_TO_S0, s->worker, s->prefix, &s->out_cfg);
    pipe_run_apply(&s->run, &s->in_cfg);
    pipe_run_apply(&s->run, &s->out_cfg);
    if (!s->run.run_id[0])
        LOG_WARN("MM3_RUN_ID / MM3_RUN_TOKEN not set: segment names are predictable (%s...); start the replica "
                 "with scripts/launch.sh, which gives both stages a random run id and token",
                 s->prefix);
    s->reqs = calloc((size_t)s->max_reqs + 1, sizeof *s->reqs); /* + a spare one to refuse a request */
    if (!s->reqs) return mm3_errorf(-ENOMEM, "stage 1: out of memory");

    double t0 = s1_now();
#ifdef MM3_HAVE_CUDA
    cuda_stream_priority_set(mm3_deploy_stream_priority_level(s->st->stream_priority)); /* before the first stream */
#endif
    /* The DiT's adapters are merged as it loads and not needed afterwards. */
    if ((rc = lora_merge_add_stage(s->st)) == 0 && (rc = condition_load(&s->cm, s->d.model)) == 0)
        rc = dit_load(&s->dm, s->d.model);
    lora_merge_clear();
    if (rc < 0 || (rc = vocoder_load(&s->voc, s->d.model)) < 0) return rc;
    /* the condition projection, the DiT, its flow loop and the vocoder on the GPU; the
     * slot mix of the frames and the window bookkeeping stay on the host */
    if ((rc = s1_backend_open(&s->be, s->d.backend, mm3_deploy_stage1_worker_device(&s->d, s->worker), s->cm, s->dm,
                              s->voc, s->st->matmul_precision)) < 0)
        return mm3_error_prefix(rc, "%s: stage 1 on %s: ", s->d.source, mm3_backend_name(s->d.backend));
    if (s->be.vocoder) vocoder_drop_weights(s->voc); /* s1_backend_apply hands every window to the GPU copy */
    if (s->be.flow) dit_drop_weights(s->dm);         /* and every DiT forward to the GPU flow loop */
    int max_windows = s->max_active < PIPE_BATCH_WINDOWS_MAX ? s->max_active : PIPE_BATCH_WINDOWS_MAX;
    if (s->st->max_num_batched_tokens > 0 && s->st->max_num_batched_tokens < max_windows)
        max_windows = s->st->max_num_batched_tokens;
    if ((rc = s1_backend_flow_batch(&s->be, s->dm, condition_latent_len(&s->cm->cfg, RENDER_WINDOW_FRAMES), max_windows,
                                    &s->fb)) < 0)
        return mm3_error_prefix(rc, "%s: stage 1 flow batch of %d windows: ", s->d.source, max_windows);
    s->cand = calloc((size_t)s->max_reqs + 1, sizeof *s->cand);
    if (!s->cand) return mm3_errorf(-ENOMEM, "stage 1: out of memory");
    s->jobs = calloc((size_t)max_windows, sizeof *s->jobs);
    s->job_ids = calloc((size_t)max_windows, sizeof *s->job_ids);
    s->job_rc = calloc((size_t)max_windows, sizeof *s->job_rc);
    if (!s->jobs || !s->job_ids || !s->job_rc) return mm3_errorf(-ENOMEM, "stage 1: out of memory");
    s->native_rate = vocoder_sample_rate(s->voc);
    s->hop = vocoder_hop(s->voc);
    s->default_shift = (float)s->st->flow_shift;
    if (s->default_shift == 0.0f && (rc = flow_checkpoint_shift(s->d.model, &s->default_shift)) < 0) return rc;
    LOG_INFO("%s: stage 1 on %s, model %s loaded in %.1f s (%d Hz, hop %d); max_num_seqs %d, up to %d requests "
             "held, %d windows per DiT batch (%s), flow shift %g, stream priority %s, window order %s, "
             "codec_streaming %s, deadlines %.2f s first / %.2f s steady, prefix '%s'",
             s->d.source, mm3_backend_name(s->d.backend), s->d.model, s1_now() - t0, s->native_rate, s->hop,
             s->max_active, s->max_reqs, s->fb.max_windows, s->fb.async ? "vocoder overlapped" : "in turn",
             (double)s->default_shift, mm3_stream_priority_name(s->st->stream_priority),
             mm3_window_order_name(s->st->window_order), s->codec_streaming ? "on" : "off",
             s->in_cfg.first_chunk_deadline_s, s->in_cfg.steady_deadline_s, s->prefix);
    return 0;
}

static int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- heartbeat ---- */

/* Beats while the serve loop turned within the steady deadline (the longest stage 0
 * waits between two messages anyway); a SIGSTOP stops this thread with the rest. */
static void *heartbeat_thread(void *arg)
{
    struct s1_server *s = arg;
    int64_t stall_ns = (int64_t)(s->in_cfg.steady_deadline_s * 1e9);
    while (!atomic_load(&s->hb_stop)) {
        int64_t now = monotonic_ns();
        pthread_mutex_lock(&s->hb_mu);
        if (s->out && now - atomic_load(&s->loop_ns) < stall_ns) shmconn_heartbeat(s->out);
        pthread_mutex_unlock(&s->hb_mu);
        struct timespec t = {0, (long)(PIPE_HEARTBEAT_PERIOD_S * 1e9)};
        nanosleep(&t, NULL);
    }
    return NULL;
}

static int heartbeat_start(struct s1_server *s)
{
    atomic_store(&s->loop_ns, monotonic_ns());
    int rc = pthread_create(&s->hb, NULL, heartbeat_thread, s);
    if (rc) return mm3_errorf(-rc, "stage 1: heartbeat thread: %s", strerror(rc));
    s->hb_started = 1;
    return 0;
}

static void heartbeat_stop(struct s1_server *s)
{
    if (!s->hb_started) return;
    atomic_store(&s->hb_stop, 1);
    pthread_join(s->hb, NULL);
    s->hb_started = 0;
}

static int out_create(struct s1_server *s)
{
    pthread_mutex_lock(&s->hb_mu);
    int rc = shmconn_create(&s->out, &s->out_cfg);
    if (rc == 0) shmconn_heartbeat(s->out); /* attached stage 0 sees a live stage 1 at once */
    pthread_mutex_unlock(&s->hb_mu);
    if (rc == -EEXIST)
        return mm3_errorf(rc, "%s: another live stage 1 owns it (set MM3_SHM_PREFIX for a second deployment)",
                          mm3_last_error());
    if (rc < 0) return rc;
    LOG_INFO("channel %s created", shmconn_segment_name(s->out));
    return 0;
}

static int ready_signal(void)
{
    printf("READY stage1\n");
    fflush(stdout);
    const char *f = getenv("MM3_READY_FILE");
    if (!f || !*f) return 0;
    int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return mm3_errorf(-errno, "MM3_READY_FILE %s: cannot create: %s", f, strerror(errno));
    char line[64];
    int n = snprintf(line, sizeof line, "stage1 %d\n", (int)getpid());
    ssize_t w = write(fd, line, (size_t)n);
    close(fd);
    if (w != n) return mm3_errorf(-EIO, "MM3_READY_FILE %s: write failed", f);
    return 0;
}

/* ---- stage 0 comes and goes ---- */

static void in_try_open(struct s1_server *s, double *wait_since, double *last_log)
{
    int rc = shmconn_open(&s->in, &s->in_cfg, S1_OPEN_ATTEMPT_S);
    double now = s1_now();
    if (rc == 0) {
        LOG_INFO("stage 0 connected: reading %s", shmconn_segment_name(s->in));
        *wait_since = 0;
        return;
    }
    if (*wait_since == 0) *wait_since = now;
    if (*last_log == 0 || now - *last_log >= S1_WAIT_LOG_EVERY_S) {
        char seg[160];
        pipe_segment_name(&s->in_cfg, seg, sizeof seg);
        if (rc == SHMCONN_E_TIMEOUT)
            LOG_INFO("waiting for stage 0 to create %s (%.0f s so far)", seg, now - *wait_since);
        else
            LOG_ERROR("cannot open %s, retrying: %s", seg, mm3_last_error());
        *last_log = now;
    }
    if (rc != SHMCONN_E_TIMEOUT) usleep(200 * 1000); /* a refused region: do not spin on it */
}

/* Every request fails (nobody to tell), both channels are dropped and s1_to_s0 is
 * re-created: one consumer per region lifetime (docs/connector.md). */
static void stage0_lost(struct s1_server *s)
{
    LOG_WARN("stage 0 went away (%s); failing %d request(s) and waiting for a new stage 0", mm3_last_error(),
             s->n_reqs);
    shmconn_close(s->in);
    s->in = NULL;
    s->stage0_lost = 1; /* no ERROR messages: nobody reads them */
    while (s->n_reqs)
        s1_request_fail(s, s->reqs[0], 0, "stage 0 went away");
    pthread_mutex_lock(&s->hb_mu);
    shmconn_close(s->out);
    s->out = NULL;
    pthread_mutex_unlock(&s->hb_mu);
    s->stage0_lost = 0;
    if (out_create(s) < 0) LOG_ERROR("re-creating the output channel: %s (retrying)", mm3_last_error());
}

/* Receive and handle whatever stage 0 sent; the first receive may wait up to `wait_s`. */
static void drain(struct s1_server *s, double wait_s)
{
    for (int first = 1; !g_stop && s->in && !s->stage0_lost; first = 0) {
        struct shmconn_event ev;
        int rc = shmconn_recv(s->in, &ev, first ? wait_s : 0.0);
        if (rc == SHMCONN_E_TIMEOUT) return;
        if (rc < 0) {
            if (rc != SHMCONN_E_PEER_DEAD && rc != SHMCONN_E_CLOSED)
                LOG_ERROR("receiving from stage 0: %s; dropping the channel", mm3_last_error());
            s->stage0_lost = 1;
            return;
        }
        if (ev.type == SHMCONN_EVENT_MESSAGE) {
            s1_request_on_message(s, &ev.msg);
            if (s->in) shmconn_release(s->in, &ev.msg);
        } else {
            s1_request_on_event(s, &ev);
        }
    }
}

static void poll_cancels(struct s1_server *s)
{
    uint64_t id;
    uint32_t reason;
    while (s->out && shmconn_cancel_poll(s->out, &id, &reason) == 1)
        s1_request_drop(s, id,
                        reason == SHMCONN_CANCEL_TIMEOUT ? "stage 0 cancelled it (PCM deadline)"
                                                         : "stage 0 cancelled it (client gone)");
}

/* Waiting requests become active, in arrival order, while slots are free. */
static void admit(struct s1_server *s)
{
    int active = 0;
    for (int i = 0; i < s->n_reqs; i++)
        active += s->reqs[i]->active;
    for (int i = 0; i < s->n_reqs && active < s->max_active; i++) {
        struct s1_request *q = s->reqs[i];
        if (q->active) continue;
        if (s1_request_activate(s, q) < 0) {
            s1_request_fail(s, q, 1, "stage 1 could not start the request: %s", mm3_last_error());
            i--; /* the list shifted */
            continue;
        }
        active++;
    }
}

/* Vocode and emit every collected window, in arrival order; stage 0 is served between
 * windows. Requests that are complete are finished here too. */
static void finish_windows(struct s1_server *s)
{
    uint64_t ids[s->max_reqs + 1];
    int n = 0;
    for (int i = 0; i < s->n_reqs; i++)
        if (s->reqs[i]->active) ids[n++] = s->reqs[i]->id;
    /* a request whose next window is out in the batch still vocodes its previous one:
     * that is the overlap */
    for (int i = 0; i < n && !g_stop && !s->stage0_lost; i++) {
        struct s1_request *q = s1_request_find(s, ids[i]);
        if (!q || !q->active) continue;
        int had = render_window_unfinished(q->render) > 0;
        s1_request_step(s, q);
        atomic_store(&s->loop_ns, monotonic_ns());
        if (had) {
            drain(s, 0.0);
            poll_cancels(s);
        }
    }
}

/* One round: the next ready window of up to fb.max_windows active requests goes into ONE
 * flow batch, taken in stages[1].window_order (stage1/window_order.h) from the candidates
 * listed round robin from where the last round stopped. With a GPU batch the
 * previous round's windows are vocoded and sent while the DiT runs; the CPU batch runs in
 * begin, so there the windows are finished right after it. A request that fails or is
 * cancelled while its window is out is simply not collected (its latents are dropped). */
static void round_run(struct s1_server *s)
{
    struct flow_batch *fb = &s->fb;
    int n = 0, start = s->n_reqs ? s->rr % s->n_reqs : 0, n_cand = 0;
    double now = s1_now();
    for (int i = 0; i < s->n_reqs; i++) {
        struct s1_request *q = s->reqs[(start + i) % s->n_reqs];
        if (!q->active || !render_window_ready(q->render)) continue;
        s1_request_candidate(s, q, now, &s->cand[n_cand++]);
    }
    window_order_sort(s->st->window_order, s->cand, n_cand);
    for (int i = 0; i < n_cand && n < fb->max_windows && !s->stage0_lost; i++) {
        struct s1_request *q = s1_request_find(s, s->cand[i].id);
        if (!q || !q->active || !render_window_ready(q->render)) continue;
        if (s1_request_prepare(s, q, &s->jobs[n]) == 1) {
            s->job_ids[n++] = q->id;
            for (int k = 0; k < s->n_reqs; k++) /* round robin goes on after the one taken */
                if (s->reqs[k] == q) s->rr = k + 1;
        }
    }
    double t0 = s1_now();
    int brc = n ? fb->begin(fb->ctx, n, s->jobs) : 0;
    s->finishing_overlapped = fb->async && n;
    if (fb->async || !n) finish_windows(s);
    s->finishing_overlapped = 0;
    if (fb->async && n && !s->stage0_lost) { /* stage 0 is served while the DiT runs */
        drain(s, 0.0);
        if (!s->stage0_lost) poll_cancels(s);
    }
    if (n) {
        for (int i = 0; i < n; i++) {
            struct s1_request *q = s1_request_find(s, s->job_ids[i]);
            if (!q || !q->in_flow) s->jobs[i].x = NULL; /* gone while its window was out */
        }
        int erc = fb->end(fb->ctx, n, s->jobs, s->job_rc);
        double dt = s1_now() - t0;
        s->tot.compute_s += dt;
        LOG_DEBUG("flow batch of %d window(s): %.3f s", n, dt);
        for (int i = 0; i < n; i++) {
            struct s1_request *q = s1_request_find(s, s->job_ids[i]);
            if (!q || !q->in_flow) continue;
            s1_request_collect(s, q, brc < 0 ? brc : erc < 0 ? erc : s->job_rc[i], dt / n);
        }
        if (!fb->async) finish_windows(s);
    }
}

static void serve(struct s1_server *s)
{
    double wait_since = 0, last_log = 0, slice = s->in_cfg.wait_slice_s > 0 ? s->in_cfg.wait_slice_s : 0.05;
    while (!g_stop) {
        atomic_store(&s->loop_ns, monotonic_ns());
        if (!s->out) {
            if (out_create(s) < 0) {
                LOG_ERROR("%s (retrying)", mm3_last_error());
                usleep(500 * 1000);
            }
            continue;
        }
        if (!s->in) {
            in_try_open(s, &wait_since, &last_log);
            continue;
        }
        admit(s);
        int busy = 0; /* a window to run or to finish: do not sleep in drain */
        for (int i = 0; i < s->n_reqs && !busy; i++)
            busy = s1_request_ready(s->reqs[i]);
        drain(s, busy ? 0.0 : slice);
        if (!s->stage0_lost) poll_cancels(s);
        if (!s->stage0_lost) {
            admit(s);
            round_run(s);
        }
        if (s->stage0_lost) {
            stage0_lost(s);
            last_log = 0;
        }
    }
}

static void server_free(struct s1_server *s)
{
    heartbeat_stop(s);
    while (s->n_reqs)
        s1_request_remove(s, s->reqs[0]);
    free(s->reqs);
    free(s->cand);
    shmconn_close(s->in);
    shmconn_close(s->out);
    pthread_mutex_destroy(&s->hb_mu);
    if (s->fb.close) s->fb.close(s->fb.ctx);
    free(s->jobs), free(s->job_ids), free(s->job_rc);
    s1_backend_close(&s->be);
    condition_free(s->cm);
    dit_free(s->dm);
    vocoder_free(s->voc);
    mm3_deploy_free(&s->d);
}

int s1_server_run(const struct s1_server_options *o)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: every wait is a bounded slice anyway */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct s1_server *s = calloc(1, sizeof *s);
    if (!s) return mm3_errorf(-ENOMEM, "stage 1: out of memory");
    pthread_mutex_init(&s->hb_mu, NULL);
    int rc = server_load(s, o);
    if (rc == 0) {
        int n = shmconn_reclaim_stale(s->prefix);
        if (n > 0) LOG_INFO("removed %d stale segment(s) with prefix '%s'", n, s->prefix);
        rc = out_create(s);
    }
    if (rc == 0) rc = heartbeat_start(s);
    if (rc == 0) rc = ready_signal();
    if (rc < 0) {
        server_free(s);
        free(s);
        return rc;
    }
    serve(s);

    LOG_INFO("shutting down: failing %d request(s) in flight", s->n_reqs);
    /* a stage 0 that stopped reading must not hold the shutdown for a whole deadline */
    if (s->send_timeout_s > 1.0) s->send_timeout_s = 1.0;
    while (s->n_reqs)
        s1_request_fail(s, s->reqs[0], 1, "stage 1 shutting down");
    LOG_INFO("stage 1 totals: %" PRIu64 " requests done, %" PRIu64 " failed, %" PRIu64 " cancelled, %" PRId64
             " windows, %.2f s of audio, %.2f s computing",
             s->tot.requests_done, s->tot.requests_failed, s->tot.requests_cancelled, s->tot.windows, s->tot.audio_s,
             s->tot.compute_s);
    server_free(s);
    free(s);
    return 0;
}
