#include "common/checkpoint.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"

static char *path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const struct ckpt_tensor *x = a, *y = b;
    return strcmp(x->st->name, y->st->name);
}

static int load_json(const char *path, json_t **out)
{
    json_error_t e;
    *out = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!*out) {
        if (!file_exists(path)) return mm3_errorf(-ENOENT, "%s: missing", path);
        return mm3_errorf(-EINVAL, "%s:%d:%d: malformed JSON: %s", path, e.line, e.column, e.text);
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return mm3_errorf(-EINVAL, "%s: expected a JSON object", path);
    }
    return 0;
}

/* Shard file names from *.safetensors.index.json, or the single *.safetensors file. */
static int list_files(struct ckpt_component *c, char ***names, int *n, json_t **index)
{
    *names = NULL;
    *n = 0;
    *index = NULL;
    DIR *d = opendir(c->dir);
    if (!d) return mm3_errorf(-ENOENT, "%s: component folder missing", c->dir);
    char *index_name = NULL, *single = NULL;
    int n_single = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 23 && !strcmp(e->d_name + len - 23, ".safetensors.index.json")) {
            free(index_name);
            index_name = strdup(e->d_name);
        } else if (len > 12 && !strcmp(e->d_name + len - 12, ".safetensors")) {
            n_single++;
            free(single);
            single = strdup(e->d_name);
        }
    }
    closedir(d);
    int rc = 0;
    if (index_name) {
        char *ip = path_join(c->dir, index_name);
        rc = load_json(ip, index);
        if (rc == 0) {
            json_t *wm = json_object_get(*index, "weight_map");
            if (!json_is_object(wm)) {
                rc = mm3_errorf(-EINVAL, "%s: 'weight_map' must be an object of tensor name -> shard file", ip);
            } else {
                const char *key;
                json_t *v;
                *names = calloc(json_object_size(wm) + 1, sizeof(char *));
                json_object_foreach(wm, key, v) {
                    if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
                        rc = mm3_errorf(-EINVAL, "%s: weight_map['%s'] must be a shard file name", ip, key);
                        break;
                    }
                    int seen = 0;
                    for (int i = 0; i < *n && !seen; i++) seen = !strcmp((*names)[i], json_string_value(v));
                    if (!seen) (*names)[(*n)++] = strdup(json_string_value(v));
                }
            }
        }
        free(ip);
    } else if (n_single == 1) {
        *names = calloc(1, sizeof(char *));
        (*names)[0] = single;
        single = NULL;
        *n = 1;
    } else {
        rc = mm3_errorf(-ENOENT, "%s: expected one .safetensors file or a .safetensors.index.json, found %d files and no index",
                        c->dir, n_single);
    }
    free(index_name);
    free(single);
    return rc;
}

