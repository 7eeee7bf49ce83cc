/* Internals of stage1/cuda/vocoder_cuda.h shared by its C loader
 * (vocoder_cuda_weights.c), its kernels (vocoder_cuda.cu) and the tests. */
#ifndef MM3_STAGE1_CUDA_VOCODER_CUDA_INTERNAL_H
#define MM3_STAGE1_CUDA_VOCODER_CUDA_INTERNAL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VOCODER_CUDA_MAX_BLOCKS 8
#define VOCODER_CUDA_RES_UNITS 3

/* Offsets (in floats) into the weight arena. Conv1d weights tap-major [c_out, k, c_in]
 * (vocoder_cuda_tap_major: a K step of the GEMM then reads one tap); a transposed conv
 * (stride s) is stored as s phases of a 2-tap Conv1d, [s][c_out][2][c_in]
 * (vocoder_cuda_phase_weights). */
struct vocoder_cuda_conv {
    size_t w, b;
    int c_in, c_out, k;
};

struct vocoder_cuda_weights {
    int latent_channels, input_dim, hidden_dim, n_blocks, hop, sample_rate;
    int stride[VOCODER_CUDA_MAX_BLOCKS];
    struct vocoder_cuda_conv in_proj, conv_in, conv_out;
    struct vocoder_cuda_conv up[VOCODER_CUDA_MAX_BLOCKS];
    struct vocoder_cuda_conv conv1[VOCODER_CUDA_MAX_BLOCKS][VOCODER_CUDA_RES_UNITS];
    struct vocoder_cuda_conv conv2[VOCODER_CUDA_MAX_BLOCKS][VOCODER_CUDA_RES_UNITS];
    size_t alpha[VOCODER_CUDA_MAX_BLOCKS], alpha_out;
    size_t alpha1[VOCODER_CUDA_MAX_BLOCKS][VOCODER_CUDA_RES_UNITS];
    size_t alpha2[VOCODER_CUDA_MAX_BLOCKS][VOCODER_CUDA_RES_UNITS];
    float *arena; /* host */
    size_t n_floats;
};

/* Read <ckpt_root>/vocoder into w (folded, phases rearranged). 0 or negative errno. */
int vocoder_cuda_weights_load(struct vocoder_cuda_weights *w, const char *ckpt_root);
void vocoder_cuda_weights_free(struct vocoder_cuda_weights *w);

/* ConvTranspose1d weights wt [c_in, c_out, 2s] -> dst [s][c_out][2][c_in]: phase r
 * (outputs n = q*s + r - s/2) reads x[q-1] with wt[i, o, r+s] (tap 0) and x[q] with
 * wt[i, o, r] (tap 1). */
void vocoder_cuda_phase_weights(float *dst, const float *wt, int c_in, int c_out, int s);

/* Conv1d weights w [c_out, c_in, k] -> dst [c_out, k, c_in] (dst != w). */
void vocoder_cuda_tap_major(float *dst, const float *w, int c_out, int c_in, int k);

/* Single kernels on host arrays (upload, run, download), for the tests (tf32: the
 * tensor-core variant): the shapes and
 * contracts of op_conv1d (pad = dilation*(k-1)/2, odd k), op_conv_transpose1d (k 2s,
 * stride s, pad s/2; weights in the STORED layout [c_in, c_out, 2s]) and op_snake, on
 * a batch of `batch` independent [C, T] items. 0 or -EIO/-ENOMEM. */
int vocoder_cuda_conv1d_host(float *y, const float *x, const float *w, const float *b, int batch, int c_in, int c_out,
                             int t, int k, int dilation, int tf32);
int vocoder_cuda_conv_transpose1d_host(float *y, const float *x, const float *w, const float *b, int batch, int c_in,
                                       int c_out, int t_in, int s, int tf32);
int vocoder_cuda_snake_host(float *y, const float *x, const float *alpha, int batch, int c, int t);

#ifdef __cplusplus
}
#endif

#endif
