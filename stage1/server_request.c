/* One request in the stage-1 server: START / FRAMES / END / CANCEL in, PCM / DONE / ERROR
 * out (pipe/pipe_proto.h, through pipe/pipe_codec.h), a render per active request. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/frame_mix.h"
#include "common/log.h"
#include "common/replay_file.h"
#include "stage1/server_internal.h"

double s1_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct s1_request *s1_request_find(struct s1_server *s, uint64_t id)
{
    for (int i = 0; i < s->n_reqs; i++)
        if (s->reqs[i]->id == id) return s->reqs[i];
    return NULL;
}

static void request_free(struct s1_request *q)
{
    render_free(q->render);
    resample_free(q->rs);
    replay_noise_free(&q->replay);
    free(q->held), free(q->rs_buf), free(q->song);
    free(q);
}

void s1_request_remove(struct s1_server *s, struct s1_request *q)
{
    for (int i = 0; i < s->n_reqs; i++)
        if (s->reqs[i] == q) {
            memmove(&s->reqs[i], &s->reqs[i + 1], sizeof q * (size_t)(s->n_reqs - i - 1));
            s->n_reqs--;
            break;
        }
    request_free(q);
}

/* ---- sending on s1_to_s0 ---- */

/* Send failures that mean stage 0 is gone flag the server; the caller sees rc either way. */
static int out_check(struct s1_server *s, int rc)
{
    if (rc == SHMCONN_E_PEER_DEAD || rc == SHMCONN_E_CLOSED) s->stage0_lost = 1;
    return rc;
}

/* One PCM message: samples at .. at + m - 1 of PCM [2, n] (channel c at pcm + c*stride;
 * m may be 0) and the progress tensor, written straight into the region. */
static int send_pcm_message(struct s1_server *s, struct s1_request *q, const float *pcm, int64_t stride, int64_t at,
                            int64_t m)
{
    struct shmconn_msg msg;
    int rc = pipe_encode_pcm(&msg, &(struct pipe_pcm){.pcm = NULL, .n = m}); /* written in place below */
    if (rc < 0) return rc;
    msg.req_id = q->id;
    msg.chunk = q->chunk_out;
    if ((rc = shmconn_send_begin(s->out, &msg, s->send_timeout_s)) < 0) return out_check(s, rc);
    struct pipe_progress progress = {
        .windows_done = q->windows_done,
        .windows_planned = q->ended ? render_window_count((int)q->frames_in) : 0,
        .work_us = (int64_t)(q->compute_s * 1e6),
    };
    pipe_pcm_write(&msg, m ? pcm + at : NULL, m ? pcm + stride + at : NULL, &progress);
    if ((rc = shmconn_send_commit(s->out, &msg)) < 0) return out_check(s, rc);
    q->chunk_out++;
    q->t_last_out = s1_now();
    if (m && q->t_first_audio == 0) q->t_first_audio = q->t_last_out;
    q->samples_out += m;
    return 0;
}

/* PCM [2, n] as messages of at most S1_PCM_MAX_SAMPLES. */
static int send_pcm(struct s1_server *s, struct s1_request *q, const float *pcm, int64_t stride, int64_t n)
{
    if (!s->out || s->stage0_lost) return SHMCONN_E_PEER_DEAD;
    for (int64_t at = 0; at < n;) {
        int64_t m = n - at < S1_PCM_MAX_SAMPLES ? n - at : S1_PCM_MAX_SAMPLES;
        int rc = send_pcm_message(s, q, pcm, stride, at, m);
        if (rc < 0) return rc;
        at += m;
    }
    return 0;
}

/* With codec_streaming off a song's audio waits for its end, but stage 0 still hears of
 * each rendered window: a PCM message of no samples with the progress tensor. Stage 0's
 * deadlines then time stage 1's silence between windows rather than the render of the
 * whole song (a held 6-minute song among 8 on one GPU renders for minutes, longer than
 * the 300 s first-chunk wait of the defaults), and the job's progress moves. */
