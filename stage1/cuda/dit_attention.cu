/* Bidirectional flash-style attention of the DiT (dit_cuda_attention in
 * stage1/cuda/dit_kernels.h): one block per (64-query tile, head, sequence), keys
 * streamed through shared memory in tiles, online float32 softmax, partial RoPE
 * applied to q and k as they are loaded (the table holds cos/sin per position).
 *
 * One kernel per precision and shape class (dit_cuda_attention_kernel dispatches):
 * - fp32: the float32 SIMT kernel here (each thread owns one query row): the only one
 *   that computes in float32, as the fp32 precision promises. It also serves heads of 8
 *   and 16 (small test geometries) in every precision: the tensor-core tiles start at 32.
 * - tf32, bf16, fp16: the flash kernel (dit_attention_flash.cu), the fastest.
 * - where the flash kernel's loads do not fit (a rotary half not a multiple of 4,
 *   unaligned rows): the tensor-core kernel here (WMMA, tf32 or bf16 operands, float32
 *   accumulators; each warp owns 16 query rows, its running output in shared memory in
 *   float32, so the per-row rescale needs no fragment layout), or for bf16
 *   dit_attention_mma.cu (mma.sync, everything in registers), which loads element-wise. */
#include <cmath>
#include <cstdint>
#include <mma.h>
#include <type_traits>

#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/dit_kernels.h"

using namespace nvcuda;

/* dit_attention_flash.cu (only this file calls it) */
int dit_attention_flash(const struct dit_attention *a, int half, int op, cudaStream_t s);
bool dit_attention_flash_usable(const void *out, const float *qkv, int half, const float *cs);

/* ---- float32 SIMT ----------------------------------------------------------------- */

enum { SIMT_Q = 64, SIMT_K = 32 };

template <int HD>
__global__ void __launch_bounds__(SIMT_Q)
    attn_simt_kernel(void *out, int out_fmt, const float *qkv, int T, int H, int half, const float *cs, float scale)
{
    __shared__ float Ks[SIMT_K][HD], Vs[SIMT_K][HD];
    int b = blockIdx.z, h = blockIdx.y, qi = blockIdx.x * SIMT_Q + threadIdx.x;
    int D = H * HD, rot = 2 * half;
    size_t ld = 3 * (size_t)D;
    const float *base = qkv + (size_t)b * T * ld;
    bool valid = qi < T;
    float q[HD], o[HD];
    float m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int d = 0; d < HD; d++) {
        q[d] = valid ? rope_at(base + qi * ld + (size_t)h * HD, d, half, cs + (size_t)qi * rot) : 0.0f;
        o[d] = 0.0f;
    }
    for (int k0 = 0; k0 < T; k0 += SIMT_K) {
        __syncthreads(); /* the previous tile is consumed */
        for (int e = threadIdx.x; e < SIMT_K * HD; e += SIMT_Q) {
            int j = e / HD, d = e % HD, key = k0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (key < T) {
                const float *row = base + key * ld + (size_t)h * HD;
                kv = rope_at(row + D, d, half, cs + (size_t)key * rot);
                vv = row[2 * D + d];
            }
            Ks[j][d] = kv;
            Vs[j][d] = vv;
        }
        __syncthreads();
        if (!valid) continue;
        float s[SIMT_K];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < SIMT_K; j++) {
            float acc = 0.0f;
#pragma unroll
            for (int d = 0; d < HD; d++)
                acc += q[d] * Ks[j][d];
            s[j] = k0 + j < T ? acc * scale : -INFINITY;
            mx = fmaxf(mx, s[j]);
        }
        float m_new = fmaxf(m, mx); /* finite: every tile holds key k0 < T */
        float corr = expf(m - m_new);
        l *= corr;
#pragma unroll
        for (int d = 0; d < HD; d++)
            o[d] *= corr;
#pragma unroll
        for (int j = 0; j < SIMT_K; j++) {
            float p = expf(s[j] - m_new);
            l += p;
#pragma unroll
            for (int d = 0; d < HD; d++)
                o[d] += p * Vs[j][d];
        }
        m = m_new;
    }
    if (!valid) return;
    size_t ob = ((size_t)b * T + qi) * D + (size_t)h * HD;
#pragma unroll
    for (int d = 0; d < HD; d++)
        dit_store_operand(out, ob + d, o[d] / l, out_fmt);
}

