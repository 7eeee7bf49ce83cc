/* LoRA adapters in the PEFT layout (common/lora.h). */
#include "common/lora.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"

#define CONFIG_NAME "adapter_config.json"
#define WEIGHTS_NAME "adapter_model.safetensors"
#define PEFT_PREFIX "base_model.model."

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* ---- adapter_config.json ------------------------------------------------- */

struct lora_targets {
    const json_t *list; /* target_modules as a list of names, or NULL for "all-linear" */
    const json_t *exclude;
    /* The module "all-linear" leaves out: PEFT skips a transformers model's output layer
     * (get_output_embeddings: the talker's lm_head); diffusers models keep every layer. */
    const char *output_layer;
};

static int config_bool(const char *path, const json_t *cfg, const char *key, int *out)
{
    const json_t *v = json_object_get(cfg, key);
    *out = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return mm3_errorf(-EINVAL, "%s: key '%s': expected true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

/* A key that must be absent, null, false, an empty list or an empty mapping: what
 * it would switch on is a kind of adapter mm3 does not serve (`what`). */
static int config_unset(const char *path, const json_t *cfg, const char *key, const char *what)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v) || json_is_false(v)) return 0;
    if ((json_is_array(v) && json_array_size(v) == 0) || (json_is_object(v) && json_object_size(v) == 0)) return 0;
    return mm3_errorf(-EINVAL, "%s: key '%s': %s is not supported (mm3 serves plain LoRA on linear layers)", path, key,
                      what);
}

static int config_names(const char *path, const char *key, const json_t *v, const json_t **out)
{
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v))
        return mm3_errorf(-EINVAL,
                          "%s: key '%s': expected a list of module names (regular expressions are not "
                          "supported)",
                          path, key);
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s) if (!json_is_string(s) || !json_string_length(s)) return mm3_errorf(
        -EINVAL, "%s: key '%s'[%zu]: expected a module name", path, key, i);
    *out = v;
    return 0;
}

static int read_config(struct lora_adapter *a, const char *path, json_t *cfg, struct lora_targets *tg)
{
    if (!json_is_object(cfg)) return mm3_errorf(-EINVAL, "%s: expected a JSON object", path);
    const json_t *v = json_object_get(cfg, "peft_type");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "LORA")))
        return mm3_errorf(-EINVAL,
                          "%s: key 'peft_type': expected \"LORA\" (other PEFT adapter types are not supported)", path);
    v = json_object_get(cfg, "r");
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > LORA_MAX_RANK)
        return mm3_errorf(-EINVAL, "%s: key 'r': expected an integer rank in [1, %d]", path, LORA_MAX_RANK);
    a->rank = (int)json_integer_value(v);
    v = json_object_get(cfg, "lora_alpha");
    a->alpha = 8.0; /* PEFT's default */
    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return mm3_errorf(-EINVAL, "%s: key 'lora_alpha': expected a number", path);
        a->alpha = json_number_value(v);
    }
    int rc, ffio, dora;
    if ((rc = config_bool(path, cfg, "use_rslora", &a->rslora)) < 0 ||
        (rc = config_bool(path, cfg, "fan_in_fan_out", &ffio)) < 0 ||
        (rc = config_bool(path, cfg, "use_dora", &dora)) < 0)
        return rc;
    if (dora) return mm3_errorf(-EINVAL, "%s: key 'use_dora': DoRA is not supported (mm3 serves plain LoRA)", path);
    /* PEFT resets fan_in_fan_out to false on nn.Linear, the only kind adapted here. */
    if (ffio) LOG_WARN("%s: fan_in_fan_out is true; ignored, as PEFT ignores it for linear layers", path);
    v = json_object_get(cfg, "bias");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "none")))
        return mm3_errorf(-EINVAL, "%s: key 'bias': expected \"none\" (bias training is not supported)", path);
    if ((rc = config_unset(path, cfg, "lora_bias", "a trained lora_B bias")) < 0 ||
        (rc = config_unset(path, cfg, "modules_to_save", "fully trained modules")) < 0 ||
        (rc = config_unset(path, cfg, "rank_pattern", "a per-module rank")) < 0 ||
        (rc = config_unset(path, cfg, "alpha_pattern", "a per-module alpha")) < 0 ||
        (rc = config_unset(path, cfg, "layer_replication", "layer replication")) < 0 ||
        (rc = config_unset(path, cfg, "trainable_token_indices", "trained token embeddings")) < 0)
        return rc;
    v = json_object_get(cfg, "target_modules");
    if (json_is_string(v) && !strcasecmp(json_string_value(v), "all-linear")) /* PEFT compares lowercased */
        tg->list = NULL;
    else if (!json_is_array(v))
        return mm3_errorf(-EINVAL,
                          "%s: key 'target_modules': expected a list of module names or \"all-linear\" "
                          "(regular expressions are not supported)",
                          path);
    else if ((rc = config_names(path, "target_modules", v, &tg->list)) < 0)
        return rc;
    if ((rc = config_names(path, "exclude_modules", json_object_get(cfg, "exclude_modules"), &tg->exclude)) < 0)
        return rc;
    a->scaling = a->rslora ? a->alpha / sqrt((double)a->rank) : a->alpha / (double)a->rank;
    return 0;
}

