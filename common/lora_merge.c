/* LoRA adapters merged into checkpoint reads (common/lora_merge.h). */
#include "common/lora_merge.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/log.h"
#include "common/lora.h"

struct merge_entry {
    char component[MM3_DEPLOY_NAME_MAX];
    double scale;
    struct lora_adapter adapter;
};

static struct merge_entry g_merges[LORA_MERGE_MAX];
static int g_n_merges;

int lora_merge_add(const char *component, const char *dir, double scale)
{
    if (g_n_merges == LORA_MERGE_MAX)
        return mm3_errorf(-EINVAL, "%s: at most %d LoRA adapters can be merged", dir, LORA_MERGE_MAX);
    if (strlen(component) >= MM3_DEPLOY_NAME_MAX)
        return mm3_errorf(-EINVAL, "%s: component name '%s' too long", dir, component);
    struct merge_entry *e = &g_merges[g_n_merges];
    int rc = lora_adapter_load(&e->adapter, dir, component);
    if (rc < 0) return mm3_error_prefix(rc, "LoRA adapter for %s: ", component);
    snprintf(e->component, sizeof e->component, "%s", component);
    e->scale = scale;
    g_n_merges++;
    LOG_INFO("LoRA %s: %d modules, r %d, alpha %g%s, scale %g merged into %s", dir, e->adapter.n_modules,
             e->adapter.rank, e->adapter.alpha, e->adapter.rslora ? " (rslora)" : "", scale, component);
    return 0;
}

int lora_merge_add_stage(const struct mm3_stage_config *s)
{
    for (int i = 0; i < s->n_lora; i++) {
        int rc = lora_merge_add(s->lora[i].component, s->lora[i].path, s->lora[i].scale);
        if (rc < 0) return rc;
    }
    return 0;
}

int lora_merge_add_golden(const char *dir, const void *manifest_json, const char *const *components, int n)
{
    const json_t *list = json_object_get(manifest_json, "lora");
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list))
        return mm3_errorf(-EINVAL, "%s/manifest.json: key 'lora': expected a list of {component, path, scale}", dir);
    size_t i;
    const json_t *e;
    json_array_foreach(list, i, e)
    {
        const char *comp = json_string_value(json_object_get(e, "component"));
        const char *path = json_string_value(json_object_get(e, "path"));
        const json_t *js = json_object_get(e, "scale");
        if (!comp || !path || (js && !json_is_number(js)))
            return mm3_errorf(-EINVAL,
                              "%s/manifest.json: lora[%zu]: expected {\"component\": string, \"path\": string, "
                              "\"scale\": number}",
                              dir, i);
        int mine = 0;
        for (int k = 0; k < n; k++)
            mine |= !strcmp(components[k], comp);
        if (!mine) continue;
        char full[4200];
        snprintf(full, sizeof full, "%s/%s", dir, path);
        int rc = lora_merge_add(comp, full, js ? json_number_value(js) : 1.0);
        if (rc < 0) return rc;
    }
    return 0;
}

void lora_merge_clear(void)
{
    for (int i = 0; i < g_n_merges; i++)
        lora_adapter_free(&g_merges[i].adapter);
    memset(g_merges, 0, sizeof g_merges);
    g_n_merges = 0;
}

int lora_merge_count(const char *component)
{
    int n = 0;
    for (int i = 0; i < g_n_merges; i++)
        n += !strcmp(g_merges[i].component, component);
    return n;
}

int lora_merge_check(const struct ckpt_component *c)
{
    for (int i = 0; i < g_n_merges; i++) {
        const struct merge_entry *e = &g_merges[i];
        if (strcmp(e->component, c->name)) continue;
        for (int j = 0; j < e->adapter.n_modules; j++) {
            const struct lora_module *m = &e->adapter.modules[j];
            const struct ckpt_tensor *t = ckpt_find(c, m->weight);
            char have[96], want[96];
            st_shape_str(want, sizeof want, 2, (int64_t[]){m->out, m->in});
            if (!t)
                return mm3_errorf(-EINVAL,
                                  "LoRA adapter %s: module '%s' adapts '%s', which %s does not hold (an adapter "
                                  "for another model or component?)",
                                  e->adapter.dir, m->name, m->weight, c->dir);
            if (t->st->ndim != 2 || t->st->shape[0] != m->out || t->st->shape[1] != m->in)
                return mm3_errorf(-EINVAL,
                                  "LoRA adapter %s: module '%s': lora_B x lora_A is %s but %s '%s' has shape %s",
                                  e->adapter.dir, m->name, want, c->dir, m->weight,
                                  st_shape_str(have, sizeof have, t->st->ndim, t->st->shape));
        }
    }
    return 0;
}

