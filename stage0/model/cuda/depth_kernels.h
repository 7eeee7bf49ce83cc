/* Kernels of the GPU depth decoder that the talker has no use for. Only compiled
 * with CUDA. */
#ifndef MM3_STAGE0_CUDA_DEPTH_KERNELS_H
#define MM3_STAGE0_CUDA_DEPTH_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The depth decoder's attention at position pos for rows 0..n-1, with the K/V store:
 * qkv row t holds [q | k | v] (each n_heads x head_dim wide); k and v of row t go to
 * the float32 caches at t * row_stride + pos * hidden (+ head * head_dim), then
 * out[t, head] = softmax(q . K[0..pos] * scale) . V[0..pos]. One launch instead of
 * talker_cuda_kv_store_pair + the split-K pair: a frame's depth context is at most
 * n_codebooks positions, too short for splitting. head_dim up to 256. */
int depth_cuda_attention_store(float *out, const float *qkv, float *k_cache, float *v_cache, int n, int pos,
                               int n_heads, int head_dim, size_t row_stride, float scale, void *stream);

#ifdef __cplusplus
}
#endif

#endif
