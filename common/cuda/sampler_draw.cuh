/* The seeded stage-0 draw of one CFG pair by one thread block, shared by the
 * sampler's kernel (sampler_cuda.cu) and kernels that go on with the drawn column in
 * the same launch (stage0/model/cuda/frame_kernels.cu).
 *
 * A block stages the order-preserving uint32 keys of one row in shared memory and
 * finds the k-th largest key with a radix select, first on the conditional row (the
 * c0 rule), then on the nan_to_num'd guided row (the draw's top-k). Rows of more than
 * 32 keys take one 12-bit histogram pass over all keys; when the bin that holds the k-th largest
 * and the bins above it hold few keys (top-50 of logits: a few hundred), those are
 * compacted and the select finishes on them alone: up to one key per thread by
 * counting, for each key, the keys above it (one loop, one barrier, where 8-bit radix
 * passes took four histograms and scans), else by radix passes; with heavy ties it goes
 * on over all keys. The Gumbel noise is only computed for the surviving candidates. Every
 * float op that the CPU rounds separately is an explicit _rn intrinsic so nvcc cannot
 * contract it into an FMA.
 *
 * Before the histogram, a cheaper bound is tried (select_top): each warp's two largest
 * per-thread maxima are 64 distinct keys, so their k-th largest L has at least k keys at
 * or above it and the k-th largest of the row is >= L; the keys >= L (typically k plus a
 * few dozen) are compacted with their columns and the select and the Gumbel draw run on
 * them alone. On the c0 rule only the conditional row's top k can survive the mask, so
 * the guidance, the second select and the draw run on those columns only, unless too
 * few of them are finite (then the whole row is guided as before). A profile of the c0
 * draw had the full-row passes at 40% and the histograms at 25% of its instructions. */
#ifndef MM3_SAMPLER_DRAW_CUH
#define MM3_SAMPLER_DRAW_CUH

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/sampler_hash.h"

enum {
    SAMPLER_THREADS = 1024,
    SAMPLER_WARPS = SAMPLER_THREADS / 32,
    FIRST_BITS = 12, /* the first pass over a wide row */
    HIST_BINS = 1 << FIRST_BITS,
    PASS_BITS = 8,   /* the other passes */
    SMALL_CAP = 2048 /* keys a select finishes on after compaction */
};

static const unsigned FULL_MASK = 0xFFFFFFFFu;
/* The key of every NaN; no number maps to it. */
static const uint32_t KEY_NAN = 0xFFFFFFFFu;

/* Keys compare as the floats do, with -0 == +0 and NaN above +inf (torch.topk's
 * order, which common/sampler.c follows). */
