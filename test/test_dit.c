/* DiT: partial half-split RoPE on a hand case, cos-first time features, batching,
 * and the two recorded DiT calls of tiny-a. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/ops.h"
#include "common/safetensors.h"
#include "stage1/dit.h"
#include "stage1/flow.h"
#include "support/test_support.h"

static char ckpt[1024];

static int setup(void **state)
{
    const char *g = test_golden_dir();
    if (!g) return 0;
    snprintf(ckpt, sizeof ckpt, "%s/checkpoint", g);
    struct dit_model *m;
    if (dit_load(&m, ckpt) < 0) {
        fprintf(stderr, "dit_load: %s\n", mm3_last_error());
        return -1;
    }
    *state = m;
    return 0;
}

static int teardown(void **state)
{
    dit_free(*state);
    return 0;
}

/* Head of 8 dims, rotary 4 (two pairs), theta 1e4 -> inv_freq {1, 0.01}; position 1. */
static void test_rope_half_split(void **state)
{
    (void)state;
    float inv[2];
    op_rope_inv_freq(inv, 1e4, 4);
    assert_true(inv[0] == 1.0f && fabsf(inv[1] - 0.01f) < 1e-9f);
    float u[16] = {1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, -8};
    int pos[1] = {1};
    op_rope(u, 1, 16, 2, 8, 4, pos, inv);
    float c1 = cosf(1.0f), s1 = sinf(1.0f), c2 = cosf(0.01f), s2 = sinf(0.01f);
    /* pairs are (0,2) and (1,3): the first half rotates against the second half */
    float want[8] = {1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2, 5, 6, 7, 8};
    for (int h = 0; h < 2; h++)
        for (int d = 0; d < 8; d++)
            assert_float_equal(u[h * 8 + d], (h ? -1 : 1) * want[d], 1e-6);
    /* position 0 (the time token) is left alone */
    float w0[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    pos[0] = 0;
    op_rope(w0, 1, 8, 1, 8, 4, pos, inv);
    for (int d = 0; d < 8; d++)
        assert_true(w0[d] == (float)(d + 1));
}

static void test_time_features(void **state)
{
    struct dit_model *m = *state;
    if (!m) skip();
    int F = m->cfg.fourier_dim, half = F / 2;
    float *f = malloc(sizeof(float) * F);
    dit_time_features(m, 0.0f, f);
    for (int k = 0; k < half; k++) {
        assert_true(f[k] == 1.0f); /* cos first */
        assert_true(f[half + k] == 0.0f);
    }
    dit_time_features(m, 0.3f, f);
    for (int k = 0; k < half; k++) {
        double ang = 2.0 * M_PI * 0.3 * m->w.time_proj[k];
        assert_float_equal(f[k], cos(ang), 1e-5);
        assert_float_equal(f[half + k], sin(ang), 1e-5);
    }
    free(f);
}

static void test_batch_equals_single(void **state)
{
    struct dit_model *m = *state;
    if (!m) skip();
    int L = 37, C = m->cfg.in_ch, Cd = m->cfg.cond_dim;
    size_t n = (size_t)C * L;
    float *x = malloc(sizeof(float) * 2 * n), *v2 = malloc(sizeof(float) * 2 * n), *v1 = malloc(sizeof(float) * n);
    float *cond = malloc(sizeof(float) * L * Cd);
    uint32_t s = 12345;
    for (size_t i = 0; i < 2 * n; i++)
        x[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < (size_t)L * Cd; i++)
        cond[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f;
    struct dit_workspace *ws;
    assert_int_equal(dit_workspace_alloc(&ws, m, L), 0);
    float t[2] = {0.25f, 0.75f};
    const float *conds[2] = {cond, NULL};
    assert_int_equal(dit_forward(m, ws, 2, L, x, t, conds, v2), 0);
    assert_int_equal(dit_forward(m, ws, 1, L, x, t, conds, v1), 0);
    assert_memory_equal(v1, v2, sizeof(float) * n);
    assert_int_equal(dit_forward(m, ws, 1, L, x + n, t + 1, NULL, v1), 0);
    assert_memory_equal(v1, v2 + n, sizeof(float) * n);
    /* the conditioning matters: zero vs cond differ */
    assert_int_equal(dit_forward(m, ws, 1, L, x, t, NULL, v1), 0);
    assert_true(test_rel_error(v1, v2, n) > 1e-3);
    assert_true(dit_forward(m, ws, 1, L + 1, x, t, NULL, v1) < 0); /* over the workspace */
    dit_workspace_free(ws);
    free(x), free(v2), free(v1), free(cond);
}

static void check_call(struct dit_model *m, struct st_file *f, int call)
{
    char key[64];
    float *hs, *ts, *ehs, *out;
    int nd;
    int64_t sh[ST_MAX_DIMS];
#define LOAD(var, suffix)                                                                                              \
    snprintf(key, sizeof key, "dit_call.%d.%s", call, suffix);                                                         \
    assert_int_equal(st_file_load_f32(f, key, &var, &nd, sh), 0)
    LOAD(ts, "timestep");
    LOAD(ehs, "encoder_hidden_states");
    LOAD(out, "out");
    LOAD(hs, "hidden_states");
#undef LOAD
    assert_int_equal(nd, 3);
    assert_int_equal(sh[1], m->cfg.in_ch);
    int L = (int)sh[2];
    struct dit_workspace *ws;
    assert_int_equal(dit_workspace_alloc(&ws, m, L), 0);
    float *v = malloc(sizeof(float) * m->cfg.in_ch * L);
    const float *conds[1] = {ehs};
    assert_int_equal(dit_forward(m, ws, 1, L, hs, ts, conds, v), 0);
    double rel = test_rel_error(v, out, (size_t)m->cfg.in_ch * L);
    printf("dit_call.%d (L=%d, t=%g): rel %.3g\n", call, L, ts[0], rel);
    assert_true(rel <= 1e-4);
    dit_workspace_free(ws);
    free(v), free(hs), free(ts), free(ehs), free(out);
}

static void test_golden_calls(void **state)
{
    struct dit_model *m = *state;
    if (!m) skip();
    char path[1200];
    snprintf(path, sizeof path, "%s/case0.safetensors", test_golden_dir());
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    check_call(m, &f, 0);
    check_call(m, &f, 1);
    st_file_close(&f);
}

/* docs/model.md §8.1, N = 30: t_i = fp32(1 - fp32(sigma_i)), not fp32(i/N) (constants to 9
 * significant digits, enough to name one float). */
static void test_flow_schedule(void **state)
{
    (void)state;
    float t[31];
    flow_schedule_fill(t, 30, FLOW_DEFAULT_SHIFT);
    assert_true(t[0] == 0.0f && t[30] == 1.0f);
    assert_true(t[1] == 0.0333333611f && t[2] == 0.0666666627f && t[3] == 0.100000024f && t[29] == 0.966666639f);
    assert_true(t[1] != 1.0f / 30.0f);
    int differ = 0, n_small = 0, n_big = 0;
    double sum = 0;
    for (int i = 0; i < 30; i++) {
        differ += t[i] != (float)i / 30.0f;
        float dt = t[i + 1] - t[i];
        n_small += dt == 0.0333333015f;
        n_big += dt == 0.0333333611f;
        assert_true(fabsf(t[i] - (float)i / 30.0f) <= 6.0e-8f);
        sum += dt;
    }
    printf("N=30: %d of 30 t differ from fp32(i/N); dt: %d x 0.033333302, %d x 0.033333361\n", differ, n_small, n_big);
    assert_int_equal(differ, 13);
    assert_int_equal(n_small + n_big, 30); /* only the two values */
    assert_true(t[1] - t[0] == 0.0333333611f && t[30] - t[29] == 0.0333333611f);
    assert_true(sum == 1.0); /* the steps telescope exactly */
    /* one step: t = 0 then straight to 1 */
    flow_schedule_fill(t, 1, FLOW_DEFAULT_SHIFT);
    assert_true(t[0] == 0.0f && t[1] == 1.0f);
}

/* diffusers' shift: sigma' = s sigma / (1 + (s - 1) sigma) on the float32 sigmas, t = 1 - sigma'.
 * N = 4, s = 3 by hand: sigma 1, 3/4, 1/2, 1/4 -> sigma' 1, 0.9, 0.75, 0.5 -> t 0, 0.1, 0.25, 0.5.
 * The N = 16 / s = 2 and N = 20 / s = 1.5 constants are the same float32 operations carried out
 * elsewhere (to 9 significant digits); every t is within 1.1e-7 of the formula in double. */
static void test_flow_schedule_shift(void **state)
{
    (void)state;
    float t[31], u[31];
    flow_schedule_fill(t, 4, 3.0f);
    assert_true(t[0] == 0.0f && t[1] == 0.100000024f && t[2] == 0.25f && t[3] == 0.5f && t[4] == 1.0f);
    flow_schedule_fill(t, 16, 2.0f);
    assert_true(t[1] == 0.0322580934f && t[7] == 0.279999971f && t[12] == 0.600000024f && t[15] == 0.882352948f);
    flow_schedule_fill(t, 20, 1.5f);
    assert_true(t[1] == 0.0338983536f && t[3] == 0.105263054f && t[12] == 0.5f && t[19] == 0.926829278f);
    static const struct {
        int n;
        float s;
    } cases[] = {{16, 2.0f}, {20, 1.5f}, {30, 3.0f}, {30, 0.5f}, {7, 20.0f}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int n = cases[c].n;
        double s = cases[c].s;
        flow_schedule_fill(t, n, cases[c].s);
        assert_true(t[0] == 0.0f && t[n] == 1.0f);
        for (int i = 0; i < n; i++) {
            double sigma = n > 1 ? 1.0 - (double)i * (1.0 - 1.0 / n) / (n - 1) : 1.0;
            double want = 1.0 - s * sigma / (1.0 + (s - 1.0) * sigma);
            assert_true(fabs((double)t[i] - want) <= 1.1e-7);
            assert_true(t[i + 1] > t[i]); /* x still moves from noise to data */
        }
    }
    /* shift 1 is the unshifted schedule bit for bit (the golden replays rely on it) */
    flow_schedule_fill(t, 30, 1.0f);
    double start = 1.0, stop = 1.0 / 30, step = (stop - start) / 29;
    for (int i = 0; i < 30; i++)
        u[i] = 1.0f - (float)(i == 29 ? stop : (double)i * step + start);
    u[30] = 1.0f;
    assert_memory_equal(t, u, sizeof(float) * 31);
}

static void write_scheduler_config(const char *dir, const char *json)
{
    char p[512];
    snprintf(p, sizeof p, "%s/scheduler", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/scheduler/scheduler_config.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
}

/* The checkpoint's shift: scheduler_config.json's `shift`, 1.0 without the folder or the key;
 * a malformed file or a shift out of (0, 20] is an error naming the file. */
static void test_flow_checkpoint_shift(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("flowshift");
    float s = -1.0f;
    assert_int_equal(flow_checkpoint_shift(dir, &s), 0);
    assert_true(s == 1.0f);
    write_scheduler_config(dir, "{\"num_train_timesteps\": 1}");
    assert_int_equal(flow_checkpoint_shift(dir, &s), 0);
    assert_true(s == 1.0f);
    write_scheduler_config(dir, "{\"shift\": 2.5, \"invert_sigmas\": true}");
    assert_int_equal(flow_checkpoint_shift(dir, &s), 0);
    assert_true(s == 2.5f);
    static const char *const bad[] = {"{\"shift\": 0}",     "{\"shift\": -1}", "{\"shift\": 21}",
                                      "{\"shift\": \"2\"}", "{\"shift\": 2",   "[1]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_scheduler_config(dir, bad[i]);
        assert_int_equal(flow_checkpoint_shift(dir, &s), -EINVAL);
        assert_non_null(strstr(mm3_last_error(), "scheduler_config.json"));
    }
    test_remove_tree(dir);
    free(dir);
}

/* After dit_drop_weights the config stays and a forward is refused, not run on freed memory. */
static void test_drop_weights(void **state)
{
    (void)state;
    if (!test_golden_dir()) skip();
    struct dit_model *m;
    assert_int_equal(dit_load(&m, ckpt), 0);
    struct dit_config cfg = m->cfg;
    dit_drop_weights(m);
    assert_memory_equal(&m->cfg, &cfg, sizeof cfg);
    assert_null(m->arena);
    struct dit_workspace *ws;
    int L = 4;
    assert_int_equal(dit_workspace_alloc(&ws, m, L), 0);
    size_t n = (size_t)cfg.in_ch * L;
    float *x = calloc(n, sizeof(float)), *v = calloc(n, sizeof(float));
    float t = 0.5f;
    assert_int_equal(dit_forward(m, ws, 1, L, x, &t, NULL, v), -ENODATA);
    assert_non_null(strstr(mm3_last_error(), "dropped"));
    free(x), free(v);
    dit_workspace_free(ws);
    dit_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_half_split),       cmocka_unit_test(test_time_features),
        cmocka_unit_test(test_batch_equals_single),   cmocka_unit_test(test_golden_calls),
        cmocka_unit_test(test_flow_schedule),         cmocka_unit_test(test_flow_schedule_shift),
        cmocka_unit_test(test_flow_checkpoint_shift), cmocka_unit_test(test_drop_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
