/* What the two decode attention kernels share (C++/CUDA only): the fused variant's
 * arguments and prologue, the block's merge of its warps into one partial result,
 * the launch arguments. attention_decode.cu holds the CUDA-core kernel, the combine
 * pass and the planning; attention_decode_mma.cu the tensor-core kernel. */
#ifndef MM3_CUDA_ATTENTION_DECODE_CUH
#define MM3_CUDA_ATTENTION_DECODE_CUH

#include <math.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/head_norm_rope.cuh"
#include "common/cuda/kv_elem.cuh"

enum { ATT_WARPS = 4, ATT_MAX_GROUP = 8, ATT_MAX_HEAD_DIM = 256, ATT_CHUNK_ALIGN = 64, ATT_BLOCKS_PER_SM = 4 };

/* What the fused variant adds to the kernel's arguments (unused otherwise). */
struct att_fuse {
    const float *q_norm, *k_norm, *inv_freq; /* norm weights [HD] (NULL: none), RoPE [rotary_dim / 2] */
    float eps;
    int rotary_dim;
    const int *pos; /* [sequence]: where the new k/v go */
    void *kw, *vw;  /* the caches again, for the store */
};

/* What the prologue below reads that no earlier kernel writes: the RoPE cos/sin of
 * position p, and the q / k norm weights copied into shared memory (nq, nk), so that
 * the decode attention can have them before its PDL wait, and the norms after it do
 * not wait for a load. No sync: att_prepare's first __syncthreads orders them. */
template <int HD>
__device__ __forceinline__ void att_prologue_tables(float *cs, float *sn, float *nq, float *nk, const att_fuse &f,
                                                    float p)
{
    for (int i = threadIdx.x; i < f.rotary_dim / 2; i += ATT_WARPS * 32)
        rope_cos_sin(f.inv_freq, i, p, &cs[i], &sn[i]);
    for (int i = threadIdx.x; i < HD; i += ATT_WARPS * 32) {
        if (f.q_norm) nq[i] = f.q_norm[i];
        if (f.k_norm) nk[i] = f.k_norm[i];
    }
}

/* The fused variant's prologue: q heads of this kv head normed and rotated into sq
 * (one warp per head, the same steps as cuda_ops_qk_norm_rope, with the RoPE cos/sin
 * computed once for all heads); with `store`, the k head too and the k/v of the new
 * position written to the cache at cache_off, kept in sk/sv as the cache holds them
 * (rounded to KT). The caller has filled cs/sn and nq/nk (att_prologue_tables). The
 * row's q, k and v are all loaded before any is stored: one round trip after the PDL
 * wait, where a loop per array (and the remainder loops of their unrolling) took one
 * each. */
template <typename KT, int HD, int G>
__device__ void att_prepare(float (&sq)[G][HD], float *sk, float *sv, const float *cs, const float *sn, const float *nq,
                            const float *nk, const float *qrow, int g, int group, bool store, const att_fuse &f,
                            size_t cache_off)
{
    constexpr int T = ATT_WARPS * 32, QE = (G * HD + T - 1) / T, KE = (HD + T - 1) / T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* The row: gridDim.y * group q heads, then gridDim.y k heads, then as many v heads. */
    const float *qh = qrow + (size_t)g * group * HD, *krow = qrow + (size_t)gridDim.y * group * HD + (size_t)g * HD,
                *vrow = krow + (size_t)gridDim.y * HD;
    float qv[QE], kv[KE], vv[KE];
#pragma unroll
    for (int e = 0; e < QE; e++) {
        const int i = (int)threadIdx.x + e * T;
        qv[e] = i < group * HD ? qh[i] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < KE; e++) {
        const int i = (int)threadIdx.x + e * T;
        kv[e] = store && i < HD ? krow[i] : 0.0f;
        vv[e] = store && i < HD ? vrow[i] : 0.0f;
    }
#pragma unroll
    for (int e = 0; e < QE; e++) {
        const int i = (int)threadIdx.x + e * T;
        if (i < group * HD) sq[i / HD][i % HD] = qv[e];
    }
#pragma unroll
    for (int e = 0; e < KE; e++) {
        const int i = (int)threadIdx.x + e * T;
        if (store && i < HD) sk[i] = kv[e], sv[i] = vv[e];
    }
    __syncthreads();
    for (int item = warp; item < group + (store ? 1 : 0); item += ATT_WARPS) {
        float *u = item < group ? sq[item] : sk;
        const float *w = item < group ? (f.q_norm ? nq : NULL) : (f.k_norm ? nk : NULL);
        warp_head_norm_rope_table(u, HD, w, f.eps, f.rotary_dim, cs, sn, lane);
    }
    __syncthreads();
    if (store)
        for (int i = threadIdx.x; i < HD; i += ATT_WARPS * 32) {
            const KT kq = kv_narrow<KT>(sk[i]), vq = kv_narrow<KT>(sv[i]);
            ((KT *)f.kw)[cache_off + i] = kq;
            ((KT *)f.vw)[cache_off + i] = vq;
            sk[i] = kv_widen(kq);
            sv[i] = kv_widen(vq);
        }
    __syncthreads();
}

/* The block's warps hold (acc, m, l) of the same heads over different positions:
 * merge them (log-sum-exp) into the partial result of this chunk, (acc[HD], m, l)
 * per query head g*group + gi at part[((s * n_heads + head) * n_split + split)]. */
template <int HD, int G>
__device__ void att_write_partial(float *__restrict__ part, const float (&sm_acc)[ATT_WARPS][G][HD],
                                  const float (&sm_m)[ATT_WARPS][G], const float (&sm_l)[ATT_WARPS][G], int group,
                                  int n_heads, int n_split)
{
    const int split = blockIdx.x, g = blockIdx.y, s = blockIdx.z;
    for (int idx = threadIdx.x; idx < group * HD; idx += ATT_WARPS * 32) {
        const int gi = idx / HD, d = idx % HD;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++)
            mx = fmaxf(mx, sm_m[w][gi]);
        float a = 0.0f, ls = 0.0f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) {
                const float f = expf(sm_m[w][gi] - mx);
                a = fmaf(f, sm_acc[w][gi][d], a);
                ls = fmaf(f, sm_l[w][gi], ls);
            }
        }
        float *out = part + (((size_t)s * n_heads + g * group + gi) * n_split + split) * (HD + 2);
        out[d] = a;
        if (d == 0) {
            out[HD] = mx;
            out[HD + 1] = ls;
        }
    }
}

struct att_args {
    float *part;
    const float *q;
    size_t q_stride; /* floats from one sequence's query row to the next */
    const void *k, *v;
    const int *kv_len, *seq_row;
    size_t seq_stride, row_stride;
    int n_heads, group;
    float scale;
    int n_split, chunk;
    bool prep; /* the fused variant (q/k/v as the QKV product left them) */
    att_fuse fuse;
};

/* The tensor-core kernel (attention_decode_mma.cu): bf16 caches, head_dim 64 or 128,
 * up to 8 query heads per kv head. */
bool att_mma_fits(bool bf16_cache, int head_dim, int group);
/* Its blocks resident per SM (the plan sizes the grid to them). */
int att_mma_blocks_per_sm(int head_dim, bool prep);
int att_mma_launch(const att_args &a, int head_dim, dim3 grid, cudaStream_t st);

#endif
