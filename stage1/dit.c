/* DiT velocity network, float32 reference (stage1/dit.h). */
#include "stage1/dit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/ops.h"

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

static int config_get(const struct ckpt_component *c, const char *key, int *out)
{
    int64_t v;
    int rc = ckpt_config_int(c, key, &v);
    if (rc < 0) return rc;
    if (v < 1 || v > (1 << 24))
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected a positive size, got %lld", c->dir, key,
                          (long long)v);
    *out = (int)v;
    return 0;
}

static int read_config(struct dit_config *g, const struct ckpt_component *c)
{
    int rc;
    if ((rc = config_get(c, "in_channels", &g->in_ch)) < 0 || (rc = config_get(c, "condition_dim", &g->cond_dim)) < 0 ||
        (rc = config_get(c, "num_layers", &g->n_layers)) < 0 ||
        (rc = config_get(c, "num_attention_heads", &g->n_heads)) < 0 ||
        (rc = config_get(c, "attention_head_dim", &g->head_dim)) < 0 ||
        (rc = config_get(c, "ff_inner_dim", &g->ff_inner)) < 0 ||
        (rc = config_get(c, "rotary_dim", &g->rotary_dim)) < 0 ||
        (rc = config_get(c, "fourier_embedding_dim", &g->fourier_dim)) < 0)
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

/* One entry of the weight table: where a tensor goes and the shape it must have. */
struct wspec {
    char name[96];
    float **dst;
    int ndim;
    int64_t shape[3];
};

static int build_table(struct dit_model *m, struct wspec *t)
{
    const struct dit_config *g = &m->cfg;
    struct dit_weights *w = &m->w;
    int n = 0;
#define ADD(nm, ptr, nd, ...)                                                                                          \
    do {                                                                                                               \
        snprintf(t[n].name, sizeof t[n].name, "%s", nm);                                                               \
        t[n].dst = (ptr);                                                                                              \
        t[n].ndim = (nd);                                                                                              \
        int64_t s_[3] = {__VA_ARGS__};                                                                                 \
        memcpy(t[n].shape, s_, sizeof s_);                                                                             \
        n++;                                                                                                           \
    } while (0)
    ADD("time_proj.weight", &w->time_proj, 2, g->fourier_dim / 2, 1);
    ADD("time_embed.linear_1.weight", &w->t1_w, 2, g->hidden, g->fourier_dim);
    ADD("time_embed.linear_1.bias", &w->t1_b, 1, g->hidden);
    ADD("time_embed.linear_2.weight", &w->t2_w, 2, g->hidden, g->hidden);
    ADD("time_embed.linear_2.bias", &w->t2_b, 1, g->hidden);
    ADD("preprocess_conv.weight", &w->pre_w, 3, g->cat_dim, g->cat_dim, 1);
    ADD("proj_in.weight", &w->proj_in, 2, g->hidden, g->cat_dim);
    ADD("proj_out.weight", &w->proj_out, 2, g->in_ch, g->hidden);
    ADD("postprocess_conv.weight", &w->post_w, 3, g->in_ch, g->in_ch, 1);
    for (int i = 0; i < g->n_layers; i++) {
        struct dit_layer *l = &w->layers[i];
        char b[64];
#define LADD(suffix, ptr, nd, ...)                                                                                     \
    do {                                                                                                               \
        snprintf(b, sizeof b, "transformer_blocks.%d.%s", i, suffix);                                                  \
        ADD(b, ptr, nd, __VA_ARGS__);                                                                                  \
    } while (0)
        LADD("norm1.weight", &l->norm1_w, 1, g->hidden);
        LADD("norm1.bias", &l->norm1_b, 1, g->hidden);
        LADD("attn.to_q.weight", &l->wq, 2, g->hidden, g->hidden);
        LADD("attn.to_k.weight", &l->wk, 2, g->hidden, g->hidden);
        LADD("attn.to_v.weight", &l->wv, 2, g->hidden, g->hidden);
        LADD("attn.to_out.0.weight", &l->wo, 2, g->hidden, g->hidden);
        LADD("norm2.weight", &l->norm2_w, 1, g->hidden);
        LADD("norm2.bias", &l->norm2_b, 1, g->hidden);
        LADD("ff_in.weight", &l->ff_in_w, 2, 2 * g->ff_inner, g->hidden);
        LADD("ff_in.bias", &l->ff_in_b, 1, 2 * g->ff_inner);
        LADD("ff_out.weight", &l->ff_out_w, 2, g->hidden, g->ff_inner);
        LADD("ff_out.bias", &l->ff_out_b, 1, g->hidden);
#undef LADD
    }
#undef ADD
    return n;
}

static int load_from(struct dit_model *m, struct ckpt_component *c)
{
    int rc = read_config(&m->cfg, c);
    if (rc < 0) return rc;
    const struct dit_config *g = &m->cfg;
    m->w.layers = calloc((size_t)g->n_layers, sizeof *m->w.layers);
    struct wspec *t = calloc(9 + 12 * (size_t)g->n_layers, sizeof *t);
    m->inv_freq = malloc(sizeof(float) * (size_t)(g->rotary_dim / 2 + 1));
    if (!m->w.layers || !t || !m->inv_freq) {
        free(t);
        return mm3_errorf(-ENOMEM, "transformer: out of memory");
    }
    int n = build_table(m, t);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t e = 1;
        for (int d = 0; d < t[i].ndim; d++)
            e *= (size_t)t[i].shape[d];
        total += e;
    }
    m->arena = malloc(sizeof(float) * total);
    if (!m->arena) {
        free(t);
        return mm3_errorf(-ENOMEM, "transformer: out of memory for %zu weights", total);
    }
    m->arena_floats = total;
    float *p = m->arena;
    for (int i = 0; i < n && rc == 0; i++) {
        *t[i].dst = p;
        rc = ckpt_read_f32(c, t[i].name, p, t[i].ndim, t[i].shape);
        size_t e = 1;
        for (int d = 0; d < t[i].ndim; d++)
            e *= (size_t)t[i].shape[d];
        p += e;
    }
    if (rc == 0 && c->n_tensors != n)
        rc = mm3_errorf(-EINVAL, "%s: %d tensors: expected exactly %d for %d layers", c->dir, c->n_tensors, n,
                        g->n_layers);
    free(t);
    if (rc < 0) return rc;
    op_rope_inv_freq(m->inv_freq, DIT_ROPE_THETA, g->rotary_dim);
    return 0;
}

