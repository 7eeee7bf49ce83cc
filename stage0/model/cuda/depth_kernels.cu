#include "stage0/model/cuda/depth_kernels.h"

#include <math.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/pdl.cuh"

enum { DEPTH_ATT_WARPS = 4, DEPTH_ATT_MAX_PER_LANE = 8 /* head_dim 256 */, DEPTH_ATT_CHUNK = 8 };

/* A lane's element i of a head row is dim lane + 32 i, or with VEC (head_dim a multiple
 * of 128) dim 128 (i / 4) + 4 lane + i % 4, so that each lane reads 16-byte words.
 * depth_att_load: row[dim(i)] for the lane's E elements (0 where dim >= D; VEC: D % 128
 * == 0, row 16-byte aligned); depth_att_store the other way. */
template <bool VEC, int E>
__device__ __forceinline__ void depth_att_load(float (&v)[E], const float *row, int D, int lane)
{
    if (VEC) {
#pragma unroll
        for (int w = 0; w < E / 4; w++) {
            const int d = 128 * w + 4 * lane;
            const float4 x = d < D ? *(const float4 *)(row + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v[4 * w] = x.x, v[4 * w + 1] = x.y, v[4 * w + 2] = x.z, v[4 * w + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < E; i++) {
            const int d = lane + 32 * i;
            v[i] = d < D ? row[d] : 0.0f;
        }
    }
}

template <bool VEC, int E>
__device__ __forceinline__ void depth_att_store(float *row, const float (&v)[E], int D, int lane)
{
    if (VEC) {
#pragma unroll
        for (int w = 0; w < E / 4; w++) {
            const int d = 128 * w + 4 * lane;
            if (d < D) *(float4 *)(row + d) = make_float4(v[4 * w], v[4 * w + 1], v[4 * w + 2], v[4 * w + 3]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < E; i++) {
            const int d = lane + 32 * i;
            if (d < D) row[d] = v[i];
        }
    }
}

/* One warp per (row, head): store this position's k and v, then the softmax over
 * positions 0..pos, each lane holding head_dim / 32 dims (depth_att_load). Positions go
 * in chunks of DEPTH_ATT_CHUNK (one chunk for the depth decoder's 8 positions) whose K
 * and V rows are all loaded before any is used: one round trip to memory per chunk
 * where a position at a time took one per position (its time grew with every
 * position). Chunks merge as an online softmax. With
 * VEC the loads are 16-byte words, a quarter of the load instructions. */
template <bool VEC>
__global__ void __launch_bounds__(DEPTH_ATT_WARPS * 32)
    depth_attention_store_kernel(float *__restrict__ out, const float *__restrict__ qkv, float *k_cache, float *v_cache,
                                 int n, int pos, int n_heads, int D, size_t row_stride, float scale)
{
    pdl_launch_dependents();
    pdl_wait();
    constexpr int E = DEPTH_ATT_MAX_PER_LANE, C = DEPTH_ATT_CHUNK;
    const int lane = threadIdx.x & 31;
    const int item = blockIdx.x * DEPTH_ATT_WARPS + (threadIdx.x >> 5);
    if (item >= n * n_heads) return;
    const int t = item / n_heads, h = item % n_heads;
    const size_t H = (size_t)n_heads * D;
    const float *q = qkv + (size_t)t * 3 * H + (size_t)h * D;
    float *kr = k_cache + (size_t)t * row_stride + (size_t)h * D,
          *vr = v_cache + (size_t)t * row_stride + (size_t)h * D;
    /* The new position's k and v are used from registers; no lane reads another's. */
    float qv[E], kn[E], vn[E], acc[E];
    depth_att_load<VEC>(qv, q, D, lane);
    depth_att_load<VEC>(kn, q + H, D, lane);
    depth_att_load<VEC>(vn, q + 2 * H, D, lane);
#pragma unroll
    for (int i = 0; i < E; i++)
        acc[i] = 0.0f;
    depth_att_store<VEC>(kr + (size_t)pos * H, kn, D, lane);
    depth_att_store<VEC>(vr + (size_t)pos * H, vn, D, lane);
    float m = -INFINITY, l = 0.0f;
    for (int j0 = 0; j0 <= pos; j0 += C) {
        float kc[C][E], vc[C][E];
#pragma unroll
        for (int p = 0; p < C; p++) {
            const int j = j0 + p;
            if (j < pos) { /* else the new position (or a masked one) */
                depth_att_load<VEC>(kc[p], kr + (size_t)j * H, D, lane);
                depth_att_load<VEC>(vc[p], vr + (size_t)j * H, D, lane);
            } else {
#pragma unroll
                for (int i = 0; i < E; i++) {
                    kc[p][i] = kn[i];
                    vc[p][i] = vn[i];
                }
            }
        }
        float sc[C], mx = m;
#pragma unroll
        for (int p = 0; p < C; p++) {
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < E; i++)
                s = fmaf(qv[i], kc[p][i], s);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                s += __shfl_xor_sync(0xffffffffu, s, off);
            sc[p] = j0 + p <= pos ? s * scale : -INFINITY;
            mx = fmaxf(mx, sc[p]);
        }
        const float c = expf(m - mx); /* mx is finite: position j0 <= pos is valid */
        l *= c;
#pragma unroll
        for (int i = 0; i < E; i++)
            acc[i] *= c;
#pragma unroll
        for (int p = 0; p < C; p++) {
            if (j0 + p > pos) break; /* past pos: no 0 * v (an infinite v would make it NaN) */
            const float e = expf(sc[p] - mx);
            l += e;
#pragma unroll
            for (int i = 0; i < E; i++)
                acc[i] = fmaf(e, vc[p][i], acc[i]);
        }
        m = mx;
    }
#pragma unroll
    for (int i = 0; i < E; i++)
        acc[i] /= l;
    depth_att_store<VEC>(out + (size_t)t * H + (size_t)h * D, acc, D, lane);
}

extern "C" int depth_cuda_attention_store(float *out, const float *qkv, int n, int pos, const struct cuda_kv_cache *kv,
                                          const struct attention_heads *heads, void *stream)
{
    const int n_heads = heads->n_heads, head_dim = heads->head_dim;
    float *k_cache = (float *)kv->k, *v_cache = (float *)kv->v;
    const size_t row_stride = kv->seq_stride;
    if (heads->n_kv_heads != n_heads || kv->dtype != CUDA_KV_F32 || kv->row_stride != (size_t)n_heads * head_dim)
        return mm3_errorf(-EINVAL,
                          "depth_cuda_attention_store: %d kv heads for %d heads of %d, cache dtype %d, position "
                          "stride %zu: expected n_kv_heads = n_heads, a float32 cache and a stride of n_heads x "
                          "head_dim",
                          heads->n_kv_heads, n_heads, head_dim, (int)kv->dtype, kv->row_stride);
    if (n < 1 || pos < 0 || n_heads < 1 || head_dim < 1 || head_dim > 32 * DEPTH_ATT_MAX_PER_LANE)
        return mm3_errorf(-EINVAL,
                          "depth_cuda_attention_store: %d rows at position %d, %d heads of %d: expected rows and "
                          "heads >= 1, position >= 0, head_dim 1..%d",
                          n, pos, n_heads, head_dim, 32 * DEPTH_ATT_MAX_PER_LANE);
    const long items = (long)n * n_heads;
    const unsigned blocks = (unsigned)((items + DEPTH_ATT_WARPS - 1) / DEPTH_ATT_WARPS);
    /* 16-byte words where every row a lane reads starts 16-byte aligned */
    const bool vec = head_dim % 128 == 0 && row_stride % 4 == 0 &&
                     (((uintptr_t)out | (uintptr_t)qkv | (uintptr_t)k_cache | (uintptr_t)v_cache) & 15) == 0;
    return launch_pdl("depth_attention_store_kernel",
                      vec ? depth_attention_store_kernel<true> : depth_attention_store_kernel<false>, blocks,
                      DEPTH_ATT_WARPS * 32, 0, cuda_stream_of(stream), out, qkv, k_cache, v_cache, n, pos, n_heads,
                      head_dim, row_stride, heads->scale);
}
