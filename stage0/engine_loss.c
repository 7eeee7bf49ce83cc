/* Stage-1 loss (stage0/engine_internal.h): held songs, re-sends, failures. */
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
#include "stage0/teacher_force.h"

/* Hold an entry with a journal for stage 1's return instead of failing it (engine.mu
 * held). Returns 1 when held. */
int eng_hold_locked(struct engine *e, struct eng_req *r)
{
    if (!r->jr || !r->ids) return 0;
    if (!r->awaiting) {
        r->awaiting = 1;
        r->await_since_ns = mm3_job_now_ns();
        atomic_fetch_add(&e->n_awaiting, 1);
        LOG_WARN("job %llu: stage 1 lost mid-song; journaled, waiting up to %g s for it to come back",
                 (unsigned long long)r->job->id, e->await_limit_s);
    }
    return 1;
}

int eng_hold(struct engine *e, struct eng_req *r)
{
    pthread_mutex_lock(&e->mu);
    int held = eng_hold_locked(e, r);
    pthread_mutex_unlock(&e->mu);
    return held;
}

/* ---- re-sending a held song (step thread) ---- */

struct resend_ctx {
    struct engine *e;
    struct eng_req *r;
};

static int resend_emit(void *ctx, int t0, const float *frames, int n)
{
    struct resend_ctx *c = ctx;
    return eng_frames_to_stage1(c->e, c->r->job, c->r, t0, n, frames, c->e->raw_width, 1) < 0 ? -EPIPE : 0;
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
    int rc = eng_payload_to_stage1(c->e, c->r->job, c->r, first, n, frames);
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
        mm3_job_fail_kind(r->job, MM3_FAIL_STAGE1,
                          "stage 1 died mid-song and re-sending from the frame spool failed after %d frames: %s",
                          c.sent, mm3_last_error());
        return -EPIPE;
    }
    return rc;
}

/* Stage 1 is back: START again, frames 0..n-1 as first sent from the spool (or, when
 * it is missing, short or unreadable, recomputed by teacher forcing from the journal;
 * generation continues live from n, nothing runs in between on this thread), and
 * END if generation already ended. */
static void resend(struct engine *e, struct eng_req *r)
{
    struct mm3_job *job = r->job;
    pthread_mutex_lock(&e->mu);
    struct s1_worker *w = eng_pick_worker_locked(e);
    if (!w) { /* every live worker is full: try again at a later tick */
        pthread_mutex_unlock(&e->mu);
        return;
    }
    if (e->n_workers > 1)
        LOG_INFO("job %llu: re-sent to stage-1 worker %d (was on %d)", (unsigned long long)job->id, w->index,
                 r->w->index);
    r->w = w;
    r->frames_sent = 0;
    r->awaiting = 0;
    atomic_fetch_sub(&e->n_awaiting, 1);
    r->pcm_got = 0;
    r->n_held = 0;
    r->chunk = 0;
    int ended = r->ended, total = r->total;
    pthread_mutex_unlock(&e->mu);
    int rc = eng_send_start(e, job, r);
    if (rc < 0) {
        if (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED) {
            eng_hold(e, r);
            return;
        }
        eng_fail_send(e, job, rc, "the request again");
        eng_drop(e, job);
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
        r->spool = r->jr ? eng_spool_open(e, job, r->jr) : NULL;
        struct resend_ctx c = {e, r};
        struct teacher_force_sink sink = {.ctx = &c, .emit = resend_emit};
        /* On the scheduler's spare row, on the backend the song was generated on. */
        const struct talker_backend *be;
        int row = sched_spare_row(e->sched, &be);
        /* the frames were made with the song's adapter: the spare row takes it for the re-send */
        int lora = talker_lora_set_find(&e->lora, job->params.lora);
        rc = row < 0 ? mm3_errorf(-ENODATA, "no spare talker row to teacher-force on (journaling is off)")
                     : talker_backend_row_lora(be, row, lora);
        if (rc == 0) rc = teacher_force_journal(be, row, r->jr, r->ids, r->prompt_len, &sink, &n);
        if (row >= 0) talker_backend_row_lora(be, row, -1);
        if (rc < 0 && rc != -EPIPE) {
            mm3_job_fail_kind(job, MM3_FAIL_STAGE1, "stage 1 died mid-song and the journal cannot re-send it: %s",
                              mm3_last_error());
            eng_drop(e, job);
            return;
        }
    }
    pthread_mutex_lock(&e->mu);
    int again = r->awaiting;
    pthread_mutex_unlock(&e->mu);
    if (again) return; /* lost again: held */
    if (rc < 0) {      /* a send failed: the job is failed */
        eng_drop(e, job);
        return;
    }
    if (spooled)
        LOG_INFO("job %llu: stage 1 is back: re-sent %d frames from the frame spool %s%s", (unsigned long long)job->id,
                 n, frame_spool_path(r->spool), ended ? " and the end" : "; live frames continue");
    else
        LOG_INFO("job %llu: stage 1 is back: re-sent %d journaled frames (teacher forcing)%s",
                 (unsigned long long)job->id, n, ended ? " and the end" : "; live frames continue");
    if (ended && eng_end_to_stage1(e, job, r, total) < 0) eng_drop(e, job);
}

