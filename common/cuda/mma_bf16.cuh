/* The tensor-core pieces shared by the weight-streaming GEMV and the decode
 * attention (C++/CUDA only): one mma.sync m16n8k16 with bf16 inputs and float32
 * accumulation, and the split of floats into bf16 hi parts and bf16 rests that
 * keeps float32 accuracy through bf16 multiplies (x - hi - lo is below 2^-16 |x|). */
#ifndef MM3_CUDA_MMA_BF16_CUH
#define MM3_CUDA_MMA_BF16_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* c += A B: A 16x16 (a0..a3, row-major fragments), B 16x8 (b0, b1, column-major). */
__device__ __forceinline__ void mma_bf16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Two floats -> packed bf16 hi parts and bf16 lo parts (a in the low half). */
__device__ __forceinline__ void split_pair(float a, float b, uint32_t *hi, uint32_t *lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 hf = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    *hi = *(uint32_t *)&h;
    *lo = *(uint32_t *)&l;
}

/* Two floats rounded to nearest even as packed bf16 (a in the low half, as split_pair). */
__device__ __forceinline__ uint32_t round_pair(float a, float b)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
}

#endif
