#include "stage0/depth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/log.h"
#include "common/ops.h"

static int config_pos_int(const struct ckpt_component *c, const char *key, int *out)
{
    int64_t v;
    int rc = ckpt_config_int(c, key, &v);
    if (rc < 0) return rc;
    if (v <= 0 || v > (1 << 30))
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected a positive size, got %lld", c->dir, key,
                          (long long)v);
    *out = (int)v;
    return 0;
}

static int read_config(struct depth_config *cfg, const struct ckpt_component *c)
{
    int rc;
    if ((rc = config_pos_int(c, "hidden_size", &cfg->hidden)) < 0 ||
        (rc = config_pos_int(c, "num_layers", &cfg->n_layers)) < 0 ||
        (rc = config_pos_int(c, "num_attention_heads", &cfg->n_heads)) < 0 ||
        (rc = config_pos_int(c, "intermediate_size", &cfg->ffn)) < 0 ||
        (rc = config_pos_int(c, "audio_vocab_size", &cfg->audio_vocab)) < 0 ||
        (rc = config_pos_int(c, "num_codebooks", &cfg->n_codebooks)) < 0 ||
        (rc = config_pos_int(c, "max_position_embeddings", &cfg->max_pos)) < 0)
        return rc;
    if (cfg->hidden % cfg->n_heads)
        return mm3_errorf(-EINVAL, "%s/config.json: hidden_size %d not divisible by num_attention_heads %d", c->dir,
                          cfg->hidden, cfg->n_heads);
    if (cfg->n_codebooks < 2 || cfg->max_pos < cfg->n_codebooks)
        return mm3_errorf(
            -EINVAL,
            "%s/config.json: need num_codebooks >= 2 and max_position_embeddings >= num_codebooks, got %d "
            "and %d",
            c->dir, cfg->n_codebooks, cfg->max_pos);
    cfg->head_dim = cfg->hidden / cfg->n_heads;
    cfg->eps = 1e-6f;
    return 0;
}

static int read_w(const struct ckpt_component *c, const char *name, float *dst, int64_t d0, int64_t d1)
{
    if (d1 > 0) return ckpt_read_f32(c, name, dst, 2, (int64_t[]){d0, d1});
    return ckpt_read_f32(c, name, dst, 1, (int64_t[]){d0});
}

int depth_load(struct depth *d, const char *ckpt_root)
{
    memset(d, 0, sizeof *d);
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, ckpt_root, "rvq_depth_decoder");
    if (rc < 0) return rc;
    struct depth_config *cfg = &d->cfg;
    if ((rc = read_config(cfg, &c)) < 0) goto out;
    size_t H = (size_t)cfg->hidden, F = (size_t)cfg->ffn, V = (size_t)cfg->audio_vocab;
    size_t nres = (size_t)(cfg->n_codebooks - 1);
    size_t per_layer = 2 * H + 4 * H * H + 3 * H * F;
    size_t total = nres * V * H + H * H + (size_t)cfg->max_pos * H + cfg->n_layers * per_layer + H + nres * V * H;
    d->arena = malloc(total * sizeof(float));
    d->layers = calloc((size_t)cfg->n_layers, sizeof *d->layers);
    if (!d->arena || !d->layers) {
        rc = mm3_errorf(-ENOMEM, "%s: cannot allocate %zu floats of weights", c.dir, total);
        goto out;
    }
    float *p = d->arena;
#define CARVE(n) (p += (n), p - (n))
    d->audio_emb = CARVE(nres * V * H);
    d->proj = CARVE(H * H);
    d->pos_emb = CARVE((size_t)cfg->max_pos * H);
    for (int l = 0; l < cfg->n_layers; l++) {
        struct depth_layer *L = &d->layers[l];
        L->attn_norm = CARVE(H);
        L->wq = CARVE(H * H);
        L->wk = CARVE(H * H);
        L->wv = CARVE(H * H);
        L->wo = CARVE(H * H);
        L->ffn_norm = CARVE(H);
        L->wg = CARVE(F * H);
        L->wu = CARVE(F * H);
        L->wd = CARVE(H * F);
    }
    d->norm = CARVE(H);
    d->heads = CARVE(nres * V * H);
#undef CARVE
    CHECK((size_t)(p - d->arena) == total);
    if ((rc = read_w(&c, "audio_embeddings.weight", d->audio_emb, (int64_t)(nres * V), (int64_t)H)) < 0) goto out;
    if ((rc = read_w(&c, "projection.weight", d->proj, (int64_t)H, (int64_t)H)) < 0) goto out;
    if ((rc = read_w(&c, "pos_embedding.weight", d->pos_emb, cfg->max_pos, (int64_t)H)) < 0) goto out;
    for (int l = 0; l < cfg->n_layers && rc == 0; l++) {
        struct depth_layer *L = &d->layers[l];
        const struct {
            float *dst;
            const char *leaf;
            int64_t d0, d1;
        } w[] = {
            {L->attn_norm, "input_layernorm", (int64_t)H, 0}, {L->wq, "attn.to_q", (int64_t)H, (int64_t)H},
            {L->wk, "attn.to_k", (int64_t)H, (int64_t)H},     {L->wv, "attn.to_v", (int64_t)H, (int64_t)H},
            {L->wo, "attn.to_out", (int64_t)H, (int64_t)H},   {L->ffn_norm, "post_attention_layernorm", (int64_t)H, 0},
            {L->wg, "gate_proj", (int64_t)F, (int64_t)H},     {L->wu, "up_proj", (int64_t)F, (int64_t)H},
            {L->wd, "down_proj", (int64_t)H, (int64_t)F},
        };
        for (size_t i = 0; i < sizeof w / sizeof w[0] && rc == 0; i++) {
            char n[128];
            snprintf(n, sizeof n, "layers.%d.%s.weight", l, w[i].leaf);
            rc = read_w(&c, n, w[i].dst, w[i].d0, w[i].d1);
        }
    }
    if (rc < 0) goto out;
    if ((rc = read_w(&c, "norm.weight", d->norm, (int64_t)H, 0)) < 0) goto out;
    for (size_t k = 0; k < nres; k++) {
        char n[64];
        snprintf(n, sizeof n, "audio_heads.%zu.weight", k);
        if ((rc = read_w(&c, n, d->heads + k * V * H, (int64_t)V, (int64_t)H)) < 0) goto out;
    }