int ckpt_component_open(struct ckpt_component *c, const char *root, const char *name)
{
    memset(c, 0, sizeof *c);
    c->name = strdup(name);
    c->dir = path_join(root, name);
    char *cfg = path_join(c->dir, strcmp(name, "scheduler") ? "config.json" : "scheduler_config.json");
    int rc = load_json(cfg, &c->config);
    free(cfg);
    if (rc < 0) goto fail;
    if (!strcmp(name, "scheduler") || !strcmp(name, "tokenizer")) return 0;

    char **names;
    int n;
    json_t *index;
    rc = list_files(c, &names, &n, &index);
    if (rc == 0) {
        c->files = calloc((size_t)n, sizeof *c->files);
        for (int i = 0; i < n; i++) {
            char *p = path_join(c->dir, names[i]);
            if (!file_exists(p)) rc = mm3_errorf(-ENOENT, "%s: shard listed in the index is missing", p);
            else rc = st_file_open(&c->files[i], p);
            free(p);
            if (rc < 0) break;
            c->n_files++;
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc < 0) {
        json_decref(index);
        goto fail;
    }
    int total = 0;
    for (int i = 0; i < c->n_files; i++) total += c->files[i].n_tensors;
    c->tensors = calloc((size_t)(total ? total : 1), sizeof *c->tensors);
    for (int i = 0; i < c->n_files; i++)
        for (int j = 0; j < c->files[i].n_tensors; j++) {
            c->tensors[c->n_tensors].st = &c->files[i].tensors[j];
            c->tensors[c->n_tensors].file = i;
            c->n_tensors++;
        }
    qsort(c->tensors, (size_t)c->n_tensors, sizeof *c->tensors, cmp_tensor_name);
    for (int i = 1; i < c->n_tensors; i++)
        if (!strcmp(c->tensors[i].st->name, c->tensors[i - 1].st->name)) {
            rc = mm3_errorf(-EINVAL, "%s: tensor '%s' appears in more than one shard", c->dir, c->tensors[i].st->name);
            json_decref(index);
            goto fail;
        }
    if (index) {
        /* The index and the shards must agree exactly. */
        json_t *wm = json_object_get(index, "weight_map");
        const char *key;
        json_t *v;
        json_object_foreach(wm, key, v) {
            const struct ckpt_tensor *t = ckpt_find(c, key);
            const char *shard = json_string_value(v);
            const char *base = t ? strrchr(c->files[t->file].path, '/') + 1 : NULL;
            if (!t || strcmp(base, shard)) {
                rc = mm3_errorf(-EINVAL, "%s: index maps '%s' to %s but that shard does not hold it", c->dir, key, shard);
                break;
            }
        }
        if (rc == 0 && (int)json_object_size(wm) != c->n_tensors)
            rc = mm3_errorf(-EINVAL, "%s: the shards hold %d tensors but the index lists %zu", c->dir, c->n_tensors,
                            json_object_size(wm));
        json_decref(index);
        if (rc < 0) goto fail;
    }
    return 0;
fail:
    ckpt_component_close(c);
    return rc;
}

void ckpt_component_close(struct ckpt_component *c)
{
    for (int i = 0; i < c->n_files; i++) st_file_close(&c->files[i]);
    free(c->files);
    free(c->tensors);
    json_decref(c->config);
    free(c->arena);
    free(c->name);
    free(c->dir);
    memset(c, 0, sizeof *c);
}

const struct ckpt_tensor *ckpt_find(const struct ckpt_component *c, const char *name)
{
    int lo = 0, hi = c->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int r = strcmp(c->tensors[mid].st->name, name);
        if (r == 0) return &c->tensors[mid];
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

int ckpt_read_f32(const struct ckpt_component *c, const char *name, float *dst, int ndim, const int64_t *shape)
{
    const struct ckpt_tensor *t = ckpt_find(c, name);
    if (!t) return mm3_errorf(-ENOENT, "%s: missing tensor '%s'", c->dir, name);
    if (ndim >= 0) {
        int ok = t->st->ndim == ndim;
        for (int i = 0; ok && i < ndim; i++) ok = t->st->shape[i] == shape[i];
        if (!ok) {
            char a[128], b[128];
            return mm3_errorf(-EINVAL, "%s: tensor '%s' has shape %s, expected %s (from config.json)", c->dir, name,
                              st_shape_str(a, sizeof a, t->st->ndim, t->st->shape), st_shape_str(b, sizeof b, ndim, shape));
        }
    }
    if (t->data) {
        mm3_convert_to_f32(dst, t->data, t->st->dtype, st_tensor_numel(t->st));
        return 0;
    }
    return st_file_read_f32(&c->files[t->file], name, dst, -1, NULL);
}

static json_t *config_get(const struct ckpt_component *c, const char *key)
{
    return json_object_get(c->config, key);
}

int ckpt_config_int(const struct ckpt_component *c, const char *key, int64_t *out)
{
    json_t *v = config_get(c, key);
    if (!json_is_integer(v))
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected an integer%s", c->dir, key, v ? "" : " (missing)");
    *out = json_integer_value(v);
    return 0;
}

int ckpt_config_double(const struct ckpt_component *c, const char *key, double *out)
{
    json_t *v = config_get(c, key);
    if (!json_is_number(v))
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected a number%s", c->dir, key, v ? "" : " (missing)");
    *out = json_number_value(v);
    return 0;
}

int ckpt_config_int_array(const struct ckpt_component *c, const char *key, int64_t *out, int *n)
{
    json_t *v = config_get(c, key);
    if (!json_is_array(v) || (int)json_array_size(v) > *n)
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected an array of at most %d integers", c->dir, key, *n);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return mm3_errorf(-EINVAL, "%s/config.json: key '%s'[%zu]: expected an integer", c->dir, key, i);
        out[i] = json_integer_value(e);
    }
    *n = (int)json_array_size(v);
    return 0;
}

int ckpt_config_rope_theta(const struct ckpt_component *c, double *theta)
{
    json_t *v = config_get(c, "rope_theta");
    if (!v) {
        json_t *rp = config_get(c, "rope_parameters");
        v = json_is_object(rp) ? json_object_get(rp, "rope_theta") : NULL;
    }
    if (!json_is_number(v))
        return mm3_errorf(-EINVAL, "%s/config.json: expected a number at 'rope_theta' or 'rope_parameters.rope_theta'", c->dir);
    *theta = json_number_value(v);
    return 0;
}
