/* The tensor-core attention of the DiT for the tf32, bf16 and fp16 operands
 * (DIT_ATTN_FLASH of dit_cuda_attention_kernel, the default where it applies): mma.sync with float32 accumulators,
 * flash-attention-2 style, scores / probabilities / output of a warp's query rows in registers (the fragment layout of
 * the PTX ISA).
 *
 * Why it is laid out this way (the kernels it replaces are in dit_attention.cu and
 * dit_attention_mma.cu):
 * - 16 * NW * MT queries per block, NW warps of MT m tiles of 16 rows: 128 queries as
 *   8 warps x 1 tile (FLASH_WARPS, FLASH_TILES), which ran closest to the tensor-core
 *   peak of the shapes tried (64 queries as 4 x 1, 128 as 4 x 2: docs/performance.md,
 *   the DiT attention). K and V tiles are converted
 *   from the float32 qkv buffer (RoPE applied to k on the way) once per block and
 *   shared by all its warps, so more queries per block means less conversion work
 *   per query. qkv is const and the contract has no scratch buffer, so RoPE cannot
 *   be applied once per layer in a pre-pass.
 * - Double-buffered K/V tiles, staged through registers: the next tile's global
 *   loads are issued before the current tile's products and converted after them,
 *   so one barrier per tile and the load latency hides behind the tensor cores.
 *   (cp.async cannot convert or rotate on the way, hence registers.)
 * - bf16 and fp16: m16n8k16; K and V stay row-major in shared memory and their B
 *   fragments come from ldmatrix (.trans for V), four 8x8 matrices per instruction.
 *   fp16 keeps tf32's 10-bit mantissa at bf16's rate; its range (65504) is the
 *   caller's concern (a rescue run computes in tf32).
 * - tf32: m16n8k8 with real tf32 operands (cvt.rna, as the WMMA kernel rounds).
 *   The contraction index of each product may be permuted freely as long as both
 *   operands agree, so fragment column tg stands for element 2tg and tg + 4 for
 *   2tg + 1: Q and K fragments are then one 64-bit shared load, and the score
 *   accumulators are the A operand of P V as they are (keys 2tg, 2tg + 1).
 * - Softmax in base 2 with the scale folded into one FMA; the key mask is applied
 *   only in the last (partial) tile.
 * Row strides are padded so that every fragment load is free of bank conflicts. */
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/dit_kernels.h"

namespace
{

const unsigned FULL = 0xffffffffu;

/* Keys per tile: the register-staged prefetch holds at most four 16-byte chunks of K
 * and four of V per thread (more spills at 128 registers); tf32 tiles take twice the
 * shared memory and registers per key and run at half the keys. */
template <int HD, int NW, int MT, int OP> struct fl_cfg {
    static const bool TF32 = OP == FLASH_TF32;
    /* tf32 operands stay float bits */
    typedef typename std::conditional<
        TF32, float, typename std::conditional<OP == FLASH_F16, __half, __nv_bfloat16>::type>::type st;
    static const int THREADS = 32 * NW;
    static const int QT = 16 * NW * MT;
    static const int KT0 = 512 * NW / HD > 64 ? 64 : 512 * NW / HD;
    static const int KT = TF32 ? (KT0 / 2 < 16 ? 16 : KT0 / 2) : KT0;
    static const int CPR = HD / 4;                 /* 16-byte float32 chunks per row */
    static const int NLD = KT * CPR / THREADS;     /* chunks of K (and of V) per thread per tile */
    static const int NLQ = QT * CPR / THREADS;     /* chunks of Q per thread */
    static const int LDK = HD + 8;                 /* Q and K rows: 16-bit ldmatrix / tf32 64-bit loads */
    static const int LDV = TF32 ? HD + 4 : HD + 8; /* V rows: tf32 32-bit loads */
    static const int TILE = KT * (LDK + LDV);      /* elements of one K + V buffer */
    static const size_t SMEM = (size_t)(QT * LDK + 2 * TILE) * sizeof(st);
    static_assert(NLD >= 1 && KT * CPR == NLD * THREADS, "tile does not divide among the threads");
    static_assert(CPR <= 32, "a row must lie within one warp for the RoPE partner exchange");
};

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The m16n8k16 product of a 16-bit operand type */
template <int OP> __device__ __forceinline__ void mma16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    if (OP == FLASH_F16)
        mma_f16(c, a, b0, b1);
    else
        mma_bf16(c, a, b0, b1);
}

