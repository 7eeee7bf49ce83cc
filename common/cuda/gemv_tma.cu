/* The tensor-core GEMV for 3-16 rows with its weights and x streamed by the copy
 * engine (measuring: MM3_GEMV_TMA, cuda_ops_gemv_set_tma; off by default).
 *
 * Why: at 8 CFG pairs (16 rows) the 4096-output products run on gemv_mma.cu as about
 * one block per SM, each warp with three k steps in flight through cp.async and x read
 * from L2 with plain loads: 4096 x 4096 in 13.7 us, 58% of the copy rate. One block
 * per SM reads at 98% of the copy rate with a deep ring of tensor-map boxes
 * (mm3-bench-ops --read-patterns, docs/performance.md), so here one producer thread
 * keeps a ring of STAGES stages full, each [16 MT weight rows][256 k] plus the x slice
 * [16 rows][256 k] it multiplies, and the 8 consumer warps wait for nothing but the
 * ring. Each block takes one tile of 16 MT outputs over the whole of `in` (one wave,
 * no k split, no pipeline restart).
 *
 * x: every block needs all of x, as many bytes per stage as the weights at 16 rows.
 * Blocks of a cluster of C (MM3_GEMV_TMA_C, default 1) take neighbouring tiles and
 * share each x slice: block r copies its part into the same place of every block
 * (multicast), so L2 serves x once per cluster. A stage may be refilled only when
 * every block of the cluster has read it: each consumer warp arrives on the "empty"
 * barrier of every block. Measured on the H200 (4096 x 4096, 16 rows): 21.4 us with
 * clusters of 2 or 4 against 12.4 without; the cluster-scope barriers cost more than
 * the L2 reads of x they save.
 *
 * Ring: 3 stages at 32 outputs per block, 2 at 48, to fit the 100 KiB shared split the
 * kernels around these products run with (an SM changes its L1/shared split only
 * when empty); MM3_GEMV_TMA_BIG=1 takes ~200 KiB (6 and 5 stages).
 *
 * Layout: weight boxes [16 MT rows][64 k] and x boxes [16 rows][32 k], 128-byte rows
 * with the copy engine's 128-byte swizzle (16-byte chunk c of row r lands at chunk
 * c ^ (r % 8)), so that the ldmatrix reads of the weights and the 8-byte reads of x
 * hit distinct banks. Rows past `out` or n_rows arrive as zeros.
 *
 * Arithmetic as gemv_mma.cu: x (normed when NORM) split into bf16 hi + lo, two MMAs
 * per tile, float32 sums; the warps' partial sums are added in warp order
 * (deterministic). */
#include <cooperative_groups.h>
#include <cuda.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/gemv_epi.cuh"
#include "common/cuda/mma_bf16.cuh"
#include "common/cuda/pdl.cuh"
#include "common/cuda/silu.cuh"
#include "common/cuda/tma.cuh"

namespace cg = cooperative_groups;

enum {
    TMA_WARPS = 8,                          /* consumer warps */
    TMA_THREADS = (TMA_WARPS + 1) * 32,     /* and one producer warp */
    TMA_ROWS = 16,                          /* x rows a block multiplies (two 8-row MMA tiles) */
    TMA_STAGE_K = 32 * TMA_WARPS,           /* k per stage: 32 per consumer warp */
    TMA_WBOX_K = 64,                        /* a weight box row: 128 bytes of bf16 */
    TMA_XBOX_K = 32,                        /* an x box row: 128 bytes of float32 */
    TMA_WBOXES = TMA_STAGE_K / TMA_WBOX_K,  /* 4 */
    TMA_XBOXES = TMA_STAGE_K / TMA_XBOX_K,  /* 8 */
    TMA_XBOX_BYTES = TMA_ROWS * 128,        /* 2 KiB */
    TMA_X_BYTES = TMA_XBOXES * TMA_XBOX_BYTES,
    /* Ring sizes (with 1 KiB to align it and the barriers): RB 0 fits the 100 KiB shared
     * split the decode attention and the x-staged GEMV run with, so that no SM changes its
     * L1/shared split between them; RB 1 takes nearly all 227 KiB (MM3_GEMV_TMA_BIG). */
    TMA_RING_SMALL = 97 * 1024,
    TMA_RING_BIG = 224 * 1024,
    TMA_MAX_STAGES = 8,
    TMA_MAX_CLUSTER = 8,                    /* must divide TMA_XBOXES */
};

