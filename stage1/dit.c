/* DiT velocity network, float32 reference (stage1/dit.h). */
#include "stage1/dit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/ops.h"
#include "common/weights.h"

/* Sanity bound on every config.json size (keeps size products in range). */
#define DIT_MAX_SIZE (1 << 24)

/* The reference's RoPE base; not in config.json. */
#define DIT_ROPE_THETA 10000.0

struct dit_workspace {
    int max_L;
    float *h0;            /* [L, cat_dim] */
    float *h1;            /* [L, cat_dim] */
    float *x;             /* [T, hidden] residual stream */
    float *a;             /* [T, hidden] normed */
    float *q, *k, *v, *o; /* [T, hidden] */
    float *g;             /* [T, 2*ff_inner] */
    float *act;           /* [T, ff_inner] */
    float *y;             /* [L, in_ch] */
    float *yp;            /* [L, in_ch] */
    float *tf;            /* [fourier_dim] */
    float *t1;            /* [hidden] */
    int *pos;             /* [T] */
};

static int read_config(struct dit_config *g, const struct ckpt_component *c)
{
    int rc;
    if ((rc = weights_config_size(c, "in_channels", DIT_MAX_SIZE, &g->in_ch)) < 0 ||
        (rc = weights_config_size(c, "condition_dim", DIT_MAX_SIZE, &g->cond_dim)) < 0 ||
        (rc = weights_config_size(c, "num_layers", DIT_MAX_SIZE, &g->n_layers)) < 0 ||
        (rc = weights_config_size(c, "num_attention_heads", DIT_MAX_SIZE, &g->n_heads)) < 0 ||
        (rc = weights_config_size(c, "attention_head_dim", DIT_MAX_SIZE, &g->head_dim)) < 0 ||
        (rc = weights_config_size(c, "ff_inner_dim", DIT_MAX_SIZE, &g->ff_inner)) < 0 ||
        (rc = weights_config_size(c, "rotary_dim", DIT_MAX_SIZE, &g->rotary_dim)) < 0 ||
        (rc = weights_config_size(c, "fourier_embedding_dim", DIT_MAX_SIZE, &g->fourier_dim)) < 0)
        return rc;
    if (g->rotary_dim % 2 || g->rotary_dim > g->head_dim)
        return mm3_errorf(-EINVAL, "%s/config.json: rotary_dim %d: expected even and at most attention_head_dim %d",
                          c->dir, g->rotary_dim, g->head_dim);
    if (g->fourier_dim % 2)
        return mm3_errorf(-EINVAL, "%s/config.json: fourier_embedding_dim %d: expected even", c->dir, g->fourier_dim);
    g->hidden = g->n_heads * g->head_dim;
    g->cat_dim = 2 * g->in_ch + g->cond_dim;
    return 0;
}

static void build_table(struct dit_model *m, struct weight_table *t)
{
    const struct dit_config *g = &m->cfg;
    struct dit_weights *w = &m->w;
#define ADD(ptr, nd, name, ...) weight_table_add(t, ptr, nd, (int64_t[]){__VA_ARGS__}, "%s", name)
    ADD(&w->time_proj, 2, "time_proj.weight", g->fourier_dim / 2, 1);
    ADD(&w->t1_w, 2, "time_embed.linear_1.weight", g->hidden, g->fourier_dim);
    ADD(&w->t1_b, 1, "time_embed.linear_1.bias", g->hidden);
    ADD(&w->t2_w, 2, "time_embed.linear_2.weight", g->hidden, g->hidden);
    ADD(&w->t2_b, 1, "time_embed.linear_2.bias", g->hidden);
    ADD(&w->pre_w, 3, "preprocess_conv.weight", g->cat_dim, g->cat_dim, 1);
    ADD(&w->proj_in, 2, "proj_in.weight", g->hidden, g->cat_dim);
    ADD(&w->proj_out, 2, "proj_out.weight", g->in_ch, g->hidden);
    ADD(&w->post_w, 3, "postprocess_conv.weight", g->in_ch, g->in_ch, 1);
#undef ADD
    int64_t hd = g->hidden, ff = g->ff_inner;
    for (int i = 0; i < g->n_layers; i++) {
        struct dit_layer *l = &w->layers[i];
        const struct weight_leaf leaves[] = {
            {&l->norm1_w, "norm1.weight", hd, 0},      {&l->norm1_b, "norm1.bias", hd, 0},
            {&l->wq, "attn.to_q.weight", hd, hd},      {&l->wk, "attn.to_k.weight", hd, hd},
            {&l->wv, "attn.to_v.weight", hd, hd},      {&l->wo, "attn.to_out.0.weight", hd, hd},
            {&l->norm2_w, "norm2.weight", hd, 0},      {&l->norm2_b, "norm2.bias", hd, 0},
            {&l->ff_in_w, "ff_in.weight", 2 * ff, hd}, {&l->ff_in_b, "ff_in.bias", 2 * ff, 0},
            {&l->ff_out_w, "ff_out.weight", hd, ff},   {&l->ff_out_b, "ff_out.bias", hd, 0},
        };
        char prefix[64];
        snprintf(prefix, sizeof prefix, "transformer_blocks.%d.", i);
        weight_table_add_leaves(t, prefix, leaves, (int)(sizeof leaves / sizeof leaves[0]));
    }
}