/* PEFT's rule: a module is named by a list entry equal to its path or to a suffix
 * of it after a dot. */
static int names_match(const json_t *list, const char *module)
{
    size_t i;
    const json_t *s;
    json_array_foreach(list, i, s)
    {
        const char *t = json_string_value(s);
        size_t n = strlen(module), k = strlen(t);
        if (!strcmp(module, t) || (n > k && module[n - k - 1] == '.' && !strcmp(module + n - k, t))) return 1;
    }
    return 0;
}

/* ---- adapter_model.safetensors ------------------------------------------- */

enum lora_part { LORA_A = 0, LORA_B = 1 };

struct key_entry {
    char *module;
    enum lora_part part;
    const struct st_tensor *t;
};

/* The module path and part of one tensor name, or an error naming the key and
 * the kind of adapter it belongs to. */
static int parse_key(const char *path, const char *key, const char *component, char **module, enum lora_part *part)
{
    const char *k = key;
    size_t plen = strlen(component);
    if (!strncmp(k, PEFT_PREFIX, strlen(PEFT_PREFIX)))
        k += strlen(PEFT_PREFIX);
    else if (!strncmp(k, component, plen) && k[plen] == '.')
        k += plen + 1;
    if (strstr(k, "lora_magnitude_vector"))
        return mm3_errorf(-EINVAL, "%s: tensor '%s': DoRA (lora_magnitude_vector) is not supported", path, key);
    if (strstr(k, "lora_embedding_"))
        return mm3_errorf(-EINVAL, "%s: tensor '%s': embedding adapters are not supported (linear layers only)", path,
                          key);
    static const char *const suffix[2] = {".lora_A.weight", ".lora_B.weight"};
    for (int p = 0; p < 2; p++)
        if (ends_with(k, suffix[p])) {
            size_t n = strlen(k) - strlen(suffix[p]);
            if (n == 0) break;
            *module = strndup(k, n);
            *part = (enum lora_part)p;
            return *module ? 0 : mm3_errorf(-ENOMEM, "%s: out of memory", path);
        }
    if (ends_with(k, ".lora_A.bias") || ends_with(k, ".lora_B.bias"))
        return mm3_errorf(-EINVAL, "%s: tensor '%s': a trained LoRA bias (lora_bias) is not supported", path, key);
    if (ends_with(k, ".bias")) return mm3_errorf(-EINVAL, "%s: tensor '%s': bias training is not supported", path, key);
    if (strstr(k, ".lora_A.") || strstr(k, ".lora_B."))
        return mm3_errorf(-EINVAL,
                          "%s: tensor '%s': expected '<module>.lora_A.weight' or '<module>.lora_B.weight' "
                          "(the adapter name is not part of a saved key)",
                          path, key);
    return mm3_errorf(-EINVAL,
                      "%s: tensor '%s': not a LoRA tensor (expected '[%s|%s.]<module>.lora_A.weight' or "
                      "'...lora_B.weight'; fully trained modules are not supported)",
                      path, key, PEFT_PREFIX, component);
}

static int cmp_entry(const void *x, const void *y)
{
    const struct key_entry *a = x, *b = y;
    int c = strcmp(a->module, b->module);
    return c ? c : (int)a->part - (int)b->part;
}

