/* The stage-0 AR loop for one request (one CFG pair), as a resumable step object
 * (model-stage0.md §3.8), and the window plan of the hand-off to stage 1 (§4.3).
 *
 *     struct generate g;
 *     generate_begin(&g, &lm, &dd, &sampler, ids_pair, P, max_frames, 1.5f, &hooks);
 *     while (!g.done) if ((rc = generate_step(&g)) < 0) break;
 *     generate_end(&g);
 *
 * Each generate_step() is one LM step s: draw c0 (or stop) from the guided logits
 * of the current hidden pair, run the depth decoder for c1.., emit the frame
 * [LM hidden | depth hiddens] of the conditional row when s > 0 (the draw at
 * <|audio_start|> is fed back but not emitted), feed the frame embedding to both
 * rows. Frames go out through hooks.on_frame as they are produced. */
#ifndef MM3_STAGE0_GENERATE_H
#define MM3_STAGE0_GENERATE_H

#include <stdint.h>

#include "common/sampler.h"
#include "stage0/depth.h"
#include "stage0/talker.h"

#define GENERATE_MAX_FRAMES 9000 /* reference cap (6 min at 25 frames/s) */
#define GENERATE_MAX_PROMPT 5000
#define WINDOW_FRAMES 200
#define WINDOW_HOP 100

enum generate_stop { GENERATE_RUNNING = 0, GENERATE_STOP_TOKEN, GENERATE_STOP_BUDGET };

struct generate_hooks {
    void *ctx;
    /* Frame t (0-based): frame[n_codebooks * hidden], codes[n_codebooks] = c0..c{n-1}. */
    void (*on_frame)(void *ctx, int t, const float *frame, const int32_t *codes);
    /* Optional: the guided logits of every draw before the sampler (step s; j = 0:
     * c0 in compact columns, n = SAMPLER_C0_COLS; j >= 1: codebook j, n = audio vocab). */
    void (*on_draw)(void *ctx, int s, int j, const float *guided, int n);
};

struct generate {
    const struct talker *lm;
    const struct depth *dd;
    struct sampler *sp;
    struct generate_hooks hooks;
    struct talker_state ts;
    struct depth_state ds;
    float cfg_scale;
    int prompt_len, max_frames;
    int step;     /* next LM step */
    int n_frames; /* frames emitted so far */
    int done;
    enum generate_stop stop;
    float *hidden;  /* [2, hidden]: post-norm LM hidden of (cond, uncond) */
    float *frame;   /* [n_codebooks * hidden] */
    float *work;    /* scratch: logits, depth hiddens, embeddings */
    int32_t *codes; /* c0..c{n-1} drawn by the last step (also step 0's, which is not emitted) */
};

/* Frame budget min(int(duration_s * frame_rate), 9000); -EINVAL when duration_s <= 0
 * or shorter than one frame. */
int generate_frame_budget(double duration_s, double frame_rate, int *max_frames);

/* AR frame rate of the checkpoint: condition_encoder input_sampling_rate / input_hop_length. */
int generate_frame_rate(const char *ckpt_root, double *fps);

/* Prefill both rows of ids_pair[2, P] (row 0 conditional) and get ready for step 0. */
int generate_begin(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                   const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                   const struct generate_hooks *hooks);

/* One LM step; emits 0 or 1 frame; sets g->done and g->stop when generation ends. */
int generate_step(struct generate *g);

void generate_end(struct generate *g);

/* Window plan for T frames: [0] if T <= 200 else range(0, T-100, 100). */
int window_count(int n_frames);
/* starts must hold window_count(n_frames) entries; *k = count. */
void window_starts(int n_frames, int *starts, int *k);
/* Windows whose frames all exist: with n_frames so far and the song not ended,
 * window k (start 100k) is complete once frame 100k+199 exists; once ended, all. */
int windows_ready(int n_frames, int ended);
/* Whether window k is the song's last (stage 1 crops the last one differently):
 * 1 yes, 0 no, -1 not known yet. With the song running it is known "no" once frame
 * 100k+200 exists (SGLang-Omni's one frame of look-ahead). */
int window_is_last(int k, int n_frames, int ended);

#endif
