/* min_frames (the request's min_new_tokens / min_duration_s): the stop code cannot be
 * drawn before the song has that many frames, it can be after, every other draw is
 * unchanged (so a seeded song is the same song up to where it would have stopped), and the
 * same seed gives the same song again. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above */
#include <cmocka.h>

#include "common/error.h"
#include "common/sampler.h"
#include "stage0/generate.h"
#include "support/test_stage0.h"
#include "support/test_support.h"

#define MAX_FRAMES 48

struct song {
    int n, ncb, stop_masked_every_draw, c0_draws;
    unsigned char masked[MAX_FRAMES + 2]; /* per c0 draw: the stop column held -inf */
    int32_t codes[MAX_FRAMES][16];
};

static void on_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    (void)frame;
    struct song *s = ctx;
    for (int j = 0; j < s->ncb; j++)
        s->codes[t][j] = codes[j];
    s->n = t + 1;
}

static void on_draw(void *ctx, int step, int j, const float *guided, int n)
{
    (void)step, (void)n;
    struct song *s = ctx;
    if (j != 0) return;
    s->c0_draws++;
    bool masked = isinf(guided[0]) && guided[0] < 0;
    if (!masked) s->stop_masked_every_draw = 0;
    if (s->c0_draws <= MAX_FRAMES + 1) s->masked[s->c0_draws - 1] = masked;
}

static const int32_t k_prompt[2][6] = {
    {151644, 151671, 64, 65, 151645, 151669},
    {151644, 151654, 151654, 151654, 151645, 151669},
};

static int sing(struct test_stage0 *m, uint64_t seed, int min_frames, struct song *s, enum generate_stop *stop)
{
    memset(s, 0, sizeof *s);
    s->ncb = m->dd.cfg.n_codebooks;
    s->stop_masked_every_draw = 1;
    if (s->ncb > 16) return -1;
    struct sampler sp;
    sampler_init_seeded(&sp, seed);
    struct generate g;
    struct generate_hooks hooks = {.ctx = s, .on_frame = on_frame, .on_draw = on_draw};
    int rc = generate_begin(&g, &m->lm, &m->dd, &sp, &k_prompt[0][0], 6, MAX_FRAMES, SAMPLER_CFG_SCALE, &hooks);
    if (rc < 0) return rc;
    g.min_frames = min_frames;
    while (!g.done && rc == 0)
        rc = generate_step(&g);
    *stop = g.stop;
    generate_end(&g);
    return rc;
}

/* Seeds (at most 2 found) whose songs end on the stop code well before the budget, sung
 * again with a minimum past that point, at that point, and twice for reproducibility. */
static int check_stopping_seeds(struct test_stage0 *m)
{
    int found = 0;
    for (uint64_t seed = 0; seed < 64 && found < 2; seed++) {
        struct song plain, longer, again, same;
        enum generate_stop st;
        int rc = sing(m, seed, 0, &plain, &st);
        if (rc < 0 || st != GENERATE_STOP_TOKEN || plain.n + 8 > MAX_FRAMES) continue;
        found++;
        int min = plain.n + 6;
        assert_int_equal(sing(m, seed, min, &longer, &st), 0);
        if (longer.n < min) fail_msg("seed %llu: %d frames with a minimum of %d", (unsigned long long)seed, longer.n, min);
        /* the stop is masked at every draw before the minimum: step 0's draw and one per
         * frame up to min (the draw made with n frames emitted decides frame n + 1) */
        for (int d = 0; d <= min; d++)
            if (!longer.masked[d]) fail_msg("seed %llu: draw %d could stop (minimum %d)", (unsigned long long)seed, d, min);
        /* the same song up to its would-be stop */
        assert_memory_equal(plain.codes, longer.codes, sizeof(int32_t) * 16 * (size_t)plain.n);
        /* reproducible: the same seed and minimum give the same song */
        enum generate_stop st2;
        assert_int_equal(sing(m, seed, min, &again, &st2), 0);
        assert_int_equal(again.n, longer.n);
        assert_int_equal(st2, st);
        assert_memory_equal(again.codes, longer.codes, sizeof(int32_t) * 16 * (size_t)longer.n);
        /* a minimum the song reaches anyway changes nothing */
        assert_int_equal(sing(m, seed, plain.n, &same, &st2), 0);
        assert_int_equal(st2, GENERATE_STOP_TOKEN);
        assert_int_equal(same.n, plain.n);
        assert_memory_equal(same.codes, plain.codes, sizeof(int32_t) * 16 * (size_t)plain.n);
    }
    return found;
}

static void test_min_frames(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    /* Make the stop code likely, as test_generate_ignore_stop does: the head row of the
     * code this model draws most often, scaled until some seeds end early. */
    struct song probe;
    enum generate_stop probe_stop;
    assert_int_equal(sing(m, 1, 0, &probe, &probe_stop), 0);
    int best = 0, best_n = 0;
    for (int t = 0; t < probe.n; t++) {
        int k = 0;
        for (int u = 0; u < probe.n; u++)
            k += probe.codes[u][0] == probe.codes[t][0];
        if (k > best_n) best_n = k, best = probe.codes[t][0];
    }
    const int H = m->lm.cfg.hidden;
    const float *row = m->lm.head + (size_t)(best + 1) * H;
    int found = 0;
    for (float scale = 1.0f; scale <= 16.0f && !found; scale *= 2.0f) {
        for (int i = 0; i < H; i++)
            m->lm.head[i] = scale * row[i];
        found = check_stopping_seeds(m);
    }
    assert_true(found > 0); /* else this test proves nothing */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_min_frames),
    };
    return cmocka_run_group_tests(tests, test_stage0_golden_setup, test_stage0_golden_teardown);
}
