/* Decode attention's pass 1 on the tensor cores (bf16 caches, head_dim 64 or 128).
 *
 * The CUDA-core kernel (attention_decode.cu) spends per position and query head a
 * 32-lane shuffle reduction and an exp on every lane: at 16 sequences it is bound by
 * those instructions, not by the K/V stream (about three times its reads' time;
 * docs/performance.md). Here a warp takes 16 positions per step and does the products with
 * mma.sync m16n8k16 (as flash attention does): S = Q K^T, then O += P V.
 *
 * The 16 rows of the A operand are the kv head's query heads (up to 8) in bf16 hi
 * parts, then the same heads' lo parts (q - hi): the two halves of the accumulator
 * add up to a float32-accurate product, and the padding rows of a 4-head group cost
 * nothing extra. P is split the same way for O += P V.
 *
 * Operands come straight from global memory, no shared memory staging:
 * - K (B operand of S, k = head dims): lane (g, t) loads 8 consecutive dims of its
 *   position's row per 32-dim chunk (16 bytes); the dot product does not care in
 *   which order dims are visited, so Q's A fragments use the same permutation.
 * - V (B operand of O += P V, k = positions, n = dims): the output dims of n-tile
 *   8b + i are 64b + 8n + i, so lane (g, t) needs dims 64b + 8g .. +7 of positions
 *   2t, 2t+1, 2t+8, 2t+9: 16-byte loads again, regrouped with byte permutes. The
 *   accumulator then holds dims 64b + 16t .. +15 of its row.
 * The next step's K is in flight during the softmax and O += P V, the next V during
 * S = Q K^T. */
#include <stdint.h>

#include "common/cuda/attention_decode.cuh"
#include "common/cuda/mma_bf16.cuh"
#include "common/cuda/ops_cuda.h"
#include "common/cuda/pdl.cuh"

enum { MMA_ATT_POS = 16, MMA_ATT_ROWS = 8 }; /* positions per warp step; query heads per kv head */

/* Coherent 16-byte load: the fused variant's owner block reads back the row it has
 * just stored, so no read-only (non-coherent) path. */
__device__ __forceinline__ uint4 att_ld(const uint16_t *p)
{
    return __ldcg((const uint4 *)p);
}

template <int HD> struct att_mma_tiles {
    static constexpr int KC = HD / 32; /* K: 32-dim chunks, one 16-byte load each */
    static constexpr int VB = HD / 64; /* V: 64-dim blocks, one 16-byte load each */
    uint4 k[2][KC];                    /* positions j + 8 nt + g */
    uint4 v[4][VB];                    /* positions j + 2t + {0, 1, 8, 9} */
};

/* The cache row a lane's K fragment nt / V fragment i holds at step j: rows past je
 * re-read row j (always valid; masked out of the softmax). att_load_k / att_load_v read
 * them, att_patch_new_row finds the new position's among them. */
__device__ __forceinline__ int att_k_row(int j, int je, int nt, int g)
{
    const int p = j + 8 * nt + g;
    return p < je ? p : j;
}

__device__ __forceinline__ int att_v_row(int j, int je, int i, int t)
{
    const int p = j + 2 * t + (i & 1) + (i >> 1) * 8;
    return p < je ? p : j;
}

template <int HD>
__device__ __forceinline__ void att_load_k(att_mma_tiles<HD> &r, const uint16_t *k, size_t kv_off, size_t row_stride,
                                           int j, int je, int g, int t)
{
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        const uint16_t *row = k + kv_off + (size_t)att_k_row(j, je, nt, g) * row_stride + 8 * t;
#pragma unroll
        for (int c = 0; c < att_mma_tiles<HD>::KC; c++)
            r.k[nt][c] = att_ld(row + 32 * c);
    }
}

