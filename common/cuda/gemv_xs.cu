/* Weight-streaming GEMV on the tensor cores with x staged in shared memory, for the
 * 17-32 rows of 8 CFG pairs' two-position depth pass (9-16 where x is split) where the
 * outputs alone nearly fill the GPU (gemv_xs_plan; gemv_mma.cu serves the rest).
 *
 * gemv_mma.cu's blocks split `in` over their 8 warps and re-read x (through L1) for every
 * 32-output weight tile: at 16 rows as many x bytes as weight bytes, at 32 rows
 * twice as many. Here the 8 warps of a block split the outputs instead (16 each, 128
 * per block) and walk the same k range, so x is read once per block: each thread
 * loads one item of 8 x values per chunk, splits it into bf16 hi + lo B fragments in
 * shared memory (double buffered, one __syncthreads per chunk), and every warp reads
 * its fragments from there. x costs a quarter of the weight bytes at 16 rows and
 * needs no per-warp conversion. Where the outputs give too few blocks, clusters of
 * ks blocks split `in` and add their partial sums through distributed shared memory
 * once, at the end (fixed order: deterministic).
 *
 * Weights in flight: a ring of XS_STAGES k steps per warp filled by cp.async. Held in
 * registers instead, the same kernel ran clearly slower, as if the __syncthreads of
 * every chunk drained the loads in flight; copies into the ring keep streaming across it.
 * Same arithmetic as gemv_mma.cu: x split into bf16 hi + lo or rounded to bf16
 * (gemv_x_round; the lo fragments are then neither stored nor read), float32 sums. */
#include <cooperative_groups.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/gemv_mma.cuh"
#include "common/cuda/pdl.cuh"
#include "common/cuda/silu.cuh"

namespace cg = cooperative_groups;

enum {
    XS_WARPS = 8,
    XS_THREADS = XS_WARPS * 32,
    XS_OUT = 16 * XS_WARPS, /* outputs per block: one 16-row weight tile per warp */
    XS_STAGES = 8,          /* a warp's weight ring: XS_STAGES - 1 k steps in flight */
    XS_MAX_CLUSTER = 8,
};

/* k steps of x per chunk: one (step, x tile, lane) item of 8 x values per thread. */
template <int NT> __host__ __device__ constexpr int xs_chunk_steps()
{
    return XS_THREADS / 32 / NT;
}

/* Shared memory: the warps' weight rings [warp][stage][row half][lane] and two chunks
 * of B fragments [step][x tile][hi, lo][lane]; after the loop the ring's bytes hold
 * the partial sums [XS_OUT][8 NT + 1] and the x^2 partials. */
constexpr int XS_RING_UINT4 = XS_WARPS * XS_STAGES * 2 * 32;
constexpr int XS_FRAG_UINT4 = XS_THREADS * 2;
constexpr int XS_SMEM_BYTES = (XS_RING_UINT4 + 2 * XS_FRAG_UINT4) * 16;
static_assert((XS_OUT * (8 * 4 + 1) + XS_THREADS) * 4 <= XS_RING_UINT4 * 16, "partials fit the ring");

/* The thread's item of chunk c: 8 consecutive x of one row (zeros past n_rows or past
 * the block's k steps) and the norm weights of the same k. */
struct xs_item {
    float4 xa, xb, na, nb;
};

template <int NT, bool NORM>
__device__ __forceinline__ void xs_item_load(xs_item &it, const float *x, const float *wn, int n_rows, int in, int s0,
                                             int n_steps, int c)
{
    const int lane = threadIdx.x & 31, nt = (threadIdx.x >> 5) % NT, j = (threadIdx.x >> 5) / NT;
    const int row = nt * 8 + (lane >> 2), step = c * xs_chunk_steps<NT>() + j;
    const size_t k = (size_t)(s0 + step) * MMA_KSTEP + 8 * (lane & 3);
    it.xa = it.xb = it.na = it.nb = make_float4(0.f, 0.f, 0.f, 0.f);
    if (step < n_steps) {
        if (row < n_rows) {
            /* ld.global.cg, not __ldg (x is the previous kernel's output): with __ldg the
             * talker's GPU tests failed under programmatic dependent launch only (not
             * with MM3_PDL=0), as if a read-only load had moved above pdl_wait; a build
             * with the load behind a runtime branch passed, and so does this one. L1
             * would not help anyway: each x value is read once per block. */
            const float4 *xr = (const float4 *)(x + (size_t)row * in + k);
            it.xa = __ldcg(xr);
            it.xb = __ldcg(xr + 1);
        }
        if (NORM) {
            it.na = __ldg((const float4 *)(wn + k));
            it.nb = __ldg((const float4 *)(wn + k) + 1);
        }
    }
}

