/* Weight-streaming GEMV on the tensor cores, for up to 32 rows.
 *
 * The float32 kernel (matmul_bf16.cu) spends 16 FMAs and 32 bytes of x per
 * weight at 16 rows and runs far below HBM speed; here mma.sync m16n8k16 does the
 * arithmetic. W tiles are the A operand straight from global memory (16-byte loads,
 * bf16 as stored); x is the B operand. To keep float32 accuracy, x is split
 * into bf16 hi + lo parts (x - hi - lo is below 2^-16 |x|) and each tile takes two
 * MMAs with float32 accumulation. Above 8 rows x is rounded to bf16 instead (the
 * precision of the reference's bf16 activations; gemv_x_round): one MMA per tile and
 * k half, a faster frame at 8 pairs (docs/performance.md).
 *
 * The dot product does not care in which order k is visited, so each lane loads 8
 * consecutive k (16 bytes) of a weight row and feeds them to two MMAs; the B
 * fragment uses the same k permutation.
 *
 * Work split: a tile is 16 x MT outputs (MT = 2, or 4 when forced: mma_default_tiles); a block walks its share of
 * `in` with 8 warps; when the matrix has too few tiles to fill the GPU, KS blocks (a
 * thread-block cluster) split `in` and add their partial sums through distributed
 * shared memory, in a fixed order (deterministic), once after their last tile (up to
 * MMA_MERGE_SLOTS tiles each). The grid is one wave: never more
 * blocks than fit on the GPU at once, each taking the same number of tiles. A grid
 * of 1.2 or 1.45 waves (what "two blocks per SM" gave for 4096 and 24576 outputs)
 * ends with a second wave of a few blocks that cannot stream at full speed.
 *
 * Weights in flight: each warp keeps two k steps in registers, or (17-32 rows unless
 * registers are asked for with x rounded, and 9-16 where x is split) three in a
 * shared-memory ring filled by cp.async (cuda_ops_gemv_set_mma_ring says why).
 * A block's next tile starts loading before the current tile's sums are merged.
 *
 * At 17-32 rows (and 9-16 where x is split), where the outputs alone nearly fill the
 * GPU, gemv_mma_launch hands the product to gemv_xs.cu, which reads x once per block
 * instead of once per tile (gemv_xs_plan). */
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/gemv_mma.cuh"
#include "common/cuda/ops_cuda.h"
#include "common/cuda/pdl.cuh"
#include "common/cuda/silu.cuh"

namespace cg = cooperative_groups;

/* This lane's weight rows of a tile: g and g + 8 of each 16-row M tile (clamped past `out`). */
template <int MT>
__device__ __forceinline__ void mma_tile_rows(const uint4 *(&wr)[MT][2], const uint16_t *w, int tile, int in, int out,
                                              int g, int t)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int o = tile * 16 * MT + mt * 16 + h * 8 + g;
            o = o < out ? o : out - 1;
            wr[mt][h] = (const uint4 *)(w + (size_t)o * in + 8 * t);
        }
}

template <int MT>
__device__ __forceinline__ void mma_load_step(uint4 (&wa)[MT][2], const uint4 *const (&wr)[MT][2], int st)
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wa[mt][h] = mma_weight_load(wr[mt][h] + st * 4); /* 4 uint4 = one 32-wide k step */
}

/* MMA_MERGE_SLOTS: the most tiles a block of a k-split cluster walks (mma_plan keeps
 * to it); their block sums wait in shared memory for one cluster merge at the end. */
enum { MMA_WARPS = 8, MMA_THREADS = MMA_WARPS * 32, MMA_MAX_CLUSTER = 8, MMA_MERGE_SLOTS = 3 };

/* x tile nt's B fragments of k step sb: its rows (normed when NORM, summing x^2 into
 * ss) split into bf16 hi + lo (LO) or rounded to bf16. */
