/* stage1/window_order.h: deadlines of streamed windows on a fake clock, and the order a DiT
 * batch takes its candidates in under `deadline` and `fifo`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "stage1/window_order.h"

static void ids(const struct window_candidate *c, int n, uint64_t *out)
{
    for (int i = 0; i < n; i++)
        out[i] = c[i].id;
}

static void test_deadline_arithmetic(void **state)
{
    (void)state;
    double now = 100.0;
    /* whole-file songs have none, whatever they sent, unless they are due by a time */
    assert_true(isinf(window_deadline(0, 1, now, 0, 0, WINDOW_NO_DEADLINE)));
    assert_true(isinf(window_deadline(0, 0, now, 90.0, 8.0, WINDOW_NO_DEADLINE)));
    /* a first window is due now */
    assert_true(window_deadline(1, 1, now, 0, 0, WINDOW_NO_DEADLINE) == now);
    /* first audio at 90 s, 8 s sent: the client runs dry at 98 s (late already) */
    assert_true(window_deadline(1, 0, now, 90.0, 8.0, WINDOW_NO_DEADLINE) == 98.0);
    /* 16 s sent: 106 s, six seconds of slack */
    assert_true(window_deadline(1, 0, now, 90.0, 16.0, WINDOW_NO_DEADLINE) == 106.0);
    /* a window rendered but its audio not out yet: as soon as it can go out */
    assert_true(window_deadline(1, 0, now, 0, 0, WINDOW_NO_DEADLINE) == now);
    assert_true(window_deadline(0, 0, now, 90.0, 8.0, 130.0) == 130.0);
    assert_true(window_deadline(1, 0, now, 90.0, 8.0, 130.0) == 98.0); /* a stream ignores it */
}

/* A whole-file song that has waited long (due by 52 s, half of stage 0's wait for its next
 * audio gone) goes ahead of streams with slack, still behind the ones about to run dry. */
static void test_whole_file_not_starved(void **state)
{
    (void)state;
    double now = 50.0;
    struct window_candidate c[4] = {
        {1, window_deadline(1, 0, now, 40.0, 24.0, WINDOW_NO_DEADLINE), 0}, /* 64 */
        {5, window_deadline(0, 0, now, 0, 0, 52.0), 0},                     /* whole file, due at 52 */
        {3, window_deadline(1, 0, now, 20.0, 28.0, WINDOW_NO_DEADLINE), 0}, /* 48: stalling */
        {2, window_deadline(1, 0, now, 45.0, 8.0, WINDOW_NO_DEADLINE), 0},  /* 53 */
    };
    uint64_t got[4], want[4] = {3, 5, 2, 1};
    window_order_sort(MM3_WINDOW_ORDER_DEADLINE, c, 4);
    ids(c, 4, got);
    assert_memory_equal(got, want, sizeof want);
}


/* Three songs playing (ids 1-3, in round-robin order), a new song's first window (4) and a
 * whole-file song (5), on a fake clock at 50 s. */
static int fixture(struct window_candidate *c)
{
    double now = 50.0;
    c[0] = (struct window_candidate){1, window_deadline(1, 0, now, 40.0, 24.0, WINDOW_NO_DEADLINE), 0}; /* 64: far ahead */
    c[1] = (struct window_candidate){5, window_deadline(0, 0, now, 30.0, 8.0, WINDOW_NO_DEADLINE), 0};  /* no deadline */
    c[2] = (struct window_candidate){2, window_deadline(1, 0, now, 45.0, 8.0, WINDOW_NO_DEADLINE), 0};  /* 53: about to run dry */
    c[3] = (struct window_candidate){3, window_deadline(1, 0, now, 20.0, 28.0, WINDOW_NO_DEADLINE), 0}; /* 48: stalling */
    c[4] = (struct window_candidate){4, window_deadline(1, 1, now, 0, 0, WINDOW_NO_DEADLINE), 1};       /* 50: first */
    return 5;
}

static void test_deadline_order(void **state)
{
    (void)state;
    struct window_candidate c[5];
    uint64_t got[5];
    int n = fixture(c);
    window_order_sort(MM3_WINDOW_ORDER_DEADLINE, c, n);
    ids(c, n, got);
    /* stalling one, then the new song's first window ahead of later windows, the whole-file song last */
    uint64_t want[5] = {3, 4, 2, 1, 5};
    assert_memory_equal(got, want, sizeof want);
}

static void test_fifo_keeps_round_robin(void **state)
{
    (void)state;
    struct window_candidate c[5];
    uint64_t got[5];
    int n = fixture(c);
    window_order_sort(MM3_WINDOW_ORDER_FIFO, c, n);
    ids(c, n, got);
    uint64_t want[5] = {1, 5, 2, 3, 4};
    assert_memory_equal(got, want, sizeof want);
}

/* Equal deadlines keep the round-robin order (stable), a first window wins a tie with a
 * later one, and whole-file songs keep theirs among themselves. */
static void test_ties(void **state)
{
    (void)state;
    double inf = WINDOW_NO_DEADLINE;
    struct window_candidate c[6] = {{10, inf, 0}, {11, 7.0, 0}, {12, inf, 1}, {13, 7.0, 1}, {14, 7.0, 0}, {15, 3.0, 0}};
    uint64_t got[6], want[6] = {15, 13, 11, 14, 12, 10};
    window_order_sort(MM3_WINDOW_ORDER_DEADLINE, c, 6);
    ids(c, 6, got);
    /* 12 is a whole-file song's first window: a first window wins only a tie, so it stays
     * behind every deadline but ahead of the other whole-file song */
    assert_memory_equal(got, want, sizeof want);
    window_order_sort(MM3_WINDOW_ORDER_DEADLINE, c, 0); /* nothing to do */
}

/* The batch takes its first max_windows: with room for two, the new first window goes in
 * and the far-ahead stream waits; FIFO would have taken the far-ahead one and the
 * whole-file song. */
static void test_batch_takes_the_most_urgent(void **state)
{
    (void)state;
    struct window_candidate c[5];
    int n = fixture(c);
    window_order_sort(MM3_WINDOW_ORDER_DEADLINE, c, n);
    assert_int_equal(c[0].id, 3);
    assert_int_equal(c[1].id, 4);
}

/* A prerolled stream: no deadline until PLAY (stage 1 passes playing 0, the song's whole_by),
 * then its clock is PLAY's time when its first audio went out before it. */
static void test_prerolled_clock(void **state)
{
    (void)state;
    double now = 100.0;
    assert_true(window_deadline(0, 0, now, 60.0, 20.0, 130.0) == 130.0);
    /* first audio out at 60 s, 20 s of it kept by stage 0, PLAY at 95 s: dry at 115 s */
    double clock = window_play_clock(60.0, 95.0);
    assert_true(clock == 95.0);
    assert_true(window_deadline(1, 0, now, clock, 20.0, 130.0) == 115.0);
    /* PLAY before its first audio: the clock starts with the audio */
    assert_true(window_play_clock(97.0, 95.0) == 97.0);
    assert_true(window_play_clock(0, 95.0) == 0); /* nothing out yet: its first window is due now */
    assert_true(window_play_clock(60.0, 0) == 60.0); /* a stream that never prerolled */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deadline_arithmetic),         cmocka_unit_test(test_deadline_order),
        cmocka_unit_test(test_fifo_keeps_round_robin),      cmocka_unit_test(test_ties),
        cmocka_unit_test(test_batch_takes_the_most_urgent), cmocka_unit_test(test_whole_file_not_starved),
        cmocka_unit_test(test_prerolled_clock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
