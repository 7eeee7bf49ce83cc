/* The vocoder (stage1/vocoder.h): loading with weight-norm folding, and the
 * float32 CPU decode built from common/ops_conv.h. */
#include "stage1/vocoder.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/log.h"
#include "common/ops.h"
#include "common/ops_conv.h"
#include "common/weights.h"

/* Fixed by the architecture (diffusers MiniMaxMusic3Vocoder), not by config.json. */
#define VOC_K 7 /* conv_in, residual conv1, conv_out */
static const int voc_dilations[VOCODER_RES_UNITS] = {1, 3, 9};

struct voc_conv {
    float *w; /* stored layout, weight norm folded: Conv1d [c_out, c_in, k]; transposed [c_in, c_out, k] */
    float *b; /* [c_out] */
    float *g; /* weight_g while loading (folded into w) */
    int c_in, c_out, k;
};

struct voc_res_unit {
    float *alpha1, *alpha2; /* [c] */
    struct voc_conv conv1;  /* k 7, dilation d, pad 3d */
    struct voc_conv conv2;  /* k 1 */
    int dilation;
};

struct voc_block {
    float *alpha;       /* [c_in] */
    struct voc_conv up; /* ConvTranspose1d k 2s, stride s, pad ceil(s/2) */
    int stride;
    struct voc_res_unit res[VOCODER_RES_UNITS];
};

struct vocoder {
    int latent_channels; /* both tracks; each track has latent_channels / 2 */
    int input_dim, hidden_dim;
    int n_blocks, hop, sample_rate;
    struct voc_conv in_proj; /* plain Conv1d k1 [input_dim, latent_channels/2, 1] */
    struct voc_conv conv_in; /* [hidden_dim, input_dim, 7] */
    struct voc_block blocks[VOCODER_MAX_BLOCKS];
    float *alpha_out;         /* [hidden_dim >> n_blocks] */
    struct voc_conv conv_out; /* [1, hidden_dim >> n_blocks, 7] */
    float *arena;             /* every weight above, one allocation */
    size_t arena_floats;
};

/* ---- loading ---------------------------------------------------------------------------- */

/* Two walks over the same description: the first adds every tensor to the weight table
 * (common/weights.h), the second, once the table is read, folds the weight norms. */
struct voc_loader {
    struct weight_table *t; /* NULL: folding walk */
};

static void loader_tensor(struct voc_loader *ld, const char *name, int ndim, const int64_t *shape, float **out)
{
    if (ld->t) weight_table_add(ld->t, out, ndim, shape, "%s", name);
}

static void loader_alpha(struct voc_loader *ld, const char *prefix, int c, float **out)
{
    char name[160];
    snprintf(name, sizeof name, "%s.alpha", prefix);
    loader_tensor(ld, name, 3, (int64_t[]){1, c, 1}, out);
}

static void loader_plain_conv(struct voc_loader *ld, const char *prefix, struct voc_conv *cv, int c_in, int c_out,
                              int k)
{
    char name[160];
    if (!ld->t) return;
    *cv = (struct voc_conv){.c_in = c_in, .c_out = c_out, .k = k};
    snprintf(name, sizeof name, "%s.weight", prefix);
    loader_tensor(ld, name, 3, (int64_t[]){c_out, c_in, k}, &cv->w);
    snprintf(name, sizeof name, "%s.bias", prefix);
    loader_tensor(ld, name, 1, (int64_t[]){c_out}, &cv->b);
}

/* weight_v / weight_g / bias; the norm runs over dim 0 of the stored tensor, which is
 * c_out for Conv1d and c_in for ConvTranspose1d ([in, out, k]). */
static void loader_wn_conv(struct voc_loader *ld, const char *prefix, struct voc_conv *cv, int c_in, int c_out, int k,
                           int transposed)
{
    char name[160];
    int d0 = transposed ? c_in : c_out, d1 = transposed ? c_out : c_in;
    if (!ld->t) {
        op_weight_norm_fold(cv->w, cv->g, cv->w, d0, d1 * k);
        return;
    }
    *cv = (struct voc_conv){.c_in = c_in, .c_out = c_out, .k = k};
    snprintf(name, sizeof name, "%s.weight_v", prefix);
    loader_tensor(ld, name, 3, (int64_t[]){d0, d1, k}, &cv->w);
    snprintf(name, sizeof name, "%s.weight_g", prefix);
    loader_tensor(ld, name, 3, (int64_t[]){d0, 1, 1}, &cv->g);
    snprintf(name, sizeof name, "%s.bias", prefix);
    loader_tensor(ld, name, 1, (int64_t[]){c_out}, &cv->b);
}

