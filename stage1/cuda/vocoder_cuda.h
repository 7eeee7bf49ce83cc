/* The vocoder (stage1/vocoder.h) on the GPU: both stereo tracks in one pass, the same
 * contract as vocoder_decode.
 *
 * Activations are time-major ([track][T][C]), so every convolution is a cuBLASLt GEMM
 * (stage1/cuda/dit_gemm.h) over rows = time: a k-tap dilated Conv1d is one GEMM with
 * K = k*C on an operand gathered by one pass that also applies the Snake in front of
 * it; a ConvTranspose1d (k 2s, stride s) is one GEMM with N = s*c_out on a 2-tap operand
 * whose output rows, read s at a time, are already the upsampled sequence. Bias and the
 * residual add ride in the GEMM epilogue; conv_out (c_out 1) with its Snake and tanh is
 * one float32 kernel. The GEMMs run in the stage's matmul precision: fp32 (float32
 * FMAs, only the summation order differs from the CPU), tf32 (tensor cores on float32
 * operands) or bf16 (bf16 operands); accumulation and every activation stay float32.
 *
 * Built from the already loaded CPU vocoder (its folded weights), which may then drop
 * its copy (vocoder_drop_weights):
 *
 *     struct vocoder_cuda *h;
 *     if ((rc = vocoder_cuda_create(&h, voc, MM3_MATMUL_BF16, max_L)) < 0) ... mm3_last_error() ...
 *     vocoder_cuda_decode(h, latents, L, pcm);   // host arrays, L <= max_L
 *     vocoder_cuda_free(h);
 *
 * One handle decodes one window at a time (not thread safe). Only built with CUDA
 * (MM3_HAVE_CUDA); the header needs no CUDA header. */
#ifndef MM3_STAGE1_CUDA_VOCODER_CUDA_H
#define MM3_STAGE1_CUDA_VOCODER_CUDA_H

#include "common/deploy.h" /* enum mm3_matmul_precision */

#ifdef __cplusplus
extern "C" {
#endif

struct vocoder;
struct vocoder_cuda;
struct render_decoder;

/* Upload v's folded weights (GEMM weights as bf16 in bf16 precision), reserve device
 * buffers for windows of up to max_L latents and run one decode of max_L zeros, which
 * picks (times) every GEMM's cuBLASLt algorithm at the window shape; shorter windows
 * later take cuBLASLt's first heuristic choice, untimed. Memory for the release at
 * max_L 689: ~0.8 GB of float32 activations + the gathered GEMM operand, 7 x 2 x
 * 352768 x 96 elements (1.9 GB fp32/tf32, 0.95 GB bf16). Needs a current CUDA device;
 * v's weights are not needed after it returns. 0 or a negative errno with a message. */
int vocoder_cuda_create(struct vocoder_cuda **out, const struct vocoder *v, enum mm3_matmul_precision prec, int max_L);
void vocoder_cuda_free(struct vocoder_cuda *h);

/* latents [latent_channels, L] channels-first (host) -> pcm [2, hop*L] channel-major
 * (host), tanh-bounded, not clamped; synchronous. -EINVAL for L < 1 or L > max_L,
 * -ENODEV/-ENOMEM for a CUDA or cuBLASLt failure. */
int vocoder_cuda_decode(struct vocoder_cuda *h, const float *latents, int L, float *pcm);

enum mm3_matmul_precision vocoder_cuda_precision(const struct vocoder_cuda *h);
int vocoder_cuda_hop(const struct vocoder_cuda *h);
int vocoder_cuda_latent_channels(const struct vocoder_cuda *h);
int vocoder_cuda_max_L(const struct vocoder_cuda *h);

/* The decode as a render decoder (stage1/render.h): ctx = h, hop, decode. h must outlive
 * the render. (stage1/cuda/vocoder_cuda_decoder.c) */
int vocoder_cuda_render_decoder(struct vocoder_cuda *h, struct render_decoder *out);

/* Time one decode of L latents (L <= max_L) on random latents: warm-up, then `reps`
 * timed decodes between CUDA events (device time, transfers included); *ms_median. */
int vocoder_cuda_bench(struct vocoder_cuda *h, int L, int reps, float *ms_median);

#ifdef __cplusplus
}
#endif

#endif
