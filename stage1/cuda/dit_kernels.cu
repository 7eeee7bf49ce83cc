/* Elementwise and row kernels of the DiT forward (stage1/cuda/dit_kernels.h). */
#include <cmath>
#include <cstdint>

#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/dit_kernels.h"

/* ---- LayerNorm ---------------------------------------------------------------- */

enum { LN_THREADS = 256 };

/* One block per row (dit_layernorm_stats). */
__global__ void layernorm_kernel(void *y, int fmt, const float *x, const float *w, const float *b, int dim, float eps)
{
    __shared__ float red[LN_THREADS / 32];
    const float *xr = x + (size_t)blockIdx.x * dim;
    float mean, r;
    dit_layernorm_stats(xr, dim, eps, red, &mean, &r);
    size_t base = (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        dit_store_operand(y, base + i, (xr[i] - mean) * r * w[i] + (b ? b[i] : 0.0f), fmt);
}

extern "C" int dit_cuda_layernorm(void *y, int out_fmt, const struct dit_layernorm *ln, void *stream)
{
    const float *x = ln->x, *w = ln->w, *b = ln->b;
    int n = ln->n, dim = ln->dim;
    float eps = ln->eps;
    if (n < 0 || dim < 1 || !y || !x || !w)
        return mm3_errorf(-EINVAL, "dit_cuda_layernorm: %d rows of %d: expected rows >= 0, dim >= 1, non-NULL", n, dim);
    if (n == 0) return 0;
    layernorm_kernel<<<n, LN_THREADS, 0, (cudaStream_t)stream>>>(y, out_fmt, x, w, b, dim, eps);
    return dit_cuda_launched("layernorm_kernel");
}

/* ---- RoPE ----------------------------------------------------------------------- */

__global__ void rope_table_kernel(float *cs, const float *inv_freq, int T, int half)
{
    size_t n = (size_t)T * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int p = (int)(e / half), i = (int)(e % half);
        float ang = inv_freq[i] * (float)p;
        float s, c;
        sincosf(ang, &s, &c);
        cs[(size_t)p * 2 * half + i] = c;
        cs[(size_t)p * 2 * half + half + i] = s;
    }
}

extern "C" int dit_cuda_rope_table(float *cs, const float *inv_freq, int T, int rotary_dim, void *stream)
{
    if (T < 1 || rotary_dim < 2 || rotary_dim % 2 || !cs || !inv_freq)
        return mm3_errorf(-EINVAL, "dit_cuda_rope_table: T %d, rotary_dim %d: expected T >= 1, even rotary_dim >= 2", T,
                          rotary_dim);
    int half = rotary_dim / 2;
    rope_table_kernel<<<dit_cuda_blocks((size_t)T * half, 256), 256, 0, (cudaStream_t)stream>>>(cs, inv_freq, T, half);
    return dit_cuda_launched("rope_table_kernel");
}

__global__ void rope_kernel(float *x, size_t rows, int T, int stride, int n_heads, int head_dim, int half,
                            const float *cs)
{
    size_t n = rows * n_heads * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % half);
        size_t rh = e / half;
        int h = (int)(rh % n_heads);
        size_t r = rh / n_heads;
        const float *t = cs + (r % T) * 2 * half;
        float c = t[i], s = t[half + i];
        float *u = x + r * stride + (size_t)h * head_dim;
        float x1 = u[i], x2 = u[i + half];
        u[i] = x1 * c - x2 * s;
        u[i + half] = x2 * c + x1 * s;
    }
}

