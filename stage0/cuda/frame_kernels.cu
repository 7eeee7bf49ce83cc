/* Kernels of the batched frame step (see frame_kernels.h). */
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/pdl.cuh"
#include "stage0/cuda/frame_kernels.h"

static __device__ __forceinline__ float bf16_to_f32(uint16_t b)
{
    return __uint_as_float((uint32_t)b << 16);
}

static __device__ __forceinline__ int clamp_row(int r, int rows)
{
    return r < 0 ? 0 : r >= rows ? rows - 1 : r;
}

__global__ void take_codes_kernel(int32_t *__restrict__ codes, int ncb, int j, const int *__restrict__ col,
                                  float *__restrict__ x, const uint16_t *__restrict__ table, int table_rows,
                                  int col_offset, int width)
{
    pdl_launch_dependents();
    pdl_wait();
    const int p = blockIdx.x;
    const int c = col[p];
    if (threadIdx.x == 0) codes[(size_t)p * ncb + j] = c;
    if (!table) return;
    const uint16_t *e = table + (size_t)clamp_row(c + col_offset, table_rows) * width;
    float *x0 = x + (size_t)2 * p * width, *x1 = x0 + width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float v = bf16_to_f32(e[i]);
        x0[i] = v;
        x1[i] = v;
    }
}

extern "C" int frame_cuda_take_codes(int32_t *codes, int ncb, int j, const int *col, int n, float *x,
                                     const uint16_t *table, int table_rows, int col_offset, int width, void *stream)
{
    if (n < 1 || ncb < 1 || j < 0 || j >= ncb || width < 1 || (table && table_rows < 1))
        return mm3_errorf(-EINVAL, "frame_cuda_take_codes: %d pairs, codebook %d of %d, width %d, %d table rows", n, j,
                          ncb, width, table_rows);
    return launch_pdl("take_codes_kernel", take_codes_kernel, n, 256, 0, cuda_stream_of(stream), codes, ncb, j, col, x,
                      table, table_rows, col_offset, width);
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

__global__ void copy_rows_kernel(float *__restrict__ dst, size_t dst_stride, const float *__restrict__ src,
                                 size_t src_stride, int width)
{
    pdl_launch_dependents();
    pdl_wait();
    const int r = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x)
        dst[(size_t)r * dst_stride + c] = src[(size_t)r * src_stride + c];
}

extern "C" int frame_cuda_copy_rows(float *dst, size_t dst_stride, const float *src, size_t src_stride, int n_rows,
                                    int width, void *stream)
{
    if (n_rows < 1 || n_rows > 65535 || width < 1)
        return mm3_errorf(-EINVAL, "frame_cuda_copy_rows: %d rows of width %d", n_rows, width);
    unsigned bx = (unsigned)((width + 255) / 256 < 64 ? (width + 255) / 256 : 64);
    return launch_pdl("copy_rows_kernel", copy_rows_kernel, dim3(bx, (unsigned)n_rows), 256, 0, cuda_stream_of(stream),
                      dst, dst_stride, src, src_stride, width);
}
