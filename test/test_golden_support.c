/* The c0 candidate-set comparison of the stage-0 golden replay: equal sets pass, a
 * swap of two ids tied at the top-k edge is tolerated, a swap away from the edge only
 * as one allowed flip of a bf16 backend, a set of another size never; a forced draw
 * outside our set is excused only on such a flipped id. Forced draws outside our set
 * (flips) are counted: one within the float error of the conditional top-k edge passes,
 * more than max(1, 1% of the c0 draws) or one off the edge fails the case. */
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

/* A conditional row 10.0, 9.9, ..., 4.1 (60 columns): the 50th largest is 5.1. */
static void fill_row(float *row, int n)
{
    for (int i = 0; i < n; i++)
        row[i] = 10.0f - 0.1f * (float)i;
}

static void test_c0_edge_margin(void **state)
{
    (void)state;
    float row[60];
    fill_row(row, 60);
    double edge, margin, scale;
    golden_c0_edge(row, 60, 50, 50, &edge, &margin, &scale);
    assert_float_equal(edge, 5.1, 1e-5);
    assert_float_equal(margin, 0.1, 1e-5); /* column 50 holds 5.0 */
    double sq = 0;
    for (int i = 0; i < 50; i++)
        sq += (double)row[i] * row[i];
    assert_float_equal(scale, sqrt(sq / 50), 1e-5);
    /* a column inside the top 50 is above the edge: a negative margin, never an edge flip */
    golden_c0_edge(row, 60, 50, 3, &edge, &margin, &scale);
    assert_true(margin < 0);
    assert_false(golden_flip_is_edge(margin, scale, 2e-2));
    /* unsorted input and a NaN (ranked lowest) give the same edge */
    float shuffled[60];
    for (int i = 0; i < 60; i++)
        shuffled[i] = row[(i * 7) % 60];
    shuffled[59] = NAN; /* replaces row[(59 * 7) % 60] = row[53], below the edge */
    golden_c0_edge(shuffled, 60, 50, 0, &edge, &margin, &scale);
    assert_float_equal(edge, 5.1, 1e-5);
    /* out-of-range column: NaN figures, not an edge flip */
    golden_c0_edge(row, 60, 50, 60, &edge, &margin, &scale);
    assert_true(isnan(margin));
    assert_false(golden_flip_is_edge(margin, scale, 2e-2));
}

static void test_edge_flip_within_float_error(void **state)
{
    (void)state;
    float row[60];
    fill_row(row, 60);
    double edge, margin, scale;
    golden_c0_edge(row, 60, 50, 50, &edge, &margin, &scale);
    /* 0.1 below the edge against the top logits' RMS ~7.7: within a bf16-like 2e-2 x RMS
     * (0.15), not within float32's 1e-4 x RMS, nor 0.5 below it */
    assert_true(golden_flip_is_edge(margin, scale, 2e-2));
    assert_false(golden_flip_is_edge(margin, scale, 1e-4));
    golden_c0_edge(row, 60, 50, 55, &edge, &margin, &scale);
    assert_false(golden_flip_is_edge(margin, scale, 2e-2));
}

static void test_flips_counted_and_bounded(void **state)
{
    (void)state;
    assert_int_equal(golden_flip_budget(0), 1);
    assert_int_equal(golden_flip_budget(250), 2);
    assert_int_equal(golden_flip_budget(1000), 10);
    /* no flip; one edge flip among 250 draws: counted, not failed */
    assert_true(golden_flips_pass(0, 0, 250));
    assert_true(golden_flips_pass(1, 1, 250));
    assert_true(golden_flips_pass(2, 2, 250));
    /* more edge flips than the bound fail */
    assert_false(golden_flips_pass(3, 3, 250));
    assert_false(golden_flips_pass(2, 2, 100));
    /* a draw outside the set that is not an edge flip (far from the edge, or a depth
     * draw) fails even alone */
    assert_false(golden_flips_pass(1, 0, 250));
    assert_false(golden_flips_pass(2, 1, 250));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_set),
        cmocka_unit_test(test_edge_tie_swapped),
        cmocka_unit_test(test_swap_off_the_edge),
        cmocka_unit_test(test_size_differs),
        cmocka_unit_test(test_forced_draw_on_swapped_id),
        cmocka_unit_test(test_c0_edge_margin),
        cmocka_unit_test(test_edge_flip_within_float_error),
        cmocka_unit_test(test_flips_counted_and_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
