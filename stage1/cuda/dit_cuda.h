/* The DiT velocity network on the GPU (the CUDA twin of stage1/dit.h).
 *
 * Weights live on the device in the matmul precision's operand type (float32 for
 * fp32 and tf32, bf16 for bf16, fp16 for fp16); norms, biases, the time projection and every
 * activation between GEMMs stay float32 (LayerNorm, softmax, residual stream,
 * time features). All B sequences of a call run as one batch of B*(L+1) token
 * rows through each GEMM (cuBLASLt, bias and residual-add epilogues); attention
 * runs per sequence (bidirectional, RoPE fused, stage1/cuda/dit_kernels.h).
 *
 *     struct dit_cuda *h;
 *     dit_cuda_load(&h, cpu_model, MM3_MATMUL_TF32);          // or dit_cuda_load_random
 *     dit_cuda_forward(h, B, L, x_dev, t_dev, conds, v_dev, stream);
 *     dit_cuda_free(h);
 *
 * Only built with CUDA (MM3_HAVE_CUDA); the header needs no CUDA header. */
#ifndef MM3_STAGE1_CUDA_DIT_CUDA_H
#define MM3_STAGE1_CUDA_DIT_CUDA_H

#include <stdint.h>

#include "common/deploy.h" /* enum mm3_matmul_precision */
#include "stage1/dit.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dit_cuda;

/* Upload the CPU model's float32 weights (converted to bf16 / fp16 for those precisions;
 * -ERANGE when a weight lies beyond fp16's range). The CPU model may be freed afterwards.
 * Needs a current CUDA device. */
int dit_cuda_load(struct dit_cuda **out, const struct dit_model *m, enum mm3_matmul_precision prec);

/* Random weights made on the device (benchmarks): `cfg` gives the geometry (hidden and
 * cat_dim are derived again here). The same seed gives the same float32 values in every
 * precision (the bf16 weights are those values rounded), so runs compare across
 * precisions. Matrices are uniform in +-1/sqrt(fan_in), norms near 1, biases small. */
int dit_cuda_load_random(struct dit_cuda **out, const struct dit_config *cfg, enum mm3_matmul_precision prec,
                         uint64_t seed);

void dit_cuda_free(struct dit_cuda *h);

const struct dit_config *dit_cuda_config(const struct dit_cuda *h);
enum mm3_matmul_precision dit_cuda_precision(const struct dit_cuda *h);

/* fp16 only: on, every operand is stored divided by DIT_F16_RESCUE_SCALE and every GEMM
 * multiplies it back (stage1/cuda/dit_kernels.h), for rerunning a window whose operands
 * overflowed fp16; off, the plain fp16 operands again. -EINVAL to turn it on in another
 * precision. Takes effect for forwards queued from now on. */
int dit_cuda_set_rescue(struct dit_cuda *h, int on);

/* Allocate the activations for up to max_B sequences of max_L latents now (optional:
 * dit_cuda_forward grows them on demand, which synchronises the device and cannot
 * happen inside a graph capture). */
int dit_cuda_reserve(struct dit_cuda *h, int max_B, int max_L);

/* Velocities of B sequences of L latents, queued on `stream` (a cudaStream_t, NULL =
 * the legacy default stream); all pointers are device memory:
 *   x[B, in_ch, L] channels-first, t[B] flow times, v[B, in_ch, L] (must not alias x);
 *   cond: NULL (all zero) or a HOST array of B device pointers, each [L, cond_dim]
 *   or NULL for a zero condition.
 * Same function as dit_forward. */
int dit_cuda_forward(struct dit_cuda *h, int B, int L, const float *x, const float *t, const float *const *cond,
                     float *v, void *stream);

/* Floating-point operations of one forward of B sequences of L latents (2 per
 * multiply-add: block linears, attention QK^T and PV, input/output paths, time MLP). */
double dit_cuda_forward_flops(const struct dit_config *cfg, int B, int L);

#ifdef __cplusplus
}
#endif

#endif
