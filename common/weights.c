/* Weight tables (common/weights.h). */
#include "common/weights.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/lora_merge.h"

int weights_config_size(const struct ckpt_component *c, const char *key, int max, int *out)
{
    int64_t v;
    int rc = ckpt_config_int(c, key, &v);
    if (rc < 0) return rc;
    if (v < 1 || v > max)
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected a positive size (at most %d), got %lld", c->dir,
                          key, max, (long long)v);
    *out = (int)v;
    return 0;
}

void weight_table_init(struct weight_table *t)
{
    memset(t, 0, sizeof *t);
}

void weight_table_free(struct weight_table *t)
{
    free(t->specs);
    memset(t, 0, sizeof *t);
}

/* A zeroed new entry, or NULL once the table has failed. */
static struct weight_spec *table_push(struct weight_table *t)
{
    if (t->rc < 0) return NULL;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        struct weight_spec *s = realloc(t->specs, sizeof *s * (size_t)cap);
        if (!s) {
            t->rc = mm3_errorf(-ENOMEM, "weight table: out of memory for %d entries", cap);
            return NULL;
        }
        t->specs = s;
        t->cap = cap;
    }
    struct weight_spec *s = &t->specs[t->n++];
    memset(s, 0, sizeof *s);
    return s;
}

static void spec_name(struct weight_table *t, struct weight_spec *s, const char *fmt, va_list ap)
{
    int len = vsnprintf(s->name, sizeof s->name, fmt, ap);
    if (len < 0 || len >= (int)sizeof s->name)
        t->rc = mm3_errorf(-ENAMETOOLONG, "weight table: tensor name '%s...' longer than %d bytes", s->name,
                           WEIGHT_NAME_MAX - 1);
}

static void spec_shape(struct weight_table *t, struct weight_spec *s, int ndim, const int64_t *shape)
{
    if (ndim < 0 || ndim > WEIGHT_MAX_DIMS) {
        if (t->rc < 0) return;
        t->rc = mm3_errorf(-EINVAL, "weight table: '%s': %d dims, at most %d", s->name, ndim, WEIGHT_MAX_DIMS);
        return;
    }
    s->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        s->shape[d] = shape[d];
}

void weight_table_add(struct weight_table *t, float **dst, int ndim, const int64_t *shape, const char *fmt, ...)
{
    struct weight_spec *s = table_push(t);
    if (!s) return;
    va_list ap;
    va_start(ap, fmt);
    spec_name(t, s, fmt, ap);
    va_end(ap);
    s->kind = WEIGHT_TENSOR;
    s->dst = dst;
    spec_shape(t, s, ndim, shape);
}

void weight_table_add_leaves(struct weight_table *t, const char *prefix, const struct weight_leaf *leaves, int n)
{
    for (int i = 0; i < n; i++) {
        const struct weight_leaf *w = &leaves[i];
        weight_table_add(t, w->dst, w->d1 > 0 ? 2 : 1, (int64_t[]){w->d0, w->d1}, "%s%s", prefix, w->name);
    }
}

static void add_named(struct weight_table *t, struct weight_spec *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    spec_name(t, s, fmt, ap);
    va_end(ap);
}

void weight_table_add_rows(struct weight_table *t, float **dst, int64_t rows, int64_t cols, int64_t row0, int64_t n,
                           const char *name)
{
    struct weight_spec *s = table_push(t);
    if (!s) return;
    add_named(t, s, "%s", name);
    s->kind = WEIGHT_ROWS;
    s->dst = dst;
    spec_shape(t, s, 2, (int64_t[]){rows, cols});
    s->row0 = row0;
    s->n_rows = n;
    if (t->rc == 0 && (row0 < 0 || n < 0 || row0 + n > rows))
        t->rc = mm3_errorf(-EINVAL, "weight table: '%s': rows [%lld, %lld) outside [0, %lld)", name, (long long)row0,
                           (long long)(row0 + n), (long long)rows);
}