/* The item -> its B fragments (bf16 hi + lo, or hi alone when rounded) in frag,
 * normed when NORM (x^2 into ss). */
template <int NT, bool NORM, int XM>
__device__ __forceinline__ void xs_item_store(uint4 *frag, const xs_item &it, float &ss)
{
    uint32_t bh[4], bl[4];
    mma_x_split<NORM, XM == X_SPLIT>(bh, bl, ss, it.xa, it.xb, it.na, it.nb);
    const int lane = threadIdx.x & 31, i = threadIdx.x >> 5; /* i = step * NT + x tile */
    frag[(i * 2 + 0) * 32 + lane] = make_uint4(bh[0], bh[1], bh[2], bh[3]);
    if constexpr (XM == X_SPLIT) frag[(i * 2 + 1) * 32 + lane] = make_uint4(bl[0], bl[1], bl[2], bl[3]);
}

/* Weight rows g and g + 8 of k step `step` into ring slot `slot` (this lane's pieces). */
__device__ __forceinline__ void xs_ring_copy(uint4 *ring, const uint4 *const (&wr)[2], int slot, int step, int lane)
{
#pragma unroll
    for (int h = 0; h < 2; h++)
        mma_async_copy(ring + (slot * 2 + h) * 32 + lane, wr[h] + step * (MMA_KSTEP / 8));
}

/* NT: 8-row tiles of x (1 for n <= 8, 2 for n <= 16, 4 for n <= 32). EPI and NORM as
 * cuda_ops_gemv_bf16_fused; XM: X_SPLIT or X_ROUND (gemv_mma.cuh). Grid: (output groups
 * of XS_OUT, ks); a cluster is the ks blocks of one group, each taking steps/ks of the
 * k steps. */
