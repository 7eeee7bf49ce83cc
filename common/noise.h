/* Seeded Gaussian noise for the flow sampler, reproducible on CPU and GPU.
 *
 * A request seed S gives window k the 63-bit seed
 *     noise_seed_derive(S, "dit", k)
 * = BLAKE2b(digest 8 bytes, personalisation "minimax-ttm") over
 *   S as u64 little-endian, then for each part ("dit", decimal k) its UTF-8
 *   length as u32 little-endian followed by its bytes; the digest read as a
 *   little-endian u64, masked with 2^63 - 1 (SGLang-Omni's _derive_seed).
 * Element i of the window's [C, L] noise tensor (row-major, i = c*L + j) is
 *     (a, b, c, d) = Philox4x32-10(counter = (i_lo, i_hi, 0, 0), key = (seed_lo, seed_hi))
 *     u1 = ((b:a >> 11) + 0.5) * 2^-53      u2 = ((d:c >> 11) + 0.5) * 2^-53
 *     z  = (float)( sqrt(-2 ln u1) * cos(2 pi u2) )      (all in double)
 * so each element is independent of launch geometry. See docs/reproducibility.md. */
#ifndef MM3_NOISE_H
#define MM3_NOISE_H

#include <stddef.h>
#include <stdint.h>

/* One Philox4x32-10 block: out[4] from counter[4] and key[2]. */
void noise_philox4x32(uint32_t out[4], const uint32_t counter[4], const uint32_t key[2]);

/* Per-purpose seed: BLAKE2b as described above over seed and `n_parts` string parts. */
uint64_t noise_seed_derive_parts(uint64_t seed, const char *const *parts, int n_parts);

/* The per-window DiT seed: noise_seed_derive_parts(seed, {"dit", "<window>"}, 2). */
uint64_t noise_seed_window(uint64_t seed, int window);

/* Standard normal element `index` of the stream `seed` (formula above). */
float noise_gaussian_at(uint64_t seed, uint64_t index);

/* out[i] = noise_gaussian_at(seed, first + i) for i < n. */
void noise_gaussian_fill(float *out, size_t n, uint64_t seed, uint64_t first);

#endif
