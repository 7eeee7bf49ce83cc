/* The engine's sending side (stage0/engine_internal.h): the scheduler's sink. */
#include "stage0/engine_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "common/metrics.h"
#include "pipe/pipe_codec.h"

/* ---- sending (step thread) ---- */

/* Send m (encoded by pipe/pipe_codec.h) as the job's next chunk to the worker its entry is
 * bound to. */
static int send_msg(struct engine *e, struct mm3_job *job, struct eng_req *r, struct shmconn_msg *m)
{
    struct s1_worker *w = r->w; /* written by this (the step) thread only */
    m->req_id = job->id;
    m->chunk = r->chunk++;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        bytes += m->tensors[i].nbytes;
    pthread_rwlock_rdlock(&w->conn_mu);
    int rc = SHMCONN_E_CLOSED;
    if (w->out) {
        /* A send that had to sleep (ring or payload area full: stage 1 is behind) is
         * backpressure: count it and its time for mm3_connector_waits / _wait_seconds. */
        struct shmconn_stats before, after;
        shmconn_stats_get(w->out, &before);
        int64_t t0 = mm3_job_now_ns();
        rc = shmconn_send(w->out, m, e->send_timeout_s);
        shmconn_stats_get(w->out, &after);
        if (after.waits > before.waits) {
            metrics_counter_add(&mm3_metrics.conn_waits[METRICS_EDGE_S0_TO_S1], after.waits - before.waits);
            metrics_counter_add(&mm3_metrics.conn_wait_us[METRICS_EDGE_S0_TO_S1],
                                (uint64_t)((mm3_job_now_ns() - t0) / 1000));
        }
    }
    pthread_rwlock_unlock(&w->conn_mu);
    if (rc == 0) metrics_counter_add(&mm3_metrics.conn_bytes[METRICS_EDGE_S0_TO_S1], bytes);
    return rc;
}


/* Fail a job whose send failed, with what the status means for the client. */
void eng_fail_send(struct engine *e, struct mm3_job *job, int rc, const char *what)
{
    if (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED)
        mm3_job_fail_kind(job, MM3_FAIL_STAGE1, "stage 1 died mid-song");
    else if (rc == SHMCONN_E_CANCELLED)
        mm3_job_fail_kind(job, MM3_FAIL_STAGE1, "stage 1 gave up on the request (its deadline expired or it failed)");
    else if (rc == SHMCONN_E_TIMEOUT)
        mm3_job_fail_kind(job, MM3_FAIL_STAGE1, "stage 1 did not take %s within %g s", what, e->send_timeout_s);
    else
        mm3_job_fail_kind(job, MM3_FAIL_STAGE1, "sending %s to stage 1 failed: %s", what, mm3_last_error());
}

void eng_capacity_publish(double cap)
{
    int64_t milli = (int64_t)(cap * 1000);
    if (cap < 0) milli = -1;
    if (cap > 1e12) milli = INT64_MAX; /* nothing measurable: unbounded */
    metrics_gauge_set(&mm3_metrics.realtime_capacity_milli, milli);
}

/* A stage-1 worker refuses songs beyond max_num_seqs(1) + max_num_seqs(0) ("stage 1 is
 * full"): a song whose frames are all sent still occupies it until DONE, so admission
 * waits for a live worker with room. Streams start like any song: whether one plays at
 * once or prerolls is decided at START, or at its first audio when it was alone at START
 * (engine_play.c). */
