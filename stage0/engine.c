#include "stage0/engine.h"

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
#include "pipe/pipe_codec.h"
#include "shmconn/shmconn.h"
#include "stage0/admission.h"
#include "stage0/recovery/frame_spool.h"
#include "stage0/generate.h"
#include "stage0/recovery/journal_sweep.h"
#include "stage0/playback.h"
#include "stage0/scheduler.h"
#include "stage0/teacher_force.h"

/* Frames per FRAMES message when a held song (async_chunk: false) is sent at its end. */
#define HELD_FRAMES_PER_MSG 100
/* How long the receiver waits for a slow client before failing its job. */
#define PCM_PUSH_TIMEOUT_MS 30000

/* Stage-1 side of one job: from START until DONE / ERROR / cancel / loss. */
struct eng_req {
    int refs;            /* the table's + each thread using it (under engine.mu) */
    struct mm3_job *job; /* one reference */
    uint32_t chunk;      /* next chunk index (step thread only) */
    float *held;         /* async_chunk false: frames kept until the end */
    int n_held, cap_held;
    /* Journal (api.journal_dir): lent by the scheduler while it generates, handed
     * over (jr_owned) when generation ended; an owned one is closed with the entry. */
    struct journal *jr;
    int jr_owned;
    enum journal_stop jr_stop;
    int jr_frames;
    int32_t *ids; /* [2, prompt_len] copy: the prompt of a re-send */
    int prompt_len;
    /* The payloads sent (or, while held, to be sent) so far, beside the journal: a
     * re-send reads them back instead of teacher forcing (step thread only). */
    struct frame_spool *spool;
    /* Stage 1 lost mid-song with a journal: held until it is back (step thread re-sends). */
    int awaiting;
    int64_t await_since_ns;
    int ended, total; /* generation ended (END sent or not): a re-send ends the song too */
    /* PCM (under engine.mu): sample frames got from the current stage 1, and pushed
     * to the client over all attempts; a re-sent song skips what was pushed. */
    int64_t pcm_got, pcm_pushed;
    /* A stream admitted against stage 1's real-time capacity (stage0/admission.h), and the
     * stage-1 work (microseconds, its progress tensor) already fed to the estimate. */
    int counted;
    int64_t work_us_seen;
    struct playback play; /* streamed: its listener, for the stall metrics (under engine.mu) */
    struct eng_req *next;
};

struct engine {
    const struct mm3_deploy *d;
    time_t created_unix; /* before any journal of this process (the start-up sweep) */
    struct sched *sched;
    struct api_engine api;
    struct frame_mix mix;
    int raw_width;
    float *mixed; /* [HELD_FRAMES_PER_MSG, hidden] step-thread scratch */
    char prefix[32];
    struct shmconn_config cfg_out, cfg_in;
    double send_timeout_s;
    int raw;   /* MM3_STAGE0_RAW_FRAMES=1: send unmixed frames (premixed 0), to compare */
    int width; /* floats per frame sent: mix.hidden, or raw_width when raw */

    pthread_rwlock_t conn_mu; /* read: any use of a handle (they are thread-safe); write: swapping them */
    shmconn_t *out, *in;
    _Atomic int s1_up;
    _Atomic int stopping;

    pthread_mutex_t mu;   /* guards reqs, n_reqs, adm */
    struct admission adm; /* stage 1's measured work per audio second: its real-time capacity */
    double fps;           /* AR frames per second of audio */
    uint64_t held_job;     /* the last stream admission held (logged once) */
    int held_for_capacity; /* the queue's head waits for real-time capacity (not for room in stage 1) */
    struct eng_req *reqs;
    int n_reqs, max_reqs;   /* songs stage 1 holds at once (its own bound) */
    _Atomic int n_awaiting; /* entries held for a stage-1 restart */
    pthread_t rx;
    int rx_started;
    /* mm3_job_now_ns of the last turn of the receiver and of the step loop (readiness) */
    _Atomic int64_t rx_turn_ns, step_turn_ns;
    int64_t last_connect_log_ns;
};

/* ---- the request table ---- */

/* A streamed song whose client did not accept stalls: it gets playback deadlines in
 * stage 1 and counts against the real-time capacity. */
static int counts_as_stream(const struct mm3_job *job)
{
    return job->params.stream && !job->params.allow_stall;
}

static int streams_locked(const struct engine *e)
{
    int n = 0;
    for (const struct eng_req *r = e->reqs; r; r = r->next)
        n += r->counted;
    return n;
}

static void req_add(struct engine *e, struct eng_req *r)
{
    pthread_mutex_lock(&e->mu);
    r->next = e->reqs;
    e->reqs = r;
    e->n_reqs++;
    metrics_gauge_set(&mm3_metrics.streams_admitted, streams_locked(e));
    pthread_mutex_unlock(&e->mu);
}

/* Unlink the entry of job id (NULL if gone); the caller owns it then. */
static struct eng_req *req_take(struct engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req **pp = &e->reqs, *r;
    while ((r = *pp) && r->job->id != id)
        pp = &r->next;
    if (r) {
        *pp = r->next;
        e->n_reqs--;
        metrics_gauge_set(&mm3_metrics.streams_admitted, streams_locked(e));
    }
    pthread_mutex_unlock(&e->mu);
    return r;
}

/* A referenced job of id, without unlinking (NULL if gone). */
static struct mm3_job *req_job(struct engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req *r = e->reqs;
    while (r && r->job->id != id)
        r = r->next;
    struct mm3_job *j = r ? r->job : NULL;
    if (j) mm3_job_ref(j);
    pthread_mutex_unlock(&e->mu);
    return j;
}

static struct eng_req *req_find_locked(struct engine *e, struct mm3_job *job)
{
    struct eng_req *r = e->reqs;
    while (r && r->job != job)
        r = r->next;
    return r;
}

