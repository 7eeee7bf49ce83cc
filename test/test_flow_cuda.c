/* The GPU flow loop (stage1/cuda/flow_cuda.h) against the CPU one (stage1/flow.h).
 *
 * 1. Given the same velocities, one pinning + CFG + Euler step on the GPU equals the
 *    CPU arithmetic of flow_window_run bit for bit (no FMA contraction on either side;
 *    the build compiles C with -ffp-contract=off), over several steps of a schedule.
 * 2. A whole window through the tiny-a DiT in fp32: rel <= 1e-5 against
 *    flow_window_run (only the GEMM summation order differs), with and without an
 *    overlap prefix, and the prefix restored exactly.
 * 3. fp16: a window within the fp16 bound; a window whose noise lies beyond fp16's range
 *    (its operands overflow to inf) is rerun with scaled operands and matches the CPU
 *    just as well, alone and inside a batch beside a plain window; the rerun is counted.
 * 4. Bad arguments are refused.
 * Exit 77 without CUDA compiled in, without a GPU, or (2.) without the tiny-a golden. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "stage1/dit.h"
#include "stage1/flow.h"
#include "support/test_rand.h"
#include "support/test_support.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/flow_cuda.h"
#include "stage1/cuda/dit_kernels.h"

/* fp32 GEMMs differ from the CPU only in summation order (a forward: ~1e-6). */
#define TOL_WINDOW_FP32 1e-5
/* fp16 operands (10-bit mantissa, as tf32) over a few Euler steps of tiny-a */
#define TOL_WINDOW_FP16 1e-2
/* noise this large overflows fp16 operands (65504) but not when scaled down 256 times */
#define FP16_OVERFLOW_NOISE 2e5f
/* fp8 (e4m3 block GEMMs): the golden replay's latents bound, GOLDEN_REL_TOL_FLOW_FP8's
 * derivation (16x bf16's operand rounding). */
#define TOL_WINDOW_FP8 5e-2

static uint64_t rng = 0x5eed1234abcdull;

static void *upload(const float *h, size_t n)
{
    void *d = NULL;
    assert_int_equal(cuda_malloc(&d, 4 * n), 0);
    assert_int_equal(cuda_memcpy_h2d(d, h, 4 * n), 0);
    return d;
}

/* flow_window_run's per-step arithmetic, written out (stage1/flow.c). */
static void cpu_pin(float *x, const float *np, const float *prev, int C, int L, int ov, float t)
{
    const float one_minus_sigma_min = (float)(1.0 - 1e-6);
    float a = 1.0f - one_minus_sigma_min * t;
    for (int c = 0; c < C; c++)
        for (int j = 0; j < ov; j++)
            x[(size_t)c * L + j] = a * np[(size_t)c * ov + j] + t * prev[(size_t)c * ov + j];
}

static void cpu_euler_cfg(float *x, const float *vc, const float *vu, size_t n, float guidance, float dt)
{
    for (size_t e = 0; e < n; e++) {
        float v = vu[e] + guidance * (vc[e] - vu[e]);
        x[e] = x[e] + dt * v;
    }
}

