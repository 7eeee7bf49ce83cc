/* Condition encoder (stage1/condition.h). */
#include "stage1/condition.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/ops.h"

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

static int load_from(struct condition_model *m, struct ckpt_component *c)
{
    struct condition_config *g = &m->cfg;
    int rc;
    if ((rc = config_get(c, "condition_hidden_dim", &g->hidden)) < 0 ||
        (rc = config_get(c, "num_condition_layers", &g->n_layers)) < 0 ||
        (rc = config_get(c, "out_dim", &g->out_dim)) < 0 ||
        (rc = config_get(c, "input_sampling_rate", &g->in_rate)) < 0 ||
        (rc = config_get(c, "input_hop_length", &g->in_hop)) < 0 ||
        (rc = config_get(c, "output_sampling_rate", &g->out_rate)) < 0 ||
        (rc = config_get(c, "output_hop_length", &g->out_hop)) < 0)
        return rc;
    if ((rc = frame_mix_load_component(&m->mix, c)) < 0) return rc;
    if (m->mix.hidden != g->hidden || m->mix.n_layers != g->n_layers)
        return mm3_errorf(-EINVAL, "%s: frame mix geometry %d x %d differs from the encoder's %d x %d", c->dir,
                          m->mix.n_layers, m->mix.hidden, g->n_layers, g->hidden);

    size_t n_w = (size_t)g->out_dim * g->hidden * 3;
    m->arena = malloc(sizeof(float) * (n_w * 2 + g->out_dim));
    if (!m->arena) return mm3_errorf(-ENOMEM, "condition encoder: out of memory");
    m->proj_w = m->arena;
    m->proj_b = m->arena + n_w;
    float *raw = m->proj_b + g->out_dim; /* [out, hidden, 3] as stored, scratch */

    if ((rc = ckpt_read_f32(c, "proj.weight", raw, 3, (int64_t[]){g->out_dim, g->hidden, 3})) < 0 ||
        (rc = ckpt_read_f32(c, "proj.bias", m->proj_b, 1, (int64_t[]){g->out_dim})) < 0)
        return rc;
    for (int o = 0; o < g->out_dim; o++)
        for (int i = 0; i < g->hidden; i++)
            for (int k = 0; k < 3; k++)
                m->proj_w[((size_t)k * g->out_dim + o) * g->hidden + i] = raw[((size_t)o * g->hidden + i) * 3 + k];
    /* Give back the scratch tail. */
    float *shrunk = realloc(m->arena, sizeof(float) * (n_w + g->out_dim));
    if (shrunk) {
        m->arena = shrunk;
        m->proj_w = shrunk;
        m->proj_b = shrunk + n_w;
    }
    return 0;
}

int condition_load(struct condition_model **out, const char *ckpt_root)
{
    *out = NULL;
    struct condition_model *m = calloc(1, sizeof *m);
    if (!m) return mm3_errorf(-ENOMEM, "condition encoder: out of memory");
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, ckpt_root, "condition_encoder");
    if (rc < 0) {
        free(m);
        return rc;
    }
    rc = load_from(m, &c);
    ckpt_component_close(&c);
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
