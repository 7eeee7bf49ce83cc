#include "stage0/api/job.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "common/metrics.h"

static _Atomic uint64_t job_next_id = 1;

int64_t mm3_job_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void mm3_job_params_free(struct mm3_job_params *p)
{
    free(p->lyrics);
    free(p->caption);
    free(p->replay_file);
    free(p->journal);
    p->lyrics = p->caption = p->replay_file = NULL;
    p->journal = NULL;
    p->journal_len = 0;
}

/* 128 bits from the kernel's generator, as 32 lowercase hex digits. */
static int make_public_id(char out[MM3_JOB_PUBLIC_ID_LEN + 1])
{
    unsigned char b[MM3_JOB_PUBLIC_ID_LEN / 2];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return mm3_errorf(-EIO, "mm3_job_create: no random bytes for the request id: %s", strerror(errno));
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof b; i++) {
        out[2 * i] = "0123456789abcdef"[b[i] >> 4];
        out[2 * i + 1] = "0123456789abcdef"[b[i] & 15];
    }
    out[MM3_JOB_PUBLIC_ID_LEN] = 0;
    return 0;
}

int mm3_job_create(struct mm3_job **out, const struct mm3_job_params *params, int32_t channels, int32_t pcm_rate,
                   size_t queue_chunks)
{
    *out = NULL;
    if (!params->lyrics || !params->caption || channels < 1 || pcm_rate < 1 || queue_chunks < 1)
        return mm3_errorf(-EINVAL, "mm3_job_create: need lyrics, caption, channels >= 1, "
                                   "pcm_rate >= 1 and queue_chunks >= 1");
    struct mm3_job *j = calloc(1, sizeof *j);
    if (!j) return mm3_errorf(-ENOMEM, "mm3_job_create: out of memory");
    int rc = make_public_id(j->public_id);
    if (rc < 0) {
        free(j);
        return rc;
    }
    j->params = *params;
    j->params.lyrics = strdup(params->lyrics);
    j->params.caption = strdup(params->caption);
    j->params.replay_file = params->replay_file ? strdup(params->replay_file) : NULL;
    j->params.journal = params->journal ? malloc(params->journal_len ? params->journal_len : 1) : NULL;
    if (j->params.journal) memcpy(j->params.journal, params->journal, params->journal_len);
    j->ring_cap = queue_chunks + 1;
    j->ring = calloc(j->ring_cap, sizeof *j->ring);
    if (!j->params.lyrics || !j->params.caption || !j->ring || (params->replay_file && !j->params.replay_file) ||
        (params->journal && !j->params.journal)) {
        mm3_job_params_free(&j->params);
        free(j->ring);
        free(j);
        return mm3_errorf(-ENOMEM, "mm3_job_create: out of memory");
    }
    j->pcm_capacity = queue_chunks;
    j->channels = channels;
    j->pcm_rate = pcm_rate;
    j->id = atomic_fetch_add(&job_next_id, 1);
    atomic_init(&j->refs, 1);
    atomic_init(&j->state, MM3_JOB_QUEUED);
    atomic_init(&j->frames_total, params->max_frames);
    j->t_created_ns = mm3_job_now_ns();
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cond, &ca);
    pthread_condattr_destroy(&ca);
    *out = j;
    return 0;
}

void mm3_job_ref(struct mm3_job *job)
{
    int old = atomic_fetch_add(&job->refs, 1);
    CHECK(old > 0);
}

void mm3_job_unref(struct mm3_job *job)
{
    if (!job) return;
    int old = atomic_fetch_sub(&job->refs, 1);
    CHECK(old > 0);
    if (old != 1) return;
    for (size_t i = 0; i < job->count; i++)
        mm3_job_chunk_release(&job->ring[(job->head + i) % job->ring_cap]);
    free(job->ring);
    mm3_job_params_free(&job->params);
    pthread_mutex_destroy(&job->mu);
    pthread_cond_destroy(&job->cond);
    free(job);
}

enum mm3_job_state mm3_job_state(const struct mm3_job *job)
{
    return (enum mm3_job_state)atomic_load(&((struct mm3_job *)job)->state);
}

