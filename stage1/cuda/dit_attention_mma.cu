/* The bf16 attention of the DiT on mma.sync (m16n8k16, bf16 operands, float32
 * accumulators), flash-attention-2 style: each warp keeps its 16 query rows' scores,
 * probabilities and output in registers, whose fragment layout the PTX ISA fixes,
 * so the online softmax needs no trip through shared memory (the WMMA kernel of
 * dit_attention.cu has to store S and O to shared memory for that). Keys and values
 * stream through shared memory in tiles of 64; V is stored transposed there so that
 * both B operands are single 32-bit loads. */
#include <cmath>
#include <cstdint>

#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/dit_kernels.h"

enum { MQ = 64, MK = 64, MTHREADS = 128 };

template <int HD> struct mma_cfg {
    static const int QLD = HD + 8; /* Qs, Ks rows (bf16): 16-byte padding keeps fragment loads conflict-free */
    static const int VLD = MK + 8; /* Vt rows */
    static const size_t SMEM = (size_t)(MQ + MK) * QLD * 2 + (size_t)HD * VLD * 2;
};

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

template <int HD>
__global__ void __launch_bounds__(MTHREADS) attn_mma_kernel(void *out, int out_fmt, const float *qkv, int T, int H,
                                                            int half, const float *cs, float scale_log2, bool vec)
{
    typedef mma_cfg<HD> C;
    const int QLD = C::QLD, VLD = C::VLD;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *Ks = Qs + MQ * QLD;
    __nv_bfloat16 *Vt = Ks + MK * QLD;

    int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * MQ;
    int D = H * HD, rot = 2 * half, tid = threadIdx.x;
    size_t ld = 3 * (size_t)D;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * HD;

    /* vec: 16-byte loads (the rotated halves split into groups of four, aligned rows) */
    if (vec) {
        for (int e = tid; e < MQ * HD / 4; e += MTHREADS) {
            int r = e / (HD / 4), d = 4 * (e % (HD / 4)), t = q0 + r;
            float4 v = t < T ? rope_at4(base + t * ld, d, half, cs + (size_t)t * rot) : make_float4(0, 0, 0, 0);
            uint32_t *q = (uint32_t *)(Qs + r * QLD + d);
            q[0] = pack_bf16(v.x, v.y);
            q[1] = pack_bf16(v.z, v.w);
        }
    } else {
        for (int e = tid; e < MQ * HD; e += MTHREADS) {
            int r = e / HD, d = e % HD, t = q0 + r;
            Qs[r * QLD + d] = __float2bfloat16_rn(t < T ? rope_at(base + t * ld, d, half, cs + (size_t)t * rot) : 0.0f);
        }
    }
    __syncthreads();

    int warp = tid / 32, lane = tid % 32, g = lane >> 2, tg = lane & 3;
    uint32_t qa[HD / 16][4];
    {
        const __nv_bfloat16 *q = Qs + warp * 16 * QLD;
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) {
            int c = kc * 16 + 2 * tg;
            qa[kc][0] = *(const uint32_t *)(q + g * QLD + c);
            qa[kc][1] = *(const uint32_t *)(q + (g + 8) * QLD + c);
            qa[kc][2] = *(const uint32_t *)(q + g * QLD + c + 8);
            qa[kc][3] = *(const uint32_t *)(q + (g + 8) * QLD + c + 8);
        }
    }
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f; /* rows g and g + 8; l is this lane's share */

    for (int k0 = 0; k0 < T; k0 += MK) {
        if (vec) {
            for (int e = tid; e < MK * HD / 4; e += MTHREADS) {
                int j = e / (HD / 4), d = 4 * (e % (HD / 4)), key = k0 + j;
                float4 kv = make_float4(0, 0, 0, 0), vv = kv;
                if (key < T) {
                    const float *r = base + key * ld;
                    kv = rope_at4(r + D, d, half, cs + (size_t)key * rot);
                    vv = *(const float4 *)(r + 2 * D + d);
                }
                uint32_t *k = (uint32_t *)(Ks + j * QLD + d);
                k[0] = pack_bf16(kv.x, kv.y);
                k[1] = pack_bf16(kv.z, kv.w);
                Vt[d * VLD + j] = __float2bfloat16_rn(vv.x);
                Vt[(d + 1) * VLD + j] = __float2bfloat16_rn(vv.y);
                Vt[(d + 2) * VLD + j] = __float2bfloat16_rn(vv.z);
                Vt[(d + 3) * VLD + j] = __float2bfloat16_rn(vv.w);
            }
        } else {
            for (int e = tid; e < MK * HD; e += MTHREADS) {
                int j = e / HD, d = e % HD, key = k0 + j;
                float kv = 0.0f, vv = 0.0f;
                if (key < T) {
                    const float *r = base + key * ld;
                    kv = rope_at(r + D, d, half, cs + (size_t)key * rot);
                    vv = r[2 * D + d];
                }
                Ks[j * QLD + d] = __float2bfloat16_rn(kv);
                Vt[d * VLD + j] = __float2bfloat16_rn(vv);
            }
        }
        __syncthreads();

        float s[MK / 8][4];
#pragma unroll
        for (int n = 0; n < MK / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            const __nv_bfloat16 *kr = Ks + (n * 8 + g) * QLD + 2 * tg;
#pragma unroll
            for (int kc = 0; kc < HD / 16; kc++)
                mma_bf16(s[n], qa[kc], *(const uint32_t *)(kr + kc * 16), *(const uint32_t *)(kr + kc * 16 + 8));
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < MK / 8; n++) {
            int key = k0 + n * 8 + 2 * tg;
            s[n][0] = key < T ? s[n][0] * scale_log2 : -INFINITY;
            s[n][1] = key + 1 < T ? s[n][1] * scale_log2 : -INFINITY;
            s[n][2] = key < T ? s[n][2] * scale_log2 : -INFINITY;
            s[n][3] = key + 1 < T ? s[n][3] * scale_log2 : -INFINITY;
            mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
            mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
        }
        /* the four lanes of a quad share a row */
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1); /* finite: key k0 < T is in every tile */
        float a0 = exp2f(m0 - n0), a1 = exp2f(m1 - n1);
        m0 = n0, m1 = n1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int n = 0; n < MK / 8; n++) {
            s[n][0] = exp2f(s[n][0] - n0);
            s[n][1] = exp2f(s[n][1] - n0);
            s[n][2] = exp2f(s[n][2] - n1);
            s[n][3] = exp2f(s[n][3] - n1);
            sum0 += s[n][0] + s[n][1];
            sum1 += s[n][2] + s[n][3];
        }
        l0 = l0 * a0 + sum0;
        l1 = l1 * a1 + sum1;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= a0, o[n][1] *= a0;
            o[n][2] *= a1, o[n][3] *= a1;
        }
        /* the score fragments are already laid out as the A operand of P V */
