/* Weight tables (common/weights.h): carving in table order, values read and widened,
 * row ranges from disk and from a loaded arena, shape mismatches, missing and
 * unexpected tensors, build errors reported at load, and deferred tensors (left in
 * the checkpoint, read later as bf16 rows by ckpt_read_rows_bf16). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checkpoint.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "common/weights.h"
#include "support/test_support.h"

struct fixture {
    char *dir;
    struct ckpt_component c;
    float a[6];        /* "a" [2, 3] f32 */
    float b[4];        /* "b" [4] bf16 (values exact in bf16) */
    float rows[5 * 2]; /* "rows" [5, 2] f32 */
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    f->dir = test_make_tmpdir("weights");
    char path[4200];
    snprintf(path, sizeof path, "%s/comp", f->dir);
    if (mkdir(path, 0755) < 0) return -1;
    snprintf(path, sizeof path, "%s/comp/config.json", f->dir);
    FILE *cf = fopen(path, "w");
    if (!cf) return -1;
    fputs("{\"hidden_size\": 3}\n", cf);
    fclose(cf);
    uint16_t b16[4];
    for (int i = 0; i < 6; i++)
        f->a[i] = 0.25f * (float)i - 1.0f;
    for (int i = 0; i < 4; i++) {
        f->b[i] = (float)(i + 1) * 1.5f;
        b16[i] = mm3_f32_to_bf16(f->b[i]);
    }
    for (int i = 0; i < 10; i++)
        f->rows[i] = 10.0f + (float)i;
    struct st_writer_tensor t[] = {
        {"a", MM3_DTYPE_F32, 2, {2, 3}, f->a},
        {"b", MM3_DTYPE_BF16, 1, {4}, b16},
        {"rows", MM3_DTYPE_F32, 2, {5, 2}, f->rows},
    };
    snprintf(path, sizeof path, "%s/comp/model.safetensors", f->dir);
    if (st_write_file(path, t, 3, NULL) < 0) return -1;
    if (ckpt_component_open(&f->c, f->dir, "comp") < 0) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    ckpt_component_close(&f->c);
    test_remove_tree(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

/* Every tensor named: a, b, rows [1, 4) of "rows", then 2 floats of space. */
static void full_table(struct weight_table *t, float **pa, float **pb, float **pr, float **ps)
{
    weight_table_init(t);
    weight_table_add(t, pa, 2, (int64_t[]){2, 3}, "%s", "a");
    weight_table_add(t, pb, 1, (int64_t[]){4}, "b");
    weight_table_add_rows(t, pr, 5, 2, 1, 3, "rows");
    weight_table_add_space(t, ps, 2);
}

static void check_full(const struct fixture *f, float *arena, float *pa, float *pb, float *pr, float *ps)
{
    assert_ptr_equal(pa, arena);
    assert_ptr_equal(pb, arena + 6);
    assert_ptr_equal(pr, arena + 10);
    assert_ptr_equal(ps, arena + 16);
    assert_memory_equal(pa, f->a, sizeof f->a);
    assert_memory_equal(pb, f->b, sizeof f->b);
    assert_memory_equal(pr, f->rows + 2, sizeof(float) * 6);
}

static void test_load_from_disk(void **state)
{
    struct fixture *f = *state;
    struct weight_table t;
    float *pa = NULL, *pb = NULL, *pr = NULL, *ps = NULL, *arena = NULL;
    size_t n = 0;
    full_table(&t, &pa, &pb, &pr, &ps);
    assert_int_equal(weight_table_floats(&t), 18);
    assert_int_equal(weights_load_table(&f->c, &t, &arena, &n), 0);
    assert_int_equal(n, 18);
    check_full(f, arena, pa, pb, pr, ps);
    weight_table_free(&t);
    free(arena);
}

static void test_load_from_arena(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(ckpt_component_load(&f->c), 0);
    struct weight_table t;
    float *pa = NULL, *pb = NULL, *pr = NULL, *ps = NULL, *arena = NULL;
    full_table(&t, &pa, &pb, &pr, &ps);
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), 0);
    check_full(f, arena, pa, pb, pr, ps);
    weight_table_free(&t);
    free(arena);
    ckpt_component_unload(&f->c);
}

static void test_shape_mismatch(void **state)
{
    struct fixture *f = *state;
    struct weight_table t;
    float *pa, *arena = (float *)&t;
    weight_table_init(&t);
    weight_table_add(&t, &pa, 2, (int64_t[]){3, 2}, "a");
    weight_table_add_elsewhere(&t, "b");
    weight_table_add_elsewhere(&t, "rows");
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -EINVAL);
    assert_null(arena);
    const char *msg = mm3_last_error();
    assert_non_null(strstr(msg, "comp"));
    assert_non_null(strstr(msg, "'a'"));
    assert_non_null(strstr(msg, "[2, 3]"));
    assert_non_null(strstr(msg, "[3, 2]"));
    weight_table_free(&t);
    /* rows of a tensor whose width differs from the config's */
    weight_table_init(&t);
    weight_table_add_rows(&t, &pa, 5, 3, 0, 1, "rows");
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "'rows'"));
    weight_table_free(&t);
}