/* Drop a reference to an entry (the one req_take handed over, or req_get's). */
static void req_put(struct engine *e, struct eng_req *r)
{
    pthread_mutex_lock(&e->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&e->mu);
    if (!last) return;
    if (r->job->params.stream && r->play.started && mm3_job_state(r->job) == MM3_JOB_DONE)
        metrics_histogram_observe(&mm3_metrics.stream_stall_seconds, r->play.stall_s);
    if (r->jr && r->jr_owned) journal_close(r->jr, sched_journal_status(r->job), r->jr_stop, r->jr_frames);
    if (r->awaiting) atomic_fetch_sub(&e->n_awaiting, 1);
    frame_spool_remove(r->spool); /* no re-send can follow */
    mm3_job_unref(r->job);
    free(r->ids);
    free(r->held);
    free(r);
}

/* The entry of a job with a reference for the caller, so that the receiver may
 * unlink it meanwhile (NULL if gone). */
static struct eng_req *req_get(struct engine *e, struct mm3_job *job)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req *r = req_find_locked(e, job);
    if (r) r->refs++;
    pthread_mutex_unlock(&e->mu);
    return r;
}

/* ---- sending (step thread) ---- */

/* Send m (encoded by pipe/pipe_codec.h) as the job's next chunk. */
static int send_msg(struct engine *e, struct mm3_job *job, struct eng_req *r, struct shmconn_msg *m)
{
    m->req_id = job->id;
    m->chunk = r ? r->chunk++ : 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        bytes += m->tensors[i].nbytes;
    pthread_rwlock_rdlock(&e->conn_mu);
    int rc = SHMCONN_E_CLOSED;
    if (e->out) {
        /* A send that had to sleep (ring or payload area full: stage 1 is behind) is
         * backpressure: count it and its time for mm3_connector_waits / _wait_seconds. */
        struct shmconn_stats before, after;
        shmconn_stats_get(e->out, &before);
        int64_t t0 = mm3_job_now_ns();
        rc = shmconn_send(e->out, m, e->send_timeout_s);
        shmconn_stats_get(e->out, &after);
        if (after.waits > before.waits) {
            metrics_counter_add(&mm3_metrics.conn_waits[METRICS_EDGE_S0_TO_S1], after.waits - before.waits);
            metrics_counter_add(&mm3_metrics.conn_wait_us[METRICS_EDGE_S0_TO_S1],
                                (uint64_t)((mm3_job_now_ns() - t0) / 1000));
        }
    }
    pthread_rwlock_unlock(&e->conn_mu);
    if (rc == 0) metrics_counter_add(&mm3_metrics.conn_bytes[METRICS_EDGE_S0_TO_S1], bytes);
    return rc;
}

/* Hold an entry with a journal for stage 1's return instead of failing it (engine.mu
 * held). Returns 1 when held. */
static int hold_locked(struct engine *e, struct eng_req *r)
{
    if (!r->jr || !r->ids) return 0;
    if (!r->awaiting) {
        r->awaiting = 1;
        r->await_since_ns = mm3_job_now_ns();
        atomic_fetch_add(&e->n_awaiting, 1);
        LOG_WARN("job %llu: stage 1 lost mid-song; journaled, waiting up to %g s for it to come back",
                 (unsigned long long)r->job->id, e->cfg_out.first_chunk_deadline_s);
    }
    return 1;
}

static int hold(struct engine *e, struct eng_req *r)
{
    pthread_mutex_lock(&e->mu);
    int held = hold_locked(e, r);
    pthread_mutex_unlock(&e->mu);
    return held;
}

/* Fail a job whose send failed, with what the status means for the client. */
static void fail_send(struct engine *e, struct mm3_job *job, int rc, const char *what)
{
    if (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED)
        mm3_job_fail(job, 502, "stage 1 died mid-song");
    else if (rc == SHMCONN_E_CANCELLED)
        mm3_job_fail(job, 502, "stage 1 gave up on the request (its deadline expired or it failed)");
    else if (rc == SHMCONN_E_TIMEOUT)
        mm3_job_fail(job, 502, "stage 1 did not take %s within %g s", what, e->send_timeout_s);
    else
        mm3_job_fail(job, 502, "sending %s to stage 1 failed: %s", what, mm3_last_error());
}

static void capacity_publish(double cap)
{
    int64_t milli = (int64_t)(cap * 1000);
    if (cap < 0) milli = -1;
    if (cap > 1e12) milli = INT64_MAX; /* nothing measurable: unbounded */
    metrics_gauge_set(&mm3_metrics.realtime_capacity_milli, milli);
}

/* Stage 1 refuses songs beyond max_num_seqs(1) + max_num_seqs(0) ("stage 1 is full"):
 * a song whose frames are all sent still occupies it until DONE, so admission waits.
 * A stream also waits while the streams admitted use stage 1's real-time capacity. */
static int sink_can_start(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    if (atomic_load(&job->cancel_requested) || mm3_job_is_terminal(job)) return 1; /* let it leave the queue */
    pthread_mutex_lock(&e->mu);
    int ok = e->n_reqs < e->max_reqs, streams = streams_locked(e);
    int held = ok && counts_as_stream(job) && !admission_allows(&e->adm, streams);
    double cap = admission_capacity(&e->adm), w = admission_work_per_audio(&e->adm);
    int first_hold = held && e->held_job != job->id;
    if (held) e->held_job = job->id;
    e->held_for_capacity = held;
    pthread_mutex_unlock(&e->mu);
    capacity_publish(cap);
    if (first_hold)
        LOG_INFO("job %llu: stream waits: %d streams play, real-time capacity %.2f (stage 1 works %.3f s per audio "
                 "second)",
                 (unsigned long long)job->id, streams, cap, w);
    return ok && !held;
}