static int send_progress(struct s1_server *s, struct s1_request *q)
{
    if (!s->out || s->stage0_lost) return SHMCONN_E_PEER_DEAD;
    return send_pcm_message(s, q, NULL, 0, 0, 0);
}

/* Send msg (encoded by pipe/pipe_codec.h) as the request's next chunk. */
static int send_small(struct s1_server *s, struct s1_request *q, struct shmconn_msg *msg)
{
    if (!s->out || s->stage0_lost) return SHMCONN_E_PEER_DEAD;
    msg->req_id = q->id;
    msg->chunk = q->chunk_out;
    int rc = shmconn_send(s->out, msg, s->send_timeout_s);
    if (rc < 0) return out_check(s, rc);
    q->chunk_out++;
    return 0;
}

/* Hand PCM on: kept for the end of the song when codec_streaming is off, else sent now. */
static int pcm_out(struct s1_server *s, struct s1_request *q, const float *pcm, int64_t stride, int64_t n)
{
    if (s->codec_streaming) return send_pcm(s, q, pcm, stride, n);
    if (q->song_n + n > q->song_cap) {
        int64_t cap = q->song_cap ? q->song_cap : 1 << 16;
        while (cap < q->song_n + n)
            cap *= 2;
        float *b = malloc(sizeof(float) * 2 * (size_t)cap);
        if (!b) return mm3_errorf(-ENOMEM, "request %" PRIu64 ": out of memory for %" PRId64 " samples", q->id, cap);
        for (int c = 0; c < 2; c++)
            if (q->song_n) memcpy(b + c * cap, q->song + c * q->song_cap, sizeof(float) * (size_t)q->song_n);
        free(q->song);
        q->song = b;
        q->song_cap = cap;
    }
    for (int c = 0; c < 2; c++)
        memcpy(q->song + c * q->song_cap + q->song_n, pcm + c * stride, sizeof(float) * (size_t)n);
    q->song_n += n;
    return 0;
}

static int rs_reserve(struct s1_request *q, int64_t n)
{
    if (n <= q->rs_cap) return 0;
    float *b = realloc(q->rs_buf, sizeof(float) * 2 * (size_t)n);
    if (!b) return mm3_errorf(-ENOMEM, "request %" PRIu64 ": out of memory for %" PRId64 " samples", q->id, n);
    q->rs_buf = b;
    q->rs_cap = n;
    return 0;
}

/* The render's sink: resample when asked, then out. A failure is kept in send_rc. */
static int request_emit(void *ctx, const float *pcm, int n)
{
    struct s1_request *q = ctx;
    struct s1_server *s = q->srv;
    int rc;
    if (q->rs) {
        int64_t want = resample_stream_push_len(q->rs, n), got = 0;
        if ((rc = rs_reserve(q, want)) == 0 &&
            (rc = resample_stream_push(q->rs, pcm, n, n, q->rs_buf, q->rs_cap, &got)) == 0)
            rc = pcm_out(s, q, q->rs_buf, q->rs_cap, got);
    } else {
        rc = pcm_out(s, q, pcm, n, n);
    }
    if (rc == 0 && !s->codec_streaming) rc = send_progress(s, q);
    if (rc < 0 && !q->send_rc) q->send_rc = rc;
    return rc < 0 ? -1 : 0;
}

static int vocoder_decode_cb(void *ctx, const float *latents, int L, float *pcm)
{
    return vocoder_decode(ctx, latents, L, pcm);
}

/* ---- failing and finishing ---- */

