/* Internals of stage1/cuda/vocoder_cuda.h shared by its host-side weight builder
 * (vocoder_cuda_weights.c), its kernels and decode (vocoder_cuda.cu) and the tests. */
#ifndef MM3_STAGE1_CUDA_VOCODER_CUDA_INTERNAL_H
#define MM3_STAGE1_CUDA_VOCODER_CUDA_INTERNAL_H

#include <stddef.h>

#include "common/conv1d_geometry.h"
#include "common/deploy.h"
#include "stage1/vocoder.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One convolution: w is an offset (in elements) into the GEMM weight arena, laid out as
 * the GEMM's [N][K] (Conv1d tap-major [c_out][k][c_in], vocoder_cuda_tap_major; a
 * ConvTranspose1d of stride s as [s][c_out][2][c_in], vocoder_cuda_phase_weights, with
 * k = 2 taps), except conv_out, whose [k][c_in] float32 weights sit in the float32 arena.
 * b is an offset into the float32 arena: [c_out], or [s][c_out] (the bias repeated per
 * phase) for a ConvTranspose1d. */
struct vocoder_cuda_conv {
    size_t w, b;
    int c_in, c_out, k;
};

struct vocoder_cuda_weights {
    int latent_channels, input_dim, hidden_dim, n_blocks, hop;
    int stride[VOCODER_MAX_BLOCKS], dilation[VOCODER_RES_UNITS];
    struct vocoder_cuda_conv in_proj, conv_in, conv_out;
    struct vocoder_cuda_conv up[VOCODER_MAX_BLOCKS];
    struct vocoder_cuda_conv conv1[VOCODER_MAX_BLOCKS][VOCODER_RES_UNITS];
    struct vocoder_cuda_conv conv2[VOCODER_MAX_BLOCKS][VOCODER_RES_UNITS];
    size_t alpha[VOCODER_MAX_BLOCKS], alpha_out; /* float32 arena */
    size_t alpha1[VOCODER_MAX_BLOCKS][VOCODER_RES_UNITS];
    size_t alpha2[VOCODER_MAX_BLOCKS][VOCODER_RES_UNITS];
    float *gemm; /* host, float32: every GEMM's weights */
    size_t n_gemm;
    float *f32; /* host: biases, Snake alphas, conv_out's weights */
    size_t n_f32;
};

/* The kernels' layouts of l's weights (host arrays; sizes copied). 0 or -ENOMEM. */
int vocoder_cuda_weights_build(struct vocoder_cuda_weights *w, const struct vocoder_layers *l);
void vocoder_cuda_weights_free(struct vocoder_cuda_weights *w);

/* ConvTranspose1d weights wt [c_in, c_out, 2s] -> dst [s][c_out][2][c_in]: phase r
 * (outputs n = q*s + r - s/2) reads x[q-1] with wt[i, o, r+s] (tap 0) and x[q] with
 * wt[i, o, r] (tap 1). */
void vocoder_cuda_phase_weights(float *dst, const float *wt, int c_in, int c_out, int s);

/* Conv1d weights w [c_out, c_in, k] -> dst [c_out, k, c_in] (dst != w). */
void vocoder_cuda_tap_major(float *dst, const float *w, int c_out, int c_in, int k);

/* Single layers on host arrays (upload, run the decode's device path, download), for the
 * tests: `batch` independent channels-first items [C, T] like common/ops_conv.h, each
 * through op_snake with alpha (NULL: no Snake) and then, for the geometry g,
 *   conv1d: op_conv1d (odd k, pad dilation*(k-1)/2), GEMMs in precision prec;
 *   conv_transpose1d: op_conv_transpose1d (k 2s, stride s, pad (s+1)/2; w in the stored
 *     layout [c_in, c_out, 2s]), GEMMs in precision prec;
 *   conv_out: op_conv1d to one channel (c_out 1, odd k <= 17, dilation 1, pad (k-1)/2,
 *     w [1, c_in, k]) and tanh, float32.
 * 0, -EINVAL (with a message naming the field) for a geometry the decode does not run,
 * or another negative errno. */
int vocoder_cuda_conv1d_host(float *y, const float *x, const float *alpha, const float *w, const float *b, int batch,
                             const struct conv1d_geometry *g, enum mm3_matmul_precision prec);
int vocoder_cuda_conv_transpose1d_host(float *y, const float *x, const float *alpha, const float *w, const float *b,
                                       int batch, const struct conv1d_geometry *g, enum mm3_matmul_precision prec);
int vocoder_cuda_conv_out_host(float *y, const float *x, const float *alpha, const float *w, const float *b, int batch,
                               const struct conv1d_geometry *g);

#ifdef __cplusplus
}
#endif

#endif