template <int MT> __host__ __device__ constexpr int tma_w_bytes()
{
    return MT * 16 * TMA_STAGE_K * 2;
}
template <int MT> __host__ __device__ constexpr int tma_stage_bytes()
{
    return tma_w_bytes<MT>() + TMA_X_BYTES;
}
template <int MT, int RB> __host__ __device__ constexpr int tma_stages()
{
    return ((RB ? TMA_RING_BIG : TMA_RING_SMALL) - 1024) / tma_stage_bytes<MT>() < TMA_MAX_STAGES
               ? ((RB ? TMA_RING_BIG : TMA_RING_SMALL) - 1024) / tma_stage_bytes<MT>()
               : TMA_MAX_STAGES;
}
/* The ring plus 1 KiB to align it: the 128-byte swizzle repeats every 1024 bytes. */
template <int MT, int RB> __host__ __device__ constexpr int tma_smem_bytes()
{
    return tma_stages<MT, RB>() * tma_stage_bytes<MT>() + 1024;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(smem_u32(p)));
}

/* The consumer warps only (the producer may still be issuing). */
__device__ __forceinline__ void tma_consumers_sync(void)
{
    asm volatile("bar.sync 1, %0;" ::"n"(TMA_WARPS * 32) : "memory");
}

/* One producer thread: the weight boxes of stage u (its own tile) and this block's
 * share of the stage's x boxes (into every block of the cluster). */
template <int MT, int RB> struct tma_producer {
    const CUtensorMap *wmap, *xmap;
    unsigned char *ring;
    uint64_t *full;
    int row0;
    unsigned rank, csize;
    int boxes3d; /* the maps are 3-D: one copy per stage for the weights, one per block for x */

    __device__ void weights(int u) const
    {
        constexpr int STAGES = tma_stages<MT, RB>();
        const int slot = u % STAGES;
        unsigned char *st = ring + (size_t)slot * tma_stage_bytes<MT>();
        mbar_expect_tx(&full[slot], tma_stage_bytes<MT>()); /* every byte of the stage, x from all blocks */
        if (boxes3d) {
            tma_load_3d(st, wmap, 0, row0, u * TMA_WBOXES, &full[slot], 0);
            return;
        }
#pragma unroll
        for (int b = 0; b < TMA_WBOXES; b++)
            tma_load_2d(st + b * (MT * 16 * 128), wmap, u * TMA_STAGE_K + b * TMA_WBOX_K, row0, &full[slot]);
    }

    __device__ void x(int u) const
    {
        constexpr int STAGES = tma_stages<MT, RB>();
        const int slot = u % STAGES;
        unsigned char *xs = ring + (size_t)slot * tma_stage_bytes<MT>() + tma_w_bytes<MT>();
        if (boxes3d) {
            const int per = TMA_XBOXES / (int)csize;
            tma_load_3d(xs + rank * per * TMA_XBOX_BYTES, xmap, 0, 0, u * TMA_XBOXES + (int)rank * per, &full[slot],
                        csize > 1 ? (uint16_t)((1u << csize) - 1) : (uint16_t)0);
            return;
        }
        for (int b = (int)rank; b < TMA_XBOXES; b += (int)csize) {
            if (csize == 1)
                tma_load_2d(xs + b * TMA_XBOX_BYTES, xmap, u * TMA_STAGE_K + b * TMA_XBOX_K, 0, &full[slot]);
            else
                tma_load_2d_multicast(xs + b * TMA_XBOX_BYTES, xmap, u * TMA_STAGE_K + b * TMA_XBOX_K, 0, &full[slot],
                                      (uint16_t)((1u << csize) - 1));
        }
    }
};

