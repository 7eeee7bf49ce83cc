/* silu(g) * u exactly as op_silu then the product round in common/ops_cpu.c: the
 * elementwise kernel and the GEMV epilogues that fuse it (matmul_bf16.cu, gemv_mma.cu)
 * share this one definition so the fused and unfused paths agree bit for bit. */
#ifndef MM3_SILU_CUH
#define MM3_SILU_CUH

__device__ __forceinline__ float silu_mul1(float g, float u)
{
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

#endif
