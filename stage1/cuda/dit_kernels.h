/* The CUDA kernels of the DiT forward (stage1/cuda/dit_cuda.h), callable from C so
 * that each one is tested against its float32 reference in common/ops.h.
 *
 * Device pointers are plain pointers; `stream` is a cudaStream_t (NULL = legacy
 * default stream). Activations that feed a GEMM ("operands") are stored in the GEMM's
 * operand type (`out_fmt`, enum dit_operand: float32, bf16 or fp16 bit patterns), so a
 * reduced-precision GEMM reads them without a separate conversion pass. Everything else
 * is float32.
 *
 * Every function returns 0 or a negative errno code with a message (common/error.h):
 * -EINVAL bad arguments, -ENODEV a CUDA error. Launches are asynchronous. */
#ifndef MM3_STAGE1_CUDA_DIT_KERNELS_H
#define MM3_STAGE1_CUDA_DIT_KERNELS_H

#include <stddef.h>

#include "common/deploy.h" /* enum mm3_matmul_precision */

#ifdef __cplusplus
extern "C" {
#endif

/* How a kernel stores the GEMM operands it writes. F16_SCALED stores v / DIT_F16_RESCUE_SCALE:
 * the rerun of a window whose fp16 operands overflowed, its GEMMs scaled back by alpha (an
 * exact power of two, so only values below ~2^-6 lose bits to fp16's subnormals). */
enum dit_operand { DIT_OPERAND_F32 = 0, DIT_OPERAND_BF16 = 1, DIT_OPERAND_F16 = 2, DIT_OPERAND_F16_SCALED = 3 };
#define DIT_F16_RESCUE_SCALE 256.0f

/* Windows and decodes rerun with scaled operands because plain fp16 ones overflowed, in
 * this process so far (stage 1 reports it in /metrics). */
unsigned long long dit_cuda_f16_rescues(void);
void dit_cuda_count_f16_rescue(void);

/* The operand type of a matmul precision's dit_gemm_run (fp32 and tf32 GEMMs read float32;
 * fp8's e4m3 rows are dit_fp8.h's, its other GEMMs run in fp16). */
static inline enum dit_operand dit_operand_of(enum mm3_matmul_precision p)
{
    return p == MM3_MATMUL_BF16                          ? DIT_OPERAND_BF16
           : p == MM3_MATMUL_FP16 || p == MM3_MATMUL_FP8 ? DIT_OPERAND_F16
                                                         : DIT_OPERAND_F32;
}

/* The rows of a LayerNorm: LayerNorm(x) * w + b of x[n, dim] (biased variance,
 * two-pass mean/variance in float32, as op_layernorm); b may be NULL. Shared by
 * dit_cuda_layernorm and dit_fp8_layernorm. */
struct dit_layernorm {
    const float *x, *w, *b;
    int n, dim;
    float eps;
};

/* y[n, dim] = the rows of ln, in operand type out_fmt. */
int dit_cuda_layernorm(void *y, int out_fmt, const struct dit_layernorm *ln, void *stream);

/* cs[T, rotary_dim]: per position p < T, cos(ang_i) for i < rotary_dim/2 then sin(ang_i),
 * ang_i = fp32(inv_freq[i] * fp32(p)) (inv_freq on the device, from op_rope_inv_freq). */
int dit_cuda_rope_table(float *cs, const float *inv_freq, int T, int rotary_dim, void *stream);

/* The token rows and heads of the DiT's attention: n_seq sequences of T tokens (token
 * row r at position r % T), n_heads heads of head_dim values, RoPE over the first
 * rotary_dim dims of each head (0: none). */
struct dit_heads {
    int n_seq, T, n_heads, head_dim, rotary_dim;
};

/* op_rope in place on x[n_seq * T, *] (row stride `stride`) for the heads h (rotary_dim
 * >= 2), using the table of dit_cuda_rope_table. */
int dit_cuda_rope(float *x, int stride, const struct dit_heads *h, const float *cs, void *stream);

/* Bidirectional multi-head attention of heads.n_seq sequences of heads.T tokens, flash style
 * (online float32 softmax, nothing of size T x T in memory). */
struct dit_attention {
    void *out;        /* [n_seq * T, n_heads * head_dim] in operand type out_fmt */
    int out_fmt;      /* enum dit_operand */
    const float *qkv; /* [n_seq * T, 3 * n_heads * head_dim]: q, then k, then v; head h at column h*head_dim */
    struct dit_heads heads;
    const float *cs; /* dit_cuda_rope_table's; NULL: no RoPE */
    float scale;     /* scores are q . k * scale */
    enum mm3_matmul_precision prec;
};

/* RoPE (cs, position = token index) is applied to q and k on load when a->cs != NULL
 * (rotary_dim > 0). Products: fp32 SIMT (MM3_MATMUL_FP32), tensor cores with tf32, bf16
 * or fp16 operands and float32 accumulation otherwise (fp16: the FLASH kernels; WMMA and a
 * rescue run, out_fmt DIT_OPERAND_F16_SCALED, in tf32). MM3_MATMUL_FP8 computes as fp16
 * (fp8 is for the DiT's GEMMs). head_dim must be 32, 64 or 128. */
int dit_cuda_attention(const struct dit_attention *a, void *stream);

/* The attention kernels behind dit_cuda_attention (tests and benchmark pick one):
 * SIMT float32 (any precision: computes in fp32), WMMA (tf32 or bf16: S and O pass
 * through shared memory), MMA (bf16 only: mma.sync, everything in registers, 64
 * queries per block), FLASH (tf32, bf16 or fp16: mma.sync with ldmatrix,
 * double-buffered K/V tiles, 128 queries = 8 warps x 16 rows; dit_attention_flash.cu).
 * FLASH needs rotary_dim % 8 == 0 and 16-byte aligned qkv / cs (8-byte aligned out);
 * otherwise it runs as WMMA (tf32) or MMA (bf16), which is why those two ship.
 * AUTO = SIMT for fp32, FLASH for tf32, bf16 and fp16, unless dit_cuda_attention_default_set
 * says otherwise. */
enum dit_attn_kernel { DIT_ATTN_AUTO = 0, DIT_ATTN_SIMT, DIT_ATTN_WMMA, DIT_ATTN_MMA, DIT_ATTN_FLASH };
int dit_cuda_attention_kernel(const struct dit_attention *a, enum dit_attn_kernel kernel, void *stream);

/* What DIT_ATTN_AUTO (and so dit_cuda_attention and the DiT forward) runs in precision
 * prec from now on, process-wide; DIT_ATTN_AUTO restores the built-in choice. For
 * benchmarks comparing kernels inside whole forwards: call it while no forward runs.
 * -EINVAL when the kernel does not compute in that precision. */
int dit_cuda_attention_default_set(enum mm3_matmul_precision prec, enum dit_attn_kernel kernel);

/* act[n, ff] = g[:, :ff] * silu(g[:, ff:]) for g[n, 2*ff] (value rows then gate rows of
 * ff_in, as op_silu_mul(act, gate, up)). */
int dit_cuda_silu_gate(void *act, int out_fmt, const float *g, int n, int ff, void *stream);

/* y[i] = silu(x[i]) */
int dit_cuda_silu(void *y, int out_fmt, const float *x, size_t n, void *stream);

/* dst[i] = src[i] in operand type fmt (round to nearest even). */
int dit_cuda_to_operand(void *dst, int fmt, const float *src, size_t n, void *stream);

/* out[b, fourier_dim] = cos(ang) then sin(ang), ang[k] = fp32(fp32(2 pi) * t[b]) * time_proj[k]
 * (dit_time_features); t[B] and time_proj[fourier_dim/2] on the device. */
int dit_cuda_time_features(float *out, const float *t, const float *time_proj, int B, int fourier_dim, void *stream);

/* One sequence's DiT input rows: h0[j, :] = [x[:, j], zeros(in_ch), cond[j, :]] for
 * x[in_ch, L] channels-first and cond[L, cond_dim] (NULL: zeros). */
int dit_cuda_embed_input(float *h0, const float *x, const float *cond, int L, int in_ch, int cond_dim, void *stream);

/* v[c, j] = y[j, c] for one sequence (y[L, in_ch] row-major back to channels-first). */
int dit_cuda_transpose_out(float *v, const float *y, int L, int in_ch, void *stream);

#ifdef __cplusplus
}
#endif

#endif
