#include "stage0/model/talker.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/ops.h"
#include "common/sampler.h"
#include "common/weights.h"
#include "stage0/model/talker_lora.h"

/* Sanity bound on every config.json size (keeps size products in range). */
#define TALKER_MAX_SIZE (1 << 30)

static int read_config(struct talker_config *cfg, const struct ckpt_component *c)
{
    int rc;
    if ((rc = weights_config_size(c, "hidden_size", TALKER_MAX_SIZE, &cfg->hidden)) < 0 ||
        (rc = weights_config_size(c, "num_hidden_layers", TALKER_MAX_SIZE, &cfg->n_layers)) < 0 ||
        (rc = weights_config_size(c, "num_attention_heads", TALKER_MAX_SIZE, &cfg->n_heads)) < 0 ||
        (rc = weights_config_size(c, "num_key_value_heads", TALKER_MAX_SIZE, &cfg->n_kv_heads)) < 0 ||
        (rc = weights_config_size(c, "intermediate_size", TALKER_MAX_SIZE, &cfg->ffn)) < 0 ||
        (rc = weights_config_size(c, "vocab_size", TALKER_MAX_SIZE, &cfg->vocab)) < 0)
        return rc;
    /* transformers defaults head_dim to hidden / heads when the key is absent or null. */
    json_t *hd = json_object_get(c->config, "head_dim");
    if (hd && !json_is_null(hd)) {
        if ((rc = weights_config_size(c, "head_dim", TALKER_MAX_SIZE, &cfg->head_dim)) < 0) return rc;
    } else {
        cfg->head_dim = cfg->hidden / cfg->n_heads;
    }
    if (cfg->head_dim % 2)
        return mm3_errorf(-EINVAL, "%s/config.json: head_dim %d must be even for RoPE", c->dir, cfg->head_dim);
    double eps;
    if ((rc = ckpt_config_double(c, "rms_norm_eps", &eps)) < 0) return rc;
    cfg->eps = (float)eps;
    if ((rc = ckpt_config_rope_theta(c, &cfg->rope_theta)) < 0) return rc;
    if (cfg->n_heads % cfg->n_kv_heads)
        return mm3_errorf(-EINVAL, "%s/config.json: num_attention_heads %d not a multiple of num_key_value_heads %d",
                          c->dir, cfg->n_heads, cfg->n_kv_heads);
    if (cfg->vocab < SAMPLER_CODE_OFFSET + SAMPLER_N_CODES)
        return mm3_errorf(-EINVAL,
                          "%s/config.json: vocab_size %d is too small: the semantic codes need ids up to %d "
                          "(vocab_size >= %d)",
                          c->dir, cfg->vocab, SAMPLER_CODE_OFFSET + SAMPLER_N_CODES - 1,
                          SAMPLER_CODE_OFFSET + SAMPLER_N_CODES);
    return 0;
}

/* config.json, and the weight table of that geometry (common/weights.h). */
static int talker_describe(void *model, const struct ckpt_component *c, struct weight_table *t)
{
    struct talker *m = model;
    struct talker_config *cfg = &m->cfg;
    int rc = read_config(cfg, c);
    if (rc < 0) return rc;
    int64_t H = cfg->hidden, F = cfg->ffn, D = cfg->head_dim;
    int64_t QD = cfg->n_heads * D, KD = cfg->n_kv_heads * D;
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers) return mm3_errorf(-ENOMEM, "%s: cannot allocate %d layers", c->dir, cfg->n_layers);
    weight_table_add(t, &m->embed, 2, (int64_t[]){cfg->vocab, H}, "model.embed_tokens.weight");
    int first_matrix = t->n;
    for (int l = 0; l < cfg->n_layers; l++) {
        struct talker_layer *L = &m->layers[l];
        const struct weight_leaf w[] = {
            {&L->attn_norm, "input_layernorm.weight", H, 0},
            {&L->wq, "self_attn.q_proj.weight", QD, H},
            {&L->wk, "self_attn.k_proj.weight", KD, H},
            {&L->wv, "self_attn.v_proj.weight", KD, H},
            {&L->wo, "self_attn.o_proj.weight", H, QD},
            {&L->q_norm, "self_attn.q_norm.weight", D, 0},
            {&L->k_norm, "self_attn.k_norm.weight", D, 0},
            {&L->ffn_norm, "post_attention_layernorm.weight", H, 0},
            {&L->wg, "mlp.gate_proj.weight", F, H},
            {&L->wu, "mlp.up_proj.weight", F, H},
            {&L->wd, "mlp.down_proj.weight", H, F},
        };
        char prefix[64];
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        weight_table_add_leaves(t, prefix, w, (int)(sizeof w / sizeof w[0]));
    }
    weight_table_add(t, &m->norm, 1, (int64_t[]){H}, "model.norm.weight");
    /* Consecutive entries are contiguous: head = [stop row; the semantic code rows]. */
    weight_table_add_rows(t, &m->head, cfg->vocab, H, SAMPLER_STOP_ID, 1, "lm_head.weight");
    weight_table_add_rows(t, NULL, cfg->vocab, H, SAMPLER_CODE_OFFSET, SAMPLER_N_CODES, "lm_head.weight");
    if (m->host_parts_only) weight_table_defer_matrices(t, first_matrix, t->n);
    weight_table_add_space(t, &m->inv_freq, (size_t)D / 2);
    return 0;
}

