/* Simple, correct kernels for the GPU talker (see talker_kernels.h); the decode hot
 * path uses common/cuda's split-K attention where its layout fits. */
#include <math.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/head_norm_rope.cuh"
#include "common/cuda/kv_elem.cuh"
#include "common/cuda/pdl.cuh"
#include "stage0/model/cuda/talker_kernels.h"

enum { ATT_WARPS = 4, ATT_PER_LANE = TALKER_CUDA_MAX_HEAD_DIM / 32 };

template <typename KT>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_rows_kernel(float *__restrict__ out, const float *__restrict__ q, size_t q_stride,
                          const KT *__restrict__ kc, const KT *__restrict__ vc, const int *__restrict__ row,
                          const int *__restrict__ pos, int n_heads, int group, int D, size_t row_stride,
                          size_t pos_stride, float scale)
{
    pdl_launch_dependents();
    pdl_wait();
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][TALKER_CUDA_MAX_HEAD_DIM];
    const int h = blockIdx.x, i = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int p = pos[i];
    const float *qi = q + (size_t)i * q_stride + (size_t)h * D;
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
        const KT *kr = kc + base + (size_t)j * pos_stride;
        const KT *vr = vc + base + (size_t)j * pos_stride;
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < ATT_PER_LANE; t++) {
            int d = lane + 32 * t;
            if (d < D) s = fmaf(qv[t], kv_widen(kr[d]), s);
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
            if (d < D) acc[t] = acc[t] * c + e * kv_widen(vr[d]);
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

extern "C" int talker_cuda_attention_rows_kv(float *out, const float *q, size_t q_stride,
                                             const struct cuda_kv_cache *kv, const struct talker_kv_slots *slots,
                                             const struct attention_heads *heads, void *stream)
{
    const int *row = slots->row, *pos = slots->pos;
    const int n_tok = slots->n;
    if (n_tok == 0) return 0;
    const int n_heads = heads->n_heads, n_kv_heads = heads->n_kv_heads, head_dim = heads->head_dim;
    const enum cuda_kv_dtype kv_dtype = kv->dtype;
    const size_t row_stride = kv->seq_stride, pos_stride = kv->row_stride;
    const float scale = heads->scale;
    if (n_tok < 0 || n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
        head_dim > TALKER_CUDA_MAX_HEAD_DIM || n_tok > 65535 || q_stride < (size_t)n_heads * head_dim)
        return mm3_errorf(-EINVAL,
                          "talker_cuda_attention_rows_kv: %d tokens, %d/%d heads of %d, q stride %zu: expected heads a "
                          "multiple of kv heads, head_dim 1..%d, at most 65535 tokens, q stride >= heads x head_dim",
                          n_tok, n_heads, n_kv_heads, head_dim, q_stride, TALKER_CUDA_MAX_HEAD_DIM);
    if (kv_dtype != CUDA_KV_F32 && kv_dtype != CUDA_KV_BF16)
        return mm3_errorf(-EINVAL, "talker_cuda_attention_rows_kv: kv dtype %d: expected CUDA_KV_F32 or CUDA_KV_BF16",
                          (int)kv_dtype);
    dim3 grid((unsigned)n_heads, (unsigned)n_tok);
    cudaStream_t st = cuda_stream_of(stream);
    int group = n_heads / n_kv_heads;
    if (kv_dtype == CUDA_KV_BF16)
        return launch_pdl("attention_rows_kernel<uint16_t>", attention_rows_kernel<uint16_t>, grid, ATT_WARPS * 32, 0,
                          st, out, q, q_stride, (const uint16_t *)kv->k, (const uint16_t *)kv->v, row, pos, n_heads,
                          group, head_dim, row_stride, pos_stride, scale);
    else
        return launch_pdl("attention_rows_kernel<float>", attention_rows_kernel<float>, grid, ATT_WARPS * 32, 0, st,
                          out, q, q_stride, (const float *)kv->k, (const float *)kv->v, row, pos, n_heads, group,
                          head_dim, row_stride, pos_stride, scale);
}

/* blockIdx.z: 0 = K, 1 = V. */
template <typename KT>
__global__ void kv_store_pair_kernel(KT *__restrict__ kc, KT *__restrict__ vc, const float *__restrict__ k,
                                     const float *__restrict__ v, size_t src_stride, const int *__restrict__ row,
                                     const int *__restrict__ pos, int width, size_t row_stride, size_t pos_stride)
{
    pdl_launch_dependents();
    pdl_wait();
    const int i = blockIdx.y;
    KT *dst = (blockIdx.z ? vc : kc) + (size_t)row[i] * row_stride + (size_t)pos[i] * pos_stride;
    const float *src = (blockIdx.z ? v : k) + (size_t)i * src_stride;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) {
        dst[c] = kv_narrow<KT>(src[c]);
    }
}

