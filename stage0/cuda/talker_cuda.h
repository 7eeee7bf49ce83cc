/* The stage-0 talker on the GPU (first version: correct, not yet fast).
 *
 * Built from a loaded CPU struct talker: the matrices go to the GPU as bf16 (the
 * CPU copy is the checkpoint's bf16 widened, so these are exactly the checkpoint's
 * values), norm weights and the bf16-rounded RoPE inv_freq as float32. The KV cache
 * lives on the GPU in float32, [n_layers][max_rows][max_ctx][n_kv_heads*head_dim]
 * (accuracy first; a bf16 cache halves it and is the next step).
 *
 * talker_cuda_forward has talker_forward's contract (host arrays in and out): the
 * tokens of a batch may belong to different rows; all of a batch's K/V are stored
 * before attention, so prefill tokens see their predecessors in the same batch.
 * Matrix products run in slices of at most 16 rows through the float32-input GEMV
 * kernels (rel. 1e-6 against the CPU), never through the bf16-input cuBLASLt path,
 * so prefill matches the CPU too. Attention: common/cuda's split-K decode kernel
 * when the batch is one token per consecutive row (the CFG pair step) and the
 * head fits it, else the simple row attention of talker_kernels.h.
 *
 * Only compiled with CUDA (stage0/cuda/ joins mm3_stage0 when MM3_HAVE_CUDA). */
#ifndef MM3_STAGE0_CUDA_TALKER_CUDA_H
#define MM3_STAGE0_CUDA_TALKER_CUDA_H

#include "stage0/talker.h"

struct talker_cuda;

/* Upload m's weights and allocate a cache of max_rows x max_ctx. m may be freed
 * afterwards. -ENODEV without a usable GPU. */
int talker_cuda_create(struct talker_cuda **out, const struct talker *m, int max_rows, int max_ctx);
void talker_cuda_destroy(struct talker_cuda *tc); /* NULL is fine */

/* As talker_forward (host emb[n, hidden] in, host hidden_out[n, hidden] out). */
int talker_cuda_forward(struct talker_cuda *tc, int n, const int *row, const int *pos, const float *emb,
                        float *hidden_out);

/* As talker_head_drawable: host hidden[n_rows, hidden] -> host logits[n_rows, SAMPLER_C0_COLS]. */
int talker_cuda_head_drawable(struct talker_cuda *tc, const float *hidden, int n_rows, float *logits);

#endif
