/* The seeded draw's noise, written once for the CPU sampler (common/sampler.c) and the
 * GPU one (common/cuda/sampler_cuda.cu), so that the two draw from the same numbers:
 * MurmurHash3 (x86_32 block mix, fmix32 finaliser) of (seed lo, seed hi, pos, col),
 * and the Gumbel noise made from it in double.
 *
 * Header only: static inline in C, __host__ __device__ under nvcc. Bit-exact on both
 * sides: the hash is integer arithmetic, and the noise has no a*b+c for nvcc to fuse
 * (double division on the device is IEEE round-to-nearest, like __ddiv_rn); only the
 * two log() calls are the device's and glibc's own (test_sampler_cuda counts them). */
#ifndef MM3_SAMPLER_HASH_H
#define MM3_SAMPLER_HASH_H

#include <float.h>
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SAMPLER_HASH_FN static inline __host__ __device__
#else
#define SAMPLER_HASH_FN static inline
#endif

SAMPLER_HASH_FN uint32_t sampler_hash_rotl32(uint32_t x, int r)
{
    return (x << r) | (x >> (32 - r));
}

/* One 4-byte block into the running hash h. */
SAMPLER_HASH_FN uint32_t sampler_hash_mix(uint32_t h, uint32_t k)
{
    k *= 0xCC9E2D51u;
    k = sampler_hash_rotl32(k, 15);
    k *= 0x1B873593u;
    h ^= k;
    h = sampler_hash_rotl32(h, 13);
    return h * 5u + 0xE6546B64u;
}

SAMPLER_HASH_FN uint32_t sampler_hash_murmur(uint64_t seed, uint32_t pos, uint32_t col)
{
    uint32_t h = 0;
    h = sampler_hash_mix(h, (uint32_t)seed);
    h = sampler_hash_mix(h, (uint32_t)(seed >> 32));
    h = sampler_hash_mix(h, pos);
    h = sampler_hash_mix(h, col);
    h ^= 16u; /* total key length in bytes, as MurmurHash3's finalisation */
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

/* -log(-clamp(log(h / (2^32-1)), -DBL_MAX, -2^-32)) */
SAMPLER_HASH_FN double sampler_hash_gumbel(uint64_t seed, uint32_t pos, uint32_t col)
{
    double u = (double)sampler_hash_murmur(seed, pos, col) / 4294967295.0;
    double lu = log(u);
    /* Clamp both ends (current SGLang): h = 0 gives log 0, h = 2^32-1 gives log 1 = 0. */
    if (lu < -DBL_MAX) lu = -DBL_MAX;
    if (lu > -0x1p-32) lu = -0x1p-32;
    return -log(-lu);
}

#endif
