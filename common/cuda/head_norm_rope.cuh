/* One attention head's RMSNorm (optional weight w) and NeoX half-split RoPE, done by
 * one warp in place on u[head_dim]: the step shared by cuda_ops_qk_norm_rope, the
 * talker's fused q/k/v store and the fused decode attention, so that all give the
 * same bits. (C++/CUDA only.) */
#ifndef MM3_CUDA_HEAD_NORM_ROPE_CUH
#define MM3_CUDA_HEAD_NORM_ROPE_CUH

/* The RoPE angle of pair i at position p, as cos and sin. */
__device__ __forceinline__ void rope_cos_sin(const float *__restrict__ inv_freq, int i, float p, float *c, float *s)
{
    sincosf(__fmul_rn(inv_freq[i], p), s, c);
}

__device__ __forceinline__ void warp_head_norm(float *u, int head_dim, const float *__restrict__ w, float eps, int lane)
{
    float ss = 0.0f;
    for (int i = lane; i < head_dim; i += 32)
        ss = fmaf(u[i], u[i], ss);
    for (int off = 16; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, off);
    float r = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int i = lane; i < head_dim; i += 32)
        u[i] = __fmul_rn(w[i], __fmul_rn(u[i], r));
    __syncwarp(); /* RoPE reads elements other lanes just wrote */
}

/* Pair i of the rotary dims with its cos c and sin s. */
__device__ __forceinline__ void rope_pair(float *u, int i, int half, float c, float s)
{
    float x1 = u[i], x2 = u[i + half];
    u[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    u[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

__device__ __forceinline__ void warp_head_norm_rope(float *u, int head_dim, const float *__restrict__ w, float eps,
                                                    int rotary_dim, float p, const float *__restrict__ inv_freq,
                                                    int lane)
{
    if (w) warp_head_norm(u, head_dim, w, eps, lane);
    const int half = rotary_dim / 2;
    for (int i = lane; i < half; i += 32) {
        float s, c;
        rope_cos_sin(inv_freq, i, p, &c, &s);
        rope_pair(u, i, half, c, s);
    }
}

/* The same with the cos/sin of every pair computed beforehand (rope_cos_sin): heads
 * at one position share them. */
__device__ __forceinline__ void warp_head_norm_rope_table(float *u, int head_dim, const float *__restrict__ w,
                                                          float eps, int rotary_dim, const float *cs, const float *sn,
                                                          int lane)
{
    if (w) warp_head_norm(u, head_dim, w, eps, lane);
    const int half = rotary_dim / 2;
    for (int i = lane; i < half; i += 32)
        rope_pair(u, i, half, cs[i], sn[i]);
}

#endif