int dit_load(struct dit_model **out, const char *ckpt_root)
{
    *out = NULL;
    struct dit_model *m = calloc(1, sizeof *m);
    if (!m) return mm3_errorf(-ENOMEM, "transformer: out of memory");
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, ckpt_root, "transformer");
    if (rc < 0) {
        free(m);
        return rc;
    }
    rc = load_from(m, &c);
    ckpt_component_close(&c);
    if (rc < 0) {
        dit_free(m);
        return mm3_error_prefix(rc, "loading transformer: ");
    }
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
    float scale = 1.0f / sqrtf((float)g->head_dim);
    for (int i = 0; i < g->n_layers; i++) {
        const struct dit_layer *l = &w->layers[i];
        op_layernorm(ws->a, ws->x, l->norm1_w, l->norm1_b, T, D, 1e-5f);
        op_matmul(ws->q, ws->a, l->wq, NULL, T, D, D);
        op_matmul(ws->k, ws->a, l->wk, NULL, T, D, D);
        op_matmul(ws->v, ws->a, l->wv, NULL, T, D, D);
        op_rope(ws->q, T, D, g->n_heads, g->head_dim, g->rotary_dim, ws->pos, m->inv_freq);
        op_rope(ws->k, T, D, g->n_heads, g->head_dim, g->rotary_dim, ws->pos, m->inv_freq);
        op_attention(ws->o, D, ws->q, D, ws->k, ws->v, D, T, T, g->n_heads, g->n_heads, g->head_dim, 0, 0, scale);
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
    if (L < 1 || L > ws->max_L)
        return mm3_errorf(-EINVAL, "dit_forward: %d latents: workspace holds 1..%d", L, ws->max_L);
    size_t per = (size_t)m->cfg.in_ch * L;
    for (int b = 0; b < B; b++)
        forward_one(m, ws, L, x + b * per, t[b], cond ? cond[b] : NULL, v_out + b * per);
    return 0;
}