static __device__ __forceinline__ uint32_t key_of(float x)
{
    if (isnan(x)) return KEY_NAN;
    uint32_t b = __float_as_uint(x);
    if ((b << 1) == 0) b = 0;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static __device__ __forceinline__ float float_of_key(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

struct select_shared {
    unsigned hist[HIST_BINS];
    uint32_t buf[SMALL_CAP];
    int col[SMALL_CAP]; /* select_top's compacted columns, beside their keys in buf */
    uint32_t sample[2 * SAMPLER_WARPS];
    unsigned warp_total[SAMPLER_WARPS];
    unsigned n_buf;
    uint32_t kth; /* rank_select's answer */
    /* The result of radix_find: */
    int digit;      /* the digit that holds the k-th largest */
    int rank;       /* k among the keys with that digit */
    unsigned count; /* keys with that digit or a larger one */
};

/* Inclusive prefix sum over the block in thread order. */
static __device__ unsigned block_scan(unsigned v, unsigned *warp_total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 1; off < 32; off <<= 1) {
        unsigned t = __shfl_up_sync(FULL_MASK, v, off);
        if (lane >= off) v += t;
    }
    if (lane == 31) warp_total[warp] = v;
    __syncthreads();
    if (warp == 0) {
        unsigned w = warp_total[lane];
        for (int off = 1; off < 32; off <<= 1) {
            unsigned t = __shfl_up_sync(FULL_MASK, w, off);
            if (lane >= off) w += t;
        }
        warp_total[lane] = w;
    }
    __syncthreads();
    return v + (warp > 0 ? warp_total[warp - 1] : 0u);
}

/* hist[d] = how many of keys[0..n) with (key & pmask) == prefix have digit d =
 * (key >> shift) & (bins - 1). */
static __device__ void radix_histogram(const uint32_t *keys, int n, uint32_t prefix, uint32_t pmask, int shift,
                                       int bins, unsigned *hist)
{
    const int lane = threadIdx.x & 31;
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
        hist[b] = 0;
    __syncthreads();
    /* blockDim is a multiple of 32: every lane runs every iteration (full-mask votes).
     * A warp whose keys share one digit adds once: a masked row is thousands of equal
     * keys, and per-lane atomics on one address would serialise. */
    for (int base = 0; base < n; base += blockDim.x) {
        int i = base + (int)threadIdx.x, d = -1;
        if (i < n) {
            uint32_t key = keys[i];
            if ((key & pmask) == prefix) d = (int)((key >> shift) & (uint32_t)(bins - 1));
        }
        int d0 = __shfl_sync(FULL_MASK, d, 0);
        if (__all_sync(FULL_MASK, d == d0)) {
            if (lane == 0 && d0 >= 0) atomicAdd(&hist[d0], 32u);
        } else if (d >= 0) {
            atomicAdd(&hist[d], 1u);
        }
    }
    __syncthreads();
}

/* The digit holding the k-th largest counted key (1 <= k <= the count), into
 * sh->digit, sh->rank and sh->count. Thread t owns the bins-per-thread bins below
 * bins-1-per*t, so the scan in thread order counts from the largest digit down. */
static __device__ void radix_find(struct select_shared *sh, int bins, int k)
{
    const int per = bins > SAMPLER_THREADS ? bins / SAMPLER_THREADS : 1;
    const int top = bins - 1 - per * (int)threadIdx.x;
    unsigned sum = 0;
    if (top >= 0)
        for (int j = 0; j < per; j++)
            sum += sh->hist[top - j];
    unsigned incl = block_scan(sum, sh->warp_total);
    unsigned above = incl - sum;
    if (top >= 0 && above < (unsigned)k && (unsigned)k <= incl) {
        for (int j = 0; j < per; j++) {
            unsigned c = sh->hist[top - j];
            if (above + c >= (unsigned)k) {
                sh->digit = top - j;
                sh->rank = k - (int)above;
                sh->count = above + c;
                break;
            }
            above += c;
        }
    }
    __syncthreads();
}

/* Finish a select: the remaining low `bits` of the k-th largest key among those that
 * match prefix under pmask, PASS_BITS at a time. */
static __device__ uint32_t radix_passes(const uint32_t *keys, int n, int k, uint32_t prefix, uint32_t pmask, int bits,
                                        struct select_shared *sh)
{
    while (bits > 0) {
        int b = bits < PASS_BITS ? bits : PASS_BITS, shift = bits - b, bins = 1 << b;
        radix_histogram(keys, n, prefix, pmask, shift, bins, sh->hist);
        radix_find(sh, bins, k);
        prefix |= (uint32_t)sh->digit << shift;
        pmask |= (uint32_t)(bins - 1) << shift;
        k = sh->rank;
        bits = shift;
    }
    return prefix;
}

/* The k-th largest of keys[0..n) for n <= blockDim.x: the key with fewer than k keys
 * above it and at least k at or above it (equal keys agree on the answer). */
static __device__ uint32_t rank_select(const uint32_t *keys, int n, int k, struct select_shared *sh)
{
    if ((int)threadIdx.x < n) {
        const uint32_t key = keys[threadIdx.x];
        int above = 0, at_or_above = 0;
#pragma unroll 4
        for (int j = 0; j < n; j++) {
            const uint32_t other = keys[j]; /* the same word for every lane: a broadcast */
            above += other > key;
            at_or_above += other >= key;
        }
        if (above < k && k <= at_or_above) sh->kth = key;
    }
    __syncthreads();
    return sh->kth;
}

/* (key, col) appended to sh->buf / sh->col where take, in no particular order, as far as
 * SMALL_CAP holds them; sh->n_buf counts every one. Called by whole warps. */
static __device__ __forceinline__ void block_append(bool take, uint32_t key, int col, struct select_shared *sh)
{
    const int lane = threadIdx.x & 31;
    const unsigned ballot = __ballot_sync(FULL_MASK, take);
    unsigned at = 0;
    if (lane == 0 && ballot) at = atomicAdd(&sh->n_buf, (unsigned)__popc(ballot));
    at = __shfl_sync(FULL_MASK, at, 0) + (unsigned)__popc(ballot & ((1u << lane) - 1u));
    if (take && at < SMALL_CAP) {
        sh->buf[at] = key;
        sh->col[at] = col;
    }
}

/* Every column i with keys[i] >= lo into sh->buf / sh->col (in no particular order) as
 * far as SMALL_CAP holds them; returns how many there are. */
static __device__ __forceinline__ unsigned compact_at_least(const uint32_t *keys, int n, uint32_t lo,
                                                            struct select_shared *sh)
{
    if (threadIdx.x == 0) sh->n_buf = 0;
    __syncthreads();
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + (int)threadIdx.x;
        const uint32_t key = i < n ? keys[i] : 0u;
        block_append(i < n && key >= lo, key, i, sh);
    }
    __syncthreads();
    return sh->n_buf;
}

