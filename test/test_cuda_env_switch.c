/* The GPU paths' measuring switches (cuda_env_switch): read from the environment once,
 * then cached; cuda_env_switches_reset makes every switch read so far read the
 * environment again (what mm3-bench-stage0 --env-sets relies on between its sets).
 * Host code only: runs without a GPU, skipped (77) in a build without CUDA. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"

static void test_cached_until_reset(void **state)
{
    (void)state;
    static int a = -1, b = -1;
    assert_int_equal(setenv("MM3_TEST_SWITCH_A", "3", 1), 0);
    assert_int_equal(unsetenv("MM3_TEST_SWITCH_B"), 0);
    assert_int_equal(cuda_env_switch(&a, "MM3_TEST_SWITCH_A", 1), 3);
    assert_int_equal(cuda_env_switch(&b, "MM3_TEST_SWITCH_B", 7), 7); /* unset: the default */

    assert_int_equal(setenv("MM3_TEST_SWITCH_A", "5", 1), 0);
    assert_int_equal(setenv("MM3_TEST_SWITCH_B", "0", 1), 0);
    assert_int_equal(cuda_env_switch(&a, "MM3_TEST_SWITCH_A", 1), 3); /* cached */
    assert_int_equal(cuda_env_switch(&b, "MM3_TEST_SWITCH_B", 7), 7);

    cuda_env_switches_reset();
    assert_int_equal(a, -1);
    assert_int_equal(b, -1);
    assert_int_equal(cuda_env_switch(&a, "MM3_TEST_SWITCH_A", 1), 5);
    assert_int_equal(cuda_env_switch(&b, "MM3_TEST_SWITCH_B", 7), 0);

    /* Not one digit: the default, and a second reset reads again. */
    assert_int_equal(setenv("MM3_TEST_SWITCH_A", "12", 1), 0);
    cuda_env_switches_reset();
    assert_int_equal(cuda_env_switch(&a, "MM3_TEST_SWITCH_A", 1), 1);
    assert_int_equal(unsetenv("MM3_TEST_SWITCH_A"), 0);
    assert_int_equal(unsetenv("MM3_TEST_SWITCH_B"), 0);
}

/* A slot a tuning hook set (not -1) is forgotten by the reset too. */
static void test_reset_forgets_hook_values(void **state)
{
    (void)state;
    static int c = -1;
    assert_int_equal(setenv("MM3_TEST_SWITCH_C", "2", 1), 0);
    assert_int_equal(cuda_env_switch(&c, "MM3_TEST_SWITCH_C", 0), 2);
    c = 4; /* as cuda_ops_gemv_set_mma_tiles stores into its slot */
    assert_int_equal(cuda_env_switch(&c, "MM3_TEST_SWITCH_C", 0), 4);
    cuda_env_switches_reset();
    assert_int_equal(cuda_env_switch(&c, "MM3_TEST_SWITCH_C", 0), 2);
    assert_int_equal(unsetenv("MM3_TEST_SWITCH_C"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_until_reset),
        cmocka_unit_test(test_reset_forgets_hook_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("built without CUDA: skipped\n");
    return 77;
}
#endif
