/* Decode attention over a KV cache: one query row per sequence, GQA, split-K.
 *
 * Pass 1: block (chunk, kv head, sequence) of 4 warps streams `chunk` positions of
 * its kv head once for all `group` query heads that share it. Each lane owns E =
 * head_dim/32 consecutive dims, so a warp reads whole rows with vector loads; a
 * warp takes POS positions per step (loads first, then the reductions) and keeps
 * an online softmax (running max m, sum l, acc). The 4 warps merge in shared
 * memory and write (acc[head_dim], m, l) for the chunk.
 * Pass 2: one block per (query head, sequence) merges the chunks (log-sum-exp).
 * With bf16 caches and head_dim 64 or 128 (the talker's), pass 1 runs on the tensor
 * cores instead (attention_decode_mma.cu): this kernel is bound by its shuffles and
 * exps there, and takes nearly twice as long (docs/performance.md).
 *
 * The fused variant (cuda_ops_attention_decode_qkv) takes the new token's q/k/v as
 * the QKV product left them: each block norms and rotates its q heads itself, the
 * block whose chunk holds the new position also its k head, stores k and v in the
 * cache and uses them from shared memory (no block reads that position from the
 * cache, so the store races with nothing). One launch per layer fewer. (Merging the
 * splits in the last block of each kv head instead of pass 2 was slower: one block
 * walks what pass 2 spreads over `group` blocks.) */
#include <math.h>
#include <stdint.h>

#include "common/cuda/attention_decode.cuh"
#include "common/cuda/cuda_internal.h"
#include "common/cuda/kv_elem.cuh"
#include "common/cuda/ops_cuda.h"
#include "common/cuda/pdl.cuh"

/* One lane's E elements of a cache row, as stored (bf16 bits or float): kept packed
 * while in flight so that more rows fit in registers, widened when used. */
template <typename KT, int E> struct kv_raw {
    KT e[E];
};

template <typename KT, int E> __device__ __forceinline__ void raw_load(kv_raw<KT, E> &r, const KT *p)
{
    constexpr int BYTES = E * (int)sizeof(KT);
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int i = 0; i < BYTES / 16; i++)
            ((uint4 *)r.e)[i] = ((const uint4 *)p)[i];
    } else if constexpr (BYTES == 8) {
        *(uint2 *)r.e = *(const uint2 *)p;
    } else if constexpr (BYTES == 4) {
        *(uint32_t *)r.e = *(const uint32_t *)p;
    } else {
#pragma unroll
        for (int i = 0; i < E; i++)
            r.e[i] = p[i];
    }
}

/* POS rows of K and V from position j on; rows past j1 re-read row j (masked later). */
template <typename KT, int E, int POS>
__device__ __forceinline__ void load_rows(const KT *k, const KT *v, size_t kv_off, size_t row_stride, int j, int j1,
                                          kv_raw<KT, E> *kr, kv_raw<KT, E> *vr)
{
#pragma unroll
    for (int p = 0; p < POS; p++) {
        const size_t off = kv_off + (size_t)(j + p < j1 ? j + p : j) * row_stride;
        raw_load<KT, E>(kr[p], k + off);
        raw_load<KT, E>(vr[p], v + off);
    }
}

/* 3 blocks per SM for the talker's heads (bf16 KV, E 4, G 4) and those no wider: the
 * fused prologue had pushed its instance past the registers of 3 blocks per SM, and
 * the drop to 2 slowed long contexts markedly. Other instances would spill under that
 * cap. */