template <int NT, int EPI, bool NORM, int XM>
__global__ void __launch_bounds__(XS_THREADS, 2)
    gemv_xs_kernel(float *__restrict__ y, const float *__restrict__ x, const uint16_t *__restrict__ w, int n_rows,
                   int in, int out, int ks, const float *__restrict__ wn, float eps)
{
    pdl_launch_dependents();
    constexpr int ROWS = 8 * NT, CS = xs_chunk_steps<NT>(), PR = ROWS + 1; /* PR: partial row stride */
    extern __shared__ uint4 xs_dyn[];
    uint4 *const frag = xs_dyn + XS_RING_UINT4; /* [2][XS_FRAG_UINT4] */
    __shared__ float block_ss[ROWS], row_scale[ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint4 *const ring = xs_dyn + warp * XS_STAGES * 2 * 32;
    const int rank = blockIdx.y; /* cluster is (1, ks, 1) and the grid's y is ks */
    const int steps = in / MMA_KSTEP;
    const int s0 = (int)((long)steps * rank / ks), n_steps = (int)((long)steps * (rank + 1) / ks) - s0;
    const int o0 = blockIdx.x * XS_OUT;

    /* This lane's weight rows g and g + 8 of the warp's tile (clamped past `out`),
     * from the block's first k step. Weights are no earlier kernel's output: the ring
     * fills before pdl_wait. */
    const uint4 *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int o = o0 + warp * 16 + h * 8 + (lane >> 2);
        o = o < out ? o : out - 1;
        wr[h] = (const uint4 *)(w + (size_t)o * in + 8 * (lane & 3)) + (size_t)s0 * (MMA_KSTEP / 8);
    }
#pragma unroll
    for (int i = 0; i < XS_STAGES - 1; i++) {
        if (i < n_steps) xs_ring_copy(ring, wr, i, i, lane);
        mma_copy_commit(); /* empty groups too: wait_group counts them */
    }
    pdl_wait();

    /* Per chunk c, after one __syncthreads: chunk c + 1's items (loaded while chunk c - 1
     * was multiplied) become fragments, chunk c + 2's items load, chunk c is multiplied. */
    float ss = 0.0f;
    xs_item it;
    xs_item_load<NT, NORM>(it, x, wn, n_rows, in, s0, n_steps, 0);
    xs_item_store<NT, NORM, XM>(frag, it, ss);
    xs_item_load<NT, NORM>(it, x, wn, n_rows, in, s0, n_steps, 1);
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[nt][i] = 0.0f;
    const int chunks = (n_steps + CS - 1) / CS;
    for (int c = 0; c < chunks; c++) {
        __syncthreads(); /* fragments of chunk c complete; those of chunk c - 1 no longer read */
        if (c + 1 < chunks) {
            xs_item_store<NT, NORM, XM>(frag + ((c + 1) & 1) * XS_FRAG_UINT4, it, ss);
            xs_item_load<NT, NORM>(it, x, wn, n_rows, in, s0, n_steps, c + 2);
        }
        const uint4 *fc = frag + (c & 1) * XS_FRAG_UINT4;
#pragma unroll
        for (int j = 0; j < CS; j++) {
            const int s = c * CS + j;
            if (s >= n_steps) break;
            mma_copy_wait<XS_STAGES - 2>(); /* step s has landed */
            const int slot = s % XS_STAGES;
            const uint4 a[2] = {ring[(slot * 2 + 0) * 32 + lane], ring[(slot * 2 + 1) * 32 + lane]};
            /* refills the slot read in the previous step (its values are in registers) */
            if (s + XS_STAGES - 1 < n_steps)
                xs_ring_copy(ring, wr, (s + XS_STAGES - 1) % XS_STAGES, s + XS_STAGES - 1, lane);
            mma_copy_commit();
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 h = fc[((j * NT + nt) * 2 + 0) * 32 + lane];
                const uint32_t bh[4] = {h.x, h.y, h.z, h.w};
                if constexpr (XM == X_SPLIT) {
                    const uint4 l = fc[((j * NT + nt) * 2 + 1) * 32 + lane];
                    const uint32_t bl[4] = {l.x, l.y, l.z, l.w};
                    mma_tile(acc[nt], a, bh, bl);
                } else {
                    mma_tile_hi(acc[nt], a, bh);
                }
            }
        }
    }
    mma_copy_wait<0>();
    __syncthreads(); /* the rings are free for the partial sums */

    /* C fragment: c0,c1 -> (out g, x rows nt*8+2t+{0,1}); c2,c3 -> out g+8; partials
     * as [o][n], row stride PR. x^2: one partial per thread (its item's row), added
     * up per row in thread order (deterministic). */
    float *const part = (float *)xs_dyn, *const item_ss = part + XS_OUT * PR;
    const int g = lane >> 2, t = lane & 3, ow = warp * 16 + g;
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int n = nt * 8 + 2 * t;
        part[ow * PR + n] = acc[nt][0];
        part[ow * PR + n + 1] = acc[nt][1];
        part[(ow + 8) * PR + n] = acc[nt][2];
        part[(ow + 8) * PR + n + 1] = acc[nt][3];
    }
    if (NORM) {
        item_ss[threadIdx.x] = ss;
        __syncthreads();
        if (threadIdx.x < ROWS) { /* row nt * 8 + g: the items (j, nt, lanes 4g..4g+3) */
            const int nt = threadIdx.x / 8, gr = threadIdx.x % 8;
            float v = 0.0f;
            for (int j = 0; j < CS; j++)
                for (int tt = 0; tt < 4; tt++)
                    v += item_ss[(j * NT + nt) * 32 + gr * 4 + tt];
            block_ss[threadIdx.x] = v;
        }
    }
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync(); /* every block's partials are complete */
    if (threadIdx.x < ROWS)
        row_scale[threadIdx.x] = NORM ? mma_cluster_norm_scale(cluster, block_ss, ks, threadIdx.x, in, eps) : 1.0f;
    __syncthreads();
    /* The ks blocks share the group's outputs out (interleaved); consecutive threads
     * take consecutive outputs of one row (coalesced stores). */
    if constexpr (EPI == CUDA_GEMV_SWIGLU) {
        for (int i = threadIdx.x + rank * XS_THREADS; i < XS_OUT / 2 * ROWS; i += XS_THREADS * ks) {
            const int n = i / (XS_OUT / 2), jp = i % (XS_OUT / 2);
            float gs = 0.0f, us = 0.0f;
            for (int r = 0; r < ks; r++) {
                const float *pr = cluster.map_shared_rank(part, r);
                gs += pr[2 * jp * PR + n];
                us += pr[(2 * jp + 1) * PR + n];
            }
            if (o0 + 2 * jp + 1 < out && n < n_rows)
                y[(size_t)n * (out / 2) + o0 / 2 + jp] = silu_mul1(gs * row_scale[n], us * row_scale[n]);
        }
    } else {
        for (int i = threadIdx.x + rank * XS_THREADS; i < XS_OUT * ROWS; i += XS_THREADS * ks) {
            const int n = i / XS_OUT, o = i % XS_OUT;
            float s = 0.0f;
            for (int r = 0; r < ks; r++)
                s += cluster.map_shared_rank(part, r)[o * PR + n];
            s *= row_scale[n];
            if (o0 + o < out && n < n_rows) {
                float *yo = y + (size_t)n * out + o0 + o;
                *yo = EPI == CUDA_GEMV_ADD ? __fadd_rn(*yo, s) : s;
            }
        }
    }
    cluster.sync(); /* keep this block's partials alive until every rank has read them */
}