extern "C" int dit_cuda_rope(float *x, int stride, const struct dit_heads *h, const float *cs, void *stream)
{
    int n_seq = h->n_seq, T = h->T, n_heads = h->n_heads, head_dim = h->head_dim, rotary_dim = h->rotary_dim;
    if (n_seq < 0 || T < 1 || n_heads < 1 || rotary_dim < 2 || rotary_dim % 2 || rotary_dim > head_dim ||
        stride < n_heads * head_dim || !x || !cs)
        return mm3_errorf(-EINVAL,
                          "dit_cuda_rope: %d x %d rows, %d heads of %d, rotary %d, stride %d: expected an even "
                          "rotary_dim <= head_dim and stride >= heads x head_dim",
                          n_seq, T, n_heads, head_dim, rotary_dim, stride);
    size_t rows = (size_t)n_seq * T;
    if (rows == 0) return 0;
    int half = rotary_dim / 2;
    rope_kernel<<<dit_cuda_blocks(rows * n_heads * half, 256), 256, 0, (cudaStream_t)stream>>>(
        x, rows, T, stride, n_heads, head_dim, half, cs);
    return dit_cuda_launched("rope_kernel");
}

/* ---- SiLU, gating, conversion ----------------------------------------------------- */

__device__ __forceinline__ float silu(float z)
{
    return z / (1.0f + expf(-z));
}

__global__ void silu_gate_kernel(void *act, int fmt, const float *g, size_t n, int ff)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / ff, c = e % ff;
        const float *gr = g + r * 2 * ff;
        dit_store_operand(act, e, silu(gr[ff + c]) * gr[c], fmt);
    }
}

/* ff % 4 == 0: 16-byte loads, a row per grid row (no 64-bit division per element). */
__global__ void silu_gate_vec_kernel(void *act, int fmt, const float *g, int n, int ff4)
{
    for (int r = blockIdx.y; r < n; r += gridDim.y) {
        const float4 *val = (const float4 *)(g + (size_t)r * 8 * ff4);
        const float4 *gate = val + ff4;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < ff4; c += gridDim.x * blockDim.x) {
            float4 v = val[c], q = gate[c];
            float4 o = make_float4(silu(q.x) * v.x, silu(q.y) * v.y, silu(q.z) * v.z, silu(q.w) * v.w);
            dit_store_operand4(act, (size_t)r * ff4 + c, o, fmt);
        }
    }
}

extern "C" int dit_cuda_silu_gate(void *act, int out_fmt, const float *g, int n, int ff, void *stream)
{
    if (n < 0 || ff < 1 || !act || !g)
        return mm3_errorf(-EINVAL, "dit_cuda_silu_gate: %d rows of %d: expected rows >= 0, ff >= 1", n, ff);
    size_t total = (size_t)n * ff;
    if (total == 0) return 0;
    if (ff % 4 == 0 && ((uintptr_t)act | (uintptr_t)g) % 16 == 0) {
        int ff4 = ff / 4, threads = ff4 < 256 ? 32 * ((ff4 + 31) / 32) : 256;
        dim3 grid((unsigned)((ff4 + threads - 1) / threads), (unsigned)(n < 65535 ? n : 65535));
        silu_gate_vec_kernel<<<grid, threads, 0, (cudaStream_t)stream>>>(act, out_fmt, g, n, ff4);
        return dit_cuda_launched("silu_gate_vec_kernel");
    }
    silu_gate_kernel<<<dit_cuda_blocks(total, 256), 256, 0, (cudaStream_t)stream>>>(act, out_fmt, g, total, ff);
    return dit_cuda_launched("silu_gate_kernel");
}

__global__ void silu_kernel(void *y, int fmt, const float *x, size_t n)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dit_store_operand(y, e, silu(x[e]), fmt);
}

extern "C" int dit_cuda_silu(void *y, int out_fmt, const float *x, size_t n, void *stream)
{
    if (!y || !x) return mm3_errorf(-EINVAL, "dit_cuda_silu: NULL pointer");
    if (n == 0) return 0;
    silu_kernel<<<dit_cuda_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>(y, out_fmt, x, n);
    return dit_cuda_launched("silu_kernel");
}

__global__ void to_operand_kernel(void *dst, int fmt, const float *src, size_t n)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dit_store_operand(dst, e, src[e], fmt);
}