/* Seconds until the song at `position` of the queue may start while streams hold it. */
static double sink_start_estimate(void *ctx, int position)
{
    struct engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    int n = e->held_for_capacity ? streams_locked(e) : 0; /* 0: unknown */
    double left[n > 0 ? n : 1];
    int i = 0;
    for (const struct eng_req *r = e->reqs; r && i < n; r = r->next) {
        if (!r->counted) continue;
        const struct mm3_job *j = r->job;
        left[i++] = (double)atomic_load(&j->frames_total) / e->fps - (double)r->pcm_got / j->pcm_rate;
    }
    double est = admission_start_estimate(&e->adm, left, n, position);
    pthread_mutex_unlock(&e->mu);
    return est;
}

static int send_start(struct engine *e, struct mm3_job *job, struct eng_req *r);

/* The song's journal stays open until stage 1 delivered it (DONE) or it is lost: the
 * entry closes it when it goes (req_put). */
static void sink_journal(void *ctx, struct mm3_job *job, struct journal *jr, enum journal_stop stop, int n_frames)
{
    struct engine *e = ctx;
    struct eng_req *r = req_get(e, job);
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
    req_put(e, r);
}

/* The spool of the entry's journal, <journal_dir>/<request id>.mm3s; NULL when it
 * cannot be created (logged: a re-send then teacher-forces from the journal). */
static struct frame_spool *spool_open(struct engine *e, struct mm3_job *job, struct journal *jr)
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
    struct eng_req *r = req_get(e, job);
    if (!r) return;
    int32_t *ids = malloc(sizeof(int32_t) * 2 * (size_t)prompt_len);
    if (ids) memcpy(ids, ids_pair, sizeof(int32_t) * 2 * (size_t)prompt_len);
    struct frame_spool *sp = ids ? spool_open(e, job, jr) : NULL; /* before the first frame */
    pthread_mutex_lock(&e->mu);
    r->jr = jr; /* lent; without the prompt copy a loss fails the job as before */
    r->ids = ids;
    r->prompt_len = prompt_len;
    r->spool = sp;
    pthread_mutex_unlock(&e->mu);
    req_put(e, r);
}

static int sink_start(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    if (!atomic_load(&e->s1_up)) {
        mm3_job_fail(job, 503, "stage 1 unavailable");
        return -1;
    }
    struct eng_req *r = calloc(1, sizeof *r);
    if (!r) {
        mm3_job_fail(job, 500, "stage 0: out of memory");
        return -1;
    }
    mm3_job_ref(job);
    r->job = job;
    r->counted = counts_as_stream(job);
    r->refs = 2; /* the table's and ours for the START below */
    req_add(e, r);
    int rc = send_start(e, job, r);
    req_put(e, r);
    if (rc < 0) {
        if ((r = req_take(e, job->id))) req_put(e, r);
        pthread_rwlock_rdlock(&e->conn_mu);
        if (e->in) shmconn_request_end(e->in, job->id);
        pthread_rwlock_unlock(&e->conn_mu);
        fail_send(e, job, rc, "the request");
        return -1;
    }
    return 0;
}

/* START with the job's parameters (the same on a re-send: stage-1 noise is a pure
 * function of the seed, so the audio is the same). */
static int send_start(struct engine *e, struct mm3_job *job, struct eng_req *r)
{
    pthread_rwlock_rdlock(&e->conn_mu);
    if (e->in) shmconn_request_begin(e->in, job->id);
    pthread_rwlock_unlock(&e->conn_mu);
    struct pipe_request_params p = {
        .version = PIPE_PARAMS_VERSION,
        .frame_width = (uint32_t)e->width,
        .seed = job->params.seed,
        .max_frames = job->params.max_frames,
        .num_inference_steps = job->params.num_inference_steps,
        .guidance_scale = job->params.guidance_scale,
        .flow_shift = job->params.flow_shift,
        .streamed = counts_as_stream(job),
        .sample_rate = job->pcm_rate, /* the HTTP layer resamples to the request's rate */
        .premixed = !e->raw,
    };
    const char *replay = job->params.replay_file;
    struct pipe_start st = {.params = p, .replay = replay, .replay_len = replay ? strlen(replay) : 0};
    struct shmconn_msg m;
    int rc = pipe_encode_start(&m, &st);
    return rc < 0 ? rc : send_msg(e, job, r, &m);
}

static int send_frames(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int n, const float *mixed)
{
    struct pipe_frames f = {.frames = mixed, .n = n, .width = e->width, .first = first};
    struct shmconn_msg m;
    int rc = pipe_encode_frames(&m, &f);
    if (rc == 0) rc = send_msg(e, job, r, &m);
    if (rc < 0 && (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED) && hold(e, r)) return 1;
    if (rc < 0) fail_send(e, job, rc, "frames");
    return rc;
}

static int frames_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int n,
                            const float *frames, int width, int send);

static int sink_frames(void *ctx, struct mm3_job *job, int first, int n, const float *frames, int width)
{
    struct engine *e = ctx;
    struct eng_req *r = req_get(e, job);
    if (!r) return -1; /* stage 1 already ended it (error, loss): stop generating */
    pthread_mutex_lock(&e->mu);
    int awaiting = r->awaiting;
    pthread_mutex_unlock(&e->mu);
    /* Held for stage 1: the frames only go to the spool, the re-send reads them back. */
    int rc = frames_to_stage1(e, job, r, first, n, frames, width, !awaiting);
    req_put(e, r);
    return rc;
}

/* Payload frames [first, first + k) to stage 1: sent (async_chunk), or kept for the
 * end of the song. -1: the job failed; 1: stage 1 was lost, the entry is held. */
static int payload_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int k,
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
            mm3_job_fail(job, 500, "stage 0: out of memory holding %d frames", cap);
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
static int frames_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int n,
                            const float *frames, int width, int send)
{
    for (int i = 0; i < n; i += HELD_FRAMES_PER_MSG) {
        int k = n - i < HELD_FRAMES_PER_MSG ? n - i : HELD_FRAMES_PER_MSG;
        if (e->raw)
            memcpy(e->mixed, frames + (size_t)i * width, sizeof(float) * (size_t)k * width);
        else if (frame_mix_apply(&e->mix, frames + (size_t)i * width, k, width, e->mixed) < 0) {
            mm3_job_fail(job, 500, "stage 0: %s", mm3_last_error());
            return -1;
        }
        frame_spool_append(r->spool, first + i, k, e->mixed); /* never fails the song */
        if (!send) continue;
        int rc = payload_to_stage1(e, job, r, first + i, k, e->mixed);
        if (rc < 0) return -1;
        if (rc > 0) send = 0;
    }
    return 0;
}