/* ---- tensor cores (WMMA) ----------------------------------------------------------- */

enum { TC_Q = 64, TC_K = 64, TC_THREADS = 128 };

template <int HD, bool BF16> struct tc_cfg {
    typedef typename std::conditional<BF16, __nv_bfloat16, float>::type st; /* operand storage */
    typedef typename std::conditional<BF16, __nv_bfloat16, wmma::precision::tf32>::type frag_t;
    static const int KSTEP = BF16 ? 16 : 8;
    static const int PAD = BF16 ? 8 : 4; /* keeps ldm legal and rows off one bank */
    static const int QLD = HD + PAD;     /* Qs, Ks, Vs */
    static const int PLD = TC_K + PAD;   /* Ps */
    static const int SLD = (HD > TC_K ? HD : TC_K) + 4;
    static const int OLD = HD + 4;
    static const size_t SMEM = (size_t)(TC_Q + 2 * TC_K) * QLD * sizeof(st) + (size_t)TC_Q * PLD * sizeof(st) +
                               (size_t)TC_Q * SLD * 4 + (size_t)TC_Q * OLD * 4;
};

template <bool BF16> __device__ __forceinline__ typename tc_cfg<64, BF16>::st to_operand(float v);
template <> __device__ __forceinline__ __nv_bfloat16 to_operand<true>(float v)
{
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ float to_operand<false>(float v)
{
    return wmma::__float_to_tf32(v);
}

/* Four consecutive operands into shared memory (8 or 16 bytes, aligned by the layout). */
template <bool BF16> __device__ __forceinline__ void store4(typename tc_cfg<64, BF16>::st *p, float4 v);
template <> __device__ __forceinline__ void store4<true>(__nv_bfloat16 *p, float4 v)
{
    __nv_bfloat162 *q = (__nv_bfloat162 *)p;
    q[0] = __floats2bfloat162_rn(v.x, v.y);
    q[1] = __floats2bfloat162_rn(v.z, v.w);
}
template <> __device__ __forceinline__ void store4<false>(float *p, float4 v)
{
    *(float4 *)p = make_float4(wmma::__float_to_tf32(v.x), wmma::__float_to_tf32(v.y), wmma::__float_to_tf32(v.z),
                               wmma::__float_to_tf32(v.w));
}

template <int HD, bool BF16>
__global__ void __launch_bounds__(TC_THREADS) attn_tc_kernel(void *out, int out_fmt, const float *qkv, int T, int H,
                                                             int half, const float *cs, float scale_log2, bool vec)
{
    typedef tc_cfg<HD, BF16> C;
    typedef typename C::st st;
    typedef typename C::frag_t ft;
    const int KS = C::KSTEP, QLD = C::QLD, PLD = C::PLD, SLD = C::SLD, OLD = C::OLD;
    extern __shared__ __align__(128) unsigned char smem[];
    st *Qs = (st *)smem;
    st *Ks = Qs + TC_Q * QLD;
    st *Vs = Ks + TC_K * QLD;
    st *Ps = Vs + TC_K * QLD;
    float *Ss = (float *)(Ps + TC_Q * PLD);
    float *Os = Ss + TC_Q * SLD;

    int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * TC_Q;
    int D = H * HD, rot = 2 * half, tid = threadIdx.x;
    size_t ld = 3 * (size_t)D;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * HD;

    /* vec: 16-byte loads (the rotated halves split into groups of four, aligned rows) */
    if (vec) {
        for (int e = tid; e < TC_Q * HD / 4; e += TC_THREADS) {
            int r = e / (HD / 4), d = 4 * (e % (HD / 4)), t = q0 + r;
            float4 v = t < T ? rope_at4(base + t * ld, d, half, cs + (size_t)t * rot) : make_float4(0, 0, 0, 0);
            store4<BF16>(Qs + r * QLD + d, v);
        }
    } else {
        for (int e = tid; e < TC_Q * HD; e += TC_THREADS) {
            int r = e / HD, d = e % HD, t = q0 + r;
            float v = t < T ? rope_at(base + t * ld, d, half, cs + (size_t)t * rot) : 0.0f;
            Qs[r * QLD + d] = to_operand<BF16>(v);
        }
    }
    for (int e = tid; e < TC_Q * HD; e += TC_THREADS)
        Os[(e / HD) * OLD + e % HD] = 0.0f;
    __syncthreads();

    int warp = tid / 32, lane = tid % 32;
    int row = lane >> 1, hl = lane & 1; /* two lanes per query row in the softmax */
    wmma::fragment<wmma::matrix_a, 16, 16, KS, ft, wmma::row_major> qf[HD / KS];
#pragma unroll
    for (int k = 0; k < HD / KS; k++)
        wmma::load_matrix_sync(qf[k], Qs + warp * 16 * QLD + k * KS, QLD);

    float *Sw = Ss + warp * 16 * SLD;
    float m = -INFINITY, l = 0.0f;
    for (int k0 = 0; k0 < T; k0 += TC_K) {
        if (vec) {
            for (int e = tid; e < TC_K * HD / 4; e += TC_THREADS) {
                int j = e / (HD / 4), d = 4 * (e % (HD / 4)), key = k0 + j;
                float4 kv = make_float4(0, 0, 0, 0), vv = kv;
                if (key < T) {
                    const float *r = base + key * ld;
                    kv = rope_at4(r + D, d, half, cs + (size_t)key * rot);
                    vv = *(const float4 *)(r + 2 * D + d);
                }
                store4<BF16>(Ks + j * QLD + d, kv);
                store4<BF16>(Vs + j * QLD + d, vv);
            }
        } else {
            for (int e = tid; e < TC_K * HD; e += TC_THREADS) {
                int j = e / HD, d = e % HD, key = k0 + j;
                float kv = 0.0f, vv = 0.0f;
                if (key < T) {
                    const float *r = base + key * ld;
                    kv = rope_at(r + D, d, half, cs + (size_t)key * rot);
                    vv = r[2 * D + d];
                }
                Ks[j * QLD + d] = to_operand<BF16>(kv);
                Vs[j * QLD + d] = to_operand<BF16>(vv);
            }
        }
        __syncthreads();

        /* S = Q K^T for this warp's 16 rows */
#pragma unroll
        for (int n = 0; n < TC_K / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, KS, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int k = 0; k < HD / KS; k++) {
                wmma::fragment<wmma::matrix_b, 16, 16, KS, ft, wmma::col_major> kf;
                wmma::load_matrix_sync(kf, Ks + n * 16 * QLD + k * KS, QLD);
                wmma::mma_sync(acc, qf[k], kf, acc);
            }
            wmma::store_matrix_sync(Sw + n * 16, acc, SLD, wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax in float32 (base 2, the scale folded in) */
        float *sr = Sw + row * SLD + hl * (TC_K / 2);
        st *pr = Ps + (warp * 16 + row) * PLD + hl * (TC_K / 2);
        float mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < TC_K / 2; c++) {
            int key = k0 + hl * (TC_K / 2) + c;
            float v = key < T ? sr[c] * scale_log2 : -INFINITY;
            sr[c] = v;
            mx = fmaxf(mx, v);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        float m_new = fmaxf(m, mx);
        float alpha = exp2f(m - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int c = 0; c < TC_K / 2; c++) {
            float p = exp2f(sr[c] - m_new);
            sum += p;
            pr[c] = to_operand<BF16>(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        __syncwarp();

        /* P V into the (now free) score rows, then O = O * alpha + P V */
#pragma unroll
        for (int n = 0; n < HD / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, KS, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int k = 0; k < TC_K / KS; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, KS, ft, wmma::row_major> pf;
                wmma::fragment<wmma::matrix_b, 16, 16, KS, ft, wmma::row_major> vf;
                wmma::load_matrix_sync(pf, Ps + warp * 16 * PLD + k * KS, PLD);
                wmma::load_matrix_sync(vf, Vs + k * KS * QLD + n * 16, QLD);
                wmma::mma_sync(acc, pf, vf, acc);
            }
            wmma::store_matrix_sync(Sw + n * 16, acc, SLD, wmma::mem_row_major);
        }
        __syncwarp();
        float *orow = Os + (warp * 16 + row) * OLD + hl * (HD / 2);
        const float *pv = Sw + row * SLD + hl * (HD / 2);
#pragma unroll
        for (int c = 0; c < HD / 2; c++)
            orow[c] = orow[c] * alpha + pv[c];
        __syncthreads(); /* Ks/Vs are refilled next */
    }

    int t = q0 + warp * 16 + row;
    if (t >= T) return;
    const float *orow = Os + (warp * 16 + row) * OLD + hl * (HD / 2);
    size_t ob = ((size_t)b * T + t) * D + (size_t)h * HD + hl * (HD / 2);
    float inv = 1.0f / l;
#pragma unroll
    for (int c = 0; c < HD / 2; c++)
        dit_store_operand(out, ob + c, orow[c] * inv, out_fmt);
}

template <int HD, bool BF16> static int launch_tc(const struct dit_attention *a, int half, cudaStream_t s)
{
    const float *qkv = a->qkv, *cs = a->cs;
    int T = a->heads.T, H = a->heads.n_heads;
    size_t smem = tc_cfg<HD, BF16>::SMEM;
    /* once per instantiation: more than 48 KB of dynamic shared memory must be asked for */
    static const cudaError_t attr =
        cudaFuncSetAttribute(attn_tc_kernel<HD, BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int rc = dit_cuda_status(attr, "cudaFuncSetAttribute (attention shared memory)");
    if (rc < 0) return rc;
    dim3 grid((T + TC_Q - 1) / TC_Q, H, a->heads.n_seq);
    bool vec = half % 4 == 0 && ((uintptr_t)qkv | (uintptr_t)cs) % 16 == 0;
    attn_tc_kernel<HD, BF16>
        <<<grid, TC_THREADS, smem, s>>>(a->out, a->out_fmt, qkv, T, H, half, cs, a->scale * (float)M_LOG2E, vec);
    return dit_cuda_launched("attn_tc_kernel");
}

/* The flash kernel's product operands: fp16 as the GEMMs, except in a rescue run (scaled
 * operands: values beyond fp16's range are about), which computes in tf32. */
static int flash_operands(enum mm3_matmul_precision prec, int out_fmt)
{
    if (prec == MM3_MATMUL_BF16) return FLASH_BF16;
    if (prec == MM3_MATMUL_FP16 && out_fmt != DIT_OPERAND_F16_SCALED) return FLASH_F16;
    return FLASH_TF32;
}

template <int HD> static int launch_simt(const struct dit_attention *a, int half, cudaStream_t s)
{
    int T = a->heads.T, H = a->heads.n_heads;
    dim3 grid((T + SIMT_Q - 1) / SIMT_Q, H, a->heads.n_seq);
    attn_simt_kernel<HD><<<grid, SIMT_Q, 0, s>>>(a->out, a->out_fmt, a->qkv, T, H, half, a->cs, a->scale);
    return dit_cuda_launched("attn_simt_kernel");
}

/* a->prec as the kernels compute it (fp8 mapped to fp16); half = the rotated half of a head. */
template <int HD> static int launch(const struct dit_attention *a, int half, enum dit_attn_kernel k, cudaStream_t s)
{
    enum mm3_matmul_precision prec = a->prec;
    if (k == DIT_ATTN_FLASH) {
        if (dit_attention_flash_usable(a->out, a->qkv, half, a->cs))
            return dit_attention_flash(a, half, flash_operands(prec, a->out_fmt), s);
        k = prec == MM3_MATMUL_BF16 ? DIT_ATTN_MMA : DIT_ATTN_WMMA; /* odd rotary split or alignment */
    }
    if (k == DIT_ATTN_MMA) return dit_attention_mma_bf16(a, half, s);
    if (k == DIT_ATTN_WMMA && prec == MM3_MATMUL_BF16) return launch_tc<HD, true>(a, half, s);
    if (k == DIT_ATTN_WMMA) return launch_tc<HD, false>(a, half, s);
    return launch_simt<HD>(a, half, s);
}

/* What AUTO runs per precision (fp32, tf32, bf16, fp16; fp8's attention is fp16's);
 * dit_cuda_attention_default_set. */
static const enum dit_attn_kernel builtin_kernel[MM3_MATMUL_COUNT] = {DIT_ATTN_SIMT, DIT_ATTN_FLASH, DIT_ATTN_FLASH,
                                                                      DIT_ATTN_FLASH, DIT_ATTN_FLASH};
static enum dit_attn_kernel auto_kernel[MM3_MATMUL_COUNT] = {DIT_ATTN_SIMT, DIT_ATTN_FLASH, DIT_ATTN_FLASH,
                                                             DIT_ATTN_FLASH, DIT_ATTN_FLASH};

static bool kernel_computes(enum dit_attn_kernel k, enum mm3_matmul_precision prec)
{
    switch (k) {
    case DIT_ATTN_SIMT:
        return true;
    case DIT_ATTN_WMMA:
    case DIT_ATTN_FLASH:
        return prec != MM3_MATMUL_FP32;
    case DIT_ATTN_MMA:
        return prec == MM3_MATMUL_BF16;
    default:
        return false;
    }
}

extern "C" int dit_cuda_attention_default_set(enum mm3_matmul_precision prec, enum dit_attn_kernel kernel)
{
    if ((int)prec < 0 || prec >= MM3_MATMUL_COUNT)
        return mm3_errorf(-EINVAL, "dit_cuda_attention_default_set: precision %d: unknown", (int)prec);
    if (prec == MM3_MATMUL_FP8) prec = MM3_MATMUL_FP16;
    int i = (int)prec;
    if (kernel == DIT_ATTN_AUTO) kernel = builtin_kernel[i];
    if (!kernel_computes(kernel, prec))
        return mm3_errorf(-EINVAL, "dit_cuda_attention_default_set: kernel %d does not compute in precision %d",
                          (int)kernel, (int)prec);
    auto_kernel[i] = kernel;
    return 0;
}

extern "C" int dit_cuda_attention_kernel(const struct dit_attention *a, enum dit_attn_kernel kernel, void *stream)
{
    int n_seq = a->heads.n_seq, T = a->heads.T, n_heads = a->heads.n_heads, head_dim = a->heads.head_dim,
        rotary_dim = a->heads.rotary_dim;
    const float *cs = a->cs;
    enum mm3_matmul_precision prec = a->prec;
    if (!a->out || !a->qkv)
        return mm3_errorf(-EINVAL, "dit_cuda_attention: out %p, qkv %p: expected non-NULL", a->out,
                          (const void *)a->qkv);
    if (n_seq < 0 || T < 1 || n_heads < 1 || n_heads > 65535 || n_seq > 65535)
        return mm3_errorf(-EINVAL, "dit_cuda_attention: %d sequences of %d tokens, %d heads: expected positive sizes",
                          n_seq, T, n_heads);
    if (rotary_dim < 0 || rotary_dim % 2 || rotary_dim > head_dim || (rotary_dim > 0 && !cs))
        return mm3_errorf(-EINVAL, "dit_cuda_attention: rotary_dim %d: expected even, <= head_dim %d, with a table",
                          rotary_dim, head_dim);
    if ((int)prec < 0 || prec >= MM3_MATMUL_COUNT)
        return mm3_errorf(-EINVAL, "dit_cuda_attention: precision %d: unknown", (int)prec);
    if (prec == MM3_MATMUL_FP8) prec = MM3_MATMUL_FP16; /* fp8 is for the GEMMs: the attention computes in fp16 */
    if (kernel == DIT_ATTN_AUTO) kernel = auto_kernel[prec];
    if (!kernel_computes(kernel, prec))
        return mm3_errorf(-EINVAL, "dit_cuda_attention: kernel %d does not compute in precision %d", (int)kernel,
                          (int)prec);
    if (n_seq == 0) return 0;
    int half = cs ? rotary_dim / 2 : 0;
    cudaStream_t s = (cudaStream_t)stream;
    struct dit_attention run = *a;
    run.prec = prec;
    switch (head_dim) {
    case 8: /* small heads (test geometries): the float32 kernel in every precision */
        return launch_simt<8>(&run, half, s);
    case 16:
        return launch_simt<16>(&run, half, s);
    case 32:
        return launch<32>(&run, half, kernel, s);
    case 64:
        return launch<64>(&run, half, kernel, s);
    case 128:
        return launch<128>(&run, half, kernel, s);
    default:
        return mm3_errorf(-EINVAL, "dit_cuda_attention: attention_head_dim %d: the CUDA kernels support 8, 16, 32, 64, 128",
                          head_dim);
    }
}

extern "C" int dit_cuda_attention(const struct dit_attention *a, void *stream)
{
    return dit_cuda_attention_kernel(a, DIT_ATTN_AUTO, stream);
}
