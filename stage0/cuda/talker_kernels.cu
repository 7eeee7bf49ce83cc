/* Simple, correct kernels for the first GPU talker (see talker_kernels.h); the
 * decode hot path uses common/cuda's split-K attention where its layout fits. */
#include <math.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "stage0/cuda/talker_kernels.h"

enum { ATT_WARPS = 4, ATT_PER_LANE = TALKER_CUDA_MAX_HEAD_DIM / 32 };

__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_rows_kernel(float *__restrict__ out, const float *__restrict__ q, const float *__restrict__ kc,
                          const float *__restrict__ vc, const int *__restrict__ row, const int *__restrict__ pos,
                          int n_heads, int group, int D, size_t row_stride, size_t pos_stride, float scale)
{
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][TALKER_CUDA_MAX_HEAD_DIM];
    const int h = blockIdx.x, i = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int p = pos[i];
    const float *qi = q + ((size_t)i * n_heads + h) * D;
    const size_t base = (size_t)row[i] * row_stride + (size_t)(h / group) * D;
    float qv[ATT_PER_LANE], acc[ATT_PER_LANE];
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int d = lane + 32 * t;
        qv[t] = d < D ? qi[d] : 0.0f;
        acc[t] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j <= p; j += ATT_WARPS) {
        const float *kr = kc + base + (size_t)j * pos_stride;
        const float *vr = vc + base + (size_t)j * pos_stride;
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < ATT_PER_LANE; t++) {
            int d = lane + 32 * t;
            if (d < D) s = fmaf(qv[t], kr[d], s);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        s *= scale;
        float mn = fmaxf(m, s);
        float c = expf(m - mn), e = expf(s - mn);
        l = l * c + e;
#pragma unroll
        for (int t = 0; t < ATT_PER_LANE; t++) {
            int d = lane + 32 * t;
            if (d < D) acc[t] = acc[t] * c + e * vr[d];
        }
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < ATT_PER_LANE; t++) {
        int d = lane + 32 * t;
        if (d < D) s_acc[warp][d] = acc[t];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++)
        M = fmaxf(M, s_m[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        L += s_l[w] * (s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - M));
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (s_m[w] != -INFINITY) o += s_acc[w][d] * expf(s_m[w] - M);
        out[((size_t)i * n_heads + h) * D + d] = o / L;
    }
}

extern "C" int talker_cuda_attention_rows(float *out, const float *q, const float *k_cache, const float *v_cache,
                                          const int *row, const int *pos, int n_tok, int n_heads, int n_kv_heads,
                                          int head_dim, size_t row_stride, size_t pos_stride, float scale, void *stream)
{
    if (n_tok == 0) return 0;
    if (n_tok < 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
        head_dim > TALKER_CUDA_MAX_HEAD_DIM || n_tok > 65535)
        return mm3_errorf(-EINVAL,
                          "talker_cuda_attention_rows: %d tokens, %d/%d heads of %d: expected heads a multiple of "
                          "kv heads, head_dim 1..%d, at most 65535 tokens",
                          n_tok, n_heads, n_kv_heads, head_dim, TALKER_CUDA_MAX_HEAD_DIM);
    dim3 grid((unsigned)n_heads, (unsigned)n_tok);
    attention_rows_kernel<<<grid, ATT_WARPS * 32, 0, cuda_stream_of(stream)>>>(
        out, q, k_cache, v_cache, row, pos, n_heads, n_heads / n_kv_heads, head_dim, row_stride, pos_stride, scale);
    return cuda_launch_status("attention_rows_kernel");
}

__global__ void kv_store_kernel(float *__restrict__ cache, const float *__restrict__ src, const int *__restrict__ row,
                                const int *__restrict__ pos, int width, size_t row_stride, size_t pos_stride)
{
    const int i = blockIdx.y;
    float *dst = cache + (size_t)row[i] * row_stride + (size_t)pos[i] * pos_stride;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x)
        dst[c] = src[(size_t)i * width + c];
}

extern "C" int talker_cuda_kv_store(float *cache, const float *src, const int *row, const int *pos, int n, int width,
                                    size_t row_stride, size_t pos_stride, void *stream)
{
    if (n == 0) return 0;
    if (n < 0 || n > 65535 || width <= 0)
        return mm3_errorf(-EINVAL, "talker_cuda_kv_store: %d tokens of width %d: expected 0..65535 and width > 0", n,
                          width);
    unsigned bx = (unsigned)((width + 255) / 256);
    kv_store_kernel<<<dim3(bx, (unsigned)n), 256, 0, cuda_stream_of(stream)>>>(cache, src, row, pos, width, row_stride,
                                                                               pos_stride);
    return cuda_launch_status("kv_store_kernel");
}

__global__ void add_row_kernel(float *__restrict__ y, const float *__restrict__ x, size_t total, int width)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x)
        y[k] += x[k % (size_t)width];
}

extern "C" int talker_cuda_add_row(float *y, const float *x, int n_rows, int width, void *stream)
{
    if (n_rows == 0) return 0;
    if (n_rows < 0 || width <= 0) return mm3_errorf(-EINVAL, "talker_cuda_add_row: %d rows of width %d", n_rows, width);
    size_t total = (size_t)n_rows * width;
    unsigned blocks = (unsigned)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
    add_row_kernel<<<blocks, 256, 0, cuda_stream_of(stream)>>>(y, x, total, width);
    return cuda_launch_status("add_row_kernel");
}

extern "C" int talker_cuda_h2d_async(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream_of(stream)),
                       "cudaMemcpyAsync (host to device)");
}