static int end_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int total)
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
    if (rc < 0 && (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED) && hold(e, r)) goto ended;
    if (rc < 0) {
        fail_send(e, job, rc, "the end of the song");
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
    struct eng_req *r = req_get(e, job);
    if (!r) return -1;
    pthread_mutex_lock(&e->mu);
    int awaiting = r->awaiting;
    if (awaiting) {
        r->ended = 1;
        r->total = total;
    }
    pthread_mutex_unlock(&e->mu);
    int rc = awaiting ? 0 : end_to_stage1(e, job, r, total);
    req_put(e, r);
    return rc;
}

static void sink_abort(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    struct eng_req *r = req_take(e, job->id);
    if (!r) return; /* stage 1 ended it first: nothing to tell */
    int told = 0;
    if (atomic_load(&e->s1_up)) {
        struct shmconn_msg m;
        pipe_encode_cancel(&m);
        int rc = send_msg(e, job, r, &m);
        told = rc == 0;
        if (rc < 0 && rc != SHMCONN_E_CANCELLED)
            LOG_WARN("job %llu: CANCEL to stage 1 not sent: %s", (unsigned long long)job->id, mm3_last_error());
    }
    pthread_rwlock_rdlock(&e->conn_mu);
    if (e->in) shmconn_request_cancel(e->in, job->id);
    pthread_rwlock_unlock(&e->conn_mu);
    LOG_INFO("job %llu: %s; %s, rows freed", (unsigned long long)job->id,
             atomic_load(&job->cancel_requested) ? "client went away" : "failed",
             told ? "cancelled in both stages" : "stage 1 not told (gone)");
    req_put(e, r);
}

/* ---- re-sending a held song (step thread) ---- */

struct resend_ctx {
    struct engine *e;
    struct eng_req *r;
};

static int resend_emit(void *ctx, int t0, const float *frames, int n)
{
    struct resend_ctx *c = ctx;
    return frames_to_stage1(c->e, c->r->job, c->r, t0, n, frames, c->e->raw_width, 1) < 0 ? -EPIPE : 0;
}

struct spool_ctx {
    struct engine *e;
    struct eng_req *r;
    int sent; /* frames handed to stage 1 */
};

/* Spooled payloads go out as they were first sent: no mix, not spooled again. */
static int spool_emit(void *ctx, int first, const void *frames, int n)
{
    struct spool_ctx *c = ctx;
    int rc = payload_to_stage1(c->e, c->r->job, c->r, first, n, frames);
    if (rc < 0) return -EPIPE;
    c->sent += n;
    return rc; /* 1: lost again, stop reading */
}

/* Frames 0..n-1 to stage 1 from the spool. Returns 0, 1 (stage 1 lost again: held),
 * -EPIPE (the job failed: a send, or the spool broke after frames went out), or
 * another error when the spool is not usable and nothing was sent (message set). */
static int resend_from_spool(struct engine *e, struct eng_req *r, int *n)
{
    *n = 0;
    struct frame_spool *sp = r->spool;
    /* The journal has a step per frame plus step 0: a spool that disagrees missed frames. */
    int want = frame_spool_frames(sp), steps = journal_steps(r->jr);
    if (sp && !frame_spool_disabled(sp) && !journal_disabled(r->jr) && steps - 1 != want && !(steps == 0 && want == 0))
        return mm3_errorf(-ENODATA, "frame spool %s: %d frames, but the journal has %d steps (%d frames)",
                          frame_spool_path(sp), want, steps, steps - 1);
    struct spool_ctx c = {e, r, 0};
    struct frame_spool_sink sink = {.ctx = &c, .emit = spool_emit};
    int rc = frame_spool_read_back(sp, HELD_FRAMES_PER_MSG, &sink, n);
    if (rc == -EPIPE || rc == 1) return rc;
    if (rc < 0 && c.sent > 0) {
        mm3_job_fail(r->job, 502,
                     "stage 1 died mid-song and re-sending from the frame spool failed after %d frames: %s", c.sent,
                     mm3_last_error());
        return -EPIPE;
    }
    return rc;
}

/* Out of the table after a failed re-send (stage 1 will not answer for it). */
static void drop(struct engine *e, struct mm3_job *job)
{
    struct eng_req *t = req_take(e, job->id);
    if (t) req_put(e, t);
}

/* Stage 1 is back: START again, frames 0..n-1 as first sent from the spool (or, when
 * it is missing, short or unreadable, recomputed by teacher forcing from the journal;
 * generation continues live from n, nothing runs in between on this thread), and
 * END if generation already ended. */
