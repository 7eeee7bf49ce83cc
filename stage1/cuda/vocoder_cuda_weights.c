/* Host side of the CUDA vocoder: the loaded CPU vocoder's folded weights rearranged into
 * the layouts its GEMMs and kernels read (stage1/cuda/vocoder_cuda_internal.h). */
#include "stage1/cuda/vocoder_cuda_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* Two passes over the same walk: the first (arenas NULL) only counts elements. */
struct wb {
    float *gemm, *f32;
    size_t n_gemm, n_f32;
};

static size_t wb_take_gemm(struct wb *b, size_t n)
{
    size_t off = b->n_gemm;
    b->n_gemm += n;
    return off;
}

static size_t wb_take_f32(struct wb *b, const float *src, size_t n)
{
    size_t off = b->n_f32;
    b->n_f32 += n;
    if (b->f32) memcpy(b->f32 + off, src, sizeof(float) * n);
    return off;
}

static void wb_conv(struct wb *b, const struct vocoder_conv_ref *r, struct vocoder_cuda_conv *cv)
{
    *cv = (struct vocoder_cuda_conv){.c_in = r->c_in, .c_out = r->c_out, .k = r->k};
    cv->w = wb_take_gemm(b, (size_t)r->c_out * r->c_in * r->k);
    if (b->gemm) vocoder_cuda_tap_major(b->gemm + cv->w, r->w, r->c_out, r->c_in, r->k);
    cv->b = wb_take_f32(b, r->b, (size_t)r->c_out);
}

static void wb_conv_t(struct wb *b, const struct vocoder_conv_ref *r, int s, struct vocoder_cuda_conv *cv)
{
    *cv = (struct vocoder_cuda_conv){.c_in = r->c_in, .c_out = r->c_out, .k = 2};
    cv->w = wb_take_gemm(b, (size_t)r->c_in * r->c_out * 2 * s);
    if (b->gemm) vocoder_cuda_phase_weights(b->gemm + cv->w, r->w, r->c_in, r->c_out, s);
    /* one bias per GEMM column (phase, channel) so that the epilogue adds it */
    cv->b = wb_take_f32(b, r->b, (size_t)r->c_out);
    for (int p = 1; p < s; p++)
        wb_take_f32(b, r->b, (size_t)r->c_out);
}

static void wb_conv_out(struct wb *b, const struct vocoder_conv_ref *r, struct vocoder_cuda_conv *cv)
{
    *cv = (struct vocoder_cuda_conv){.c_in = r->c_in, .c_out = r->c_out, .k = r->k};
    size_t n = (size_t)r->c_in * r->k;
    cv->w = b->n_f32;
    b->n_f32 += n;
    if (b->f32) vocoder_cuda_tap_major(b->f32 + cv->w, r->w, 1, r->c_in, r->k);
    cv->b = wb_take_f32(b, r->b, 1);
}

static void wb_run(struct wb *b, struct vocoder_cuda_weights *w, const struct vocoder_layers *l)
{
    wb_conv(b, &l->in_proj, &w->in_proj);
    wb_conv(b, &l->conv_in, &w->conv_in);
    for (int k = 0; k < l->n_blocks; k++) {
        w->alpha[k] = wb_take_f32(b, l->alpha[k], (size_t)l->up[k].c_in);
        wb_conv_t(b, &l->up[k], l->stride[k], &w->up[k]);
        for (int r = 0; r < VOCODER_RES_UNITS; r++) {
            int c = l->conv1[k][r].c_in;
            w->alpha1[k][r] = wb_take_f32(b, l->alpha1[k][r], (size_t)c);
            wb_conv(b, &l->conv1[k][r], &w->conv1[k][r]);
            w->alpha2[k][r] = wb_take_f32(b, l->alpha2[k][r], (size_t)c);
            wb_conv(b, &l->conv2[k][r], &w->conv2[k][r]);
        }
    }
    w->alpha_out = wb_take_f32(b, l->alpha_out, (size_t)l->conv_out.c_in);
    wb_conv_out(b, &l->conv_out, &w->conv_out);
}

int vocoder_cuda_weights_build(struct vocoder_cuda_weights *w, const struct vocoder_layers *l)
{
    memset(w, 0, sizeof *w);
    w->latent_channels = l->latent_channels;
    w->input_dim = l->input_dim;
    w->hidden_dim = l->hidden_dim;
    w->n_blocks = l->n_blocks;
    w->hop = l->hop;
    memcpy(w->stride, l->stride, sizeof w->stride);
    memcpy(w->dilation, l->dilation, sizeof w->dilation);
    struct wb b = {0};
    wb_run(&b, w, l);
    w->gemm = malloc(sizeof(float) * b.n_gemm);
    w->f32 = malloc(sizeof(float) * b.n_f32);
    if (!w->gemm || !w->f32) {
        vocoder_cuda_weights_free(w);
        return mm3_errorf(-ENOMEM, "vocoder_cuda: cannot allocate %zu bytes to rearrange the weights",
                          sizeof(float) * (b.n_gemm + b.n_f32));
    }
    w->n_gemm = b.n_gemm;
    w->n_f32 = b.n_f32;
    b = (struct wb){.gemm = w->gemm, .f32 = w->f32};
    wb_run(&b, w, l);
    return 0;
}

void vocoder_cuda_weights_free(struct vocoder_cuda_weights *w)
{
    free(w->gemm);
    free(w->f32);
    w->gemm = w->f32 = NULL;
    w->n_gemm = w->n_f32 = 0;
}

void vocoder_cuda_phase_weights(float *dst, const float *wt, int c_in, int c_out, int s)
{
    for (int r = 0; r < s; r++)
        for (int o = 0; o < c_out; o++)
            for (int i = 0; i < c_in; i++) {
                const float *src = wt + ((size_t)i * c_out + o) * 2 * s;
                float *d = dst + ((size_t)r * c_out + o) * 2 * c_in + i;
                d[0] = src[r + s];
                d[c_in] = src[r];
            }
}

void vocoder_cuda_tap_major(float *dst, const float *w, int c_out, int c_in, int k)
{
    for (int o = 0; o < c_out; o++)
        for (int i = 0; i < c_in; i++)
            for (int kk = 0; kk < k; kk++)
                dst[((size_t)o * k + kk) * c_in + i] = w[((size_t)o * c_in + i) * k + kk];
}
