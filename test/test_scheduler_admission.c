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
    assert_true(admission_fits(&a, 0, 0, 1, INFINITY)); /* nothing measured yet: alone plays */
    assert_false(admission_fits(&a, 1, 1, 1, 2.0));
    assert_true(admission_fits(&a, 1, 1, 0, -1)); /* wholly rendered: it cannot stall */
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
    assert_true(admission_fits(&a, 0, 0, 1, INFINITY));
    /* 5.22 x 0.85 = 4.4: the headroom keeps a fifth full stream out */
    assert_true(admission_fits(&a, 3, 3, 1, 2.0));
    assert_false(admission_fits(&a, 4, 4, 1, 2.0));
    /* ... but not one that needs 0.4 of a stream from now on */
    assert_true(admission_fits(&a, 4, 4, 0.4, 2.0));
    /* the share is the operator's */
    a.share = 1.0;
    assert_true(admission_fits(&a, 4, 4, 1, 2.0));
    assert_false(admission_fits(&a, 5, 5, 1, 2.0));
    /* slower than real time: one stream at a time (it stalls, but the server serves) */
    struct admission c = {.share = 0.85};
    admission_observe(&c, 6, 4);
    assert_true(admission_fits(&c, 0, 0, 1, INFINITY));
    assert_false(admission_fits(&c, 1, 1, 1, 2.0));
    /* no work at all: unbounded */
    struct admission d = {.share = 0.85};
    admission_observe(&d, 0, 4);
    assert_true(isinf(admission_capacity(&d)));
    assert_true(admission_fits(&d, 1000, 1000, 1, 2.0));
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

/* A simulated stage 1 serving n 30 s songs that all arrive at once (a burst: none is alone)
 * in batches of up to 8 windows of 4 s, a song at most one window per batch, a batch of k
 * taking fixed_s + k x 4 / cap seconds, slow x that while stage 0 still generates (the first
 * stage0_s seconds). deadline 1: as the engine and stage 1 do it (streams that fit play,
 * the others preroll and play once they fit; playing streams' windows first, earliest dry
 * first, then the others, longest waiting first). deadline 0: FIFO, every stream playing
 * from its first audio, round robin. Returns the stalls; *prerolled and *end_s (when the
 * last audio is out) for the caller. */
#define SIM_MAX 32
struct sim {
    int n;
    double cap, fixed_s, slow, stage0_s;
};

