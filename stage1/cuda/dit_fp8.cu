/* Per-row e4m3 quantization of the fp8 GEMM operands (stage1/cuda/dit_fp8.h). One block per
 * row: the row's amax is reduced before any element is stored, so every producer computes
 * its values twice (once for the amax, once to store) instead of keeping a float32 copy. */
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cuda_fp8.h>

#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/dit_fp8.h"

enum { Q_THREADS = 256 };

/* |v| folded into a running amax so that NaN wins (fmaxf would drop it). */
static __device__ __forceinline__ float amax_step(float m, float v)
{
    float a = fabsf(v);
    return a > m || a != a ? a : m;
}

/* The row's scale (dit_fp8.h), stored by thread 0; returns 1 / scale. A NaN amax keeps a
 * unit scale: the NaN elements themselves carry it into the GEMM. */
static __device__ __forceinline__ float row_scale(float amax, float *s_row)
{
    float s = amax / 448.0f;
    if (!(s >= FLT_MIN)) s = 1.0f;
    if (threadIdx.x == 0) *s_row = s;
    return 1.0f / s;
}

static __device__ __forceinline__ uint8_t to_e4m3(float v)
{
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

__global__ void quantize_rows_kernel(uint8_t *q, float *s, const float *x, int dim, int ldx)
{
    __shared__ float red[Q_THREADS / 32];
    const float *xr = x + (size_t)blockIdx.x * ldx;
    float m = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        m = amax_step(m, xr[i]);
    float inv = row_scale(dit_block_max(m, red), s + blockIdx.x);
    uint8_t *qr = q + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        qr[i] = to_e4m3(xr[i] * inv);
}

extern "C" int dit_fp8_quantize_rows(uint8_t *q, float *s, const float *x, int n, int dim, int ldx, void *stream)
{
    if (n < 0 || dim < 1 || ldx < dim || !q || !s || !x)
        return mm3_errorf(-EINVAL,
                          "dit_fp8_quantize_rows: %d rows of %d (stride %d): expected rows >= 0, dim >= 1, "
                          "stride >= dim, non-NULL pointers",
                          n, dim, ldx);
    if (n == 0) return 0;
    quantize_rows_kernel<<<n, Q_THREADS, 0, (cudaStream_t)stream>>>(q, s, x, dim, ldx);
    return dit_cuda_launched("quantize_rows_kernel");
}

/* As layernorm_kernel (dit_kernels.cu), then a third pass for the amax and a fourth to store. */
__global__ void layernorm_fp8_kernel(uint8_t *q, float *s, const float *x, const float *w, const float *b, int dim,
                                     float eps)
{
    __shared__ float red[Q_THREADS / 32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float mean, r;
    dit_layernorm_stats(xr, dim, eps, red, &mean, &r);
    float m = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        m = amax_step(m, (xr[i] - mean) * r * w[i] + (b ? b[i] : 0.0f));
    float inv = row_scale(dit_block_max(m, red), s + blockIdx.x);
    uint8_t *qr = q + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        qr[i] = to_e4m3(((xr[i] - mean) * r * w[i] + (b ? b[i] : 0.0f)) * inv);
}

extern "C" int dit_fp8_layernorm(uint8_t *q, float *s, const struct dit_layernorm *ln, void *stream)
{
    const float *x = ln->x, *w = ln->w, *b = ln->b;
    int n = ln->n, dim = ln->dim;
    float eps = ln->eps;
    if (n < 0 || dim < 1 || !q || !s || !x || !w)
        return mm3_errorf(-EINVAL, "dit_fp8_layernorm: %d rows of %d: expected rows >= 0, dim >= 1, non-NULL", n, dim);
    if (n == 0) return 0;
    layernorm_fp8_kernel<<<n, Q_THREADS, 0, (cudaStream_t)stream>>>(q, s, x, w, b, dim, eps);
    return dit_cuda_launched("layernorm_fp8_kernel");
}

static __device__ __forceinline__ float silu(float z)
{
    return z / (1.0f + expf(-z));
}

/* The gated value of element i of row gr (bias: the ff_in GEMM's, or NULL). */
static __device__ __forceinline__ float gated(const float *gr, const float *bias, int ff, int i)
{
    float v = gr[i], z = gr[ff + i];
    if (bias) v += bias[i], z += bias[ff + i];
    return silu(z) * v;
}

__global__ void silu_gate_fp8_kernel(uint8_t *q, float *s, const float *g, const float *bias, int ff)
{
    __shared__ float red[Q_THREADS / 32];
    const float *gr = g + (size_t)blockIdx.x * 2 * ff;
    float m = 0.0f;
    for (int i = threadIdx.x; i < ff; i += blockDim.x)
        m = amax_step(m, gated(gr, bias, ff, i));
    float inv = row_scale(dit_block_max(m, red), s + blockIdx.x);
    uint8_t *qr = q + (size_t)blockIdx.x * ff;
    for (int i = threadIdx.x; i < ff; i += blockDim.x)
        qr[i] = to_e4m3(gated(gr, bias, ff, i) * inv);
}

extern "C" int dit_fp8_silu_gate(uint8_t *q, float *s, const float *g, const float *bias, int n, int ff, void *stream)
{
    if (n < 0 || ff < 1 || !q || !s || !g)
        return mm3_errorf(-EINVAL, "dit_fp8_silu_gate: %d rows of %d: expected rows >= 0, ff >= 1, non-NULL", n, ff);
    if (n == 0) return 0;
    silu_gate_fp8_kernel<<<n, Q_THREADS, 0, (cudaStream_t)stream>>>(q, s, g, bias, ff);
    return dit_cuda_launched("silu_gate_fp8_kernel");
}