/* The adapters' deltas added to rows [row0, row0 + n) of tensor t (widened, cols
 * floats each), then the sum rounded once to `round_to` (BF16, F16; F32: none). */
static int merge_rows(const struct ckpt_component *c, const struct ckpt_tensor *t, int64_t row0, int64_t n, float *rows,
                      enum mm3_dtype round_to)
{
    int merged = 0;
    for (int i = 0; i < g_n_merges; i++) {
        const struct merge_entry *e = &g_merges[i];
        if (strcmp(e->component, c->name)) continue;
        const struct lora_module *m = lora_adapter_find(&e->adapter, t->st->name);
        if (!m) continue;
        if (t->st->ndim != 2 || t->st->shape[0] != m->out || t->st->shape[1] != m->in)
            return mm3_errorf(-EINVAL, "LoRA adapter %s: module '%s' does not fit %s '%s'", e->adapter.dir, m->name,
                              c->dir, t->st->name);
        int rc = lora_module_add_rows(m, e->adapter.rank, (float)(e->scale * e->adapter.scaling), row0, n, rows);
        if (rc < 0) return rc;
        merged = 1;
    }
    if (!merged || round_to == MM3_DTYPE_F32) return 0;
    size_t count = (size_t)n * (size_t)t->st->shape[1];
    for (size_t k = 0; k < count; k++)
        rows[k] = round_to == MM3_DTYPE_BF16 ? mm3_bf16_to_f32(mm3_f32_to_bf16(rows[k]))
                                             : mm3_f16_to_f32(mm3_f32_to_f16(rows[k]));
    return 0;
}

static const struct ckpt_tensor *merged_tensor(const struct ckpt_component *c, const char *name)
{
    if (!lora_merge_count(c->name)) return NULL;
    const struct ckpt_tensor *t = ckpt_find(c, name);
    if (!t) return NULL;
    for (int i = 0; i < g_n_merges; i++)
        if (!strcmp(g_merges[i].component, c->name) && lora_adapter_find(&g_merges[i].adapter, name)) return t;
    return NULL;
}

int lora_merge_read_f32(const struct ckpt_component *c, const char *name, float *dst, int ndim, const int64_t *shape)
{
    int rc = ckpt_read_f32(c, name, dst, ndim, shape);
    const struct ckpt_tensor *t = rc < 0 ? NULL : merged_tensor(c, name);
    return t ? merge_rows(c, t, 0, t->st->shape[0], dst, t->st->dtype) : rc;
}

int lora_merge_read_rows_f32(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n, float *dst)
{
    int rc = ckpt_read_rows_f32(c, name, row0, n, dst);
    const struct ckpt_tensor *t = rc < 0 ? NULL : merged_tensor(c, name);
    return t ? merge_rows(c, t, row0, n, dst, t->st->dtype) : rc;
}

int lora_merge_read_rows_bf16(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n, uint16_t *dst)
{
    const struct ckpt_tensor *t = merged_tensor(c, name);
    if (!t) return ckpt_read_rows_bf16(c, name, row0, n, dst);
    if (t->st->ndim != 2) return mm3_errorf(-EINVAL, "%s: '%s' is not a matrix", c->dir, name);
    size_t count = (size_t)n * (size_t)t->st->shape[1];
    float *rows = malloc(sizeof(float) * (count ? count : 1));
    if (!rows) return mm3_errorf(-ENOMEM, "%s: out of memory merging LoRA into '%s'", c->dir, name);
    /* Widened, merged in float32, rounded to bf16 once (the conversion below is exact). */
    int rc = ckpt_read_rows_f32(c, name, row0, n, rows);
    if (rc == 0) rc = merge_rows(c, t, row0, n, rows, MM3_DTYPE_BF16);
    for (size_t k = 0; rc == 0 && k < count; k++)
        dst[k] = mm3_f32_to_bf16(rows[k]);
    free(rows);
    return rc;
}