static int load(struct talker *m, const char *ckpt_root, int host_parts_only)
{
    memset(m, 0, sizeof *m);
    m->host_parts_only = host_parts_only;
    int rc = weights_component_load_deferred(ckpt_root, "language_model", m, talker_describe, &m->arena, NULL,
                                             host_parts_only ? &m->deferred : NULL);
    if (rc < 0) {
        talker_free(m);
        return rc;
    }
    const struct talker_config *cfg = &m->cfg;
    /* The reference loads the LM in bf16, which casts the rotary inv_freq buffer to
     * bf16; widening the model to float32 afterwards keeps the rounded values. The
     * golden replay confirms it (guided logits rel 3e-4 with fp32 inv_freq, 1e-7
     * with bf16-rounded inv_freq on tiny-a). */
    op_rope_inv_freq(m->inv_freq, cfg->rope_theta, cfg->head_dim);
    for (int i = 0; i < cfg->head_dim / 2; i++)
        m->inv_freq[i] = mm3_bf16_to_f32(mm3_f32_to_bf16(m->inv_freq[i]));
    return 0;
}

int talker_load(struct talker *m, const char *ckpt_root)
{
    return load(m, ckpt_root, 0);
}

int talker_load_host_parts(struct talker *m, const char *ckpt_root)
{
    return load(m, ckpt_root, 1);
}

int talker_has_matrices(const struct talker *m)
{
    return !m->host_parts_only;
}

void talker_free(struct talker *m)
{
    free(m->arena);
    free(m->layers);
    weight_deferred_free(&m->deferred);
    memset(m, 0, sizeof *m);
}

int talker_state_init(struct talker_state *s, const struct talker *m, int max_rows, int max_ctx)
{
    memset(s, 0, sizeof *s);
    size_t n = (size_t)m->cfg.n_layers * max_rows * max_ctx * m->cfg.n_kv_heads * m->cfg.head_dim;
    s->max_rows = max_rows;
    s->max_ctx = max_ctx;
    /* zeroed: a token attends to every cache entry before its position, so a caller that
     * skips positions reads zeros, never stale memory (calloc's pages come zeroed lazily) */
    s->k = calloc(n, sizeof(float));
    s->v = calloc(n, sizeof(float));
    s->row_lora = malloc(sizeof(int) * (size_t)(max_rows > 0 ? max_rows : 1));
    if (!s->k || !s->v || !s->row_lora) {
        talker_state_free(s);
        return mm3_errorf(-ENOMEM, "talker: cannot allocate a KV cache of %d rows x %d positions", max_rows, max_ctx);
    }
    talker_state_set_lora(s, NULL);
    return 0;
}

void talker_state_set_lora(struct talker_state *s, const struct talker_lora_set *set)
{
    s->lora = set;
    for (int r = 0; r < s->max_rows; r++)
        s->row_lora[r] = -1;
}

void talker_state_free(struct talker_state *s)
{
    free(s->k);
    free(s->v);
    free(s->row_lora);
    s->k = s->v = NULL;
    s->row_lora = NULL;
}

/* The largest rank of the adapters the batch's rows use; 0 when none does. */
static int batch_lora_rank(const struct talker_state *s, int n, const int *row)
{
    int r = 0;
    for (int i = 0; s->lora && i < n; i++) {
        int a = s->row_lora[row[i]];
        if (a >= 0 && s->lora->a[a].rank > r) r = s->lora->a[a].rank;
    }
    return r;
}