/* config.json, and the weight table of that geometry (common/weights.h). */
static int dit_describe(void *model, const struct ckpt_component *c, struct weight_table *t)
{
    struct dit_model *m = model;
    int rc = read_config(&m->cfg, c);
    if (rc < 0) return rc;
    m->w.layers = calloc((size_t)m->cfg.n_layers, sizeof *m->w.layers);
    if (!m->w.layers) return mm3_errorf(-ENOMEM, "transformer: out of memory");
    build_table(m, t);
    return 0;
}

int dit_load(struct dit_model **out, const char *ckpt_root)
{
    *out = NULL;
    struct dit_model *m = calloc(1, sizeof *m);
    if (!m) return mm3_errorf(-ENOMEM, "transformer: out of memory");
    int rc = weights_component_load(ckpt_root, "transformer", m, dit_describe, &m->arena, &m->arena_floats);
    if (rc == 0 && !(m->inv_freq = malloc(sizeof(float) * (size_t)(m->cfg.rotary_dim / 2 + 1))))
        rc = mm3_errorf(-ENOMEM, "transformer: out of memory");
    if (rc < 0) {
        dit_free(m);
        return mm3_error_prefix(rc, "loading transformer: ");
    }
    op_rope_inv_freq(m->inv_freq, DIT_ROPE_THETA, m->cfg.rotary_dim);
    *out = m;
    return 0;
}

void dit_free(struct dit_model *m)
{
    if (!m) return;
    free(m->arena);
    free(m->w.layers);
    free(m->inv_freq);
    free(m);
}

void dit_drop_weights(struct dit_model *m)
{
    free(m->arena);
    free(m->w.layers);
    memset(&m->w, 0, sizeof m->w);
    m->arena = NULL;
    m->arena_floats = 0;
}

int dit_workspace_alloc(struct dit_workspace **out, const struct dit_model *m, int max_L)
{
    *out = NULL;
    const struct dit_config *g = &m->cfg;
    if (max_L < 1) return mm3_errorf(-EINVAL, "dit workspace: max_L %d: expected >= 1", max_L);
    struct dit_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return mm3_errorf(-ENOMEM, "dit workspace: out of memory");
    size_t L = (size_t)max_L, T = L + 1;
    ws->max_L = max_L;
    ws->h0 = malloc(sizeof(float) * L * g->cat_dim);
    ws->h1 = malloc(sizeof(float) * L * g->cat_dim);
    ws->x = malloc(sizeof(float) * T * g->hidden);
    ws->a = malloc(sizeof(float) * T * g->hidden);
    ws->q = malloc(sizeof(float) * T * g->hidden);
    ws->k = malloc(sizeof(float) * T * g->hidden);
    ws->v = malloc(sizeof(float) * T * g->hidden);
    ws->o = malloc(sizeof(float) * T * g->hidden);
    ws->g = malloc(sizeof(float) * T * 2 * g->ff_inner);
    ws->act = malloc(sizeof(float) * T * g->ff_inner);
    ws->y = malloc(sizeof(float) * L * g->in_ch);
    ws->yp = malloc(sizeof(float) * L * g->in_ch);
    ws->tf = malloc(sizeof(float) * g->fourier_dim);
    ws->t1 = malloc(sizeof(float) * g->hidden);
    ws->pos = malloc(sizeof(int) * T);
    if (!ws->h0 || !ws->h1 || !ws->x || !ws->a || !ws->q || !ws->k || !ws->v || !ws->o || !ws->g || !ws->act ||
        !ws->y || !ws->yp || !ws->tf || !ws->t1 || !ws->pos) {
        dit_workspace_free(ws);
        return mm3_errorf(-ENOMEM, "dit workspace: out of memory for %d latents", max_L);
    }
    for (size_t i = 0; i < T; i++)
        ws->pos[i] = (int)i;
    *out = ws;
    return 0;
}

void dit_workspace_free(struct dit_workspace *ws)
{
    if (!ws) return;
    free(ws->h0), free(ws->h1), free(ws->x), free(ws->a), free(ws->q), free(ws->k), free(ws->v), free(ws->o);
    free(ws->g), free(ws->act), free(ws->y), free(ws->yp), free(ws->tf), free(ws->t1), free(ws->pos);
    free(ws);
}

void dit_time_features(const struct dit_model *m, float t, float *out)
{
    int half = m->cfg.fourier_dim / 2;
    /* torch: (2.0 * math.pi * t) @ W^T -> the double 2 pi is rounded to float first */
    float tt = (float)(2.0 * M_PI) * t;
    for (int k = 0; k < half; k++) {
        float ang = tt * m->w.time_proj[k];
        out[k] = cosf(ang);
        out[half + k] = sinf(ang);
    }
}

