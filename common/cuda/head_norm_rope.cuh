/* One attention head's RMSNorm (optional weight w) and NeoX half-split RoPE, done by
 * one warp in place on u[head_dim]: the step shared by cuda_ops_qk_norm_rope and the
 * talker's fused q/k/v store, so that both give the same bits. (C++/CUDA only.) */
#ifndef MM3_CUDA_HEAD_NORM_ROPE_CUH
#define MM3_CUDA_HEAD_NORM_ROPE_CUH

__device__ __forceinline__ void warp_head_norm_rope(float *u, int head_dim, const float *__restrict__ w, float eps,
                                                    int rotary_dim, float p, const float *__restrict__ inv_freq,
                                                    int lane)
{
    if (w) {
        float ss = 0.0f;
        for (int i = lane; i < head_dim; i += 32) ss = fmaf(u[i], u[i], ss);
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        float r = 1.0f / sqrtf(ss / (float)head_dim + eps);
        for (int i = lane; i < head_dim; i += 32) u[i] = __fmul_rn(w[i], __fmul_rn(u[i], r));
        __syncwarp(); /* RoPE reads elements other lanes just wrote */
    }
    const int half = rotary_dim / 2;
    for (int i = lane; i < half; i += 32) {
        float ang = __fmul_rn(inv_freq[i], p);
        float s, c;
        sincosf(ang, &s, &c);
        float x1 = u[i], x2 = u[i + half];
        u[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
        u[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    }
}

#endif
