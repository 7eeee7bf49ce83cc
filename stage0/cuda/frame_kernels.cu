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
                                  int col_offset, int width, float *__restrict__ dh, size_t dh_stride,
                                  const float *__restrict__ y)
{
    pdl_launch_dependents();
    pdl_wait();
    const int p = blockIdx.x;
    const int c = col[p];
    if (threadIdx.x == 0) codes[(size_t)p * ncb + j] = c;
    if (dh)
        for (int i = threadIdx.x; i < width; i += blockDim.x)
            dh[(size_t)p * dh_stride + i] = y[(size_t)2 * p * width + i];
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
                                     const uint16_t *table, int table_rows, int col_offset, int width, float *dh,
                                     size_t dh_stride, const float *y, void *stream)
{
    if (n < 1 || ncb < 1 || j < 0 || j >= ncb || width < 1 || (table && table_rows < 1) ||
        (dh && (!y || dh_stride < (size_t)width)))
        return mm3_errorf(-EINVAL,
                          "frame_cuda_take_codes: %d pairs, codebook %d of %d, width %d, %d table rows, hidden copy "
                          "stride %zu%s",
                          n, j, ncb, width, table_rows, dh_stride, dh && !y ? " without a source" : "");
    return launch_pdl("take_codes_kernel", take_codes_kernel, n, 256, 0, cuda_stream_of(stream), codes, ncb, j, col, x,
                      table, table_rows, col_offset, width, dh, dh_stride, y);
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