/* A consumer warp's share of one stage: k 32 warp .. 32 warp + 31, two k16 MMA steps. */
template <int MT, bool NORM>
__device__ __forceinline__ void tma_stage_mma(float (&acc)[MT][2][4], float (&ss)[2], const unsigned char *wst,
                                              const unsigned char *xst, const float *__restrict__ wn, int kst,
                                              int warp, int lane)
{
    const int g = lane >> 2, t = lane & 3, q = lane >> 3, r8 = lane & 7;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int k0 = 32 * warp + 16 * j; /* within the stage */
        /* ldmatrix: lanes 8q..8q+7 address matrix q = (rows +8 if q odd, k +8 if q >= 2) */
        const unsigned char *wbox = wst + (k0 / TMA_WBOX_K) * (MT * 16 * 128);
        const int chunk = (k0 % TMA_WBOX_K) / 8 + (q >> 1);
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int row = mt * 16 + (q & 1) * 8 + r8;
            ldmatrix_x4(a[mt], wbox + row * 128 + ((chunk ^ r8) << 4));
        }
        /* B fragments: x row nt 8 + g at k 2t, 2t + 1 and 2t + 8, 2t + 9 of the k16 step */
        const unsigned char *xbox = xst + (k0 / TMA_XBOX_K) * TMA_XBOX_BYTES;
        uint32_t bh[2][2], bl[2][2];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int n = nt * 8 + g;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int kk = k0 % TMA_XBOX_K + 8 * h + 2 * t;
                float2 v = *(const float2 *)(xbox + n * 128 + (((kk >> 2) ^ g) << 4) + (kk & 3) * 4);
                if (NORM) {
                    const float2 nw = __ldg((const float2 *)(wn + kst + k0 + 8 * h + 2 * t));
                    ss[nt] = fmaf(v.x, v.x, fmaf(v.y, v.y, ss[nt]));
                    v.x *= nw.x;
                    v.y *= nw.y;
                }
                split_pair(v.x, v.y, &bh[nt][h], &bl[nt][h]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                mma_bf16(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], bh[nt][0], bh[nt][1]);
                mma_bf16(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], bl[nt][0], bl[nt][1]);
            }
    }
}

