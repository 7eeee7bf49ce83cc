/* Stage-0 sampling on the GPU: CFG blend, the c0 rule, top-k and the seeded
 * Gumbel-max draw of common/sampler.h, for many CFG pairs in one launch with no
 * host round trip (so a frame step can be captured in a CUDA graph).
 *
 * Only built with CUDA (MM3_HAVE_CUDA); this header needs no CUDA header. All
 * array arguments are device pointers; `stream` is a cudaStream_t (NULL = the
 * legacy default stream). Functions return 0 or a negative errno code with a
 * message (common/error.h): -EINVAL bad arguments, -ENODEV a CUDA error.
 *
 * Exactness: the drawn column equals sampler_draw_gumbel's on the same guided
 * logits. The blend is three separately rounded float ops (as sampler_cfg_blend,
 * built with -ffp-contract=off), so guided values are bitwise equal. The k-th
 * largest value is an exact radix select over the order-preserving uint32 image
 * of the floats (NaN ranks above +inf, -0 equals +0), so thresholds, ties and
 * candidate sets are identical. The only inexact piece is the Gumbel noise: the
 * double `log` of CUDA (<= 1 ulp) and of glibc (< 1 ulp, not always correctly
 * rounded) may round differently; a draw can then differ only if the two best
 * scores lie within an ulp of each other. test_sampler_cuda counts both: under 1% of
 * the noise values differ, each by 1 ulp, and it expects no differing draw in 2 x 10^5
 * random ones (rows of 1024 and 16385 columns). One block per pair. */
#ifndef MM3_SAMPLER_CUDA_H
#define MM3_SAMPLER_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A guided draw for n_pairs CFG pairs at once, all pointers on the device. */
struct cuda_sampler_pairs {
    const float *logits; /* [n_pairs][2][n]: row 0 of a pair conditional, row 1 unconditional */
    int ld;              /* floats between consecutive rows (>= n) */
    int n, n_pairs;
    const float *scale; /* [n_pairs] */
    int c0_rule, top_k;
    const uint64_t *seed;           /* [n_pairs] */
    const uint32_t *pos;            /* [n_pairs] */
    const unsigned char *mask_col0; /* NULL or [n_pairs] */
    int *col_out;                   /* [n_pairs] */
    float *guided_out;              /* NULL or [n_pairs][n] */
};

/* The draw d, no host sync, so it can be captured in a CUDA graph.
 * Per pair p: scale[p] (> 1: blend u + (c - u) * scale as three separately rounded float ops;
 * <= 1: g = c, no blend, as stage0/generate.c does), c0_rule (1: after the blend set g = -inf
 * where c < the conditional row's top_k-th largest value, NaN ranking first, exactly
 * sampler_c0_guide; 0: blend only, the depth rule), mask_col0 (NULL or [n_pairs]: nonzero sets
 * g[0] = -inf after guidance -- the benchmark's "never draw stop"), then the draw of
 * sampler_draw_gumbel(seed[p], g, n, top_k, pos[p]): nan_to_num(-1e9/1e9/-1e9), top-k mask
 * (k-th largest with duplicates counted, ties kept), argmax of (double)v + Gumbel(seed, pos, col)
 * with the first maximum winning. Result col_out[p]. guided_out: NULL or [n_pairs][n] float
 * (g before nan_to_num, for checks; it includes the mask_col0 -inf).
 *
 * top_k <= 0 or >= n: no top-k restriction (as common/sampler.c). One block of 1024 threads
 * per pair; the row's keys are staged in shared memory, so n is limited to
 * cuda_sampler_max_cols() (about 57 000 on an H200). */
int cuda_sampler_draw_pairs(const struct cuda_sampler_pairs *d, void *stream);

/* Largest n cuda_sampler_draw_pairs accepts on the current device (0 on a CUDA error). */
int cuda_sampler_max_cols(void);

/* Test hook: out[i] = the Gumbel noise of column col0 + i at (seed, pos) as the draw
 * computes it on the device (compare with sampler_gumbel to measure log rounding). */
int cuda_sampler_gumbel(double *out, uint64_t seed, uint32_t pos, uint32_t col0, int n, void *stream);

#ifdef __cplusplus
}
#endif

#endif
