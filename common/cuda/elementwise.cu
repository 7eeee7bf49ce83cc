/* Row-wise and element-wise kernels of the decode path: RMSNorm (optionally fused
 * with the residual add), per-head q/k RMSNorm + NeoX RoPE, SwiGLU, add.
 * Each mirrors the float32 op of the same name in common/ops.h; products that the
 * reference rounds separately are written with __fmul_rn / __fsub_rn so the
 * compiler cannot contract them into FMAs. */
#include <stdint.h>

#include "common/cuda/block_sum.cuh"
#include "common/cuda/cuda_internal.h"
#include "common/cuda/head_norm_rope.cuh"
#include "common/cuda/ops_cuda.h"
#include "common/cuda/pdl.cuh"
#include "common/cuda/silu.cuh"

enum { ROW_THREADS = 256, EW_THREADS = 256, EW_MAX_BLOCKS = 4096 };

static unsigned ew_blocks(size_t n)
{
    size_t b = (n + EW_THREADS - 1) / EW_THREADS;
    if (b < 1) b = 1;
    return (unsigned)(b < EW_MAX_BLOCKS ? b : (size_t)EW_MAX_BLOCKS);
}

/* One block per row. When add != NULL: h += add first and h is stored back. Each
 * thread's elements (i = thread, + blockDim, ...) are loaded ROW_BATCH at a time
 * before any is stored: y may be h, so the compiler would otherwise keep every load
 * after the store before it, one round trip per element (16 at the talker's width). */
enum { ROW_BATCH = 16 };

/* v[e] = src[i0 + e T] where that is below dim, else 0: one thread's batch of a row. */
static __device__ __forceinline__ void row_batch_load(float (&v)[ROW_BATCH], const float *src, int i0, int T, int dim)
{
#pragma unroll
    for (int e = 0; e < ROW_BATCH; e++) {
        const int i = i0 + e * T;
        v[e] = i < dim ? src[i] : 0.0f;
    }
}

__global__ void __launch_bounds__(ROW_THREADS)
    rmsnorm_kernel(float *__restrict__ y, float *h, const float *__restrict__ add, const float *__restrict__ w, int dim,
                   float eps)
{
    pdl_launch_dependents();
    pdl_wait();
    float *xr = h + (size_t)blockIdx.x * dim;
    const float *ar = add ? add + (size_t)blockIdx.x * dim : NULL;
    float *yr = y + (size_t)blockIdx.x * dim;
    const int T = (int)blockDim.x;
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < dim; i0 += ROW_BATCH * T) {
        float v[ROW_BATCH], a[ROW_BATCH];
        row_batch_load(v, xr, i0, T, dim);
        if (ar) row_batch_load(a, ar, i0, T, dim);
#pragma unroll
        for (int e = 0; e < ROW_BATCH; e++) {
            const int i = i0 + e * T;
            if (i >= dim) continue;
            if (ar) {
                v[e] = __fadd_rn(v[e], a[e]);
                xr[i] = v[e];
            }
            ss = fmaf(v[e], v[e], ss);
        }
    }
    ss = block_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i0 = threadIdx.x; i0 < dim; i0 += ROW_BATCH * T) {
        float v[ROW_BATCH], g[ROW_BATCH];
        row_batch_load(v, xr, i0, T, dim);
        row_batch_load(g, w, i0, T, dim);
#pragma unroll
        for (int e = 0; e < ROW_BATCH; e++) {
            const int i = i0 + e * T;
            if (i < dim) yr[i] = __fmul_rn(g[e], __fmul_rn(v[e], r));
        }
    }
}

extern "C" int cuda_ops_rmsnorm(float *y, const float *x, const float *w, int n_rows, int dim, float eps, void *stream)
{
    if (n_rows < 0 || dim < 1)
        return mm3_errorf(-EINVAL, "cuda_ops_rmsnorm: %d rows of %d: expected rows >= 0, dim >= 1", n_rows, dim);
    if (n_rows == 0) return 0;
    /* y may alias x: each thread reads its elements before the block writes them. */
    return launch_pdl("rmsnorm_kernel", rmsnorm_kernel, n_rows, ROW_THREADS, 0, cuda_stream_of(stream), y, (float *)x,
                      (const float *)NULL, w, dim, eps);
}

extern "C" int cuda_ops_add_rmsnorm(float *h, float *y, const float *x_add, const float *w, int n_rows, int dim,
                                    float eps, void *stream)
{
    if (n_rows < 0 || dim < 1)
        return mm3_errorf(-EINVAL, "cuda_ops_add_rmsnorm: %d rows of %d: expected rows >= 0, dim >= 1", n_rows, dim);
    if (n_rows == 0) return 0;
    return launch_pdl("rmsnorm_kernel (add)", rmsnorm_kernel, n_rows, ROW_THREADS, 0, cuda_stream_of(stream), y, h,
                      x_add, w, dim, eps);
}