static void test_step_bit_exact(void **state)
{
    (void)state;
    const int C = 6, L = 53, ov = 17, steps = 7;
    size_t n = (size_t)C * L;
    float table[8]; /* steps + 1 */
    flow_schedule_fill(table, steps, FLOW_DEFAULT_SHIFT);
    /* wide magnitudes so that rounding differences would show */
    float *x = test_rand_array(&rng, n, 3.0f), *np = test_rand_array(&rng, (size_t)C * ov, 2.0f),
          *prev = test_rand_array(&rng, (size_t)C * ov, 5.0f);
    float *dx = upload(x, n), *dnp = upload(np, (size_t)C * ov), *dprev = upload(prev, (size_t)C * ov);
    float *got = malloc(sizeof(float) * n);
    assert_non_null(got);
    const float guidance[] = {1.7f, 0.37f, 3.1f};
    for (int i = 0; i < steps; i++) {
        float *vc = test_rand_array(&rng, n, 10.0f), *vu = test_rand_array(&rng, n, 10.0f);
        float *dvc = upload(vc, n), *dvu = upload(vu, n);
        float t = table[i], dt = table[i + 1] - table[i], s = guidance[i % 3];
        cpu_pin(x, np, prev, C, L, ov, t);
        cpu_euler_cfg(x, vc, vu, n, s, dt);
        assert_int_equal(flow_cuda_pin(dx, dnp, dprev, C, L, ov, t, NULL), 0);
        assert_int_equal(flow_cuda_euler_cfg(dx, dvc, dvu, n, s, dt, NULL), 0);
        assert_int_equal(cuda_stream_sync(NULL), 0);
        assert_int_equal(cuda_memcpy_d2h(got, dx, 4 * n), 0);
        size_t diff = 0;
        for (size_t e = 0; e < n; e++)
            diff += memcmp(&got[e], &x[e], 4) != 0;
        if (diff) printf("step %d: %zu of %zu elements differ in bits\n", i, diff, n);
        assert_int_equal(diff, 0);
        free(vc), free(vu);
        cuda_free(dvc), cuda_free(dvu);
    }
    /* ov = 0 pins nothing */
    assert_int_equal(flow_cuda_pin(dx, dnp, dprev, C, L, 0, 0.5f, NULL), 0);
    assert_int_equal(cuda_memcpy_d2h(got, dx, 4 * n), 0);
    assert_memory_equal(got, x, 4 * n);
    assert_true(flow_cuda_pin(dx, dnp, dprev, C, L, L + 1, 0.5f, NULL) == -EINVAL);
    free(x), free(np), free(prev), free(got);
    cuda_free(dx), cuda_free(dnp), cuda_free(dprev);
}

struct tiny {
    struct dit_model *dm;
    struct dit_workspace *ws;
    struct flow_cuda *fc;
};

#define MAX_L 96

static int tiny_setup(void **state)
{
    const char *g = test_golden_dir();
    if (!g) return 0;
    struct tiny *t = calloc(1, sizeof *t);
    char root[4096];
    snprintf(root, sizeof root, "%s/checkpoint", g);
    if (!t || dit_load(&t->dm, root) < 0 || dit_workspace_alloc(&t->ws, t->dm, MAX_L) < 0 ||
        flow_cuda_create(&t->fc, t->dm, MM3_MATMUL_FP32, MAX_L) < 0) {
        fprintf(stderr, "setup: %s\n", mm3_last_error());
        return -1;
    }
    *state = t;
    return 0;
}

static int tiny_teardown(void **state)
{
    struct tiny *t = *state;
    if (!t) return 0;
    flow_cuda_free(t->fc);
    dit_workspace_free(t->ws);
    dit_free(t->dm);
    free(t);
    return 0;
}

static void window_case(struct tiny *t, int L, int ov, int steps, float guidance, float shift)
{
    int C = t->dm->cfg.in_ch, D = t->dm->cfg.cond_dim;
    size_t n = (size_t)C * L;
    float *cond = test_rand_array(&rng, (size_t)L * D, 1.0f),
          *prev = test_rand_array(&rng, (size_t)C * (ov ? ov : 1), 1.0f);
    float *x_cpu = test_rand_array(&rng, n, 1.0f), *x_gpu = malloc(sizeof(float) * n);
    assert_non_null(x_gpu);
    memcpy(x_gpu, x_cpu, sizeof(float) * n);
    assert_int_equal(
        flow_window_run(t->dm, t->ws, &(struct flow_job){steps, guidance, shift, L, ov, cond, prev, x_cpu}), 0);
    int rc = flow_cuda_window_run(t->fc, &(struct flow_job){steps, guidance, shift, L, ov, cond, prev, x_gpu});
    if (rc < 0) fprintf(stderr, "%s\n", mm3_last_error());
    assert_int_equal(rc, 0);
    double rel = test_rel_error(x_gpu, x_cpu, n);
    printf("window L %d, overlap %d, %d steps, guidance %.2f, shift %.2f: rel %.2e\n", L, ov, steps, guidance,
           (double)shift, rel);
    assert_true(rel <= TOL_WINDOW_FP32);
    for (int c = 0; c < C; c++)
        assert_memory_equal(x_gpu + (size_t)c * L, prev + (size_t)c * ov, sizeof(float) * ov);
    free(cond), free(prev), free(x_cpu), free(x_gpu);
}