static int check_shape(const char *path, const struct st_tensor *t, int64_t rank, int rank_dim)
{
    char s[96];
    if (t->dtype != MM3_DTYPE_F32 && t->dtype != MM3_DTYPE_F16 && t->dtype != MM3_DTYPE_BF16)
        return mm3_errorf(-EINVAL, "%s: tensor '%s' is %s: expected F32, F16 or BF16", path, t->name,
                          mm3_dtype_name(t->dtype));
    if (t->ndim != 2)
        return mm3_errorf(-EINVAL, "%s: tensor '%s' has shape %s: expected 2 dimensions (%s)", path, t->name,
                          st_shape_str(s, sizeof s, t->ndim, t->shape),
                          t->ndim > 2 ? "convolution adapters are not supported" : "a linear layer's factor");
    if (t->shape[rank_dim] != rank || t->shape[1 - rank_dim] < 1)
        return mm3_errorf(-EINVAL, "%s: tensor '%s' has shape %s: expected %s with r = %lld from %s", path, t->name,
                          st_shape_str(s, sizeof s, t->ndim, t->shape), rank_dim == 0 ? "[r, in]" : "[out, r]",
                          (long long)rank, CONFIG_NAME);
    return 0;
}

/* Pair the sorted entries into modules: each module has exactly one A and one B. */
static int build_modules(struct lora_adapter *a, const char *path, const struct st_file *f, struct key_entry *e, int n,
                         const struct lora_targets *tg)
{
    a->modules = calloc((size_t)(n / 2 + 1), sizeof *a->modules);
    if (!a->modules) return mm3_errorf(-ENOMEM, "%s: out of memory", path);
    int rc = 0;
    for (int i = 0; i < n && rc == 0;) {
        const char *mod = e[i].module;
        if (i + 1 >= n || strcmp(e[i + 1].module, mod) || e[i].part != LORA_A || e[i + 1].part != LORA_B)
            return mm3_errorf(-EINVAL, "%s: module '%s': expected exactly one lora_A and one lora_B tensor (has %s)",
                              path, mod, e[i].part == LORA_A ? "lora_A only" : "lora_B without lora_A");
        if (i + 2 < n && !strcmp(e[i + 2].module, mod))
            return mm3_errorf(-EINVAL, "%s: module '%s': its lora_%c tensor appears twice under different prefixes",
                              path, mod, e[i + 2].part == LORA_A ? 'A' : 'B');
        if (tg->list && !names_match(tg->list, mod))
            return mm3_errorf(-EINVAL, "%s: tensor '%s': module '%s' is not named by target_modules in %s", path,
                              e[i].t->name, mod, CONFIG_NAME);
        if (!tg->list && tg->output_layer && !strcmp(mod, tg->output_layer))
            return mm3_errorf(-EINVAL,
                              "%s: tensor '%s': module '%s' is the output layer, which target_modules \"all-linear\" "
                              "in %s leaves out (PEFT would not load it)",
                              path, e[i].t->name, mod, CONFIG_NAME);
        if (tg->exclude && names_match(tg->exclude, mod))
            return mm3_errorf(-EINVAL, "%s: tensor '%s': module '%s' is named by exclude_modules in %s", path,
                              e[i].t->name, mod, CONFIG_NAME);
        const struct st_tensor *ta = e[i].t, *tb = e[i + 1].t;
        if ((rc = check_shape(path, ta, a->rank, 0)) < 0 || (rc = check_shape(path, tb, a->rank, 1)) < 0) return rc;
        struct lora_module *m = &a->modules[a->n_modules++];
        m->name = e[i].module;
        e[i].module = NULL;
        m->in = ta->shape[1];
        m->out = tb->shape[0];
        size_t wl = strlen(m->name) + sizeof ".weight";
        m->weight = malloc(wl);
        m->a = malloc(sizeof(float) * (size_t)(a->rank * m->in));
        m->b = malloc(sizeof(float) * (size_t)(m->out * a->rank));
        if (!m->weight || !m->a || !m->b)
            return mm3_errorf(-ENOMEM, "%s: out of memory for module '%s'", path, m->name);
        snprintf(m->weight, wl, "%s.weight", m->name);
        if ((rc = st_file_read_f32(f, ta->name, m->a, -1, NULL)) < 0 ||
            (rc = st_file_read_f32(f, tb->name, m->b, -1, NULL)) < 0)
            return rc;
        i += 2;
    }
    return rc;
}

