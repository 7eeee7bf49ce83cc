/* stage0/admission.h and stage0/playback.h on a fake clock: the real-time capacity from
 * stage 1's work per audio second, which streams it admits, the start estimate of a held
 * stream, and the stalls of a listener playing at 1x. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "stage0/admission.h"
#include "stage0/playback.h"

#define NEAR(a, b) assert_true(fabs((a) - (b)) < 1e-9)

static void test_unknown_admits(void **state)
{
    (void)state;
    struct admission a = {0};
    assert_true(admission_capacity(&a) < 0);
    assert_true(admission_work_per_audio(&a) == 0);
    assert_true(admission_allows(&a, 0)); /* nothing measured yet: one stream at a time */
    assert_false(admission_allows(&a, 1));
    double left[2] = {10, 20};
    assert_true(admission_start_estimate(&a, left, 2, 1) < 0);
    /* nonsense is ignored */
    admission_observe(&a, -1, 4);
    admission_observe(&a, 1, 0);
    admission_observe(&a, NAN, 4);
    admission_observe(&a, 1, INFINITY);
    assert_true(admission_capacity(&a) < 0);
}

/* The figure: 16 streams at 5.22 audio s/s is w = 1 / 5.22 s of work per audio
 * second: 5.22 streams at full use, 4 admitted with the headroom. */
static void test_capacity_from_work(void **state)
{
    (void)state;
    struct admission a = {0};
    for (int i = 0; i < 50; i++)
        admission_observe(&a, 4.0 / 5.22, 4.0); /* 4-second windows */
    NEAR(admission_work_per_audio(&a), 1 / 5.22);
    NEAR(admission_capacity(&a), 5.22);
    assert_true(admission_allows(&a, 0));
    /* 5.22 x ADMISSION_UTILIZATION (0.85) = 4.4: the headroom keeps a fifth out */
    assert_true(admission_allows(&a, 3));  /* the fourth fits */
    assert_false(admission_allows(&a, 4)); /* a fifth would leave no room for a batch's wait */
    /* one stream alone at RTF 0.37: 2 streams */
    struct admission b = {0};
    admission_observe(&b, 0.37 * 8, 8);
    NEAR(admission_capacity(&b), 1 / 0.37);
    assert_true(admission_allows(&b, 1));
    assert_false(admission_allows(&b, 2));
    /* slower than real time: one stream at a time (it stalls, but the server serves) */
    struct admission c = {0};
    admission_observe(&c, 6, 4);
    assert_true(admission_allows(&c, 0));
    assert_false(admission_allows(&c, 1));
    /* no work at all: unbounded */
    struct admission d = {0};
    admission_observe(&d, 0, 4);
    assert_true(isinf(admission_capacity(&d)));
    assert_true(admission_allows(&d, 1000));
}

/* Older windows fade: after the precision changes, the new ratio dominates. */
static void test_capacity_follows_change(void **state)
{
    (void)state;
    struct admission a = {0};
    for (int i = 0; i < 200; i++)
        admission_observe(&a, 1.0, 4.0); /* w 0.25: 4 streams */
    NEAR(admission_capacity(&a), 4.0);
    for (int i = 0; i < 300; i++)
        admission_observe(&a, 0.5, 4.0); /* twice as fast: 8 */
    assert_true(admission_capacity(&a) > 7.9 && admission_capacity(&a) <= 8.0);
}

/* Three streams with 30, 10 and 20 s of audio left at w = 0.2: each renders 1 / (0.2 x 3)
 * audio s/s, so they end in 6, 12 and 18 s; the first held stream starts in 6 s, the
 * third in 18 s, a fourth is unknown. */
static void test_start_estimate(void **state)
{
    (void)state;
    struct admission a = {0};
    admission_observe(&a, 0.8, 4.0);
    double left[3] = {30, 10, 20};
    NEAR(admission_start_estimate(&a, left, 3, 1), 6.0);
    NEAR(admission_start_estimate(&a, left, 3, 2), 12.0);
    NEAR(admission_start_estimate(&a, left, 3, 3), 18.0);
    assert_true(admission_start_estimate(&a, left, 3, 4) < 0);
    assert_true(admission_start_estimate(&a, left, 3, 0) < 0);
    double done[1] = {-2}; /* all sent already: it starts as soon as it ends */
    NEAR(admission_start_estimate(&a, done, 1, 1), 0.0);
}

/* A listener from its first audio at t = 10: 4 s arrive, the next 4 s at 13 (1 s early),
 * the next at 19 (due at 18: a 1 s stall), the next at 22.5 (due at 23, early again). */
static void test_playback_stalls(void **state)
{
    (void)state;
    struct playback p = {0};
    assert_true(playback_runs_dry(&p) == 0);
    NEAR(playback_arrive(&p, 10, 4), 0);
    NEAR(playback_runs_dry(&p), 14);
    NEAR(playback_arrive(&p, 13, 4), 1);
    NEAR(playback_arrive(&p, 19, 4), -1);
    assert_int_equal(p.stalls, 1);
    NEAR(p.stall_s, 1);
    NEAR(playback_runs_dry(&p), 23); /* playback resumed at 19 with 4 s */
    NEAR(playback_arrive(&p, 22.5, 4), 0.5);
    assert_int_equal(p.stalls, 1);
    NEAR(p.audio_s, 16);
    /* a first arrival at time 0 of a fake clock still starts the listener */
    struct playback q = {0};
    playback_arrive(&q, 0, 2);
    NEAR(playback_arrive(&q, 3, 1), -1);
    assert_int_equal(q.stalls, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_admits),          cmocka_unit_test(test_capacity_from_work),
        cmocka_unit_test(test_capacity_follows_change), cmocka_unit_test(test_start_estimate),
        cmocka_unit_test(test_playback_stalls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