__device__ __forceinline__ void mma_tf32(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ uint32_t tf32_bits(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

template <int OP> __device__ __forceinline__ uint32_t pack16x2(float lo, float hi)
{
    return OP == FLASH_F16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi);
}

/* Four float32 values as operands at p (16 bytes for tf32, 8 for bf16 and fp16, aligned). */
__device__ __forceinline__ void put4(float *p, float4 v)
{
    *(uint4 *)p = make_uint4(tf32_bits(v.x), tf32_bits(v.y), tf32_bits(v.z), tf32_bits(v.w));
}
__device__ __forceinline__ void put4(__nv_bfloat16 *p, float4 v)
{
    *(uint2 *)p = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
}
__device__ __forceinline__ void put4(__half *p, float4 v)
{
    *(uint2 *)p = make_uint2(pack_f16x2(v.x, v.y), pack_f16x2(v.z, v.w));
}

/* 2^x on the special-function unit; flushing denormal results to zero only drops
 * probabilities below 2^-126 (exp2f adds a range fix-up of three instructions). */
__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* NeoX half-split RoPE of one 16-byte chunk: the chunk of the other half comes from
 * lane `src` of the same warp (a row lies in CPR consecutive lanes; src = own lane
 * outside the rotated part), t points at the chunk's cos values in the table row, its
 * sin values are `half` further, sgn is -1 in the first half and +1 in the second.
 * Every lane must call it (the shuffles); `rotated` is false past the rotated
 * columns and for rows at or past T (zeros, no table row). */
__device__ __forceinline__ float4 rope_chunk(float4 x, int src, bool rotated, float sgn, const float *t, int half)
{
    float4 p;
    p.x = __shfl_sync(FULL, x.x, src);
    p.y = __shfl_sync(FULL, x.y, src);
    p.z = __shfl_sync(FULL, x.z, src);
    p.w = __shfl_sync(FULL, x.w, src);
    if (!rotated) return x;
    float4 co = __ldg((const float4 *)t), si = __ldg((const float4 *)(t + half));
    return make_float4(fmaf(x.x, co.x, sgn * (p.x * si.x)), fmaf(x.y, co.y, sgn * (p.y * si.y)),
                       fmaf(x.z, co.z, sgn * (p.z * si.z)), fmaf(x.w, co.w, sgn * (p.w * si.w)));
}

template <int HD, int NW, int MT, int OP>
__global__ void __launch_bounds__(32 * NW, MT > 1    ? 3
                                           : NW >= 8 ? 2
                                                     : 4)
    attn_flash_kernel(void *out, int out_fmt, const float *__restrict__ qkv, int T, int H, int half,
                      const float *__restrict__ cs, float scale_log2)
{
    typedef fl_cfg<HD, NW, MT, OP> C;
    typedef typename C::st st;
    const bool TF32 = C::TF32;
    const int KT = C::KT, CPR = C::CPR, NLD = C::NLD, LDK = C::LDK, LDV = C::LDV, THREADS = C::THREADS;
    extern __shared__ __align__(128) unsigned char smem[];
    st *Qs = (st *)smem;
    st *kv = Qs + C::QT * LDK; /* two buffers of [K tile | V tile] */

    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * C::QT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int D = H * HD;
    const size_t ld = 3 * (size_t)D;
    const float *base = qkv + (size_t)b * T * ld + (size_t)h * HD;
    /* this thread's chunk: rows tid / CPR + i * THREADS / CPR, column chunk tid % CPR */
    const int c = tid % CPR, r0 = tid / CPR, RSTEP = THREADS / CPR;
    /* its RoPE role (the same in every row): partner lane, table column, sign */
    const int hq = half >> 2, rot = 2 * half;
    const bool lo = c < hq, in_rot = c < 2 * hq;
    const int src = lo ? lane + hq : in_rot ? lane - hq : lane;
    const float sgn = lo ? -1.0f : 1.0f;
    const int cc = in_rot ? 4 * (lo ? c : c - hq) : 0; /* table column: cs + row * rot + cc */

    /* Q (rotated), once */
#pragma unroll
    for (int i = 0; i < C::NLQ; i++) {
        int r = r0 + i * RSTEP, t = q0 + r;
        bool ok = t < T;
        float4 x = ok ? __ldg((const float4 *)(base + (size_t)t * ld + 4 * c)) : make_float4(0, 0, 0, 0);
        x = rope_chunk(x, src, in_rot && ok, sgn, cs + (size_t)t * rot + cc, half);
        put4(Qs + r * LDK + 4 * c, x);
    }

    /* K / V tiles: this thread's rows of key tile k0 start at kp + k0 * ld, RSTEP rows apart */
    const float *kp = base + D + (size_t)r0 * ld + 4 * c;
    const int rs = RSTEP * (int)ld; /* < 2^31: ld <= 3 * 65535 * 128, RSTEP <= 32 */
    float4 kr[NLD], vr[NLD];
    auto fetch = [&](int k0) {
        const float *p = kp + (size_t)k0 * ld;
#pragma unroll
        for (int i = 0; i < NLD; i++) {
            if (k0 + r0 + i * RSTEP < T) {
                kr[i] = __ldg((const float4 *)(p + i * rs));
                vr[i] = __ldg((const float4 *)(p + i * rs + D));
            } else {
                kr[i] = vr[i] = make_float4(0, 0, 0, 0);
            }
        }
    };
    auto stash = [&](int k0, st *buf) {
        const float *t = cs + (size_t)(k0 + r0) * rot + cc;
#pragma unroll
        for (int i = 0; i < NLD; i++) {
            int r = r0 + i * RSTEP;
            float4 k = rope_chunk(kr[i], src, in_rot && k0 + r < T, sgn, t + i * RSTEP * rot, half);
            put4(buf + r * LDK + 4 * c, k);
            put4(buf + KT * LDK + r * LDV + 4 * c, vr[i]);
        }
    };

    const int ntiles = (T + KT - 1) / KT;
    fetch(0);
    stash(0, kv);
    __syncthreads();

    const bool active = q0 + warp * 16 * MT < T; /* a warp of only padding rows skips the products */
    float o[MT][HD / 8][4];
    float m[MT][2], l[MT][2]; /* rows g, g + 8 of each m tile; l: this lane's share */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    for (int kt = 0; kt < ntiles; kt++) {
        const int k0 = kt * KT;
        const bool more = kt + 1 < ntiles;
        if (more) fetch(k0 + KT);
        const st *Ks = kv + (kt & 1) * C::TILE, *Vs = Ks + KT * LDK;
        if (active) {
            float s[MT][KT / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < KT / 8; n++)
                    s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
            /* Q fragments are re-read from shared memory per tile: registers are what
             * limits the prefetch depth, and the reads are few (one per 8 or 16 mma).
             * Each K / V fragment feeds MT products (MT m tiles per warp). */
            const st *q = Qs + warp * 16 * MT * LDK;
            if (TF32) {
#pragma unroll
                for (int kc = 0; kc < HD / 8; kc++) {
                    uint32_t qa[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        float2 lo = *(const float2 *)(q + (mt * 16 + g) * LDK + kc * 8 + 2 * tg);
                        float2 hi = *(const float2 *)(q + (mt * 16 + g + 8) * LDK + kc * 8 + 2 * tg);
                        qa[mt][0] = __float_as_uint(lo.x), qa[mt][1] = __float_as_uint(hi.x);
                        qa[mt][2] = __float_as_uint(lo.y), qa[mt][3] = __float_as_uint(hi.y);
                    }
#pragma unroll
                    for (int n = 0; n < KT / 8; n++) {
                        float2 kb = *(const float2 *)(Ks + (n * 8 + g) * LDK + kc * 8 + 2 * tg);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++)
                            mma_tf32(s[mt][n], qa[mt], __float_as_uint(kb.x), __float_as_uint(kb.y));
                    }
                }
            } else {
                /* ldmatrix x4, Q: rows (0..7 | 8..15) x dims kc*16 + (0..7 | 8..15) = a0..a3;
                 * K: keys np*16 + (0..7 | 8..15) x dims kc*16 + (0..7 | 8..15) */
                const st *qp = q + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDK + (lane >> 4) * 8;
                const st *kp = Ks + (lane & 7) * LDK + ((lane >> 4) << 3) * LDK + ((lane >> 3) & 1) * 8;
#pragma unroll
                for (int kc = 0; kc < HD / 16; kc++) {
                    uint32_t qa[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
                        ldsm_x4(qa[mt], qp + mt * 16 * LDK + kc * 16);
#pragma unroll
                    for (int np = 0; np < KT / 16; np++) {
                        uint32_t r[4];
                        ldsm_x4(r, kp + np * 16 * LDK + kc * 16);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma16<OP>(s[mt][2 * np], qa[mt], r[0], r[1]);
                            mma16<OP>(s[mt][2 * np + 1], qa[mt], r[2], r[3]);
                        }
                    }
                }
            }

#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (k0 + KT > T) {
#pragma unroll
                    for (int n = 0; n < KT / 8; n++) {
                        int key = k0 + n * 8 + 2 * tg;
                        if (key >= T) s[mt][n][0] = s[mt][n][2] = -INFINITY;
                        if (key + 1 >= T) s[mt][n][1] = s[mt][n][3] = -INFINITY;
                    }
                }
                float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
                for (int n = 0; n < KT / 8; n++) {
                    mx0 = fmaxf(mx0, fmaxf(s[mt][n][0], s[mt][n][1]));
                    mx1 = fmaxf(mx1, fmaxf(s[mt][n][2], s[mt][n][3]));
                }
                /* the four lanes of a quad share a row */
                mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 2));
                /* finite: key k0 < T is in every tile; the scale is positive */
                float n0 = fmaxf(m[mt][0], mx0 * scale_log2), n1 = fmaxf(m[mt][1], mx1 * scale_log2);
                float a0 = ex2(m[mt][0] - n0), a1 = ex2(m[mt][1] - n1);
                m[mt][0] = n0, m[mt][1] = n1;
                float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
                for (int n = 0; n < KT / 8; n++) {
                    s[mt][n][0] = ex2(fmaf(s[mt][n][0], scale_log2, -n0));
                    s[mt][n][1] = ex2(fmaf(s[mt][n][1], scale_log2, -n0));
                    s[mt][n][2] = ex2(fmaf(s[mt][n][2], scale_log2, -n1));
                    s[mt][n][3] = ex2(fmaf(s[mt][n][3], scale_log2, -n1));
                    sum0 += s[mt][n][0] + s[mt][n][1];
                    sum1 += s[mt][n][2] + s[mt][n][3];
                }
                l[mt][0] = l[mt][0] * a0 + sum0;
                l[mt][1] = l[mt][1] * a1 + sum1;