/* A worker that is attached and whose channel's consumer is not dead. A song is held on
 * the receiver's PEER_LOST event before it marks the worker lost (up): without the peer
 * check the step thread would re-send into the dead one at once. */
static int any_worker_alive(struct engine *e)
{
    for (int k = 0; k < e->n_workers; k++)
        if (eng_worker_alive(&e->workers[k])) return 1;
    return 0;
}

void eng_sink_tick(void *ctx)
{
    struct engine *e = ctx;
    atomic_store(&e->step_turn_ns, mm3_job_now_ns());
    int queued, rows;
    sched_counts(e->sched, &queued, &rows);
    atomic_store(&e->sched_queued, queued);
    pthread_mutex_lock(&e->mu);
    eng_publish_worker_load_locked(e);
    pthread_mutex_unlock(&e->mu);
    eng_play_send(e);
    if (atomic_load(&e->n_awaiting) == 0) return;
    double limit = e->await_limit_s;
    int64_t now = mm3_job_now_ns();
    int up = any_worker_alive(e);
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
            struct eng_req *t = eng_req_take(e, r->job->id, NULL);
            mm3_job_fail_kind(r->job, MM3_FAIL_STAGE1, "stage 1 died mid-song and did not come back within %g s",
                              limit);
            LOG_WARN("job %llu: stage 1 did not come back within %g s", (unsigned long long)r->job->id, limit);
            if (t) eng_req_put(e, t);
            eng_req_put(e, r);
            continue;
        }
        resend(e, r);
        pthread_mutex_lock(&e->mu);
        int again = r->awaiting; /* lost again before the receiver noticed: next tick */
        pthread_mutex_unlock(&e->mu);
        eng_req_put(e, r);
        if (again || !any_worker_alive(e)) return;
    }
}

/* Worker w is gone: hold its journaled entries for a live worker (or its return), fail
 * its others. */
static void hold_or_fail_worker(struct engine *e, struct s1_worker *w, const char *msg)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req *keep = NULL, *lost = NULL, *r = e->reqs;
    while (r) {
        struct eng_req *next = r->next;
        if (r->w != w || eng_hold_locked(e, r)) {
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
        if (mm3_job_fail_kind(r->job, MM3_FAIL_STAGE1, "%s", msg) == 0)
            LOG_WARN("job %llu: %s", (unsigned long long)r->job->id, msg);
        eng_req_put(e, r);
        r = next;
    }
}

void eng_stage1_lost(struct s1_worker *w, const char *why)
{
    struct engine *e = w->e;
    if (atomic_exchange(&w->up, 0)) {
        if (e->n_workers > 1)
            LOG_WARN("stage-1 worker %d lost (%s): its journaled songs go to a live worker, the others fail; "
                     "waiting for it",
                     w->index, why);
        else
            LOG_WARN("stage 1 lost (%s): failing its requests without a journal, waiting for it", why);
    }
    hold_or_fail_worker(e, w, "stage 1 died mid-song");
    eng_reset_channels(w);
    pthread_mutex_lock(&e->mu);
    eng_publish_worker_load_locked(e);
    pthread_mutex_unlock(&e->mu);
}
