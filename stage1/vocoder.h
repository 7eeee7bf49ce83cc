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

#ifdef __cplusplus
extern "C" { /* read by the CUDA backend's .cu files */
#endif

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
 * and track in the release (far from real time on one core): a reference, not a server path.
 * Returns 0, -EINVAL for L < 1 or hop*L > 2^30, -ENOMEM, -ENODATA after
 * vocoder_drop_weights. */
int vocoder_decode(const struct vocoder *v, const float *latents, int L, float *pcm);

/* Output samples per latent: the product of upsampling_ratios (512 in the release). */
int vocoder_hop(const struct vocoder *v);

/* latent_channels from config.json (128 in the release). */
int vocoder_latent_channels(const struct vocoder *v);

/* sampling_rate from config.json (44100 in the release). */
int vocoder_sample_rate(const struct vocoder *v);

/* ---- the folded layers, for a backend that uploads them (stage1/cuda/vocoder_cuda.h) ---- */

#define VOCODER_MAX_BLOCKS 8 /* upsampling blocks config.json may ask for */
#define VOCODER_RES_UNITS 3  /* residual units per block (dilations 1, 3, 9), fixed by the architecture */

/* One convolution as vocoder_decode runs it: w in the stored layout with weight norm
 * folded (Conv1d [c_out, c_in, k]; ConvTranspose1d [c_in, c_out, k]), b [c_out]. */
struct vocoder_conv_ref {
    const float *w, *b;
    int c_in, c_out, k;
};

/* Every size and weight of a loaded vocoder, in decode order (see the top of this file).
 * Block b: snake alpha[b] [c_in], up[b] ConvTranspose1d (k 2*stride[b], stride[b], pad
 * stride[b]/2), residual unit r: snake alpha1[b][r], conv1[b][r] (k 7, dilation
 * dilation[r], pad 3*dilation[r]), snake alpha2[b][r], conv2[b][r] (k 1), added to the
 * block's stream. Then snake alpha_out, conv_out (k 7, c_out 1), tanh. The pointers
 * borrow v's weights: valid until vocoder_free or vocoder_drop_weights. */
struct vocoder_layers {
    int latent_channels, input_dim, hidden_dim, n_blocks, hop, sample_rate;
    int stride[VOCODER_MAX_BLOCKS];
    int dilation[VOCODER_RES_UNITS];
    struct vocoder_conv_ref in_proj, conv_in, conv_out;
    struct vocoder_conv_ref up[VOCODER_MAX_BLOCKS];
    struct vocoder_conv_ref conv1[VOCODER_MAX_BLOCKS][VOCODER_RES_UNITS];
    struct vocoder_conv_ref conv2[VOCODER_MAX_BLOCKS][VOCODER_RES_UNITS];
    const float *alpha[VOCODER_MAX_BLOCKS], *alpha_out;
    const float *alpha1[VOCODER_MAX_BLOCKS][VOCODER_RES_UNITS];
    const float *alpha2[VOCODER_MAX_BLOCKS][VOCODER_RES_UNITS];
};

/* Fill *out from v. -ENODATA (message says so) after vocoder_drop_weights. */
int vocoder_layers_get(const struct vocoder *v, struct vocoder_layers *out);

/* Free the float32 weights once a GPU copy made from them is all that decodes: the
 * sizes stay (vocoder_hop etc.), vocoder_decode and vocoder_layers_get then fail with
 * -ENODATA. Saves ~220 MB of host memory in the release. */
void vocoder_drop_weights(struct vocoder *v);

#ifdef __cplusplus
}
#endif

#endif