template <bool NORM, bool LO>
__device__ __forceinline__ void mma_x_fragment(uint32_t (&bh)[4], uint32_t (&bl)[4], float &ss, const float4 *xr,
                                               bool xv, const float *__restrict__ wn, int t, int kq)
{
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f), q = p, na = p, nb = p;
    if (xv) {
        p = __ldg(xr + 2 * kq);
        q = __ldg(xr + 2 * kq + 1);
    }
    if (NORM) {
        const float4 *nr = (const float4 *)(wn + 8 * t) + 2 * kq;
        na = __ldg(nr);
        nb = __ldg(nr + 1);
    }
    mma_x_split<NORM, LO>(bh, bl, ss, p, q, na, nb);
}

/* One k step of one warp: x times this lane's weights a of every tile. Up to 16 rows
 * (and with x rounded at 32) every x tile is converted first; x split at 32 rows
 * (NT 4) goes one x tile at a time, which keeps 24 fewer words live (the norm's
 * variants spilled) and adds in the same order. */
template <int NT, int MMA_MT, bool NORM, int XM>
__device__ __forceinline__ void mma_step(float (&acc)[MMA_MT][NT][4], float (&ss)[NT], const uint4 (&a)[MMA_MT][2],
                                         const float4 *const (&xr)[NT], const bool (&xv)[NT],
                                         const float *__restrict__ wn, int t, int sb)
{
    const int kq = sb * (MMA_KSTEP / 8); /* offset in uint4 (8 bf16) units */
    if constexpr (XM == X_ROUND) { /* two MMAs per tile */
        uint32_t bh[NT][4], unused[4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma_x_fragment<NORM, false>(bh[nt], unused, ss[nt], xr[nt], xv[nt], wn, t, kq);
#pragma unroll
        for (int mt = 0; mt < MMA_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                mma_tile_hi(acc[mt][nt], a[mt], bh[nt]);
    } else if constexpr (NT > 2) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint32_t bh[4], bl[4];
            mma_x_fragment<NORM, true>(bh, bl, ss[nt], xr[nt], xv[nt], wn, t, kq);
#pragma unroll
            for (int mt = 0; mt < MMA_MT; mt++)
                mma_tile(acc[mt][nt], a[mt], bh, bl);
        }
    } else {
        uint32_t bh[NT][4], bl[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mma_x_fragment<NORM, true>(bh[nt], bl[nt], ss[nt], xr[nt], xv[nt], wn, t, kq);
#pragma unroll
        for (int mt = 0; mt < MMA_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                mma_tile(acc[mt][nt], a[mt], bh[nt], bl[nt]);
    }
}

/* A warp's ring of STAGES k steps of weights in shared memory, filled by
 * cp.async: a lane reads back only the 16-byte pieces it copied itself, so
 * cp.async.wait_group is all the synchronisation the ring needs. */
template <int MMA_MT, int STAGES>
__device__ __forceinline__ void mma_copy_step(uint4 *ring, const uint4 *const (&wr)[MMA_MT][2], int lane, int i, int sb,
                                              int steps)
{
    if (sb < steps)
#pragma unroll
        for (int mt = 0; mt < MMA_MT; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                mma_async_copy(ring + (((i % STAGES) * MMA_MT + mt) * 2 + h) * 32 + lane, wr[mt][h] + sb * 4);
    mma_copy_commit(); /* empty groups too: wait_group counts them */
}

template <int MMA_MT, int STAGES> constexpr int mma_ring_bytes()
{
    return STAGES ? MMA_WARPS * STAGES * MMA_MT * 2 * 32 * 16 : 0;
}

/* Rank 0's output of one tile: the cluster's block sums bs (this block's, then ranks 1..ks-1
 * through distributed shared memory, in rank order: deterministic), scaled by the row's
 * RMSNorm (computed from every rank's block_ss where slot is 0: at every tile of an
 * unsplit block, at the first tile of a cluster's merge), then stored, SwiGLU'd or added
 * to y. */
template <int NT, int MMA_MT, int EPI, bool NORM>
__device__ __forceinline__ void mma_store_tile(float *__restrict__ y, float *bs, float *block_ss, float *row_scale,
                                               cg::cluster_group &cluster, int n_rows, int in, int out, int ks, int o0,
                                               int slot, float eps)
{
    constexpr int MMA_OUT = 16 * MMA_MT, ncols = 8 * NT;
    if (slot == 0) {
        if (threadIdx.x < ncols) /* 0 + rank 0's sum first: the same bits as starting from it */
            row_scale[threadIdx.x] = NORM ? mma_cluster_norm_scale(cluster, block_ss, ks, threadIdx.x, in, eps) : 1.0f;
        __syncthreads();
    }
    if constexpr (EPI == CUDA_GEMV_SWIGLU) {
        for (int i = threadIdx.x; i < MMA_OUT / 2 * ncols; i += MMA_THREADS) {
            const int jp = i / ncols, n = i % ncols, ig = 2 * jp * ncols + n, iu = ig + ncols;
            float g = bs[ig], u = bs[iu];
            for (int r = 1; r < ks; r++) {
                g += cluster.map_shared_rank(bs, r)[ig];
                u += cluster.map_shared_rank(bs, r)[iu];
            }
            if (o0 + 2 * jp + 1 < out && n < n_rows)
                y[(size_t)n * (out / 2) + o0 / 2 + jp] = silu_mul1(g * row_scale[n], u * row_scale[n]);
        }
    } else {
        for (int i = threadIdx.x; i < MMA_OUT * ncols; i += MMA_THREADS) {
            const int o = i / ncols, n = i % ncols;
            float s = bs[i];
            for (int r = 1; r < ks; r++)
                s += cluster.map_shared_rank(bs, r)[i];
            s *= row_scale[n];
            if (o0 + o < out && n < n_rows) {
                float *yo = y + (size_t)n * out + o0 + o;
                *yo = EPI == CUDA_GEMV_ADD ? __fadd_rn(*yo, s) : s;
            }
        }
    }
}

/* NT: 8-row tiles of x (1 for n <= 8, 2 for n <= 16, 4 for n <= 32). MMA_MT: 16-row tiles of W
 * per block; more tiles re-read x (mostly from L1) fewer times per weight byte. EPI and
 * NORM: as cuda_ops_gemv_bf16_fused (the k-split blocks of a cluster each sum x^2
 * over their share of the row and rank 0 adds them up with the partial products).
 * STAGES: 0 keeps two k steps of weights per warp in registers; n > 0 keeps n - 1
 * in flight through a shared-memory ring (no registers held while in flight).
 * XM: how x meets the tensor cores (gemv_mma.cuh: split or rounded to bf16). */
template <int NT, int MMA_MT, int EPI, bool NORM, int STAGES, int XM = X_SPLIT>
__global__ void __launch_bounds__(MMA_THREADS, 2)
    gemv_mma_kernel(float *__restrict__ y, const float *__restrict__ x, const uint16_t *__restrict__ w, int n_rows,
                    int in, int out, int ks, int tiles, const float *__restrict__ wn, float eps)
{
    pdl_launch_dependents();
    constexpr int MMA_OUT = 16 * MMA_MT;
    __shared__ float red[MMA_WARPS][MMA_OUT * 8 * NT];
    __shared__ float block_sum[MMA_MERGE_SLOTS][MMA_OUT * 8 * NT];
    __shared__ float red_ss[MMA_WARPS][8 * NT], block_ss[8 * NT], row_scale[8 * NT];
    extern __shared__ uint4 mma_ring[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int rank = blockIdx.y; /* cluster is (1, ks, 1) and the grid's y is ks */
    /* x rows g and 8+g; rows past n_rows read as zero. */
    const float4 *xr[NT];
    bool xv[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int n = nt * 8 + g;
        xv[nt] = n < n_rows;
        xr[nt] = (const float4 *)(x + (size_t)(xv[nt] ? n : 0) * in + 8 * t);
    }
    cg::cluster_group cluster = cg::this_cluster();
    const int steps = in / MMA_KSTEP;
    const int stride = MMA_WARPS * ks;
    const int ncols = 8 * NT;
    const int st0 = rank * MMA_WARPS + warp;
    uint4 *ring = mma_ring + (size_t)warp * (STAGES ? STAGES : 1) * MMA_MT * 2 * 32;
    /* The first tile's first weights are loaded before pdl_wait (weights are no earlier
     * kernel's output), so a block placed while the previous kernel finishes streams.
     * Registers: steps st0 and st0 + stride; ring: STAGES - 1 steps. */
    const uint4 *wr[MMA_MT][2];
    uint4 wa[2][MMA_MT][2];
    auto start_tile = [&](int tile) {
        mma_tile_rows<MMA_MT>(wr, w, tile, in, out, g, t);
        if constexpr (STAGES > 0) {
#pragma unroll
            for (int i = 0; i < STAGES - 1; i++)
                mma_copy_step<MMA_MT, STAGES>(ring, wr, lane, i, st0 + i * stride, steps);
        } else {
            if (st0 < steps) mma_load_step<MMA_MT>(wa[0], wr, st0);
            if (st0 + stride < steps) mma_load_step<MMA_MT>(wa[1], wr, st0 + stride);
        }
    };
    if (blockIdx.x < tiles) start_tile(blockIdx.x);
    pdl_wait();

    for (int tile = blockIdx.x, slot = 0; tile < tiles; tile += gridDim.x, slot++) {
        const int o0 = tile * MMA_OUT;
        float acc[MMA_MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MMA_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++)
                    acc[mt][nt][i] = 0.0f;
        float ss[NT];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            ss[nt] = 0.0f;

        if constexpr (STAGES > 0) {
            int i = 0;
            for (int sb = st0; sb < steps; sb += stride, i++) {
                mma_copy_wait<STAGES - 2>(); /* step i has landed */
                uint4 a[MMA_MT][2];
#pragma unroll
                for (int mt = 0; mt < MMA_MT; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        a[mt][h] = ring[(((i % STAGES) * MMA_MT + mt) * 2 + h) * 32 + lane];
                /* refills the slot read in the previous step (its values are in registers) */
                mma_copy_step<MMA_MT, STAGES>(ring, wr, lane, i + STAGES - 1, sb + (STAGES - 1) * stride, steps);
                mma_step<NT, MMA_MT, NORM, XM>(acc, ss, a, xr, xv, wn, t, sb);
            }
        } else {
            for (int st = st0; st < steps; st += 2 * stride) {
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    const int sb = st + b * stride;
                    if (sb < steps) {
                        mma_step<NT, MMA_MT, NORM, XM>(acc, ss, wa[b], xr, xv, wn, t, sb);
                        if (sb + 2 * stride < steps) mma_load_step<MMA_MT>(wa[b], wr, sb + 2 * stride);
                    }
                }
            }
        }

        /* The next tile's first weights stream while this tile's sums are merged. */
        if (tile + (int)gridDim.x < tiles) start_tile(tile + (int)gridDim.x);

            /* C fragment: c0,c1 -> (out mt*16+g, x rows nt*8+2t+{0,1}); c2,c3 -> out +8. Layout [o][n]. */
#pragma unroll
        for (int mt = 0; mt < MMA_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int o = mt * 16 + g, n = nt * 8 + 2 * t;
                red[warp][o * ncols + n] = acc[mt][nt][0];
                red[warp][o * ncols + n + 1] = acc[mt][nt][1];
                red[warp][(o + 8) * ncols + n] = acc[mt][nt][2];
                red[warp][(o + 8) * ncols + n + 1] = acc[mt][nt][3];
            }
        if (NORM) { /* lanes 4g..4g+3 hold row nt*8+g's x^2 over their k: add them up */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float v = ss[nt];
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                if (t == 0) red_ss[warp][nt * 8 + g] = v;
            }
        }
        __syncthreads();
        float *const bs = block_sum[ks > 1 ? slot : 0];
        for (int i = threadIdx.x; i < MMA_OUT * ncols; i += MMA_THREADS) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < MMA_WARPS; k++)
                s += red[k][i];
            bs[i] = s;
        }
        if (NORM && threadIdx.x < ncols) {
            float v = 0.0f;
#pragma unroll
            for (int k = 0; k < MMA_WARPS; k++)
                v += red_ss[k][threadIdx.x];
            block_ss[threadIdx.x] = v;
        }
        __syncthreads(); /* red is free again, block_sum and block_ss are complete */
        if (ks == 1)
            mma_store_tile<NT, MMA_MT, EPI, NORM>(y, block_sum[0], block_ss, row_scale, cluster, n_rows, in, out, 1, o0,
                                                  0, eps);
    }
    /* A k-split cluster merges once, after its last tile: a merge per tile held every
     * block's weight stream at two cluster barriers per tile. */
    if (ks > 1) {
        cluster.sync(); /* every block's sums of every tile are complete */
        if (rank == 0)
            for (int tile = blockIdx.x, slot = 0; tile < tiles; tile += gridDim.x, slot++)
                mma_store_tile<NT, MMA_MT, EPI, NORM>(y, block_sum[slot], block_ss, row_scale, cluster, n_rows, in, out,
                                                      ks, tile * MMA_OUT, slot, eps);
        cluster.sync(); /* keep the other blocks' block_sum alive until rank 0 has read it */
    }
}

/* Clusters of ks blocks of this kernel that fit on the GPU at once (cached per
 * instantiation; every thread computes the same values, so the race is benign). */
template <int NT, int MT, int EPI, bool NORM, int S, int XM = X_SPLIT> static int mma_resident_clusters(int ks)
{
    static int cache[MMA_MAX_CLUSTER + 1];
    if (!cache[ks]) {
        if (S) /* the ring is past the 48 KiB a launch gets unasked */
            (void)cudaFuncSetAttribute(gemv_mma_kernel<NT, MT, EPI, NORM, S, XM>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, mma_ring_bytes<MT, S>());
        cache[ks] = cuda_resident_clusters_y(gemv_mma_kernel<NT, MT, EPI, NORM, S, XM>, MMA_THREADS,
                                             mma_ring_bytes<MT, S>(), ks);
    }
    return cache[ks];
}

/* One wave. Clusters of ks blocks split `in` (ks = 1: none); each cluster takes `per`
 * tiles, the same number for all. ks is chosen so that the fewest block slots idle:
 * 384 tiles on 264 slots as 2 tiles per block leave 72 slots empty, as 3 tiles per
 * cluster of 2 blocks 8; 64 tiles take clusters of 4 (256 slots busy). Each warp keeps
 * at least one k step, MMA_MIN_TILE_STEPS where a block walks several tiles (its
 * pipeline restarts at every tile) and at most MMA_MERGE_SLOTS tiles in a split; a
 * split must beat the best so far by 3% (its blocks merge through distributed shared
 * memory). */
enum { MMA_MIN_TILE_STEPS = 4 };
template <int NT, int MT, int EPI, bool NORM, int S, int XM = X_SPLIT>
static void mma_plan(int tiles, int steps, int *ks_out, int *grid_out)
{
    const int slots = mma_resident_clusters<NT, MT, EPI, NORM, S, XM>(1);
    int ks = 1, per = (tiles + slots - 1) / slots;
    long best = tiles; /* block-tiles of work of ks = 1; busy fraction best / (per * slots) */
    for (int k = 2; k <= MMA_MAX_CLUSTER && k * MMA_WARPS <= steps; k++) {
        const int clusters = mma_resident_clusters<NT, MT, EPI, NORM, S, XM>(k);
        const int p = (tiles + clusters - 1) / clusters;
        if (p > MMA_MERGE_SLOTS || (p > 1 && k * MMA_WARPS * MMA_MIN_TILE_STEPS > steps)) continue;
        if ((long)tiles * k * per * 100 > best * p * 103) best = (long)tiles * k, per = p, ks = k;
    }
    *ks_out = ks;
    *grid_out = (tiles + per - 1) / per;
}

template <int NT, int MT, int EPI, bool NORM, int S, int XM = X_SPLIT>
static int mma_launch(const struct cuda_gemv_fused &g, cudaStream_t st)
{
    const int tiles = (g.out + 16 * MT - 1) / (16 * MT);
    int ks, grid;
    mma_plan<NT, MT, EPI, NORM, S, XM>(tiles, g.in / MMA_KSTEP, &ks, &grid);
    return launch_ex("cudaLaunchKernelEx(gemv_mma_kernel)", gemv_mma_kernel<NT, MT, EPI, NORM, S, XM>,
                     dim3((unsigned)grid, (unsigned)ks), dim3(MMA_THREADS), mma_ring_bytes<MT, S>(), st, ks, true, g.y,
                     g.x, g.w, g.n_rows, g.in, g.out, ks, tiles, g.norm_w, g.eps);
}

/* cuda_ops_gemv_set_mma_tiles: 2 or 4 weight tiles per block for every launch, or
 * (0) the choice below. */
static int mma_tiles_setting;

extern "C" int cuda_ops_gemv_set_mma_tiles(int m_tiles)
{
    if (m_tiles != 0 && m_tiles != 2 && m_tiles != 4)
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_set_mma_tiles: %d: expected 0 (per shape), 2 or 4", m_tiles);
    __atomic_store_n(&mma_tiles_setting, m_tiles, __ATOMIC_RELAXED);
    return 0;
}

/* Weight tiles per block: 2 unless 4 is forced. With two k steps of weights held per
 * warp (the kernel's pipeline), 4 tiles need more than the 128 registers that keep two
 * blocks per SM and spill, and were slower per frame (docs/performance.md). */
static int mma_default_tiles(void)
{
    return __atomic_load_n(&mma_tiles_setting, __ATOMIC_RELAXED) == 4 ? 4 : 2;
}

/* Where a warp's weights wait for the tensor cores (cuda_ops_gemv_set_mma_ring): 0 = per
 * x conversion and row count (below), 1 = the shared-memory ring, 2 = registers. With x
 * split, the ring of 3 steps is faster at 9-16 rows and registers at 3-8; with x rounded
 * to bf16 (half the x registers, half the MMAs) registers win at 9-16 rows too
 * (docs/performance.md). The ring's 48 KiB per block come out of L1, where x is re-read
 * once per weight tile. */
static int mma_ring_setting;

extern "C" int cuda_ops_gemv_set_mma_ring(int mode)
{
    if (mode < 0 || mode > 2)
        return mm3_errorf(-EINVAL,
                          "cuda_ops_gemv_set_mma_ring: %d: expected 0 (per row count), 1 (ring), 2 (registers)", mode);
    __atomic_store_n(&mma_ring_setting, mode, __ATOMIC_RELAXED);
    return 0;
}

/* 17-32 rows (NT 4) take the ring unless registers are asked for (2) with x rounded:
 * with x split, 32 accumulators and 32 words of split x per step leave no registers for
 * weights in flight (ptxas: spills); rounded, x takes half as many (128 registers, no
 * spills without the norm, a few bytes with it). */
template <int NT, int XM> static bool mma_uses_ring(void)
{
    const int m = __atomic_load_n(&mma_ring_setting, __ATOMIC_RELAXED);
    if (NT > 2) return m != 2 || XM == X_SPLIT;
    return m == 1 || (m != 2 && NT == 2 && XM == X_SPLIT);
}

enum { MMA_RING_STAGES = 3 };

/* Where the tensor-core GEMVs round float32 x to bf16 instead of splitting it
 * (gemv_mma.cuh, X_ROUND; cuda_ops_gemv_set_x_round): 0 = per row count (gemv_x_round),
 * 1 = every row count, 2 = never. */
static int x_round_setting;

extern "C" int cuda_ops_gemv_set_x_round(int mode)
{
    if (mode < 0 || mode > 2)
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_set_x_round: %d: expected 0 (per row count), 1 (always), 2 (never)",
                          mode);
    __atomic_store_n(&x_round_setting, mode, __ATOMIC_RELAXED);
    return 0;
}