static int simulate(const struct sim *m, int deadline, int *prerolled, double *end_s)
{
    const double W = 4, song = 30;
    const int n = m->n;
    struct admission a = {.share = 0.85};
    struct playback play[SIM_MAX] = {{0}};
    double rendered[SIM_MAX] = {0}, kept[SIM_MAX] = {0}, rate[SIM_MAX], last[SIM_MAX] = {0};
    int pre[SIM_MAX] = {0}, stalls = 0, playing = 0, rr = 0;
    *prerolled = 0;
    double t = 0;
    admission_observe(&a, m->fixed_s + W / m->cap, W); /* a warm-up song's window, alone in its batch */
    for (int i = 0; i < n; i++) { /* the burst: nothing measured, company: all preroll (one alone plays) */
        rate[i] = -1;
        pre[i] = deadline && !admission_fits(&a, playing, 0, 1, n == 1 ? INFINITY : -1);
        playing += !pre[i];
        *prerolled += pre[i];
    }
    for (;;) {
        int pick[8], k = 0, used[SIM_MAX] = {0};
        for (int pass = 0; pass < 2 && k < 8; pass++)
            while (k < 8) {
                int best = -1;
                double best_key = 0;
                for (int j = 0; j < n; j++) {
                    int i = (rr + j) % n;
                    if (used[i] || rendered[i] >= song) continue;
                    if (deadline && pre[i] != pass) continue;
                    double key = !deadline ? j : pre[i] ? last[i] : play[i].started ? playback_runs_dry(&play[i]) : t;
                    if (best < 0 || key < best_key) best = i, best_key = key;
                }
                if (best < 0) break;
                used[best] = 1;
                pick[k++] = best;
            }
        if (k == 0) break;
        rr = (pick[k - 1] + 1) % n;
        double batch_s = (m->fixed_s + k * W / m->cap) * (t < m->stage0_s ? m->slow : 1);
        t += batch_s;
        for (int i = 0; i < k; i++) {
            int s = pick[i];
            double audio = song - rendered[s] < W ? song - rendered[s] : W;
            rendered[s] += audio;
            admission_observe(&a, batch_s / k, audio);
            if (last[s] > 0) rate[s] = rate[s] > 0 ? 0.5 * rate[s] + 0.5 * audio / (t - last[s]) : audio / (t - last[s]);
            last[s] = t;
            if (pre[s])
                kept[s] += audio;
            else if (playback_arrive(&play[s], t, audio) < 0)
                stalls++;
        }
        if (!deadline) continue;
        /* prerolled streams that fit now play, oldest first */
        double margin = admission_margin(&a, W, 8), load = 0;
        for (int j = 0; j < n; j++)
            if (!pre[j])
                load += admission_stream_need(play[j].started ? playback_runs_dry(&play[j]) - t : 0,
                                              song - rendered[j], margin);
        for (int j = 0; j < n; j++) {
            if (!pre[j]) continue;
            double need = admission_stream_need(kept[j], song - rendered[j], margin);
            if (!admission_fits(&a, playing, load, need, rate[j])) continue;
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

/* The load, 16 streams of 30 s at once, on a stage 1 like the H100's (7.7 streams
 * flat out, 0.22 s of fixed cost a batch, so a full batch takes longer than its 4 s of
 * audio), half as fast while stage 0 generates the songs: FIFO stalls every stream; with
 * preroll admission none stalls and the work ends within 3% of FIFO's time. A lone stream
 * plays at once and does not stall. */
static void test_sixteen_streams_never_stall(void **state)
{
    (void)state;
    int prerolled;
    double end_s, fifo_s;
    struct sim m = {.n = 16, .cap = 7.7, .fixed_s = 0.22, .slow = 2.0, .stage0_s = 20};
    assert_true(simulate(&m, 0, &prerolled, &fifo_s) >= 16);
    assert_int_equal(simulate(&m, 1, &prerolled, &end_s), 0);
    assert_int_equal(prerolled, 16);
    assert_true(end_s <= 1.03 * fifo_s);
    m.slow = 1.0; /* stage 1 alone */
    assert_true(simulate(&m, 0, &prerolled, &fifo_s) >= 16);
    assert_int_equal(simulate(&m, 1, &prerolled, &end_s), 0);
    assert_true(end_s <= 1.03 * fifo_s);
    struct sim one = {.n = 1, .cap = 7.7, .fixed_s = 0.22, .slow = 2.0, .stage0_s = 5};
    assert_int_equal(simulate(&one, 1, &prerolled, &end_s), 0);
    assert_int_equal(prerolled, 0);
}

/* A stream alone on its worker plays at once; with company and nothing measured it
 * prerolls; a measured rate below its need (with the share) keeps it prerolling even with
 * capacity to spare: a song advances one window per batch. */
static void test_stream_rate_bounds(void **state)
{
    (void)state;
    struct admission a = {.share = 0.85};
    assert_true(admission_fits(&a, 0, 0, 1, INFINITY)); /* fresh server, alone */
    assert_false(admission_fits(&a, 0, 0, 1, -1));      /* fresh server, a burst */
    admission_observe(&a, 0.4, 4.0);                    /* capacity 10 streams */
    assert_true(admission_fits(&a, 2, 2, 1, 1.5));
    assert_false(admission_fits(&a, 2, 2, 1, 1.0));  /* 1 > 0.85 x 1.0 */
    assert_true(admission_fits(&a, 2, 2, 0.8, 1.0)); /* a prerolled stream with audio ahead */
    assert_false(admission_fits(&a, 2, 2, 1, -1));   /* its rate not measured yet */
    assert_true(admission_fits(&a, 9, 9, 0, -1));    /* wholly rendered */
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
        cmocka_unit_test(test_stream_rate_bounds),
        cmocka_unit_test(test_playback_stalls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
