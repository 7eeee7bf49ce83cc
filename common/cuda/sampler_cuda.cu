/* The seeded stage-0 draw on the GPU, one block per CFG pair (see sampler_cuda.h): the
 * kernel and its launch. The draw itself is sampler_draw.cuh's. */
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/pdl.cuh"
#include "common/cuda/sampler_cuda.h"
#include "common/cuda/sampler_draw.cuh"

__global__ void __launch_bounds__(SAMPLER_THREADS)
    draw_pairs_kernel(const float *__restrict__ logits, int ld, int n, const float *__restrict__ scale, int c0_rule,
                      int top_k, const uint64_t *__restrict__ seed, const uint32_t *__restrict__ pos,
                      const unsigned char *__restrict__ mask_col0, int *__restrict__ col_out,
                      float *__restrict__ guided_out)
{
    pdl_launch_dependents();
    pdl_wait();
    extern __shared__ uint32_t keys[];
    const int p = blockIdx.x;
    const int col = sampler_draw_pair(logits, ld, n, scale, c0_rule, top_k, seed, pos, mask_col0, guided_out, p, keys);
    if (threadIdx.x == 0) col_out[p] = col;
}

__global__ void gumbel_kernel(double *out, uint64_t seed, uint32_t pos, uint32_t col0, int n)
{
    pdl_launch_dependents();
    pdl_wait();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = sampler_hash_gumbel(seed, pos, col0 + (uint32_t)i);
}

static int max_cols_cached;

extern "C" int cuda_sampler_max_cols(void)
{
    return sampler_draw_max_cols((const void *)draw_pairs_kernel, "draw_pairs_kernel", &max_cols_cached);
}

extern "C" int cuda_sampler_draw_pairs(const struct cuda_sampler_pairs *d, void *stream)
{
    const float *logits = d->logits, *scale = d->scale;
    int ld = d->ld, n = d->n, n_pairs = d->n_pairs;
    const uint64_t *seed = d->seed;
    const uint32_t *pos = d->pos;
    int *col_out = d->col_out;
    if (n < 1 || ld < n || n_pairs < 0)
        return mm3_errorf(-EINVAL,
                          "cuda_sampler_draw_pairs: n %d, ld %d, n_pairs %d: expected n >= 1, ld >= n, n_pairs >= 0", n,
                          ld, n_pairs);
    if (n_pairs == 0) return 0;
    if (!logits || !scale || !seed || !pos || !col_out)
        return mm3_errorf(-EINVAL, "cuda_sampler_draw_pairs: logits, scale, seed, pos and col_out must be device "
                                   "pointers, got NULL");
    int max_cols = cuda_sampler_max_cols();
    if (max_cols == 0) return mm3_error_prefix(-ENODEV, "cuda_sampler_draw_pairs: ");
    if (n > max_cols)
        return mm3_errorf(-EINVAL, "cuda_sampler_draw_pairs: n %d columns: expected at most %d (shared memory)", n,
                          max_cols);
    size_t smem = sizeof(uint32_t) * (size_t)n;
    return launch_pdl("draw_pairs_kernel", draw_pairs_kernel, (unsigned)n_pairs, SAMPLER_THREADS, smem,
                      cuda_stream_of(stream), logits, ld, n, scale, d->c0_rule, d->top_k, seed, pos, d->mask_col0,
                      col_out, d->guided_out);
}

extern "C" int cuda_sampler_gumbel(double *out, uint64_t seed, uint32_t pos, uint32_t col0, int n, void *stream)
{
    if (n < 0 || (n > 0 && !out))
        return mm3_errorf(-EINVAL, "cuda_sampler_gumbel: n %d, out %p: expected n >= 0 and a device buffer", n,
                          (void *)out);
    if (n == 0) return 0;
    const int threads = 256;
    return launch_pdl("gumbel_kernel", gumbel_kernel, (unsigned)((n + threads - 1) / threads), threads, 0,
                      cuda_stream_of(stream), out, seed, pos, col0, n);
}
