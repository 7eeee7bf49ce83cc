/* When streams play (stage0/engine_internal.h, stage0/admission.h): a counted stream that
 * does not fit beside the streams playing on its stage-1 worker prerolls, its audio kept
 * here, and plays once it fits or its song is complete. */
#include "stage0/engine_internal.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/metrics.h"
#include "pipe/pipe_proto.h"
#include "stage0/generate.h"

/* The weight of the earlier rate in a stream's average: the last few windows count. */
#define PLAY_RATE_KEEP 0.5

static double now_s(void)
{
    return (double)mm3_job_now_ns() * 1e-9;
}

double eng_left_s_locked(const struct engine *e, const struct eng_req *r)
{
    const struct mm3_job *j = r->job;
    double left = (double)atomic_load(&j->frames_total) / e->fps - (double)r->pcm_got / j->pcm_rate;
    return left > 0 ? left : 0;
}

/* Seconds before the entry's client runs dry: a prerolling one would get all its kept audio
 * at once; a playing one without audio yet is due now. */
static double dry_s(const struct eng_req *r, double now)
{
    if (r->preroll) return (double)r->pre_n / r->job->pcm_rate;
    return r->play.started ? playback_runs_dry(&r->play) - now : 0;
}

static double margin_locked(const struct engine *e, const struct s1_worker *w)
{
    int songs = eng_worker_songs_locked(e, w);
    int batch = songs < PIPE_BATCH_WINDOWS_MAX ? songs : PIPE_BATCH_WINDOWS_MAX;
    return admission_margin(&e->adm, WINDOW_HOP / e->fps, batch > 0 ? batch : 1);
}

/* The needs of the streams playing on w, summed, and how many there are. */
static double load_locked(const struct engine *e, const struct s1_worker *w, double now, double margin, int *streams)
{
    double load = 0;
    *streams = 0;
    for (const struct eng_req *r = e->reqs; r; r = r->next) {
        if (r->w != w || !r->counted || r->preroll || r->awaiting) continue;
        load += admission_stream_need(dry_s(r, now), eng_left_s_locked(e, r), margin);
        (*streams)++;
    }
    return load;
}

void eng_listener_advance_locked(struct eng_req *r, double new_s)
{
    if (!r->job->params.stream || new_s <= 0) return;
    int stalls = r->play.stalls;
    double slack = playback_arrive(&r->play, now_s(), new_s);
    if (r->play.stalls > stalls) {
        metrics_counter_add(&mm3_metrics.stream_stalls, 1);
        metrics_counter_add(&mm3_metrics.stream_stall_us, (uint64_t)(-slack * 1e6));
    }
    if (r->play.audio_s > new_s) metrics_histogram_observe(&mm3_metrics.window_slack_seconds, slack);
}

void eng_publish_streams_locked(const struct engine *e)
{
    int pre = 0;
    for (const struct eng_req *r = e->reqs; r; r = r->next)
        pre += r->preroll && !r->judge_at_first_audio;
    metrics_gauge_set(&mm3_metrics.streams_admitted, eng_streams_locked(e));
    metrics_gauge_set(&mm3_metrics.streams_prerolling, pre);
}

void eng_play_rate_locked(struct eng_req *r, double audio_s, int64_t now_ns)
{
    if (r->t_last_pcm_ns > 0 && now_ns > r->t_last_pcm_ns && audio_s > 0) {
        double rate = audio_s / ((double)(now_ns - r->t_last_pcm_ns) * 1e-9);
        r->rate = r->rate > 0 ? PLAY_RATE_KEEP * r->rate + (1 - PLAY_RATE_KEEP) * rate : rate;
    }
    if (audio_s > 0) r->t_last_pcm_ns = now_ns;
}

/* The rate a new stream `self` on w can expect: the best the other songs get now (a due
 * window goes in every batch), INFINITY with no other song in flight or waiting, -1 when
 * none is measured. */
static double new_stream_rate_locked(const struct engine *e, const struct s1_worker *w, int queued,
                                     const struct eng_req *self)
{
    double best = -1;
    int songs = 0;
    for (const struct eng_req *r = e->reqs; r; r = r->next) {
        if (r == self || r->w != w || r->awaiting) continue;
        songs++;
        if (r->rate > best) best = r->rate;
    }
    return songs == 0 && queued == 0 ? INFINITY : best;
}

static void preroll_begin_locked(struct engine *e, struct eng_req *r, int streams, double load, double rate)
{
    r->preroll = 1;
    r->judge_at_first_audio = 0;
    atomic_store(&r->job->preroll, 1);
    metrics_counter_add(&mm3_metrics.streams_prerolled, 1);
    LOG_INFO("job %llu: stream prerolls: %d streams play with needs %.2f, real-time capacity %.2f x share %.2f, "
             "songs' audio coming at %.2fx",
             (unsigned long long)r->job->id, streams, load, admission_capacity(&e->adm), e->adm.share, rate);
}

void eng_play_decide_locked(struct engine *e, struct eng_req *r, int queued)
{
    r->rate = -1;
    if (!r->counted) return;
    double rate = new_stream_rate_locked(e, r->w, queued, r);
    if (isinf(rate)) {
        r->preroll = r->judge_at_first_audio = 1;
        return;
    }
    int streams;
    double margin = margin_locked(e, r->w), load = load_locked(e, r->w, now_s(), margin, &streams);
    double need = admission_stream_need(0, eng_left_s_locked(e, r), margin);
    if (!admission_fits(&e->adm, streams, load, need, rate)) preroll_begin_locked(e, r, streams, load, rate);
}

