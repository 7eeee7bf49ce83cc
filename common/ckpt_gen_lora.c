/* Random LoRA adapters for a checkpoint (common/ckpt_gen.h, mm3-mkckpt --lora). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checkpoint.h"
#include "common/ckpt_gen.h"
#include "common/error.h"
#include "common/safetensors.h"

#define MAX_TARGETS 32

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* N(0, 1) from (key, i) by Box-Muller, independent of any order of calls. */
static float unit_normal(uint64_t key, uint64_t i)
{
    uint64_t x = mix64(key ^ mix64(i));
    double u1 = ((double)(x >> 11) + 1.0) / 9007199254740993.0, u2 = (double)(mix64(x) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

static uint64_t name_key(const char *s, uint64_t seed)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return mix64(h ^ mix64(seed));
}

/* PEFT's target rule: the module path equals a target or ends with "." target. */
static int is_target(const char *module, char *const *targets, int n)
{
    size_t m = strlen(module);
    for (int i = 0; i < n; i++) {
        size_t k = strlen(targets[i]);
        if (!strcmp(module, targets[i]) || (m > k && module[m - k - 1] == '.' && !strcmp(module + m - k, targets[i])))
            return 1;
    }
    return 0;
}

static const char *default_targets(const char *component)
{
    if (!strcmp(component, "language_model")) return "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    if (!strcmp(component, "rvq_depth_decoder")) return "to_q,to_k,to_v,to_out,gate_proj,up_proj,down_proj";
    if (!strcmp(component, "transformer")) return "to_q,to_k,to_v,to_out.0,ff_in,ff_out";
    return NULL;
}

static int write_config(const char *path, const struct ckpt_gen_lora_opts *o, char *const *targets, int n)
{
    FILE *f = fopen(path, "w");
    if (!f) return mm3_errorf(-errno, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f, "{\n  \"peft_type\": \"LORA\",\n  \"r\": %d,\n  \"lora_alpha\": %.17g,\n  \"use_rslora\": %s,\n",
            o->rank, o->alpha, o->rslora ? "true" : "false");
    fprintf(f, "  \"target_modules\": [");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s\"%s\"", i ? ", " : "", targets[i]);
    fprintf(f, "],\n  \"fan_in_fan_out\": false,\n  \"bias\": \"none\",\n  \"use_dora\": false,\n"
               "  \"lora_dropout\": 0.0,\n  \"modules_to_save\": null,\n  \"init_lora_weights\": true,\n"
               "  \"base_model_name_or_path\": null,\n  \"task_type\": null\n}\n");
    return fclose(f) == 0 ? 0 : mm3_errorf(-EIO, "%s: write failed", path);
}

int ckpt_gen_lora_write(const char *out, const char *ckpt_root, const struct ckpt_gen_lora_opts *o)
{
    if (o->rank < 1 || o->rank > 4096) return mm3_errorf(-EINVAL, "LoRA rank %d: expected 1..4096", o->rank);
    const char *list = o->targets && o->targets[0] ? o->targets : default_targets(o->component);
    if (!list)
        return mm3_errorf(-EINVAL, "LoRA component '%s': expected language_model, rvq_depth_decoder or transformer",
                          o->component);
    char *buf = strdup(list), *targets[MAX_TARGETS], *save = NULL;
    int n_targets = 0;
    if (!buf) return mm3_errorf(-ENOMEM, "out of memory");
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n_targets == MAX_TARGETS) {
            free(buf);
            return mm3_errorf(-EINVAL, "--targets: at most %d module names", MAX_TARGETS);
        }
        targets[n_targets++] = t;
    }
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, ckpt_root, o->component);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    /* The prefix each tool writes: PEFT's for transformers models, diffusers' for the DiT. */
    const char *prefix = !strcmp(o->component, "transformer") ? "transformer." : "base_model.model.";
    struct st_writer_tensor *w = calloc((size_t)c.n_tensors * 2 + 1, sizeof *w);
    char **names = calloc((size_t)c.n_tensors * 2 + 1, sizeof *names);
    float **data = calloc((size_t)c.n_tensors * 2 + 1, sizeof *data);
    int n = 0;
    if (!w || !names || !data) rc = mm3_errorf(-ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < c.n_tensors; i++) {
        const struct st_tensor *t = c.tensors[i].st;
        size_t len = strlen(t->name);
        if (t->ndim != 2 || len <= 7 || strcmp(t->name + len - 7, ".weight")) continue;
        char module[512];
        snprintf(module, sizeof module, "%.*s", (int)(len - 7), t->name);
        if (!is_target(module, targets, n_targets)) continue;
        const int64_t out_dim = t->shape[0], in_dim = t->shape[1], r = o->rank;
        for (int part = 0; part < 2 && rc == 0; part++) {
            size_t numel = (size_t)r * (size_t)(part == 0 ? in_dim : out_dim);
            size_t nl = strlen(prefix) + strlen(module) + 32;
            names[n] = malloc(nl);
            data[n] = malloc(sizeof(float) * numel);
            if (!names[n] || !data[n]) {
                rc = mm3_errorf(-ENOMEM, "out of memory");
                break;
            }
            snprintf(names[n], nl, "%s%s.lora_%c.weight", prefix, module, part == 0 ? 'A' : 'B');
            /* A ~ N(0, 1/in) like the base weights; B ~ N(0, 0.01/r): with alpha = r the
             * delta is about a tenth of the weight it adapts, visible but not dominant. */
            const float sd = part == 0 ? (float)(1.0 / sqrt((double)in_dim)) : (float)(0.1 / sqrt((double)r));
            uint64_t key = name_key(names[n], o->seed);
            for (size_t e = 0; e < numel; e++)
                data[n][e] = sd * unit_normal(key, e);
            w[n] = (struct st_writer_tensor){names[n], MM3_DTYPE_F32, 2, {0}, data[n]};
            w[n].shape[0] = part == 0 ? r : out_dim;
            w[n].shape[1] = part == 0 ? in_dim : r;
            n++;
        }
    }
    if (rc == 0 && n == 0)
        rc = mm3_errorf(-EINVAL, "%s/%s: no 2-D weight matches the targets '%s'", ckpt_root, o->component, list);
    char path[4200];
    if (rc == 0 && mkdir(out, 0755) < 0 && errno != EEXIST)
        rc = mm3_errorf(-errno, "%s: cannot create the adapter folder: %s", out, strerror(errno));
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
        rc = st_write_file(path, w, n, NULL);
    }
    if (rc == 0) {
        snprintf(path, sizeof path, "%s/adapter_config.json", out);
        rc = write_config(path, o, targets, n_targets);
    }
    for (int i = 0; i < n + 1 && names && data; i++) {
        free(names[i]);
        free(data[i]);
    }
    free(names);
    free(data);
    free(w);
    free(buf);
    ckpt_component_close(&c);
    return rc;
}
