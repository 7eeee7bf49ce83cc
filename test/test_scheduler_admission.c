/* stage0/admission.h and stage0/playback.h on a fake clock: the real-time capacity from
 * stage 1's work per audio second, a stream's need and which streams fit, the estimates,
 * a simulated stage 1 serving 16 streams without a stall, and the stalls of a listener
 * playing at 1x. */
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
    struct admission a = {.share = 0.85};
    assert_true(admission_capacity(&a) < 0);
    assert_true(admission_work_per_audio(&a) == 0);
    assert_true(admission_fits(&a, 0, 0, 1)); /* nothing measured yet: one stream at a time */
    assert_false(admission_fits(&a, 1, 1, 1));
    assert_true(admission_fits(&a, 1, 1, 0)); /* wholly rendered: it cannot stall */
    assert_true(admission_render_estimate(&a, 10, 2) < 0);
    /* nonsense is ignored */
    admission_observe(&a, -1, 4);
    admission_observe(&a, 1, 0);
    admission_observe(&a, NAN, 4);
    admission_observe(&a, 1, INFINITY);
    assert_true(admission_capacity(&a) < 0);
}

/* The figure: 16 streams at 5.22 audio s/s is w = 1 / 5.22 s of work per audio
 * second: 5.22 streams at full use, 4 streams that need all they get with the headroom. */
static void test_capacity_from_work(void **state)
{
    (void)state;
    struct admission a = {.share = 0.85};
    for (int i = 0; i < 50; i++)
        admission_observe(&a, 4.0 / 5.22, 4.0); /* 4-second windows */
    NEAR(admission_work_per_audio(&a), 1 / 5.22);
    NEAR(admission_capacity(&a), 5.22);
    assert_true(admission_fits(&a, 0, 0, 1));
    /* 5.22 x 0.85 = 4.4: the headroom keeps a fifth full stream out */
    assert_true(admission_fits(&a, 3, 3, 1));
    assert_false(admission_fits(&a, 4, 4, 1));
    /* ... but not one that needs 0.4 of a stream from now on */
    assert_true(admission_fits(&a, 4, 4, 0.4));
    /* the share is the operator's */
    a.share = 1.0;
    assert_true(admission_fits(&a, 4, 4, 1));
    assert_false(admission_fits(&a, 5, 5, 1));
    /* slower than real time: one stream at a time (it stalls, but the server serves) */
    struct admission c = {.share = 0.85};
    admission_observe(&c, 6, 4);
    assert_true(admission_fits(&c, 0, 0, 1));
    assert_false(admission_fits(&c, 1, 1, 1));
    /* no work at all: unbounded */
    struct admission d = {.share = 0.85};
    admission_observe(&d, 0, 4);
    assert_true(isinf(admission_capacity(&d)));
    assert_true(admission_fits(&d, 1000, 1000, 1));
}

/* Older windows fade: after the precision changes, the new ratio dominates. */
static void test_capacity_follows_change(void **state)
{
    (void)state;
    struct admission a = {.share = 0.85};
    for (int i = 0; i < 200; i++)
        admission_observe(&a, 1.0, 4.0); /* w 0.25: 4 streams */
    NEAR(admission_capacity(&a), 4.0);
    for (int i = 0; i < 300; i++)
        admission_observe(&a, 0.5, 4.0); /* twice as fast: 8 */
    assert_true(admission_capacity(&a) > 7.9 && admission_capacity(&a) <= 8.0);
}

/* A stream's need: l / (d - m + l), 1 within the margin, 0 when nothing is left. */
static void test_stream_need(void **state)
{
    (void)state;
    NEAR(admission_stream_need(0, 30, 5), 1);
    NEAR(admission_stream_need(5, 30, 5), 1);   /* at the margin */
    NEAR(admission_stream_need(35, 30, 5), 0.5); /* 30 s of audio ahead: half a stream */
    NEAR(admission_stream_need(15, 10, 5), 0.5);
    NEAR(admission_stream_need(12, 0, 5), 0);   /* wholly rendered */
    NEAR(admission_stream_need(-3, 10, 5), 1);  /* already dry */
    /* margin: a 4 s window, two batches of 8 windows at 0.125 s of work per audio second */
    struct admission a = {.share = 0.85};
    admission_observe(&a, 0.5, 4.0);
    NEAR(admission_margin(&a, 4, 8), 4 * (1 + 2 * 8 * 0.125));
    NEAR(admission_margin(&(struct admission){0}, 4, 8), 4); /* unmeasured: the window alone */
}

/* Three songs with 30, 10 and 20 s of audio left at w = 0.2 sharing stage 1: each renders
 * 1 / (0.2 x 3) audio s/s, so the 10 s one is rendered in 6 s, the 30 s one in 18 s. */
static void test_render_estimate(void **state)
{
    (void)state;
    struct admission a = {.share = 0.85};
    admission_observe(&a, 0.8, 4.0);
    NEAR(admission_render_estimate(&a, 10, 3), 6.0);
    NEAR(admission_render_estimate(&a, 30, 3), 18.0);
    NEAR(admission_render_estimate(&a, -2, 3), 0.0); /* all rendered already */
    assert_true(admission_render_estimate(&a, 10, 0) < 0);
}