static void test_unexpected_and_missing(void **state)
{
    struct fixture *f = *state;
    struct weight_table t;
    float *pa, *pr, *arena;
    weight_table_init(&t);
    weight_table_add(&t, &pa, 2, (int64_t[]){2, 3}, "a");
    weight_table_add_rows(&t, &pr, 5, 2, 0, 5, "rows");
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -EINVAL);
    assert_null(arena);
    assert_non_null(strstr(mm3_last_error(), "unexpected tensor 'b'"));
    /* read by other code: not unexpected, and no space */
    weight_table_add_elsewhere(&t, "b");
    assert_int_equal(weight_table_floats(&t), 16);
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), 0);
    assert_memory_equal(pr, f->rows, sizeof f->rows);
    free(arena);
    /* a tensor the table names but the file lacks */
    weight_table_add(&t, &pa, 1, (int64_t[]){1}, "layers.%d.w", 7);
    assert_true(weights_load_table(&f->c, &t, &arena, NULL) < 0);
    assert_null(arena);
    assert_non_null(strstr(mm3_last_error(), "layers.7.w"));
    weight_table_free(&t);
}

static void test_build_errors(void **state)
{
    struct fixture *f = *state;
    struct weight_table t;
    float *p, *arena;
    weight_table_init(&t);
    weight_table_add_rows(&t, &p, 5, 2, 4, 2, "rows");
    weight_table_add(&t, &p, 2, (int64_t[]){2, 3}, "a"); /* later adds do not hide the first error */
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "rows [4, 6) outside [0, 5)"));
    weight_table_free(&t);
    char long_name[WEIGHT_NAME_MAX + 8];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    weight_table_init(&t);
    weight_table_add(&t, &p, 1, (int64_t[]){1}, "%s", long_name);
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -ENAMETOOLONG);
    weight_table_free(&t);
    weight_table_init(&t);
    weight_table_add(&t, &p, WEIGHT_MAX_DIMS + 1, (int64_t[]){1, 1, 1, 1, 1}, "a");
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -EINVAL);
    weight_table_free(&t);
}

/* a, b, rows [1, 4) then [4, 5) of "rows" (one field, carved contiguously). */
static void split_table(struct weight_table *t, float **pa, float **pb, float **pr)
{
    weight_table_init(t);
    weight_table_add(t, pa, 2, (int64_t[]){2, 3}, "a");
    weight_table_add(t, pb, 1, (int64_t[]){4}, "b");
    weight_table_add_rows(t, pr, 5, 2, 1, 3, "rows");
    weight_table_add_rows(t, NULL, 5, 2, 4, 1, "rows");
}

struct defer_model {
    float *a, *b, *r;
    int defer;
};

static int defer_describe(void *model, const struct ckpt_component *c, struct weight_table *t)
{
    (void)c;
    struct defer_model *m = model;
    split_table(t, &m->a, &m->b, &m->r);
    if (m->defer) weight_table_defer_matrices(t, 0, t->n);
    return 0;
}

/* Deferred entries: no space, dst NULL, still named and shape-checked, found by
 * their field; their rows read as bf16 straight from the file. */
static void test_deferred(void **state)
{
    struct fixture *f = *state;
    struct defer_model m = {.defer = 1};
    struct weight_deferred d;
    float *arena;
    size_t n;
    m.a = m.r = (float *)&m; /* must be reset to NULL */
    assert_int_equal(weights_component_load_deferred(f->dir, "comp", &m, defer_describe, &arena, &n, &d), 0);
    assert_int_equal(n, 4); /* only the vector b */
    assert_null(m.a);
    assert_null(m.r);
    assert_ptr_equal(m.b, arena);
    assert_memory_equal(m.b, f->b, sizeof f->b);
    assert_true(weight_deferred_any(&d));
    assert_string_equal(d.component, "comp");
    int k;
    const struct weight_spec *s = weight_deferred_find(&d, &m.r, &k);
    assert_non_null(s);
    assert_int_equal(k, 2);
    assert_int_equal(s[0].row0, 1);
    assert_int_equal(s[1].row0, 4);
    assert_non_null(weight_deferred_find(&d, &m.a, &k));
    assert_int_equal(k, 1);
    assert_null(weight_deferred_find(&d, &m.b, &k));
    assert_int_equal(k, 0);
    /* the rows as bf16: rounded from the file's float32 */
    uint16_t got[8], want[8];
    assert_int_equal(ckpt_read_rows_bf16(&f->c, "rows", 1, 4, got), 0);
    for (int i = 0; i < 8; i++)
        want[i] = mm3_f32_to_bf16(f->rows[2 + i]);
    assert_memory_equal(got, want, sizeof want);
    /* bf16 on disk: the stored bits */
    assert_int_equal(ckpt_read_rows_bf16(&f->c, "b", 1, 2, got), 0);
    assert_int_equal(got[0], mm3_f32_to_bf16(f->b[1]));
    assert_int_equal(got[1], mm3_f32_to_bf16(f->b[2]));
    assert_int_equal(ckpt_read_rows_bf16(&f->c, "rows", 3, 3, got), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "rows [3, 6) of 'rows' outside its 5 rows"));
    assert_int_equal(ckpt_read_rows_bf16(&f->c, "nope", 0, 1, got), -ENOENT);
    free(arena);
    weight_deferred_free(&d);
    /* a load that keeps no deferred tensors refuses to lose them */
    assert_int_equal(weights_component_load(f->dir, "comp", &m, defer_describe, &arena, NULL), -EINVAL);
    assert_null(arena);
    assert_non_null(strstr(mm3_last_error(), "deferred"));
    /* without deferral every matrix is carved */
    m.defer = 0;
    assert_int_equal(weights_component_load_deferred(f->dir, "comp", &m, defer_describe, &arena, &n, &d), 0);
    assert_int_equal(n, 6 + 4 + 8);
    assert_false(weight_deferred_any(&d));
    assert_memory_equal(m.r, f->rows + 2, sizeof(float) * 8);
    free(arena);
    weight_deferred_free(&d);
}