extern "C" int talker_cuda_kv_store_pair(const struct cuda_kv_cache *kv, const float *k, const float *v,
                                         size_t src_stride, const struct talker_kv_slots *slots, int width,
                                         void *stream)
{
    const int *row = slots->row, *pos = slots->pos;
    const int n = slots->n;
    if (n == 0) return 0;
    const enum cuda_kv_dtype kv_dtype = kv->dtype;
    const size_t row_stride = kv->seq_stride, pos_stride = kv->row_stride;
    if (n < 0 || n > 65535 || width <= 0 || src_stride < (size_t)width)
        return mm3_errorf(-EINVAL,
                          "talker_cuda_kv_store_pair: %d tokens of width %d, source stride %zu: expected 0..65535 "
                          "tokens, width > 0, stride >= width",
                          n, width, src_stride);
    if (kv_dtype != CUDA_KV_F32 && kv_dtype != CUDA_KV_BF16)
        return mm3_errorf(-EINVAL, "talker_cuda_kv_store_pair: kv dtype %d: expected CUDA_KV_F32 or CUDA_KV_BF16",
                          (int)kv_dtype);
    dim3 grid((unsigned)((width + 255) / 256), (unsigned)n, 2);
    cudaStream_t st = cuda_stream_of(stream);
    if (kv_dtype == CUDA_KV_BF16)
        return launch_pdl("kv_store_pair_kernel<uint16_t>", kv_store_pair_kernel<uint16_t>, grid, 256, 0, st,
                          (uint16_t *)kv->k, (uint16_t *)kv->v, k, v, src_stride, row, pos, width, row_stride,
                          pos_stride);
    else
        return launch_pdl("kv_store_pair_kernel<float>", kv_store_pair_kernel<float>, grid, 256, 0, st, (float *)kv->k,
                          (float *)kv->v, k, v, src_stride, row, pos, width, row_stride, pos_stride);
}

/* One warp per (token, item): items [0, n_heads) are q heads, then n_kv_heads k heads,
 * then n_kv_heads v heads. The norm and RoPE are elementwise.cu's qk_norm_rope_kernel
 * step for step (same operations, same order), so the results are bit-identical. */
template <typename KT>
__global__ void qkv_norm_rope_store_kernel(float *qkv, int n, int n_heads, int n_kv_heads, int D,
                                           const float *__restrict__ q_norm, const float *__restrict__ k_norm,
                                           float eps, int rotary_dim, const int *__restrict__ pos,
                                           const float *__restrict__ inv_freq, KT *__restrict__ kc, KT *__restrict__ vc,
                                           const int *__restrict__ row, size_t row_stride, size_t pos_stride)
{
    pdl_launch_dependents();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int items = n_heads + 2 * n_kv_heads;
    const long item = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (item >= (long)n * items) return;
    const int t = (int)(item / items), h = (int)(item % items);
    const size_t width = (size_t)items * D;
    float *u = qkv + (size_t)t * width + (size_t)h * D;
    if (h >= n_heads + n_kv_heads) { /* v head: stored as is */
        const int g = h - n_heads - n_kv_heads;
        KT *dst = vc + (size_t)row[t] * row_stride + (size_t)pos[t] * pos_stride + (size_t)g * D;
        for (int i = lane; i < D; i += 32) {
            dst[i] = kv_narrow<KT>(u[i]);
        }
        return;
    }
    const float *w = h < n_heads ? q_norm : k_norm;
    warp_head_norm_rope(u, D, w, eps, rotary_dim, (float)pos[t], inv_freq, lane);
    if (h < n_heads) return;
    __syncwarp(); /* the store reads elements other lanes' RoPE wrote */
    KT *dst = kc + (size_t)row[t] * row_stride + (size_t)pos[t] * pos_stride + (size_t)(h - n_heads) * D;
    for (int i = lane; i < D; i += 32) {
        dst[i] = kv_narrow<KT>(u[i]);
    }
}