int eng_preroll_keep_locked(struct eng_req *r, const float *pcm, int64_t n)
{
    int ch = r->job->channels;
    if (r->pre_n + n > r->pre_cap) {
        int64_t cap = r->pre_cap ? 2 * r->pre_cap : 65536;
        while (cap < r->pre_n + n)
            cap *= 2;
        float *p = realloc(r->pre_pcm, sizeof(float) * (size_t)(cap * ch));
        if (!p) return mm3_errorf(-ENOMEM, "stage 0: out of memory keeping %lld sample frames of a prerolling stream",
                                  (long long)cap);
        r->pre_pcm = p;
        r->pre_cap = cap;
    }
    memcpy(r->pre_pcm + r->pre_n * ch, pcm, sizeof(float) * (size_t)(n * ch));
    r->pre_n += n;
    return 0;
}

/* Hand the kept audio to the client until none is left, then play as any stream: audio
 * the receiver keeps meanwhile follows in order. */
static void play_start(struct engine *e, struct eng_req *r)
{
    struct mm3_job *job = r->job;
    pthread_mutex_lock(&e->mu);
    double kept = (double)r->pre_n / job->pcm_rate;
    int judged = r->judge_at_first_audio;
    r->judge_at_first_audio = 0;
    r->play_us = mm3_job_now_ns() / 1000;
    r->play_unsent = 1;
    pthread_mutex_unlock(&e->mu);
    if (!judged) LOG_INFO("job %llu: stream plays after prerolling %.1f s of audio", (unsigned long long)job->id, kept);
    for (;;) {
        pthread_mutex_lock(&e->mu);
        float *pcm = r->pre_pcm;
        int64_t n = r->pre_n;
        r->pre_pcm = NULL;
        r->pre_n = r->pre_cap = 0;
        eng_listener_advance_locked(r, (double)n / job->pcm_rate);
        if (n == 0) {
            r->preroll = 0;
            atomic_store(&job->preroll, 0);
            atomic_store(&job->start_estimate_ns, 0);
            eng_publish_streams_locked(e);
        }
        pthread_mutex_unlock(&e->mu);
        if (n == 0) return;
        int rc = mm3_job_push_pcm(job, pcm, (size_t)n, PCM_PUSH_TIMEOUT_MS);
        free(pcm);
        if (rc < 0 && rc != -ECANCELED && rc != -EPIPE)
            mm3_job_fail_kind(job, MM3_FAIL_INTERNAL, "stage 0: a prerolled stream's audio: %s", mm3_last_error());
    }
}

void eng_play_now(struct engine *e, struct eng_req *r)
{
    pthread_mutex_lock(&e->mu);
    int pre = r->preroll;
    pthread_mutex_unlock(&e->mu);
    if (pre) play_start(e, r);
}

void eng_play_check(struct engine *e, struct s1_worker *w)
{
    int queued = atomic_load(&e->sched_queued);
    pthread_mutex_lock(&e->mu);
    struct eng_req *pre[e->n_reqs > 0 ? e->n_reqs : 1], *go[e->n_reqs > 0 ? e->n_reqs : 1];
    int n = 0, n_go = 0;
    for (struct eng_req *r = e->reqs; r; r = r->next) /* newest first */
        if (r->preroll && r->w == w && !r->awaiting) pre[n++] = r;
    if (n == 0) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    double now = now_s(), margin = margin_locked(e, w), w_audio = admission_work_per_audio(&e->adm);
    int streams, songs = eng_worker_songs_locked(e, w);
    double load = load_locked(e, w, now, margin, &streams);
    for (int i = n - 1; i >= 0; i--) { /* oldest first */
        struct eng_req *r = pre[i];
        if (r->judge_at_first_audio && r->pre_n == 0) continue;
        /* judged as new at its first audio: its own rate is not measured yet */
        double rate = r->judge_at_first_audio ? new_stream_rate_locked(e, w, queued, r) : r->rate;
        double need = admission_stream_need(dry_s(r, now), eng_left_s_locked(e, r), margin);
        if (admission_fits(&e->adm, streams, load, need, rate)) {
            load += need;
            streams++;
            r->refs++;
            go[n_go++] = r;
            continue;
        }
        if (r->judge_at_first_audio) {
            preroll_begin_locked(e, r, streams, load, rate);
            eng_publish_streams_locked(e);
        }
        /* at the latest once wholly rendered, its room shared evenly */
        double est = w_audio > 0 ? admission_render_estimate(&e->adm, eng_left_s_locked(e, r), songs) : -1;
        atomic_store(&r->job->start_estimate_ns, est >= 0 ? mm3_job_now_ns() + (int64_t)(est * 1e9) : 0);
    }
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n_go; i++) {
        play_start(e, go[i]);
        eng_req_put(e, go[i]);
    }
}

void eng_play_send(struct engine *e)
{
    for (;;) {
        pthread_mutex_lock(&e->mu);
        struct eng_req *r = e->reqs;
        while (r && !r->play_unsent)
            r = r->next;
        int64_t us = 0;
        if (r) {
            r->play_unsent = 0;
            us = r->play_us;
            r->refs++;
        }
        pthread_mutex_unlock(&e->mu);
        if (!r) return;
        int rc = eng_send_play(e, r, us);
        if (rc < 0) /* a lost stage 1 gets the song again with START, which says it plays */
            LOG_DEBUG("job %llu: PLAY not sent: %s", (unsigned long long)r->job->id, mm3_last_error());
        eng_req_put(e, r);
    }
}