/* Grid (tiles / C, C), clusters of (1, C, 1): block (x, r) takes tile C x + r. */
template <int MT, int RB, int EPI, bool NORM>
__global__ void __launch_bounds__(TMA_THREADS, 1)
    gemv_tma_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                    float *__restrict__ y, const float *__restrict__ wn, int n_rows, int in, int out, float eps,
                    int pre, int boxes3d)
{
    constexpr int STAGES = tma_stages<MT, RB>(), OUT = 16 * MT;
    static_assert(TMA_WARPS * OUT * TMA_ROWS * 4 <= STAGES * tma_stage_bytes<MT>(), "partial sums fit the ring");
    pdl_launch_dependents();
    extern __shared__ unsigned char tma_dyn[];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ float part_ss[TMA_WARPS][TMA_ROWS];
    unsigned char *ring = (unsigned char *)(((uintptr_t)tma_dyn + 1023) & ~(uintptr_t)1023);
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned csize = gridDim.y, rank = blockIdx.y;
    const int tile = blockIdx.x * (int)csize + (int)rank;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nst = in / TMA_STAGE_K;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], TMA_WARPS * csize);
        }
        mbar_init_fence();
    }
    cluster.sync(); /* barriers initialised before any copy or remote arrival reaches them */

    if (warp == TMA_WARPS) {
        if (lane == 0) {
            const tma_producer<MT, RB> p = {&wmap, &xmap, ring, full, tile * OUT, rank, csize, boxes3d};
            const int first = nst < STAGES ? nst : STAGES;
            /* Weights are no earlier kernel's output: the first stages' weights may stream
             * while the kernel before finishes; x only after the wait. */
            if (pre)
                for (int u = 0; u < first; u++)
                    p.weights(u);
            pdl_wait();
            for (int u = 0; u < first; u++) {
                if (!pre) p.weights(u);
                p.x(u);
            }
            for (int u = first; u < nst; u++) {
                if (csize > 1)
                    mbar_wait<true>(&empty[u % STAGES], ((u / STAGES) & 1) ^ 1);
                else
                    mbar_wait(&empty[u % STAGES], ((u / STAGES) & 1) ^ 1);
                p.weights(u);
                p.x(u);
            }
        }
        __syncwarp();
    } else {
        float acc[MT][2][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[mt][nt][i] = 0.0f;
        float ss[2] = {0.0f, 0.0f};
        for (int u = 0; u < nst; u++) {
            const int slot = u % STAGES;
            mbar_wait(&full[slot], (u / STAGES) & 1);
            const unsigned char *wst = ring + (size_t)slot * tma_stage_bytes<MT>();
            tma_stage_mma<MT, NORM>(acc, ss, wst, wst + tma_w_bytes<MT>(), wn, u * TMA_STAGE_K, warp, lane);
            __syncwarp();
            if (csize == 1) { /* this warp is done with the stage */
                if (lane == 0) mbar_arrive(&empty[slot]);
            } else if (lane < (int)csize) {
                mbar_arrive_cluster(&empty[slot], (unsigned)lane);
            }
        }

        /* Every stage has landed and been read: the ring holds the partial sums
         * [warp][output][row] now. C fragment: c0, c1 -> (output mt 16 + g, rows nt 8 +
         * 2t, +1); c2, c3 -> output + 8. */
        tma_consumers_sync();
        float *part = (float *)ring;
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                float *p = part + ((size_t)warp * OUT + mt * 16 + g) * TMA_ROWS + nt * 8 + 2 * t;
                p[0] = acc[mt][nt][0];
                p[1] = acc[mt][nt][1];
                p[8 * TMA_ROWS] = acc[mt][nt][2];
                p[8 * TMA_ROWS + 1] = acc[mt][nt][3];
            }
        if (NORM) /* lanes 4g..4g+3 hold row nt 8 + g's x^2 over their k */
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                float v = ss[nt];
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                if (t == 0) part_ss[warp][nt * 8 + g] = v;
            }
        tma_consumers_sync();
        pdl_wait(); /* the residual add reads y, an earlier kernel's output */
        const int o0 = tile * OUT;
        auto sum = [&](int o, int n) {
            float s = 0.0f;
#pragma unroll
            for (int w = 0; w < TMA_WARPS; w++)
                s += part[((size_t)w * OUT + o) * TMA_ROWS + n];
            return s;
        };
        auto scale = [&](int n) {
            if (!NORM) return 1.0f;
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < TMA_WARPS; w++)
                v += part_ss[w][n];
            return 1.0f / sqrtf(v / (float)in + eps);
        };
        if constexpr (EPI == CUDA_GEMV_SWIGLU) {
            for (int i = threadIdx.x; i < OUT / 2 * TMA_ROWS; i += TMA_WARPS * 32) {
                const int jp = i / TMA_ROWS, n = i % TMA_ROWS;
                if (o0 + 2 * jp + 1 < out && n < n_rows) {
                    const float sc = scale(n);
                    y[(size_t)n * (out / 2) + o0 / 2 + jp] = silu_mul1(sum(2 * jp, n) * sc, sum(2 * jp + 1, n) * sc);
                }
            }
        } else {
            for (int i = threadIdx.x; i < OUT * TMA_ROWS; i += TMA_WARPS * 32) {
                const int o = i / TMA_ROWS, n = i % TMA_ROWS;
                if (o0 + o < out && n < n_rows) {
                    float *yo = y + (size_t)n * out + o0 + o;
                    const float s = sum(o, n) * scale(n);
                    *yo = EPI == CUDA_GEMV_ADD ? __fadd_rn(*yo, s) : s;
                }
            }
        }
    }
    cluster.sync(); /* no block leaves while another may still arrive on its barriers */
}

/* cuda_ops_gemv_set_tma: -1 = not yet read from the environment. */
static int tma_setting = -1, tma_cluster_setting = -1;
static unsigned long long tma_launch_count;

