/* One weight-table loader for every model: a table of {tensor name, destination
 * pointer, shape from config.json} is sized, carved from one float allocation and read
 * (widened to float32) with every shape checked; afterwards the component must hold no
 * tensor the table does not name, so config.json and the weights cannot disagree
 * silently.
 *
 *     struct weight_table t;
 *     weight_table_init(&t);
 *     weight_table_add(&t, &m->embed, 2, (int64_t[]){vocab, H}, "model.embed_tokens.weight");
 *     for (l ...) weight_table_add(&t, &L->wq, 2, (int64_t[]){QD, H}, "model.layers.%d.q.weight", l);
 *     rc = weights_load_table(&c, &t, &m->arena, NULL);
 *     weight_table_free(&t);
 *
 * Entries are carved in table order, so consecutive entries are contiguous. Errors of
 * weight_table_add (out of memory, name too long) are kept and returned by
 * weights_load_table, so a table is built without checking each call. */
#ifndef MM3_WEIGHTS_H
#define MM3_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/checkpoint.h"

#define WEIGHT_NAME_MAX 128
#define WEIGHT_MAX_DIMS 4

enum weight_kind {
    WEIGHT_TENSOR = 0, /* the whole tensor, shape checked */
    WEIGHT_ROWS,       /* rows [row0, row0 + n_rows) of a 2-D tensor of shape `shape` */
    WEIGHT_SPACE,      /* no tensor: arena space the caller fills (computed tables) */
    WEIGHT_ELSEWHERE,  /* a tensor read by other code: no space, but not unexpected */
};

struct weight_spec {
    enum weight_kind kind;
    char name[WEIGHT_NAME_MAX];
    float **dst; /* receives the carved pointer; may be NULL */
    int ndim;
    int64_t shape[WEIGHT_MAX_DIMS];
    int64_t row0, n_rows; /* WEIGHT_ROWS only */
    int deferred;         /* left in the checkpoint (weight_table_defer): not carved, *dst stays NULL */
};

struct weight_table {
    struct weight_spec *specs;
    int n, cap;
    int rc; /* first error of an add, 0 if none */
};

void weight_table_init(struct weight_table *t);
void weight_table_free(struct weight_table *t);

/* The whole tensor fmt... of shape[0..ndim) into *dst. */
void weight_table_add(struct weight_table *t, float **dst, int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A layer's tensors "<prefix><name>" of shape [d0] (d1 == 0) or [d0, d1]. */
struct weight_leaf {
    float **dst;
    const char *name;
    int64_t d0, d1;
};
void weight_table_add_leaves(struct weight_table *t, const char *prefix, const struct weight_leaf *leaves, int n);

/* Rows [row0, row0 + n) of the 2-D tensor `name` of shape [rows, cols] into *dst. */
void weight_table_add_rows(struct weight_table *t, float **dst, int64_t rows, int64_t cols, int64_t row0, int64_t n,
                           const char *name);
/* n floats of arena the caller fills after loading. */
void weight_table_add_space(struct weight_table *t, float **dst, size_t n);
/* A tensor of the component that other code reads (not carved, not unexpected). */
void weight_table_add_elsewhere(struct weight_table *t, const char *name);

/* Leave tensors in the checkpoint for a reader that takes them straight from its
 * bytes (stage 0's GPU upload): they get no arena space and their *dst stays NULL,
 * but their shapes are still checked and they still count as named.
 * weight_table_defer_matrices: every 2-D entry among entries [from, to) (vectors stay
 * on the host). weight_table_defer: the entry that fills *dst and the NULL-dst
 * entries right after it (the rows carved contiguously after it). */
void weight_table_defer_matrices(struct weight_table *t, int from, int to);
void weight_table_defer(struct weight_table *t, float **dst);

/* What a load left in the checkpoint: where (root, component) and the deferred
 * entries in table order. An entry is found by the model field it would have
 * filled, so the model must stay where it was loaded. */
struct weight_deferred {
    char *root, *component;
    struct weight_table table;
};

/* The deferred entries of field dst: the one whose dst is `dst`, then the NULL-dst
 * ones after it; *n receives their count. NULL (and *n = 0) when dst was not deferred. */
const struct weight_spec *weight_deferred_find(const struct weight_deferred *d, float *const *dst, int *n);
/* Whether the load deferred anything. */
int weight_deferred_any(const struct weight_deferred *d);
void weight_deferred_free(struct weight_deferred *d);

/* The whole load of one component: open root/name, describe() reads config.json into
 * the model and fills the table, the table is loaded (weights_load_table) into *arena,
 * the component is closed. The caller finishes (computed tables, re-layouts) and, on
 * error, frees its model. */
typedef int (*weights_describe_fn)(void *model, const struct ckpt_component *c, struct weight_table *t);
int weights_component_load(const char *root, const char *name, void *model, weights_describe_fn describe, float **arena,
                           size_t *arena_floats);
/* The same, for a describe() that defers tensors: *deferred (zeroed first, freed with
 * weight_deferred_free) receives them. weights_component_load refuses deferred entries. */
int weights_component_load_deferred(const char *root, const char *name, void *model, weights_describe_fn describe,
                                    float **arena, size_t *arena_floats, struct weight_deferred *deferred);

/* A size from config.json: an integer in [1, max], else -EINVAL naming the file and key. */
int weights_config_size(const struct ckpt_component *c, const char *key, int max, int *out);

/* Floats the table carves. */
size_t weight_table_floats(const struct weight_table *t);

/* Allocate one arena (*arena, free() it) for the table, set every dst, read every
 * tensor with its shape checked, then check that each tensor of c is named by the
 * table. arena_floats (may be NULL) receives the arena size in floats. On error
 * *arena is NULL and the message names the component, tensor and shapes. */
int weights_load_table(const struct ckpt_component *c, const struct weight_table *t, float **arena,
                       size_t *arena_floats);

#endif
