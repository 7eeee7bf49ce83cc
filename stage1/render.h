/* The per-request window loop of stage 1, as an incremental object.
 *
 * Frames arrive in any amounts (render_push_frames); window k covers frames
 * [100k, min(100k + 200, N)) and runs as soon as its 200 frames exist, or at
 * render_finish (then it is the last, possibly short, window). Each window:
 * condition encoder (its first 172 latents' conditioning spliced from the previous
 * window), fresh noise, the Euler + CFG loop pinned to the previous window's latents
 * [L-344, L-172) over the first 172 latents, vocoder, crop 86 latents left (not
 * window 0) and 258 right (not the last window), clamp to [-1, 1].
 *
 * PCM is handed to the sink as soon as it is final: window 0 of a longer song gives
 * 431 latents (220,672 samples per channel at hop 512), each middle window 345
 * (176,640), the last window the rest. A full window that may be the last one
 * emits [left, L-258) at once and its tail [L-258, L) when the end is known
 * (next frame arrives: dropped; render_finish: emitted). The concatenation of all
 * chunks equals the reference pipeline's `audio` sample for sample.
 *
 *     struct render_params p = {.n_steps = 30, .guidance = 1.7f, .noise = {RENDER_NOISE_SEEDED, seed},
 *                               .decoder = {voc, hop, decode_fn}, .sink = {ctx, emit_fn}};
 *     render_create(&r, cond_model, dit_model, &p);
 *     while (frames arrive) render_push_frames(r, frames, n, width);
 *     render_finish(r);  render_free(r);
 */
#ifndef MM3_STAGE1_RENDER_H
#define MM3_STAGE1_RENDER_H

#include <stdint.h>

#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/flow_batch.h"

/* Pipeline constants of the reference (not checkpoint geometry). */
#define RENDER_WINDOW_FRAMES 200
#define RENDER_HOP_FRAMES 100
#define RENDER_OVERLAP_LATENTS 172 /* carried span and pinned prefix */
#define RENDER_CROP_LEFT 86        /* latents dropped left, every window but the first */
#define RENDER_CROP_RIGHT 258      /* latents dropped right, every window but the last */

enum render_noise_mode {
    RENDER_NOISE_SEEDED = 0, /* window k: common/noise.h stream noise_seed_window(seed, k) */
    RENDER_NOISE_REPLAY,     /* window k: replay[k], replay_len[k] floats = in_ch * L_k */
};

struct render_noise {
    enum render_noise_mode mode;
    uint64_t seed;
    int n_replay;
    const float *const *replay;
    const int64_t *replay_len;
};

/* latents[in_ch, L] -> pcm[2, hop * L] (channel-major), not clamped. */
struct render_decoder {
    void *ctx;
    int hop;
    int (*decode)(void *ctx, const float *latents, int L, float *pcm);
};

/* Receives pcm[2, n] (channel-major, clamped) chunks in order; nonzero return aborts. */
struct render_sink {
    void *ctx;
    int (*emit)(void *ctx, const float *pcm, int n);
};

/* What one finished window produced; pointers valid during the callback only. */
struct render_window_info {
    int index, frame_start, n_frames, L, overlap;
    const float *condition; /* [L, cond_dim] before the overlap splice */
    const float *noise;     /* [in_ch, L] initial noise */
    const float *latents;   /* [in_ch, L] final, overlap restored */
    const float *waveform;  /* [2, hop * L] vocoder output, not clamped */
};

struct render_observer {
    void *ctx;
    int (*window_done)(void *ctx, const struct render_window_info *w);
};

/* The Euler + CFG loop of one window with flow_window_run's contract (stage1/flow.h:
 * struct flow_job), on some backend, e.g. flow_cuda_window_run_cb
 * (stage1/cuda/flow_cuda.h) with a flow_cuda. */
struct render_flow {
    void *ctx;
    int (*run)(void *ctx, const struct flow_job *j);
};

/* The condition projection of a window with condition_project's contract (stage1/condition.h:
 * mixed[F, hidden] -> cond[L, out_dim]) on some backend, e.g. condition_cuda_project_cb
 * (stage1/cuda/condition_cuda.h): on the CPU it is ~5 s per release window. */
struct render_condition {
    void *ctx;
    int (*project)(void *ctx, const float *mixed, int F, float *cond);
};

