/* Kernels of the stage-0 GPU talker that common/cuda/ops_cuda.h lacks: attention
 * of tokens over the rows of a KV cache (prefill and mixed batches), the KV-cache
 * scatter, and a broadcast row add. C-callable; device pointers, `stream` is a
 * cudaStream_t as void * (NULL = default stream). Return 0 or a negative errno
 * code with a message (common/error.h). Float32 throughout. */
#ifndef MM3_STAGE0_CUDA_TALKER_KERNELS_H
#define MM3_STAGE0_CUDA_TALKER_KERNELS_H

#include <stddef.h>

#include "common/cuda/ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim of talker_cuda_attention_rows (8 values per lane of a warp). */
#define TALKER_CUDA_MAX_HEAD_DIM 256

/* Token i (i < n_tok) attends over positions 0..pos[i] of cache row row[i]:
 *   q[n_tok, n_heads*head_dim] -> out[n_tok, n_heads*head_dim]
 *   k/v element (r, j, g, d) at r*row_stride + j*pos_stride + g*head_dim + d
 * (query head h reads kv head h / (n_heads / n_kv_heads)); row, pos device ints.
 * Same result as op_attention (causal, q_pos0 = pos[i]) up to summation order:
 * one block per (head, token), warps take positions round-robin with an online
 * softmax and merge at the end. Correct for any head_dim <= 256, not tuned. */
int talker_cuda_attention_rows(float *out, const float *q, const float *k_cache, const float *v_cache, const int *row,
                               const int *pos, int n_tok, int n_heads, int n_kv_heads, int head_dim, size_t row_stride,
                               size_t pos_stride, float scale, void *stream);

/* cache[row[i]*row_stride + pos[i]*pos_stride + c] = src[i*width + c], c < width. */
int talker_cuda_kv_store(float *cache, const float *src, const int *row, const int *pos, int n, int width,
                         size_t row_stride, size_t pos_stride, void *stream);

/* y[r*width + c] += x[c] for r < n_rows. */
int talker_cuda_add_row(float *y, const float *x, int n_rows, int width, void *stream);

/* cudaMemcpyAsync host -> device on `stream` (ordered with that stream's kernels). */
int talker_cuda_h2d_async(void *dst, const void *src, size_t bytes, void *stream);

#ifdef __cplusplus
}
#endif

#endif
