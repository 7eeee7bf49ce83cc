/* safetensors parser: golden checkpoint files read, a written file reads back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/safetensors.h"
#include "support/test_support.h"

static void test_roundtrip(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("st");
    char path[512];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {mm3_f32_to_bf16(1.5f), mm3_f32_to_bf16(-2.0f), mm3_f32_to_bf16(0.25f)};
    struct st_writer_tensor w[2] = {
        {"a", MM3_DTYPE_F32, 2, {2, 3}, a},
        {"b", MM3_DTYPE_BF16, 1, {3}, b},
    };
    assert_int_equal(st_write_file(path, w, 2, "{\"format\":\"pt\"}"), 0);
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    assert_int_equal(f.n_tensors, 2);
    float got[6];
    int64_t want[2] = {2, 3};
    assert_int_equal(st_file_read_f32(&f, "a", got, 2, want), 0);
    for (int i = 0; i < 6; i++) assert_true(got[i] == a[i]);
    assert_int_equal(st_file_read_f32(&f, "b", got, -1, NULL), 0);
    assert_true(got[0] == 1.5f && got[1] == -2.0f && got[2] == 0.25f);
    assert_true(st_file_read_f32(&f, "a", got, 1, want) < 0); /* wrong rank */
    st_file_close(&f);
    test_remove_tree(dir);
    free(dir);
}

/* e4m3 (the fp8 GEMM operands): every code decodes and re-encodes to itself, ties go
 * to the even code, values past 448 saturate, and nothing is further than half a step. */
static void test_e4m3(void **state)
{
    (void)state;
    assert_true(mm3_e4m3_to_f32(0x38) == 1.0f);
    assert_true(mm3_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(mm3_e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    assert_true(mm3_e4m3_to_f32(0x08) == ldexpf(1.0f, -6));
    assert_true(mm3_e4m3_to_f32(0xc0) == -2.0f);
    assert_true(isnan(mm3_e4m3_to_f32(0x7f)) && isnan(mm3_e4m3_to_f32(0xff)));
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        float v = mm3_e4m3_to_f32((uint8_t)b);
        if (mm3_f32_to_e4m3(v) != b) fail_msg("code 0x%02x (%g) re-encodes to 0x%02x", b, v, mm3_f32_to_e4m3(v));
        if ((b & 0x7f) == 0x7e) continue;
        /* the midpoint to the next code rounds to the even one of the two; just above it, up */
        float next = mm3_e4m3_to_f32((uint8_t)(b + 1)), mid = 0.5f * (v + next);
        int even = (b & 1) ? b + 1 : b;
        if (mm3_f32_to_e4m3(mid) != even) fail_msg("midpoint %g after 0x%02x: 0x%02x", mid, b, mm3_f32_to_e4m3(mid));
        float past = nextafterf(mid, copysignf(INFINITY, mid));
        if (mm3_f32_to_e4m3(past) != b + 1)
            fail_msg("%g, past the midpoint after 0x%02x: 0x%02x", past, b, mm3_f32_to_e4m3(past));
    }
    assert_int_equal(mm3_f32_to_e4m3(0.0f), 0x00);
    assert_int_equal(mm3_f32_to_e4m3(-0.0f), 0x80);
    assert_int_equal(mm3_f32_to_e4m3(464.0f), 0x7e); /* saturates instead of rounding to 480 */
    assert_int_equal(mm3_f32_to_e4m3(1e30f), 0x7e);
    assert_int_equal(mm3_f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(mm3_f32_to_e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(mm3_f32_to_e4m3(ldexpf(1.0f, -11)), 0x00); /* a quarter step: zero */
    assert_int_equal(mm3_f32_to_e4m3(ldexpf(3.0f, -11)), 0x01); /* three quarters of a step: one */
    assert_int_equal(mm3_f32_to_e4m3(ldexpf(3.0f, -10)), 0x02); /* a step and a half: the even two */
    /* normal range: within 2^-4 relative (half of a 3-bit mantissa step) */
    for (int i = 0; i < 100000; i++) {
        float v = ldexpf(1.0f + (float)i / 100000.0f, i % 14 - 6);
        float q = mm3_e4m3_to_f32(mm3_f32_to_e4m3(v));
        if (!(fabsf(q - v) <= ldexpf(v, -4))) fail_msg("%g -> %g", v, q);
    }
}

/* F16 and I64 widen by value; an empty tensor is legal; load_f32 reports the shape. */
static void test_dtypes_and_load(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("st2");
    char path[512];
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    uint16_t h[2] = {mm3_f32_to_f16(0.5f), mm3_f32_to_f16(-3.0f)};
    int64_t ids[3] = {151644, -1, 7};
    struct st_writer_tensor w[3] = {
        {"half", MM3_DTYPE_F16, 2, {1, 2}, h},
        {"ids", MM3_DTYPE_I64, 1, {3}, ids},
        {"empty", MM3_DTYPE_F32, 2, {0, 4}, NULL},
    };
    assert_int_equal(st_write_file(path, w, 3, NULL), 0);
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    assert_int_equal(f.n_tensors, 3);
    float *v;
    int nd;
    int64_t shape[ST_MAX_DIMS];
    assert_int_equal(st_file_load_f32(&f, "half", &v, &nd, shape), 0);
    assert_int_equal(nd, 2);
    assert_int_equal(shape[1], 2);
    assert_true(v[0] == 0.5f && v[1] == -3.0f);
    free(v);
    assert_int_equal(st_file_load_f32(&f, "ids", &v, &nd, shape), 0);
    assert_true(v[0] == 151644.0f && v[1] == -1.0f && v[2] == 7.0f);
    free(v);
    const struct st_tensor *e = st_file_find(&f, "empty");
    assert_non_null(e);
    assert_int_equal(e->nbytes, 0);
    assert_int_equal(st_tensor_numel(e), 0);
    assert_true(st_file_load_f32(&f, "absent", &v, &nd, shape) < 0);
    assert_null(v);
    char buf[64];
    assert_string_equal(st_shape_str(buf, sizeof buf, 3, (int64_t[]){2, 0, 5}), "[2, 0, 5]");
    st_file_close(&f);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_dtypes_and_load),
        cmocka_unit_test(test_e4m3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