/* The k-th largest of keys[0..n) (1 <= k <= n, duplicates counted). Called by the
 * whole block; every thread gets the result. keys are only read. */
static __device__ uint32_t radix_select(const uint32_t *keys, int n, int k, struct select_shared *sh)
{
    if (n <= 32) return rank_select(keys, n, k, sh);
    const int shift = 32 - FIRST_BITS;
    radix_histogram(keys, n, 0, 0, shift, HIST_BINS, sh->hist);
    radix_find(sh, HIST_BINS, k);
    const uint32_t lo = (uint32_t)sh->digit << shift;
    const unsigned count = sh->count;
    const int rank = sh->rank;
    if (count > SMALL_CAP) /* heavy ties: go on over all keys in that bin */
        return radix_passes(keys, n, rank, lo, ~0u << shift, shift, sh);
    /* Every key >= lo (count of them, k-th largest among them) into buf. */
    compact_at_least(keys, n, lo, sh);
    if ((int)count <= (int)blockDim.x) return rank_select(sh->buf, (int)count, k, sh);
    return radix_passes(sh->buf, (int)count, k, 0, 0, 32, sh);
}

/* A lower bound on the k-th largest key (k <= 2 * SAMPLER_WARPS): the k-th largest of
 * each warp's two largest thread maxima. thread_max: the largest of the thread's keys,
 * 0 (below every key) if it has none. Those 64 are keys of distinct columns, so at
 * least k keys are >= the bound whenever it is not 0, and every key is >= 0. */
static __device__ __forceinline__ uint32_t pivot_bound(uint32_t thread_max, int k, struct select_shared *sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t m1 = __reduce_max_sync(FULL_MASK, thread_max);
    const int owner = __ffs(__ballot_sync(FULL_MASK, thread_max == m1)) - 1;
    const uint32_t m2 = __reduce_max_sync(FULL_MASK, lane == owner ? 0u : thread_max);
    if (lane == 0) {
        sh->sample[2 * warp] = m1;
        sh->sample[2 * warp + 1] = m2;
    }
    __syncthreads();
    return rank_select(sh->sample, 2 * SAMPLER_WARPS, k, sh);
}

/* The k-th largest of keys[0..n) (1 <= k <= n), as radix_select. Where the pivot bound
 * leaves at most blockDim.x keys, those keys and their columns are left in sh->buf and
 * sh->col and *n_cand says how many (every column whose key is >= the answer is among
 * them); else *n_cand = 0. */
static __device__ __forceinline__ uint32_t select_top(const uint32_t *keys, int n, int k, uint32_t thread_max,
                                                      struct select_shared *sh, unsigned *n_cand)
{
    *n_cand = 0;
    if (n > 32 && k <= 2 * SAMPLER_WARPS) {
        const uint32_t lo = pivot_bound(thread_max, k, sh);
        const unsigned count = compact_at_least(keys, n, lo, sh);
        if (count <= blockDim.x) {
            *n_cand = count;
            return rank_select(sh->buf, (int)count, k, sh);
        }
    }
    return radix_select(keys, n, k, sh);
}

/* (score, col) pairs: the larger score wins, on equal scores the smaller column
 * (torch.argmax returns the first maximum). col INT_MAX = no candidate. */