/* Rounded above 8 rows (two or four x tiles), where the split's second pair of MMAs
 * and its conversion slow the products; up to 8 rows x in bf16 gained nothing
 * (docs/performance.md), so those keep float32 accuracy. */
bool gemv_x_round(int n_rows)
{
    const int m = __atomic_load_n(&x_round_setting, __ATOMIC_RELAXED);
    return m == 1 || (m == 0 && n_rows > CUDA_OPS_GEMV_SPLIT_MAX_ROWS);
}

/* 17-32 rows (NT 4) always take 2 tiles (4 would hold 64 accumulators). */
template <int NT, int EPI, bool NORM, int XM>
static int mma_launch_tiles(const struct cuda_gemv_fused &g, int m_tiles, cudaStream_t st)
{
    if constexpr (NT > 2) {
        if constexpr (XM == X_ROUND)
            if (!mma_uses_ring<NT, XM>()) return mma_launch<NT, 2, EPI, NORM, 0, XM>(g, st);
        return mma_launch<NT, 2, EPI, NORM, MMA_RING_STAGES, XM>(g, st);
    } else {
        if (m_tiles == 0) m_tiles = mma_default_tiles();
        if (m_tiles == 4) return mma_launch<NT, 4, EPI, NORM, 0, XM>(g, st);
        return mma_uses_ring<NT, XM>() ? mma_launch<NT, 2, EPI, NORM, MMA_RING_STAGES, XM>(g, st)
                                       : mma_launch<NT, 2, EPI, NORM, 0, XM>(g, st);
    }
}

