/* The MiniMax-Music3 vocoder (DAC-style decoder, diffusers MiniMaxMusic3Vocoder), float32 CPU.
 *
 * latents [latent_channels, L] -> stereo waveform [2, hop*L] at sampling_rate (44.1 kHz):
 * channels 0..latent_channels/2-1 are track 0 (left), the rest track 1 (right); each
 * track is decoded separately with the same weights:
 *   dec_in_proj (k1) -> conv_in (k7) -> per upsampling ratio s: Snake, ConvTranspose1d
 *   (k 2s, stride s, pad ceil(s/2)), 3 residual units (dilation 1, 3, 9) -> Snake ->
 *   conv_out (k7) -> tanh.
 * Every size comes from <root>/vocoder/config.json; weight norm (weight_g/weight_v)
 * is folded at load along dim 0 of the stored tensors.
 *
 *     struct vocoder *v;
 *     if ((rc = vocoder_load(&v, ckpt_root)) < 0) ... mm3_last_error() ...
 *     float *pcm = malloc(sizeof(float) * 2 * vocoder_hop(v) * L);
 *     vocoder_decode(v, latents, L, pcm);
 *     vocoder_free(v);
 */
#ifndef MM3_VOCODER_H
#define MM3_VOCODER_H

struct vocoder;

/* Open <ckpt_root>/vocoder, check every tensor's shape against config.json and the
 * tensor set for exactness, fold weight norm. Returns 0 or a negative errno with a
 * message naming the file/tensor; *v is NULL on error. */
int vocoder_load(struct vocoder **v, const char *ckpt_root);
void vocoder_free(struct vocoder *v);

/* latents [latent_channels, L] channels-first -> pcm [2, hop*L] channel-major,
 * tanh-bounded, not clamped. Allocates its scratch per call: three float buffers of the
 * largest activation, 96 x 512L floats in the release (3 x 135 MB for L = 689); const v,
 * so concurrent calls on one vocoder are safe. The CPU cost is about 0.8 G MAC per latent
 * and track in the release (0.7 s per latent on one core): a reference, not a server path.
 * Returns 0, -EINVAL for L < 1 or hop*L > 2^30, -ENOMEM. */
int vocoder_decode(const struct vocoder *v, const float *latents, int L, float *pcm);

/* Output samples per latent: the product of upsampling_ratios (512 in the release). */
int vocoder_hop(const struct vocoder *v);

/* latent_channels from config.json (128 in the release). */
int vocoder_latent_channels(const struct vocoder *v);

/* sampling_rate from config.json (44100 in the release). */
int vocoder_sample_rate(const struct vocoder *v);

#endif
