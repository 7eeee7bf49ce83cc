/* Host side of the CUDA vocoder: read <ckpt_root>/vocoder into one arena in the layouts
 * the kernels want (stage1/cuda/vocoder_cuda_internal.h). Same tensors, shapes and
 * weight-norm folding as stage1/vocoder.c, whose struct is private. */
#include "stage1/cuda/vocoder_cuda_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/ops_conv.h"

/* Two passes like vocoder.c: the first (arena NULL) only counts floats. */
struct wl {
    const struct ckpt_component *c;
    float *arena;
    size_t used;
};

static size_t wl_take(struct wl *l, size_t n)
{
    size_t off = l->used;
    l->used += n;
    return off;
}

static int wl_read(struct wl *l, const char *name, float *dst, int d0, int d1, int d2, int ndim)
{
    int64_t shape[3] = {d0, d1, d2};
    return ckpt_read_f32(l->c, name, dst, ndim, shape);
}

static int wl_alpha(struct wl *l, const char *prefix, int c, size_t *off)
{
    char name[160];
    snprintf(name, sizeof name, "%s.alpha", prefix);
    *off = wl_take(l, (size_t)c);
    return l->arena ? wl_read(l, name, l->arena + *off, 1, c, 1, 3) : 0;
}

static int wl_bias(struct wl *l, const char *prefix, struct vocoder_cuda_conv *cv)
{
    char name[160];
    snprintf(name, sizeof name, "%s.bias", prefix);
    cv->b = wl_take(l, (size_t)cv->c_out);
    return l->arena ? wl_read(l, name, l->arena + cv->b, cv->c_out, 0, 0, 1) : 0;
}

/* weight_v [d0, d1, k] folded with weight_g [d0, 1, 1] along dim 0 into dst. */
static int wl_fold(struct wl *l, const char *prefix, float *dst, int d0, int d1, int k)
{
    char name[160];
    float *g = malloc(sizeof(float) * (size_t)d0);
    if (!g) return mm3_errorf(-ENOMEM, "%s: out of memory", l->c->dir);
    snprintf(name, sizeof name, "%s.weight_v", prefix);
    int rc = wl_read(l, name, dst, d0, d1, k, 3);
    snprintf(name, sizeof name, "%s.weight_g", prefix);
    if (rc == 0) rc = wl_read(l, name, g, d0, 1, 1, 3);
    if (rc == 0) op_weight_norm_fold(dst, g, dst, d0, d1 * k);
    free(g);
    return rc;
}

static int wl_conv(struct wl *l, const char *prefix, struct vocoder_cuda_conv *cv, int c_in, int c_out, int k, int wn)
{
    char name[160];
    *cv = (struct vocoder_cuda_conv){.c_in = c_in, .c_out = c_out, .k = k};
    size_t n = (size_t)c_out * c_in * k;
    cv->w = wl_take(l, n);
    int rc = 0;
    if (l->arena) {
        float *tmp = malloc(sizeof(float) * n);
        if (!tmp) return mm3_errorf(-ENOMEM, "%s: out of memory", l->c->dir);
        snprintf(name, sizeof name, "%s.weight", prefix);
        rc = wn ? wl_fold(l, prefix, tmp, c_out, c_in, k) : wl_read(l, name, tmp, c_out, c_in, k, 3);
        if (rc == 0) vocoder_cuda_tap_major(l->arena + cv->w, tmp, c_out, c_in, k);
        free(tmp);
    }
    return rc ? rc : wl_bias(l, prefix, cv);
}

static int wl_conv_t(struct wl *l, const char *prefix, struct vocoder_cuda_conv *cv, int c_in, int c_out, int s)
{
    size_t n = (size_t)c_in * c_out * 2 * s;
    *cv = (struct vocoder_cuda_conv){.c_in = c_in, .c_out = c_out, .k = 2};
    cv->w = wl_take(l, n);
    if (l->arena) {
        float *tmp = malloc(sizeof(float) * n);
        if (!tmp) return mm3_errorf(-ENOMEM, "%s: out of memory", l->c->dir);
        int rc = wl_fold(l, prefix, tmp, c_in, c_out, 2 * s);
        if (rc == 0) vocoder_cuda_phase_weights(l->arena + cv->w, tmp, c_in, c_out, s);
        free(tmp);
        if (rc) return rc;
    }
    return wl_bias(l, prefix, cv);
}