/* The kernel's shared memory is past the 48 KiB a launch gets unasked. */
template <int NT, int EPI, bool NORM, int XM> static void xs_allow_smem(void)
{
    static bool done; /* every thread sets the same value: the race is benign */
    if (!done) {
        (void)cudaFuncSetAttribute(gemv_xs_kernel<NT, EPI, NORM, XM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   XS_SMEM_BYTES);
        done = true;
    }
}

/* Clusters of ks blocks that fit on the GPU at once (cached). One instantiation
 * stands for all: they share the shared memory size and the launch bounds. */
static int xs_resident_clusters(int ks)
{
    static int cache[XS_MAX_CLUSTER + 1];
    if (!cache[ks]) {
        xs_allow_smem<2, CUDA_GEMV_STORE, false, X_SPLIT>();
        cache[ks] = cuda_resident_clusters_y(gemv_xs_kernel<2, CUDA_GEMV_STORE, false, X_SPLIT>, XS_THREADS,
                                             XS_SMEM_BYTES, ks);
    }
    return cache[ks];
}

/* The largest k split whose grid still fits on the GPU at once (one wave: a second
 * wave of a few blocks streams at a fraction of the rate); none where the output
 * groups alone fill it. Each block keeps at least one k step. */
static int xs_plan(int out, int steps)
{
    const int groups = (out + XS_OUT - 1) / XS_OUT;
    int ks = 1;
    for (int k = 2; k <= XS_MAX_CLUSTER && k <= steps; k++)
        if (groups <= xs_resident_clusters(k)) ks = k;
    return ks;
}

template <int NT, int EPI, bool NORM, int XM>
static int xs_launch(const struct cuda_gemv_fused &g, int ks, cudaStream_t st)
{
    const int groups = (g.out + XS_OUT - 1) / XS_OUT;
    xs_allow_smem<NT, EPI, NORM, XM>();
    return launch_ex("cudaLaunchKernelEx(gemv_xs_kernel)", gemv_xs_kernel<NT, EPI, NORM, XM>,
                     dim3((unsigned)groups, (unsigned)ks), dim3(XS_THREADS), XS_SMEM_BYTES, st, ks, true, g.y, g.x, g.w,
                     g.n_rows, g.in, g.out, ks, g.norm_w, g.eps);
}

template <int NT> static int xs_launch_variant(const struct cuda_gemv_fused &g, int ks, cudaStream_t st)
{
    return gemv_mma_dispatch(g.epi, g.norm_w != NULL, gemv_x_round(g.n_rows), [&](auto e, auto norm, auto xm) {
        return xs_launch<NT, decltype(e)::value, decltype(norm)::value, decltype(xm)::value>(g, ks, st);
    });
}

/* cuda_ops_gemv_set_xs: 0 = per row count, 1 = every tensor-core row count, 2 = never. */
static int xs_setting;

extern "C" int cuda_ops_gemv_set_xs(int mode)
{
    if (mode < 0 || mode > 2)
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_set_xs: %d: expected 0 (per row count), 1 (always), 2 (never)", mode);
    __atomic_store_n(&xs_setting, mode, __ATOMIC_RELAXED);
    return 0;
}

/* With x split, this kernel wins where the output groups fill the GPU with at most 2
 * blocks per group and loses where they need clusters of 5-8 (their merge costs more
 * than x's re-reads); with x rounded to bf16 (gemv_x_round) gemv_mma.cu's register path
 * wins or ties at 16 rows too, so there this kernel serves 17-32 rows only
 * (mm3-bench-ops; docs/performance.md). */
enum { XS_SERVE_MAX_SPLIT = 2 };

int gemv_xs_plan(int n_rows, int in, int out)
{
    const int m = __atomic_load_n(&xs_setting, __ATOMIC_RELAXED);
    if (m == 2 || (m == 0 && (n_rows <= 8 || (n_rows <= 16 && gemv_x_round(n_rows))))) return 0;
    const int ks = xs_plan(out, in / MMA_KSTEP);
    return m == 1 || ks <= XS_SERVE_MAX_SPLIT ? ks : 0;
}

/* The caller (gemv_mma_launch) has checked rows, in % 32, alignment and the epilogue. */
int gemv_xs_launch(const struct cuda_gemv_fused *g, int ks, cudaStream_t st)
{
    if (g->n_rows <= 8) return xs_launch_variant<1>(*g, ks, st);
    if (g->n_rows <= 16) return xs_launch_variant<2>(*g, ks, st);
    return xs_launch_variant<4>(*g, ks, st);
}