static void test_window_tiny_a(void **state)
{
    struct tiny *t = *state;
    if (!t) skip();
    window_case(t, MAX_L, 31, 30, FLOW_DEFAULT_GUIDANCE, FLOW_DEFAULT_SHIFT);
    window_case(t, 40, 0, 4, 1.2f, FLOW_DEFAULT_SHIFT);
    window_case(t, 17, 17, 3, FLOW_DEFAULT_GUIDANCE, FLOW_DEFAULT_SHIFT); /* all pinned */
    window_case(t, MAX_L, 31, 16, FLOW_DEFAULT_GUIDANCE, 2.0f);           /* a shifted schedule */
}

/* CPU latents of one window from noise of amplitude a (deterministic per call order). */
struct fp16_case {
    int L, ov, steps;
    float *cond, *prev, *x0, *ref;
};

static void fp16_case_make(struct tiny *t, struct fp16_case *k, int L, int ov, int steps, float a)
{
    int C = t->dm->cfg.in_ch, D = t->dm->cfg.cond_dim;
    size_t n = (size_t)C * L;
    k->L = L, k->ov = ov, k->steps = steps;
    k->cond = test_rand_array(&rng, (size_t)L * D, 1.0f);
    k->prev = test_rand_array(&rng, (size_t)C * (ov ? ov : 1), a);
    k->x0 = test_rand_array(&rng, n, a);
    k->ref = malloc(sizeof(float) * n);
    assert_non_null(k->ref);
    memcpy(k->ref, k->x0, sizeof(float) * n);
    assert_int_equal(
        flow_window_run(t->dm, t->ws,
                        &(struct flow_job){steps, FLOW_DEFAULT_GUIDANCE, 1.0f, L, ov, k->cond, k->prev, k->ref}),
        0);
}

static void fp16_case_check(struct tiny *t, const struct fp16_case *k, const float *x, const char *what)
{
    double rel = test_rel_error(x, k->ref, (size_t)t->dm->cfg.in_ch * k->L);
    printf("fp16 %s: L %d, overlap %d, %d steps: rel %.2e (bound %.0e)\n", what, k->L, k->ov, k->steps, rel,
           TOL_WINDOW_FP16);
    assert_true(rel <= TOL_WINDOW_FP16);
}

static void fp16_case_free(struct fp16_case *k)
{
    free(k->cond), free(k->prev), free(k->x0), free(k->ref);
}

/* An fp8 window against the CPU: plain noise, and noise beyond fp16's range (the fp16 io
 * GEMMs overflow, the window is rerun with scaled operands as fp16's is). */
static void test_fp8_window(void **state)
{
    struct tiny *t = *state;
    if (!t) skip();
    struct flow_cuda *fc;
    assert_int_equal(flow_cuda_create(&fc, t->dm, MM3_MATMUL_FP8, MAX_L), 0);
    int C = t->dm->cfg.in_ch;
    for (int big = 0; big < 2; big++) {
        struct fp16_case k;
        fp16_case_make(t, &k, 60, 20, 4, big ? FP16_OVERFLOW_NOISE : 1.0f);
        float *x = malloc(sizeof(float) * C * 60);
        assert_non_null(x);
        memcpy(x, k.x0, sizeof(float) * C * 60);
        unsigned long long r0 = dit_cuda_f16_rescues();
        if (flow_cuda_window_run(fc, &(struct flow_job){4, FLOW_DEFAULT_GUIDANCE, 1.0f, 60, 20, k.cond, k.prev, x}) < 0)
            fail_msg("flow_cuda_window_run: %s", mm3_last_error());
        double rel = test_rel_error(x, k.ref, (size_t)C * 60);
        printf("fp8 window%s: rel %.2e (bound %.0e), rescued %llu\n", big ? ", noise beyond fp16's range" : "", rel,
               TOL_WINDOW_FP8, dit_cuda_f16_rescues() - r0);
        assert_true(rel <= TOL_WINDOW_FP8);
        assert_true(dit_cuda_f16_rescues() == r0 + (unsigned long long)big);
        free(x);
        fp16_case_free(&k);
    }
    flow_cuda_free(fc);
}

