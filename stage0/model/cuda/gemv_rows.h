/* The decode products of common/cuda/ops_cuda.h over any number of rows, in slices
 * of cuda_ops_gemv_max_rows(in) (32 on the tensor-core GEMV, else 16: the
 * float32-accurate GEMV kernels' limits; cuBLASLt beyond would round x to bf16), for
 * the GPU talker and depth decoder. Only compiled with CUDA. */
#ifndef MM3_STAGE0_CUDA_GEMV_ROWS_H
#define MM3_STAGE0_CUDA_GEMV_ROWS_H

#include <stdint.h>

#include "common/cuda/ops_cuda.h"

/* y[n, out] = x[n, in] . w^T (cuda_ops_matmul_bf16 per slice). */
int gemv_rows(float *y, const float *x, const uint16_t *w, int n, int in, int out, void *stream);

/* y[n, ffn] = silu(x . Wg^T) * (x . Wu^T) over interleaved gate/up rows
 * (cuda_ops_matmul_bf16_swiglu per slice; gu [n, 2 ffn] its scratch). */
int gemv_rows_swiglu(float *y, float *gu, const float *x, const uint16_t *wgu, int n, int in, int ffn, void *stream);

/* cuda_ops_gemv_bf16_fused on g's rows (any number) per slice. */
int gemv_rows_fused(const struct cuda_gemv_fused *g, void *stream);

/* Whether every slice of n rows fuses for this product and gains by it
 * (cuda_ops_gemv_fused_ok, cuda_ops_gemv_fused_pays). */
int gemv_rows_fused_ok(int n, int in, int out, enum cuda_gemv_epi epi, int norm);

#endif
