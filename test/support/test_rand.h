/* Deterministic pseudo-random inputs for tests: splitmix64 over a state the test
 * program holds, so each program keeps its own seeds and sequences (some tolerances
 * and expectations were settled on them):
 *
 *     static uint64_t rng = 0x5eedull;
 *     float *x = test_rand_array(&rng, n, 0.5f);
 *
 * Header only (static inline): test/CMakeLists.txt links just test_support.c into
 * each test. */
#ifndef MM3_TEST_RAND_H
#define MM3_TEST_RAND_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>

/* The next 64 random bits (splitmix64). */
static inline uint64_t test_rand_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a) on a grid of 2^24 steps: the top 24 bits, exact in float. */
static inline float test_rand_uniform(uint64_t *state, float a)
{
    return a * ((float)(test_rand_next(state) >> 40) / 8388608.0f - 1.0f);
}

/* n values of test_rand_uniform (at least one element allocated); caller frees. */
static inline float *test_rand_array(uint64_t *state, size_t n, float a)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = test_rand_uniform(state, a);
    return p;
}

#endif