static void resend(struct engine *e, struct eng_req *r)
{
    struct mm3_job *job = r->job;
    pthread_mutex_lock(&e->mu);
    r->awaiting = 0;
    atomic_fetch_sub(&e->n_awaiting, 1);
    r->pcm_got = 0;
    r->n_held = 0;
    r->chunk = 0;
    int ended = r->ended, total = r->total;
    pthread_mutex_unlock(&e->mu);
    int rc = send_start(e, job, r);
    if (rc < 0) {
        if (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED) {
            hold(e, r);
            return;
        }
        fail_send(e, job, rc, "the request again");
        drop(e, job);
        return;
    }
    int n = 0, spooled = 1;
    rc = resend_from_spool(e, r, &n);
    if (rc < 0 && rc != -EPIPE) {
        /* Nothing went out: start a fresh spool, which the recomputed frames fill, so
         * that a later loss reads them back. */
        spooled = 0;
        LOG_WARN("job %llu: %s: re-sending by teacher forcing from the journal", (unsigned long long)job->id,
                 mm3_last_error());
        frame_spool_remove(r->spool);
        r->spool = r->jr ? spool_open(e, job, r->jr) : NULL;
        struct resend_ctx c = {e, r};
        struct teacher_force_sink sink = {.ctx = &c, .emit = resend_emit};
        /* On the scheduler's spare row, on the backend the song was generated on. */
        const struct talker_backend *be;
        int row = sched_spare_row(e->sched, &be);
        rc = row < 0 ? mm3_errorf(-ENODATA, "no spare talker row to teacher-force on (journaling is off)")
                     : teacher_force_journal(be, row, r->jr, r->ids, r->prompt_len, &sink, &n);
        if (rc < 0 && rc != -EPIPE) {
            mm3_job_fail(job, 502, "stage 1 died mid-song and the journal cannot re-send it: %s", mm3_last_error());
            drop(e, job);
            return;
        }
    }
    pthread_mutex_lock(&e->mu);
    int again = r->awaiting;
    pthread_mutex_unlock(&e->mu);
    if (again) return; /* lost again: held */
    if (rc < 0) {      /* a send failed: the job is failed */
        drop(e, job);
        return;
    }
    if (spooled)
        LOG_INFO("job %llu: stage 1 is back: re-sent %d frames from the frame spool %s%s", (unsigned long long)job->id,
                 n, frame_spool_path(r->spool), ended ? " and the end" : "; live frames continue");
    else
        LOG_INFO("job %llu: stage 1 is back: re-sent %d journaled frames (teacher forcing)%s",
                 (unsigned long long)job->id, n, ended ? " and the end" : "; live frames continue");
    if (ended && end_to_stage1(e, job, r, total) < 0) drop(e, job);
}

/* Stage 1 attached and its channel's consumer not dead. A song is held on the
 * receiver's PEER_LOST event before it marks the stage lost (s1_up): without the
 * peer check the step thread would re-send into the dead one at once. */
static int stage1_alive(struct engine *e)
{
    if (!atomic_load(&e->s1_up)) return 0;
    pthread_rwlock_rdlock(&e->conn_mu);
    int alive = e->out && shmconn_peer_status(e->out) == 0;
    pthread_rwlock_unlock(&e->conn_mu);
    return alive;
}

static void sink_tick(void *ctx)
{
    struct engine *e = ctx;
    atomic_store(&e->step_turn_ns, mm3_job_now_ns());
    if (atomic_load(&e->n_awaiting) == 0) return;
    double limit = e->cfg_out.first_chunk_deadline_s;
    int64_t now = mm3_job_now_ns();
    int up = stage1_alive(e);
    for (;;) {
        /* One entry at a time: the table may change while we send. */
        pthread_mutex_lock(&e->mu);
        struct eng_req *r = e->reqs;
        while (r && !r->awaiting)
            r = r->next;
        int late = r && (now - r->await_since_ns) > (int64_t)(limit * 1e9);
        if (r && !up && !late) {
            /* others may be late */
            struct eng_req *q = r;
            while (q && !(q->awaiting && (now - q->await_since_ns) > (int64_t)(limit * 1e9)))
                q = q->next;
            r = q;
            late = r != NULL;
        }
        if (r) r->refs++;
        pthread_mutex_unlock(&e->mu);
        if (!r) return;
        if (late && !up) {
            struct eng_req *t = req_take(e, r->job->id);
            mm3_job_fail(r->job, 502, "stage 1 died mid-song and did not come back within %g s", limit);
            LOG_WARN("job %llu: stage 1 did not come back within %g s", (unsigned long long)r->job->id, limit);
            if (t) req_put(e, t);
            req_put(e, r);
            continue;
        }
        resend(e, r);
        pthread_mutex_lock(&e->mu);
        int again = r->awaiting; /* lost again before the receiver noticed: next tick */
        pthread_mutex_unlock(&e->mu);
        req_put(e, r);
        if (again || !atomic_load(&e->s1_up)) return;
    }
}

/* ---- receiving (receiver thread) ---- */

/* Stage 1 is gone: hold the journaled entries for its return, fail the others. */
static void hold_or_fail_all(struct engine *e, const char *msg)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req *keep = NULL, *lost = NULL, *r = e->reqs;
    while (r) {
        struct eng_req *next = r->next;
        if (hold_locked(e, r)) {
            r->next = keep;
            keep = r;
        } else {
            r->next = lost;
            lost = r;
            e->n_reqs--;
        }
        r = next;
    }
    e->reqs = keep;
    pthread_mutex_unlock(&e->mu);
    for (r = lost; r;) {
        struct eng_req *next = r->next;
        if (mm3_job_fail(r->job, 502, "%s", msg) == 0) LOG_WARN("job %llu: %s", (unsigned long long)r->job->id, msg);
        req_put(e, r);
        r = next;
    }
}

static void fail_all(struct engine *e, const char *msg)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req *r = e->reqs;
    e->reqs = NULL;
    e->n_reqs = 0;
    pthread_mutex_unlock(&e->mu);
    while (r) {
        struct eng_req *next = r->next;
        if (mm3_job_fail(r->job, 502, "%s", msg) == 0) LOG_WARN("job %llu: %s", (unsigned long long)r->job->id, msg);
        req_put(e, r);
        r = next;
    }
}

/* A PCM message of `audio_s` seconds (`new_s` of them not yet pushed to the client) for
 * entry q, under e->mu: stage 1's work for it (progress[2], microseconds so far) feeds the
 * real-time capacity, and a streamed song's listener is advanced (stall metrics). */