void s1_request_fail(struct s1_server *s, struct s1_request *q, int tell, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    char esc[1200]; /* the reason may quote the request (a replay file's path) */
    LOG_WARN("request %" PRIu64 " failed: %s", q->id, mm3_log_escape(esc, sizeof esc, text));
    if (tell && s->out && !s->stage0_lost) {
        struct shmconn_msg msg;
        int rc = pipe_encode_error(&msg, text, strlen(text));
        if (rc == 0) rc = send_small(s, q, &msg);
        if (rc < 0 && rc != SHMCONN_E_CANCELLED)
            LOG_WARN("request %" PRIu64 ": the ERROR message could not be sent: %s", q->id, mm3_last_error());
    }
    /* tell stage 0 to stop sending, and drop what it already sent */
    if (!q->untracked && s->in) shmconn_request_cancel(s->in, q->id);
    s->tot.requests_failed++;
    s1_request_remove(s, q);
}

void s1_request_drop(struct s1_server *s, uint64_t id, const char *why)
{
    struct s1_request *q = s1_request_find(s, id);
    if (!q) return;
    LOG_INFO("request %" PRIu64 ": %s; freeing it", id, why);
    if (!q->untracked && s->in) shmconn_request_cancel(s->in, q->id);
    s->tot.requests_cancelled++;
    s1_request_remove(s, q);
}

/* A send inside the sink or at the end failed with rc: classify and free. */
static void request_send_failed(struct s1_server *s, struct s1_request *q, int rc, const char *what)
{
    if (rc == SHMCONN_E_CANCELLED) {
        s1_request_drop(s, q->id, "stage 0 cancelled it (its PCM was refused)");
    } else if (s->stage0_lost) {
        s1_request_fail(s, q, 0, "stage 0 went away while sending %s", what);
    } else {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", mm3_last_error());
        s1_request_fail(s, q, 1, "stage 1 could not send %s: %s", what, msg);
    }
}

static void request_complete(struct s1_server *s, struct s1_request *q)
{
    int rc = 0;
    if (q->rs) {
        int64_t got = 0;
        if ((rc = rs_reserve(q, resample_stream_finish_len(q->rs))) == 0 &&
            (rc = resample_stream_finish(q->rs, q->rs_buf, q->rs_cap, &got)) == 0)
            rc = pcm_out(s, q, q->rs_buf, q->rs_cap, got);
    }
    if (rc == 0 && !s->codec_streaming) rc = send_pcm(s, q, q->song, q->song_cap, q->song_n);
    if (rc == 0) {
        struct pipe_done done = {.total = q->samples_out, .fp16_rescues = (int64_t)s1_backend_fp16_rescues()};
        struct shmconn_msg msg;
        if ((rc = pipe_encode_done(&msg, &done)) == 0) rc = send_small(s, q, &msg);
    }
    if (rc < 0) {
        request_send_failed(s, q, rc, "the end of the song");
        return;
    }
    double audio_s = (double)q->samples_out / q->p.sample_rate, wall = s1_now() - q->t_start;
    LOG_INFO("request %" PRIu64 " done: %" PRId64 " frames, %d windows, %.2f s of audio at %d Hz, compute %.2f s "
             "(real-time factor %.3f), wall %.2f s",
             q->id, q->frames_in, q->windows_done, audio_s, q->p.sample_rate, q->compute_s,
             audio_s > 0 ? q->compute_s / audio_s : 0.0, wall);
    s->tot.requests_done++;
    s->tot.audio_s += audio_s;
    s1_request_remove(s, q);
}

/* A render call failed with rc: the sink's send failure, or the render's own error. */
static void request_render_failed(struct s1_server *s, struct s1_request *q, const char *what)
{
    if (q->send_rc) {
        request_send_failed(s, q, q->send_rc, "PCM");
        return;
    }
    char msg[768];
    snprintf(msg, sizeof msg, "%s", mm3_last_error());
    s1_request_fail(s, q, 1, "stage 1 %s: %s", what, msg);
}

/* ---- scheduling hooks ---- */

int s1_request_ready(const struct s1_request *q)
{
    return q->active &&
           (render_window_ready(q->render) || render_window_unfinished(q->render) > 0 || render_complete(q->render));
}

