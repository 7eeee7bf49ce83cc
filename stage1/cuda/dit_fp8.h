/* FP8 (e4m3) operands of the DiT's fp8 GEMMs (matmul_precision fp8, dit_gemm_run_fp8):
 * each row r of a matrix is stored as q[r, :] = e4m3(x[r, :] * (1 / s[r])) with the
 * float32 scale s[r] = amax(|x[r, :]|) / 448, so the row's largest magnitude lands on
 * e4m3's largest finite value and nothing saturates; an all-zero row (or one whose scale
 * would be below FLT_MIN) gets s = 1. NaN and infinities reach the GEMM as NaN.
 * Weights are quantized per output channel (row of w[N, K]) at load, activations per token
 * by the kernels that produce them (LayerNorm, gating) or by dit_fp8_quantize_rows.
 * e4m3 rounding is to nearest even with saturation, as mm3_f32_to_e4m3 (common/dtype.h).
 * Device pointers; `stream` a cudaStream_t. 0 or a negative errno code with a message. */
#ifndef MM3_STAGE1_CUDA_DIT_FP8_H
#define MM3_STAGE1_CUDA_DIT_FP8_H

#include <stdint.h>

#include "stage1/cuda/dit_kernels.h" /* struct dit_layernorm */

#ifdef __cplusplus
extern "C" {
#endif

/* q[n, dim], s[n] from x[n, dim] (row stride ldx >= dim). */
int dit_fp8_quantize_rows(uint8_t *q, float *s, const float *x, int n, int dim, int ldx, void *stream);

/* The rows of ln (as dit_cuda_layernorm's), stored as e4m3 rows q[n, dim] with scales s[n]. */
int dit_fp8_layernorm(uint8_t *q, float *s, const struct dit_layernorm *ln, void *stream);

/* dit_cuda_silu_gate's act[n, ff] = u[:, :ff] * silu(u[:, ff:]) as e4m3 rows with scales s[n],
 * u = g + bias (bias[2 ff], the ff_in GEMM's, added here instead of in a pass of its own;
 * NULL: none). */
int dit_fp8_silu_gate(uint8_t *q, float *s, const float *g, const float *bias, int n, int ff, void *stream);

#ifdef __cplusplus
}
#endif

#endif