template <typename KT, int E, int G, bool FUSE>
__global__ void __launch_bounds__(ATT_WARPS * 32, (sizeof(KT) == 2 && E >= 4 && E * G <= 16) ? 3 : 1)
    attn_split_kernel(float *__restrict__ part, const float *__restrict__ q, size_t q_stride, const KT *__restrict__ k,
                      const KT *__restrict__ v, const int *__restrict__ kv_len, const int *__restrict__ seq_row,
                      size_t seq_stride, size_t row_stride, int n_heads, int group, float scale, int n_split, int chunk,
                      att_fuse f)
{
    pdl_launch_dependents();
    pdl_wait();
    constexpr int HD = 32 * E;
    /* Rows per warp step: more in flight for narrow heads, bounded registers for wide. */
    constexpr int POS = E <= 4 ? 8 : 4;
    __shared__ float sm_acc[ATT_WARPS][G][HD];
    __shared__ float sm_m[ATT_WARPS][G], sm_l[ATT_WARPS][G];
    __shared__ float sq[FUSE ? G : 1][FUSE ? HD : 1], sk[FUSE ? HD : 1], sv[FUSE ? HD : 1];
    __shared__ float rope_cs[FUSE ? HD / 2 : 1], rope_sn[FUSE ? HD / 2 : 1], nq[FUSE ? HD : 1], nk[FUSE ? HD : 1];
    const int split = blockIdx.x, g = blockIdx.y, s = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int len = kv_len[s];
    /* chunk 0: cut this sequence's own length into the n_split chunks (a graph is
     * planned for the longest context it may see; a short one still gets every split). */
    int c = chunk;
    if (c == 0) c = ((len + n_split - 1) / n_split + ATT_CHUNK_ALIGN - 1) / ATT_CHUNK_ALIGN * ATT_CHUNK_ALIGN;
    const int j0 = split * c;
    const int j1 = min(j0 + c, len);
    const size_t seq_off = (size_t)(seq_row ? seq_row[s] : s) * seq_stride + (size_t)g * HD;
    const size_t kv_off = seq_off + (size_t)lane * E;
    /* FUSE: the new position is this block's when its chunk holds it (then it is the
     * chunk's last, kv_len - 1), or split 0's when it is not attended (padding). */
    const int pnew = FUSE ? f.pos[s] : -1;
    const bool mine = FUSE && pnew >= j0 && pnew < j1;
    const int je = mine ? pnew : j1; /* rows read from the cache: [j0, je) */

    /* Software pipeline: the next POS rows of K and V are in flight while the
     * current ones are reduced (the first ones during the fused prologue). */
    kv_raw<KT, E> kf[POS], vf[POS], kn[POS], vn[POS];
    const int step = ATT_WARPS * POS;
    int j = j0 + warp * POS;
    if (j < je) load_rows<KT, E, POS>(k, v, kv_off, row_stride, j, je, kn, vn);
    const bool store = mine || (FUSE && split == 0 && pnew >= len);
    if constexpr (FUSE)
        if (j0 < len || store) { /* an empty chunk needs no q */
            att_prologue_tables<HD>(rope_cs, rope_sn, nq, nk, f, (float)pnew);
            att_prepare<KT, HD, G>(sq, sk, sv, rope_cs, rope_sn, nq, nk, q + (size_t)s * q_stride, g, group, store, f,
                                   seq_off + (size_t)pnew * row_stride);
        }

    float qv[G][E], acc[G][E], m[G], l[G];
#pragma unroll
    for (int gi = 0; gi < G; gi++) {
        const int h = g * group + (gi < group ? gi : 0);
        const float *qh = q + (size_t)s * q_stride + (size_t)h * HD + lane * E;
#pragma unroll
        for (int e = 0; e < E; e++) {
            qv[gi][e] = FUSE ? sq[gi < group ? gi : 0][lane * E + e] : qh[e];
            acc[gi][e] = 0.0f;
        }
        m[gi] = -INFINITY;
        l[gi] = 0.0f;
    }

    for (; j < je; j += step) {
#pragma unroll
        for (int p = 0; p < POS; p++) {
            kf[p] = kn[p];
            vf[p] = vn[p];
        }
        if (j + step < je) load_rows<KT, E, POS>(k, v, kv_off, row_stride, j + step, je, kn, vn);
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            float sc[POS];
            float mx = m[gi];
#pragma unroll
            for (int p = 0; p < POS; p++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++)
                    d = fmaf(qv[gi][e], kv_widen(kf[p].e[e]), d);
#pragma unroll
                for (int off = 16; off > 0; off >>= 1)
                    d += __shfl_xor_sync(0xffffffffu, d, off);
                sc[p] = j + p < je ? d * scale : -INFINITY;
                mx = fmaxf(mx, sc[p]);
            }
            /* mx is finite: position j is always valid. */
            const float corr = expf(m[gi] - mx);
            float lsum = l[gi] * corr;
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[gi][e] *= corr;
#pragma unroll
            for (int p = 0; p < POS; p++) {
                const float pe = expf(sc[p] - mx);
                lsum += pe;
#pragma unroll
                for (int e = 0; e < E; e++)
                    acc[gi][e] = fmaf(pe, kv_widen(vf[p].e[e]), acc[gi][e]);
            }
            m[gi] = mx;
            l[gi] = lsum;
        }
    }

    if (FUSE && mine && warp == 0) /* the new position, from shared memory */
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++)
                d = fmaf(qv[gi][e], sk[lane * E + e], d);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                d += __shfl_xor_sync(0xffffffffu, d, off);
            const float sc = d * scale, mx = fmaxf(m[gi], sc);
            const float corr = expf(m[gi] - mx), pe = expf(sc - mx);
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[gi][e] = fmaf(pe, sv[lane * E + e], acc[gi][e] * corr);
            l[gi] = l[gi] * corr + pe;
            m[gi] = mx;
        }