/* y[i] += s B (A x[i]) for every token i whose row's adapter adapts `target` of
 * layer l, one token at a time so that a row's result does not depend on the batch. */
static void lora_add(const struct talker_state *s, int l, enum talker_lora_target target, float *y, const float *x,
                     int n, const int *row, int in, int out, float *t)
{
    if (!t) return;
    for (int i = 0; i < n; i++) {
        int a = s->row_lora[row[i]];
        if (a < 0) continue;
        const struct talker_lora *L = &s->lora->a[a];
        const struct talker_lora_mat *m = talker_lora_at(L, l, target);
        if (!m->a) continue;
        op_lora_down(t, x + (size_t)i * in, m->a, 1, in, L->rank);
        op_lora_up(y + (size_t)i * out, t, m->b, L->scale, 1, L->rank, out);
    }
}

int talker_forward(const struct talker *m, struct talker_state *s, int n, const int *row, const int *pos,
                   const float *emb, float *hidden_out)
{
    const struct talker_config *cfg = &m->cfg;
    for (int i = 0; i < n; i++)
        if (row[i] < 0 || row[i] >= s->max_rows || pos[i] < 0 || pos[i] >= s->max_ctx)
            return mm3_errorf(
                -EINVAL, "talker_forward: token %d at row %d position %d outside the state (%d rows, %d positions)", i,
                row[i], pos[i], s->max_rows, s->max_ctx);
    int lora_rank = batch_lora_rank(s, n, row);
    size_t H = (size_t)cfg->hidden, F = (size_t)cfg->ffn, D = (size_t)cfg->head_dim;
    size_t QD = (size_t)cfg->n_heads * D, KD = (size_t)cfg->n_kv_heads * D;
    size_t big = QD > H ? QD : H;
    float *h = malloc(sizeof(float) * n * H), *a = malloc(sizeof(float) * n * big);
    float *q = malloc(sizeof(float) * n * QD), *o = malloc(sizeof(float) * n * QD);
    float *k = malloc(sizeof(float) * n * KD), *v = malloc(sizeof(float) * n * KD);
    float *g = malloc(sizeof(float) * n * F), *u = malloc(sizeof(float) * n * F);
    float *lt = lora_rank ? malloc(sizeof(float) * (size_t)lora_rank) : NULL;
    int rc = 0;
    if (!h || !a || !q || !o || !k || !v || !g || !u || (lora_rank && !lt)) {
        rc = mm3_errorf(-ENOMEM, "talker_forward: out of memory for %d tokens", n);
        goto out;
    }
    memcpy(h, emb, sizeof(float) * n * H);
    const struct attention_heads heads = {cfg->n_heads, cfg->n_kv_heads, (int)D, 1.0f / sqrtf((float)D)};
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct talker_layer *L = &m->layers[l];
        float *kc = s->k + (size_t)l * s->max_rows * s->max_ctx * KD;
        float *vc = s->v + (size_t)l * s->max_rows * s->max_ctx * KD;
        op_rmsnorm(a, h, L->attn_norm, n, (int)H, cfg->eps);
        op_matmul(q, a, L->wq, NULL, n, (int)H, (int)QD);
        op_matmul(k, a, L->wk, NULL, n, (int)H, (int)KD);
        op_matmul(v, a, L->wv, NULL, n, (int)H, (int)KD);
        /* the adapters' deltas land before the q/k norms, as in the PEFT-wrapped projections */
        lora_add(s, l, TALKER_LORA_Q, q, a, n, row, (int)H, (int)QD, lt);
        lora_add(s, l, TALKER_LORA_K, k, a, n, row, (int)H, (int)KD, lt);
        lora_add(s, l, TALKER_LORA_V, v, a, n, row, (int)H, (int)KD, lt);
        op_rmsnorm(q, q, L->q_norm, n * cfg->n_heads, (int)D, cfg->eps);
        op_rmsnorm(k, k, L->k_norm, n * cfg->n_kv_heads, (int)D, cfg->eps);
        op_rope(q, n, (int)QD, cfg->n_heads, (int)D, (int)D, pos, m->inv_freq);
        op_rope(k, n, (int)KD, cfg->n_kv_heads, (int)D, (int)D, pos, m->inv_freq);
        /* Write the whole batch into the cache first so a prefill token sees its
         * predecessors of the same batch. */
        for (int i = 0; i < n; i++) {
            size_t at = ((size_t)row[i] * s->max_ctx + pos[i]) * KD;
            memcpy(kc + at, k + i * KD, sizeof(float) * KD);
            memcpy(vc + at, v + i * KD, sizeof(float) * KD);
        }
        for (int i = 0; i < n; i++) {
            size_t base = (size_t)row[i] * s->max_ctx * KD;
            op_attention(&(struct attention_rows){.out = o + i * QD,
                                                  .out_stride = (int)QD,
                                                  .q = q + i * QD,
                                                  .q_stride = (int)QD,
                                                  .k = kc + base,
                                                  .v = vc + base,
                                                  .kv_stride = (int)KD,
                                                  .n_q = 1,
                                                  .n_kv = pos[i] + 1},
                         &heads);
        }
        op_matmul(a, o, L->wo, NULL, n, (int)QD, (int)H);
        lora_add(s, l, TALKER_LORA_O, a, o, n, row, (int)QD, (int)H, lt);
        op_add(h, a, n * H);
        op_rmsnorm(a, h, L->ffn_norm, n, (int)H, cfg->eps);
        op_matmul(g, a, L->wg, NULL, n, (int)H, (int)F);
        op_matmul(u, a, L->wu, NULL, n, (int)H, (int)F);
        lora_add(s, l, TALKER_LORA_GATE, g, a, n, row, (int)H, (int)F, lt);
        lora_add(s, l, TALKER_LORA_UP, u, a, n, row, (int)H, (int)F, lt);
        op_silu_mul(g, g, u, n * F);
        op_matmul(a, g, L->wd, NULL, n, (int)F, (int)H);
        lora_add(s, l, TALKER_LORA_DOWN, a, g, n, row, (int)F, (int)H, lt);
        op_add(h, a, n * H);
    }
    op_rmsnorm(hidden_out, h, m->norm, n, (int)H, cfg->eps);
