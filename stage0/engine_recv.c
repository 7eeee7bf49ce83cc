/* The engine's receiving side (stage0/engine_internal.h): the receiver thread. */
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
#include "pipe/pipe_channel.h"
#include "pipe/pipe_codec.h"

/* A PCM message of `audio_s` seconds for entry q, under e->mu: stage 1's work for it
 * (progress[2], microseconds so far) feeds the real-time capacity. */
static void pcm_account(struct engine *e, struct eng_req *q, const struct pipe_progress *prog, double audio_s)
{
    int64_t work_us = prog->work_us;
    /* after a stage-1 restart the song's work counts from 0 again: nothing to add */
    if (work_us > q->work_us_seen) admission_observe(&e->adm, (double)(work_us - q->work_us_seen) * 1e-6, audio_s);
    q->work_us_seen = work_us;
    eng_capacity_publish(admission_capacity(&e->adm));
}

static void on_pcm(struct engine *e, struct s1_worker *w, const struct shmconn_msg *m)
{
    struct mm3_job *job = eng_req_job(e, m->req_id, w);
    if (!job) return; /* cancelled meanwhile */
    struct pipe_pcm pcm;
    if (pipe_decode_pcm(m, &pcm) < 0) {
        struct eng_req *r = eng_req_take(e, m->req_id, w);
        mm3_job_fail_kind(job, MM3_FAIL_STAGE1, "stage 1: %s", mm3_last_error());
        if (r) eng_req_put(e, r);
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
        if (n) pcm_account(e, q, &pcm.progress, (double)n / job->pcm_rate);
        eng_play_rate_locked(q, (double)n / job->pcm_rate, mm3_job_now_ns());
    }
    pthread_mutex_unlock(&e->mu);
    float *il = malloc(sizeof(float) * 2 * (n ? n : 1));
    int rc = il ? 0 : -ENOMEM;
    if (il) {
        for (size_t i = skip; i < n; i++) {
            il[2 * (i - skip)] = src[i];
            il[2 * (i - skip) + 1] = src[n + i];
        }
        /* a prerolling stream's audio is kept; whether it is is decided with the keeping,
         * so nothing passes audio kept before it */
        int kept = 0;
        if (n > skip) {
            pthread_mutex_lock(&e->mu);
            if ((q = eng_req_find_locked(e, job)) && q->preroll) {
                rc = eng_preroll_keep_locked(q, il, (int64_t)(n - skip));
                kept = 1;
            } else if (q) {
                eng_listener_advance_locked(q, (double)(n - skip) / job->pcm_rate);
            }
            pthread_mutex_unlock(&e->mu);
        }
        if (n > skip && !kept) rc = mm3_job_push_pcm(job, il, n - skip, PCM_PUSH_TIMEOUT_MS);
    }
    free(il);
    if (rc == 0) {
        int64_t delta = pcm.progress.windows_done - atomic_load(&job->windows_done);
        if (delta > 0) mm3_job_progress_add(job, 0, delta);
    }
    if (rc == -ETIMEDOUT || rc == -ENOMEM) {
        /* Give up on it here and in stage 1 (the cancel ring tells it); the step loop
         * frees the rows if it is still generating. */
        struct eng_req *r = eng_req_take(e, m->req_id, w);
        mm3_job_fail_kind(job, MM3_FAIL_INTERNAL, "%s",
                          rc == -ENOMEM ? "stage 0: out of memory" : "client too slow to take the audio");
        shmconn_request_cancel(w->in, m->req_id);
        LOG_WARN("job %llu: %s", (unsigned long long)m->req_id,
                 rc == -ENOMEM ? "out of memory for PCM" : "client took no audio for 30 s: cancelled");
        if (r) eng_req_put(e, r);
    }
    mm3_job_unref(job);
    eng_play_check(e, w);
}

static void on_message(struct engine *e, struct s1_worker *w, const struct shmconn_msg *m)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        bytes += m->tensors[i].nbytes;
    metrics_counter_add(&mm3_metrics.conn_bytes[METRICS_EDGE_S1_TO_S0], bytes);
    if (m->kind == PIPE_MSG_PCM) {
        on_pcm(e, w, m);
        return;
    }
    if (m->kind != PIPE_MSG_DONE && m->kind != PIPE_MSG_ERROR) {
        LOG_WARN("stage 1 sent message kind %u for job %llu: ignored", m->kind, (unsigned long long)m->req_id);
        return;
    }
    struct eng_req *r = eng_req_take(e, m->req_id, w);
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
        eng_play_now(e, r); /* a prerolling stream is complete: it plays */
        eng_continue_keep(e, r); /* before the client can hear the end and ask for more */
        mm3_job_finish(r->job);
    }
    if (rc < 0 || m->kind == PIPE_MSG_ERROR) {
        if (len > 400) len = 400;
        mm3_job_fail_kind(r->job, MM3_FAIL_STAGE1, "stage 1: %.*s", (int)len, text);
        LOG_WARN("job %llu: stage 1: %.*s", (unsigned long long)m->req_id, (int)len, text);
    }
    eng_req_put(e, r);
    eng_play_check(e, w); /* its room is free */
}

