/* Bounds of the stage-1 golden replay (stage1/golden_bounds.h): the tiny bounds per
 * backend and precision, widened on the GPU to 1.25x PyTorch's own deviation read from a
 * yardsticks.json; a replay figure that fails the tiny bound passes under the yardstick
 * bound; the CPU's float32 bounds never move; a malformed file is an error naming the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/error.h"
#include "stage1/golden.h"
#include "stage1/golden_bounds.h"
#include "support/test_support.h"

static char *write_file(const char *dir, const char *name, const char *text)
{
    char *path = malloc(4096);
    assert_non_null(path);
    snprintf(path, 4096, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* PyTorch's figures at a release-like geometry (tf32 audio above the tiny 2e-3 bound). */
static const char *const yardsticks = "{\"reference\": \"float32\", \"precisions\": {"
                                      "\"tf32\": {\"dit_call\": {\"rel\": 1.2e-3, \"snr_db\": 58.4},"
                                      "          \"latents\": {\"rel\": 3.0e-3, \"snr_db\": 50.5},"
                                      "          \"audio\": {\"rel\": 4.82e-3, \"snr_db\": 46.3}},"
                                      "\"bf16\": {\"audio\": {\"rel\": 3.7e-2, \"snr_db\": 28.6}},"
                                      "\"fp16\": {\"audio\": {\"rel\": null, \"snr_db\": null}},"
                                      "\"bf16-naive\": {\"audio\": {\"rel\": 5e-2, \"snr_db\": 26}}}}";

static void test_tiny_bounds(void **state)
{
    (void)state;
    struct golden_bounds b;
    for (int p = 0; p < MM3_MATMUL_COUNT; p++) {
        golden_bounds_tiny(&b, MM3_BACKEND_CPU, (enum mm3_matmul_precision)p);
        for (int q = 0; q < GOLDEN_Q_COUNT; q++) {
            assert_true(b.bound[q] == GOLDEN_REL_TOL);
            assert_true(b.yardstick[q] < 0);
        }
    }
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_FP32);
    assert_true(b.bound[GOLDEN_Q_AUDIO] == GOLDEN_REL_TOL);
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_TF32);
    assert_true(b.bound[GOLDEN_Q_DIT_CALL] == GOLDEN_REL_TOL_FWD_TF32);
    assert_true(b.bound[GOLDEN_Q_LATENTS] == GOLDEN_REL_TOL_FLOW_TF32);
    assert_true(b.bound[GOLDEN_Q_AUDIO] == GOLDEN_REL_TOL_AUDIO_TF32);
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_FP16);
    assert_true(b.bound[GOLDEN_Q_AUDIO] == GOLDEN_REL_TOL_AUDIO_FP16);
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_FP8);
    assert_true(b.bound[GOLDEN_Q_DIT_CALL] == GOLDEN_REL_TOL_FWD_FP8);
    assert_true(b.bound[GOLDEN_Q_LATENTS] == GOLDEN_REL_TOL_FLOW_FP8);
    assert_true(b.bound[GOLDEN_Q_AUDIO] == GOLDEN_REL_TOL_AUDIO_FP8);
    assert_string_equal(golden_quantity_name(GOLDEN_Q_LATENTS), "latents");
}

static void test_rule(void **state)
{
    (void)state;
    assert_true(golden_bound_with_yardstick(2e-3, -1) == 2e-3);
    assert_true(golden_bound_with_yardstick(2e-3, 1e-3) == 2e-3); /* 1.25e-3 < tiny */
    assert_true(golden_bound_with_yardstick(2e-3, 4e-3) == 1.25 * 4e-3);
}

