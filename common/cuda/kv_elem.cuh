/* KV cache elements as stored: float32, or bf16 bit patterns (uint16_t). The
 * narrowing rounds to nearest even and keeps NaN a NaN: bit for bit mm3_f32_to_bf16
 * (common/dtype.h), so GPU caches hold what the CPU's would. (C++/CUDA only.) */
#ifndef MM3_CUDA_KV_ELEM_CUH
#define MM3_CUDA_KV_ELEM_CUH

#include <stdint.h>

__device__ __forceinline__ float kv_widen(float f)
{
    return f;
}

__device__ __forceinline__ float kv_widen(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

template <typename KT> __device__ __forceinline__ KT kv_narrow(float f);

template <> __device__ __forceinline__ float kv_narrow<float>(float f)
{
    return f;
}

template <> __device__ __forceinline__ uint16_t kv_narrow<uint16_t>(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