static void loader_run(struct voc_loader *ld, struct vocoder *v)
{
    char p[128];
    loader_plain_conv(ld, "dec_in_proj", &v->in_proj, v->latent_channels / 2, v->input_dim, 1);
    loader_wn_conv(ld, "conv_in", &v->conv_in, v->input_dim, v->hidden_dim, VOC_K, 0);
    for (int b = 0; b < v->n_blocks; b++) {
        struct voc_block *blk = &v->blocks[b];
        int c_in = v->hidden_dim >> b, c_out = v->hidden_dim >> (b + 1), s = blk->stride;
        snprintf(p, sizeof p, "blocks.%d.snake1", b);
        loader_alpha(ld, p, c_in, &blk->alpha);
        snprintf(p, sizeof p, "blocks.%d.conv_t1", b);
        loader_wn_conv(ld, p, &blk->up, c_in, c_out, 2 * s, 1);
        for (int r = 0; r < VOCODER_RES_UNITS; r++) {
            struct voc_res_unit *ru = &blk->res[r];
            ru->dilation = voc_dilations[r];
            snprintf(p, sizeof p, "blocks.%d.res_unit%d.snake1", b, r + 1);
            loader_alpha(ld, p, c_out, &ru->alpha1);
            snprintf(p, sizeof p, "blocks.%d.res_unit%d.conv1", b, r + 1);
            loader_wn_conv(ld, p, &ru->conv1, c_out, c_out, VOC_K, 0);
            snprintf(p, sizeof p, "blocks.%d.res_unit%d.snake2", b, r + 1);
            loader_alpha(ld, p, c_out, &ru->alpha2);
            snprintf(p, sizeof p, "blocks.%d.res_unit%d.conv2", b, r + 1);
            loader_wn_conv(ld, p, &ru->conv2, c_out, c_out, 1, 0);
        }
    }
    int c_last = v->hidden_dim >> v->n_blocks;
    loader_alpha(ld, "snake_out", c_last, &v->alpha_out);
    loader_wn_conv(ld, "conv_out", &v->conv_out, c_last, 1, VOC_K, 0);
}

/* Sizes from config.json, checked so that every later size computation is in range. */
static int vocoder_config_read(struct vocoder *v, const struct ckpt_component *c)
{
    int64_t lat, in_dim, hid, rate, ratios[VOCODER_MAX_BLOCKS + 1];
    int n = VOCODER_MAX_BLOCKS + 1, rc;
    if ((rc = ckpt_config_int(c, "latent_channels", &lat)) < 0) return rc;
    if ((rc = ckpt_config_int(c, "decoder_input_dim", &in_dim)) < 0) return rc;
    if ((rc = ckpt_config_int(c, "decoder_hidden_dim", &hid)) < 0) return rc;
    if ((rc = ckpt_config_int(c, "sampling_rate", &rate)) < 0) return rc;
    if ((rc = ckpt_config_int_array(c, "upsampling_ratios", ratios, &n)) < 0) return rc;
    if (lat < 2 || lat % 2 || lat > 65536)
        return mm3_errorf(-EINVAL,
                          "%s/config.json: key 'latent_channels': expected an even integer in [2, 65536] "
                          "(two stereo tracks), got %lld",
                          c->dir, (long long)lat);
    if (in_dim < 1 || in_dim > 65536)
        return mm3_errorf(-EINVAL, "%s/config.json: key 'decoder_input_dim': expected [1, 65536], got %lld", c->dir,
                          (long long)in_dim);
    if (hid < 1 || hid > 65536)
        return mm3_errorf(-EINVAL, "%s/config.json: key 'decoder_hidden_dim': expected [1, 65536], got %lld", c->dir,
                          (long long)hid);
    if (rate < 1 || rate > 1000000)
        return mm3_errorf(-EINVAL, "%s/config.json: key 'sampling_rate': expected [1, 1000000], got %lld", c->dir,
                          (long long)rate);
    if (n < 1 || n > VOCODER_MAX_BLOCKS)
        return mm3_errorf(-EINVAL, "%s/config.json: key 'upsampling_ratios': expected 1 to %d ratios, got %d", c->dir,
                          VOCODER_MAX_BLOCKS, n);
    if (hid % (1 << n))
        return mm3_errorf(-EINVAL,
                          "%s/config.json: 'decoder_hidden_dim' %lld must be divisible by 2^%d (each of the %d "
                          "blocks halves the channels)",
                          c->dir, (long long)hid, n, n);
    int64_t hop = 1;
    for (int i = 0; i < n; i++) {
        /* ConvTranspose1d(k 2s, stride s, pad ceil(s/2)) gives exactly s*T only for even s */
        if (ratios[i] < 2 || ratios[i] % 2 || ratios[i] > 64)
            return mm3_errorf(-EINVAL,
                              "%s/config.json: key 'upsampling_ratios'[%d]: expected an even stride in [2, 64], "
                              "got %lld",
                              c->dir, i, (long long)ratios[i]);
        hop *= ratios[i];
    }
    if (hop > 65536)
        return mm3_errorf(-EINVAL,
                          "%s/config.json: 'upsampling_ratios' multiply to %lld samples per latent, expected at "
                          "most 65536",
                          c->dir, (long long)hop);
    v->latent_channels = (int)lat;
    v->input_dim = (int)in_dim;
    v->hidden_dim = (int)hid;
    v->sample_rate = (int)rate;
    v->n_blocks = n;
    v->hop = (int)hop;
    for (int i = 0; i < n; i++)
        v->blocks[i].stride = (int)ratios[i];
    return 0;
}