static int cmp_module(const void *x, const void *y)
{
    return strcmp(((const struct lora_module *)x)->weight, ((const struct lora_module *)y)->weight);
}

static int read_weights(struct lora_adapter *a, const char *path, const char *component, const struct lora_targets *tg)
{
    struct st_file f;
    int rc = st_file_open(&f, path);
    if (rc < 0) return rc;
    if (f.n_tensors == 0) {
        st_file_close(&f);
        return mm3_errorf(-EINVAL, "%s: no tensors (expected lora_A and lora_B per adapted module)", path);
    }
    struct key_entry *e = calloc((size_t)f.n_tensors, sizeof *e);
    if (!e) rc = mm3_errorf(-ENOMEM, "%s: out of memory", path);
    int n = 0;
    for (int i = 0; rc == 0 && i < f.n_tensors; i++) {
        e[n].t = &f.tensors[i];
        if ((rc = parse_key(path, f.tensors[i].name, component, &e[n].module, &e[n].part)) == 0) n++;
    }
    if (rc == 0) {
        qsort(e, (size_t)n, sizeof *e, cmp_entry);
        rc = build_modules(a, path, &f, e, n, tg);
    }
    if (rc == 0) qsort(a->modules, (size_t)a->n_modules, sizeof *a->modules, cmp_module);
    for (int i = 0; e && i < n; i++)
        free(e[i].module);
    free(e);
    st_file_close(&f);
    return rc;
}

int lora_adapter_load(struct lora_adapter *a, const char *dir, const char *component)
{
    memset(a, 0, sizeof *a);
    char cfg_path[4200], st_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/%s", dir, CONFIG_NAME);
    snprintf(st_path, sizeof st_path, "%s/%s", dir, WEIGHTS_NAME);
    json_error_t jerr;
    json_t *cfg = json_load_file(cfg_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!cfg) {
        int missing = jerr.line <= 0 && jerr.position == 0;
        return mm3_errorf(missing ? -ENOENT : -EINVAL, "%s:%d:%d: %s (expected a PEFT LoRA folder)", cfg_path,
                          jerr.line, jerr.column, missing ? "cannot read the file" : jerr.text);
    }
    struct lora_targets tg = {.output_layer = strcmp(component, "language_model") ? NULL : "lm_head"};
    a->dir = strdup(dir);
    int rc = a->dir ? read_config(a, cfg_path, cfg, &tg) : mm3_errorf(-ENOMEM, "%s: out of memory", dir);
    if (rc == 0) rc = read_weights(a, st_path, component, &tg);
    json_decref(cfg);
    if (rc < 0) lora_adapter_free(a);
    return rc;
}

void lora_adapter_free(struct lora_adapter *a)
{
    for (int i = 0; a->modules && i < a->n_modules; i++) {
        free(a->modules[i].name);
        free(a->modules[i].weight);
        free(a->modules[i].a);
        free(a->modules[i].b);
    }
    free(a->modules);
    free(a->dir);
    memset(a, 0, sizeof *a);
}

const struct lora_module *lora_adapter_find(const struct lora_adapter *a, const char *weight)
{
    int lo = 0, hi = a->n_modules - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(a->modules[mid].weight, weight);
        if (c == 0) return &a->modules[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int lora_module_add_rows(const struct lora_module *m, int rank, float factor, int64_t row0, int64_t n, float *rows)
{
    const int64_t in = m->in;
    float *restrict acc = malloc(sizeof(float) * (size_t)in);
    if (!acc) return mm3_errorf(-ENOMEM, "LoRA module '%s': out of memory", m->name);
    for (int64_t i = 0; i < n; i++) {
        const float *b = m->b + (row0 + i) * rank;
        float *dst = rows + i * in;
        memset(acc, 0, sizeof(float) * (size_t)in);
        for (int k = 0; k < rank; k++) {
            const float bk = b[k];
            const float *restrict ak = m->a + (int64_t)k * in;
            for (int64_t j = 0; j < in; j++)
                acc[j] += bk * ak[j];
        }
        for (int64_t j = 0; j < in; j++)
            dst[j] += factor * acc[j];
    }
    free(acc);
    return 0;
}