static void pcm_account(struct engine *e, struct eng_req *q, const struct pipe_progress *prog, double audio_s,
                        double new_s)
{
    int64_t work_us = prog->work_us;
    /* after a stage-1 restart the song's work counts from 0 again: nothing to add */
    if (work_us > q->work_us_seen) admission_observe(&e->adm, (double)(work_us - q->work_us_seen) * 1e-6, audio_s);
    q->work_us_seen = work_us;
    capacity_publish(admission_capacity(&e->adm));
    if (!q->job->params.stream || new_s <= 0) return;
    int stalls = q->play.stalls;
    double slack = playback_arrive(&q->play, (double)mm3_job_now_ns() * 1e-9, new_s);
    if (q->play.stalls > stalls) {
        metrics_counter_add(&mm3_metrics.stream_stalls, 1);
        metrics_counter_add(&mm3_metrics.stream_stall_us, (uint64_t)(-slack * 1e6));
    }
    if (q->play.audio_s > new_s) metrics_histogram_observe(&mm3_metrics.window_slack_seconds, slack);
}

static void on_pcm(struct engine *e, const struct shmconn_msg *m)
{
    struct mm3_job *job = req_job(e, m->req_id);
    if (!job) return; /* cancelled meanwhile */
    struct pipe_pcm pcm;
    if (pipe_decode_pcm(m, &pcm) < 0) {
        struct eng_req *r = req_take(e, m->req_id);
        mm3_job_fail(job, 502, "stage 1: %s", mm3_last_error());
        if (r) req_put(e, r);
        mm3_job_unref(job);
        return;
    }
    size_t n = (size_t)pcm.n;
    const float *src = pcm.pcm;
    /* After a re-send stage 1 renders the song from its start: skip what the client has. */
    size_t skip = 0;
    pthread_mutex_lock(&e->mu);
    struct eng_req *q = e->reqs;
    while (q && q->job != job)
        q = q->next;
    if (q) {
        int64_t have = q->pcm_pushed - q->pcm_got;
        skip = have <= 0 ? 0 : (size_t)have >= n ? n : (size_t)have;
        q->pcm_got += (int64_t)n;
        if (q->pcm_got > q->pcm_pushed) q->pcm_pushed = q->pcm_got;
        if (n) pcm_account(e, q, &pcm.progress, (double)n / job->pcm_rate, (double)(n - skip) / job->pcm_rate);
    }
    pthread_mutex_unlock(&e->mu);
    float *il = malloc(sizeof(float) * 2 * (n ? n : 1));
    int rc = il ? 0 : -ENOMEM;
    if (il) {
        for (size_t i = skip; i < n; i++) {
            il[2 * (i - skip)] = src[i];
            il[2 * (i - skip) + 1] = src[n + i];
        }
        rc = n > skip ? mm3_job_push_pcm(job, il, n - skip, PCM_PUSH_TIMEOUT_MS) : 0;
    }
    free(il);
    if (rc == 0) {
        int64_t delta = pcm.progress.windows_done - atomic_load(&job->windows_done);
        if (delta > 0) mm3_job_progress_add(job, 0, delta);
    }
    if (rc == -ETIMEDOUT || rc == -ENOMEM) {
        /* Give up on it here and in stage 1 (the cancel ring tells it); the step loop
         * frees the rows if it is still generating. */
        struct eng_req *r = req_take(e, m->req_id);
        mm3_job_fail(job, 500, "%s", rc == -ENOMEM ? "stage 0: out of memory" : "client too slow to take the audio");
        shmconn_request_cancel(e->in, m->req_id);
        LOG_WARN("job %llu: %s", (unsigned long long)m->req_id,
                 rc == -ENOMEM ? "out of memory for PCM" : "client took no audio for 30 s: cancelled");
        if (r) req_put(e, r);
    }
    mm3_job_unref(job);
}

static void on_message(struct engine *e, const struct shmconn_msg *m)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        bytes += m->tensors[i].nbytes;
    metrics_counter_add(&mm3_metrics.conn_bytes[METRICS_EDGE_S1_TO_S0], bytes);
    if (m->kind == PIPE_MSG_PCM) {
        on_pcm(e, m);
        return;
    }
    if (m->kind != PIPE_MSG_DONE && m->kind != PIPE_MSG_ERROR) {
        LOG_WARN("stage 1 sent message kind %u for job %llu: ignored", m->kind, (unsigned long long)m->req_id);
        return;
    }
    struct eng_req *r = req_take(e, m->req_id);
    if (!r) return;
    struct pipe_done done;
    const char *text = "";
    size_t len = 0;
    char why[400];
    int rc = m->kind == PIPE_MSG_DONE ? pipe_decode_done(m, &done) : pipe_decode_error(m, &text, &len);
    if (rc < 0) { /* a malformed DONE or ERROR fails the job with what was wrong */
        len = (size_t)snprintf(why, sizeof why, "%s", mm3_last_error());
        text = why;
    } else if (m->kind == PIPE_MSG_DONE) {
        if (done.fp16_rescues >= 0) metrics_gauge_set(&mm3_metrics.stage1_fp16_rescues, done.fp16_rescues);
        mm3_job_finish(r->job);
    }
    if (rc < 0 || m->kind == PIPE_MSG_ERROR) {
        if (len > 400) len = 400;
        mm3_job_fail(r->job, 502, "stage 1: %.*s", (int)len, text);
        LOG_WARN("job %llu: stage 1: %.*s", (unsigned long long)m->req_id, (int)len, text);
    }
    req_put(e, r);
}

/* Drop both channels after stage 1 went away, and offer a fresh s0_to_s1 for the next one. */
static void reset_channels(struct engine *e)
{
    pthread_rwlock_wrlock(&e->conn_mu);
    shmconn_close(e->in);
    e->in = NULL;
    shmconn_close(e->out);
    e->out = NULL;
    if (!atomic_load(&e->stopping) && shmconn_create(&e->out, &e->cfg_out) < 0)
        LOG_ERROR("cannot re-create %s: %s", e->cfg_out.name, mm3_last_error());
    pthread_rwlock_unlock(&e->conn_mu);
}