#pragma unroll
        for (int kc = 0; kc < MK / 16; kc++) {
            uint32_t pa[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]), pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                              pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                              pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                const __nv_bfloat16 *vr = Vt + (n * 8 + g) * VLD + kc * 16 + 2 * tg;
                mma_bf16(o[n], pa, *(const uint32_t *)vr, *(const uint32_t *)(vr + 8));
            }
        }
        __syncthreads(); /* Ks and Vt are refilled next */
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float i0 = 1.0f / l0, i1 = 1.0f / l1;
    int t0 = q0 + warp * 16 + g, t1 = t0 + 8;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
        int c = h * HD + n * 8 + 2 * tg;
        if (t0 < T) {
            size_t i = ((size_t)b * T + t0) * D + c;
            dit_store_operand(out, i, o[n][0] * i0, out_fmt);
            dit_store_operand(out, i + 1, o[n][1] * i0, out_fmt);
        }
        if (t1 < T) {
            size_t i = ((size_t)b * T + t1) * D + c;
            dit_store_operand(out, i, o[n][2] * i1, out_fmt);
            dit_store_operand(out, i + 1, o[n][3] * i1, out_fmt);
        }
    }
}

template <int HD> static int launch_mma(const struct dit_attention *a, int half, cudaStream_t s)
{
    const float *qkv = a->qkv, *cs = a->cs;
    int T = a->heads.T, H = a->heads.n_heads;
    size_t smem = mma_cfg<HD>::SMEM;
    static const cudaError_t attr =
        cudaFuncSetAttribute(attn_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    int rc = dit_cuda_status(attr, "cudaFuncSetAttribute (mma attention shared memory)");
    if (rc < 0) return rc;
    dim3 grid((T + MQ - 1) / MQ, H, a->heads.n_seq);
    bool vec = half % 4 == 0 && ((uintptr_t)qkv | (uintptr_t)cs) % 16 == 0;
    attn_mma_kernel<HD>
        <<<grid, MTHREADS, smem, s>>>(a->out, a->out_fmt, qkv, T, H, half, cs, a->scale * (float)M_LOG2E, vec);
    return dit_cuda_launched("attn_mma_kernel");
}

int dit_attention_mma_bf16(const struct dit_attention *a, int half, cudaStream_t s)
{
    switch (a->heads.head_dim) {
    case 32:
        return launch_mma<32>(a, half, s);
    case 64:
        return launch_mma<64>(a, half, s);
    case 128:
        return launch_mma<128>(a, half, s);
    default:
        return mm3_errorf(-EINVAL, "attention: head_dim %d: the mma kernel supports 32, 64, 128", a->heads.head_dim);
    }
}