#pragma unroll
    for (int gi = 0; gi < G; gi++) {
#pragma unroll
        for (int e = 0; e < E; e++)
            sm_acc[warp][gi][lane * E + e] = acc[gi][e];
        if (lane == 0) {
            sm_m[warp][gi] = m[gi];
            sm_l[warp][gi] = l[gi];
        }
    }
    __syncthreads();
    att_write_partial<HD, G>(part, sm_acc, sm_m, sm_l, group, n_heads, n_split);
}

/* Block (query head, sequence), one thread per dim. */
__global__ void attn_combine_kernel(float *__restrict__ out, const float *__restrict__ part, int n_heads, int head_dim,
                                    int n_split)
{
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, s = blockIdx.y;
    const float *ph = part + ((size_t)s * n_heads + h) * n_split * (head_dim + 2);
    float mx = -INFINITY;
    for (int i = 0; i < n_split; i++)
        mx = fmaxf(mx, ph[(size_t)i * (head_dim + 2) + head_dim]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f, ls = 0.0f;
        if (mx != -INFINITY) {
            for (int i = 0; i < n_split; i++) {
                const float *pi = ph + (size_t)i * (head_dim + 2);
                const float f = expf(pi[head_dim] - mx);
                a = fmaf(f, pi[d], a);
                ls = fmaf(f, pi[head_dim + 1], ls);
            }
        }
        out[((size_t)s * n_heads + h) * head_dim + d] = ls > 0.0f ? a / ls : 0.0f;
    }
}

/* The same merge in one round of L2 loads, where attn_combine_kernel's loops take one
 * per 4 splits and operand: every thread first issues its dim's loads of up to 16
 * splits and warp 0 those of every split's (max, sum), all before any is used; warp 0
 * leaves each split's weight expf(m_i - max) and sum in shared memory, lane 0 the
 * weighted sum of the sums. The same operations in the same order as
 * attn_combine_kernel: the same bits. */
