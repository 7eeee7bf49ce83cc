/* cuBLASLt GEMMs of the DiT in one of the matmul precisions (deploy key
 * `matmul_precision`): fp32 (CUBLAS_COMPUTE_32F on float32), tf32
 * (CUBLAS_COMPUTE_32F_FAST_TF32 on float32), bf16 or fp16 (2-byte operands,
 * CUBLAS_COMPUTE_32F). An fp8 handle runs dit_gemm_run in fp16 and dit_gemm_run_fp8 in e4m3.
 * Output, bias and the accumulated C are always float32.
 *
 *     struct dit_gemm *g;  dit_gemm_create(&g, MM3_MATMUL_TF32);
 *     dit_gemm_run(g, &(struct dit_gemm_product){.d = d, .a = a, .w = w, .M = M, .K = K, .N = N,
 *                                               .lda = K, .ldd = N}, stream);
 *
 * Plans (descriptors and the chosen algorithm) are cached per shape, so steady
 * calls cost no heuristic query. The first call of a shape outside a graph capture
 * times up to 8 of cuBLASLt's heuristic candidates on its real operands and keeps the
 * fastest (dit_gemm_set_autotune(g, 0): take the first candidate).
 * Not thread-safe: one handle per thread/stream. */
#ifndef MM3_STAGE1_CUDA_DIT_GEMM_H
#define MM3_STAGE1_CUDA_DIT_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/deploy.h" /* enum mm3_matmul_precision */

#ifdef __cplusplus
extern "C" {
#endif

struct dit_gemm;

int dit_gemm_create(struct dit_gemm **out, enum mm3_matmul_precision prec);
void dit_gemm_destroy(struct dit_gemm *g);

/* Autotuning of plans made from now on (on by default; see above). */
void dit_gemm_set_autotune(struct dit_gemm *g, int on);

/* Every product from now on is alpha . a . w^T (the bias and c are not scaled); 1 by
 * default. A caller that stores its operands divided by a power of two undoes it here. */
void dit_gemm_set_alpha(struct dit_gemm *g, float alpha);

/* Bytes of one operand element of dit_gemm_run: 2 for bf16, fp16 and fp8 (whose plain
 * GEMMs run in fp16), else 4. */
size_t dit_gemm_operand_size(enum mm3_matmul_precision prec);

/* One product, row-major: d[M, N] (row stride ldd) = a[M, K] (row stride lda) . w[N, K]^T
 * (+ bias[N]) (+ c[M, N]); for dit_gemm_run_fp8 scaled per row by sa and sw. */
struct dit_gemm_product {
    float *d;
    const void *a;        /* dit_gemm_run: operands (bf16 / fp16 bits, else float32); _fp8: e4m3 bytes */
    const void *w;        /* like a; row stride K */
    const float *sa, *sw; /* dit_gemm_run_fp8 only: row scales of a [M] and w [N], float32 on the device */
    const float *bias;    /* [N] or NULL */
    const float *c;       /* NULL, equal to d, or another matrix with row stride ldd */
    int M, K, N, lda, ldd;
};

/* The product p in the handle's precision (p->sa and p->sw are not read). */
int dit_gemm_run(struct dit_gemm *g, const struct dit_gemm_product *p, void *stream);

/* Whether a GEMM of this shape may run in fp8: cuBLASLt's e4m3 GEMMs need K, N and lda
 * multiples of 16 (16-byte rows) and 16-byte float32 output rows. */
int dit_gemm_fp8_fits(int K, int N, int lda, int ldd);

/* fp8 handles only: d[M, N] = sa[m] sw[n] (a[M, K] . w[N, K]^T) (+ bias[N]) (+ c[M, N]) with
 * float32 accumulation; p->a and p->w are e4m3 bytes, p->sa and p->sw their row scales.
 * The scales ride on cuBLASLt's outer-vector scale modes; where cuBLASLt has none for e4m3
 * (said once in the log) the GEMM runs with unit scales into a float32 scratch and one
 * kernel applies scales, bias and c. Needs dit_gemm_fp8_fits(K, N, lda, ldd). */
int dit_gemm_run_fp8(struct dit_gemm *g, const struct dit_gemm_product *p, void *stream);

/* From now on, every fp8 GEMM takes the unit-scale path with the scaling epilogue, as where
 * cuBLASLt has no per-row scales (for tests and comparisons). */
void dit_gemm_set_fp8_epilogue(struct dit_gemm *g, int on);

#ifdef __cplusplus
}
#endif

#endif