static void stage1_lost(struct engine *e, const char *why)
{
    if (atomic_exchange(&e->s1_up, 0))
        LOG_WARN("stage 1 lost (%s): failing its requests without a journal, waiting for it", why);
    hold_or_fail_all(e, "stage 1 died mid-song");
    reset_channels(e);
}

/* Stage 1 gave up on requests (its deadline, or its own failure). */
static void poll_cancels(struct engine *e)
{
    uint64_t id;
    uint32_t reason;
    for (;;) {
        pthread_rwlock_rdlock(&e->conn_mu);
        int rc = e->out ? shmconn_cancel_poll(e->out, &id, &reason) : 0;
        pthread_rwlock_unlock(&e->conn_mu);
        if (rc <= 0) return;
        struct eng_req *r = req_take(e, id);
        if (!r) continue;
        mm3_job_fail(r->job, 502, "stage 1 gave up on the request (%s)",
                     reason == SHMCONN_CANCEL_TIMEOUT ? "no frames within its deadline" : "cancelled by stage 1");
        req_put(e, r);
    }
}

static int try_connect(struct engine *e)
{
    pthread_rwlock_rdlock(&e->conn_mu);
    int dead = !e->out || shmconn_peer_status(e->out) != 0;
    pthread_rwlock_unlock(&e->conn_mu);
    /* A consumer that attached and died leaves the region unusable: offer a new one. */
    if (dead) reset_channels(e);
    shmconn_t *in;
    int rc = shmconn_open(&in, &e->cfg_in, 0.25);
    if (rc < 0) return rc;
    pthread_rwlock_wrlock(&e->conn_mu);
    e->in = in;
    pthread_rwlock_unlock(&e->conn_mu);
    atomic_store(&e->s1_up, 1);
    LOG_INFO("stage 1 attached (%s)", shmconn_segment_name(in));
    return 0;
}

static void *rx_thread(void *arg)
{
    struct engine *e = arg;
    while (!atomic_load(&e->stopping)) {
        int64_t now = mm3_job_now_ns();
        atomic_store(&e->rx_turn_ns, now);
        if (!e->in) {
            int rc = try_connect(e);
            /* a refused segment (another user's, another run's) is worth saying, not every 100 ms */
            if (rc < 0 && rc != SHMCONN_E_TIMEOUT && now - e->last_connect_log_ns > 10 * INT64_C(1000000000)) {
                LOG_WARN("stage 1 not attached: %s", mm3_last_error());
                e->last_connect_log_ns = now;
            }
            if (rc < 0) {
                struct timespec t = {0, 100 * 1000000L};
                nanosleep(&t, NULL);
            }
            continue;
        }
        struct shmconn_event ev;
        int rc = shmconn_recv(e->in, &ev, 0.2);
        poll_cancels(e);
        if (rc == SHMCONN_E_TIMEOUT) {
            pthread_rwlock_rdlock(&e->conn_mu);
            int st = e->out ? shmconn_peer_status(e->out) : SHMCONN_E_CLOSED;
            pthread_rwlock_unlock(&e->conn_mu);
            if (st == SHMCONN_E_PEER_DEAD || st == SHMCONN_E_CLOSED)
                stage1_lost(e, st == SHMCONN_E_CLOSED ? "closed its channel" : "process died");
            continue;
        }
        if (rc < 0) {
            stage1_lost(e, rc == SHMCONN_E_CLOSED ? "closed its channel" : "process died");
            continue;
        }
        if (ev.type == SHMCONN_EVENT_MESSAGE) {
            on_message(e, &ev.msg);
            shmconn_release(e->in, &ev.msg);
        } else if (ev.type == SHMCONN_EVENT_TIMEOUT) {
            struct eng_req *r = req_take(e, ev.req_id);
            if (r) {
                mm3_job_fail(r->job, 502, "stage 1 did not answer within %.0f s", ev.waited_s);
                LOG_WARN("job %llu: stage 1 did not answer within %.0f s (%s deadline)", (unsigned long long)ev.req_id,
                         ev.waited_s, ev.first_chunk ? "first-chunk" : "steady");
                mm3_job_cancel(r->job); /* frees its rows at the next step */
                req_put(e, r);
            }
        } else if (ev.type == SHMCONN_EVENT_PEER_LOST) {
            pthread_mutex_lock(&e->mu);
            struct eng_req *h = e->reqs;
            while (h && h->job->id != ev.req_id)
                h = h->next;
            int held = h && hold_locked(e, h);
            pthread_mutex_unlock(&e->mu);
            struct eng_req *r = held ? NULL : req_take(e, ev.req_id);
            if (r) {
                mm3_job_fail(r->job, 502, "stage 1 died mid-song");
                LOG_WARN("job %llu: stage 1 died mid-song", (unsigned long long)ev.req_id);
                req_put(e, r);
            }
        }
    }
    return NULL;
}

/* ---- api_engine ---- */

