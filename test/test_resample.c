/* 44.1 -> 32 kHz resampler: equal to torchaudio on a stored fixture, streaming equal to
 * the whole buffer bit for bit whatever the chunking, lengths, DC gain, errors.
 *
 * test/data/resample/torchaudio_resample.safetensors was made with torch 2.15 /
 * torchaudio 2.11 (CPU): for each case X, X.input [C, n] float32 (tanh of a few sines
 * plus Gaussian noise), X.output = torchaudio.functional.resample(X.input, *X.rates)
 * with the defaults, X.rates [in, out] i64. Cases: a (2 x 9000, 44100 -> 32000),
 * b (2 x 441*7, whole blocks), c (1 x 100, shorter than a block), d (1 x 2000,
 * 24000 -> 44100, upsampling). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/resample.h"
#include "common/safetensors.h"
#include "support/test_support.h"

static void fixture_case(struct st_file *f, const char *name)
{
    char key[64];
    float *in, *want, *rates;
    int nd;
    int64_t shp_in[ST_MAX_DIMS], shp_out[ST_MAX_DIMS], shp_r[ST_MAX_DIMS];
    snprintf(key, sizeof key, "%s.input", name);
    assert_int_equal(st_file_load_f32(f, key, &in, &nd, shp_in), 0);
    snprintf(key, sizeof key, "%s.output", name);
    assert_int_equal(st_file_load_f32(f, key, &want, &nd, shp_out), 0);
    snprintf(key, sizeof key, "%s.rates", name);
    assert_int_equal(st_file_load_f32(f, key, &rates, &nd, shp_r), 0);
    int ch = (int)shp_in[0];
    int64_t n = shp_in[1], m = shp_out[1];

    struct resample *r;
    assert_int_equal(resample_create(&r, (int)rates[0], (int)rates[1], ch), 0);
    assert_int_equal(resample_out_len(r, n), m);
    float *got = calloc((size_t)(ch * m), sizeof(float));
    assert_int_equal(resample_buffer(r, in, n, n, got, m), 0);
    double rel = test_rel_error(got, want, (size_t)(ch * m));
    double max_abs = 0;
    for (int64_t i = 0; i < ch * m; i++)
        max_abs = fmax(max_abs, fabs((double)got[i] - want[i]));
    printf("resample case %s (%d -> %d Hz, %d x %lld): rel %.3g, max abs %.3g\n", name, (int)rates[0], (int)rates[1],
           ch, (long long)n, rel, max_abs);
    assert_true(rel <= 1e-5);
    resample_free(r);
    free(got);
    free(in);
    free(want);
    free(rates);
}

static void test_torchaudio_fixture(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/test/data/resample/torchaudio_resample.safetensors", test_source_dir());
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    fixture_case(&f, "a");
    fixture_case(&f, "b");
    fixture_case(&f, "c");
    fixture_case(&f, "d");
    st_file_close(&f);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Stream x [2, n] in chunks drawn from `sizes` (cycled); returns the concatenated output. */
static float *stream_all(struct resample *r, const float *x, int64_t n, const int64_t *sizes, int n_sizes,
                         int64_t *n_total)
{
    int64_t total = resample_out_len(r, n);
    float *y = calloc((size_t)(2 * total + 2), sizeof(float));
    float *tmp = NULL;
    int64_t pos = 0, at = 0;
    resample_stream_reset(r);
    for (int k = 0; pos < n; k++) {
        int64_t m = sizes[k % n_sizes];
        if (m > n - pos) m = n - pos;
        int64_t need = resample_stream_push_len(r, m), got;
        tmp = realloc(tmp, (size_t)(2 * need + 2) * sizeof(float));
        assert_int_equal(resample_stream_push(r, x + pos, n, m, tmp, need, &got), 0);
        assert_int_equal(got, need);
        for (int c = 0; c < 2; c++)
            memcpy(y + c * total + at, tmp + c * need, (size_t)got * sizeof(float));
        at += got;
        pos += m;
    }
    int64_t need = resample_stream_finish_len(r), got;
    tmp = realloc(tmp, (size_t)(2 * need + 2) * sizeof(float));
    assert_int_equal(resample_stream_finish(r, tmp, need, &got), 0);
    assert_int_equal(got, need);
    for (int c = 0; c < 2; c++)
        memcpy(y + c * total + at, tmp + c * need, (size_t)got * sizeof(float));
    at += got;
    free(tmp);
    *n_total = at;
    return y;
}