static __device__ __forceinline__ void best_merge(double *score, int *col, double other_score, int other_col)
{
    if (other_col == INT_MAX) return;
    if (*col == INT_MAX || other_score > *score || (other_score == *score && other_col < *col)) {
        *score = other_score;
        *col = other_col;
    }
}

static __device__ __forceinline__ void best_warp_reduce(double *score, int *col)
{
    for (int off = 16; off > 0; off >>= 1) {
        double s = __shfl_down_sync(FULL_MASK, *score, off);
        int c = __shfl_down_sync(FULL_MASK, *col, off);
        best_merge(score, col, s, c);
    }
}

/* The guided value the draw ranks, nan_to_num'd (CPU: sampler.c's guidance). */
static __device__ __forceinline__ float guided_value(float ci, float ui, float s, bool blend, bool masked)
{
    float g = ci;
    if (blend) g = __fadd_rn(ui, __fmul_rn(__fsub_rn(ci, ui), s));
    if (masked) g = -INFINITY;
    return g;
}

static __device__ __forceinline__ float finite_value(float g)
{
    if (isnan(g)) return -1e9f;
    if (isinf(g)) return g > 0.0f ? 1e9f : -1e9f;
    return g;
}

/* A candidate's score in the draw: its guided value plus the column's Gumbel noise. */
static __device__ __forceinline__ double gumbel_score(uint32_t key, uint64_t seed, uint32_t pos, int col)
{
    return __dadd_rn((double)float_of_key(key), sampler_hash_gumbel(seed, pos, (uint32_t)col));
}

/* The Gumbel argmax over the block: every thread offers (best, col), every thread gets
 * the winning column (0 if none offered one). */
static __device__ __forceinline__ int block_best_col(double best, int col)
{
    __shared__ double warp_score[SAMPLER_WARPS];
    __shared__ int warp_col[SAMPLER_WARPS];
    __shared__ int drawn;
    best_warp_reduce(&best, &col);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_score[warp] = best;
        warp_col[warp] = col;
    }
    __syncthreads();
    if (warp == 0) {
        best = warp_score[lane];
        col = warp_col[lane];
        best_warp_reduce(&best, &col);
        /* No candidate cannot happen (top-k keeps >= 1 finite value); 0 is what the
         * CPU loop would answer. */
        if (lane == 0) drawn = col == INT_MAX ? 0 : col;
    }
    __syncthreads();
    return drawn;
}

/* The c0 rule's draw on the conditional row's top k alone: sh->buf / sh->col hold
 * n_cand columns, among them every one whose conditional key is >= tc (select_top's
 * list). Every other column is masked to -1e9, so where at least k of the kept ones
 * guide to more than -1e9 the row's k-th largest and its candidates are theirs. Returns
 * the drawn column, or -1 (the caller guides the whole row) where fewer are. */
static __device__ __forceinline__ int draw_unmasked(const float *c, const float *u, float s, bool blend, bool mask0,
                                                    int top_k, uint32_t tc, unsigned n_cand, uint64_t sd, uint32_t ps,
                                                    struct select_shared *sh)
{
    /* Keep the columns at or above tc, one per thread (n_cand <= blockDim.x). */
    const bool mine = threadIdx.x < n_cand;
    const int i = mine ? sh->col[threadIdx.x] : 0;
    const bool keep = mine && sh->buf[threadIdx.x] >= tc;
    if (threadIdx.x == 0) sh->n_buf = 0;
    __syncthreads(); /* every thread has its column: buf and col are free */
    const uint32_t key = keep ? key_of(finite_value(guided_value(c[i], u[i], s, blend, i == 0 && mask0))) : 0u;
    block_append(keep, key, i, sh);
    const uint32_t floor_key = key_of(-1e9f);
    if (__syncthreads_count(keep && key > floor_key) < top_k) return -1;
    const unsigned kept = sh->n_buf;
    const uint32_t tv = rank_select(sh->buf, (int)kept, top_k, sh);
    double best = -INFINITY;
    int col = INT_MAX;
    if (keep && key >= tv) {
        best = gumbel_score(key, sd, ps, i);
        col = i;
    }
    return block_best_col(best, col);
}

/* The draw of pair p (one block of SAMPLER_THREADS threads; cuda_sampler_draw_pairs
 * has the contract): every thread gets the column. keys: n words of (dynamic) shared
 * memory. Called once per block: its shared state is static. */