void s1_request_candidate(const struct s1_server *s, const struct s1_request *q, double now, struct window_candidate *c)
{
    c->id = q->id;
    c->first = render_windows_done(q->render) == 0 && render_window_unfinished(q->render) == 0;
    /* a whole-file song is due once half of stage 0's wait for its next audio has passed */
    double whole_by = (q->t_last_out > 0 ? q->t_last_out : q->t_start) + 0.5 * s->in_cfg.steady_deadline_s;
    /* a prerolled stream plays from PLAY, or from its first audio when that came later */
    int playing = q->p.streamed && s->codec_streaming && (!q->p.preroll || q->t_play > 0);
    c->deadline = window_deadline(playing, c->first, now, window_play_clock(q->t_first_audio, q->t_play),
                                  (double)q->samples_out / q->p.sample_rate, whole_by);
}

int s1_request_activate(struct s1_server *s, struct s1_request *q)
{
    struct render_params p = {
        .n_steps = q->p.num_inference_steps,
        .guidance = q->p.guidance_scale,
        .shift = q->p.flow_shift,
        .noise = {RENDER_NOISE_SEEDED, q->p.seed, 0, NULL, NULL},
        .decoder = {s->voc, s->hop, vocoder_decode_cb},
        .sink = {q, request_emit},
    };
    if (q->replay.n) p.noise = replay_noise_render(&q->replay);
    s1_backend_apply(&s->be, &p);
    int rc = render_create(&q->render, s->cm, s->dm, &p);
    if (rc < 0) return rc;
    q->active = 1;
    if (q->n_held && (rc = render_push_frames_deferred(q->render, q->held, q->n_held, s->cm->cfg.hidden)) < 0)
        return rc;
    free(q->held);
    q->held = NULL;
    q->n_held = q->held_cap = 0;
    if (q->ended) rc = render_end(q->render);
    return rc;
}

int s1_request_prepare(struct s1_server *s, struct s1_request *q, struct flow_job *job)
{
    if (!q->active) return 0;
    double t0 = s1_now();
    int rc = render_window_prepare(q->render, job);
    double dt = s1_now() - t0;
    q->compute_s += dt;
    s->tot.compute_s += dt;
    if (rc < 0) {
        request_render_failed(s, q, "window failed");
        return rc;
    }
    q->in_flow = rc;
    return rc;
}

void s1_request_collect(struct s1_server *s, struct s1_request *q, int flow_rc, double dit_s)
{
    q->in_flow = 0;
    q->compute_s += dit_s;
    if (render_window_collect(q->render, flow_rc) < 0) request_render_failed(s, q, "window failed");
}

void s1_request_step(struct s1_server *s, struct s1_request *q)
{
    if (!q->active) return;
    if (render_window_unfinished(q->render) > 0) {
        double t0 = s1_now();
        q->windows_done = render_windows_done(q->render) + 1;
        int rc = render_window_finish(q->render);
        double dt = s->finishing_overlapped ? 0.0 : s1_now() - t0;
        q->compute_s += dt;
        s->tot.compute_s += dt;
        if (rc < 0) {
            request_render_failed(s, q, "window failed");
            return;
        }
        s->tot.windows++;
        LOG_DEBUG("request %" PRIu64 ": window %d finished, %.3f s of compute so far", q->id, q->windows_done - 1,
                  q->compute_s);
    }
    if (render_complete(q->render)) request_complete(s, q);
}

/* ---- messages from stage 0 ---- */

/* Fail a request id that has no state here (bad START): ERROR and stop its frames. */
static void refuse(struct s1_server *s, uint64_t id, const char *text)
{
    struct s1_request *q = calloc(1, sizeof *q);
    if (!q) {
        char esc[1200];
        LOG_WARN("request %" PRIu64 " refused (and out of memory to say so): %s", id,
                 mm3_log_escape(esc, sizeof esc, text));
        if (s->in) shmconn_request_cancel(s->in, id);
        return;
    }
    q->id = id;
    q->srv = s;
    s->reqs[s->n_reqs++] = q; /* the list has one spare entry for this */
    s1_request_fail(s, q, 1, "%s", text);
}

