/* The engine's request table (stage0/engine_internal.h). */
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
#include "stage0/generate.h"

/* ---- the request table ---- */

/* A streamed song whose client did not accept stalls: it gets playback deadlines in
 * stage 1 and counts against the real-time capacity. */
int eng_counts_as_stream(const struct mm3_job *job)
{
    return job->params.stream && !job->params.allow_stall;
}

int eng_streams_locked(const struct engine *e)
{
    int n = 0;
    for (const struct eng_req *r = e->reqs; r; r = r->next)
        n += r->counted && (!r->preroll || r->judge_at_first_audio);
    return n;
}

void eng_req_add(struct engine *e, struct eng_req *r)
{
    pthread_mutex_lock(&e->mu);
    r->next = e->reqs;
    e->reqs = r;
    e->n_reqs++;
    eng_publish_streams_locked(e);
    pthread_mutex_unlock(&e->mu);
}

/* Whether entry r answers for job id from worker w (any worker when w is NULL): a
 * worker's late messages about a song re-sent elsewhere are not the song's. */
static int req_is(const struct eng_req *r, uint64_t id, const struct s1_worker *w)
{
    return r->job->id == id && (!w || r->w == w);
}

struct eng_req *eng_req_take(struct engine *e, uint64_t id, const struct s1_worker *w)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req **pp = &e->reqs, *r;
    while ((r = *pp) && !req_is(r, id, w))
        pp = &r->next;
    if (r) {
        *pp = r->next;
        e->n_reqs--;
        eng_publish_streams_locked(e);
    }
    pthread_mutex_unlock(&e->mu);
    return r;
}

struct mm3_job *eng_req_job(struct engine *e, uint64_t id, const struct s1_worker *w)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req *r = e->reqs;
    while (r && !req_is(r, id, w))
        r = r->next;
    struct mm3_job *j = r ? r->job : NULL;
    if (j) mm3_job_ref(j);
    pthread_mutex_unlock(&e->mu);
    return j;
}

struct eng_req *eng_req_find_locked(struct engine *e, struct mm3_job *job)
{
    struct eng_req *r = e->reqs;
    while (r && r->job != job)
        r = r->next;
    return r;
}

/* Drop a reference to an entry (the one req_take handed over, or req_get's). */
void eng_req_put(struct engine *e, struct eng_req *r)
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
    free(r->codes);
    free(r->ids);
    free(r->held);
    free(r->pre_pcm);
    free(r);
}

/* The entry of a job with a reference for the caller, so that the receiver may
 * unlink it meanwhile (NULL if gone). */
struct eng_req *eng_req_get(struct engine *e, struct mm3_job *job)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req *r = eng_req_find_locked(e, job);
    if (r) r->refs++;
    pthread_mutex_unlock(&e->mu);
    return r;
}

/* Out of the table after a failed re-send (stage 1 will not answer for it). */
void eng_drop(struct engine *e, struct mm3_job *job)
{
    struct eng_req *t = eng_req_take(e, job->id, NULL);
    if (t) eng_req_put(e, t);
}

void eng_fail_all(struct engine *e, const char *msg)
{
    pthread_mutex_lock(&e->mu);
    struct eng_req *r = e->reqs;
    e->reqs = NULL;
    e->n_reqs = 0;
    pthread_mutex_unlock(&e->mu);
    while (r) {
        struct eng_req *next = r->next;
        if (mm3_job_fail_kind(r->job, MM3_FAIL_STAGE1, "%s", msg) == 0)
            LOG_WARN("job %llu: %s", (unsigned long long)r->job->id, msg);
        eng_req_put(e, r);
        r = next;
    }
}

/* ---- stage-1 workers: liveness and load ---- */

int eng_worker_alive(struct s1_worker *w)
{
    if (!atomic_load(&w->up)) return 0;
    pthread_rwlock_rdlock(&w->conn_mu);
    int alive = w->out && shmconn_peer_status(w->out) == 0;
    pthread_rwlock_unlock(&w->conn_mu);
    return alive;
}

int eng_worker_songs_locked(const struct engine *e, const struct s1_worker *w)
{
    int n = 0;
    for (const struct eng_req *r = e->reqs; r; r = r->next)
        n += r->w == w && !r->awaiting;
    return n;
}

int eng_worker_windows_queued_locked(const struct engine *e, const struct s1_worker *w)
{
    int n = 0;
    for (const struct eng_req *r = e->reqs; r; r = r->next) {
        if (r->w != w || r->awaiting) continue;
        /* audio back, in model frames: pcm_got samples at pcm_rate, fps frames a second */
        double back = r->job->pcm_rate > 0 ? (double)r->pcm_got / r->job->pcm_rate * e->fps : 0;
        double left = (double)r->frames_sent - back;
        int windows = left > 0 ? (int)((left + WINDOW_HOP - 1) / WINDOW_HOP) : 0;
        n += windows > 0 ? windows : 1; /* a running song always has its next window coming */
    }
    return n;
}

struct s1_worker *eng_pick_worker_locked(struct engine *e)
{
    struct s1_worker *best = NULL;
    int best_windows = 0, best_songs = 0;
    for (int k = 0; k < e->n_workers; k++) {
        struct s1_worker *w = &e->workers[k];
        if (!eng_worker_alive(w)) continue;
        int songs = eng_worker_songs_locked(e, w);
        if (songs >= e->max_per_worker) continue;
        int windows = eng_worker_windows_queued_locked(e, w);
        if (!best || windows < best_windows || (windows == best_windows && songs < best_songs)) {
            best = w;
            best_windows = windows;
            best_songs = songs;
        }
    }
    return best;
}

void eng_publish_worker_load_locked(const struct engine *e)
{
    for (int k = 0; k < e->n_workers && k < METRICS_WORKERS_MAX; k++) {
        struct s1_worker *w = &e->workers[k];
        metrics_gauge_set(&mm3_metrics.worker_up[k], atomic_load(&w->up));
        metrics_gauge_set(&mm3_metrics.worker_songs[k], eng_worker_songs_locked(e, w));
        metrics_gauge_set(&mm3_metrics.worker_windows_queued[k], eng_worker_windows_queued_locked(e, w));
    }
}
