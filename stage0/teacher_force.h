/* Teacher forcing: the frame hidden states of a song recomputed from its codes in
 * one pass, without sampling (docs/journal.md). Used to re-send a song's frames to
 * a restarted stage 1, to re-render a finished song (mm3-rerender), and to resume
 * generation after a stage-0 restart.
 *
 * codes[n_steps, n_codebooks] are the draws of LM steps 0..n_steps-1 (step 0 = the
 * draw at <|audio_start|>, fed back but not emitted), as journaled. Frame t is step
 * t + 1: slot 0 = the LM hidden after feeding the feedback embedding of step t at
 * position P + t, slots 1.. = the depth decoder's hiddens with c0..c{n-2} of step
 * t + 1 forced. The LM runs all feedback tokens as causal chunks of one row (the
 * conditional row: the frames do not depend on the unconditional one), the depth
 * decoder runs a chunk of frames as independent rows. Float32 sums in another order
 * than the step-by-step loop, so frames agree with generation to ~1e-6 relative. */
#ifndef MM3_STAGE0_TEACHER_FORCE_H
#define MM3_STAGE0_TEACHER_FORCE_H

#include <stdint.h>

#include "stage0/model/depth.h"
#include "stage0/generate.h"
#include "stage0/recovery/journal.h"
#include "stage0/model/talker.h"

#define TEACHER_FORCE_CHUNK 128 /* tokens per LM forward and frames per depth batch */

/* Receives frames [n, n_codebooks * hidden] for t0..t0+n-1, in order; nonzero aborts. */
struct teacher_force_sink {
    void *ctx;
    int (*emit)(void *ctx, int t0, const float *frames, int n);
};

/* Recompute the n_steps - 1 frames of codes[n_steps, n_codebooks] (frames 0..T-1,
 * T = n_steps - 1) and hand them to sink in chunks. ids_pair [2, prompt_len]: only
 * row 0 (conditional) is used. Returns 0, -EINVAL (bad code, prompt id or sizes,
 * message names the step and codebook), -ENOMEM, or the sink's nonzero value. */
int teacher_force_stream(const struct talker *lm, const struct depth *dd, const int32_t *ids_pair, int prompt_len,
                         const int32_t *codes, int n_steps, const struct teacher_force_sink *sink);

/* The same on row `row` of a backend (e.g. the scheduler's spare row, CUDA or CPU;
 * called on the thread that runs the backend's steps: its depth rows are scratch, used
 * in batches of at most be->depth_rows frames). The row's KV cache is overwritten.
 * Works with models loaded for the GPU. On the CPU backend the frames equal
 * teacher_force_stream's bit for bit. */
int teacher_force_stream_backend(const struct talker_backend *be, int row, const int32_t *ids_pair, int prompt_len,
                                 const int32_t *codes, int n_steps, const struct teacher_force_sink *sink);

/* The same into frames[(n_steps - 1), n_codebooks * hidden]. */
int teacher_force_frames(const struct talker *lm, const struct depth *dd, const int32_t *ids_pair, int prompt_len,
                         const int32_t *codes, int n_steps, float *frames);

/* The frames of a request journaled so far, from its live writer: flushes j, reads
 * its file back, checks it belongs to ids_pair (prompt hash) and this model
 * (n_codebooks), and streams frames 0..n_steps-2 to sink (*n_frames = how many),
 * computed on row `row` of be (teacher_force_stream_backend). This is the stage-1
 * restart path (docs/journal.md): the engine calls it on the step thread with the
 * scheduler's spare row (sched_spare_row), so no step runs between the read and the
 * next live frame.
 * -ENODATA when there is no usable journal (j NULL, or disabled by a write error). */
int teacher_force_journal(const struct talker_backend *be, int row, struct journal *j, const int32_t *ids_pair,
                          int prompt_len, const struct teacher_force_sink *sink, int *n_frames);

/* Resume generation after n_steps journaled steps, as generate_begin() would have it
 * after running them: both rows prefilled and fed steps 0..n_steps-1, the frames
 * 0..n_steps-2 re-emitted through hooks->on_frame (in order, with their codes), and
 * g ready for step n_steps (GENERATE_SAMPLE). With a seeded sampler the rest of the
 * song equals the uninterrupted one (draws are position-addressed). n_steps = 0 is
 * generate_begin(). If the journaled steps already filled max_frames, g->done is set
 * with GENERATE_STOP_BUDGET. Free g with generate_end(). */
int teacher_force_resume(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                         const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                         const struct generate_hooks *hooks, const int32_t *codes, int n_steps);

/* Fill the rows of a request attached but not yet fed (generate_attach or
 * generate_attach_backend, so on the CPU or on a backend's KV rows): both rows prefilled
 * with the prompt and fed steps 0..n_steps-1, frames 0..n_steps-2 to sink (NULL: none)
 * as they are computed, and g left at step n_steps in GENERATE_SAMPLE (done with
 * GENERATE_STOP_BUDGET when the steps already filled max_frames). Returns 0, < 0 (bad
 * codes or sizes, a model error), or the sink's nonzero value. A continued song
 * (stage0/scheduler.h) starts this way; on a backend, call it on the thread that runs
 * the backend's steps (its depth rows are scratch). */
int teacher_force_fill(struct generate *g, const int32_t *codes, int n_steps, const struct teacher_force_sink *sink);

/* The same on rows row_c / row_u of a shared talker_state (the scheduler's): like
 * generate_attach(), but the rows are filled right away (synchronously: one
 * prefill-sized pass over prompt_len + n_steps tokens per row) and g is left in
 * GENERATE_SAMPLE at step n_steps, ready for the batched loop's generate_sample().
 * Free with generate_end() (the shared state stays). */
int teacher_force_attach(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                         struct talker_state *ts, int row_c, int row_u, const int32_t *ids_pair, int prompt_len,
                         int max_frames, float cfg_scale, const struct generate_hooks *hooks, const int32_t *codes,
                         int n_steps);

#endif
