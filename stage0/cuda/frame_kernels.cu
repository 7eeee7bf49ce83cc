/* Kernels of the batched frame step (see frame_kernels.h). */
#include <stdint.h>

#include "common/cuda/block_sum.cuh"
#include "common/cuda/cuda_internal.h"
#include "common/cuda/pdl.cuh"
#include "common/cuda/sampler_draw.cuh"
#include "stage0/cuda/frame_kernels.h"

static __device__ __forceinline__ float bf16_to_f32(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

static __device__ __forceinline__ int clamp_row(int r, int rows)
{
    return r < 0 ? 0 : r >= rows ? rows - 1 : r;
}

__global__ void __launch_bounds__(SAMPLER_THREADS) draw_take_kernel(struct frame_draw_take a)
{
    pdl_launch_dependents();
    pdl_wait();
    extern __shared__ uint32_t keys[];
    const int p = blockIdx.x, W = a.width;
    const int c = sampler_draw_pair(a.logits, a.n_cols, a.n_cols, a.scale, a.c0_rule, a.top_k, a.seed, a.pos,
                                    a.mask_col0, NULL, p, keys);
    if (threadIdx.x == 0) a.codes[(size_t)p * a.ncb + a.j] = c;
    if (a.dh) { /* the pair's conditional row, normed as rmsnorm_kernel does */
        const float *hr = a.h + (size_t)2 * p * W;
        float r = 1.0f;
        if (a.norm_w) {
            float ss = 0.0f;
            for (int i = threadIdx.x; i < W; i += blockDim.x)
                ss = fmaf(hr[i], hr[i], ss);
            r = 1.0f / sqrtf(block_sum(ss) / (float)W + a.eps);
        }
        float *d = a.dh + (size_t)p * a.dh_stride;
        for (int i = threadIdx.x; i < W; i += blockDim.x)
            d[i] = a.norm_w ? __fmul_rn(a.norm_w[i], __fmul_rn(hr[i], r)) : hr[i];
    }
    if (a.copy_dst)
        for (int i = threadIdx.x; i < 2 * W; i += blockDim.x)
            a.copy_dst[(size_t)2 * p * W + i] = a.copy_src[(size_t)2 * p * W + i];
    if (!a.table && !a.table_f32) return;
    __syncthreads(); /* x may be the rows h that dh was read from */
    const size_t r = (size_t)clamp_row(c + a.col_offset, a.table_rows), row = r * W;
    float *x0 = a.x + (size_t)2 * p * W, *x1 = x0 + W;
    for (int i = threadIdx.x; i < W; i += blockDim.x) {
        float v = a.table_f32 ? a.table_f32[row + i] : bf16_to_f32(a.table[row + i]);
        x0[i] = v;
        x1[i] = v;
    }
    if (!a.table2) return;
    const int W2 = a.width2;
    const float4 *t2 = (const float4 *)(a.table2 + r * W2);
    float4 *y0 = (float4 *)(a.x2 + (size_t)2 * p * W2), *y1 = (float4 *)(a.x2 + (size_t)(2 * p + 1) * W2);
    for (int i = threadIdx.x; i < W2 / 4; i += blockDim.x) {
        float4 v = t2[i];
        y0[i] = v;
        y1[i] = v;
    }
}

static int draw_take_cols;

extern "C" int frame_cuda_draw_take_max_cols(void)
{
    return sampler_draw_max_cols((const void *)draw_take_kernel, "draw_take_kernel", &draw_take_cols);
}

extern "C" int frame_cuda_draw_take(const struct frame_draw_take *a, int n, void *stream)
{
    if (n < 1 || a->n_cols < 1 || a->ncb < 1 || a->j < 0 || a->j >= a->ncb || a->width < 1 || !a->logits || !a->scale ||
        !a->seed || !a->pos || !a->codes || ((a->table || a->table_f32) && (a->table_rows < 1 || !a->x)) ||
        (a->table && a->table_f32) ||
        (a->table2 && (!a->table_f32 || !a->x2 || a->width2 < 4 || a->width2 % 4 ||
                       ((uintptr_t)a->table2 | (uintptr_t)a->x2) % 16)) ||
        (a->dh && (!a->h || a->dh_stride < (size_t)a->width)) || (!a->copy_dst != !a->copy_src))
        return mm3_errorf(-EINVAL,
                          "frame_cuda_draw_take: %d pairs, %d columns, codebook %d of %d, width %d, %d table rows, "
                          "hidden stride %zu: expected positive sizes, j < ncb, the draw's device arrays, one table "
                          "with its x (a second float32 one beside table_f32 only, 16-byte aligned, its width a "
                          "multiple of 4), dh with its rows and a stride >= width, copy_dst with copy_src",
                          n, a->n_cols, a->j, a->ncb, a->width, a->table_rows, a->dh_stride);
    const int max_cols = frame_cuda_draw_take_max_cols();
    if (max_cols == 0) return mm3_error_prefix(-ENODEV, "frame_cuda_draw_take: ");
    if (a->n_cols > max_cols)
        return mm3_errorf(-EINVAL, "frame_cuda_draw_take: %d columns: expected at most %d (shared memory)", a->n_cols,
                          max_cols);
    return launch_pdl("draw_take_kernel", draw_take_kernel, (unsigned)n, SAMPLER_THREADS,
                      sizeof(uint32_t) * (size_t)a->n_cols, cuda_stream_of(stream), *a);
}

__global__ void feedback_kernel(float *__restrict__ fb, const int32_t *__restrict__ codes, int ncb,
                                const uint16_t *__restrict__ e0, int e0_rows, const uint16_t *__restrict__ audio, int V,
                                int width, float scale)
{
    pdl_launch_dependents();
    pdl_wait();
    const int p = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    const int32_t *c = codes + (size_t)p * ncb;
    float r = 0.0f;
    for (int j = 1; j < ncb; j++)
        r = __fadd_rn(r, bf16_to_f32(audio[((size_t)(j - 1) * V + clamp_row(c[j], V)) * width + i]));
    float s = __fadd_rn(bf16_to_f32(e0[(size_t)clamp_row(c[0] - 1, e0_rows) * width + i]), r);
    fb[(size_t)p * width + i] = __fmul_rn(s, scale);
}

extern "C" int frame_cuda_feedback(float *fb, const int32_t *codes, int ncb, int n, const uint16_t *e0, int e0_rows,
                                   const uint16_t *audio, int V, int width, float scale, void *stream)
{
    if (n < 1 || n > 65535 || ncb < 1 || e0_rows < 1 || V < 1 || width < 1)
        return mm3_errorf(-EINVAL, "frame_cuda_feedback: %d pairs, %d codebooks, %d/%d rows, width %d", n, ncb, e0_rows,
                          V, width);
    dim3 grid((unsigned)((width + 255) / 256), (unsigned)n);
    return launch_pdl("feedback_kernel", feedback_kernel, grid, 256, 0, cuda_stream_of(stream), fb, codes, ncb, e0,
                      e0_rows, audio, V, width, scale);
}