static void test_deferred_checks(void **state)
{
    struct fixture *f = *state;
    struct weight_table t;
    float *pa, *pb, *pr, *arena;
    /* a deferred tensor's shape is still checked */
    weight_table_init(&t);
    weight_table_add(&t, &pa, 2, (int64_t[]){3, 2}, "a");
    weight_table_add_elsewhere(&t, "b");
    weight_table_add_elsewhere(&t, "rows");
    weight_table_defer(&t, &pa);
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "[3, 2]"));
    weight_table_free(&t);
    /* weight_table_defer takes the field's continuation rows along */
    split_table(&t, &pa, &pb, &pr);
    weight_table_defer(&t, &pr);
    assert_false(t.specs[0].deferred);
    assert_false(t.specs[1].deferred);
    assert_true(t.specs[2].deferred && t.specs[3].deferred);
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), 0);
    assert_null(pr);
    assert_memory_equal(pa, f->a, sizeof f->a);
    free(arena);
    /* continuation rows deferred without the rows they continue */
    t.specs[2].deferred = 0;
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "continues"));
    /* a field no entry fills */
    float *other;
    weight_table_defer(&t, &other);
    assert_int_equal(weights_load_table(&f->c, &t, &arena, NULL), -EINVAL);
    weight_table_free(&t);
}

/* Rows read as bf16 from wider tensors: f16, and a float32 tensor of more than one of the
 * converter's 1M-element slices (rows that straddle a slice boundary), each element the
 * bf16 rounding of the stored value. */
static void test_rows_bf16_from_wider(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("weights_wide"), path[4200];
    snprintf(path, sizeof path, "%s/wide", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/wide/config.json", dir);
    FILE *cf = fopen(path, "w");
    assert_non_null(cf);
    fputs("{}\n", cf);
    fclose(cf);
    enum { H_ROWS = 3, H_COLS = 5, B_COLS = 64, B_ROWS = (1 << 20) / B_COLS + 3 };
    uint16_t h[H_ROWS * H_COLS];
    for (int i = 0; i < H_ROWS * H_COLS; i++)
        h[i] = mm3_f32_to_f16(0.3f * (float)i - 2.0f);
    float *big = malloc(sizeof(float) * B_ROWS * B_COLS);
    assert_non_null(big);
    for (int i = 0; i < B_ROWS * B_COLS; i++)
        big[i] = 1.0f + (float)(i % 9973) * 1.1e-4f; /* rounding to bf16 changes most of them */
    struct st_writer_tensor t[] = {
        {"h", MM3_DTYPE_F16, 2, {H_ROWS, H_COLS}, h},
        {"big", MM3_DTYPE_F32, 2, {B_ROWS, B_COLS}, big},
    };
    snprintf(path, sizeof path, "%s/wide/model.safetensors", dir);
    assert_int_equal(st_write_file(path, t, 2, NULL), 0);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, dir, "wide"), 0);

    uint16_t got_h[2 * H_COLS];
    assert_int_equal(ckpt_read_rows_bf16(&c, "h", 1, 2, got_h), 0);
    for (int i = 0; i < 2 * H_COLS; i++)
        assert_int_equal(got_h[i], mm3_f32_to_bf16(mm3_f16_to_f32(h[H_COLS + i])));

    const int64_t row0 = 1, n = B_ROWS - 2; /* from row 1: the slices start mid-row */
    uint16_t *got = malloc(sizeof(uint16_t) * n * B_COLS);
    assert_non_null(got);
    assert_int_equal(ckpt_read_rows_bf16(&c, "big", row0, n, got), 0);
    for (int64_t i = 0; i < n * B_COLS; i++)
        if (got[i] != mm3_f32_to_bf16(big[row0 * B_COLS + i])) fail_msg("element %lld of the rows read as bf16", (long long)i);
    free(got);
    free(big);
    ckpt_component_close(&c);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_from_disk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_from_arena, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shape_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unexpected_and_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_build_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred_checks, setup, teardown),
        cmocka_unit_test(test_rows_bf16_from_wider),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