template <int HD>
__device__ __forceinline__ void att_load_v(att_mma_tiles<HD> &r, const uint16_t *v, size_t kv_off, size_t row_stride,
                                           int j, int je, int g, int t)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint16_t *row = v + kv_off + (size_t)att_v_row(j, je, i, t) * row_stride + 8 * g;
#pragma unroll
        for (int b = 0; b < att_mma_tiles<HD>::VB; b++)
            r.v[i][b] = att_ld(row + 64 * b);
    }
}

/* Eight floats that are bf16 values (kv_widen's) as the cache holds them: one uint4. */
__device__ __forceinline__ uint4 att_pack8(const float *x)
{
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; q++)
        w[q] = (__float_as_uint(x[2 * q]) >> 16) | (__float_as_uint(x[2 * q + 1]) & 0xffff0000u);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* The fragments of the rows att_load_k / att_load_v read at step j that are the new
 * position's, from its k and v as this block stored them (sk, sv): the block that
 * holds pnew loads its chunk before the store, with the others, and patches it here. */
template <int HD>
__device__ __forceinline__ void att_patch_new_row(att_mma_tiles<HD> &r, const float *sk, const float *sv, int j, int je,
                                                  int pnew, int g, int t)
{
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
        if (att_k_row(j, je, nt, g) == pnew)
#pragma unroll
            for (int c = 0; c < att_mma_tiles<HD>::KC; c++)
                r.k[nt][c] = att_pack8(sk + 32 * c + 8 * t);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (att_v_row(j, je, i, t) == pnew)
#pragma unroll
            for (int b = 0; b < att_mma_tiles<HD>::VB; b++)
                r.v[i][b] = att_pack8(sv + 64 * b + 8 * g);
}

/* Word w (0..3) of a uint4. */
__device__ __forceinline__ uint32_t u4w(const uint4 &u, int w)
{
    return w == 0 ? u.x : w == 1 ? u.y : w == 2 ? u.z : u.w;
}