static int api_submit(void *ctx, struct mm3_job *job)
{
    struct engine *e = ctx;
    const struct mm3_connector_config *k = mm3_deploy_edge_connector(e->d);
    if (job->params.stream && !k->codec_streaming) {
        mm3_job_set_error(job, 400, "stream: streamed answers need codec_streaming: true in the deploy file");
        return -EINVAL;
    }
    if (!atomic_load(&e->s1_up)) {
        mm3_job_set_error(job, 503, "stage 1 unavailable");
        return -EAGAIN;
    }
    int rc = sched_submit(e->sched, job);
    if (rc == -EAGAIN) mm3_job_set_error(job, 503, "server busy: generation queue full, retry later");
    if (rc == -ESHUTDOWN) {
        mm3_job_set_error(job, 503, "server shutting down");
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
    double rx_age = (double)(now - atomic_load(&e->rx_turn_ns)) * 1e-9;
    double step_age = (double)(now - atomic_load(&e->step_turn_ns)) * 1e-9;
    double stall = e->cfg_in.steady_deadline_s;
    if (stall < PCM_PUSH_TIMEOUT_MS * 1e-3) stall = PCM_PUSH_TIMEOUT_MS * 1e-3;
    stall += PIPE_HEARTBEAT_DEADLINE_S;
    if (rx_age > stall || step_age > stall) {
        h->stages[0].state = API_STAGE_DOWN;
        snprintf(h->stages[0].detail, sizeof h->stages[0].detail,
                 "stuck: receiver last turned %.1f s ago, step loop %.1f s ago", rx_age, step_age);
    }
    snprintf(h->stages[1].name, sizeof h->stages[1].name, "stage1");
    int up = atomic_load(&e->s1_up);
    double beat = -1;
    if (up) {
        pthread_rwlock_rdlock(&e->conn_mu);
        beat = e->in ? shmconn_peer_heartbeat_age(e->in) : -1;
        pthread_rwlock_unlock(&e->conn_mu);
    }
    if (!up) {
        h->stages[1].state = API_STAGE_DOWN;
        snprintf(h->stages[1].detail, sizeof h->stages[1].detail,
                 "not attached: waiting for mm3-stage1 (requests get 503)");
    } else if (beat < 0) {
        h->stages[1].state = API_STAGE_STARTING;
        snprintf(h->stages[1].detail, sizeof h->stages[1].detail, "attached, no heartbeat yet");
    } else if (beat > PIPE_HEARTBEAT_DEADLINE_S) {
        h->stages[1].state = API_STAGE_DOWN;
        snprintf(h->stages[1].detail, sizeof h->stages[1].detail,
                 "attached, but no heartbeat for %.1f s (stopped or stuck; its songs wait)", beat);
    } else {
        h->stages[1].state = API_STAGE_READY;
        snprintf(h->stages[1].detail, sizeof h->stages[1].detail, "attached, heartbeat %.1f s ago", beat);
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
    pipe_channel_config(d, PIPE_CHANNEL_S0_TO_S1, e->prefix, &e->cfg_out);
    pipe_channel_config(d, PIPE_CHANNEL_S1_TO_S0, e->prefix, &e->cfg_in);
    if (run) {
        pipe_run_apply(run, &e->cfg_out);
        pipe_run_apply(run, &e->cfg_in);
    }
    if (!e->cfg_out.run_id[0])
        LOG_WARN("MM3_RUN_ID / MM3_RUN_TOKEN not set: segment names are predictable (%s...); start the replica "
                 "with scripts/launch.sh, which gives both stages a random run id and token",
                 e->prefix);
    e->send_timeout_s = e->cfg_out.steady_deadline_s;
    if ((rc = generate_frame_rate(ckpt_root, &e->fps)) < 0) goto fail;
    capacity_publish(-1);
    const struct mm3_stage_config *s0 = mm3_deploy_stage(d, 0);
    struct sched_config sc = {.max_rows = s0->max_num_seqs,
                              .max_ctx = s0->max_model_len,
                              .max_batched_tokens = s0->max_num_batched_tokens,
                              .max_queue = d->api.max_queue_depth,
                              .journal_dir = d->api.journal_dir,
                              .replay_dir = d->api.replay_dir};
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
    if ((rc = talker_backend_plan_check(sc.backend, &plan, s0->gpu_memory_utilization)) < 0) goto fail;
    e->max_reqs = mm3_deploy_stage(d, 1)->max_num_seqs + s0->max_num_seqs;
    struct sched_sink sink = {.ctx = e,
                              .can_start = sink_can_start,
                              .start_estimate = sink_start_estimate,
                              .on_start = sink_start,
                              .on_frames = sink_frames,
                              .on_end = sink_end,
                              .on_abort = sink_abort,
                              .on_journal = sink_journal,
                              .on_journal_open = sink_journal_open,
                              .on_tick = sink_tick};
    if ((rc = sched_create(&e->sched, &sc, lm, dd, tok, &sink)) < 0) goto fail;
    pthread_mutex_init(&e->mu, NULL);
    pthread_rwlock_init(&e->conn_mu, NULL);
    e->api = (struct api_engine){.ctx = e, .submit = api_submit, .cancel = api_cancel, .health = api_health};
    *out = e;
    return 0;
fail:
    free(e->mixed);
    free(e);
    return rc;
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
    int rc = shmconn_create(&e->out, &e->cfg_out);
    if (rc < 0) return rc;
    atomic_store(&e->rx_turn_ns, mm3_job_now_ns());
    if ((rc = pthread_create(&e->rx, NULL, rx_thread, e)))
        return mm3_errorf(-rc, "engine: receiver thread: %s", strerror(rc));
    e->rx_started = 1;
    atomic_store(&e->step_turn_ns, mm3_job_now_ns());
    if ((rc = sched_start(e->sched)) < 0) return rc;
    char seg[160];
    LOG_INFO("waiting up to %g s for stage 1 to attach (%s)", wait_s, pipe_segment_name(&e->cfg_in, seg, sizeof seg));
    int64_t t0 = mm3_job_now_ns();
    while (!atomic_load(&e->s1_up) && (mm3_job_now_ns() - t0) < (int64_t)(wait_s * 1e9)) {
        struct timespec t = {0, 20 * 1000000L};
        nanosleep(&t, NULL);
    }
    if (!atomic_load(&e->s1_up))
        LOG_WARN("stage 1 not attached after %g s: serving anyway (/health says stage1 down, requests get 503)",
                 wait_s);
    return 0;
}

int engine_stage1_up(struct engine *e)
{
    return atomic_load(&e->s1_up);
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
    if (e->rx_started) pthread_join(e->rx, NULL);
    fail_all(e, "server shutting down");
    pthread_rwlock_wrlock(&e->conn_mu);
    shmconn_close(e->in);
    shmconn_close(e->out);
    e->in = e->out = NULL;
    pthread_rwlock_unlock(&e->conn_mu);
    pthread_mutex_destroy(&e->mu);
    pthread_rwlock_destroy(&e->conn_mu);
    free(e->mixed);
    free(e);
}
