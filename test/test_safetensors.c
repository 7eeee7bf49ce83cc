/* safetensors parser: golden checkpoint files read, a written file reads back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