bool mm3_job_is_terminal(const struct mm3_job *job)
{
    return mm3_job_state(job) >= MM3_JOB_DONE;
}

void mm3_job_set_running(struct mm3_job *job)
{
    int expect = MM3_JOB_QUEUED;
    atomic_compare_exchange_strong(&job->state, &expect, MM3_JOB_RUNNING);
}

void mm3_job_progress_add(struct mm3_job *job, int64_t frames, int64_t windows)
{
    if (frames > 0) {
        atomic_fetch_add(&job->frames_done, frames);
        metrics_counter_add(&mm3_metrics.frames, (uint64_t)frames);
    }
    if (windows > 0) {
        atomic_fetch_add(&job->windows_done, windows);
        metrics_counter_add(&mm3_metrics.windows, (uint64_t)windows);
    }
}

void mm3_job_set_frames_total(struct mm3_job *job, int64_t frames)
{
    atomic_store(&job->frames_total, frames);
}

static void deadline_after(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / 1000;
    ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Wait on the job's condition until woken or the deadline passes; returns
 * false on timeout. timeout_ms < 0 waits without a deadline. */
static bool job_wait(struct mm3_job *job, const struct timespec *deadline, int timeout_ms)
{
    if (timeout_ms < 0) {
        pthread_cond_wait(&job->cond, &job->mu);
        return true;
    }
    return pthread_cond_timedwait(&job->cond, &job->mu, deadline) != ETIMEDOUT;
}

static void ring_put(struct mm3_job *job, struct mm3_job_chunk c)
{
    CHECK(job->count < job->ring_cap);
    job->ring[(job->head + job->count) % job->ring_cap] = c;
    job->count++;
}

int mm3_job_push_pcm(struct mm3_job *job, const float *pcm, size_t n_frames, int timeout_ms)
{
    size_t n = n_frames * (size_t)job->channels;
    float *copy = malloc(n ? n * sizeof *copy : 1);
    if (!copy)
        return mm3_errorf(-ENOMEM, "job %llu: out of memory for %zu PCM frames", (unsigned long long)job->id, n_frames);
    if (n) memcpy(copy, pcm, n * sizeof *copy);

    struct timespec deadline;
    if (timeout_ms > 0) deadline_after(&deadline, timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&job->mu);
    for (;;) {
        if (atomic_load(&job->cancel_requested)) {
            rc = -ECANCELED;
            break;
        }
        if (job->ended) {
            rc = -EPIPE;
            break;
        }
        if (job->count < job->pcm_capacity) break;
        if (timeout_ms == 0 || !job_wait(job, &deadline, timeout_ms)) {
            rc = -ETIMEDOUT;
            break;
        }
    }
    if (rc == 0) {
        ring_put(job, (struct mm3_job_chunk){MM3_CHUNK_PCM, copy, n_frames});
        pthread_cond_broadcast(&job->cond);
    }
    pthread_mutex_unlock(&job->mu);
    if (rc < 0) {
        free(copy);
        return mm3_errorf(rc, "job %llu: PCM push refused (%s)", (unsigned long long)job->id,
                          rc == -ECANCELED ? "cancelled"
                          : rc == -EPIPE   ? "stream ended"
                                           : "queue full");
    }
    int64_t zero = 0;
    atomic_compare_exchange_strong(&job->t_first_audio_ns, &zero, mm3_job_now_ns());
    atomic_fetch_add(&job->pcm_frames_pushed, (int64_t)n_frames);
    return 0;
}

/* Queue the end marker. The ring has one slot beyond pcm_capacity, so it always fits. */
static int job_end(struct mm3_job *job, enum mm3_job_chunk_kind kind, enum mm3_job_state state, int http_status,
                   const char *msg)
{
    pthread_mutex_lock(&job->mu);
    if (job->ended) {
        pthread_mutex_unlock(&job->mu);
        return -EPIPE;
    }
    if (msg) {
        job->http_status = http_status;
        snprintf(job->error, sizeof job->error, "%s", msg);
    }
    job->ended = true;
    ring_put(job, (struct mm3_job_chunk){kind, NULL, 0});
    /* A cancelled job stays CANCELLED: that is what happened to the client. */
    if (!atomic_load(&job->cancel_requested)) atomic_store(&job->state, state);
    pthread_cond_broadcast(&job->cond);
    pthread_mutex_unlock(&job->mu);
    return 0;
}

int mm3_job_finish(struct mm3_job *job)
{
    return job_end(job, MM3_CHUNK_END, MM3_JOB_DONE, 0, NULL);
}

int mm3_job_fail(struct mm3_job *job, int http_status, const char *fmt, ...)
{
    char msg[sizeof job->error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return job_end(job, MM3_CHUNK_ERROR, MM3_JOB_FAILED, http_status > 0 ? http_status : 500, msg);
}

void mm3_job_set_error(struct mm3_job *job, int http_status, const char *fmt, ...)
{
    pthread_mutex_lock(&job->mu);
    job->http_status = http_status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->error, sizeof job->error, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&job->mu);
}

void mm3_job_set_error_param(struct mm3_job *job, int http_status, const char *param, const char *fmt, ...)
{
    pthread_mutex_lock(&job->mu);
    job->http_status = http_status;
    snprintf(job->error_param, sizeof job->error_param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->error, sizeof job->error, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&job->mu);
}

void mm3_job_error_param(struct mm3_job *job, char *param, size_t cap)
{
    pthread_mutex_lock(&job->mu);
    if (cap) snprintf(param, cap, "%s", job->error_param);
    pthread_mutex_unlock(&job->mu);
}

int mm3_fail_kind_status(enum mm3_fail_kind kind)
{
    switch (kind) {
    case MM3_FAIL_BAD_REQUEST:
        return 400;
    case MM3_FAIL_INTERNAL:
        return 500;
    case MM3_FAIL_STAGE1:
        return 502;
    case MM3_FAIL_UNAVAILABLE:
        return 503;
    }
    return 500;
}

int mm3_job_fail_kind(struct mm3_job *job, enum mm3_fail_kind kind, const char *fmt, ...)
{
    char msg[sizeof job->error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return job_end(job, MM3_CHUNK_ERROR, MM3_JOB_FAILED, mm3_fail_kind_status(kind), msg);
}

void mm3_job_set_error_kind(struct mm3_job *job, enum mm3_fail_kind kind, const char *fmt, ...)
{
    pthread_mutex_lock(&job->mu);
    job->http_status = mm3_fail_kind_status(kind);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(job->error, sizeof job->error, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&job->mu);
}

int mm3_job_error(struct mm3_job *job, char *msg, size_t cap)
{
    pthread_mutex_lock(&job->mu);
    int status = job->http_status;
    if (cap) snprintf(msg, cap, "%s", job->error);
    pthread_mutex_unlock(&job->mu);
    return status;
}

int mm3_job_pop(struct mm3_job *job, struct mm3_job_chunk *out, int timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms > 0) deadline_after(&deadline, timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&job->mu);
    while (job->count == 0) {
        if (timeout_ms == 0 || !job_wait(job, &deadline, timeout_ms)) {
            rc = -ETIMEDOUT;
            break;
        }
    }
    if (rc == 0) {
        struct mm3_job_chunk *c = &job->ring[job->head];
        *out = *c;
        if (c->kind == MM3_CHUNK_PCM) {
            c->pcm = NULL;
            job->head = (job->head + 1) % job->ring_cap;
            job->count--;
            pthread_cond_broadcast(&job->cond); /* room for a blocked pusher */
        }
        /* END / ERROR stay queued so every later pop sees them again. */
    }
    pthread_mutex_unlock(&job->mu);
    return rc;
}

void mm3_job_chunk_release(struct mm3_job_chunk *c)
{
    free(c->pcm);
    c->pcm = NULL;
    c->n_frames = 0;
}

bool mm3_job_cancel(struct mm3_job *job)
{
    pthread_mutex_lock(&job->mu);
    bool first = false;
    if (!job->ended) {
        bool expect = false;
        first = atomic_compare_exchange_strong(&job->cancel_requested, &expect, true);
        if (first) atomic_store(&job->state, MM3_JOB_CANCELLED);
    }
    pthread_cond_broadcast(&job->cond);
    pthread_mutex_unlock(&job->mu);
    return first;
}