static void forward_one(const struct dit_model *m, struct dit_workspace *ws, int L, const float *x, float t,
                        const float *cond, float *v)
{
    const struct dit_config *g = &m->cfg;
    const struct dit_weights *w = &m->w;
    int T = L + 1, D = g->hidden, Cc = g->cat_dim, C = g->in_ch;

    /* 1. [x, zeros, cond] per latent, residual 1x1 conv, proj_in into rows 1..L */
    for (int j = 0; j < L; j++) {
        float *r = ws->h0 + (size_t)j * Cc;
        for (int c = 0; c < C; c++)
            r[c] = x[(size_t)c * L + j];
        memset(r + C, 0, sizeof(float) * C);
        if (cond)
            memcpy(r + 2 * C, cond + (size_t)j * g->cond_dim, sizeof(float) * g->cond_dim);
        else
            memset(r + 2 * C, 0, sizeof(float) * g->cond_dim);
    }
    op_matmul(ws->h1, ws->h0, w->pre_w, NULL, L, Cc, Cc);
    op_add(ws->h1, ws->h0, (size_t)L * Cc);
    op_matmul(ws->x + D, ws->h1, w->proj_in, NULL, L, Cc, D);

    /* 2. time token in row 0 */
    dit_time_features(m, t, ws->tf);
    op_matmul(ws->t1, ws->tf, w->t1_w, w->t1_b, 1, g->fourier_dim, D);
    op_silu(ws->t1, ws->t1, (size_t)D);
    op_matmul(ws->x, ws->t1, w->t2_w, w->t2_b, 1, D, D);

    /* 3. blocks */
    const struct attention_heads heads = {g->n_heads, g->n_heads, g->head_dim, 1.0f / sqrtf((float)g->head_dim)};
    for (int i = 0; i < g->n_layers; i++) {
        const struct dit_layer *l = &w->layers[i];
        op_layernorm(ws->a, ws->x, l->norm1_w, l->norm1_b, T, D, 1e-5f);
        op_matmul(ws->q, ws->a, l->wq, NULL, T, D, D);
        op_matmul(ws->k, ws->a, l->wk, NULL, T, D, D);
        op_matmul(ws->v, ws->a, l->wv, NULL, T, D, D);
        op_rope(ws->q, T, D, g->n_heads, g->head_dim, g->rotary_dim, ws->pos, m->inv_freq);
        op_rope(ws->k, T, D, g->n_heads, g->head_dim, g->rotary_dim, ws->pos, m->inv_freq);
        op_attention(&(struct attention_rows){.out = ws->o,
                                              .out_stride = D,
                                              .q = ws->q,
                                              .q_stride = D,
                                              .k = ws->k,
                                              .v = ws->v,
                                              .kv_stride = D,
                                              .n_q = T,
                                              .n_kv = T},
                     &heads);
        op_matmul(ws->a, ws->o, l->wo, NULL, T, D, D);
        op_add(ws->x, ws->a, (size_t)T * D);

        op_layernorm(ws->a, ws->x, l->norm2_w, l->norm2_b, T, D, 1e-5f);
        op_matmul(ws->g, ws->a, l->ff_in_w, l->ff_in_b, T, D, 2 * g->ff_inner);
        for (int r = 0; r < T; r++) {
            const float *gr = ws->g + (size_t)r * 2 * g->ff_inner;
            op_silu_mul(ws->act + (size_t)r * g->ff_inner, gr + g->ff_inner, gr, (size_t)g->ff_inner);
        }
        op_matmul(ws->a, ws->act, l->ff_out_w, l->ff_out_b, T, g->ff_inner, D);
        op_add(ws->x, ws->a, (size_t)T * D);
    }

    /* 4. drop the time token, proj_out, residual 1x1 conv, back to channels-first */
    op_matmul(ws->y, ws->x + D, w->proj_out, NULL, L, D, C);
    op_matmul(ws->yp, ws->y, w->post_w, NULL, L, C, C);
    for (int j = 0; j < L; j++)
        for (int c = 0; c < C; c++)
            v[(size_t)c * L + j] = ws->yp[(size_t)j * C + c] + ws->y[(size_t)j * C + c];
}

int dit_forward(const struct dit_model *m, struct dit_workspace *ws, int B, int L, const float *x, const float *t,
                const float *const *cond, float *v_out)
{
    if (!m->arena) return mm3_errorf(-ENODATA, "dit_forward: the weights were dropped (dit_drop_weights)");
    if (L < 1 || L > ws->max_L)
        return mm3_errorf(-EINVAL, "dit_forward: %d latents: workspace holds 1..%d", L, ws->max_L);
    size_t per = (size_t)m->cfg.in_ch * L;
    for (int b = 0; b < B; b++)
        forward_one(m, ws, L, x + b * per, t[b], cond ? cond[b] : NULL, v_out + b * per);
    return 0;
}
