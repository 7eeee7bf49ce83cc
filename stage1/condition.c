/* Condition encoder (stage1/condition.h). */
#include "stage1/condition.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/ops.h"
#include "common/weights.h"

/* Sanity bound on every config.json size (keeps size products in range). */
#define COND_MAX_SIZE (1 << 24)

/* config.json, the frame mix, and the weight table of that geometry (common/weights.h). */
static int condition_describe(void *model, const struct ckpt_component *c, struct weight_table *t)
{
    struct condition_model *m = model;
    struct condition_config *g = &m->cfg;
    int rc;
    if ((rc = weights_config_size(c, "condition_hidden_dim", COND_MAX_SIZE, &g->hidden)) < 0 ||
        (rc = weights_config_size(c, "num_condition_layers", COND_MAX_SIZE, &g->n_layers)) < 0 ||
        (rc = weights_config_size(c, "out_dim", COND_MAX_SIZE, &g->out_dim)) < 0 ||
        (rc = weights_config_size(c, "input_sampling_rate", COND_MAX_SIZE, &g->in_rate)) < 0 ||
        (rc = weights_config_size(c, "input_hop_length", COND_MAX_SIZE, &g->in_hop)) < 0 ||
        (rc = weights_config_size(c, "output_sampling_rate", COND_MAX_SIZE, &g->out_rate)) < 0 ||
        (rc = weights_config_size(c, "output_hop_length", COND_MAX_SIZE, &g->out_hop)) < 0)
        return rc;
    if ((rc = frame_mix_load_component(&m->mix, c)) < 0) return rc;
    if (m->mix.hidden != g->hidden || m->mix.n_layers != g->n_layers)
        return mm3_errorf(-EINVAL, "%s: frame mix geometry %d x %d differs from the encoder's %d x %d", c->dir,
                          m->mix.n_layers, m->mix.hidden, g->n_layers, g->hidden);
    /* proj.weight lands as stored, [out, hidden, 3], and is re-laid per tap after loading. */
    weight_table_add(t, &m->proj_w, 3, (int64_t[]){g->out_dim, g->hidden, 3}, "proj.weight");
    weight_table_add(t, &m->proj_b, 1, (int64_t[]){g->out_dim}, "proj.bias");
    weight_table_add_elsewhere(t, "layer_weight_logits"); /* the frame mix's */
    weight_table_add_elsewhere(t, "layer_scale");
    return 0;
}

/* proj.weight [out, hidden, 3] -> [3][out][hidden], so each tap is a plain matrix. */
static int condition_relayout(struct condition_model *m)
{
    const struct condition_config *g = &m->cfg;
    size_t n_w = (size_t)g->out_dim * g->hidden * 3;
    float *tmp = malloc(sizeof(float) * n_w), *w = m->proj_w;
    if (!tmp) return mm3_errorf(-ENOMEM, "condition encoder: out of memory");
    for (int o = 0; o < g->out_dim; o++)
        for (int i = 0; i < g->hidden; i++)
            for (int k = 0; k < 3; k++)
                tmp[((size_t)k * g->out_dim + o) * g->hidden + i] = w[((size_t)o * g->hidden + i) * 3 + k];
    memcpy(w, tmp, sizeof(float) * n_w);
    free(tmp);
    return 0;
}

int condition_load(struct condition_model **out, const char *ckpt_root)
{
    *out = NULL;
    struct condition_model *m = calloc(1, sizeof *m);
    if (!m) return mm3_errorf(-ENOMEM, "condition encoder: out of memory");
    int rc = weights_component_load(ckpt_root, "condition_encoder", m, condition_describe, &m->arena, NULL);
    if (rc == 0) rc = condition_relayout(m);
    if (rc < 0) {
        condition_free(m);
        return mm3_error_prefix(rc, "loading condition encoder: ");
    }
    *out = m;
    return 0;
}

void condition_free(struct condition_model *m)
{
    if (!m) return;
    free(m->arena);
    free(m);
}

int condition_latent_len(const struct condition_config *cfg, int F)
{
    double v = (double)F * cfg->out_rate / cfg->in_rate * cfg->in_hop / cfg->out_hop;
    int L = (int)v;
    return L < 1 ? 1 : L;
}

int condition_nearest_index(int F, int L, int j)
{
    float scale = (float)F / (float)L;
    int src = (int)floorf((float)j * scale);
    return src < F - 1 ? src : F - 1;
}

int condition_mix(const struct condition_model *m, const float *frames, int n, int width, float *out)
{
    return frame_mix_apply(&m->mix, frames, n, width, out);
}

int condition_project(const struct condition_model *m, const float *mixed, int F, float *cond)
{
    const struct condition_config *g = &m->cfg;
    if (F < 1) return mm3_errorf(-EINVAL, "condition_project: %d frames: expected at least 1", F);
    int H = g->hidden, O = g->out_dim;
    float *cf = malloc(sizeof(float) * (size_t)F * O); /* cond_f transposed: [F, out] */
    if (!cf) return mm3_errorf(-ENOMEM, "condition_project: out of memory for %d frames", F);
    for (int f = 0; f < F; f++) {
        float *y = cf + (size_t)f * O;
        for (int o = 0; o < O; o++) {
            float s = 0.0f;
            for (int k = 0; k < 3; k++) {
                int src = f - 1 + k;
                if (src < 0 || src >= F) continue; /* zero padding at the window edges */
                const float *w = m->proj_w + ((size_t)k * O + o) * H;
                const float *x = mixed + (size_t)src * H;
                for (int i = 0; i < H; i++)
                    s += w[i] * x[i];
            }
            y[o] = s + m->proj_b[o];
        }
    }
    int L = condition_latent_len(g, F);
    for (int j = 0; j < L; j++)
        memcpy(cond + (size_t)j * O, cf + (size_t)condition_nearest_index(F, L, j) * O, sizeof(float) * O);
    free(cf);
    return 0;
}
