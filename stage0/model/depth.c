#include "stage0/model/depth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/log.h"
#include "common/ops.h"
#include "common/weights.h"

/* Sanity bound on every config.json size (keeps size products in range). */
#define DEPTH_MAX_SIZE (1 << 30)

static int read_config(struct depth_config *cfg, const struct ckpt_component *c)
{
    int rc;
    if ((rc = weights_config_size(c, "hidden_size", DEPTH_MAX_SIZE, &cfg->hidden)) < 0 ||
        (rc = weights_config_size(c, "num_layers", DEPTH_MAX_SIZE, &cfg->n_layers)) < 0 ||
        (rc = weights_config_size(c, "num_attention_heads", DEPTH_MAX_SIZE, &cfg->n_heads)) < 0 ||
        (rc = weights_config_size(c, "intermediate_size", DEPTH_MAX_SIZE, &cfg->ffn)) < 0 ||
        (rc = weights_config_size(c, "audio_vocab_size", DEPTH_MAX_SIZE, &cfg->audio_vocab)) < 0 ||
        (rc = weights_config_size(c, "num_codebooks", DEPTH_MAX_SIZE, &cfg->n_codebooks)) < 0 ||
        (rc = weights_config_size(c, "max_position_embeddings", DEPTH_MAX_SIZE, &cfg->max_pos)) < 0)
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

/* config.json, and the weight table of that geometry (common/weights.h). */
static int depth_describe(void *model, const struct ckpt_component *c, struct weight_table *t)
{
    struct depth *d = model;
    struct depth_config *cfg = &d->cfg;
    int rc = read_config(cfg, c);
    if (rc < 0) return rc;
    int64_t H = cfg->hidden, F = cfg->ffn, V = cfg->audio_vocab;
    int64_t nres = cfg->n_codebooks - 1;
    d->layers = calloc((size_t)cfg->n_layers, sizeof *d->layers);
    if (!d->layers) return mm3_errorf(-ENOMEM, "%s: cannot allocate %d layers", c->dir, cfg->n_layers);
    weight_table_add(t, &d->audio_emb, 2, (int64_t[]){nres * V, H}, "audio_embeddings.weight");
    weight_table_add(t, &d->proj, 2, (int64_t[]){H, H}, "projection.weight");
    weight_table_add(t, &d->pos_emb, 2, (int64_t[]){cfg->max_pos, H}, "pos_embedding.weight");
    int first_layer = t->n;
    for (int l = 0; l < cfg->n_layers; l++) {
        struct depth_layer *L = &d->layers[l];
        const struct weight_leaf w[] = {
            {&L->attn_norm, "input_layernorm.weight", H, 0},
            {&L->wq, "attn.to_q.weight", H, H},
            {&L->wk, "attn.to_k.weight", H, H},
            {&L->wv, "attn.to_v.weight", H, H},
            {&L->wo, "attn.to_out.weight", H, H},
            {&L->ffn_norm, "post_attention_layernorm.weight", H, 0},
            {&L->wg, "gate_proj.weight", F, H},
            {&L->wu, "up_proj.weight", F, H},
            {&L->wd, "down_proj.weight", H, F},
        };
        char prefix[64];
        snprintf(prefix, sizeof prefix, "layers.%d.", l);
        weight_table_add_leaves(t, prefix, w, (int)(sizeof w / sizeof w[0]));
    }
    weight_table_add(t, &d->norm, 1, (int64_t[]){H}, "norm.weight");
    /* Consecutive entries are contiguous: heads = [n_codebooks - 1][V, H]. */
    for (int64_t k = 0; k < nres; k++)
        weight_table_add(t, k == 0 ? &d->heads : NULL, 2, (int64_t[]){V, H}, "audio_heads.%lld.weight", (long long)k);
    if (d->host_parts_only) {
        weight_table_defer_matrices(t, first_layer, t->n); /* the layers' and the heads */
        weight_table_defer(t, &d->proj);
    }
    return 0;
}

static int load(struct depth *d, const char *ckpt_root, int host_parts_only)
{
    memset(d, 0, sizeof *d);
    d->host_parts_only = host_parts_only;
    int rc = weights_component_load_deferred(ckpt_root, "rvq_depth_decoder", d, depth_describe, &d->arena, NULL,
                                             host_parts_only ? &d->deferred : NULL);
    if (rc < 0) depth_free(d);
    return rc;
}

int depth_load(struct depth *d, const char *ckpt_root)
{
    return load(d, ckpt_root, 0);
}

int depth_load_host_parts(struct depth *d, const char *ckpt_root)
{
    return load(d, ckpt_root, 1);
}

int depth_has_matrices(const struct depth *d)
{
    return !d->host_parts_only;
}

void depth_free(struct depth *d)
{
    free(d->arena);
    free(d->layers);
    weight_deferred_free(&d->deferred);
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
    const struct attention_heads heads = {cfg->n_heads, cfg->n_heads, cfg->head_dim,
                                          1.0f / sqrtf((float)cfg->head_dim)};
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct depth_layer *L = &d->layers[l];
        op_rmsnorm(a, h, L->attn_norm, n, (int)H, cfg->eps);
        op_matmul(q, a, L->wq, NULL, n, (int)H, (int)H);
        for (int r = 0; r < n; r++) {
            float *kc = s->k + (((size_t)l * s->max_rows + r) * S) * H;
            float *vc = s->v + (((size_t)l * s->max_rows + r) * S) * H;
            op_matmul(kc + pos * H, a + r * H, L->wk, NULL, 1, (int)H, (int)H);
            op_matmul(vc + pos * H, a + r * H, L->wv, NULL, 1, (int)H, (int)H);
            op_attention(&(struct attention_rows){.out = o + r * H,
                                                  .out_stride = (int)H,
                                                  .q = q + r * H,
                                                  .q_stride = (int)H,
                                                  .k = kc,
                                                  .v = vc,
                                                  .kv_stride = (int)H,
                                                  .n_q = 1,
                                                  .n_kv = pos + 1},
                         &heads);
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