void eng_reset_channels(struct s1_worker *w)
{
    pthread_rwlock_wrlock(&w->conn_mu);
    shmconn_close(w->in);
    w->in = NULL;
    shmconn_close(w->out);
    w->out = NULL;
    if (!atomic_load(&w->e->stopping) && shmconn_create(&w->out, &w->cfg_out) < 0)
        LOG_ERROR("cannot re-create %s: %s", w->cfg_out.name, mm3_last_error());
    pthread_rwlock_unlock(&w->conn_mu);
}

/* Stage 1 gave up on requests (its deadline, or its own failure). */
static void poll_cancels(struct s1_worker *w)
{
    struct engine *e = w->e;
    uint64_t id;
    uint32_t reason;
    for (;;) {
        pthread_rwlock_rdlock(&w->conn_mu);
        int rc = w->out ? shmconn_cancel_poll(w->out, &id, &reason) : 0;
        pthread_rwlock_unlock(&w->conn_mu);
        if (rc <= 0) return;
        struct eng_req *r = eng_req_take(e, id, w);
        if (!r) continue;
        mm3_job_fail_kind(r->job, MM3_FAIL_STAGE1, "stage 1 gave up on the request (%s)",
                          reason == SHMCONN_CANCEL_TIMEOUT ? "no frames within its deadline" : "cancelled by stage 1");
        eng_req_put(e, r);
    }
}

static int try_connect(struct s1_worker *w)
{
    pthread_rwlock_rdlock(&w->conn_mu);
    int dead = !w->out || shmconn_peer_status(w->out) != 0;
    pthread_rwlock_unlock(&w->conn_mu);
    /* A consumer that attached and died leaves the region unusable: offer a new one. */
    if (dead) eng_reset_channels(w);
    shmconn_t *in;
    int rc = shmconn_open(&in, &w->cfg_in, 0.25);
    if (rc < 0) return rc;
    pthread_rwlock_wrlock(&w->conn_mu);
    w->in = in;
    pthread_rwlock_unlock(&w->conn_mu);
    atomic_store(&w->up, 1);
    LOG_INFO("stage 1 attached (%s)", shmconn_segment_name(in));
    pthread_mutex_lock(&w->e->mu);
    eng_publish_worker_load_locked(w->e);
    pthread_mutex_unlock(&w->e->mu);
    return 0;
}

void *eng_rx_thread(void *arg)
{
    struct s1_worker *w = arg;
    struct engine *e = w->e;
    while (!atomic_load(&e->stopping)) {
        int64_t now = mm3_job_now_ns();
        atomic_store(&w->rx_turn_ns, now);
        if (!w->in) {
            int rc = try_connect(w);
            /* a refused segment (another user's, another run's) is worth saying, not every 100 ms */
            if (rc < 0 && rc != SHMCONN_E_TIMEOUT && now - w->last_connect_log_ns > 10 * INT64_C(1000000000)) {
                LOG_WARN("stage-1 worker %d not attached: %s", w->index, mm3_last_error());
                w->last_connect_log_ns = now;
            }
            if (rc < 0) {
                struct timespec t = {0, 100 * 1000000L};
                nanosleep(&t, NULL);
            }
            continue;
        }
        struct shmconn_event ev;
        int rc = shmconn_recv(w->in, &ev, 0.2);
        poll_cancels(w);
        if (rc == SHMCONN_E_TIMEOUT) {
            pthread_rwlock_rdlock(&w->conn_mu);
            int st = w->out ? shmconn_peer_status(w->out) : SHMCONN_E_CLOSED;
            pthread_rwlock_unlock(&w->conn_mu);
            if (st == SHMCONN_E_PEER_DEAD || st == SHMCONN_E_CLOSED)
                eng_stage1_lost(w, st == SHMCONN_E_CLOSED ? "closed its channel" : "process died");
            continue;
        }
        if (rc < 0) {
            eng_stage1_lost(w, rc == SHMCONN_E_CLOSED ? "closed its channel" : "process died");
            continue;
        }
        if (ev.type == SHMCONN_EVENT_MESSAGE) {
            on_message(e, w, &ev.msg);
            shmconn_release(w->in, &ev.msg);
        } else if (ev.type == SHMCONN_EVENT_TIMEOUT) {
            struct eng_req *r = eng_req_take(e, ev.req_id, w);
            if (r) {
                mm3_job_fail_kind(r->job, MM3_FAIL_STAGE1, "stage 1 did not answer within %.0f s", ev.waited_s);
                LOG_WARN("job %llu: stage 1 did not answer within %.0f s (%s deadline)", (unsigned long long)ev.req_id,
                         ev.waited_s, ev.first_chunk ? "first-chunk" : "steady");
                mm3_job_cancel(r->job); /* frees its rows at the next step */
                eng_req_put(e, r);
            }
        } else if (ev.type == SHMCONN_EVENT_PEER_LOST) {
            pthread_mutex_lock(&e->mu);
            struct eng_req *h = e->reqs;
            while (h && !(h->job->id == ev.req_id && h->w == w))
                h = h->next;
            int held = h && eng_hold_locked(e, h);
            pthread_mutex_unlock(&e->mu);
            struct eng_req *r = held ? NULL : eng_req_take(e, ev.req_id, w);
            if (r) {
                mm3_job_fail_kind(r->job, MM3_FAIL_STAGE1, "stage 1 died mid-song");
                LOG_WARN("job %llu: stage 1 died mid-song", (unsigned long long)ev.req_id);
                eng_req_put(e, r);
            }
        }
    }
    return NULL;
}