template <int HD, bool FUSE>
__global__ void __launch_bounds__(ATT_WARPS * 32, 2)
    attn_split_mma_kernel(float *__restrict__ part, const float *__restrict__ q, size_t q_stride, const uint16_t *k,
                          const uint16_t *v, const int *__restrict__ kv_len, const int *__restrict__ seq_row,
                          size_t seq_stride, size_t row_stride, int n_heads, int group, float scale, int n_split,
                          int chunk, att_fuse f)
{
    pdl_launch_dependents();
    /* Decode (FUSE): every index below comes from the host (kv_len, pos,
     * seq_row are copied in before the step), the cache rows read before this
     * kernel's own store hold earlier forwards' K/V, and the host waits for each
     * forward (talker_cuda.c's stream sync, or frame_cuda_decode_pairs' wait for the
     * sampling step queued after it) before it queues the next: those rows
     * are complete even where a chain of early-started kernels is still running. So
     * the first K/V step and the RoPE table are under way while the QKV product
     * finishes. A prefill's K/V were stored by the kernel just before: wait first.
     * (The depth decoder cannot do the same: its earlier positions come from the
     * same graph, with no sync in between.) */
    if constexpr (!FUSE) pdl_wait();
    constexpr int KC = HD / 32, VB = HD / 64, G = MMA_ATT_ROWS;
    __shared__ float sm_acc[ATT_WARPS][G][HD];
    __shared__ float sm_m[ATT_WARPS][G], sm_l[ATT_WARPS][G];
    __shared__ float sq[FUSE ? G : 1][FUSE ? HD : 1], sk[FUSE ? HD : 1], sv[FUSE ? HD : 1];
    __shared__ float rope_cs[FUSE ? HD / 2 : 1], rope_sn[FUSE ? HD / 2 : 1], nq[FUSE ? HD : 1], nk[FUSE ? HD : 1];
    const int split = blockIdx.x, hk = blockIdx.y, s = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int len = kv_len[s];
    int c = chunk; /* 0: this sequence's length cut into the n_split chunks */
    if (c == 0) c = ((len + n_split - 1) / n_split + MMA_ATT_POS - 1) / MMA_ATT_POS * MMA_ATT_POS;
    const int j0 = split * c, j1 = min(j0 + c, len);
    const size_t seq_off = (size_t)(seq_row ? seq_row[s] : s) * seq_stride + (size_t)hk * HD;
    /* FUSE: the block whose chunk holds the new position stores its k/v and takes that
     * row from shared memory, its other rows loaded early as everywhere (one round trip
     * fewer after the wait for the block that finishes last); split 0 stores a padding
     * token's. */
    const int pnew = FUSE ? f.pos[s] : -1;
    const bool mine = FUSE && pnew >= j0 && pnew < j1;
    const bool store = mine || (FUSE && split == 0 && pnew >= len);

    att_mma_tiles<HD> r;
    int j = j0 + warp * MMA_ATT_POS;
    if (j < j1) {
        att_load_k<HD>(r, k, seq_off, row_stride, j, j1, g, t);
        att_load_v<HD>(r, v, seq_off, row_stride, j, j1, g, t);
    }
    if constexpr (FUSE) {
        const bool prep = j0 < len || store;
        /* The tables read nothing an earlier kernel writes: before the wait either way. */
        if (prep) att_prologue_tables<HD>(rope_cs, rope_sn, nq, nk, f, (float)pnew);
        pdl_wait();
        if (prep)
            att_prepare<uint16_t, HD, G>(sq, sk, sv, rope_cs, rope_sn, nq, nk, q + (size_t)s * q_stride, hk, group,
                                         store, f, seq_off + (size_t)pnew * row_stride);
    }
    if constexpr (FUSE)
        if (mine && j < j1) att_patch_new_row<HD>(r, sk, sv, j, j1, pnew, g, t);

    /* Q fragments, the softmax scale folded in: chunk cc, half h (dims 8t + 4h ..
     * + 3 of the chunk): rows g (hi) and g + 8 (lo) of head g. */
    uint32_t qa[KC][2][4];
    {
        const bool valid = g < group;
        const float *qh =
            FUSE ? &sq[valid ? g : 0][0] : q + (size_t)s * q_stride + (size_t)(hk * group + (valid ? g : 0)) * HD;
#pragma unroll
        for (int cc = 0; cc < KC; cc++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float x[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    x[e] = valid ? qh[32 * cc + 8 * t + 4 * h + e] * scale : 0.0f;
                split_pair(x[0], x[1], &qa[cc][h][0], &qa[cc][h][1]);
                split_pair(x[2], x[3], &qa[cc][h][2], &qa[cc][h][3]);
            }
    }

    float acc[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[n][e] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    for (; j < j1; j += ATT_WARPS * MMA_ATT_POS) {
        float sc[2][4] = {};
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int cc = 0; cc < KC; cc++) {
                mma_bf16(sc[nt], qa[cc][0][0], qa[cc][0][1], qa[cc][0][2], qa[cc][0][3], r.k[nt][cc].x, r.k[nt][cc].y);
                mma_bf16(sc[nt], qa[cc][1][0], qa[cc][1][1], qa[cc][1][2], qa[cc][1][3], r.k[nt][cc].z, r.k[nt][cc].w);
            }
        const int jn = j + ATT_WARPS * MMA_ATT_POS;
        if (jn < j1) att_load_k<HD>(r, k, seq_off, row_stride, jn, j1, g, t);

        /* Row g's scores at positions j + 2t, +1, j + 8 + 2t, +1: hi + lo halves. */
        float p[4];
        p[0] = j + 2 * t < j1 ? sc[0][0] + sc[0][2] : -INFINITY;
        p[1] = j + 2 * t + 1 < j1 ? sc[0][1] + sc[0][3] : -INFINITY;
        p[2] = j + 8 + 2 * t < j1 ? sc[1][0] + sc[1][2] : -INFINITY;
        p[3] = j + 9 + 2 * t < j1 ? sc[1][1] + sc[1][3] : -INFINITY;
        float mx = fmaxf(fmaxf(p[0], p[1]), fmaxf(p[2], p[3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(mx, m); /* finite: position j is valid */
        const float corr = expf(m - mx);
        m = mx;
        l *= corr;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            p[e] = expf(p[e] - mx);
            l += p[e];
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[n][e] *= corr;
        uint32_t pa[4];
        split_pair(p[0], p[1], &pa[0], &pa[1]);
        split_pair(p[2], p[3], &pa[2], &pa[3]);
#pragma unroll
        for (int b = 0; b < VB; b++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const uint32_t sel = (i & 1) ? 0x7632u : 0x5410u;
                const uint32_t b0 = __byte_perm(u4w(r.v[0][b], i >> 1), u4w(r.v[1][b], i >> 1), sel);
                const uint32_t b1 = __byte_perm(u4w(r.v[2][b], i >> 1), u4w(r.v[3][b], i >> 1), sel);
                mma_bf16(acc[8 * b + i], pa[0], pa[1], pa[2], pa[3], b0, b1);
            }
        if (jn < j1) att_load_v<HD>(r, v, seq_off, row_stride, jn, j1, g, t);
    }

    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (g < group) {
#pragma unroll
        for (int b = 0; b < VB; b++)
#pragma unroll
            for (int i = 0; i < 8; i++) {
                sm_acc[warp][g][64 * b + 16 * t + i] = acc[8 * b + i][0] + acc[8 * b + i][2];
                sm_acc[warp][g][64 * b + 16 * t + 8 + i] = acc[8 * b + i][1] + acc[8 * b + i][3];
            }
        if (t == 0) {
            sm_m[warp][g] = m;
            sm_l[warp][g] = l;
        }
    }
    __syncthreads();
    att_write_partial<HD, G>(part, sm_acc, sm_m, sm_l, group, n_heads, n_split);
}

bool att_mma_fits(bool bf16_cache, int head_dim, int group)
{
    return bf16_cache && (head_dim == 64 || head_dim == 128) && group <= MMA_ATT_ROWS;
}

template <int HD, bool FUSE> static int att_mma_occupancy(void)
{
    static int n; /* benign race: every thread computes the same value */
    if (!n) {
        int b = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, attn_split_mma_kernel<HD, FUSE>, ATT_WARPS * 32, 0) !=
                cudaSuccess ||
            b < 1) {
            (void)cudaGetLastError();
            b = 1;
        }
        n = b;
    }
    return n;
}

int att_mma_blocks_per_sm(int head_dim, bool prep)
{
    if (head_dim == 64) return prep ? att_mma_occupancy<64, true>() : att_mma_occupancy<64, false>();
    return prep ? att_mma_occupancy<128, true>() : att_mma_occupancy<128, false>();
}

template <int HD, bool FUSE> static int att_mma_go(const att_args &a, dim3 grid, cudaStream_t st)
{
    return launch_pdl(FUSE ? "attn_split_mma_kernel (qkv)" : "attn_split_mma_kernel", attn_split_mma_kernel<HD, FUSE>,
                      grid, ATT_WARPS * 32, 0, st, a.part, a.q, a.q_stride, (const uint16_t *)a.k,
                      (const uint16_t *)a.v, a.kv_len, a.seq_row, a.seq_stride, a.row_stride, a.n_heads, a.group,
                      a.scale, a.n_split, a.chunk, a.fuse);
}

int att_mma_launch(const att_args &a, int head_dim, dim3 grid, cudaStream_t st)
{
    if (head_dim == 64) return a.prep ? att_mma_go<64, true>(a, grid, st) : att_mma_go<64, false>(a, grid, st);
    return a.prep ? att_mma_go<128, true>(a, grid, st) : att_mma_go<128, false>(a, grid, st);
}