#pragma unroll
                for (int n = 0; n < HD / 8; n++) {
                    o[mt][n][0] *= a0, o[mt][n][1] *= a0;
                    o[mt][n][2] *= a1, o[mt][n][3] *= a1;
                }
            }

            if (TF32) {
                /* A column tg = key 2tg, column tg + 4 = key 2tg + 1 (see the header) */
#pragma unroll
                for (int kb = 0; kb < KT / 8; kb++) {
                    uint32_t pa[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pa[mt][0] = tf32_bits(s[mt][kb][0]), pa[mt][1] = tf32_bits(s[mt][kb][2]);
                        pa[mt][2] = tf32_bits(s[mt][kb][1]), pa[mt][3] = tf32_bits(s[mt][kb][3]);
                    }
                    const st *v0 = Vs + (kb * 8 + 2 * tg) * LDV + g;
#pragma unroll
                    for (int dn = 0; dn < HD / 8; dn++) {
                        uint32_t b0 = __float_as_uint(v0[dn * 8]), b1 = __float_as_uint(v0[LDV + dn * 8]);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++)
                            mma_tf32(o[mt][dn], pa[mt], b0, b1);
                    }
                }
            } else {
                /* the score fragments are the A operand of P V as they are */
                const st *vp = Vs + (lane & 7) * LDV + ((lane >> 3) & 1) * 8 * LDV + (lane >> 4) * 8;
#pragma unroll
                for (int kc = 0; kc < KT / 16; kc++) {
                    uint32_t pa[MT][4];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        pa[mt][0] = pack16x2<OP>(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                        pa[mt][1] = pack16x2<OP>(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                        pa[mt][2] = pack16x2<OP>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                        pa[mt][3] = pack16x2<OP>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
                    }
#pragma unroll
                    for (int np = 0; np < HD / 16; np++) {
                        uint32_t r[4];
                        ldsm_x4_trans(r, vp + kc * 16 * LDV + np * 16);
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            mma16<OP>(o[mt][2 * np], pa[mt], r[0], r[1]);
                            mma16<OP>(o[mt][2 * np + 1], pa[mt], r[2], r[3]);
                        }
                    }
                }
            }
        }
        if (more) stash(k0 + KT, kv + ((kt + 1) & 1) * C::TILE);
        __syncthreads(); /* the next buffer is written; this one is consumed */
    }
    if (!active) return;

