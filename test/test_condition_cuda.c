/* The condition projection on the GPU against condition_project (the C reference):
 * tiny-a's encoder and a random wider one, several window lengths (1 frame, odd, the full
 * 200). Exit 77 without CUDA or without a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above */
#include <cmocka.h>

#include "common/error.h"
#include "stage1/condition.h"
#include "support/test_rand.h"
#include "support/test_support.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/condition_cuda.h"

static uint64_t rng = 12345;
static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / (s > 0 ? s : 1));
}

/* GPU vs CPU for each F, in both precisions. */
static void compare(const struct condition_model *m, const int *Fs, int nF)
{
    const struct condition_config *g = &m->cfg;
    int maxF = 0;
    for (int i = 0; i < nF; i++)
        maxF = Fs[i] > maxF ? Fs[i] : maxF;
    float *mixed = malloc(sizeof(float) * (size_t)maxF * g->hidden);
    int maxL = condition_latent_len(g, maxF);
    float *want = malloc(sizeof(float) * (size_t)maxL * g->out_dim);
    float *got = malloc(sizeof(float) * (size_t)maxL * g->out_dim);
    assert_non_null(mixed), assert_non_null(want), assert_non_null(got);
    for (size_t i = 0; i < (size_t)maxF * g->hidden; i++)
        mixed[i] = test_rand_uniform(&rng, 1.0f);
    {
        struct condition_cuda *cc;
        if (condition_cuda_create(&cc, m, maxF) < 0) fail_msg("%s", mm3_last_error());
        for (int i = 0; i < nF; i++) {
            int F = Fs[i], L = condition_latent_len(g, F);
            assert_int_equal(condition_project(m, mixed, F, want), 0);
            memset(got, 0xff, sizeof(float) * (size_t)L * g->out_dim);
            assert_int_equal(condition_cuda_project(cc, mixed, F, got), 0);
            double r = rel_l2(got, want, (size_t)L * g->out_dim);
            fprintf(stderr, "  F %d L %d: rel %.2e\n", F, L, r);
            assert_true(r <= 1e-5); /* float32 in another summation order */
        }
        assert_true(condition_cuda_project(cc, mixed, maxF + 1, got) < 0); /* over the reserved size */
        condition_cuda_free(cc);
    }
    free(mixed), free(want), free(got);
}

static void test_tiny_a(void **state)
{
    (void)state;
    const char *g = test_golden_dir();
    if (!g) skip();
    char root[1024];
    snprintf(root, sizeof root, "%s/checkpoint", g);
    struct condition_model *m;
    if (condition_load(&m, root) < 0) fail_msg("condition_load: %s", mm3_last_error());
    const int Fs[] = {1, 2, 37, 200};
    compare(m, Fs, 4);
    condition_free(m);
}

static void test_random_wide(void **state)
{
    (void)state;
    struct condition_model m = {.cfg = {.hidden = 640, .n_layers = 8, .out_dim = 384, .in_rate = 24000,
                                        .in_hop = 960, .out_rate = 44100, .out_hop = 512}};
    size_t nw = (size_t)3 * m.cfg.out_dim * m.cfg.hidden;
    m.proj_w = malloc(sizeof(float) * nw);
    m.proj_b = malloc(sizeof(float) * m.cfg.out_dim);
    assert_non_null(m.proj_w), assert_non_null(m.proj_b);
    for (size_t i = 0; i < nw; i++)
        m.proj_w[i] = 0.05f * test_rand_uniform(&rng, 1.0f);
    for (int i = 0; i < m.cfg.out_dim; i++)
        m.proj_b[i] = test_rand_uniform(&rng, 1.0f);
    const int Fs[] = {200, 3, 101};
    compare(&m, Fs, 3);
    free(m.proj_w), free(m.proj_b);
}

int main(void)
{
    if (cuda_device_count_safe() < 1) {
        fprintf(stderr, "test_condition_cuda: no CUDA device, skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_a),
        cmocka_unit_test(test_random_wide),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
    fprintf(stderr, "test_condition_cuda: built without CUDA, skipped\n");
    return 77;
}

#endif