void weight_table_add_space(struct weight_table *t, float **dst, size_t n)
{
    struct weight_spec *s = table_push(t);
    if (!s) return;
    s->kind = WEIGHT_SPACE;
    s->dst = dst;
    spec_shape(t, s, 1, (int64_t[]){(int64_t)n});
}

void weight_table_add_elsewhere(struct weight_table *t, const char *name)
{
    struct weight_spec *s = table_push(t);
    if (!s) return;
    add_named(t, s, "%s", name);
    s->kind = WEIGHT_ELSEWHERE;
}

void weight_table_defer_matrices(struct weight_table *t, int from, int to)
{
    for (int i = from < 0 ? 0 : from; i < to && i < t->n; i++) {
        struct weight_spec *s = &t->specs[i];
        if ((s->kind == WEIGHT_TENSOR || s->kind == WEIGHT_ROWS) && s->ndim == 2) s->deferred = 1;
    }
}

void weight_table_defer(struct weight_table *t, float **dst)
{
    for (int i = 0; i < t->n; i++) {
        if (t->specs[i].dst != dst) continue;
        do
            t->specs[i++].deferred = 1;
        while (i < t->n && !t->specs[i].dst && t->specs[i].kind != WEIGHT_SPACE && t->specs[i].kind != WEIGHT_ELSEWHERE);
        return;
    }
    if (t->rc == 0) t->rc = mm3_errorf(-EINVAL, "weight table: no entry fills the field to defer");
}

const struct weight_spec *weight_deferred_find(const struct weight_deferred *d, float *const *dst, int *n)
{
    *n = 0;
    const struct weight_table *t = &d->table;
    for (int i = 0; i < t->n; i++) {
        if (t->specs[i].dst != dst) continue;
        int k = 1;
        while (i + k < t->n && !t->specs[i + k].dst) k++;
        *n = k;
        return &t->specs[i];
    }
    return NULL;
}

int weight_deferred_any(const struct weight_deferred *d)
{
    return d->table.n > 0;
}

void weight_deferred_free(struct weight_deferred *d)
{
    free(d->root);
    free(d->component);
    weight_table_free(&d->table);
    memset(d, 0, sizeof *d);
}

static size_t spec_floats(const struct weight_spec *s)
{
    if (s->kind == WEIGHT_ELSEWHERE || s->deferred) return 0;
    size_t e = s->kind == WEIGHT_ROWS ? (size_t)s->n_rows : 1;
    for (int d = s->kind == WEIGHT_ROWS ? 1 : 0; d < s->ndim; d++)
        e *= (size_t)s->shape[d];
    return e;
}

size_t weight_table_floats(const struct weight_table *t)
{
    size_t total = 0;
    for (int i = 0; i < t->n; i++)
        total += spec_floats(&t->specs[i]);
    return total;
}

/* Rows of a 2-D tensor, widened, without materialising the rest of it. */
static int read_rows(const struct ckpt_component *c, const struct weight_spec *s, float *dst)
{
    int rc = ckpt_find_shaped(c, s->name, s->ndim, s->shape, NULL);
    return rc < 0 ? rc : lora_merge_read_rows_f32(c, s->name, s->row0, s->n_rows, dst);
}

/* Every tensor of c is named by the table. */
static int check_all_named(const struct ckpt_component *c, const struct weight_table *t)
{
    unsigned char *seen = calloc((size_t)c->n_tensors + 1, 1);
    if (!seen) return mm3_errorf(-ENOMEM, "%s: out of memory", c->dir);
    for (int i = 0; i < t->n; i++) {
        if (t->specs[i].kind == WEIGHT_SPACE) continue;
        const struct ckpt_tensor *ct = ckpt_find(c, t->specs[i].name);
        if (ct) seen[ct - c->tensors] = 1;
    }
    int rc = 0;
    for (int i = 0; i < c->n_tensors && rc == 0; i++)
        if (!seen[i])
            rc = mm3_errorf(-EINVAL,
                            "%s: unexpected tensor '%s': the model config.json describes has no such weight "
                            "(config.json and the weights disagree)",
                            c->dir, c->tensors[i].st->name);
    free(seen);
    return rc;
}

