/* 1-D convolution ops of the vocoder (DAC decoder): float32 CPU reference.
 *
 * Activations are channels-first [C, T] (row c holds the T samples of channel c),
 * exactly as PyTorch's Conv1d sees one batch item. Weights keep the PyTorch
 * layouts: Conv1d [C_out, C_in, k], ConvTranspose1d [C_in, C_out, k]. Padding is
 * zero padding. No op allocates; y never aliases x unless noted. */
#ifndef MM3_OPS_CONV_H
#define MM3_OPS_CONV_H

#include "common/conv1d_geometry.h"

/* Output length of op_conv1d: T + 2*pad - dilation*(k-1) (stride 1); <= 0 means no output. */
int op_conv1d_out_len(int t, int k, int dilation, int pad);

/* Conv1d, stride 1: y[o, n] = b[o] + sum_i sum_kk w[o, i, kk] * x[i, n - pad + kk*dilation],
 * x[C_in, T] (zero outside [0, T)), y[C_out, op_conv1d_out_len(T, k, dilation, pad)].
 * With pad = dilation*(k-1)/2 (odd k) the length is unchanged. b may be NULL.
 * g->stride is not read. */
void op_conv1d(float *y, const float *x, const float *w, const float *b, const struct conv1d_geometry *g);

/* Output length of op_conv_transpose1d: (T_in - 1)*stride - 2*pad + k (no output_padding). */
int op_conv_transpose1d_out_len(int t_in, int k, int stride, int pad);

/* ConvTranspose1d: y[o, n] = b[o] + sum over (i, m, kk) with m*stride - pad + kk = n of
 * x[i, m] * w[i, o, kk]; w is [C_in, C_out, k], x[C_in, T_in],
 * y[C_out, op_conv_transpose1d_out_len(T_in, k, stride, pad)]. b may be NULL.
 * g->dilation is not read. */
void op_conv_transpose1d(float *y, const float *x, const float *w, const float *b, const struct conv1d_geometry *g);

/* Snake activation per channel, as the reference writes it in float32:
 * y = x + (1 / (alpha + 1e-9)) * sin(alpha * x)^2, alpha[C] (the stored [1, C, 1]).
 * x, y [C, T]; y may alias x. */
void op_snake(float *y, const float *x, const float *alpha, int c, int t);

/* Fold PyTorch weight norm (dim 0 of the STORED tensor): for each row o < dim0,
 * w[o, :] = v[o, :] * (g[o] / ||v[o, :]||_2) over the `rest` elements of the row,
 * no epsilon (a zero row gives NaN, as in PyTorch). For Conv1d [C_out, C_in, k] the
 * rows are output channels; for ConvTranspose1d [C_in, C_out, k] they are INPUT
 * channels. g holds dim0 values (stored [dim0, 1, 1]). w may alias v. */
void op_weight_norm_fold(float *w, const float *g, const float *v, int dim0, int rest);

#endif