static int sink_can_start(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    if (atomic_load(&job->cancel_requested) || mm3_job_is_terminal(job)) return 1; /* let it leave the queue */
    pthread_mutex_lock(&e->mu);
    int ok = eng_pick_worker_locked(e) != NULL;
    pthread_mutex_unlock(&e->mu);
    return ok;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* Seconds until the song at `position` of the queue may start: the position-th song to be
 * wholly rendered frees its room, the songs sharing stage 1 evenly; -1 when unknown. */
static double sink_start_estimate(void *ctx, int position)
{
    struct engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    int n = e->n_reqs, i = 0;
    double left[n > 0 ? n : 1];
    for (const struct eng_req *r = e->reqs; r && i < n; r = r->next)
        left[i++] = eng_left_s_locked(e, r);
    double est = -1;
    if (position >= 1 && position <= i) {
        qsort(left, (size_t)i, sizeof *left, cmp_double);
        est = admission_render_estimate(&e->adm, left[position - 1], i);
    }
    pthread_mutex_unlock(&e->mu);
    return est;
}

/* The song's journal stays open until stage 1 delivered it (DONE) or it is lost: the
 * entry closes it when it goes (req_put). */
static void sink_journal(void *ctx, struct mm3_job *job, struct journal *jr, enum journal_stop stop, int n_frames)
{
    struct engine *e = ctx;
    struct eng_req *r = eng_req_get(e, job);
    if (!r) { /* already finished or failed */
        journal_close(jr, sched_journal_status(job), stop, n_frames);
        return;
    }
    pthread_mutex_lock(&e->mu);
    r->jr = jr;
    r->jr_owned = 1;
    r->jr_stop = stop;
    r->jr_frames = n_frames;
    pthread_mutex_unlock(&e->mu);
    eng_req_put(e, r);
}

/* The spool of the entry's journal, <journal_dir>/<request id>.mm3s; NULL when it
 * cannot be created (logged: a re-send then teacher-forces from the journal). */
struct frame_spool *eng_spool_open(struct engine *e, struct mm3_job *job, struct journal *jr)
{
    char *path = NULL, id[JOURNAL_ID_MAX];
    struct frame_spool *sp = NULL;
    if (frame_spool_path_for(journal_path(jr), &path, id) < 0 ||
        frame_spool_open(&sp, path, id, e->width, MM3_DTYPE_F32) < 0)
        LOG_WARN("job %llu: no frame spool (a re-send would teacher-force): %s", (unsigned long long)job->id,
                 mm3_last_error());
    free(path);
    return sp;
}

static void sink_journal_open(void *ctx, struct mm3_job *job, struct journal *jr, const int32_t *ids_pair,
                              int prompt_len)
{
    struct engine *e = ctx;
    struct eng_req *r = eng_req_get(e, job);
    if (!r) return;
    int32_t *ids = malloc(sizeof(int32_t) * 2 * (size_t)prompt_len);
    if (ids) memcpy(ids, ids_pair, sizeof(int32_t) * 2 * (size_t)prompt_len);
    struct frame_spool *sp = ids ? eng_spool_open(e, job, jr) : NULL; /* before the first frame */
    pthread_mutex_lock(&e->mu);
    r->jr = jr; /* lent; without the prompt copy a loss fails the job as before */
    r->ids = ids;
    r->prompt_len = prompt_len;
    r->spool = sp;
    pthread_mutex_unlock(&e->mu);
    eng_req_put(e, r);
}

static int sink_start(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    struct eng_req *r = calloc(1, sizeof *r);
    if (!r) {
        mm3_job_fail_kind(job, MM3_FAIL_INTERNAL, "stage 0: out of memory");
        return -1;
    }
    /* The song stays with this worker: its windows chain (each carries the last one's
     * overlap), so only a loss moves it, and then it starts over there. */
    pthread_mutex_lock(&e->mu);
    struct s1_worker *w = eng_pick_worker_locked(e);
    pthread_mutex_unlock(&e->mu);
    if (!w) {
        free(r);
        mm3_job_fail_kind(job, MM3_FAIL_UNAVAILABLE, "stage 1 unavailable");
        return -1;
    }
    mm3_job_ref(job);
    r->job = job;
    r->w = w;
    r->counted = eng_counts_as_stream(job);
    r->pcm_pushed = job->pcm_skip; /* a continuation's earlier part: as if the client had it */
    r->refs = 2; /* the table's and ours for the START below */
    int queued = 0, rows;
    sched_counts(e->sched, &queued, &rows); /* a burst's first song is not alone */
    atomic_store(&e->sched_queued, queued);
    pthread_mutex_lock(&e->mu);
    eng_play_decide_locked(e, r, queued);
    pthread_mutex_unlock(&e->mu);
    eng_req_add(e, r);
    if (e->n_workers > 1) LOG_INFO("job %llu: stage-1 worker %d", (unsigned long long)job->id, w->index);
    int rc = eng_send_start(e, job, r);
    eng_req_put(e, r);
    if (rc < 0) {
        if ((r = eng_req_take(e, job->id, NULL))) eng_req_put(e, r);
        pthread_rwlock_rdlock(&w->conn_mu);
        if (w->in) shmconn_request_end(w->in, job->id);
        pthread_rwlock_unlock(&w->conn_mu);
        eng_fail_send(e, job, rc, "the request");
        return -1;
    }
    return 0;
}

/* START with the job's parameters (the same on a re-send: stage-1 noise is a pure
 * function of the seed, so the audio is the same). */
int eng_send_start(struct engine *e, struct mm3_job *job, struct eng_req *r)
{
    struct s1_worker *w = r->w;
    pthread_rwlock_rdlock(&w->conn_mu);
    if (w->in) shmconn_request_begin(w->in, job->id);
    pthread_rwlock_unlock(&w->conn_mu);
    pthread_mutex_lock(&e->mu);
    int preroll = r->preroll;
    r->play_unsent = 0; /* START says whether it plays */
    pthread_mutex_unlock(&e->mu);
    struct pipe_request_params p = {
        .version = PIPE_PARAMS_VERSION,
        .frame_width = (uint32_t)e->width,
        .seed = job->params.seed,
        .max_frames = job->params.max_frames,
        .num_inference_steps = job->params.num_inference_steps,
        .guidance_scale = job->params.guidance_scale,
        .flow_shift = job->params.flow_shift,
        .streamed = eng_counts_as_stream(job),
        .preroll = preroll,
        .sample_rate = job->pcm_rate, /* the HTTP layer resamples to the request's rate */
        .premixed = !e->raw,
    };
    const char *replay = job->params.replay_file;
    struct pipe_start st = {.params = p, .replay = replay, .replay_len = replay ? strlen(replay) : 0};
    struct shmconn_msg m;
    int rc = pipe_encode_start(&m, &st);
    return rc < 0 ? rc : send_msg(e, job, r, &m);
}

int eng_send_play(struct engine *e, struct eng_req *r, int64_t t_play_us)
{
    struct shmconn_msg m;
    int rc = pipe_encode_play(&m, &t_play_us);
    return rc < 0 ? rc : send_msg(e, r->job, r, &m);
}

static int send_frames(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int n, const float *mixed)
{
    struct pipe_frames f = {.frames = mixed, .n = n, .width = e->width, .first = first};
    struct shmconn_msg m;
    int rc = pipe_encode_frames(&m, &f);
    if (rc == 0) rc = send_msg(e, job, r, &m);
    if (rc == 0) {
        pthread_mutex_lock(&e->mu);
        r->frames_sent += n;
        pthread_mutex_unlock(&e->mu);
    }
    if (rc < 0 && (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED) && eng_hold(e, r)) return 1;
    if (rc < 0) eng_fail_send(e, job, rc, "frames");
    return rc;
}

static int sink_frames(void *ctx, struct mm3_job *job, int first, int n, const float *frames, int width)
{
    struct engine *e = ctx;
    struct eng_req *r = eng_req_get(e, job);
    if (!r) return -1; /* stage 1 already ended it (error, loss): stop generating */
    pthread_mutex_lock(&e->mu);
    int awaiting = r->awaiting;
    pthread_mutex_unlock(&e->mu);
    /* Held for stage 1: the frames only go to the spool, the re-send reads them back. */
    int rc = eng_frames_to_stage1(e, job, r, first, n, frames, width, !awaiting);
    eng_req_put(e, r);
    return rc;
}

/* Payload frames [first, first + k) to stage 1: sent (async_chunk), or kept for the
 * end of the song. -1: the job failed; 1: stage 1 was lost, the entry is held. */
int eng_payload_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int k,
                          const float *payload)
{
    int H = e->width;
    if (e->d->async_chunk) {
        int rc = send_frames(e, job, r, first, k, payload);
        return rc < 0 ? -1 : rc;
    }
    if (r->n_held + k > r->cap_held) {
        int cap = r->cap_held ? 2 * r->cap_held : 256;
        while (cap < r->n_held + k)
            cap *= 2;
        float *nh = realloc(r->held, sizeof(float) * (size_t)cap * H);
        if (!nh) {
            mm3_job_fail_kind(job, MM3_FAIL_INTERNAL, "stage 0: out of memory holding %d frames", cap);
            return -1;
        }
        r->held = nh;
        r->cap_held = cap;
    }
    memcpy(r->held + (size_t)r->n_held * H, payload, sizeof(float) * (size_t)k * H);
    r->n_held += k;
    return 0;
}

