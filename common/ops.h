/* The op interface: plain-C float32 reference implementations.
 *
 * Every model (talker, depth decoder, DiT, vocoder) is written as a sequence of
 * these calls. They are the oracle the CUDA kernels are tested against, so they
 * stay obvious loops: no blocking, no SIMD tricks, sums in the natural order with
 * a float accumulator unless noted.
 *
 * Layouts are row-major. A "row" is one token; weights are PyTorch Linear
 * [out, in]. Nothing here allocates except where a scratch buffer is unavoidable
 * (noted). */
#ifndef MM3_OPS_H
#define MM3_OPS_H

#include <stddef.h>

#include "common/attention_heads.h"

/* y[n, out] = x[n, in] . w[out, in]^T (+ bias[out] when bias != NULL). y must not alias x. */
void op_matmul(float *y, const float *x, const float *w, const float *bias, int n, int in, int out);

/* y = x * rsqrt(mean(x^2) + eps) * w over rows of `dim` (n rows). y may alias x. */
void op_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps);

/* LayerNorm over rows of `dim` with biased variance; b may be NULL. y may alias x. */
void op_layernorm(float *y, const float *x, const float *w, const float *b, int n, int dim, float eps);

/* Inverse frequencies of RoPE as torch computes them in float32:
 * inv_freq[i] = 1 / theta^(fp32(2i) / dim), i < dim/2. For (1e6, 128) and (1e4, 32)
 * the exact table PyTorch produces is used (it differs from powf by 1 ulp in places). */
void op_rope_inv_freq(float *inv_freq, double theta, int dim);

/* NeoX ("rotate_half") RoPE applied in place to the first rotary_dim dims of each
 * head of x[n, n_heads*head_dim] (row stride `stride` floats); token t has position
 * pos[t]. Angles: fp32(inv_freq[i] * fp32(pos)), cos/sin in float32. */
void op_rope(float *x, int n, int stride, int n_heads, int head_dim, int rotary_dim, const int *pos,
             const float *inv_freq);

/* The rows of one op_attention call (strides in floats). */
struct attention_rows {
    float *out; /* [n_q, n_heads*head_dim] */
    int out_stride;
    const float *q; /* [n_q, *]: head h at column h*head_dim */
    int q_stride;
    const float *k, *v; /* [n_kv, *]: kv head g at column g*head_dim */
    int kv_stride;
    int n_q, n_kv;
    int causal; /* query i sits at absolute position q_pos0 + i and sees keys 0..q_pos0+i; 0: every key */
    int q_pos0;
};

/* Scaled dot-product attention over the rows r, float32 softmax, with the heads of
 * `heads` (common/attention_heads.h, the GPU kernels' description too). */
void op_attention(const struct attention_rows *r, const struct attention_heads *heads);

/* silu(z) = z * sigmoid(z). y[i] = silu(gate[i]) * up[i]. y may alias either. */
void op_silu_mul(float *y, const float *gate, const float *up, size_t n);
void op_silu(float *y, const float *x, size_t n);

/* In-place softmax of x[n] in float32 (max-subtracted). */
void op_softmax(float *x, int n);

/* y[i] += x[i] */
void op_add(float *y, const float *x, size_t n);

/* The two halves of a LoRA product y += scale * B (A x), kept apart because the
 * small [n, rank] middle is what a batch of rows with different adapters shares:
 * op_lora_down: t[n, rank] = x[n, in] . a[rank, in]^T;
 * op_lora_up:   y[n, out] += scale * (t[n, rank] . b[out, rank]^T), the product
 * summed in float32 before it is scaled and added. */
void op_lora_down(float *t, const float *x, const float *a, int n, int in, int rank);
void op_lora_up(float *y, const float *t, const float *b, float scale, int n, int rank, int out);

#endif
