/* Condition encoder: PyTorch's float32 nearest-index rule at every length the spec lists,
 * latent lengths, the slot mix against a slot-by-slot reference, the projection against
 * tiny-a, and bad frames. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/safetensors.h"
#include "stage1/condition.h"
#include "support/test_support.h"

/* The release's rates (docs/model.md §2). */
static const struct condition_config release = {4096, 8, 2048, 24000, 960, 44100, 512};

/* docs/model.md §6.3: the 23 (F, j) where the float32 index is one below floor(j F / L). */
static const struct {
    int F, L, j;
} table[] = {
    {32, 110, 55},   {48, 165, 55},   {48, 165, 110},  {64, 220, 55},   {64, 220, 110},  {80, 275, 55},
    {80, 275, 110},  {80, 275, 220},  {82, 282, 141},  {96, 330, 55},   {96, 330, 110},  {96, 330, 220},
    {112, 385, 55},  {112, 385, 110}, {112, 385, 220}, {118, 406, 203}, {123, 423, 141}, {123, 423, 282},
    {150, 516, 430}, {175, 602, 430}, {177, 609, 203}, {177, 609, 406}, {190, 654, 327},
};

static void test_latent_len(void **state)
{
    (void)state;
    assert_int_equal(condition_latent_len(&release, 200), 689);
    assert_int_equal(condition_latent_len(&release, 100), 344);
    assert_int_equal(condition_latent_len(&release, 101), 347);
    assert_int_equal(condition_latent_len(&release, 125), 430);
    assert_int_equal(condition_latent_len(&release, 150), 516);
    assert_int_equal(condition_latent_len(&release, 199), 685);
    assert_int_equal(condition_latent_len(&release, 0), 1); /* max(1, .) */
    for (int F = 1; F <= 9000; F++)
        assert_int_equal(condition_latent_len(&release, F), (int)((int64_t)F * 441 / 128));
}

static void test_nearest_table(void **state)
{
    (void)state;
    size_t n = sizeof table / sizeof table[0];
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(condition_latent_len(&release, table[i].F), table[i].L);
        int exact = (int)((int64_t)table[i].j * table[i].F / table[i].L);
        assert_int_equal(condition_nearest_index(table[i].F, table[i].L, table[i].j), exact - 1);
    }
    /* ...and nowhere else for F <= 200: the list is complete */
    size_t found = 0;
    for (int F = 1; F <= 200; F++) {
        int L = condition_latent_len(&release, F);
        for (int j = 0; j < L; j++) {
            int exact = (int)((int64_t)j * F / L);
            int got = condition_nearest_index(F, L, j);
            if (got == exact) continue;
            assert_int_equal(got, exact - 1);
            int listed = 0;
            for (size_t i = 0; i < n; i++)
                listed |= table[i].F == F && table[i].j == j;
            assert_true(listed);
            found++;
        }
    }
    assert_int_equal(found, n);
    for (int j = 0; j < 689; j++)
        assert_int_equal(condition_nearest_index(200, 689, j), j * 200 / 689);
    assert_int_equal(condition_nearest_index(3, 1, 0), 0);
}

static struct condition_model *load_tiny(void)
{
    const char *g = test_golden_dir();
    if (!g) return NULL;
    char root[1024];
    snprintf(root, sizeof root, "%s/checkpoint", g);
    struct condition_model *m;
    if (condition_load(&m, root) < 0) fail_msg("condition_load: %s", mm3_last_error());
    return m;
}

static void test_mix_slotwise(void **state)
{
    (void)state;
    struct condition_model *m = load_tiny();
    if (!m) skip();
    const char *g = test_golden_dir();
    char path[1200];
    snprintf(path, sizeof path, "%s/checkpoint/condition_encoder/diffusion_pytorch_model.safetensors", g);
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    int Lr = m->cfg.n_layers, H = m->cfg.hidden, n = 7;
    float logits[64], scale;
    assert_int_equal(st_file_read_f32(&f, "layer_weight_logits", logits, 1, (int64_t[]){Lr}), 0);
    assert_int_equal(st_file_read_f32(&f, "layer_scale", &scale, 1, (int64_t[]){1}), 0);
    st_file_close(&f);
    double mx = -INFINITY, z = 0, w[64];
    for (int l = 0; l < Lr; l++)
        mx = fmax(mx, logits[l]);
    for (int l = 0; l < Lr; l++)
        z += w[l] = exp(logits[l] - mx);
    float *frames = malloc(sizeof(float) * n * Lr * H), *mixed = malloc(sizeof(float) * n * H);
    for (int i = 0; i < n * Lr * H; i++)
        frames[i] = sinf(0.37f * i) * (1 + i % 5);
    assert_int_equal(condition_mix(m, frames, n, Lr * H, mixed), 0);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < H; c++) {
            double s = 0; /* slot l holds frame values [l*H, (l+1)*H) */
            for (int l = 0; l < Lr; l++)
                s += w[l] / z * frames[(size_t)t * Lr * H + l * H + c];
            assert_float_equal(mixed[t * H + c], scale * s, 1e-5 * (1 + fabs(scale * s)));
        }
    /* already-mixed frames pass through */
    float *again = malloc(sizeof(float) * n * H);
    assert_int_equal(condition_mix(m, mixed, n, H, again), 0);
    assert_memory_equal(again, mixed, sizeof(float) * n * H);
    /* wrong width, NaN */
    assert_true(condition_mix(m, frames, n, Lr * H - 1, again) == -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "width"));
    frames[3 * Lr * H + 5] = NAN;
    assert_true(condition_mix(m, frames, n, Lr * H, again) == -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "frame 3"));
    free(frames), free(mixed), free(again);
    condition_free(m);
}

static void test_project_golden(void **state)
{
    (void)state;
    struct condition_model *m = load_tiny();
    if (!m) skip();
    char path[1200];
    snprintf(path, sizeof path, "%s/case1.safetensors", test_golden_dir());
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    for (int w = 0; w < 3; w++) { /* two full windows and a 150-frame one (L = 516, a listed length) */
        char k[64];
        float *fr, *want;
        int nd;
        int64_t sh[ST_MAX_DIMS], shw[ST_MAX_DIMS];
        snprintf(k, sizeof k, "window.%d.frame_hiddens", w);
        assert_int_equal(st_file_load_f32(&f, k, &fr, &nd, sh), 0);
        snprintf(k, sizeof k, "window.%d.condition", w);
        assert_int_equal(st_file_load_f32(&f, k, &want, &nd, shw), 0);
        int F = (int)sh[0], L = condition_latent_len(&m->cfg, F);
        assert_int_equal(L, shw[0]);
        float *mixed = malloc(sizeof(float) * F * m->cfg.hidden), *cond = malloc(sizeof(float) * L * m->cfg.out_dim);
        assert_int_equal(condition_mix(m, fr, F, (int)sh[1], mixed), 0);
        assert_int_equal(condition_project(m, mixed, F, cond), 0);
        double rel = test_rel_error(cond, want, (size_t)L * m->cfg.out_dim);
        printf("window %d: F=%d L=%d rel %.3g\n", w, F, L, rel);
        assert_true(rel <= 1e-5);
        free(fr), free(want), free(mixed), free(cond);
    }
    st_file_close(&f);
    condition_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_latent_len),
        cmocka_unit_test(test_nearest_table),
        cmocka_unit_test(test_mix_slotwise),
        cmocka_unit_test(test_project_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