/* START's optional "replay" tensor: a testing aid that reads a server-side file, so it
 * is honoured only when the operator set MM3_ALLOW_REPLAY=1, and only for a regular
 * file inside api.replay_dir (common/replay_file.h). Fails q on refusal. */
static int start_replay(struct s1_server *s, struct s1_request *q, const struct pipe_start *st)
{
    if (!st->replay) return 0;
    const char *allow = getenv("MM3_ALLOW_REPLAY");
    if (!allow || strcmp(allow, "1")) {
        s1_request_fail(s, q, 1, "replay not enabled (stage 1 needs MM3_ALLOW_REPLAY=1)");
        return -1;
    }
    char *path = malloc(st->replay_len + 1);
    if (!path) {
        s1_request_fail(s, q, 1, "stage 1 is out of memory");
        return -1;
    }
    memcpy(path, st->replay, st->replay_len);
    path[st->replay_len] = 0;
    struct st_file f;
    int rc = replay_file_open_st(&f, s->d.api.replay_dir, path);
    if (rc == 0) {
        rc = replay_noise_load_file(&q->replay, &f);
        st_file_close(&f);
    }
    free(path);
    if (rc < 0) {
        s1_request_fail(s, q, 1, "stage 1 replay: %s", mm3_last_error());
        return -1;
    }
    return 0;
}

