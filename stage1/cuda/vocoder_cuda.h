/* The vocoder (stage1/vocoder.h) on the GPU: float32 kernels, both stereo tracks as a
 * batch of 2, the same contract as vocoder_decode.
 *
 * Every convolution is an implicit GEMM with float32 accumulation (only the summation
 * order differs from the CPU reference: rel ~1e-6 on a whole window; optional TF32
 * tensor cores, vocoder_cuda_set_tf32). ConvTranspose1d
 * (k 2s, stride s, pad s/2) runs as s phase convolutions of 2 taps each, its weights
 * rearranged at load. Snake is its own elementwise pass; the residual add is fused into
 * the k1 conv, tanh into conv_out. Weight norm is folded at load with the CPU's
 * op_weight_norm_fold, so the weights are bit for bit the CPU vocoder's.
 *
 * The CPU vocoder's struct is private to stage1/vocoder.c, so the weights are read from
 * the checkpoint again (<ckpt_root>/vocoder); load the CPU vocoder first where the
 * tensor set must be checked for exactness (vocoder_load does that, this does not).
 *
 *     struct vocoder_cuda *h;
 *     if ((rc = vocoder_cuda_create(&h, ckpt_root, max_L)) < 0) ... mm3_last_error() ...
 *     vocoder_cuda_decode(h, latents, L, pcm);   // host arrays, L <= max_L
 *     vocoder_cuda_free(h);
 *
 * One handle decodes one window at a time (not thread safe). Only built with CUDA
 * (MM3_HAVE_CUDA); the header needs no CUDA header. */
#ifndef MM3_STAGE1_CUDA_VOCODER_CUDA_H
#define MM3_STAGE1_CUDA_VOCODER_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

struct vocoder_cuda;
struct render_decoder;

/* Read and fold <ckpt_root>/vocoder (sizes from its config.json), upload the weights and
 * reserve device buffers for windows of up to max_L latents (3 x 2 x the largest
 * activation: 3 x 271 MB for the release at 689). Needs a current CUDA device.
 * Returns 0 or a negative errno with a message naming the file/tensor. */
int vocoder_cuda_create(struct vocoder_cuda **out, const char *ckpt_root, int max_L);
void vocoder_cuda_free(struct vocoder_cuda *h);

/* latents [latent_channels, L] channels-first (host) -> pcm [2, hop*L] channel-major
 * (host), tanh-bounded, not clamped; synchronous. -EINVAL for L < 1 or L > max_L,
 * -EIO for a CUDA failure. */
int vocoder_cuda_decode(struct vocoder_cuda *h, const float *latents, int L, float *pcm);

/* TF32 tensor cores (mma.sync, fp32 accumulate) for every convolution instead of fp32
 * FMAs: several times faster, rel ~1e-3 against the CPU instead of ~1e-6. Off at create. */
void vocoder_cuda_set_tf32(struct vocoder_cuda *h, int on);

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