extern "C" int talker_cuda_qkv_norm_rope_store(float *qkv, int n, const struct attention_heads *heads,
                                               const struct cuda_qkv_prep *prep, const struct cuda_kv_cache *kv,
                                               const int *row, void *stream)
{
    if (n == 0) return 0;
    const int n_heads = heads->n_heads, n_kv_heads = heads->n_kv_heads, head_dim = heads->head_dim;
    const int rotary_dim = prep->rotary_dim;
    const int *pos = prep->pos;
    const float *inv_freq = prep->inv_freq;
    const enum cuda_kv_dtype kv_dtype = kv->dtype;
    const size_t row_stride = kv->seq_stride, pos_stride = kv->row_stride;
    if (n < 0 || n_heads < 1 || n_kv_heads < 1 || head_dim < 1 || head_dim > 1024 || rotary_dim < 0 ||
        rotary_dim > head_dim || rotary_dim % 2 || (rotary_dim > 0 && (!pos || !inv_freq)))
        return mm3_errorf(-EINVAL,
                          "talker_cuda_qkv_norm_rope_store: %d tokens, %d/%d heads of %d, rotary_dim %d: expected "
                          "head_dim 1..1024, rotary_dim even and <= head_dim (with pos and inv_freq)",
                          n, n_heads, n_kv_heads, head_dim, rotary_dim);
    if (kv_dtype != CUDA_KV_F32 && kv_dtype != CUDA_KV_BF16)
        return mm3_errorf(-EINVAL, "talker_cuda_qkv_norm_rope_store: kv dtype %d: expected CUDA_KV_F32 or CUDA_KV_BF16",
                          (int)kv_dtype);
    const long items = (long)n * (n_heads + 2 * n_kv_heads);
    const int warps_per_block = 4;
    const long blocks = (items + warps_per_block - 1) / warps_per_block;
    if (blocks > 0x7fffffffL) return mm3_errorf(-EINVAL, "talker_cuda_qkv_norm_rope_store: %d tokens: too many", n);
    cudaStream_t st = cuda_stream_of(stream);
    if (kv_dtype == CUDA_KV_BF16)
        return launch_pdl("qkv_norm_rope_store_kernel<uint16_t>", qkv_norm_rope_store_kernel<uint16_t>,
                          (unsigned)blocks, 32 * warps_per_block, 0, st, qkv, n, n_heads, n_kv_heads, head_dim,
                          prep->q_norm, prep->k_norm, prep->eps, rotary_dim, pos, inv_freq, (uint16_t *)kv->k,
                          (uint16_t *)kv->v, row, row_stride, pos_stride);
    else
        return launch_pdl("qkv_norm_rope_store_kernel<float>", qkv_norm_rope_store_kernel<float>, (unsigned)blocks,
                          32 * warps_per_block, 0, st, qkv, n, n_heads, n_kv_heads, head_dim, prep->q_norm,
                          prep->k_norm, prep->eps, rotary_dim, pos, inv_freq, (float *)kv->k, (float *)kv->v, row,
                          row_stride, pos_stride);
}

__global__ void add_row_kernel(float *__restrict__ y, const float *__restrict__ x, size_t total, int width)
{
    pdl_launch_dependents();
    pdl_wait();
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x)
        y[k] += x[k % (size_t)width];
}

extern "C" int talker_cuda_add_row(float *y, const float *x, int n_rows, int width, void *stream)
{
    if (n_rows == 0) return 0;
    if (n_rows < 0 || width <= 0) return mm3_errorf(-EINVAL, "talker_cuda_add_row: %d rows of width %d", n_rows, width);
    size_t total = (size_t)n_rows * width;
    unsigned blocks = (unsigned)((total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096);
    return launch_pdl("add_row_kernel", add_row_kernel, blocks, 256, 0, cuda_stream_of(stream), y, x, total, width);
}

extern "C" int talker_cuda_h2d_async(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream_of(stream)),
                       "cudaMemcpyAsync (host to device)");
}