static void test_stream_equals_buffer(void **state)
{
    (void)state;
    const int64_t lens[] = {1, 9, 440, 441, 450, 451, 882, 20000, 70001};
    uint64_t seed = 7;
    struct resample *r;
    assert_int_equal(resample_create(&r, 44100, 32000, 2), 0);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int64_t n = lens[li];
        float *x = malloc((size_t)(2 * n) * sizeof(float));
        for (int64_t i = 0; i < 2 * n; i++)
            x[i] = (float)((int)(lcg(&seed) % 20001) - 10000) / 10000.0f;
        int64_t m = resample_out_len(r, n);
        float *whole = malloc((size_t)(2 * m) * sizeof(float));
        assert_int_equal(resample_buffer(r, x, n, n, whole, m), 0);
        const int64_t plans[][4] = {
            {1, 1, 1, 1}, {441, 441, 441, 441}, {0, 7, 1000, 3}, {100000, 1, 1, 1}, {440, 442, 13, 29000}};
        for (size_t p = 0; p < sizeof plans / sizeof plans[0]; p++) {
            if (plans[p][0] == 1 && n > 20000) continue; /* sample-by-sample on long input: slow, no new case */
            int64_t got;
            float *y = stream_all(r, x, n, plans[p], 4, &got);
            assert_int_equal(got, m);
            assert_memory_equal(y, whole, (size_t)m * sizeof(float));
            assert_memory_equal(y + m, whole + m, (size_t)m * sizeof(float));
            free(y);
        }
        free(whole);
        free(x);
    }
    resample_free(r);
}

/* A constant signal comes out constant (the filter's DC gain is 1 up to the window
 * ripple) away from the zero-padded edges, and the first output tapers. */
static void test_dc_gain(void **state)
{
    (void)state;
    struct resample *r;
    assert_int_equal(resample_create(&r, 44100, 32000, 1), 0);
    int64_t n = 44100, m = resample_out_len(r, n);
    assert_int_equal(m, 32000);
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)m * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.5f;
    assert_int_equal(resample_buffer(r, x, n, n, y, m), 0);
    for (int64_t i = 100; i < m - 100; i++)
        assert_true(fabsf(y[i] - 0.5f) < 5e-3f);
    /* output 0 sits on input 0: the left half of the filter sees the zero padding,
     * (1/2 + k_centre/2) * 0.5 with k_centre = 0.99 * 320/441 */
    assert_true(y[0] > 0.42f && y[0] < 0.44f);
    free(x);
    free(y);
    resample_free(r);
}

static void test_lengths_and_errors(void **state)
{
    (void)state;
    struct resample *r;
    assert_true(resample_create(&r, 0, 32000, 2) == -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "rates"));
    assert_true(resample_create(&r, 44100, 32000, 0) == -EINVAL);
    assert_int_equal(resample_create(&r, 44100, 32000, 2), 0);
    assert_int_equal(resample_out_len(r, 0), 0);
    assert_int_equal(resample_out_len(r, 1), 1);
    assert_int_equal(resample_out_len(r, 441), 320);
    assert_int_equal(resample_out_len(r, 442), 321);
    assert_int_equal(resample_out_len(r, 44100LL * 360), 32000LL * 360);
    /* a block needs its right context: 441 samples are not enough, 441 + 9 are */
    assert_int_equal(resample_stream_push_len(r, 441), 0);
    assert_int_equal(resample_stream_push_len(r, 450), 320);
    float x[2 * 450] = {0}, y[2 * 320];
    int64_t got;
    assert_int_equal(resample_stream_push(r, x, 450, 450, y, 100, &got), -ENOSPC);
    assert_int_equal(resample_stream_push(r, x, 450, 450, y, 320, &got), 0);
    assert_int_equal(got, 320);
    assert_int_equal(resample_stream_finish_len(r), 327 - 320);
    assert_int_equal(resample_stream_finish(r, y, 320, &got), 0);
    assert_int_equal(got, 7);
    assert_int_equal(resample_stream_push(r, x, 450, 450, y, 320, &got), -EINVAL);
    resample_stream_reset(r);
    assert_int_equal(resample_stream_push(r, x, 450, 450, y, 320, &got), 0);
    resample_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torchaudio_fixture),
        cmocka_unit_test(test_stream_equals_buffer),
        cmocka_unit_test(test_dc_gain),
        cmocka_unit_test(test_lengths_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
