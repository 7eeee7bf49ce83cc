/* stage1/capacity.h: the batch cost fitted over the batch sizes stage 1 ran, and the
 * streams it keeps fed with the batches it would run for them. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "stage1/capacity.h"

#define NEAR(a, b, tol) assert_true(fabs((a) - (b)) < (tol))

static void windows(struct s1_capacity *c, int n, double extra_s, double audio_s)
{
    for (int i = 0; i < n; i++)
        s1_capacity_window(c, extra_s, audio_s);
}

static void test_unknown(void **state)
{
    (void)state;
    struct s1_capacity c;
    s1_capacity_init(&c, 8);
    double a, b;
    assert_int_equal(s1_capacity_fit(&c, &a, &b), -1);
    assert_true(s1_capacity_streams(&c) < 0);
    s1_capacity_batch(&c, 1, 0.68); /* a batch but no window finished yet */
    assert_true(s1_capacity_streams(&c) < 0);
    struct s1_capacity d;
    s1_capacity_init(&d, 8);
    windows(&d, 3, 0, 4.0); /* windows but no batch */
    assert_true(s1_capacity_streams(&d) < 0);
    s1_capacity_batch(&d, 0, 1.0); /* nonsense is ignored */
    s1_capacity_batch(&d, 2, -1.0);
    s1_capacity_batch(&d, 2, NAN);
    s1_capacity_batch(&d, 2, INFINITY);
    s1_capacity_window(&d, -1, 4);
    s1_capacity_window(&d, 0, 0);
    assert_true(s1_capacity_streams(&d) < 0);
}

/* Batches of 1..3 windows costing 0.22 + 0.45 n (what a lightly loaded GPU stage 1 runs):
 * the fit finds both terms, and with 4 s windows a batch of 8 (3.82 s) fits, a ninth
 * stream opens a second batch (4.49 s): 8.27 streams, where the cost per window of the
 * batches run (0.6 s per 4 s) would say 6.6. */
static void test_fit_predicts_full_batches(void **state)
{
    (void)state;
    struct s1_capacity c;
    s1_capacity_init(&c, 8);
    for (int i = 0; i < 60; i++)
        s1_capacity_batch(&c, 1 + i % 3, 0.22 + 0.45 * (1 + i % 3));
    windows(&c, 40, 0, 4.0);
    double a, b;
    assert_int_equal(s1_capacity_fit(&c, &a, &b), 0);
    NEAR(a, 0.22, 1e-9);
    NEAR(b, 0.45, 1e-9);
    NEAR(s1_capacity_streams(&c), 8 + (4.0 - 3.82) / (4.49 - 3.82), 1e-9);
}

/* Past one batch the fixed cost comes again: with batches of at most 4, costing 1 + 0.25 n,
 * 4 streams need 2 s per 4 s window, the fifth opens a second batch (3.25 s), the sixth
 * (3.5 s), the seventh (3.75 s), the eighth (4.0 s) fills it: 8 streams exactly. With 0.1 s
 * of work per window outside the batch, 5 fit (3.75 s) and part of a sixth (4.1 s). */
static void test_batches_of_batches(void **state)
{
    (void)state;
    struct s1_capacity c;
    s1_capacity_init(&c, 4);
    for (int n = 1; n <= 4; n++)
        s1_capacity_batch(&c, n, 1 + 0.25 * n);
    windows(&c, 10, 0, 4.0);
    NEAR(s1_capacity_streams(&c), 8.0, 1e-9);
    struct s1_capacity e;
    s1_capacity_init(&e, 4);
    for (int n = 1; n <= 4; n++)
        s1_capacity_batch(&e, n, 1 + 0.25 * n);
    windows(&e, 10, 0.1, 4.0);
    NEAR(s1_capacity_streams(&e), 5 + (4.0 - 3.75) / 0.35, 1e-9);
    /* slower than real time: one window costs more than its audio */
    struct s1_capacity slow;
    s1_capacity_init(&slow, 8);
    s1_capacity_batch(&slow, 1, 8.0);
    windows(&slow, 1, 0, 4.0);
    NEAR(s1_capacity_streams(&slow), 0.5, 1e-9);
}

/* One batch size seen: no slope, every second counted per window (never an
 * overestimate); larger batches no dearer: the mean batch cost, any size; a fit with a
 * negative fixed cost: proportional. */
static void test_degenerate_fits(void **state)
{
    (void)state;
    struct s1_capacity c;
    s1_capacity_init(&c, 8);
    for (int i = 0; i < 10; i++)
        s1_capacity_batch(&c, 2, 1.0);
    windows(&c, 5, 0, 4.0);
    double a, b;
    assert_int_equal(s1_capacity_fit(&c, &a, &b), 0);
    NEAR(a, 0, 1e-12);
    NEAR(b, 0.5, 1e-9);
    NEAR(s1_capacity_streams(&c), 8.0, 1e-9);

    struct s1_capacity flat;
    s1_capacity_init(&flat, 8);
    s1_capacity_batch(&flat, 1, 2.0);
    s1_capacity_batch(&flat, 8, 1.9);
    assert_int_equal(s1_capacity_fit(&flat, &a, &b), 0);
    NEAR(b, 0, 1e-12);
    NEAR(a, (CAPACITY_DECAY * 2.0 + 1.9) / (CAPACITY_DECAY + 1), 1e-9); /* the newer weighs more */

    struct s1_capacity prop;
    s1_capacity_init(&prop, 8);
    s1_capacity_batch(&prop, 1, 0.1);
    s1_capacity_batch(&prop, 2, 1.0);
    assert_int_equal(s1_capacity_fit(&prop, &a, &b), 0);
    NEAR(a, 0, 1e-12);
    NEAR(b, (CAPACITY_DECAY * 0.1 + 1.0) / (CAPACITY_DECAY + 2), 1e-9);
}

/* The sums decay: a GPU that became twice as fast shows within a few hundred batches. */
static void test_follows_change(void **state)
{
    (void)state;
    struct s1_capacity c;
    s1_capacity_init(&c, 8);
    for (int i = 0; i < 300; i++) {
        s1_capacity_batch(&c, 1 + i % 8, 0.4 * (1 + i % 8));
        s1_capacity_window(&c, 0, 4.0);
    }
    NEAR(s1_capacity_streams(&c), 10.0, 1e-6);
    for (int i = 0; i < 600; i++) {
        s1_capacity_batch(&c, 1 + i % 8, 0.2 * (1 + i % 8));
        s1_capacity_window(&c, 0, 4.0);
    }
    NEAR(s1_capacity_streams(&c), 20.0, 0.01);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown),           cmocka_unit_test(test_fit_predicts_full_batches),
        cmocka_unit_test(test_batches_of_batches), cmocka_unit_test(test_degenerate_fits),
        cmocka_unit_test(test_follows_change),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
