/* Shared by the .cu files of stage1/cuda (C++ only). */
#ifndef MM3_STAGE1_CUDA_INTERNAL_H
#define MM3_STAGE1_CUDA_INTERNAL_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "common/error.h"
}

static inline int dit_cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError(); /* clear the non-sticky error so the next check is clean */
    int code = e == cudaErrorMemoryAllocation ? -ENOMEM : -ENODEV;
    return mm3_errorf(code, "CUDA %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static inline int dit_cuda_launched(const char *kernel)
{
    return dit_cuda_status(cudaGetLastError(), kernel);
}

/* Grid size for a grid-stride loop over n elements. */
static inline unsigned dit_cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return b > 65535u * 8u ? 65535u * 8u : (unsigned)b;
}

/* Store one operand element as float32 or bf16. */
static __device__ __forceinline__ void dit_store_operand(void *p, size_t i, float v, bool bf16)
{
    if (bf16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else
        ((float *)p)[i] = v;
}

/* Element d of a head after NeoX half-split RoPE; u is the head's row, t its
 * cos/sin row (NULL or half == 0: no rotation). */
__device__ __forceinline__ float rope_at(const float *u, int d, int half, const float *t)
{
    if (d < half) return u[d] * t[d] - u[d + half] * t[half + d];
    if (d < 2 * half) return u[d] * t[d - half] + u[d - half] * t[d];
    return u[d];
}

/* Elements d0..d0+3 (d0 % 4 == 0) of a head after RoPE, with 16-byte loads; needs
 * half % 4 == 0 (so a group of four never straddles the rotated halves) and 16-byte
 * aligned rows of u and t. */
__device__ __forceinline__ float4 rope_at4(const float *u, int d0, int half, const float *t)
{
    float4 x = *(const float4 *)(u + d0);
    if (d0 < half) {
        float4 p = *(const float4 *)(u + d0 + half), c = *(const float4 *)(t + d0),
               s = *(const float4 *)(t + half + d0);
        return make_float4(x.x * c.x - p.x * s.x, x.y * c.y - p.y * s.y, x.z * c.z - p.z * s.z, x.w * c.w - p.w * s.w);
    }
    if (d0 < 2 * half) {
        float4 p = *(const float4 *)(u + d0 - half), c = *(const float4 *)(t + d0 - half),
               s = *(const float4 *)(t + d0);
        return make_float4(x.x * c.x + p.x * s.x, x.y * c.y + p.y * s.y, x.z * c.z + p.z * s.z, x.w * c.w + p.w * s.w);
    }
    return x;
}

/* dit_attention_mma.cu: the bf16 mma.sync attention (head_dim 32, 64, 128; half = rotary_dim/2). */
int dit_attention_mma_bf16(void *out, bool out_bf16, const float *qkv, int n_seq, int T, int H, int head_dim, int half,
                           const float *cs, float scale, cudaStream_t s);

#endif