static void test_fp16_rescue(void **state)
{
    struct tiny *t = *state;
    if (!t) skip();
    struct flow_cuda *fc;
    assert_int_equal(flow_cuda_create(&fc, t->dm, MM3_MATMUL_FP16, MAX_L), 0);
    int C = t->dm->cfg.in_ch;
    struct fp16_case plain, big;
    fp16_case_make(t, &plain, 60, 20, 4, 1.0f);
    fp16_case_make(t, &big, 60, 20, 4, FP16_OVERFLOW_NOISE);
    float *x = malloc(sizeof(float) * C * 60), *y = malloc(sizeof(float) * C * 60);
    assert_true(x && y);

    /* one window at a time */
    unsigned long long r0 = dit_cuda_f16_rescues();
    memcpy(x, plain.x0, sizeof(float) * C * 60);
    assert_int_equal(
        flow_cuda_window_run(fc, &(struct flow_job){4, FLOW_DEFAULT_GUIDANCE, 1.0f, 60, 20, plain.cond, plain.prev, x}),
        0);
    fp16_case_check(t, &plain, x, "window");
    assert_true(dit_cuda_f16_rescues() == r0); /* nothing overflowed */
    memcpy(x, big.x0, sizeof(float) * C * 60);
    assert_int_equal(
        flow_cuda_window_run(fc, &(struct flow_job){4, FLOW_DEFAULT_GUIDANCE, 1.0f, 60, 20, big.cond, big.prev, x}), 0);
    fp16_case_check(t, &big, x, "window, noise beyond fp16's range");
    assert_true(dit_cuda_f16_rescues() == r0 + 1);

    /* both in one batch: the batch is rerun once, both windows right */
    struct flow_batch fb;
    assert_int_equal(flow_cuda_batch_open(fc, 2, &fb), 0);
    memcpy(x, plain.x0, sizeof(float) * C * 60);
    memcpy(y, big.x0, sizeof(float) * C * 60);
    struct flow_job jobs[2] = {{4, FLOW_DEFAULT_GUIDANCE, 1.0f, 60, 20, plain.cond, plain.prev, x},
                               {4, FLOW_DEFAULT_GUIDANCE, 1.0f, 60, 20, big.cond, big.prev, y}};
    int rcs[2] = {-1, -1};
    assert_int_equal(fb.begin(fb.ctx, 2, jobs), 0);
    assert_int_equal(fb.end(fb.ctx, 2, jobs, rcs), 0);
    assert_int_equal(rcs[0], 0);
    assert_int_equal(rcs[1], 0);
    fp16_case_check(t, &plain, x, "batch, plain window");
    fp16_case_check(t, &big, y, "batch, window beyond fp16's range");
    assert_true(dit_cuda_f16_rescues() == r0 + 2);
    fb.close(fb.ctx);

    free(x), free(y);
    fp16_case_free(&plain), fp16_case_free(&big);
    flow_cuda_free(fc);
}

static void test_bad_args(void **state)
{
    struct tiny *t = *state;
    if (!t) skip();
    float x[4] = {0}, c[4] = {0};
    assert_true(flow_cuda_window_run(t->fc, &(struct flow_job){4, 1.7f, 1.0f, MAX_L + 1, 0, c, NULL, x}) == -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "max"));
    assert_true(flow_cuda_window_run(t->fc, &(struct flow_job){0, 1.7f, 1.0f, 1, 0, c, NULL, x}) == -EINVAL);
    assert_true(flow_cuda_window_run(t->fc, &(struct flow_job){4, 1.7f, 0.0f, 1, 0, c, NULL, x}) == -EINVAL);
    assert_true(flow_cuda_window_run(t->fc, &(struct flow_job){4, 1.7f, 1.0f, 3, 4, c, x, x}) == -EINVAL);
    assert_true(flow_cuda_window_run(t->fc, &(struct flow_job){4, 1.7f, 1.0f, 3, 2, c, NULL, x}) == -EINVAL);
}

int main(void)
{
    if (cuda_device_count_safe() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_bit_exact),
        cmocka_unit_test_setup_teardown(test_window_tiny_a, tiny_setup, tiny_teardown),
        cmocka_unit_test_setup_teardown(test_fp16_rescue, tiny_setup, tiny_teardown),
        cmocka_unit_test_setup_teardown(test_fp8_window, tiny_setup, tiny_teardown),
        cmocka_unit_test_setup_teardown(test_bad_args, tiny_setup, tiny_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
    printf("built without CUDA (MM3_HAVE_CUDA undefined): skipped\n");
    return 77;
}

#endif