/* Every epilogue / norm variant and x conversion for one x tile count. */
template <int NT> static int mma_launch_variant(const struct cuda_gemv_fused &g, int m_tiles, cudaStream_t st)
{
    return gemv_mma_dispatch(g.epi, g.norm_w != NULL, gemv_x_round(g.n_rows), [&](auto e, auto norm, auto xm) {
        return mma_launch_tiles<NT, decltype(e)::value, decltype(norm)::value, decltype(xm)::value>(g, m_tiles, st);
    });
}

int gemv_mma_launch(const struct cuda_gemv_fused *g, int m_tiles, cudaStream_t st)
{
    float *y = g->y;
    const float *x = g->x, *norm_w = g->norm_w;
    const uint16_t *w = g->w;
    int n_rows = g->n_rows, in = g->in, out = g->out;
    enum cuda_gemv_epi epi = g->epi;
    if (m_tiles != 0 && m_tiles != 2 && m_tiles != 4)
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_bf16_mma: %d weight tiles per block, expected 0 (auto), 2 or 4",
                          m_tiles);
    if (n_rows < 1 || n_rows > CUDA_OPS_GEMV_MMA_MAX_ROWS || out < 1 || in < MMA_KSTEP || in % MMA_KSTEP || !y || !x ||
        !w)
        return mm3_errorf(-EINVAL,
                          "cuda_ops_gemv_bf16_mma: %d rows, in %d, out %d: expected rows 1..%d, in a multiple of %d",
                          n_rows, in, out, CUDA_OPS_GEMV_MMA_MAX_ROWS, MMA_KSTEP);
    if (((uintptr_t)w | (uintptr_t)x) & 15)
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_bf16_mma: w and x must be 16-byte aligned");
    if (epi == CUDA_GEMV_SWIGLU && out % 2)
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_bf16_mma (swiglu): %d outputs, expected even", out);
    if (norm_w && epi == CUDA_GEMV_ADD)
        return mm3_errorf(-ENOTSUP, "cuda_ops_gemv_bf16_mma: no norm with the residual add");
    const int xs_split = m_tiles == 0 ? gemv_xs_plan(n_rows, in, out) : 0;
    if (xs_split) return gemv_xs_launch(g, xs_split, st);
    if (n_rows <= 8) return mma_launch_variant<1>(*g, m_tiles, st);
    if (n_rows <= 16) return mma_launch_variant<2>(*g, m_tiles, st);
    return mma_launch_variant<4>(*g, m_tiles, st);
}

extern "C" int cuda_ops_gemv_bf16_mma(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out,
                                      int m_tiles, void *stream)
{
    const struct cuda_gemv_fused g = {.y = y, .x = x, .w = w, .n_rows = n_rows, .in = in, .out = out};
    return gemv_mma_launch(&g, m_tiles, cuda_stream_of(stream));
}