struct render_params {
    int n_steps;    /* Euler steps per window (FLOW_DEFAULT_STEPS) */
    float guidance; /* CFG scale (FLOW_DEFAULT_GUIDANCE) */
    float shift;    /* scheduler shift in (0, FLOW_MAX_SHIFT]; 0 = FLOW_DEFAULT_SHIFT */
    struct render_noise noise;
    struct render_decoder decoder;
    struct render_sink sink;
    struct render_observer observer; /* optional (window_done NULL) */
    struct render_flow flow;         /* optional: run NULL = flow_window_run on the CPU DiT */
    struct render_condition condition; /* optional: project NULL = condition_project on the CPU */
};

struct render;

/* The models are borrowed and must outlive the render. With p->flow.run set the DiT
 * model only gives the geometry (no CPU workspace is made). */
int render_create(struct render **out, const struct condition_model *cm, const struct dit_model *dm,
                  const struct render_params *p);
void render_free(struct render *r);

/* Append n frames of `width` floats (n_layers * hidden raw, or hidden already mixed) and
 * run every window that became ready. Bad width, non-finite values or a failing window
 * return < 0 and leave the render failed (every later call fails, nothing more is emitted). */
int render_push_frames(struct render *r, const float *frames, int n, int width);

/* End of the song: run the remaining window(s) and emit the rest. Zero frames: -EINVAL. */
int render_finish(struct render *r);

/* The same loop in pieces, for a scheduler that interleaves requests (stage1/server.h):
 * push frames without running windows, mark the end, and run one ready window at a time.
 * render_push_frames = deferred push + run every ready window; render_finish = end + run
 * every remaining window. Any order of these calls gives the same PCM chunks' concatenation
 * (a window run later knows more, so it holds back less tail; the samples are the same). */
int render_push_frames_deferred(struct render *r, const float *frames, int n, int width);
/* End of the song (no more frames); emits a held tail if the last window already ran.
 * Zero frames: -EINVAL. */
int render_end(struct render *r);
/* 1 when render_run_one_window (or render_window_prepare) has a window to run now, else 0
 * (also after a failure, while a window is out in a flow batch, and while two windows
 * wait for their vocoder). */
int render_window_ready(const struct render *r);
/* Run the next ready window: 1 when one ran, 0 when none is ready, < 0 on error (the
 * render is then failed). */
int render_run_one_window(struct render *r);
/* 1 once the end is marked and every window has run and been emitted. */
int render_complete(const struct render *r);
/* Windows finished (vocoded and emitted). */
int render_windows_done(const struct render *r);

/* A window in three steps, for a scheduler that runs the windows of several songs in one
 * flow batch (stage1/flow_batch.h) and vocodes one batch while the next one's DiT runs:
 *   render_window_prepare: condition, splice and noise of the next ready window; fills
 *     *job (pointers into the render, valid until collect). 1 prepared, 0 none ready,
 *     < 0 failed (the render is then failed).
 *   render_window_collect: after the flow ran the job (flow_rc: its result): the carried
 *     latents for the next window. The next window may be prepared right after.
 *   render_window_finish: vocoder, observer, crop and emission of the oldest collected
 *     window. 1 finished one, 0 none waiting, < 0 failed.
 * At most one window is out in a flow and at most two are unfinished; the PCM is the same
 * as render_run_one_window's (bit for bit: the same ops on the same values). */
int render_window_prepare(struct render *r, struct flow_job *job);
int render_window_collect(struct render *r, int flow_rc);
int render_window_finish(struct render *r);
/* Windows collected and not finished yet (0..2). */
int render_window_unfinished(const struct render *r);

/* The whole cycle over n renders with one flow batch: one window of every render that has
 * one ready goes into ONE batch (at most fb->max_windows, in array order), then each is
 * collected and finished, render by render. A render that fails is left failed (its
 * entry in rc[] < 0, else the number of windows it ran, 0 or 1); the others go on.
 * NULL entries are skipped. Returns the number of windows run, or < 0 when the batch as
 * a whole failed. (stage1/render_batch.c) */
int render_batch_step(struct render *const *r, int n, const struct flow_batch *fb, int *rc);
int render_frames_pushed(const struct render *r);

/* Sample frames per channel handed to the sink so far. */
int64_t render_samples_emitted(const struct render *r);

/* Number of windows of a song of n_frames frames (1 if n_frames <= 200). */
int render_window_count(int n_frames);

#endif