static void on_start(struct s1_server *s, const struct shmconn_msg *m)
{
    struct pipe_start st;
    char text[512] = "";
    if (pipe_decode_start(m, &st) < 0) snprintf(text, sizeof text, "%s", mm3_last_error());
    struct s1_request *old = s1_request_find(s, m->req_id);
    if (old) {
        s1_request_fail(s, old, 1, "START for request %" PRIu64 " while it is in flight", m->req_id);
        return;
    }
    if (text[0]) {
        refuse(s, m->req_id, text);
        return;
    }
    struct pipe_request_params p = st.params;
    /* stage 0 normally fills both; these mean "stage 1's deploy-file default" */
    if (p.num_inference_steps == 0) p.num_inference_steps = s->st->num_inference_steps;
    if (p.guidance_scale < 0.0f) p.guidance_scale = (float)s->st->guidance_scale;
    if (p.flow_shift == 0.0f) p.flow_shift = s->default_shift;
    const struct condition_config *g = &s->cm->cfg;
    if (p.premixed ? (int64_t)p.frame_width != g->hidden : (int64_t)p.frame_width != (int64_t)g->n_layers * g->hidden)
        snprintf(text, sizeof text, "START frame_width %u with premixed %d: expected %d", p.frame_width, p.premixed,
                 p.premixed ? g->hidden : g->n_layers * g->hidden);
    else if (p.max_frames < 1 || p.max_frames > MM3_DEPLOY_AUDIO_FRAMES_MAX + MM3_DEPLOY_EXTRA_AR_STEPS)
        snprintf(text, sizeof text, "START max_frames %d: expected 1..%d", p.max_frames,
                 MM3_DEPLOY_AUDIO_FRAMES_MAX + MM3_DEPLOY_EXTRA_AR_STEPS);
    else if (p.num_inference_steps < 1 || p.num_inference_steps > 1000)
        snprintf(text, sizeof text, "START num_inference_steps %d: expected 1..1000", p.num_inference_steps);
    else if (!(p.guidance_scale >= 0.0f && p.guidance_scale <= 100.0f))
        snprintf(text, sizeof text, "START guidance_scale %g: expected 0..100", (double)p.guidance_scale);
    else if (!(p.flow_shift > 0.0f && p.flow_shift <= FLOW_MAX_SHIFT))
        snprintf(text, sizeof text, "START flow_shift %g: expected (0, %g] (0: stage 1's default)",
                 (double)p.flow_shift, (double)FLOW_MAX_SHIFT);
    else if (p.sample_rate != s->native_rate && p.sample_rate != 32000)
        snprintf(text, sizeof text, "START sample_rate %d: expected %d (native) or 32000", p.sample_rate,
                 s->native_rate);
    else if (p.streamed != 0 && p.streamed != 1)
        snprintf(text, sizeof text, "START streamed %d: expected 0 or 1", p.streamed);
    else if (p.preroll != 0 && !(p.preroll == 1 && p.streamed == 1))
        snprintf(text, sizeof text, "START preroll %d: expected 0, or 1 with streamed 1", p.preroll);
    else if (s->n_reqs >= s->max_reqs)
        snprintf(text, sizeof text, "stage 1 is full: %d requests in flight (max_num_seqs %d + %d waiting)", s->n_reqs,
                 s->max_active, s->max_reqs - s->max_active);
    if (text[0]) {
        refuse(s, m->req_id, text);
        return;
    }
    struct s1_request *q = calloc(1, sizeof *q);
    if (!q) {
        refuse(s, m->req_id, "stage 1 is out of memory");
        return;
    }
    q->id = m->req_id;
    q->p = p;
    q->srv = s;
    q->t_start = s1_now();
    q->chunk_out = 0;
    s->reqs[s->n_reqs++] = q;
    int rc = 0;
    if (p.sample_rate != s->native_rate) rc = resample_create(&q->rs, s->native_rate, p.sample_rate, 2);
    if (rc < 0) {
        s1_request_fail(s, q, 1, "stage 1 resampler %d -> %d Hz: %s", s->native_rate, p.sample_rate, mm3_last_error());
        return;
    }
    if ((rc = shmconn_request_begin(s->in, q->id)) < 0) {
        q->untracked = 1;
        s1_request_fail(s, q, 1, "stage 1 cannot track the request: %s", mm3_last_error());
        return;
    }
    if (start_replay(s, q, &st) < 0) return;
    LOG_INFO("request %" PRIu64 ": start, seed %" PRIu64 ", %d steps, guidance %.3g, shift %.3g, %d Hz, %s frames "
             "of %u, %d in flight",
             q->id, p.seed, p.num_inference_steps, (double)p.guidance_scale, (double)p.flow_shift, p.sample_rate,
             p.premixed ? "pre-mixed" : "raw", p.frame_width, s->n_reqs);
}

static void on_frames(struct s1_server *s, struct s1_request *q, const struct shmconn_msg *m)
{
    struct pipe_frames f;
    if (pipe_decode_frames(m, &f) < 0) {
        s1_request_fail(s, q, 1, "%s", mm3_last_error());
        return;
    }
    int64_t n = f.n, w = f.width, at = f.first;
    if (w != q->p.frame_width) {
        s1_request_fail(s, q, 1, "FRAMES of width %" PRId64 ", expected %u (START frame_width)", w, q->p.frame_width);
        return;
    }
    if (at != q->frames_in) {
        s1_request_fail(s, q, 1, "FRAMES start at frame %" PRId64 ", expected %" PRId64 " (a gap or a repeat)", at,
                        q->frames_in);
        return;
    }
    if (q->ended) {
        s1_request_fail(s, q, 1, "FRAMES after END");
        return;
    }
    if (q->frames_in + n > q->p.max_frames) {
        s1_request_fail(s, q, 1, "frames %" PRId64 "..%" PRId64 " exceed the request's max_frames %d", at, at + n - 1,
                        q->p.max_frames);
        return;
    }
    int rc;
    if (q->active) {
        rc = render_push_frames_deferred(q->render, f.frames, (int)n, (int)w);
    } else {
        int H = s->cm->cfg.hidden;
        if (q->n_held + n > q->held_cap) {
            int cap = q->held_cap ? q->held_cap : RENDER_WINDOW_FRAMES;
            while (cap < q->n_held + n)
                cap *= 2;
            float *b = realloc(q->held, sizeof(float) * (size_t)cap * H);
            if (!b) {
                s1_request_fail(s, q, 1, "stage 1 is out of memory for %d waiting frames", cap);
                return;
            }
            q->held = b;
            q->held_cap = cap;
        }
        rc = frame_mix_apply(&s->cm->mix, f.frames, (int)n, (int)w, q->held + (size_t)q->n_held * H);
        if (rc == 0) q->n_held += (int)n;
    }
    if (rc < 0) {
        request_render_failed(s, q, "refused frames");
        return;
    }
    q->frames_in += n;
}

