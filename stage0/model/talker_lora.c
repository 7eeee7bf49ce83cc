/* Talker LoRA adapters served per request (stage0/model/talker_lora.h). */
#include "stage0/model/talker_lora.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"

static const char *const target_names[TALKER_LORA_N_TARGETS] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj",
};

static int name_check(const char *name)
{
    if (mm3_lora_name_valid(name)) return 0;
    size_t n = strlen(name);
    if (n == 0 || n >= TALKER_LORA_NAME_MAX)
        return mm3_errorf(-EINVAL, "adapter name '%.80s': expected 1 to %d characters", name, TALKER_LORA_NAME_MAX - 1);
    return mm3_errorf(-EINVAL, "adapter name '%s': expected only letters, digits, '.', '_' and '-'", name);
}

/* The shape [out, in] of a target of the talker of cfg. */
static void target_shape(const struct talker_config *cfg, enum talker_lora_target t, int *out, int *in)
{
    int H = cfg->hidden, F = cfg->ffn, QD = cfg->n_heads * cfg->head_dim, KD = cfg->n_kv_heads * cfg->head_dim;
    static const int sizes[TALKER_LORA_N_TARGETS][2] = {{0, 1}, {2, 1}, {2, 1}, {1, 0}, {3, 1}, {3, 1}, {1, 3}};
    const int dims[4] = {QD, H, KD, F};
    *out = dims[sizes[t][0]];
    *in = dims[sizes[t][1]];
}

/* Which layer and target module name m is ("model.layers.<l>.<target>"), or -EINVAL
 * naming it: only those are served per request. */
static int place_module(const struct talker_config *cfg, const char *dir, const struct lora_module *m, int *layer,
                        enum talker_lora_target *target)
{
    int l, used = 0;
    if (sscanf(m->name, "model.layers.%d.%n", &l, &used) == 1 && used > 0 && l >= 0 && l < cfg->n_layers)
        for (int t = 0; t < TALKER_LORA_N_TARGETS; t++)
            if (!strcmp(m->name + used, target_names[t])) {
                int out, in;
                target_shape(cfg, (enum talker_lora_target)t, &out, &in);
                if (m->out != out || m->in != in)
                    return mm3_errorf(-EINVAL,
                                      "LoRA adapter %s: module '%s': lora_B x lora_A is [%lld, %lld] but the talker's "
                                      "'%s' is [%d, %d]",
                                      dir, m->name, (long long)m->out, (long long)m->in, m->weight, out, in);
                *layer = l;
                *target = (enum talker_lora_target)t;
                return 0;
            }
    return mm3_errorf(-EINVAL,
                      "LoRA adapter %s: module '%s' is not served per request: only the talker's decoder layers "
                      "(model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.mlp.{gate,up,down}_proj) are; merge "
                      "this adapter at load with stages[0].lora instead",
                      dir, m->name);
}

int talker_lora_set_add(struct talker_lora_set *s, const struct talker_config *cfg, const char *name, const char *dir,
                        double scale)
{
    int rc = name_check(name);
    if (rc < 0) return rc;
    if (s->n == TALKER_LORA_MAX)
        return mm3_errorf(-EINVAL, "adapter '%s': at most %d adapters can be served per request", name,
                          TALKER_LORA_MAX);
    if (talker_lora_set_find(s, name) >= 0) return mm3_errorf(-EINVAL, "adapter '%s': the name is already used", name);
    if (s->n && s->n_layers != cfg->n_layers)
        return mm3_errorf(-EINVAL, "adapter '%s': the set was made for a talker of %d layers", name, s->n_layers);
    struct talker_lora *l = &s->a[s->n];
    memset(l, 0, sizeof *l);
    if ((rc = lora_adapter_load(&l->src, dir, "language_model")) < 0)
        return mm3_error_prefix(rc, "LoRA adapter '%s': ", name);
    snprintf(l->name, sizeof l->name, "%s", name);
    l->rank = l->src.rank;
    l->scale = (float)(scale * l->src.scaling);
    l->mats = calloc((size_t)cfg->n_layers * TALKER_LORA_N_TARGETS, sizeof *l->mats);
    if (!l->mats) rc = mm3_errorf(-ENOMEM, "LoRA adapter %s: out of memory", dir);
    for (int i = 0; rc == 0 && i < l->src.n_modules; i++) {
        const struct lora_module *m = &l->src.modules[i];
        int layer = 0;
        enum talker_lora_target t = TALKER_LORA_Q;
        if ((rc = place_module(cfg, dir, m, &layer, &t)) < 0) break;
        l->mats[layer * TALKER_LORA_N_TARGETS + t] =
            (struct talker_lora_mat){.a = m->a, .b = m->b, .in = (int)m->in, .out = (int)m->out};
    }
    if (rc < 0) {
        free(l->mats);
        lora_adapter_free(&l->src);
        memset(l, 0, sizeof *l);
        return rc;
    }
    s->n_layers = cfg->n_layers;
    s->n++;
    LOG_INFO("LoRA '%s' (%s): %d modules, r %d, alpha %g%s, scale %g, served per request", name, dir, l->src.n_modules,
             l->rank, l->src.alpha, l->src.rslora ? " (rslora)" : "", scale);
    return 0;
}

void talker_lora_set_free(struct talker_lora_set *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->a[i].mats);
        lora_adapter_free(&s->a[i].src);
    }
    memset(s, 0, sizeof *s);
}

int talker_lora_set_find(const struct talker_lora_set *s, const char *name)
{
    for (int i = 0; s && name && i < s->n; i++)
        if (!strcmp(s->a[i].name, name)) return i;
    return -1;
}

size_t talker_lora_floats(const struct talker_lora *l, int n_layers)
{
    size_t n = 0;
    for (int i = 0; i < n_layers * TALKER_LORA_N_TARGETS; i++) {
        const struct talker_lora_mat *m = &l->mats[i];
        if (m->a) n += (size_t)l->rank * (size_t)(m->in + m->out);
    }
    return n;
}

size_t talker_lora_set_bytes(const struct talker_lora_set *s)
{
    size_t n = 0;
    for (int k = 0; s && k < s->n; k++)
        n += talker_lora_floats(&s->a[k], s->n_layers);
    return n * sizeof(float);
}

const struct talker_lora_mat *talker_lora_at(const struct talker_lora *l, int layer, enum talker_lora_target target)
{
    return &l->mats[layer * TALKER_LORA_N_TARGETS + target];
}