/* Frames [first, first + n) of the model (width floats each) as payloads (pre-mixed,
 * or raw): each one into the spool, then to stage 1 unless send is 0 or stage 1 was
 * lost meanwhile (held: the re-send reads them back from the spool). */
int eng_frames_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int n,
                         const float *frames, int width, int send)
{
    for (int i = 0; i < n; i += HELD_FRAMES_PER_MSG) {
        int k = n - i < HELD_FRAMES_PER_MSG ? n - i : HELD_FRAMES_PER_MSG;
        if (e->raw)
            memcpy(e->mixed, frames + (size_t)i * width, sizeof(float) * (size_t)k * width);
        else if (frame_mix_apply(&e->mix, frames + (size_t)i * width, k, width, e->mixed) < 0) {
            mm3_job_fail_kind(job, MM3_FAIL_INTERNAL, "stage 0: %s", mm3_last_error());
            return -1;
        }
        frame_spool_append(r->spool, first + i, k, e->mixed); /* never fails the song */
        if (!send) continue;
        int rc = eng_payload_to_stage1(e, job, r, first + i, k, e->mixed);
        if (rc < 0) return -1;
        if (rc > 0) send = 0;
    }
    return 0;
}

int eng_end_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int total)
{
    int H = e->width;
    for (int i = 0; i < r->n_held; i += HELD_FRAMES_PER_MSG) {
        int k = r->n_held - i < HELD_FRAMES_PER_MSG ? r->n_held - i : HELD_FRAMES_PER_MSG;
        int rc = send_frames(e, job, r, i, k, r->held + (size_t)i * H);
        if (rc < 0) return -1;
        if (rc > 0) goto ended;
    }
    int64_t tot = total;
    struct shmconn_msg m;
    int rc = pipe_encode_end(&m, &tot);
    if (rc == 0) rc = send_msg(e, job, r, &m);
    if (rc < 0 && (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED) && eng_hold(e, r)) goto ended;
    if (rc < 0) {
        eng_fail_send(e, job, rc, "the end of the song");
        return -1;
    }
ended: /* delivered or not: a stage 1 lost later renders the song anew, the re-send ends it */
    pthread_mutex_lock(&e->mu);
    r->ended = 1;
    r->total = total;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static int sink_end(void *ctx, struct mm3_job *job, int total)
{
    struct engine *e = ctx;
    struct eng_req *r = eng_req_get(e, job);
    if (!r) return -1;
    pthread_mutex_lock(&e->mu);
    int awaiting = r->awaiting;
    if (awaiting) {
        r->ended = 1;
        r->total = total;
    }
    pthread_mutex_unlock(&e->mu);
    int rc = awaiting ? 0 : eng_end_to_stage1(e, job, r, total);
    eng_req_put(e, r);
    return rc;
}

/* The song's codes, kept on the entry until stage 1 delivers it (eng_continue_keep). */
static void sink_codes(void *ctx, struct mm3_job *job, const int32_t *codes, int n_steps, int n_codebooks)
{
    struct engine *e = ctx;
    struct eng_req *r = eng_req_get(e, job);
    if (!r) return;
    size_t n = (size_t)n_steps * n_codebooks;
    int32_t *copy = malloc(sizeof(int32_t) * (n ? n : 1));
    if (copy)
        memcpy(copy, codes, sizeof(int32_t) * n);
    else
        LOG_WARN("job %llu: out of memory: the song will not be kept for continuation", (unsigned long long)job->id);
    pthread_mutex_lock(&e->mu);
    free(r->codes);
    r->codes = copy;
    r->n_steps = n_steps;
    r->n_codebooks = n_codebooks;
    pthread_mutex_unlock(&e->mu);
    eng_req_put(e, r);
}

static void sink_abort(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    struct eng_req *r = eng_req_take(e, job->id, NULL);
    if (!r) return; /* stage 1 ended it first: nothing to tell */
    int told = 0;
    struct s1_worker *w = r->w;
    if (atomic_load(&w->up)) {
        struct shmconn_msg m;
        pipe_encode_cancel(&m);
        int rc = send_msg(e, job, r, &m);
        told = rc == 0;
        if (rc < 0 && rc != SHMCONN_E_CANCELLED)
            LOG_WARN("job %llu: CANCEL to stage 1 not sent: %s", (unsigned long long)job->id, mm3_last_error());
    }
    pthread_rwlock_rdlock(&w->conn_mu);
    if (w->in) shmconn_request_cancel(w->in, job->id);
    pthread_rwlock_unlock(&w->conn_mu);
    LOG_INFO("job %llu: %s; %s, rows freed", (unsigned long long)job->id,
             atomic_load(&job->cancel_requested) ? "client went away" : "failed",
             told ? "cancelled in both stages" : "stage 1 not told (gone)");
    eng_req_put(e, r);
}

void eng_sink_fill(struct engine *e, struct sched_sink *sink)
{
    *sink = (struct sched_sink){.ctx = e,
                                .can_start = sink_can_start,
                                .start_estimate = sink_start_estimate,
                                .on_start = sink_start,
                                .on_frames = sink_frames,
                                .on_end = sink_end,
                                .on_abort = sink_abort,
                                .on_journal = sink_journal,
                                .on_journal_open = sink_journal_open,
                                .on_codes = sink_codes,
                                .on_tick = eng_sink_tick};
}