extern "C" int cuda_ops_gemv_set_tma(int mode, int cluster)
{
    if (mode < 0 || mode > 2 || (cluster != 0 && cluster != 1 && cluster != 2 && cluster != 4 && cluster != 8))
        return mm3_errorf(-EINVAL,
                          "cuda_ops_gemv_set_tma: mode %d, cluster %d: expected mode 0 (off, or MM3_GEMV_TMA), 1 "
                          "(9-16 rows, products that fill the GPU), 2 (3-16 rows, any one-wave shape); cluster 0 "
                          "(default, or MM3_GEMV_TMA_C), 1, 2, 4 or 8",
                          mode, cluster);
    __atomic_store_n(&tma_setting, mode ? mode : -1, __ATOMIC_RELAXED);
    __atomic_store_n(&tma_cluster_setting, cluster ? cluster : -1, __ATOMIC_RELAXED);
    return 0;
}

extern "C" unsigned long long cuda_ops_gemv_tma_launches(void)
{
    return __atomic_load_n(&tma_launch_count, __ATOMIC_RELAXED);
}

static int tma_cluster(void)
{
    const int c = cuda_env_switch(&tma_cluster_setting, "MM3_GEMV_TMA_C", 1);
    return c == 1 || c == 2 || c == 4 || c == 8 ? c : 1;
}

/* MM3_GEMV_TMA_PRE=0: the first stages' weights after griddepcontrol.wait (measuring). */
static int tma_pre(void)
{
    static int state = -1;
    return cuda_env_switch(&state, "MM3_GEMV_TMA_PRE", 1);
}

/* MM3_GEMV_TMA_3D=0: 2-D tensor maps, four weight copies and eight x copies per stage
 * (measuring) instead of one 3-D copy each: the tile seen as [k / 64][rows][64] with
 * the 64-k blocks 128 bytes apart lands in the same swizzled layout. */
static int tma_3d(void)
{
    static int state = -1;
    return cuda_env_switch(&state, "MM3_GEMV_TMA_3D", 1);
}

/* MM3_GEMV_TMA_BIG=1: the ring of nearly all 227 KiB (6 stages at 32 outputs per block,
 * 5 at 48) instead of the one that fits the 100 KiB shared split (3 and 2 stages). */
static int tma_big(void)
{
    static int state = -1;
    return cuda_env_switch(&state, "MM3_GEMV_TMA_BIG", 0) == 1;
}

/* Clusters of c blocks that fit at once (per tile size and ring; the variants share the
 * shared-memory size that decides it). */