#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float l0 = l[mt][0], l1 = l[mt][1];
        l0 += __shfl_xor_sync(FULL, l0, 1);
        l0 += __shfl_xor_sync(FULL, l0, 2);
        l1 += __shfl_xor_sync(FULL, l1, 1);
        l1 += __shfl_xor_sync(FULL, l1, 2);
        float i0 = 1.0f / l0, i1 = 1.0f / l1;
        int t0 = q0 + (warp * MT + mt) * 16 + g, t1 = t0 + 8;
        size_t row0 = ((size_t)b * T + t0) * D + (size_t)h * HD + 2 * tg, row1 = row0 + 8 * (size_t)D;
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            float(*on)[4] = o[mt];
            if (t0 < T) dit_store_operand2(out, row0 + n * 8, on[n][0] * i0, on[n][1] * i0, out_fmt);
            if (t1 < T) dit_store_operand2(out, row1 + n * 8, on[n][2] * i1, on[n][3] * i1, out_fmt);
        }
    }
}

template <int HD, int NW, int MT, int OP> int launch_flash(const struct dit_attention *a, int half, cudaStream_t s)
{
    typedef fl_cfg<HD, NW, MT, OP> C;
    /* once per instantiation: more than 48 KB of dynamic shared memory must be asked for */
    static const cudaError_t attr = cudaFuncSetAttribute(attn_flash_kernel<HD, NW, MT, OP>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM);
    int rc = dit_cuda_status(attr, "cudaFuncSetAttribute (flash attention shared memory)");
    if (rc < 0) return rc;
    int T = a->heads.T, H = a->heads.n_heads;
    dim3 grid((T + C::QT - 1) / C::QT, H, a->heads.n_seq);
    attn_flash_kernel<HD, NW, MT, OP>
        <<<grid, C::THREADS, C::SMEM, s>>>(a->out, a->out_fmt, a->qkv, T, H, half, a->cs, a->scale * (float)M_LOG2E);
    return dit_cuda_launched("attn_flash_kernel");
}

