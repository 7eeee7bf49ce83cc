/* The GPU paths' measuring switches (cuda_env_switch: MM3_PDL, MM3_GRAPH_TIMING): read
 * from the environment once, then cached; cuda_env_switches_reset makes every switch read
 * so far read the environment again (what mm3-bench-stage0 --env-sets relies on between
 * its sets). The kernels' tuning hooks are set in code only: they check their values and
 * no reset touches them. Host code only: runs without a GPU, skipped (77) in a build
 * without CUDA. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "common/error.h"

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

/* Every tuning hook takes its documented values and refuses others with -EINVAL and a
 * message naming it. */
static void test_tuning_hooks_check_values(void **state)
{
    (void)state;
    assert_int_equal(cuda_ops_gemv_set_mma_tiles(3), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "cuda_ops_gemv_set_mma_tiles"));
    assert_int_equal(cuda_ops_gemv_set_mma_ring(3), -EINVAL);
    assert_int_equal(cuda_ops_gemv_set_xs(-1), -EINVAL);
    assert_int_equal(cuda_ops_gemv_set_x_round(3), -EINVAL);
    assert_int_equal(cuda_ops_gemv_set_mma_rows(1), -EINVAL);
    assert_int_equal(cuda_ops_gemv_set_mma_wide(-2), -EINVAL);
    assert_int_equal(cuda_ops_attention_set_combine(3), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "cuda_ops_attention_set_combine"));
    assert_int_equal(cuda_ops_gemv_set_mma_tiles(4), 0);
    assert_int_equal(cuda_ops_gemv_set_mma_ring(2), 0);
    assert_int_equal(cuda_ops_gemv_set_xs(2), 0);
    assert_int_equal(cuda_ops_gemv_set_x_round(1), 0);
    assert_int_equal(cuda_ops_gemv_set_mma_rows(4), 0);
    assert_int_equal(cuda_ops_gemv_set_mma_wide(0), 0);
    assert_int_equal(cuda_ops_attention_set_combine(2), 0);
    /* back to the defaults */
    assert_int_equal(cuda_ops_gemv_set_mma_tiles(0), 0);
    assert_int_equal(cuda_ops_gemv_set_mma_ring(0), 0);
    assert_int_equal(cuda_ops_gemv_set_xs(0), 0);
    assert_int_equal(cuda_ops_gemv_set_x_round(0), 0);
    assert_int_equal(cuda_ops_gemv_set_mma_rows(0), 0);
    assert_int_equal(cuda_ops_gemv_set_mma_wide(-1), 0);
    assert_int_equal(cuda_ops_attention_set_combine(0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cached_until_reset),
        cmocka_unit_test(test_tuning_hooks_check_values),
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
