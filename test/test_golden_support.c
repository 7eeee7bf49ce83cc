/* The c0 candidate-set comparison of the stage-0 golden replay: equal sets pass, a
 * swap of two ids tied at the top-k edge is tolerated, a swap away from the edge only
 * as one allowed flip of a bf16 backend, a set of another size never; a forced draw
 * outside our set is excused only on such a flipped id. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/sampler.h"
#include "stage0/golden.h"

enum { N = 8 };

static int64_t id_of(int col)
{
    return col == 0 ? SAMPLER_STOP_ID : SAMPLER_CODE_OFFSET + col - 1;
}

/* ours: columns `cols` finite with `vals`, the rest -inf. */
static void fill(float *g, const int *cols, const float *vals, int k)
{
    for (int c = 0; c < N; c++) g[c] = -INFINITY;
    for (int i = 0; i < k; i++) g[cols[i]] = vals[i];
}

static void test_same_set(void **state)
{
    (void)state;
    float g[N];
    int cols[3] = {0, 2, 5};
    float v[3] = {4.0f, 3.0f, 1.0f};
    fill(g, cols, v, 3);
    int64_t ids[3] = {id_of(0), id_of(2), id_of(5)};
    int swaps = -1;
    assert_int_equal(golden_support_compare(g, N, ids, v, 3, 1e-4, 0, &swaps), 0);
    assert_int_equal(swaps, 0);
}

static void test_edge_tie_swapped(void **state)
{
    (void)state;
    /* reference {2: 4.0, 5: 3.0, 6: 1.000}, ours {2: 4.0, 5: 3.0, 7: 1.001}: 6 and 7 tie at the edge */
    float ref[3] = {4.0f, 3.0f, 1.000f};
    int64_t ids[3] = {id_of(2), id_of(5), id_of(6)};
    float g[N];
    int cols[3] = {2, 5, 7};
    float v[3] = {4.0f, 3.0f, 1.001f};
    fill(g, cols, v, 3);
    int swaps = 0;
    assert_int_equal(golden_support_compare(g, N, ids, ref, 3, 2e-2, 0, &swaps), 0);
    assert_int_equal(swaps, 1);
    /* the same swap under a float32 tolerance is a difference */
    assert_true(golden_support_compare(g, N, ids, ref, 3, 1e-5, 0, &swaps) > 0);
}

static void test_swap_off_the_edge(void **state)
{
    (void)state;
    /* reference has 5 (logit 3.0, far above its edge 1.0); ours has 7 instead */
    float ref[3] = {4.0f, 3.0f, 1.0f};
    int64_t ids[3] = {id_of(2), id_of(5), id_of(6)};
    float g[N];
    int cols[3] = {2, 7, 6};
    float v[3] = {4.0f, 3.0f, 1.0f};
    fill(g, cols, v, 3);
    int swaps = 0;
    assert_true(golden_support_compare(g, N, ids, ref, 3, 2e-2, 0, &swaps) >= 2);
    /* a bf16 backend allows one such flip (the c0 rule's threshold), not two */
    assert_int_equal(golden_support_compare(g, N, ids, ref, 3, 2e-2, 1, &swaps), 0);
    assert_int_equal(swaps, 1);
    int cols2[3] = {2, 7, 4};
    fill(g, cols2, v, 3);
    assert_true(golden_support_compare(g, N, ids, ref, 3, 2e-2, 1, &swaps) >= 4);
}

static void test_size_differs(void **state)
{
    (void)state;
    float ref[3] = {4.0f, 3.0f, 1.0f};
    int64_t ids[3] = {id_of(2), id_of(5), id_of(6)};
    float g[N];
    int cols[2] = {2, 5};
    float v[2] = {4.0f, 3.0f};
    fill(g, cols, v, 2);
    int swaps = 0;
    assert_true(golden_support_compare(g, N, ids, ref, 3, 2e-2, 1, &swaps) > 0);
}

static void test_forced_draw_on_swapped_id(void **state)
{
    (void)state;
    /* reference {2, 5, 6}, ours {2, 7, 6}: 5 crossed the c0 rule's threshold (a tolerated flip) */
    int64_t ids[3] = {id_of(2), id_of(5), id_of(6)};
    float g[N];
    int cols[3] = {2, 7, 6};
    float v[3] = {4.0f, 3.0f, 1.0f};
    fill(g, cols, v, 3);
    /* the reference drew the flipped id: outside ours, inside its set */
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(5)), 1);
    /* a draw inside our set is no flip; one outside both sets is a real difference */
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(6)), 0);
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(4)), 0);
    /* ids that are not drawable columns */
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, 12), 0);
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(N)), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_set),
        cmocka_unit_test(test_edge_tie_swapped),
        cmocka_unit_test(test_swap_off_the_edge),
        cmocka_unit_test(test_size_differs),
        cmocka_unit_test(test_forced_draw_on_swapped_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