/* 128 queries per block: 8 warps of one 16-row tile each (see the top). */
enum { FLASH_WARPS = 8, FLASH_TILES = 1 };

} // namespace

/* Called by dit_attention.cu (declared there): arguments checked, n_seq > 0, and
 * dit_attention_flash_usable() true. */
int dit_attention_flash(const struct dit_attention *a, int half, int op, cudaStream_t s)
{
    int head_dim = a->heads.head_dim;
#define FLASH_CASE(hd, o)                                                                                              \
    case hd * 4 + o:                                                                                                   \
        return launch_flash<hd, FLASH_WARPS, FLASH_TILES, o>(a, half, s)
    switch (head_dim * 4 + op) {
        FLASH_CASE(32, FLASH_TF32);
        FLASH_CASE(32, FLASH_BF16);
        FLASH_CASE(32, FLASH_F16);
        FLASH_CASE(64, FLASH_TF32);
        FLASH_CASE(64, FLASH_BF16);
        FLASH_CASE(64, FLASH_F16);
        FLASH_CASE(128, FLASH_TF32);
        FLASH_CASE(128, FLASH_BF16);
        FLASH_CASE(128, FLASH_F16);
    default:
        return mm3_errorf(-EINVAL, "attention: head_dim %d, operands %d: the flash kernel supports 32, 64, 128",
                          head_dim, op);
    }
#undef FLASH_CASE
}

/* The flash kernel reads 16-byte chunks that never straddle the rotated halves
 * (half % 4 == 0), from 16-byte aligned qkv and table rows, and stores pairs. */
bool dit_attention_flash_usable(const void *out, const float *qkv, int half, const float *cs)
{
    return half % 4 == 0 && ((uintptr_t)qkv | (uintptr_t)cs) % 16 == 0 && (uintptr_t)out % 8 == 0;
}