out:
    free(h), free(a), free(q), free(o), free(k), free(v), free(g), free(u), free(lt);
    return rc;
}

int talker_embed_tokens(const struct talker *m, const int32_t *ids, int n, float *out)
{
    size_t H = (size_t)m->cfg.hidden;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab)
            return mm3_errorf(-EINVAL, "token id %d at index %d outside the vocabulary [0, %d)", ids[i], i,
                              m->cfg.vocab);
        memcpy(out + i * H, m->embed + (size_t)ids[i] * H, sizeof(float) * H);
    }
    return 0;
}

void talker_head_drawable(const struct talker *m, const float *hidden, int n_rows, float *logits)
{
    op_matmul(logits, hidden, m->head, NULL, n_rows, m->cfg.hidden, SAMPLER_C0_COLS);
}

int talker_feedback_embedding(const struct talker *m, const struct depth *d, const int32_t *codes, float *out)
{
    int H = m->cfg.hidden, ncb = d->cfg.n_codebooks;
    if (d->cfg.hidden != H)
        return mm3_errorf(-EINVAL, "feedback: depth decoder hidden %d differs from the LM hidden %d", d->cfg.hidden, H);
    if (codes[0] < 0 || codes[0] >= SAMPLER_N_CODES)
        return mm3_errorf(-EINVAL, "feedback: semantic code %d outside [0, %d)", codes[0], SAMPLER_N_CODES);
    const float *e = m->embed + ((size_t)codes[0] + SAMPLER_CODE_OFFSET) * H;
    const float *rows[64];
    if (ncb - 1 > 64) return mm3_errorf(-EINVAL, "feedback: %d codebooks, at most 65 supported", ncb);
    for (int j = 1; j < ncb; j++) {
        rows[j - 1] = depth_code_embedding(d, j, codes[j]);
        if (!rows[j - 1])
            return mm3_errorf(-EINVAL, "feedback: code %d of codebook %d outside [0, %d)", codes[j], j,
                              d->cfg.audio_vocab);
    }
    float scale = (float)pow((double)ncb, -0.5);
    for (int i = 0; i < H; i++) {
        float r = 0.0f;
        for (int j = 0; j < ncb - 1; j++)
            r += rows[j][i];
        float s = e[i] + r;
        out[i] = s * scale;
    }
    return 0;
}