static void test_yardstick_widens_the_gpu_bound(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("golden_bounds");
    char *path = write_file(dir, "yardsticks.json", yardsticks);
    /* mm3 tf32 at the release geometry: audio 4.90e-3, as close to float32 as PyTorch's TF32 */
    double replay_audio = 4.90e-3, replay_latents = 2.5e-3, replay_dit = 1.0e-3;
    struct golden_bounds b;
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_TF32);
    assert_false(replay_audio <= b.bound[GOLDEN_Q_AUDIO]); /* fails the tiny bound */
    assert_false(replay_latents <= b.bound[GOLDEN_Q_LATENTS]);
    assert_int_equal(golden_bounds_apply_yardsticks(&b, path, MM3_MATMUL_TF32), 0);
    assert_true(replay_audio <= b.bound[GOLDEN_Q_AUDIO]); /* passes at 1.25 x 4.82e-3 */
    assert_true(replay_latents <= b.bound[GOLDEN_Q_LATENTS]);
    assert_true(replay_dit <= b.bound[GOLDEN_Q_DIT_CALL]);
    assert_float_equal(b.bound[GOLDEN_Q_AUDIO], 1.25 * 4.82e-3, 1e-12);
    assert_float_equal(b.yardstick[GOLDEN_Q_AUDIO], 4.82e-3, 1e-12);
    /* PyTorch's tf32 DiT call 1.2e-3 x 1.25 is below the tiny 2e-3: the tiny bound holds */
    assert_true(b.bound[GOLDEN_Q_DIT_CALL] == GOLDEN_REL_TOL_FWD_TF32);
    /* still bounded: worse than 1.25x PyTorch fails */
    assert_false(1.3 * 4.82e-3 <= b.bound[GOLDEN_Q_AUDIO]);

    /* bf16 lists only audio; the other quantities keep their tiny bounds */
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_BF16);
    assert_int_equal(golden_bounds_apply_yardsticks(&b, path, MM3_MATMUL_BF16), 0);
    assert_float_equal(b.bound[GOLDEN_Q_AUDIO], 1.25 * 3.7e-2, 1e-12);
    assert_true(b.bound[GOLDEN_Q_LATENTS] == GOLDEN_REL_TOL_FLOW_BF16);
    /* fp16's PyTorch run overflowed (null): no yardstick, the tiny bound */
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_FP16);
    assert_int_equal(golden_bounds_apply_yardsticks(&b, path, MM3_MATMUL_FP16), 0);
    assert_true(b.bound[GOLDEN_Q_AUDIO] == GOLDEN_REL_TOL_AUDIO_FP16);
    assert_true(b.yardstick[GOLDEN_Q_AUDIO] < 0);
    /* PyTorch has no fp8 run: no yardstick, the tiny bound */
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_FP8);
    assert_int_equal(golden_bounds_apply_yardsticks(&b, path, MM3_MATMUL_FP8), 0);
    assert_true(b.bound[GOLDEN_Q_AUDIO] == GOLDEN_REL_TOL_AUDIO_FP8);
    assert_true(b.yardstick[GOLDEN_Q_AUDIO] < 0);
    /* fp32 is not listed: 1e-4 everywhere */
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_FP32);
    assert_int_equal(golden_bounds_apply_yardsticks(&b, path, MM3_MATMUL_FP32), 0);
    assert_true(b.bound[GOLDEN_Q_AUDIO] == GOLDEN_REL_TOL);
    free(path);
    test_remove_tree(dir);
    free(dir);
}

static void test_malformed_yardsticks(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("golden_bounds_bad");
    static const char *const bad[][2] = {
        {"{\"precisions\": {\"tf32\": {\"audio\": {\"rel\": -1}}}}", "precisions.tf32.audio.rel"},
        {"{\"precisions\": {\"tf32\": {\"audio\": {\"rel\": \"x\"}}}}", "precisions.tf32.audio.rel"},
        {"{\"precisions\": {\"tf32\": {\"audio\": 3}}}", "precisions.tf32.audio.rel"},
        {"{\"precisions\": {\"tf32\": []}}", "precisions.tf32"},
        {"{\"precisions\": 1}", "precisions"},
        {"{\"precisions\": ", "yardsticks.json"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *path = write_file(dir, "yardsticks.json", bad[i][0]);
        struct golden_bounds b;
        golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_TF32);
        assert_true(golden_bounds_apply_yardsticks(&b, path, MM3_MATMUL_TF32) < 0);
        assert_non_null(strstr(mm3_last_error(), bad[i][1]));
        assert_true(b.bound[GOLDEN_Q_AUDIO] == GOLDEN_REL_TOL_AUDIO_TF32);
        free(path);
    }
    struct golden_bounds b;
    golden_bounds_tiny(&b, MM3_BACKEND_CUDA, MM3_MATMUL_TF32);
    assert_true(golden_bounds_apply_yardsticks(&b, "/nonexistent/yardsticks.json", MM3_MATMUL_TF32) < 0);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_bounds),
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_yardstick_widens_the_gpu_bound),
        cmocka_unit_test(test_malformed_yardsticks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