enum { ATT_COMBINE_BATCH = 16 };
__global__ void attn_combine_staged_kernel(float *__restrict__ out, const float *__restrict__ part, int n_heads,
                                           int head_dim, int n_split)
{
    extern __shared__ float w[]; /* [2 n_split + 1]: weights, sums, then the sum of the sums */
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, s = blockIdx.y, lane = threadIdx.x & 31;
    const size_t stride = (size_t)head_dim + 2;
    const float *ph = part + ((size_t)s * n_heads + h) * n_split * stride;
    const int d = threadIdx.x; /* launched with head_dim threads: one dim each */
    float v[ATT_COMBINE_BATCH];
#pragma unroll
    for (int u = 0; u < ATT_COMBINE_BATCH; u++)
        v[u] = u < n_split ? __ldcg(ph + u * stride + d) : 0.0f;
    if (threadIdx.x < 32) {
        /* lane i < 32: split i's (max, sum) in registers; more splits are read again below */
        const float m_own = lane < n_split ? __ldcg(ph + lane * stride + head_dim) : -INFINITY;
        const float s_own = lane < n_split ? __ldcg(ph + lane * stride + head_dim + 1) : 0.0f;
        float mx = m_own;
        for (int i = lane + 32; i < n_split; i += 32)
            mx = fmaxf(mx, __ldcg(ph + i * stride + head_dim));
        for (int off = 16; off > 0; off >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        for (int i = lane; i < n_split; i += 32) {
            const float mi = i < 32 ? m_own : __ldcg(ph + i * stride + head_dim);
            w[i] = mx == -INFINITY ? 0.0f : expf(mi - mx);
            w[n_split + i] = i < 32 ? s_own : __ldcg(ph + i * stride + head_dim + 1);
        }
        __syncwarp();
        if (lane == 0) {
            float ls = 0.0f;
            for (int i = 0; i < n_split && mx != -INFINITY; i++)
                ls = fmaf(w[i], w[n_split + i], ls);
            w[2 * n_split] = ls;
        }
    }
    __syncthreads();
    /* ls > 0 exactly when some split saw a position: its max contributes exp(0) >= 1. */
    const float ls = w[2 * n_split];
    float a = 0.0f;
    for (int i0 = 0; ls > 0.0f && i0 < n_split; i0 += ATT_COMBINE_BATCH) {
        if (i0 > 0) /* more than a batch of splits: the next batch (the first is in v already) */
#pragma unroll
            for (int u = 0; u < ATT_COMBINE_BATCH; u++)
                v[u] = i0 + u < n_split ? __ldcg(ph + (i0 + u) * stride + d) : 0.0f;
#pragma unroll
        for (int u = 0; u < ATT_COMBINE_BATCH; u++)
            if (i0 + u < n_split) a = fmaf(w[i0 + u], v[u], a);
    }
    out[((size_t)s * n_heads + h) * head_dim + d] = ls > 0.0f ? a / ls : 0.0f;
}

template <typename KT, int E, int G> static int att_launch(const att_args &a, dim3 grid, cudaStream_t st)
{
    if (a.prep)
        return launch_pdl("attn_split_kernel (qkv)", attn_split_kernel<KT, E, G, true>, grid, ATT_WARPS * 32, 0, st,
                          a.part, a.q, a.q_stride, (const KT *)a.k, (const KT *)a.v, a.kv_len, a.seq_row, a.seq_stride,
                          a.row_stride, a.n_heads, a.group, a.scale, a.n_split, a.chunk, a.fuse);
    return launch_pdl("attn_split_kernel", attn_split_kernel<KT, E, G, false>, grid, ATT_WARPS * 32, 0, st, a.part, a.q,
                      a.q_stride, (const KT *)a.k, (const KT *)a.v, a.kv_len, a.seq_row, a.seq_stride, a.row_stride,
                      a.n_heads, a.group, a.scale, a.n_split, a.chunk, a.fuse);
}

template <typename KT, int E> static int att_launch_g(const att_args &a, dim3 grid, cudaStream_t st)
{
    if (a.group <= 1) return att_launch<KT, E, 1>(a, grid, st);
    if (a.group <= 2) return att_launch<KT, E, 2>(a, grid, st);
    if (a.group <= 4) return att_launch<KT, E, 4>(a, grid, st);
    return att_launch<KT, E, 8>(a, grid, st);
}

template <typename KT> static int att_launch_e(const att_args &a, int head_dim, dim3 grid, cudaStream_t st)
{
    switch (head_dim) {
    case 32:
        return att_launch_g<KT, 1>(a, grid, st);
    case 64:
        return att_launch_g<KT, 2>(a, grid, st);
    case 128:
        return att_launch_g<KT, 4>(a, grid, st);
    case 256:
        return att_launch_g<KT, 8>(a, grid, st);
    default:
        return mm3_errorf(-EINVAL, "cuda_ops_attention_decode: head_dim %d: expected 32, 64, 128 or 256", head_dim);
    }
}

static int att_sm_count(void)
{
    const int sms = cuda_sm_count();
    return sms > 0 ? sms : 132;
}

/* Chunk so that the grid has about ATT_BLOCKS_PER_SM blocks per SM: few sequences
 * get many splits, many sequences long chunks (fewer partials). */
static void att_plan(int n_seq, int n_kv_heads, int max_kv_len, int chunk_positions, long *chunk_out, int *n_split_out)
{
    const int sms = att_sm_count();
    long pairs = (long)(n_seq > 0 ? n_seq : 1) * n_kv_heads;
    long want_splits = (ATT_BLOCKS_PER_SM * (long)sms + pairs - 1) / pairs;
    long chunk = want_splits > 0 ? ((long)max_kv_len + want_splits - 1) / want_splits : max_kv_len;
    chunk = (chunk + ATT_CHUNK_ALIGN - 1) / ATT_CHUNK_ALIGN * ATT_CHUNK_ALIGN;
    if (chunk < ATT_CHUNK_ALIGN) chunk = ATT_CHUNK_ALIGN;
    if (chunk_positions) chunk = chunk_positions;
    *chunk_out = chunk;
    *n_split_out = max_kv_len > 0 ? (int)((max_kv_len + chunk - 1) / chunk) : 1;
}

/* Which combine kernel merges n_split partials: the staged one above
 * ATT_COMBINE_STAGED_MIN splits, where loading every split's max and sum at once saves
 * more than its extra barrier costs; below, the per-split one (docs/performance.md).
 * cuda_ops_attention_set_combine: 0 = that choice, 1 = never staged, 2 = always. */
enum { ATT_COMBINE_STAGED_MIN = 4 };
static int combine_setting;

extern "C" int cuda_ops_attention_set_combine(int mode)
{
    if (mode < 0 || mode > 2)
        return mm3_errorf(-EINVAL,
                          "cuda_ops_attention_set_combine: %d: expected 0 (per split count), 1 (per split), 2 (staged)",
                          mode);
    __atomic_store_n(&combine_setting, mode, __ATOMIC_RELAXED);
    return 0;
}

static bool att_combine_staged(int n_split)
{
    const int m = __atomic_load_n(&combine_setting, __ATOMIC_RELAXED);
    return m == 2 || (m == 0 && n_split > ATT_COMBINE_STAGED_MIN);
}

/* The tensor-core kernel's split count: one wave of its blocks (it keeps more bytes
 * in flight per block than the CUDA-core kernel, which wants several), each split at
 * least one step of all warps, never more than att_plan's (the workspace is sized by
 * att_plan). */
static int att_mma_splits(int n_seq, int n_kv_heads, int max_kv_len, int plan_splits, int blocks_per_sm)
{
    const int sms = att_sm_count();
    const long pairs = (long)(n_seq > 0 ? n_seq : 1) * n_kv_heads;
    long n = (long)blocks_per_sm * sms / pairs;
    const long most = ((long)max_kv_len + ATT_CHUNK_ALIGN - 1) / ATT_CHUNK_ALIGN;
    if (n > most) n = most;
    if (n > plan_splits) n = plan_splits;
    return n < 1 ? 1 : (int)n;
}

/* Partial results of every (sequence, head, chunk): head_dim accumulators, max, sum. */
static size_t att_part_bytes(int n_seq, int n_heads, int head_dim, int n_split)
{
    return sizeof(float) * (size_t)n_seq * n_heads * n_split * (head_dim + 2);
}

/* prep NULL: the plain kernels (q already normed and rotated, k/v stored); else the
 * fused variant (cuda_ops_attention_decode_qkv). */
static int attention_decode(const struct cuda_attention_decode *d, const struct cuda_qkv_prep *prep, void *stream)
{
    if (!d) return mm3_errorf(-EINVAL, "cuda_ops_attention_decode: NULL arguments");
    const int n_seq = d->n_seq, max_kv_len = d->max_kv_len, chunk_positions = d->chunk_positions;
    const int n_heads = d->heads.n_heads, n_kv_heads = d->heads.n_kv_heads, head_dim = d->heads.head_dim;
    const enum cuda_kv_dtype kv_dtype = d->kv.dtype;
    const void *k_cache = d->kv.k, *v_cache = d->kv.v;
    const size_t seq_stride = d->kv.seq_stride, row_stride = d->kv.row_stride;
    if (chunk_positions < 0 || chunk_positions % ATT_CHUNK_ALIGN)
        return mm3_errorf(-EINVAL, "cuda_ops_attention_decode: chunk %d: expected 0 (auto) or a multiple of %d",
                          chunk_positions, ATT_CHUNK_ALIGN);
    if (n_seq < 0 || n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads || max_kv_len < 0)
        return mm3_errorf(-EINVAL,
                          "cuda_ops_attention_decode: %d sequences, %d heads, %d kv heads, max_kv_len %d: expected "
                          "heads a multiple of kv heads",
                          n_seq, n_heads, n_kv_heads, max_kv_len);
    const int group = n_heads / n_kv_heads;
    if (group > ATT_MAX_GROUP)
        return mm3_errorf(-EINVAL, "cuda_ops_attention_decode: %d query heads per kv head: at most %d", group,
                          ATT_MAX_GROUP);
    if (kv_dtype != CUDA_KV_F32 && kv_dtype != CUDA_KV_BF16)
        return mm3_errorf(-EINVAL, "cuda_ops_attention_decode: kv dtype %d: expected CUDA_KV_F32 or CUDA_KV_BF16",
                          (int)kv_dtype);
    if (head_dim != 32 && head_dim != 64 && head_dim != 128 && head_dim != ATT_MAX_HEAD_DIM)
        return mm3_errorf(-EINVAL, "cuda_ops_attention_decode: head_dim %d: expected 32, 64, 128 or 256", head_dim);
    const size_t q_width = (size_t)(n_heads + (prep ? 2 * n_kv_heads : 0)) * head_dim;
    const size_t q_stride = d->q_stride ? d->q_stride : q_width;
    if (q_stride < q_width)
        return mm3_errorf(-EINVAL, "cuda_ops_attention_decode: q stride %zu < the %zu floats of a %s row", q_stride,
                          q_width, prep ? "q|k|v" : "q");
    if (prep && (prep->rotary_dim < 0 || prep->rotary_dim > head_dim || prep->rotary_dim % 2 ||
                 (prep->rotary_dim && !prep->inv_freq) || !prep->pos))
        return mm3_errorf(-EINVAL,
                          "cuda_ops_attention_decode_qkv: rotary_dim %d: expected even, <= head_dim %d (with "
                          "inv_freq), and pos",
                          prep->rotary_dim, head_dim);
    if (row_stride < (size_t)n_kv_heads * head_dim)
        return mm3_errorf(-EINVAL, "cuda_ops_attention_decode: row_stride %zu < kv heads x head_dim %d", row_stride,
                          n_kv_heads * head_dim);
    /* Each lane loads head_dim/32 elements at once: that run must be aligned. */
    const size_t elem = kv_dtype == CUDA_KV_BF16 ? 2 : 4;
    size_t align = elem * (size_t)(head_dim / 32);
    if (align > 16) align = 16;
    if (((uintptr_t)k_cache | (uintptr_t)v_cache) % align || (row_stride * elem) % align || (seq_stride * elem) % align)
        return mm3_errorf(-EINVAL,
                          "cuda_ops_attention_decode: KV cache pointers and strides must be %zu-byte aligned "
                          "(row_stride %zu, seq_stride %zu elements)",
                          align, row_stride, seq_stride);
    if (n_seq == 0) return 0;

    cudaStream_t st = cuda_stream_of(stream);
    long chunk;
    int n_split;
    att_plan(n_seq, n_kv_heads, max_kv_len, chunk_positions, &chunk, &n_split);
    const bool mma = att_mma_fits(kv_dtype == CUDA_KV_BF16, head_dim, group);
    if (mma && !chunk_positions)
        n_split = att_mma_splits(n_seq, n_kv_heads, max_kv_len, n_split, att_mma_blocks_per_sm(head_dim, prep != NULL));
    const size_t part_bytes = att_part_bytes(n_seq, n_heads, head_dim, n_split);
    float *part = (float *)d->workspace;
    int rc = 0;
    if (!part)
        rc = cuda_status(cudaMallocAsync((void **)&part, part_bytes, st), "cudaMallocAsync (attention partials)");
    else if (d->workspace_bytes < part_bytes)
        rc = mm3_errorf(-EINVAL, "cuda_ops_attention_decode: workspace of %zu bytes, %zu needed", d->workspace_bytes,
                        part_bytes);
    if (rc < 0) return rc;

    /* Automatic plans let each sequence cut its own length (chunk 0 in the kernel). */
    att_args a = {
        part,         d->q,       q_stride, k_cache, v_cache,        d->kv_len, d->seq_row,
        seq_stride,   row_stride, n_heads,  group,   d->heads.scale, n_split,   chunk_positions ? (int)chunk : 0,
        prep != NULL, {}}; /* a.fuse stays zero (the plain kernel ignores it) without prep */
    if (prep) {
        a.fuse.q_norm = prep->q_norm;
        a.fuse.k_norm = prep->k_norm;
        a.fuse.inv_freq = prep->inv_freq;
        a.fuse.eps = prep->eps;
        a.fuse.rotary_dim = prep->rotary_dim;
        a.fuse.pos = prep->pos;
        a.fuse.kw = (void *)k_cache;
        a.fuse.vw = (void *)v_cache;
    }
    dim3 grid((unsigned)n_split, (unsigned)n_kv_heads, (unsigned)n_seq);
    if (mma)
        rc = att_mma_launch(a, head_dim, grid, st);
    else
        rc = kv_dtype == CUDA_KV_BF16 ? att_launch_e<uint16_t>(a, head_dim, grid, st)
                                      : att_launch_e<float>(a, head_dim, grid, st);
    if (rc == 0 && att_combine_staged(n_split))
        rc = launch_pdl("attn_combine_staged_kernel", attn_combine_staged_kernel,
                        dim3((unsigned)n_heads, (unsigned)n_seq), head_dim, sizeof(float) * (size_t)(2 * n_split + 1),
                        st, d->out, (const float *)part, n_heads, head_dim, n_split);
    else if (rc == 0)
        rc = launch_pdl("attn_combine_kernel", attn_combine_kernel, dim3((unsigned)n_heads, (unsigned)n_seq), head_dim,
                        0, st, d->out, (const float *)part, n_heads, head_dim, n_split);
    if (!d->workspace) (void)cudaFreeAsync(part, st);
    return rc;
}

extern "C" int cuda_ops_attention_decode(const struct cuda_attention_decode *a, void *stream)
{
    return attention_decode(a, NULL, stream);
}

extern "C" int cuda_ops_attention_decode_qkv(const struct cuda_attention_decode *a, const struct cuda_qkv_prep *prep,
                                             void *stream)
{
    if (!prep) return mm3_errorf(-EINVAL, "cuda_ops_attention_decode_qkv: NULL prep");
    return attention_decode(a, prep, stream);
}

extern "C" size_t cuda_ops_attention_decode_workspace_bytes(int n_seq, int n_heads, int n_kv_heads, int head_dim,
                                                            int max_kv_len)
{
    long chunk;
    int n_split;
    att_plan(n_seq, n_kv_heads, max_kv_len, 0, &chunk, &n_split);
    return att_part_bytes(n_seq, n_heads, head_dim, n_split);
}