int weights_load_table(const struct ckpt_component *c, const struct weight_table *t, float **arena,
                       size_t *arena_floats)
{
    *arena = NULL;
    if (arena_floats) *arena_floats = 0;
    if (t->rc < 0) return t->rc;
    int rc = lora_merge_check(c);
    if (rc < 0) return rc;
    size_t total = weight_table_floats(t);
    float *base = malloc(sizeof(float) * (total ? total : 1));
    if (!base) return mm3_errorf(-ENOMEM, "%s: cannot allocate %zu floats of weights", c->dir, total);
    float *p = base;
    for (int i = 0; i < t->n && rc == 0; i++) {
        const struct weight_spec *s = &t->specs[i];
        if (s->kind == WEIGHT_ELSEWHERE) continue;
        if (s->deferred) {
            if (!s->dst && (i == 0 || !t->specs[i - 1].deferred))
                rc = mm3_errorf(-EINVAL, "%s: '%s' is deferred but the rows it continues are not", c->dir, s->name);
            else
                rc = ckpt_find_shaped(c, s->name, s->ndim, s->shape, NULL);
            if (s->dst) *s->dst = NULL;
            continue;
        }
        if (s->dst) *s->dst = p;
        if (s->kind == WEIGHT_TENSOR) rc = lora_merge_read_f32(c, s->name, p, s->ndim, s->shape);
        if (s->kind == WEIGHT_ROWS) rc = read_rows(c, s, p);
        p += spec_floats(s);
    }
    if (rc == 0) rc = check_all_named(c, t);
    if (rc < 0) {
        free(base);
        return rc;
    }
    *arena = base;
    if (arena_floats) *arena_floats = total;
    return 0;
}

/* The deferred entries of t, in order, with where they live. */
static int keep_deferred(const struct weight_table *t, const char *root, const char *name, struct weight_deferred *d)
{
    int n = 0;
    for (int i = 0; i < t->n; i++)
        n += t->specs[i].deferred;
    d->root = strdup(root);
    d->component = strdup(name);
    d->table.specs = malloc(sizeof *d->table.specs * (size_t)(n ? n : 1));
    if (!d->root || !d->component || !d->table.specs) {
        weight_deferred_free(d);
        return mm3_errorf(-ENOMEM, "%s/%s: out of memory for %d deferred tensors", root, name, n);
    }
    for (int i = 0; i < t->n; i++)
        if (t->specs[i].deferred) d->table.specs[d->table.n++] = t->specs[i];
    d->table.cap = d->table.n;
    return 0;
}

int weights_component_load_deferred(const char *root, const char *name, void *model, weights_describe_fn describe,
                                    float **arena, size_t *arena_floats, struct weight_deferred *deferred)
{
    *arena = NULL;
    if (deferred) memset(deferred, 0, sizeof *deferred);
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, root, name);
    if (rc < 0) return rc;
    struct weight_table t;
    weight_table_init(&t);
    if ((rc = describe(model, &c, &t)) == 0) rc = weights_load_table(&c, &t, arena, arena_floats);
    for (int i = 0; rc == 0 && !deferred && i < t.n; i++)
        if (t.specs[i].deferred)
            rc = mm3_errorf(-EINVAL, "%s: '%s' deferred, but the load keeps no deferred tensors", c.dir, t.specs[i].name);
    if (rc == 0 && deferred) rc = keep_deferred(&t, root, name, deferred);
    if (rc < 0) {
        free(*arena);
        *arena = NULL;
    }
    weight_table_free(&t);
    ckpt_component_close(&c);
    return rc;
}

int weights_component_load(const char *root, const char *name, void *model, weights_describe_fn describe, float **arena,
                           size_t *arena_floats)
{
    return weights_component_load_deferred(root, name, model, describe, arena, arena_floats, NULL);
}
