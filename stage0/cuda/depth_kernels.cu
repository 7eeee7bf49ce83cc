#include "stage0/cuda/depth_kernels.h"

#include <math.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/pdl.cuh"

enum { DEPTH_ATT_WARPS = 4, DEPTH_ATT_MAX_PER_LANE = 8 /* head_dim 256 */ };

/* One warp per (row, head): store this position's k and v, then an online softmax
 * over positions 0..pos, each lane holding head_dim / 32 dims (lane + 32 i). */
__global__ void __launch_bounds__(DEPTH_ATT_WARPS * 32)
    depth_attention_store_kernel(float *__restrict__ out, const float *__restrict__ qkv, float *k_cache, float *v_cache,
                                 int n, int pos, int n_heads, int D, size_t row_stride, float scale)
{
    pdl_launch_dependents();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * DEPTH_ATT_WARPS + (threadIdx.x >> 5);
    if (item >= n * n_heads) return;
    const int t = item / n_heads, h = item % n_heads;
    const size_t H = (size_t)n_heads * D;
    const float *q = qkv + (size_t)t * 3 * H + (size_t)h * D;
    float *kr = k_cache + (size_t)t * row_stride + (size_t)h * D,
          *vr = v_cache + (size_t)t * row_stride + (size_t)h * D;
    float qv[DEPTH_ATT_MAX_PER_LANE], acc[DEPTH_ATT_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < DEPTH_ATT_MAX_PER_LANE; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < D ? q[d] : 0.0f;
        acc[i] = 0.0f;
        if (d < D) {
            kr[(size_t)pos * H + d] = q[H + d];
            vr[(size_t)pos * H + d] = q[2 * H + d];
        }
    }
    __syncwarp(); /* this lane reads the dims other lanes stored */
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j <= pos; j++) {
        const float *kj = kr + (size_t)j * H, *vj = vr + (size_t)j * H;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < DEPTH_ATT_MAX_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < D) s = fmaf(qv[i], kj[d], s);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= scale;
        const float m_new = fmaxf(m, s), c = expf(m - m_new), p = expf(s - m_new);
        l = l * c + p;
#pragma unroll
        for (int i = 0; i < DEPTH_ATT_MAX_PER_LANE; i++) {
            const int d = lane + 32 * i;
            if (d < D) acc[i] = fmaf(p, vj[d], acc[i] * c);
        }
        m = m_new;
    }
    float *o = out + (size_t)t * H + (size_t)h * D;
#pragma unroll
    for (int i = 0; i < DEPTH_ATT_MAX_PER_LANE; i++) {
        const int d = lane + 32 * i;
        if (d < D) o[d] = acc[i] / l;
    }
}

extern "C" int depth_cuda_attention_store(float *out, const float *qkv, float *k_cache, float *v_cache, int n, int pos,
                                          int n_heads, int head_dim, size_t row_stride, float scale, void *stream)
{
    if (n < 1 || pos < 0 || n_heads < 1 || head_dim < 1 || head_dim > 32 * DEPTH_ATT_MAX_PER_LANE)
        return mm3_errorf(-EINVAL,
                          "depth_cuda_attention_store: %d rows at position %d, %d heads of %d: expected rows and "
                          "heads >= 1, position >= 0, head_dim 1..%d",
                          n, pos, n_heads, head_dim, 32 * DEPTH_ATT_MAX_PER_LANE);
    const long items = (long)n * n_heads;
    const unsigned blocks = (unsigned)((items + DEPTH_ATT_WARPS - 1) / DEPTH_ATT_WARPS);
    return launch_pdl("depth_attention_store_kernel", depth_attention_store_kernel, blocks, DEPTH_ATT_WARPS * 32, 0,
                      cuda_stream_of(stream), out, qkv, k_cache, v_cache, n, pos, n_heads, head_dim, row_stride, scale);
}
