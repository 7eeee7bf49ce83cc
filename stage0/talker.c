#include "stage0/talker.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/log.h"
#include "common/ops.h"
#include "common/sampler.h"

static int config_size(const struct ckpt_component *c, const char *key, int *out)
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

static int read_config(struct talker_config *cfg, const struct ckpt_component *c)
{
    int rc;
    if ((rc = config_size(c, "hidden_size", &cfg->hidden)) < 0 ||
        (rc = config_size(c, "num_hidden_layers", &cfg->n_layers)) < 0 ||
        (rc = config_size(c, "num_attention_heads", &cfg->n_heads)) < 0 ||
        (rc = config_size(c, "num_key_value_heads", &cfg->n_kv_heads)) < 0 ||
        (rc = config_size(c, "intermediate_size", &cfg->ffn)) < 0 ||
        (rc = config_size(c, "vocab_size", &cfg->vocab)) < 0)
        return rc;
    /* transformers defaults head_dim to hidden / heads when the key is absent or null. */
    json_t *hd = json_object_get(c->config, "head_dim");
    if (hd && !json_is_null(hd)) {
        if ((rc = config_size(c, "head_dim", &cfg->head_dim)) < 0) return rc;
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

static int read_w(const struct ckpt_component *c, const char *name, float *dst, int64_t d0, int64_t d1)
{
    if (d1 > 0) return ckpt_read_f32(c, name, dst, 2, (int64_t[]){d0, d1});
    return ckpt_read_f32(c, name, dst, 1, (int64_t[]){d0});
}

/* Rows [r0, r0+n) of a 2-D tensor, widened; avoids materialising the whole head. */
static int read_rows(const struct ckpt_component *c, const char *name, int64_t rows, int64_t cols, int64_t r0,
                     int64_t n, float *dst)
{
    const struct ckpt_tensor *t = ckpt_find(c, name);
    if (!t) return mm3_errorf(-ENOENT, "%s: missing tensor '%s'", c->dir, name);
    if (t->st->ndim != 2 || t->st->shape[0] != rows || t->st->shape[1] != cols) {
        char a[128];
        return mm3_errorf(-EINVAL, "%s: tensor '%s' has shape %s, expected [%lld, %lld] (from config.json)", c->dir,
                          name, st_shape_str(a, sizeof a, t->st->ndim, t->st->shape), (long long)rows, (long long)cols);
    }
    size_t es = mm3_dtype_size(t->st->dtype);
    size_t nbytes = (size_t)n * (size_t)cols * es;
    uint64_t off = (uint64_t)r0 * (uint64_t)cols * es;
    if (t->data) {
        mm3_convert_to_f32(dst, (const char *)t->data + off, t->st->dtype, (size_t)(n * cols));
        return 0;
    }
    char *buf = malloc(nbytes);
    if (!buf) return mm3_errorf(-ENOMEM, "%s: cannot allocate %zu bytes for '%s'", c->dir, nbytes, name);
    const struct st_file *f = &c->files[t->file];
    size_t got = 0;
    while (got < nbytes) {
        ssize_t r = pread(f->fd, buf + got, nbytes - got, (off_t)(t->st->offset + off + got));
        if (r <= 0) {
            free(buf);
            return mm3_errorf(-EIO, "%s: short read of '%s'", f->path, name);
        }
        got += (size_t)r;
    }
    mm3_convert_to_f32(dst, buf, t->st->dtype, (size_t)(n * cols));
    free(buf);
    return 0;
}

int talker_load(struct talker *m, const char *ckpt_root)
{
    memset(m, 0, sizeof *m);
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, ckpt_root, "language_model");
    if (rc < 0) return rc;
    struct talker_config *cfg = &m->cfg;
    if ((rc = read_config(cfg, &c)) < 0) goto out;
    size_t H = (size_t)cfg->hidden, F = (size_t)cfg->ffn, D = (size_t)cfg->head_dim;
    size_t QD = (size_t)cfg->n_heads * D, KD = (size_t)cfg->n_kv_heads * D;
    size_t per_layer = 2 * H + QD * H + 2 * KD * H + H * QD + 2 * D + 3 * F * H;
    size_t total = (size_t)cfg->vocab * H + cfg->n_layers * per_layer + H + (size_t)SAMPLER_C0_COLS * H + D / 2;
    m->arena = malloc(total * sizeof(float));
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->arena || !m->layers) {
        rc = mm3_errorf(-ENOMEM, "%s: cannot allocate %zu floats of weights", c.dir, total);
        goto out;
    }
    float *p = m->arena;
#define CARVE(n) (p += (n), p - (n))
    m->embed = CARVE((size_t)cfg->vocab * H);
    for (int l = 0; l < cfg->n_layers; l++) {
        struct talker_layer *L = &m->layers[l];
        L->attn_norm = CARVE(H);
        L->wq = CARVE(QD * H);
        L->wk = CARVE(KD * H);
        L->wv = CARVE(KD * H);
        L->wo = CARVE(H * QD);
        L->q_norm = CARVE(D);
        L->k_norm = CARVE(D);
        L->ffn_norm = CARVE(H);
        L->wg = CARVE(F * H);
        L->wu = CARVE(F * H);
        L->wd = CARVE(H * F);
    }
    m->norm = CARVE(H);
    m->head = CARVE((size_t)SAMPLER_C0_COLS * H);
    m->inv_freq = CARVE(D / 2);
#undef CARVE
    CHECK((size_t)(p - m->arena) == total);
    if ((rc = read_w(&c, "model.embed_tokens.weight", m->embed, cfg->vocab, (int64_t)H)) < 0) goto out;
    for (int l = 0; l < cfg->n_layers && rc == 0; l++) {
        struct talker_layer *L = &m->layers[l];
        const struct {
            float *dst;
            const char *leaf;
            int64_t d0, d1;
        } w[] = {
            {L->attn_norm, "input_layernorm", (int64_t)H, 0},
            {L->wq, "self_attn.q_proj", (int64_t)QD, (int64_t)H},
            {L->wk, "self_attn.k_proj", (int64_t)KD, (int64_t)H},
            {L->wv, "self_attn.v_proj", (int64_t)KD, (int64_t)H},
            {L->wo, "self_attn.o_proj", (int64_t)H, (int64_t)QD},
            {L->q_norm, "self_attn.q_norm", (int64_t)D, 0},
            {L->k_norm, "self_attn.k_norm", (int64_t)D, 0},
            {L->ffn_norm, "post_attention_layernorm", (int64_t)H, 0},
            {L->wg, "mlp.gate_proj", (int64_t)F, (int64_t)H},
            {L->wu, "mlp.up_proj", (int64_t)F, (int64_t)H},
            {L->wd, "mlp.down_proj", (int64_t)H, (int64_t)F},
        };
        for (size_t i = 0; i < sizeof w / sizeof w[0] && rc == 0; i++) {
            char n[128];
            snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, w[i].leaf);
            rc = read_w(&c, n, w[i].dst, w[i].d0, w[i].d1);
        }
    }
    if (rc < 0) goto out;
    if ((rc = read_w(&c, "model.norm.weight", m->norm, (int64_t)H, 0)) < 0) goto out;
    if ((rc = read_rows(&c, "lm_head.weight", cfg->vocab, (int64_t)H, SAMPLER_STOP_ID, 1, m->head)) < 0) goto out;
    if ((rc = read_rows(&c, "lm_head.weight", cfg->vocab, (int64_t)H, SAMPLER_CODE_OFFSET, SAMPLER_N_CODES,
                        m->head + H)) < 0)
        goto out;
    /* The reference loads the LM in bf16, which casts the rotary inv_freq buffer to
     * bf16; widening the model to float32 afterwards keeps the rounded values. The
     * golden replay confirms it (guided logits rel 3e-4 with fp32 inv_freq, 1e-7
     * with bf16-rounded inv_freq on tiny-a). */
    op_rope_inv_freq(m->inv_freq, cfg->rope_theta, cfg->head_dim);
    for (int i = 0; i < cfg->head_dim / 2; i++)
        m->inv_freq[i] = mm3_bf16_to_f32(mm3_f32_to_bf16(m->inv_freq[i]));
