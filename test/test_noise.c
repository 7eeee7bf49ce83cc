/* Seeded noise: BLAKE2b seed vectors, Philox4x32-10 known answers, determinism, moments. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/noise.h"

static void test_seed_vectors(void **state)
{
    (void)state;
    /* SGLang-Omni acoustic seeds (docs/model.md §5) */
    assert_true(noise_seed_window(3, 0) == 1648571301556962109ull);
    assert_true(noise_seed_window(3, 1) == 5080984550091710395ull);
    const char *parts[2] = {"dit", "1"};
    assert_true(noise_seed_derive_parts(3, parts, 2) == 5080984550091710395ull);
    assert_true(noise_seed_window(4, 0) != noise_seed_window(3, 0));
    for (int k = 0; k < 100; k++)
        assert_true(noise_seed_window(12345, k) >> 63 == 0);
}

/* Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds). */
static void test_philox_kat(void **state)
{
    (void)state;
    uint32_t o[4];
    uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    noise_philox4x32(o, c0, k0);
    assert_true(o[0] == 0x6627e8d5u && o[1] == 0xe169c58du && o[2] == 0xbc57ac4cu && o[3] == 0x9b00dbd8u);
    uint32_t c1[4] = {~0u, ~0u, ~0u, ~0u}, k1[2] = {~0u, ~0u};
    noise_philox4x32(o, c1, k1);
    assert_true(o[0] == 0x408f276du && o[1] == 0x41c83b0eu && o[2] == 0xa20bc7c6u && o[3] == 0x6d5451fdu);
    uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, k2[2] = {0xa4093822u, 0x299f31d0u};
    noise_philox4x32(o, c2, k2);
    assert_true(o[0] == 0xd16cfe09u && o[1] == 0x94fdccebu && o[2] == 0x5001e420u && o[3] == 0x24126ea1u);
}

static void test_deterministic(void **state)
{
    (void)state;
    enum { N = 4096 };
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    uint64_t s = noise_seed_window(7, 2);
    noise_gaussian_fill(a, N, s, 0);
    noise_gaussian_fill(b, N, s, 0);
    assert_memory_equal(a, b, sizeof(float) * N);
    /* element i depends only on (seed, i): a slice starting later sees the same values */
    noise_gaussian_fill(b, 100, s, 1000);
    assert_memory_equal(a + 1000, b, sizeof(float) * 100);
    assert_true(noise_gaussian_at(s, 17) == a[17]);
    noise_gaussian_fill(b, N, noise_seed_window(7, 3), 0);
    int same = 0;
    for (int i = 0; i < N; i++)
        same += a[i] == b[i];
    assert_true(same < 4);
    free(a), free(b);
}

static void test_moments(void **state)
{
    (void)state;
    enum { N = 100000 };
    float *a = malloc(sizeof(float) * N);
    noise_gaussian_fill(a, N, noise_seed_window(0, 0), 0);
    double m = 0, v = 0, m4 = 0;
    int tail = 0;
    for (int i = 0; i < N; i++) {
        assert_true(isfinite(a[i]));
        m += a[i];
    }
    m /= N;
    for (int i = 0; i < N; i++) {
        double d = a[i] - m;
        v += d * d;
        m4 += d * d * d * d;
        tail += fabs(a[i]) > 1.959964;
    }
    v /= N;
    m4 /= N;
    /* standard errors: mean 0.0032, variance 0.0045, kurtosis ~0.015, tail share 0.0007 */
    assert_true(fabs(m) < 0.02);
    assert_true(fabs(v - 1) < 0.03);
    assert_true(fabs(m4 / (v * v) - 3) < 0.1);
    assert_true(fabs(tail / (double)N - 0.05) < 0.005);
    free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seed_vectors),
        cmocka_unit_test(test_philox_kat),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_moments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
