/* Philox4x32-10 + Box-Muller noise and BLAKE2b seed derivation (common/noise.h). */
#include "common/noise.h"

#include <blake2.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"

void noise_philox4x32(uint32_t out[4], const uint32_t counter[4], const uint32_t key[2])
{
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t noise_seed_derive_parts(uint64_t seed, const char *const *parts, int n_parts)
{
    blake2b_param P;
    memset(&P, 0, sizeof P);
    P.digest_length = 8;
    P.fanout = 1;
    P.depth = 1;
    memcpy(P.personal, "minimax-ttm", 11);
    blake2b_state S;
    CHECK(blake2b_init_param(&S, &P) == 0);
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(seed >> (8 * i));
    blake2b_update(&S, b, 8);
    for (int p = 0; p < n_parts; p++) {
        size_t n = strlen(parts[p]);
        put_le32(b, (uint32_t)n);
        blake2b_update(&S, b, 4);
        blake2b_update(&S, (const uint8_t *)parts[p], n);
    }
    uint8_t d[8];
    CHECK(blake2b_final(&S, d, 8) == 0);
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)d[i] << (8 * i);
    return v & 0x7fffffffffffffffull;
}

uint64_t noise_seed_window(uint64_t seed, int window)
{
    char idx[16];
    snprintf(idx, sizeof idx, "%d", window);
    const char *parts[2] = {"dit", idx};
    return noise_seed_derive_parts(seed, parts, 2);
}

float noise_gaussian_at(uint64_t seed, uint64_t index)
{
    uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    noise_philox4x32(r, ctr, key);
    /* 53-bit uniforms strictly inside (0, 1): log(u1) is finite. */
    uint64_t a = ((uint64_t)r[1] << 32) | r[0];
    uint64_t b = ((uint64_t)r[3] << 32) | r[2];
    double u1 = ((double)(a >> 11) + 0.5) * 0x1p-53;
    double u2 = ((double)(b >> 11) + 0.5) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void noise_gaussian_fill(float *out, size_t n, uint64_t seed, uint64_t first)
{
    for (size_t i = 0; i < n; i++)
        out[i] = noise_gaussian_at(seed, first + i);
}