/* A stage 1 of capacity `cap` streams (batches of up to 8 windows of 4 s, each batch taking
 * fixed + its windows' work) serving `n` 30 s streams that all arrive at once, as the
 * engine does it: streams that fit play from their first audio, the others preroll and
 * play once they fit or are complete. The server is warm (it measured one window alone).
 * Windows with a listener go first, earliest dry first; prerolling ones (arrival order)
 * fill the batch while it still ends before the tightest of those (stage1/window_order.h). Returns the stalls; *prerolled and *end_s
 * (when the last audio is out) for the caller. */
#define SIM_MAX 32
static int simulate(int n, double cap, double fixed_s, int *prerolled, double *end_s)
{
    const double W = 4, song = 30, margin_windows = 8;
    struct admission a = {.share = 0.85};
    struct playback play[SIM_MAX] = {{0}};
    double rendered[SIM_MAX] = {0}, kept[SIM_MAX] = {0};
    int pre[SIM_MAX] = {0};
    int stalls = 0, playing = 0;
    *prerolled = 0;
    double t = 0;
    admission_observe(&a, fixed_s + W / cap, W); /* a warm-up song's window, alone in its batch */
    for (int i = 0; i < n; i++) { /* arrivals, in order */
        double margin = admission_margin(&a, W, margin_windows), load = 0;
        for (int j = 0; j < i; j++)
            if (!pre[j]) load += admission_stream_need(play[j].started ? playback_runs_dry(&play[j]) - t : 0,
                                                       song - rendered[j], margin);
        pre[i] = !admission_fits(&a, playing, load, 1);
        playing += !pre[i];
        *prerolled += pre[i];
    }
    for (;;) {
        /* the batch: windows with a listener first, by when their client runs dry; then
         * prerolling ones (arrival order) while the batch ends before the tightest slack */
        int pick[8], k = 0, used[SIM_MAX] = {0};
        double slack = INFINITY;
        for (int pass = 0; pass < 2; pass++)
            while (k < 8) {
                int best = -1;
                double best_due = 0;
                for (int i = 0; i < n; i++) {
                    if (used[i] || rendered[i] >= song || pre[i] != pass) continue;
                    double due = pre[i] ? i : play[i].started ? playback_runs_dry(&play[i]) : t;
                    if (best < 0 || due < best_due) best = i, best_due = due;
                }
                if (best < 0 || (pass == 1 && fixed_s + (k + 1) * W / cap > slack)) break;
                if (pass == 0 && best_due > t && best_due - t < slack) slack = best_due - t;
                used[best] = 1;
                pick[k++] = best;
            }
        if (k == 0) break;
        double batch_s = fixed_s + k * W / cap;
        t += batch_s;
        for (int i = 0; i < k; i++) {
            int s = pick[i];
            double audio = song - rendered[s] < W ? song - rendered[s] : W;
            rendered[s] += audio;
            admission_observe(&a, batch_s / k, audio);
            if (pre[s]) {
                kept[s] += audio;
                continue;
            }
            if (playback_arrive(&play[s], t, audio) < 0) stalls++;
        }
        /* prerolled streams that fit now play, oldest first */
        double margin = admission_margin(&a, W, margin_windows), load = 0;
        for (int j = 0; j < n; j++)
            if (!pre[j])
                load += admission_stream_need(play[j].started ? playback_runs_dry(&play[j]) - t : 0,
                                              song - rendered[j], margin);
        for (int j = 0; j < n; j++) {
            if (!pre[j]) continue;
            double need = admission_stream_need(kept[j], song - rendered[j], margin);
            if (!admission_fits(&a, playing, load, need)) continue;
            pre[j] = 0;
            playing++;
            load += need;
            if (kept[j] > 0) playback_arrive(&play[j], t, kept[j]);
        }
    }
    for (int i = 0; i < n; i++)
        assert_true(play[i].audio_s == song); /* every stream played all of its song */
    *end_s = t;
    return stalls;
}

/* The load, 16 streams of 30 s, on a stage 1 of 7.7 streams with batches costing
 * 0.22 s more than their windows (the H100's DiT, where a full batch takes longer than
 * its 4 s of audio): none stalls, most preroll, and the work ends within 3% of 16 full
 * batches (FIFO's time). Within the capacity every stream plays at once. */
static void test_sixteen_streams_never_stall(void **state)
{
    (void)state;
    int prerolled;
    double end_s;
    assert_int_equal(simulate(16, 7.7, 0.22, &prerolled, &end_s), 0);
    assert_true(prerolled >= 8);
    /* 16 x 8 windows in batches of 8 at 0.22 + 8 x 4 / 7.7 s */
    assert_true(end_s <= 1.03 * 16 * (0.22 + 8 * 4 / 7.7)); /* FIFO's 16 full batches */
    assert_int_equal(simulate(4, 7.7, 0.22, &prerolled, &end_s), 0);
    assert_int_equal(prerolled, 0); /* within the capacity every stream plays at once */
    assert_int_equal(simulate(3, 2.5, 0.0, &prerolled, &end_s), 0);
    assert_int_equal(prerolled, 1);
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
        cmocka_unit_test(test_capacity_follows_change), cmocka_unit_test(test_stream_need),
        cmocka_unit_test(test_render_estimate),         cmocka_unit_test(test_sixteen_streams_never_stall),
        cmocka_unit_test(test_playback_stalls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
