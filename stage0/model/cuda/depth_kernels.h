/* Kernels of the GPU depth decoder that the talker has no use for. Only compiled
 * with CUDA. */
#ifndef MM3_STAGE0_CUDA_DEPTH_KERNELS_H
#define MM3_STAGE0_CUDA_DEPTH_KERNELS_H

#include <stddef.h>

#include "common/attention_heads.h"
#include "common/cuda/ops_cuda.h" /* struct cuda_kv_cache */

#ifdef __cplusplus
extern "C" {
#endif

/* The depth decoder's attention at position pos for rows 0..n-1, with the K/V store:
 * qkv row t holds [q | k | v] (each n_heads x head_dim = hidden wide); k and v of row t
 * go to cache row t of kv at position pos (kv: float32, row_stride = hidden, any
 * seq_stride), then out[t, head] = softmax(q . K[0..pos] * scale) . V[0..pos]. One launch
 * instead of talker_cuda_kv_store_pair + the split-K pair: a frame's depth context is at
 * most n_codebooks positions, too short for splitting. No GQA (n_kv_heads = n_heads),
 * head_dim up to 256. */
int depth_cuda_attention_store(float *out, const float *qkv, int n, int pos, const struct cuda_kv_cache *kv,
                               const struct attention_heads *heads, void *stream);

#ifdef __cplusplus
}
#endif

#endif