template <int MT, int RB> static int tma_resident_clusters(int c)
{
    static int cache[TMA_MAX_CLUSTER + 1];
    if (!cache[c]) {
        const int smem = tma_smem_bytes<MT, RB>();
        auto set = [&](auto e, auto norm) {
            return cuda_status(cudaFuncSetAttribute(gemv_tma_kernel<MT, RB, decltype(e)::value, decltype(norm)::value>,
                                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                               "gemv_tma_kernel attributes");
        };
        /* every variant a launch may use */
        if (set(gemv_epi_c<CUDA_GEMV_STORE>{}, std::false_type{}) || set(gemv_epi_c<CUDA_GEMV_STORE>{}, std::true_type{}) ||
            set(gemv_epi_c<CUDA_GEMV_ADD>{}, std::false_type{}) || set(gemv_epi_c<CUDA_GEMV_SWIGLU>{}, std::false_type{}) ||
            set(gemv_epi_c<CUDA_GEMV_SWIGLU>{}, std::true_type{}))
            return 0;
        cache[c] = cuda_resident_clusters_y(gemv_tma_kernel<MT, RB, CUDA_GEMV_STORE, false>, TMA_THREADS, smem, c);
    }
    return cache[c];
}

/* 16-row weight tiles per block (2 or 3) for the shape, or 0 where this kernel does
 * not serve it: off, rows outside the mode's range, in not a multiple of 256, or no
 * tile size whose tiles run as one wave (mode 1: also filling at least half the SMs). */
int gemv_tma_plan(int n_rows, int in, int out)
{
    const int mode = cuda_env_switch(&tma_setting, "MM3_GEMV_TMA", 0);
    if (mode == 0 || n_rows > TMA_ROWS || n_rows < (mode == 1 ? 9 : 3) || in < TMA_STAGE_K || in % TMA_STAGE_K)
        return 0;
    const int c = tma_cluster();
    for (int mt = 2; mt <= 3; mt++) {
        const int tiles = (out + 16 * mt - 1) / (16 * mt);
        const int clusters = (tiles + c - 1) / c;
        if (mode == 1 && 2 * tiles < cuda_sm_count()) return 0;
        const int big = tma_big();
        const int fit = mt == 2 ? (big ? tma_resident_clusters<2, 1>(c) : tma_resident_clusters<2, 0>(c))
                                : (big ? tma_resident_clusters<3, 1>(c) : tma_resident_clusters<3, 0>(c));
        if (clusters <= fit) return mt;
    }
    return 0;
}

template <int MT, int RB, int EPI, bool NORM>
static int tma_launch(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out, const float *wn,
                      float eps, cudaStream_t st)
{
    const int c = tma_cluster(), tiles = (out + 16 * MT - 1) / (16 * MT), b3 = tma_3d();
    CUtensorMap wmap, xmap;
    /* 3-D: [in / 64][out][64] and [in / 32][n_rows][32], the k blocks 128 bytes apart */
    const uint64_t wdims[3] = {TMA_WBOX_K, (uint64_t)out, (uint64_t)in / TMA_WBOX_K},
                   wstrides[2] = {(uint64_t)in * 2, TMA_WBOX_K * 2};
    const uint64_t xdims[3] = {TMA_XBOX_K, (uint64_t)n_rows, (uint64_t)in / TMA_XBOX_K},
                   xstrides[2] = {(uint64_t)in * 4, TMA_XBOX_K * 4};
    const unsigned wbox[3] = {TMA_WBOX_K, 16u * MT, TMA_WBOXES}, xbox[3] = {TMA_XBOX_K, TMA_ROWS, TMA_XBOXES / (unsigned)c};
    const uint64_t wdims2[2] = {(uint64_t)in, (uint64_t)out}, xdims2[2] = {(uint64_t)in, (uint64_t)n_rows};
    int rc = b3 ? cuda_tensor_map(&wmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, w, wdims, wstrides, wbox,
                                  CU_TENSOR_MAP_SWIZZLE_128B)
                : cuda_tensor_map(&wmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w, wdims2, wstrides, wbox,
                                  CU_TENSOR_MAP_SWIZZLE_128B);
    if (rc < 0) return rc;
    rc = b3 ? cuda_tensor_map(&xmap, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, x, xdims, xstrides, xbox,
                              CU_TENSOR_MAP_SWIZZLE_128B)
            : cuda_tensor_map(&xmap, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, x, xdims2, xstrides, xbox,
                              CU_TENSOR_MAP_SWIZZLE_128B);
    if (rc < 0) return rc;
    __atomic_add_fetch(&tma_launch_count, 1, __ATOMIC_RELAXED);
    /* one block: no cluster attribute (the kernel's cluster calls see a cluster of 1) */
    return launch_ex("cudaLaunchKernelEx(gemv_tma_kernel)", gemv_tma_kernel<MT, RB, EPI, NORM>,
                     dim3((unsigned)((tiles + c - 1) / c), (unsigned)c), dim3(TMA_THREADS), tma_smem_bytes<MT, RB>(),
                     st, c > 1 ? c : 0, true, wmap, xmap, y, wn, n_rows, in, out, eps, tma_pre(), b3);
}

/* The caller (gemv_mma_launch) has checked rows, alignment and the epilogue; mt from
 * gemv_tma_plan. */
int gemv_tma_launch(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out, int mt,
                    enum cuda_gemv_epi epi, const float *norm_w, float eps, cudaStream_t st)
{
    return gemv_epi_dispatch(epi, norm_w != NULL, [&](auto e, auto norm) {
        constexpr int E = decltype(e)::value;
        constexpr bool N = decltype(norm)::value;
        if (tma_big())
            return mt == 2 ? tma_launch<2, 1, E, N>(y, x, w, n_rows, in, out, norm_w, eps, st)
                           : tma_launch<3, 1, E, N>(y, x, w, n_rows, in, out, norm_w, eps, st);
        return mt == 2 ? tma_launch<2, 0, E, N>(y, x, w, n_rows, in, out, norm_w, eps, st)
                       : tma_launch<3, 0, E, N>(y, x, w, n_rows, in, out, norm_w, eps, st);
    });
}