static void on_end(struct s1_server *s, struct s1_request *q, const struct shmconn_msg *m)
{
    int64_t total;
    q->untracked = 1; /* LAST ended the deadline tracking */
    if (pipe_decode_end(m, &total) < 0) {
        s1_request_fail(s, q, 1, "%s", mm3_last_error());
        return;
    }
    if (total != q->frames_in || total < 1) {
        s1_request_fail(s, q, 1, "END says %" PRId64 " frames, %" PRId64 " received (at least 1 needed)", total,
                        q->frames_in);
        return;
    }
    q->ended = 1;
    if (q->active && render_end(q->render) < 0) request_render_failed(s, q, "end of song failed");
}

/* Stage 0 let the prerolled stream's client start playing: its windows get deadlines from
 * then on. A stamp from the future (another clock) counts as now. */
static void on_play(struct s1_server *s, struct s1_request *q, const struct shmconn_msg *m)
{
    int64_t us;
    if (pipe_decode_play(m, &us) < 0) {
        s1_request_fail(s, q, 1, "%s", mm3_last_error());
        return;
    }
    if (us <= 0) {
        s1_request_fail(s, q, 1, "bad PLAY message: t_play_us %lld, expected > 0", (long long)us);
        return;
    }
    double now = s1_now(), t = (double)us * 1e-6;
    q->t_play = t < now ? t : now;
}

void s1_request_on_message(struct s1_server *s, const struct shmconn_msg *m)
{
    if (m->kind == PIPE_MSG_START) {
        on_start(s, m);
        return;
    }
    struct s1_request *q = s1_request_find(s, m->req_id);
    if (!q) {
        LOG_DEBUG("message kind %u for unknown request %" PRIu64 " ignored", m->kind, m->req_id);
        return;
    }
    switch (m->kind) {
    case PIPE_MSG_FRAMES:
        on_frames(s, q, m);
        break;
    case PIPE_MSG_END:
        on_end(s, q, m);
        break;
    case PIPE_MSG_CANCEL:
        q->untracked = 1; /* CANCELLED ended the tracking */
        s1_request_drop(s, q->id, "cancelled by stage 0");
        break;
    case PIPE_MSG_PLAY:
        on_play(s, q, m);
        break;
    default:
        s1_request_fail(s, q, 1, "unknown message kind %u", m->kind);
    }
}

void s1_request_on_event(struct s1_server *s, const struct shmconn_event *ev)
{
    struct s1_request *q = s1_request_find(s, ev->req_id);
    if (!q) return;
    q->untracked = 1; /* the connector already forgot it (and told stage 0 on a timeout) */
    if (ev->type == SHMCONN_EVENT_TIMEOUT)
        s1_request_fail(s, q, 1, "stage 0 sent no %s message within %.2f s (connector deadline)",
                        ev->first_chunk ? "first" : "further", ev->waited_s);
    else
        s1_request_fail(s, q, s->out && shmconn_peer_status(s->out) == 0, "stage 0 went away (%s)",
                        ev->status == SHMCONN_E_CLOSED ? "closed its channel" : "process died");
}