static __device__ int sampler_draw_pair(const float *__restrict__ logits, int ld, int n,
                                        const float *__restrict__ scale, int c0_rule, int top_k,
                                        const uint64_t *__restrict__ seed, const uint32_t *__restrict__ pos,
                                        const unsigned char *__restrict__ mask_col0, float *__restrict__ guided_out,
                                        int p, uint32_t *keys)
{
    __shared__ struct select_shared sh;

    const float *c = logits + (size_t)2 * (size_t)p * (size_t)ld;
    const float *u = c + ld;
    const float s = scale[p];
    const bool blend = s > 1.0f;
    const bool limit = top_k > 0 && top_k < n;
    const bool c0 = c0_rule && limit;
    const uint64_t sd = seed[p];
    const uint32_t ps = pos[p];
    const bool mask0 = mask_col0 && mask_col0[p];
    float *gout = guided_out ? guided_out + (size_t)p * (size_t)n : NULL;

    /* The c0 rule's threshold: the conditional row's top_k-th value. */
    uint32_t tc = KEY_NAN;
    unsigned n_cand = 0;
    if (c0) {
        uint32_t mx = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t k = key_of(c[i]);
            keys[i] = k;
            mx = max(mx, k);
        }
        __syncthreads();
        tc = select_top(keys, n, top_k, mx, &sh, &n_cand);
    }
    /* A NaN threshold masks nothing: c < NaN is false everywhere. */
    const bool c0_mask = c0 && tc != KEY_NAN;
    if (c0_mask && !gout && n_cand > 0) {
        const int col = draw_unmasked(c, u, s, blend, mask0, top_k, tc, n_cand, sd, ps, &sh);
        if (col >= 0) return col;
    }

    /* Guidance, then the draw's keys in place of c's (each thread rewrites only the
     * entries it read). */
    uint32_t mx = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float g =
            guided_value(c[i], blend ? u[i] : 0.0f, s, blend, (c0_mask && keys[i] < tc) || (i == 0 && mask0));
        if (gout) gout[i] = g;
        const uint32_t k = key_of(finite_value(g));
        keys[i] = k;
        mx = max(mx, k);
    }
    __syncthreads();

    /* v has no NaN, so key order is float order; key 0 keeps every column. */
    n_cand = 0;
    const uint32_t tv = limit ? select_top(keys, n, top_k, mx, &sh, &n_cand) : 0u;
    double best = -INFINITY;
    int col = INT_MAX;
    if (n_cand > 0) {
        if (threadIdx.x < n_cand) {
            const uint32_t k = sh.buf[threadIdx.x];
            const int i = sh.col[threadIdx.x];
            if (k >= tv) {
                best = gumbel_score(k, sd, ps, i);
                col = i;
            }
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const uint32_t k = keys[i];
            if (k < tv) continue;
            const double score = gumbel_score(k, sd, ps, i);
            /* i grows within a thread: strict > keeps the first maximum. */
            if (col == INT_MAX || score > best) {
                best = score;
                col = i;
            }
        }
    }
    return block_best_col(best, col);
}

/* Columns whose keys fit the dynamic shared memory of `kernel` (a kernel calling
 * sampler_draw_pair); its opt-in limit is raised on the first call, once per process
 * (not a stream operation: fine during graph capture). 0 on a CUDA error. */
static inline int sampler_draw_max_cols(const void *kernel, const char *name, int *cache)
{
    int cached = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (cached > 0) return cached;
    int dev = 0, optin = 0;
    cudaFuncAttributes fa;
    if (cuda_status(cudaGetDevice(&dev), "cudaGetDevice") < 0) return 0;
    if (cuda_status(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                    "cudaDeviceGetAttribute(shared memory per block opt-in)") < 0)
        return 0;
    if (cuda_status(cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes(draw kernel)") < 0) return 0;
    int dyn = optin - (int)fa.sharedSizeBytes;
    if (dyn < (int)sizeof(uint32_t)) {
        mm3_errorf(-ENODEV, "%s: %d bytes of shared memory per block leave no room for keys", name, optin);
        return 0;
    }
    if (cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn),
                    "cudaFuncSetAttribute(draw kernel, max dynamic shared memory)") < 0)
        return 0;
    cached = dyn / (int)sizeof(uint32_t);
    __atomic_store_n(cache, cached, __ATOMIC_RELEASE);
    return cached;
}

#endif