out:
    ckpt_component_close(&c);
    if (rc < 0) depth_free(d);
    return rc;
}

void depth_free(struct depth *d)
{
    free(d->arena);
    free(d->layers);
    memset(d, 0, sizeof *d);
}

int depth_state_init(struct depth_state *s, const struct depth *d, int max_rows)
{
    size_t n = (size_t)d->cfg.n_layers * max_rows * d->cfg.n_codebooks * d->cfg.hidden;
    s->max_rows = max_rows;
    s->k = calloc(n, sizeof(float));
    s->v = calloc(n, sizeof(float));
    if (!s->k || !s->v) {
        depth_state_free(s);
        return mm3_errorf(-ENOMEM, "depth decoder: cannot allocate a KV cache for %d rows", max_rows);
    }
    return 0;
}

void depth_state_free(struct depth_state *s)
{
    free(s->k);
    free(s->v);
    s->k = s->v = NULL;
}

int depth_step(const struct depth *d, struct depth_state *s, int n, const float *x, int pos, float *out)
{
    const struct depth_config *cfg = &d->cfg;
    if (n > s->max_rows || pos < 0 || pos >= cfg->n_codebooks)
        return mm3_errorf(-EINVAL, "depth_step: %d rows at position %d (state holds %d rows, %d positions)", n, pos,
                          s->max_rows, cfg->n_codebooks);
    size_t H = (size_t)cfg->hidden, F = (size_t)cfg->ffn, S = (size_t)cfg->n_codebooks;
    float *h = malloc(sizeof(float) * n * H), *a = malloc(sizeof(float) * n * H);
    float *q = malloc(sizeof(float) * n * H), *o = malloc(sizeof(float) * n * H);
    float *g = malloc(sizeof(float) * n * F), *u = malloc(sizeof(float) * n * F);
    if (!h || !a || !q || !o || !g || !u) {
        free(h), free(a), free(q), free(o), free(g), free(u);
        return mm3_errorf(-ENOMEM, "depth_step: out of memory");
    }
    op_matmul(h, x, d->proj, NULL, n, (int)H, (int)H);
    for (int r = 0; r < n; r++)
        op_add(h + r * H, d->pos_emb + (size_t)pos * H, H);
    float scale = 1.0f / sqrtf((float)cfg->head_dim);
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct depth_layer *L = &d->layers[l];
        op_rmsnorm(a, h, L->attn_norm, n, (int)H, cfg->eps);
        op_matmul(q, a, L->wq, NULL, n, (int)H, (int)H);
        for (int r = 0; r < n; r++) {
            float *kc = s->k + (((size_t)l * s->max_rows + r) * S) * H;
            float *vc = s->v + (((size_t)l * s->max_rows + r) * S) * H;
            op_matmul(kc + pos * H, a + r * H, L->wk, NULL, 1, (int)H, (int)H);
            op_matmul(vc + pos * H, a + r * H, L->wv, NULL, 1, (int)H, (int)H);
            op_attention(o + r * H, (int)H, q + r * H, (int)H, kc, vc, (int)H, 1, pos + 1, cfg->n_heads, cfg->n_heads,
                         cfg->head_dim, 0, 0, scale);
        }
        op_matmul(a, o, L->wo, NULL, n, (int)H, (int)H);
        op_add(h, a, n * H);
        op_rmsnorm(a, h, L->ffn_norm, n, (int)H, cfg->eps);
        op_matmul(g, a, L->wg, NULL, n, (int)H, (int)F);
        op_matmul(u, a, L->wu, NULL, n, (int)H, (int)F);
        op_silu_mul(g, g, u, n * F);
        op_matmul(a, g, L->wd, NULL, n, (int)F, (int)H);
        op_add(h, a, n * H);
    }
    op_rmsnorm(out, h, d->norm, n, (int)H, cfg->eps);
    free(h), free(a), free(q), free(o), free(g), free(u);
    return 0;
}

void depth_logits(const struct depth *d, int j, const float *hidden, int n, float *logits)
{
    CHECK(j >= 1 && j < d->cfg.n_codebooks);
    size_t VH = (size_t)d->cfg.audio_vocab * d->cfg.hidden;
    op_matmul(logits, hidden, d->heads + (size_t)(j - 1) * VH, NULL, n, d->cfg.hidden, d->cfg.audio_vocab);
}

const float *depth_code_embedding(const struct depth *d, int j, int c)
{
    if (j < 1 || j >= d->cfg.n_codebooks || c < 0 || c >= d->cfg.audio_vocab) return NULL;
    return d->audio_emb + ((size_t)(j - 1) * d->cfg.audio_vocab + c) * d->cfg.hidden;
}