/* config.json, and the weight table of that geometry (common/weights.h). */
static int vocoder_describe(void *model, const struct ckpt_component *c, struct weight_table *t)
{
    struct vocoder *v = model;
    int rc = vocoder_config_read(v, c);
    if (rc < 0) return rc;
    loader_run(&(struct voc_loader){.t = t}, v);
    return 0;
}

int vocoder_load(struct vocoder **out, const char *ckpt_root)
{
    *out = NULL;
    struct vocoder *v = calloc(1, sizeof *v);
    if (!v) return mm3_errorf(-ENOMEM, "vocoder: out of memory");
    int rc = weights_component_load(ckpt_root, "vocoder", v, vocoder_describe, &v->arena, &v->arena_floats);
    if (rc < 0) {
        vocoder_free(v);
        return rc;
    }
    loader_run(&(struct voc_loader){.t = NULL}, v); /* fold the weight norms */
    LOG_INFO("vocoder: %d latent channels, %d -> %d channels, %d blocks, hop %d, %.3f M parameters", v->latent_channels,
             v->input_dim, v->hidden_dim, v->n_blocks, v->hop, (double)v->arena_floats / 1e6);
    *out = v;
    return 0;
}

void vocoder_free(struct vocoder *v)
{
    if (!v) return;
    free(v->arena);
    free(v);
}

int vocoder_hop(const struct vocoder *v)
{
    return v->hop;
}
int vocoder_latent_channels(const struct vocoder *v)
{
    return v->latent_channels;
}
int vocoder_sample_rate(const struct vocoder *v)
{
    return v->sample_rate;
}

static struct vocoder_conv_ref conv_ref(const struct voc_conv *cv)
{
    return (struct vocoder_conv_ref){.w = cv->w, .b = cv->b, .c_in = cv->c_in, .c_out = cv->c_out, .k = cv->k};
}

int vocoder_layers_get(const struct vocoder *v, struct vocoder_layers *out)
{
    memset(out, 0, sizeof *out);
    if (!v->arena) return mm3_errorf(-ENODATA, "vocoder_layers_get: the weights were dropped (vocoder_drop_weights)");
    out->latent_channels = v->latent_channels;
    out->input_dim = v->input_dim;
    out->hidden_dim = v->hidden_dim;
    out->n_blocks = v->n_blocks;
    out->hop = v->hop;
    out->sample_rate = v->sample_rate;
    for (int r = 0; r < VOCODER_RES_UNITS; r++)
        out->dilation[r] = voc_dilations[r];
    out->in_proj = conv_ref(&v->in_proj);
    out->conv_in = conv_ref(&v->conv_in);
    out->conv_out = conv_ref(&v->conv_out);
    out->alpha_out = v->alpha_out;
    for (int b = 0; b < v->n_blocks; b++) {
        const struct voc_block *blk = &v->blocks[b];
        out->stride[b] = blk->stride;
        out->alpha[b] = blk->alpha;
        out->up[b] = conv_ref(&blk->up);
        for (int r = 0; r < VOCODER_RES_UNITS; r++) {
            out->alpha1[b][r] = blk->res[r].alpha1;
            out->alpha2[b][r] = blk->res[r].alpha2;
            out->conv1[b][r] = conv_ref(&blk->res[r].conv1);
            out->conv2[b][r] = conv_ref(&blk->res[r].conv2);
        }
    }
    return 0;
}