static int wl_run(struct wl *l, struct vocoder_cuda_weights *w)
{
    char p[128];
    int rc = wl_conv(l, "dec_in_proj", &w->in_proj, w->latent_channels / 2, w->input_dim, 1, 0);
    if (rc == 0) rc = wl_conv(l, "conv_in", &w->conv_in, w->input_dim, w->hidden_dim, 7, 1);
    for (int b = 0; rc == 0 && b < w->n_blocks; b++) {
        int c_in = w->hidden_dim >> b, c_out = w->hidden_dim >> (b + 1);
        snprintf(p, sizeof p, "blocks.%d.snake1", b);
        rc = wl_alpha(l, p, c_in, &w->alpha[b]);
        snprintf(p, sizeof p, "blocks.%d.conv_t1", b);
        if (rc == 0) rc = wl_conv_t(l, p, &w->up[b], c_in, c_out, w->stride[b]);
        for (int r = 0; rc == 0 && r < VOCODER_CUDA_RES_UNITS; r++) {
            snprintf(p, sizeof p, "blocks.%d.res_unit%d.snake1", b, r + 1);
            rc = wl_alpha(l, p, c_out, &w->alpha1[b][r]);
            snprintf(p, sizeof p, "blocks.%d.res_unit%d.conv1", b, r + 1);
            if (rc == 0) rc = wl_conv(l, p, &w->conv1[b][r], c_out, c_out, 7, 1);
            snprintf(p, sizeof p, "blocks.%d.res_unit%d.snake2", b, r + 1);
            if (rc == 0) rc = wl_alpha(l, p, c_out, &w->alpha2[b][r]);
            snprintf(p, sizeof p, "blocks.%d.res_unit%d.conv2", b, r + 1);
            if (rc == 0) rc = wl_conv(l, p, &w->conv2[b][r], c_out, c_out, 1, 1);
        }
    }
    int c_last = w->hidden_dim >> w->n_blocks;
    if (rc == 0) rc = wl_alpha(l, "snake_out", c_last, &w->alpha_out);
    if (rc == 0) rc = wl_conv(l, "conv_out", &w->conv_out, c_last, 1, 7, 1);
    return rc;
}

static int wl_config(struct vocoder_cuda_weights *w, const struct ckpt_component *c)
{
    int64_t lat, in_dim, hid, rate, ratios[VOCODER_CUDA_MAX_BLOCKS + 1];
    int n = VOCODER_CUDA_MAX_BLOCKS + 1, rc;
    if ((rc = ckpt_config_int(c, "latent_channels", &lat)) < 0) return rc;
    if ((rc = ckpt_config_int(c, "decoder_input_dim", &in_dim)) < 0) return rc;
    if ((rc = ckpt_config_int(c, "decoder_hidden_dim", &hid)) < 0) return rc;
    if ((rc = ckpt_config_int(c, "sampling_rate", &rate)) < 0) return rc;
    if ((rc = ckpt_config_int_array(c, "upsampling_ratios", ratios, &n)) < 0) return rc;
    if (lat < 2 || lat % 2 || lat > 65536 || in_dim < 1 || in_dim > 65536 || hid < 1 || hid > 65536 || n < 1 ||
        n > VOCODER_CUDA_MAX_BLOCKS || hid % (1 << n))
        return mm3_errorf(-EINVAL,
                          "%s/config.json: latent_channels %lld, decoder_input_dim %lld, decoder_hidden_dim %lld "
                          "or %d upsampling_ratios out of range (see stage1/vocoder.c for the rules)",
                          c->dir, (long long)lat, (long long)in_dim, (long long)hid, n);
    int64_t hop = 1;
    for (int i = 0; i < n; i++) {
        if (ratios[i] < 2 || ratios[i] % 2 || ratios[i] > 64)
            return mm3_errorf(-EINVAL,
                              "%s/config.json: 'upsampling_ratios'[%d]: expected an even stride in [2, 64], got %lld",
                              c->dir, i, (long long)ratios[i]);
        hop *= ratios[i];
        w->stride[i] = (int)ratios[i];
    }
    if (hop > 65536)
        return mm3_errorf(-EINVAL, "%s/config.json: 'upsampling_ratios' multiply to %lld, expected at most 65536",
                          c->dir, (long long)hop);
    w->latent_channels = (int)lat;
    w->input_dim = (int)in_dim;
    w->hidden_dim = (int)hid;
    w->sample_rate = (int)rate;
    w->n_blocks = n;
    w->hop = (int)hop;
    return 0;
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

int vocoder_cuda_weights_load(struct vocoder_cuda_weights *w, const char *ckpt_root)
{
    memset(w, 0, sizeof *w);
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, ckpt_root, "vocoder");
    if (rc < 0) return rc;
    struct wl l = {.c = &c};
    if ((rc = wl_config(w, &c)) < 0) goto done;
    wl_run(&l, w); /* counting pass: cannot fail */
    w->n_floats = l.used;
    w->arena = malloc(sizeof(float) * l.used);
    if (!w->arena) {
        rc = mm3_errorf(-ENOMEM, "%s: cannot allocate %zu bytes of vocoder weights", c.dir, sizeof(float) * l.used);
        goto done;
    }
    l.arena = w->arena;
    l.used = 0;
    rc = wl_run(&l, w);
done:
    ckpt_component_close(&c);
    if (rc < 0) vocoder_cuda_weights_free(w);
    return rc;
}

void vocoder_cuda_weights_free(struct vocoder_cuda_weights *w)
{
    free(w->arena);
    w->arena = NULL;
    w->n_floats = 0;
}
