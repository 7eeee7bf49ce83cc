/* Kernels of the batched frame step (see frame_kernels.h). */
#include <stdint.h>

#include "common/cuda/block_sum.cuh"
#include "common/cuda/cuda_internal.h"
#include "common/cuda/pdl.cuh"
#include "common/cuda/sampler_draw.cuh"
#include "stage0/model/cuda/frame_kernels.h"

static __device__ __forceinline__ float bf16_to_f32(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

static __device__ __forceinline__ int clamp_row(int r, int rows)
{
    return r < 0 ? 0 : r >= rows ? rows - 1 : r;
}

enum {
    TAKE_BATCH = 8, /* elements per thread in flight in copy_batched: 2 W = 8192 in one batch */
    TAKE_REGS = 4   /* elements per thread and row loaded at once after the draw: W = 4096 */
};

/* store(i, load(i)) for i < n over the block, each thread's loads of a batch issued
 * before its stores. Through pointers that may alias, the compiler keeps every load
 * after the store before it: a loop of load-store pairs costs one memory round trip
 * per element and thread (the draws' table copies, each then bound by memory latency). */
template <typename T, typename Load, typename Store>
static __device__ __forceinline__ void copy_batched(int n, Load load, Store store)
{
    for (int i0 = threadIdx.x; i0 < n; i0 += TAKE_BATCH * blockDim.x) {
        T v[TAKE_BATCH];
#pragma unroll
        for (int e = 0; e < TAKE_BATCH; e++) {
            const int i = i0 + e * (int)blockDim.x;
            if (i < n) v[e] = load(i);
        }
#pragma unroll
        for (int e = 0; e < TAKE_BATCH; e++) {
            const int i = i0 + e * (int)blockDim.x;
            if (i < n) store(i, v[e]);
        }
    }
}

__global__ void __launch_bounds__(SAMPLER_THREADS) draw_take_kernel(struct frame_draw_take a)
{
    pdl_launch_dependents();
    pdl_wait();
    extern __shared__ uint32_t keys[];
    const int p = blockIdx.x, W = a.width, T = (int)blockDim.x;
    if (a.copy_dst) { /* the LM hidden pair: no need of the drawn column */
        const float *src = a.copy_src + (size_t)2 * p * W;
        float *dst = a.copy_dst + (size_t)2 * p * W;
        copy_batched<float>(
            2 * W, [=](int i) { return src[i]; }, [=](int i, float v) { dst[i] = v; });
    }
    const int c = sampler_draw_pair(a.logits, a.n_cols, a.n_cols, a.scale, a.c0_rule, a.top_k, a.seed, a.pos,
                                    a.mask_col0, NULL, p, keys);
    if (threadIdx.x == 0) a.codes[(size_t)p * a.ncb + a.j] = c;
    const bool take = a.table || a.table_f32;
    const size_t r = take ? (size_t)clamp_row(c + a.col_offset, a.table_rows) : 0;
    const float *hr = a.dh ? a.h + (size_t)2 * p * W : NULL;
    float *x0 = a.x + (size_t)2 * p * W, *x1 = x0 + W;
    const int W2 = a.table2 ? a.width2 / 4 : 0;
    const float4 *t2 = a.table2 ? (const float4 *)(a.table2 + r * a.width2) : NULL;
    float4 *y0 = a.table2 ? (float4 *)(a.x2 + (size_t)2 * p * a.width2) : NULL, *y1 = y0 + W2;

    /* Where the rows fit TAKE_REGS per thread (the release widths), everything after the
     * draw is one round trip: dh's row and weights and the drawn code's rows are loaded
     * together, then normed and stored. Element i is thread i % T's in every row, so a
     * thread reads h[i] before it stores x[i] where x is h. */
    if (W <= TAKE_REGS * T && W2 <= TAKE_REGS * T) {
        float hv[TAKE_REGS], wv[TAKE_REGS], xv[TAKE_REGS];
        float4 yv[TAKE_REGS];
#pragma unroll
        for (int e = 0; e < TAKE_REGS; e++) {
            const int i = (int)threadIdx.x + e * T;
            hv[e] = a.dh && i < W ? hr[i] : 0.0f;
            wv[e] = a.dh && a.norm_w && i < W ? a.norm_w[i] : 0.0f;
            if (take && i < W) xv[e] = a.table_f32 ? a.table_f32[r * W + i] : bf16_to_f32(a.table[r * W + i]);
            if (i < W2) yv[e] = t2[i];
        }
        if (a.dh) { /* the pair's conditional row, normed as rmsnorm_kernel does */
            float rn = 1.0f;
            if (a.norm_w) {
                /* each thread's squares in rmsnorm_kernel's order (i = thread, + T, ...) */
                float ss = 0.0f;
#pragma unroll
                for (int e = 0; e < TAKE_REGS; e++)
                    if ((int)threadIdx.x + e * T < W) ss = fmaf(hv[e], hv[e], ss);
                rn = 1.0f / sqrtf(block_sum(ss) / (float)W + a.eps);
            }
            float *d = a.dh + (size_t)p * a.dh_stride;
#pragma unroll
            for (int e = 0; e < TAKE_REGS; e++) {
                const int i = (int)threadIdx.x + e * T;
                if (i < W) d[i] = a.norm_w ? __fmul_rn(wv[e], __fmul_rn(hv[e], rn)) : hv[e];
            }
        }
#pragma unroll
        for (int e = 0; e < TAKE_REGS; e++) {
            const int i = (int)threadIdx.x + e * T;
            if (take && i < W) {
                x0[i] = xv[e];
                x1[i] = xv[e];
            }
            if (i < W2) {
                y0[i] = yv[e];
                y1[i] = yv[e];
            }
        }
        return;
    }

    if (a.dh) { /* wider rows: the same steps a batch at a time */
        float *d = a.dh + (size_t)p * a.dh_stride;
        float rn = 1.0f;
        if (a.norm_w) {
            float ss = 0.0f;
            for (int i0 = threadIdx.x; i0 < W; i0 += TAKE_BATCH * T) {
                float v[TAKE_BATCH];
#pragma unroll
                for (int e = 0; e < TAKE_BATCH; e++) {
                    const int i = i0 + e * T;
                    v[e] = i < W ? hr[i] : 0.0f;
                }
#pragma unroll
                for (int e = 0; e < TAKE_BATCH; e++)
                    if (i0 + e * T < W) ss = fmaf(v[e], v[e], ss);
            }
            rn = 1.0f / sqrtf(block_sum(ss) / (float)W + a.eps);
            const float *w = a.norm_w;
            copy_batched<float2>(
                W, [=](int i) { return make_float2(w[i], hr[i]); },
                [=](int i, float2 v) { d[i] = __fmul_rn(v.x, __fmul_rn(v.y, rn)); });
        } else {
            copy_batched<float>(
                W, [=](int i) { return hr[i]; }, [=](int i, float v) { d[i] = v; });
        }
    }
    if (!take) return;
    __syncthreads(); /* x may be the rows h that dh was read from */
    const auto store_x = [=](int i, float v) {
        x0[i] = v;
        x1[i] = v;
    };
    if (a.table_f32) {
        const float *t = a.table_f32 + r * W;
        copy_batched<float>(
            W, [=](int i) { return t[i]; }, store_x);
    } else {
        const uint16_t *t = a.table + r * W;
        copy_batched<float>(
            W, [=](int i) { return bf16_to_f32(t[i]); }, store_x);
    }
    copy_batched<float4>(
        W2, [=](int i) { return t2[i]; },
        [=](int i, float4 v) {
            y0[i] = v;
            y1[i] = v;
        });
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

extern "C" int frame_cuda_feedback(float *fb, const int32_t *codes, int ncb, int n,
                                   const struct frame_feedback_tables *t, void *stream)
{
    const uint16_t *e0 = t->e0, *audio = t->audio;
    int e0_rows = t->e0_rows, V = t->V, width = t->width;
    float scale = t->scale;
    if (n < 1 || n > 65535 || ncb < 1 || e0_rows < 1 || V < 1 || width < 1)
        return mm3_errorf(-EINVAL, "frame_cuda_feedback: %d pairs, %d codebooks, %d/%d rows, width %d", n, ncb, e0_rows,
                          V, width);
    dim3 grid((unsigned)((width + 255) / 256), (unsigned)n);
    return launch_pdl("feedback_kernel", feedback_kernel, grid, 256, 0, cuda_stream_of(stream), fb, codes, ncb, e0,
                      e0_rows, audio, V, width, scale);
}