void vocoder_drop_weights(struct vocoder *v)
{
    free(v->arena);
    v->arena = NULL;
    v->arena_floats = 0;
    /* every weight pointer pointed into the arena */
    v->in_proj = v->conv_in = v->conv_out = (struct voc_conv){0};
    v->alpha_out = NULL;
    for (int b = 0; b < v->n_blocks; b++) {
        int s = v->blocks[b].stride;
        memset(&v->blocks[b], 0, sizeof v->blocks[b]);
        v->blocks[b].stride = s;
    }
}

/* ---- decoding ---------------------------------------------------------------------------- */

static void conv(float *y, const float *x, const struct voc_conv *cv, int t, int dilation)
{
    struct conv1d_geometry g = {.c_in = cv->c_in,
                                .c_out = cv->c_out,
                                .t = t,
                                .k = cv->k,
                                .dilation = dilation,
                                .pad = dilation * (cv->k - 1) / 2};
    op_conv1d(y, x, cv->w, cv->b, &g);
}

/* One track: u [latent_channels/2, L] -> y [hop*L]. a, r1, r2 hold max_floats each. */
static void vocoder_decode_track(const struct vocoder *v, const float *u, int L, float *y, float *a, float *r1,
                                 float *r2)
{
    conv(r1, u, &v->in_proj, L, 1);
    conv(a, r1, &v->conv_in, L, 1);
    int t = L;
    for (int b = 0; b < v->n_blocks; b++) {
        const struct voc_block *blk = &v->blocks[b];
        int s = blk->stride, c = blk->up.c_out;
        op_snake(r1, a, blk->alpha, blk->up.c_in, t);
        CHECK(op_conv_transpose1d_out_len(t, 2 * s, s, (s + 1) / 2) == s * t);
        struct conv1d_geometry up = {
            .c_in = blk->up.c_in, .c_out = c, .t = t, .k = 2 * s, .stride = s, .pad = (s + 1) / 2};
        op_conv_transpose1d(a, r1, blk->up.w, blk->up.b, &up);
        t *= s;
        for (int r = 0; r < VOCODER_RES_UNITS; r++) {
            const struct voc_res_unit *ru = &blk->res[r];
            op_snake(r1, a, ru->alpha1, c, t);
            conv(r2, r1, &ru->conv1, t, ru->dilation);
            op_snake(r2, r2, ru->alpha2, c, t);
            conv(r1, r2, &ru->conv2, t, 1);
            op_add(a, r1, (size_t)c * t);
        }
    }
    op_snake(r1, a, v->alpha_out, v->conv_out.c_in, t);
    conv(y, r1, &v->conv_out, t, 1);
    for (int n = 0; n < t; n++)
        y[n] = tanhf(y[n]);
}

int vocoder_decode(const struct vocoder *v, const float *latents, int L, float *pcm)
{
    if (!v->arena) return mm3_errorf(-ENODATA, "vocoder_decode: the weights were dropped (vocoder_drop_weights)");
    if (L < 1) return mm3_errorf(-EINVAL, "vocoder_decode: latent length %d, expected >= 1", L);
    if ((int64_t)L * v->hop > INT32_MAX / 2)
        return mm3_errorf(-EINVAL, "vocoder_decode: latent length %d gives more than 2^30 samples per channel", L);
    /* Largest activation [C, T] of any stage; the three scratch buffers each hold one. */
    size_t t = (size_t)L, max_floats = (size_t)v->input_dim * t;
    if ((size_t)v->hidden_dim * t > max_floats) max_floats = (size_t)v->hidden_dim * t;
    for (int b = 0; b < v->n_blocks; b++) {
        t *= (size_t)v->blocks[b].stride;
        size_t f = (size_t)v->blocks[b].up.c_out * t;
        if (f > max_floats) max_floats = f;
    }
    float *a = malloc(max_floats * sizeof(float));
    float *r1 = malloc(max_floats * sizeof(float));
    float *r2 = malloc(max_floats * sizeof(float));
    int rc = 0;
    if (!a || !r1 || !r2) {
        rc = mm3_errorf(-ENOMEM, "vocoder_decode: cannot allocate 3 x %zu bytes of scratch for %d latents",
                        max_floats * sizeof(float), L);
    } else {
        int half = v->latent_channels / 2;
        size_t samples = (size_t)v->hop * L;
        for (int track = 0; track < 2; track++)
            vocoder_decode_track(v, latents + (size_t)track * half * L, L, pcm + track * samples, a, r1, r2);
    }
    free(a);
    free(r1);
    free(r2);
    return rc;
}
