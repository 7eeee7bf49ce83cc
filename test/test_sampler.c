/* Portable seeded sampler: the published vectors of docs/model.md §5, top-k tie
 * handling, NaN/inf handling, the c0 and depth guidance rules, replay mode. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* cmocka needs the headers above */
#include <cmocka.h>

#include "common/sampler.h"

static void test_seed_derive(void **state)
{
    (void)state;
    assert_int_equal(sampler_seed_derive(0), 411363039);
    assert_int_equal(sampler_seed_derive(3), 122074423);
    assert_int_equal(sampler_seed_derive(7), 2092721875);
    assert_int_equal(sampler_seed_derive(42), 1153769322);
}

static void test_murmur(void **state)
{
    (void)state;
    uint64_t s = 1153769322;
    assert_int_equal(sampler_murmur(s, 0, 0), 1795620021u);
    assert_int_equal(sampler_murmur(s, 0, 1), 1827116861u);
    assert_int_equal(sampler_murmur(s, 7, 1023), 390523399u);
    assert_int_equal(sampler_murmur(s, 24, 16384), 3048668828u);
}

static void test_gumbel(void **state)
{
    (void)state;
    uint64_t s = 1153769322;
    const double want[4] = {0.13685856399176435, 0.15699924740860752, 1.1298430305674518, 3.0455076122592826};
    for (int i = 0; i < 4; i++)
        assert_true(fabs(sampler_gumbel(s, 0, (uint32_t)i) - want[i]) <= 1e-15);
}

static void test_draw_vector(void **state)
{
    (void)state;
    const float v[4] = {1, 2, 3, 4};
    assert_int_equal(sampler_draw_gumbel(1809552049, v, 4, 4, 0), 3);
    struct sampler sp;
    sampler_init_raw(&sp, 1809552049);
    int col = -1;
    assert_int_equal(sampler_draw(&sp, v, 4, 0, &col), 0);
    assert_int_equal(col, 3);
}

/* Only the top-k candidates can ever be drawn, whatever the position. */
static void test_draw_respects_topk(void **state)
{
    (void)state;
    enum { N = 300 };
    float g[N];
    for (int i = 0; i < N; i++)
        g[i] = (float)((i * 37) % N) * 0.01f;
    for (uint32_t pos = 0; pos < 200; pos++) {
        int c = sampler_draw_gumbel(12345, g, N, 50, pos);
        int rank = 0;
        for (int i = 0; i < N; i++)
            rank += g[i] > g[c];
        assert_true(rank < 50);
    }
}

static void test_topk_ties(void **state)
{
    (void)state;
    float v[6] = {5, 3, 3, 3, 1, 0};
    sampler_topk_mask(v, 6, 2); /* 2nd largest is 3: every tie at 3 survives */
    assert_true(v[0] == 5 && v[1] == 3 && v[2] == 3 && v[3] == 3);
    assert_true(isinf(v[4]) && v[4] < 0 && isinf(v[5]));
    float w[3] = {1, 2, 3};
    sampler_topk_mask(w, 3, 5); /* k >= n: unchanged */
    assert_true(w[0] == 1 && w[1] == 2 && w[2] == 3);
}

static void test_nan_inf(void **state)
{
    (void)state;
    /* NaN ranks first in torch.topk and is never masked by the threshold. */
    float v[4] = {NAN, 1, 2, 0};
    sampler_topk_mask(v, 4, 2);
    assert_true(isnan(v[0]) && v[2] == 2 && isinf(v[1]) && isinf(v[3]));
    /* nan_to_num before the draw: NaN -> -1e9, +inf -> 1e9 wins every draw. */
    float g[5] = {NAN, 0.5f, INFINITY, -INFINITY, 0.25f};
    for (uint32_t pos = 0; pos < 50; pos++)
        assert_int_equal(sampler_draw_gumbel(7, g, 5, 50, pos), 2);
    /* All candidates -inf except one: that one is drawn. */
    float h[4] = {-INFINITY, -INFINITY, 3.0f, -INFINITY};
    for (uint32_t pos = 0; pos < 50; pos++)
        assert_int_equal(sampler_draw_gumbel(7, h, 4, 2, pos), 2);
}

static void test_cfg_rules(void **state)
{
    (void)state;
    enum { N = 60 };
    float c[N], u[N], g[N];
    for (int i = 0; i < N; i++) {
        c[i] = (float)i * 0.1f;
        u[i] = (float)(N - i) * 0.03f;
    }
    sampler_c0_guide(g, c, u, N, 1.5f, 50);
    for (int i = 0; i < N; i++) {
        if (i < 10) {
            assert_true(isinf(g[i]) && g[i] < 0); /* below the conditional top-50 */
        } else {
            float d = c[i] - u[i];
            float m = d * 1.5f;
            assert_true(g[i] == u[i] + m);
        }
    }
    float b[2];
    const float bc[2] = {1.0f, 2.0f}, bu[2] = {0.5f, 4.0f};
    sampler_cfg_blend(b, bc, bu, 2, 1.5f);
    assert_true(b[0] == 1.25f && b[1] == 1.0f);
}

static void test_replay(void **state)
{
    (void)state;
    const int64_t lm[2] = {SAMPLER_CODE_OFFSET + 5, SAMPLER_STOP_ID};
    const int64_t depth[3] = {7, 8, 9}; /* n_codebooks 4: 3 per step */
    struct sampler sp;
    sampler_init_replay(&sp, lm, 2, depth, 3, 4);
    float g[SAMPLER_C0_COLS];
    for (int i = 0; i < SAMPLER_C0_COLS; i++)
        g[i] = (float)(i % 97);
    int col;
    assert_int_equal(sampler_draw(&sp, g, SAMPLER_C0_COLS, 0, &col), 0);
    assert_int_equal(col, 6);
    assert_int_equal(sampler_c0_col_to_id(col), SAMPLER_CODE_OFFSET + 5);
    float d[16] = {0};
    assert_int_equal(sampler_draw(&sp, d, 16, 1, &col), 0);
    assert_int_equal(col, 7);
    assert_int_equal(sampler_draw(&sp, d, 16, 3, &col), 0);
    assert_int_equal(col, 9);
    assert_int_equal(sampler_draw(&sp, g, SAMPLER_C0_COLS, 4, &col), 0);
    assert_int_equal(col, 0);                                        /* the stop id */
    assert_true(sampler_draw(&sp, d, 16, 5, &col) < 0);              /* exhausted */
    assert_true(sampler_draw(&sp, g, SAMPLER_C0_COLS, 8, &col) < 0); /* exhausted */
    assert_true(sampler_draw(&sp, d, 8, 2, &col) < 0);               /* code 8 outside [0, 8) */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_derive),
        cmocka_unit_test(test_murmur),
        cmocka_unit_test(test_gumbel),
        cmocka_unit_test(test_draw_vector),
        cmocka_unit_test(test_draw_respects_topk),
        cmocka_unit_test(test_topk_ties),
        cmocka_unit_test(test_nan_inf),
        cmocka_unit_test(test_cfg_rules),
        cmocka_unit_test(test_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