out:
    ckpt_component_close(&c);
    if (rc < 0) talker_free(m);
    return rc;
}

void talker_free(struct talker *m)
{
    free(m->arena);
    free(m->layers);
    memset(m, 0, sizeof *m);
}

int talker_state_init(struct talker_state *s, const struct talker *m, int max_rows, int max_ctx)
{
    memset(s, 0, sizeof *s);
    size_t n = (size_t)m->cfg.n_layers * max_rows * max_ctx * m->cfg.n_kv_heads * m->cfg.head_dim;
    s->max_rows = max_rows;
    s->max_ctx = max_ctx;
    s->k = malloc(n * sizeof(float));
    s->v = malloc(n * sizeof(float));
    if (!s->k || !s->v) {
        talker_state_free(s);
        return mm3_errorf(-ENOMEM, "talker: cannot allocate a KV cache of %d rows x %d positions", max_rows, max_ctx);
    }
    return 0;
}

void talker_state_free(struct talker_state *s)
{
    free(s->k);
    free(s->v);
    s->k = s->v = NULL;
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
    size_t H = (size_t)cfg->hidden, F = (size_t)cfg->ffn, D = (size_t)cfg->head_dim;
    size_t QD = (size_t)cfg->n_heads * D, KD = (size_t)cfg->n_kv_heads * D;
    size_t big = QD > H ? QD : H;
    float *h = malloc(sizeof(float) * n * H), *a = malloc(sizeof(float) * n * big);
    float *q = malloc(sizeof(float) * n * QD), *o = malloc(sizeof(float) * n * QD);
    float *k = malloc(sizeof(float) * n * KD), *v = malloc(sizeof(float) * n * KD);
    float *g = malloc(sizeof(float) * n * F), *u = malloc(sizeof(float) * n * F);
    int rc = 0;
    if (!h || !a || !q || !o || !k || !v || !g || !u) {
        rc = mm3_errorf(-ENOMEM, "talker_forward: out of memory for %d tokens", n);
        goto out;
    }
    memcpy(h, emb, sizeof(float) * n * H);
    float scale = 1.0f / sqrtf((float)D);
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct talker_layer *L = &m->layers[l];
        float *kc = s->k + (size_t)l * s->max_rows * s->max_ctx * KD;
        float *vc = s->v + (size_t)l * s->max_rows * s->max_ctx * KD;
        op_rmsnorm(a, h, L->attn_norm, n, (int)H, cfg->eps);
        op_matmul(q, a, L->wq, NULL, n, (int)H, (int)QD);
        op_matmul(k, a, L->wk, NULL, n, (int)H, (int)KD);
        op_matmul(v, a, L->wv, NULL, n, (int)H, (int)KD);
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
            op_attention(o + i * QD, (int)QD, q + i * QD, (int)QD, kc + base, vc + base, (int)KD, 1, pos[i] + 1,
                         cfg->n_heads, cfg->n_kv_heads, (int)D, 0, 0, scale);
        }
        op_matmul(a, o, L->wo, NULL, n, (int)QD, (int)H);
        op_add(h, a, n * H);
        op_rmsnorm(a, h, L->ffn_norm, n, (int)H, cfg->eps);
        op_matmul(g, a, L->wg, NULL, n, (int)H, (int)F);
        op_matmul(u, a, L->wu, NULL, n, (int)H, (int)F);
        op_silu_mul(g, g, u, n * F);
        op_matmul(a, g, L->wd, NULL, n, (int)F, (int)H);
        op_add(h, a, n * H);
    }
    op_rmsnorm(hidden_out, h, m->norm, n, (int)H, cfg->eps);
out:
    free(h), free(a), free(q), free(o), free(k), free(v), free(g), free(u);
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
