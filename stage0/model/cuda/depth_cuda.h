/* The RVQ depth decoder on the GPU, built from a loaded CPU struct depth: matrices as
 * bf16 (exactly the checkpoint's values; Wq|Wk|Wv and Wg|Wu packed into one matrix
 * each at upload, one product each), norms and the position table as float32, a
 * float32 KV cache [n_layers][max_rows][n_codebooks][hidden].
 * Same contract as depth_step / depth_logits with host arrays in and out; the
 * *_dev variants queue the same work on device arrays for the batched frame step.
 * Only compiled with CUDA. */
#ifndef MM3_STAGE0_CUDA_DEPTH_CUDA_H
#define MM3_STAGE0_CUDA_DEPTH_CUDA_H

#include "common/cuda/ops_cuda.h"
#include "stage0/model/depth.h"

/* Most rows of one position in the two-position pass (depth_cuda_step01_dev): the
 * pass's 2n product rows must fit one GEMV slice, 32 rows on the tensor-core GEMV
 * (depth_cuda_step01_fits checks the widths). A plain constant: the memory plan of a
 * CPU-only build reads it too (stage0/model/talker_backend.c). */
#define DEPTH_CUDA_PAIR_MAX_ROWS (CUDA_OPS_GEMV_MMA_MAX_ROWS / 2)

struct depth_cuda;

int depth_cuda_create(struct depth_cuda **out, const struct depth *d, int max_rows);
void depth_cuda_destroy(struct depth_cuda *dc); /* NULL is fine */

/* As depth_step: rows 0..n-1 at depth position pos; x, out host [n, hidden]. */
int depth_cuda_step(struct depth_cuda *dc, int n, const float *x, int pos, float *out);

/* As depth_logits: host hidden[n, hidden] -> host logits[n, audio_vocab], codebook j >= 1. */
int depth_cuda_logits(struct depth_cuda *dc, int j, const float *hidden, int n, float *logits);

/* The same two on device arrays, queued on `stream` (a cudaStream_t as void *, NULL =
 * the default stream) without a sync or a host-dependent value that changes between
 * calls, so the batched frame step (stage0/model/cuda/frame_cuda.h) can capture them in a
 * CUDA graph; x and out (n rows) are the caller's buffers, never the decoder's
 * internal activations. */
int depth_cuda_step_dev(struct depth_cuda *dc, int n, const float *x, int pos, float *out, void *stream);
int depth_cuda_logits_dev(struct depth_cuda *dc, int j, const float *hidden, int n, float *logits, void *stream);

/* Positions 0 and 1 in one pass, as the reference's first depth call ([P(LM hidden),
 * P(c0 embedding)]): the weights are read once for both. x0: the position-0 inputs,
 * x1: the position-1 inputs (n rows each, device); out gets position 1's output, as
 * depth_cuda_step_dev at position 0 then 1 would leave it. Only where
 * depth_cuda_step01_fits(n): 2n product rows must fit one GEMV slice (more would read
 * the weights twice anyway). */
int depth_cuda_step01_fits(const struct depth_cuda *dc, int n);
int depth_cuda_step01_dev(struct depth_cuda *dc, int n, const float *x0, const float *x1, float *out, void *stream);
/* The decoder's own input rows of the two-position pass (position 0 at rows 0..n-1,
 * position 1 at n..2n-1; NULL where it does not fit): a caller that writes x0 and x1
 * there saves depth_cuda_step01_dev its two copies. */
float *depth_cuda_step01_inputs(struct depth_cuda *dc, int n);

/* Inputs of positions 2 .. n_codebooks-1 precomputed: they are the projection of an
 * audio embedding row plus a position row, a function of (codebook, code) only, so a
 * pass need not read the projection matrix (hidden^2 bf16, one of a pass's 1 + 7 x
 * n_layers products). depth_cuda_input_table: float32 [(n_codebooks-2) x audio_vocab]
 * [hidden], row (j-1) audio_vocab + c = the input of position j+1 after code c of
 * codebook j; NULL where it was not built (fewer than 3 codebooks, no audio embeddings
 * on the host, or DEPTH_CUDA_TABLES_NONE). A caller copies the n rows of a pass into
 * depth_cuda_projected_inputs (the decoder's residual rows; the last pass's raw rows
 * live there too, depth_cuda_raw_rows) and runs depth_cuda_step_projected_dev, which
 * is depth_cuda_step_dev without the projection and the position add.
 * depth_cuda_qkv_table: float32 [same rows][3 hidden], layer 0's fused Q|K|V of each
 * input row (the product of its RMS-normed row, float32 accuracy), NULL where not
 * built (no input table, hidden not a multiple of 4, or DEPTH_CUDA_TABLES_INPUT). Where
 * it exists the caller also copies the n rows' Q|K|V into depth_cuda_projected_qkv, and
 * the pass skips layer 0's first product as well. */
const float *depth_cuda_input_table(const struct depth_cuda *dc);
float *depth_cuda_projected_inputs(struct depth_cuda *dc);
const float *depth_cuda_qkv_table(const struct depth_cuda *dc);
float *depth_cuda_projected_qkv(struct depth_cuda *dc);
int depth_cuda_step_projected_dev(struct depth_cuda *dc, int n, int pos, float *out, void *stream);
/* Bytes of bf16 matrices a frame's passes 2.. skip with the tables depth_cuda_create
 * would build for d now (0: none); what mm3-bench-stage0 reports beside its floor. */
size_t depth_cuda_table_spared_bytes(const struct depth *d);
/* Test hook: which of those tables depth_cuda_create builds from now on (to compare a
 * pass from the tables with the products they replace): both by default. Process-wide;
 * not for use while another thread creates a depth state. -EINVAL for another mode. */
enum { DEPTH_CUDA_TABLES_NONE = 0, DEPTH_CUDA_TABLES_BOTH = 1, DEPTH_CUDA_TABLES_INPUT = 2 };
int depth_cuda_set_input_tables(int mode);

/* The final norm left to the head and the caller: where depth_cuda_raw_fits(n, n_pos)
 * (the layers and the head's product fuse at n rows; n_pos 2 for step01), out may be
 * NULL in depth_cuda_step_dev / depth_cuda_step01_dev; the last position's un-normed
 * rows are then at depth_cuda_raw_rows until the next step, depth_cuda_logits_raw_dev
 * norms them inside the head's product, and depth_cuda_norm_weight is the norm's weight
 * for anyone else who needs the normed rows (one launch fewer per codebook). */
int depth_cuda_raw_fits(const struct depth_cuda *dc, int n, int n_pos);
const float *depth_cuda_raw_rows(const struct depth_cuda *dc, int n, int n_pos);
const float *depth_cuda_norm_weight(const struct depth_cuda *dc, float *eps);
int depth_cuda_logits_raw_dev(struct depth_cuda *dc, int j, const float *raw, int n, float *logits, void *stream);

#endif
