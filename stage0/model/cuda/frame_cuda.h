/* One batched sampling step for n CFG pairs on the GPU (docs/model.md §4.3-§4.5):
 * the drawable head on 2n rows in one product, the guided c0 draw, the depth
 * decoder's steps for all pairs at once with each codebook's guided draw, and the
 * frame feedback embedding, with one upload and one download per step. Draws go
 * through common/cuda/sampler_cuda.h (seeded Gumbel-max, the same columns as
 * common/sampler.c); products use the float32-accurate GEMV kernels, so codes,
 * depth hiddens and feedback match the CPU AR loop (stage0/generate.c).
 *
 *     frame_cuda_create(&fc, &lm, &dd, max_pairs);   // embedding tables as bf16
 *     frame_cuda_graphs_enable(fc, 1);                // optional: replay CUDA graphs
 *     frame_cuda_sample_pairs(fc, tc, dc, &in, &out);
 *     frame_cuda_decode_pairs(fc, tc, dc, &din, &out);  // with graphs: the forward first
 *
 * The embedding tables (the c0 rows of embed_tokens, the depth decoder's
 * audio_embeddings) go to the GPU as bf16, which holds the checkpoint's values
 * exactly; when a loaded table is not exactly bf16 (a float32 checkpoint), or the
 * model is one the AR loop cannot run (hidden sizes differ, no embeddings), create
 * returns 0 with *out NULL and the caller keeps the per-request host path.
 * Only compiled with CUDA. */
#ifndef MM3_STAGE0_CUDA_FRAME_CUDA_H
#define MM3_STAGE0_CUDA_FRAME_CUDA_H

#include "stage0/model/cuda/depth_cuda.h"
#include "stage0/model/cuda/talker_cuda.h"
#include "stage0/model/talker_pairs.h"

struct frame_cuda;

int frame_cuda_create(struct frame_cuda **out, const struct talker *lm, const struct depth *dd, int max_pairs);
void frame_cuda_destroy(struct frame_cuda *fc); /* NULL is fine */

/* CUDA graphs for the step (the scheduler's switch, talker_backend_graphs_enable):
 * from now on a call uploads its inputs from a pinned block with one asynchronous
 * copy on the step's own stream, runs the step, downloads the outputs the same way
 * and syncs that stream once. The step of each (n pairs, top_k) runs eagerly on
 * that stream `warmups` times, is then captured once and replayed: every per-call
 * value (hidden pair, seeds, steps, cfg scales, stop masks) lives in the fixed
 * device input block, so one graph serves every call. Results are bit for bit the
 * eager step's. Without this call every step is eager on the default stream. */
int frame_cuda_graphs_enable(struct frame_cuda *fc, int warmups);

/* Graphs captured so far and steps served by a replay (0 and 0 for NULL). */
void frame_cuda_graph_stats(const struct frame_cuda *fc, int *captured, long *replays);
/* GPU milliseconds of the last finished replay (events around its launch; a replay
 * still running, a step queued ahead, is not waited for): only with MM3_GRAPH_TIMING=1
 * when graphs were enabled and the last step queued was a replay, else 0. */
float frame_cuda_replay_ms(struct frame_cuda *fc);

/* The contract of talker_backend.sample_pairs; dc needs 2 * in->n depth rows. */
int frame_cuda_sample_pairs(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc,
                            const struct talker_pairs_in *in, const struct talker_pairs_out *out);

/* The contract of talker_backend.decode_pairs: the forward of the pairs' tokens as a
 * queued graph replay (talker_cuda_forward_queued) and this step after it on the GPU,
 * the hidden pairs handed over by a device copy. Returns 1, doing nothing, where that
 * does not apply (graphs off, no graph for 2n rows).
 *
 * With in->last (and frame_cuda_set_look_ahead not turned off) the call looks ahead: once this step's
 * codes and feedback are down it queues the step that follows if nothing else
 * changes (the pairs that go on, one token further, the feedback as their input),
 * then waits for this step's frames and copies them out while the GPU runs it. The
 * next call that asks for exactly that step (every input compared) only waits for
 * it; any other call, and every other use of fc (sample_pairs, destroy) or of the
 * talker and depth states it shares (the backend's other entries call
 * frame_cuda_ahead_drop first), waits for it and drops it. Dropped work leaves nothing
 * behind: the KV entries it wrote are those the same step writes again, or past the
 * length of the row's next owner. */
int frame_cuda_decode_pairs(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc,
                            const struct talker_decode_in *in, const struct talker_pairs_out *out);

/* Waits for a step queued ahead by frame_cuda_decode_pairs, if any, and drops it
 * (NULL is fine). */
int frame_cuda_ahead_drop(struct frame_cuda *fc);
/* Steps queued ahead so far, and those a call then asked for (0 and 0 for NULL). */
void frame_cuda_ahead_stats(const struct frame_cuda *fc, long *queued, long *taken);

/* Test hook: 0 = frame_cuda_decode_pairs never looks ahead (to compare its results with
 * the look-ahead's), else it does (the default). Process-wide; not for use while a
 * step is being queued on another thread. */
void frame_cuda_set_look_ahead(int on);

#endif