extern "C" int dit_cuda_to_operand(void *dst, int fmt, const float *src, size_t n, void *stream)
{
    if (!dst || !src) return mm3_errorf(-EINVAL, "dit_cuda_to_operand: NULL pointer");
    if (fmt < DIT_OPERAND_F32 || fmt > DIT_OPERAND_F16_SCALED)
        return mm3_errorf(-EINVAL, "dit_cuda_to_operand: operand type %d: expected 0..%d", fmt, DIT_OPERAND_F16_SCALED);
    if (n == 0) return 0;
    to_operand_kernel<<<dit_cuda_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>(dst, fmt, src, n);
    return dit_cuda_launched("to_operand_kernel");
}

/* ---- fp16 rescues -------------------------------------------------------------------- */

static unsigned long long f16_rescues;

extern "C" unsigned long long dit_cuda_f16_rescues(void)
{
    return __atomic_load_n(&f16_rescues, __ATOMIC_RELAXED);
}

extern "C" void dit_cuda_count_f16_rescue(void)
{
    __atomic_fetch_add(&f16_rescues, 1, __ATOMIC_RELAXED);
}

/* ---- time token, input and output layout --------------------------------------------- */

__global__ void time_features_kernel(float *out, const float *t, const float *time_proj, int B, int half)
{
    int n = B * half;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        int b = e / half, k = e % half;
        /* torch: (2.0 * math.pi * t): the double constant is rounded to float first */
        float tt = (float)(2.0 * M_PI) * t[b];
        float ang = tt * time_proj[k];
        float s, c;
        sincosf(ang, &s, &c);
        out[(size_t)b * 2 * half + k] = c;
        out[(size_t)b * 2 * half + half + k] = s;
    }
}

extern "C" int dit_cuda_time_features(float *out, const float *t, const float *time_proj, int B, int fourier_dim,
                                      void *stream)
{
    if (B < 1 || fourier_dim < 2 || fourier_dim % 2 || !out || !t || !time_proj)
        return mm3_errorf(-EINVAL, "dit_cuda_time_features: B %d, fourier_dim %d: expected B >= 1, even dim", B,
                          fourier_dim);
    int half = fourier_dim / 2;
    time_features_kernel<<<dit_cuda_blocks((size_t)B * half, 256), 256, 0, (cudaStream_t)stream>>>(out, t, time_proj, B,
                                                                                                   half);
    return dit_cuda_launched("time_features_kernel");
}

__global__ void embed_input_kernel(float *h0, const float *x, const float *cond, int L, int C, int Cd)
{
    int width = 2 * C + Cd;
    size_t n = (size_t)L * width;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(e / width), c = (int)(e % width);
        float v = 0.0f;
        if (c < C)
            v = x[(size_t)c * L + j];
        else if (c >= 2 * C && cond)
            v = cond[(size_t)j * Cd + (c - 2 * C)];
        h0[e] = v;
    }
}

extern "C" int dit_cuda_embed_input(float *h0, const float *x, const float *cond, int L, int in_ch, int cond_dim,
                                    void *stream)
{
    if (L < 1 || in_ch < 1 || cond_dim < 0 || !h0 || !x)
        return mm3_errorf(-EINVAL, "dit_cuda_embed_input: L %d, in_ch %d, cond_dim %d: expected positive sizes", L,
                          in_ch, cond_dim);
    size_t n = (size_t)L * (2 * in_ch + cond_dim);
    embed_input_kernel<<<dit_cuda_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>(h0, x, cond, L, in_ch, cond_dim);
    return dit_cuda_launched("embed_input_kernel");
}

__global__ void transpose_out_kernel(float *v, const float *y, int L, int C)
{
    size_t n = (size_t)L * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(e / L), j = (int)(e % L);
        v[e] = y[(size_t)j * C + c];
    }
}

extern "C" int dit_cuda_transpose_out(float *v, const float *y, int L, int in_ch, void *stream)
{
    if (L < 1 || in_ch < 1 || !v || !y)
        return mm3_errorf(-EINVAL, "dit_cuda_transpose_out: L %d, in_ch %d: expected positive sizes", L, in_ch);
    transpose_out_kernel<<<dit_cuda_blocks((size_t)L * in_ch, 256), 256, 0, (cudaStream_t)stream>>>(v, y, L, in_ch);
    return dit_cuda_launched("transpose_out_kernel");
}
