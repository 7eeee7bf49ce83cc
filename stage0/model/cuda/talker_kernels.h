/* Kernels of the stage-0 GPU talker that common/cuda/ops_cuda.h lacks: attention
 * of tokens over the rows of a KV cache (prefill and mixed batches), the KV-cache
 * scatter, and a broadcast row add. C-callable; device pointers, `stream` is a
 * cudaStream_t as void * (NULL = default stream). Return 0 or a negative errno
 * code with a message (common/error.h). Activations float32; the KV cache float32
 * or bf16 (enum cuda_kv_dtype: the _kv variants; bf16 elements are rounded to
 * nearest even on store, as mm3_f32_to_bf16, and widened exactly on read). */
#ifndef MM3_STAGE0_CUDA_TALKER_KERNELS_H
#define MM3_STAGE0_CUDA_TALKER_KERNELS_H

#include <stddef.h>

#include "common/cuda/ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim of talker_cuda_attention_rows_kv (8 values per lane of a warp). */
#define TALKER_CUDA_MAX_HEAD_DIM 256

/* Where n tokens sit in a KV cache: token i at cache row row[i], position pos[i]
 * (device ints). */
struct talker_kv_slots {
    const int *row, *pos;
    int n;
};

/* Token i (i < slots->n) attends over positions 0..pos[i] of cache row row[i]:
 *   query row i at q + i*q_stride (q_stride >= n_heads*head_dim: q may sit inside a
 *   fused QKV row) -> out[n, n_heads*head_dim]
 *   kv: the cache (struct cuda_kv_cache, ops_cuda.h).
 * Same result as op_attention (causal, q_pos0 = pos[i]) up to summation order:
 * one block per (head, token), warps take positions round-robin with an online
 * softmax and merge at the end. The kernel for the heads the split-K decode attention
 * does not take: correct for any head_dim <= 256, not tuned. */
int talker_cuda_attention_rows_kv(float *out, const float *q, size_t q_stride, const struct cuda_kv_cache *kv,
                                  const struct talker_kv_slots *slots, const struct attention_heads *heads,
                                  void *stream);

/* K and V of the slots' n tokens into their caches in one launch:
 *   kv->k[row[i]*kv->seq_stride + pos[i]*kv->row_stride + c] = k[i*src_stride + c], c < width
 * and the same for v (k, v may be columns of one fused QKV row: src_stride >= width). */
int talker_cuda_kv_store_pair(const struct cuda_kv_cache *kv, const float *k, const float *v, size_t src_stride,
                              const struct talker_kv_slots *slots, int width, void *stream);

/* The step between the QKV product and attention, in one launch, on fused rows
 * qkv[n][q width | kv width | kv width] (q width = n_heads*head_dim, kv width =
 * n_kv_heads*head_dim; heads->scale unused): per-head RMSNorm (prep->q_norm on q heads,
 * prep->k_norm on k heads; NULL skips it) then NeoX RoPE over the first
 * prep->rotary_dim dims at position prep->pos[i], in place on q and k, and K and V
 * stored into the cache at (row[i], pos[i]) (layout of talker_cuda_kv_store_pair). Bit
 * for bit cuda_ops_qk_norm_rope on q, the same on k, then talker_cuda_kv_store_pair:
 * one warp per head, the same arithmetic (the prefill's path; a decode step does all
 * of it inside cuda_ops_attention_decode_qkv). */
int talker_cuda_qkv_norm_rope_store(float *qkv, int n, const struct attention_heads *heads,
                                    const struct cuda_qkv_prep *prep, const struct cuda_kv_cache *kv, const int *row,
                                    void *stream);

/* y[r*width + c] += x[c] for r < n_rows. */
int talker_cuda_add_row(float *y, const float *x, int n_rows, int width, void *stream);

/* cudaMemcpyAsync host -> device on `stream` (ordered with that stream's kernels). */
int talker_cuda_h2d_async(void *dst, const void *src, size_t bytes, void *stream);

#ifdef __cplusplus
}
#endif

#endif
