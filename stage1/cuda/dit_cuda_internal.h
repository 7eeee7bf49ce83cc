/* Shared by the .cu files of stage1/cuda (C++ only). */
#ifndef MM3_STAGE1_CUDA_INTERNAL_H
#define MM3_STAGE1_CUDA_INTERNAL_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "common/error.h"
}
#include "stage1/cuda/dit_kernels.h" /* enum dit_operand */

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

/* Store operand element i in type fmt (enum dit_operand). */
static __device__ __forceinline__ void dit_store_operand(void *p, size_t i, float v, int fmt)
{
    if (fmt == DIT_OPERAND_BF16)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else if (fmt == DIT_OPERAND_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else if (fmt == DIT_OPERAND_F16_SCALED)
        ((__half *)p)[i] = __float2half_rn(v * (1.0f / DIT_F16_RESCUE_SCALE));
    else
        ((float *)p)[i] = v;
}

/* Store elements i and i + 1 (i even: one 8-byte or 4-byte store). */
static __device__ __forceinline__ void dit_store_operand2(void *p, size_t i, float v0, float v1, int fmt)
{
    if (fmt == DIT_OPERAND_BF16) {
        *(__nv_bfloat162 *)((__nv_bfloat16 *)p + i) = __floats2bfloat162_rn(v0, v1);
    } else if (fmt == DIT_OPERAND_F16 || fmt == DIT_OPERAND_F16_SCALED) {
        float k = fmt == DIT_OPERAND_F16 ? 1.0f : 1.0f / DIT_F16_RESCUE_SCALE;
        *(__half2 *)((__half *)p + i) = __floats2half2_rn(v0 * k, v1 * k);
    } else {
        *(float2 *)((float *)p + i) = make_float2(v0, v1);
    }
}

/* Store elements 4 i4 .. 4 i4 + 3 (16-byte float32 or 8-byte 2-byte-type stores). */
static __device__ __forceinline__ void dit_store_operand4(void *p, size_t i4, float4 v, int fmt)
{
    if (fmt == DIT_OPERAND_BF16) {
        __nv_bfloat162 *d = (__nv_bfloat162 *)p + 2 * i4;
        d[0] = __floats2bfloat162_rn(v.x, v.y);
        d[1] = __floats2bfloat162_rn(v.z, v.w);
    } else if (fmt == DIT_OPERAND_F16 || fmt == DIT_OPERAND_F16_SCALED) {
        float k = fmt == DIT_OPERAND_F16 ? 1.0f : 1.0f / DIT_F16_RESCUE_SCALE;
        __half2 *d = (__half2 *)p + 2 * i4;
        d[0] = __floats2half2_rn(v.x * k, v.y * k);
        d[1] = __floats2half2_rn(v.z * k, v.w * k);
    } else {
        ((float4 *)p)[i4] = v;
    }
}

/* Bytes of one element of operand type fmt. */
static inline size_t dit_operand_size(int fmt)
{
    return fmt == DIT_OPERAND_F32 ? 4 : 2;
}

/* Sum and max of one value per thread over the block (blockDim.x a multiple of 32; red holds
 * blockDim.x / 32 floats and may be reused by the next call). */
__device__ __forceinline__ float dit_block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* red is reused between calls */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++)
        s += red[w];
    return s;
}

__device__ __forceinline__ float dit_block_max(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* red is reused between calls */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < (int)blockDim.x / 32; w++)
        m = fmaxf(m, red[w]);
    return m;
}

/* LayerNorm statistics of row xr[dim] by the whole block, two passes (mean, then squared
 * deviations) as op_layernorm, so rows with a large mean keep their float32 accuracy:
 * *mean and *rstd = 1 / sqrt(var + eps). */
__device__ __forceinline__ void dit_layernorm_stats(const float *xr, int dim, float eps, float *red, float *mean,
                                                    float *rstd)
{
    float s = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        s += xr[i];
    float m = dit_block_sum(s, red) / (float)dim;
    float q = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float d = xr[i] - m;
        q += d * d;
    }
    float var = dit_block_sum(q, red) / (float)dim;
    *mean = m;
    *rstd = 1.0f / sqrtf(var + eps);
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

/* Operands of the flash attention's products (dit_attention_flash.cu). */
enum { FLASH_TF32 = 0, FLASH_BF16 = 1, FLASH_F16 = 2 };

/* dit_attention_mma.cu: the bf16 mma.sync attention a (head_dim 32, 64, 128; half =
 * rotary_dim/2, 0 without a table). */
int dit_attention_mma_bf16(const struct dit_attention *a, int half, cudaStream_t s);

#endif