/* One warp per (row, head): RMSNorm over the head, then rotate pairs (i, i+half). */
__global__ void qk_norm_rope_kernel(float *x, int n_rows, int stride, int n_heads, int head_dim,
                                    const float *__restrict__ w, float eps, int rotary_dim, const int *__restrict__ pos,
                                    const float *__restrict__ inv_freq)
{
    pdl_launch_dependents();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const long item = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (item >= (long)n_rows * n_heads) return;
    const int t = (int)(item / n_heads), h = (int)(item % n_heads);
    float *u = x + (size_t)t * stride + (size_t)h * head_dim;
    warp_head_norm_rope(u, head_dim, w, eps, rotary_dim, (float)pos[t], inv_freq, lane);
}

extern "C" int cuda_ops_qk_norm_rope(float *x, int n_rows, int stride, int n_heads, int head_dim,
                                     const struct cuda_head_norm_rope *p, void *stream)
{
    const float *w = p->w, *inv_freq = p->inv_freq;
    const int *pos = p->pos;
    float eps = p->eps;
    int rotary_dim = p->rotary_dim;
    if (n_rows < 0 || n_heads < 1 || head_dim < 1 || head_dim > 1024 || stride < n_heads * head_dim)
        return mm3_errorf(-EINVAL,
                          "cuda_ops_qk_norm_rope: %d rows, %d heads of %d, stride %d: expected head_dim 1..1024 "
                          "and stride >= heads*head_dim",
                          n_rows, n_heads, head_dim, stride);
    if (rotary_dim < 0 || rotary_dim > head_dim || rotary_dim % 2)
        return mm3_errorf(-EINVAL, "cuda_ops_qk_norm_rope: rotary_dim %d: expected even, <= head_dim %d", rotary_dim,
                          head_dim);
    if (rotary_dim > 0 && (!pos || !inv_freq))
        return mm3_errorf(-EINVAL, "cuda_ops_qk_norm_rope: rotary_dim %d needs pos and inv_freq", rotary_dim);
    long items = (long)n_rows * n_heads;
    if (items == 0) return 0;
    const int warps_per_block = 4;
    unsigned blocks = (unsigned)((items + warps_per_block - 1) / warps_per_block);
    return launch_pdl("qk_norm_rope_kernel", qk_norm_rope_kernel, blocks, 32 * warps_per_block, 0,
                      cuda_stream_of(stream), x, n_rows, stride, n_heads, head_dim, w, eps, rotary_dim, pos, inv_freq);
}

__global__ void silu_mul_kernel(float *y, const float *gate, const float *up, size_t n)
{
    pdl_launch_dependents();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = silu_mul1(gate[i], up[i]);
}

/* gu rows of 2*ffn: gate j at column 2j, up j at 2j+1 (the interleaved packing of
 * cuda_ops_matmul_bf16_swiglu's weights). */
__global__ void silu_mul_interleaved_kernel(float *__restrict__ y, const float *__restrict__ gu, int n_rows, int ffn)
{
    pdl_launch_dependents();
    pdl_wait();
    size_t n = (size_t)n_rows * ffn;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / ffn, c = i % ffn;
        const float *row = gu + r * 2 * ffn;
        y[i] = silu_mul1(row[2 * c], row[2 * c + 1]);
    }
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
    pdl_launch_dependents();
    pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], x[i]);
}

extern "C" int cuda_ops_silu_mul(float *y, const float *gate, const float *up, size_t n, void *stream)
{
    if (n == 0) return 0;
    return launch_pdl("silu_mul_kernel", silu_mul_kernel, ew_blocks(n), EW_THREADS, 0, cuda_stream_of(stream), y, gate,
                      up, n);
}

extern "C" int cuda_ops_silu_mul_interleaved(float *y, const float *gu, int n_rows, int ffn, void *stream)
{
    if (n_rows < 0 || ffn < 1)
        return mm3_errorf(-EINVAL, "cuda_ops_silu_mul_interleaved: %d rows of ffn %d: expected rows >= 0, ffn >= 1",
                          n_rows, ffn);
    size_t n = (size_t)n_rows * ffn;
    if (n == 0) return 0;
    return launch_pdl("silu_mul_interleaved_kernel", silu_mul_interleaved_kernel, ew_blocks(n), EW_THREADS, 0,
                      cuda_stream_of(stream), y, gu, n_rows, ffn);
}

extern "C" int cuda_ops_add(float *y, const float *x, size_t n, void *stream)
{
    if (n == 0) return 0;
    return launch_pdl("add_kernel", add_kernel, ew_blocks(n), EW_THREADS, 0, cuda_stream_of(stream), y, x, n);
}
