/* y = x . W^T with bf16 weights: a weight-streaming GEMV kernel for 1..16 rows,
 * cuBLASLt beyond.
 *
 * Decode is bound by reading W once per step: the kernel gives each block OPW
 * consecutive output rows, splits `in` across its 8 warps (consecutive threads
 * take consecutive 16-byte chunks, so each warp reads 512 contiguous bytes of
 * every weight row it owns), and applies every loaded weight to all NR rows of x
 * before dropping it. x (at most 16 x in floats) is re-read from L1/L2, never
 * from HBM more than once. Partial sums meet in shared memory. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <pthread.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/gemv_epi.cuh"
#include "common/cuda/ops_cuda.h"
#include "common/cuda/pdl.cuh"
#include "common/cuda/silu.cuh"

enum { GEMV_THREADS = 256, GEMV_WARPS = GEMV_THREADS / 32 };
/* Row counts above mma_rows go to the tensor-core kernel (gemv_mma.cu): 2 by default
 * (cuda_ops_gemv_set_mma_rows). */
enum { GEMV_MMA_ROWS_DEFAULT = 2, GEMV_MMA_ROWS_MAX = 4 }; /* the float32 fused kernel exists up to 4 */
static int mma_rows_setting;                               /* 0: the default */

static int mma_rows(void)
{
    const int r = __atomic_load_n(&mma_rows_setting, __ATOMIC_RELAXED);
    return r ? r : GEMV_MMA_ROWS_DEFAULT;
}

/* Products with at least wide x 4096 outputs (6 by default: the talker's gate|up, 24576)
 * take the tensor-core kernel at 1-2 rows too, fused or not: there it streams the
 * weights faster than the float32 kernel; at 3 (the depth decoder's gate|up, 12288,
 * too) the frame did not change (docs/performance.md). cuda_ops_gemv_set_mma_wide. */
enum { GEMV_MMA_WIDE_DEFAULT = 6 };
static int mma_wide_setting = -1; /* -1: the default */

static bool gemv_mma_wide(int in, int out)
{
    int v = __atomic_load_n(&mma_wide_setting, __ATOMIC_RELAXED);
    if (v < 0) v = GEMV_MMA_WIDE_DEFAULT;
    return v > 0 && in % 32 == 0 && out >= v * 4096;
}

extern "C" int cuda_ops_gemv_set_mma_wide(int wide)
{
    if (wide < -1 || wide > 64)
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_set_mma_wide: %d: expected -1 (default), 0 (never) or 1..64", wide);
    __atomic_store_n(&mma_wide_setting, wide, __ATOMIC_RELAXED);
    return 0;
}

extern "C" int cuda_ops_gemv_set_mma_rows(int rows)
{
    if (rows != 0 && (rows < GEMV_MMA_ROWS_DEFAULT || rows > GEMV_MMA_ROWS_MAX))
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_set_mma_rows: %d: expected 0 (default) or %d..%d", rows,
                          GEMV_MMA_ROWS_DEFAULT, GEMV_MMA_ROWS_MAX);
    __atomic_store_n(&mma_rows_setting, rows, __ATOMIC_RELAXED);
    return 0;
}

__device__ __forceinline__ float bf16_lo(uint32_t u)
{
    return __uint_as_float(u << 16);
}

__device__ __forceinline__ float bf16_hi(uint32_t u)
{
    return __uint_as_float(u & 0xffff0000u);
}

/* acc += dot(w[0..8), x[0..8)) for one 16-byte weight chunk. */
__device__ __forceinline__ float dot8(uint4 w, float4 xa, float4 xb, float acc)
{
    acc = fmaf(bf16_lo(w.x), xa.x, acc);
    acc = fmaf(bf16_hi(w.x), xa.y, acc);
    acc = fmaf(bf16_lo(w.y), xa.z, acc);
    acc = fmaf(bf16_hi(w.y), xa.w, acc);
    acc = fmaf(bf16_lo(w.z), xb.x, acc);
    acc = fmaf(bf16_hi(w.z), xb.y, acc);
    acc = fmaf(bf16_lo(w.w), xb.z, acc);
    acc = fmaf(bf16_hi(w.w), xb.w, acc);
    return acc;
}

/* acc[r][j] += the 8 weights of wv[j] times the 8 x of row r at unit c. NORM: x is
 * multiplied by the norm weights wn as it is read and ss[r] collects x^2 (the
 * RMSNorm of cuda_ops_gemv_bf16_fused, whose scale is applied to the sums). */
template <int NR, int OPW, bool NORM>
__device__ __forceinline__ void gemv_apply8(float (&acc)[NR][OPW], float (&ss)[NR], const uint4 (&wv)[OPW],
                                            const float *x, const float *wn, int in, int c)
{
    float4 na, nb;
    if (NORM) {
        const float4 *nr = (const float4 *)wn + 2 * c;
        na = __ldg(nr), nb = __ldg(nr + 1);
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const float4 *xr = (const float4 *)(x + (size_t)r * in) + 2 * c;
        float4 xa = __ldg(xr), xb = __ldg(xr + 1);
        if (NORM) {
            ss[r] = fmaf(xa.x, xa.x, fmaf(xa.y, xa.y, fmaf(xa.z, xa.z, fmaf(xa.w, xa.w, ss[r]))));
            ss[r] = fmaf(xb.x, xb.x, fmaf(xb.y, xb.y, fmaf(xb.z, xb.z, fmaf(xb.w, xb.w, ss[r]))));
            xa = make_float4(xa.x * na.x, xa.y * na.y, xa.z * na.z, xa.w * na.w);
            xb = make_float4(xb.x * nb.x, xb.y * nb.y, xb.z * nb.z, xb.w * nb.w);
        }
#pragma unroll
        for (int j = 0; j < OPW; j++)
            acc[r][j] = dot8(wv[j], xa, xb, acc[r][j]);
    }
}

/* VEC: in % 8 == 0 and 16-byte aligned rows, one unit = 8 elements; otherwise a
 * unit is one element (odd sizes; correct, not fast). The first GEMV_PREFETCH
 * passes of weights are loaded before pdl_wait (weights are no earlier kernel's
 * output), so they stream while the previous kernel finishes.
 * EPI (what is stored): CUDA_GEMV_STORE y = sum; CUDA_GEMV_SWIGLU rows 2j and 2j + 1 are gate j
 * and up j, and y (out / 2 columns) gets silu(gate) * up; CUDA_GEMV_ADD y += sum (the
 * residual add, in place). NORM (VEC only): x is RMSNorm(x; wn, eps) on the fly, each
 * block summing x^2 over the whole row it reads anyway. */
enum { GEMV_PREFETCH = 2 };
/* Register caps (blocks per SM in the launch bounds): unbounded, the compiler gave the
 * 2-row kernel 120 registers (2 blocks per SM instead of 3) once the norm and the
 * epilogues were in the template; 80 (1-2 rows) and 128 (3-4 rows) fit without spills.
 * Wider row counts only serve odd widths and the benchmark's variants: left alone. */
template <int NR, int OPW, bool VEC, int EPI = CUDA_GEMV_STORE, bool NORM = false>
__global__ void __launch_bounds__(GEMV_THREADS, NR <= 2   ? 3
                                                : NR <= 4 ? 2
                                                          : 1)
    gemv_bf16_kernel(float *__restrict__ y, const float *__restrict__ x, const uint16_t *__restrict__ w, int in,
                     int out, const float *__restrict__ wn, float eps)
{
    static_assert(VEC || !NORM, "the fused norm reads x in 8-element units");
    static_assert(NR * OPW <= GEMV_THREADS, "one output per thread in the epilogue");
    pdl_launch_dependents();
    __shared__ float part[GEMV_WARPS][NR * OPW + NR];
    const int o0 = blockIdx.x * OPW;
    const int units = VEC ? in / 8 : in;
    const uint16_t *wr[OPW];
#pragma unroll
    for (int j = 0; j < OPW; j++) {
        /* Rows past `out` re-read the last row; their sums are never stored. */
        int o = o0 + j < out ? o0 + j : out - 1;
        wr[j] = w + (size_t)o * in;
    }
    /* CUDA_GEMV_ADD: thread t's output (row t / OPW, column o0 + t % OPW) as it is
     * before the add, loaded right after the PDL wait so that the epilogue does not
     * wait a round trip for it at the block's end (each output is this block's alone). */
    float y_old = 0.0f;
    auto load_y_old = [&]() {
        if (EPI == CUDA_GEMV_ADD && threadIdx.x < NR * OPW && o0 + (int)threadIdx.x % OPW < out)
            y_old = y[(size_t)(threadIdx.x / OPW) * out + o0 + threadIdx.x % OPW];
    };
    float acc[NR][OPW], ss[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        ss[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < OPW; j++)
            acc[r][j] = 0.0f;
    }

    if (VEC) {
        uint4 pre[GEMV_PREFETCH][OPW];
#pragma unroll
        for (int p = 0; p < GEMV_PREFETCH; p++) {
            const int c = threadIdx.x + p * GEMV_THREADS;
#pragma unroll
            for (int j = 0; j < OPW; j++)
                pre[p][j] = c < units ? __ldcs((const uint4 *)wr[j] + c) : make_uint4(0, 0, 0, 0);
        }
        pdl_wait();
        load_y_old();
#pragma unroll
        for (int p = 0; p < GEMV_PREFETCH; p++) {
            const int c = threadIdx.x + p * GEMV_THREADS;
            if (c < units) gemv_apply8<NR, OPW, NORM>(acc, ss, pre[p], x, wn, in, c);
        }
#pragma unroll 2
        for (int c = threadIdx.x + GEMV_PREFETCH * GEMV_THREADS; c < units; c += GEMV_THREADS) {
            uint4 wv[OPW];
#pragma unroll
            for (int j = 0; j < OPW; j++)
                wv[j] = __ldcs((const uint4 *)wr[j] + c);
            gemv_apply8<NR, OPW, NORM>(acc, ss, wv, x, wn, in, c);
        }
    } else {
        pdl_wait();
        load_y_old();
        for (int c = threadIdx.x; c < units; c += GEMV_THREADS) {
            float wv[OPW];
#pragma unroll
            for (int j = 0; j < OPW; j++)
                wv[j] = __uint_as_float((uint32_t)__ldg(wr[j] + c) << 16);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                float xv = __ldg(x + (size_t)r * in + c);
#pragma unroll
                for (int j = 0; j < OPW; j++)
                    acc[r][j] = fmaf(wv[j], xv, acc[r][j]);
            }
        }
    }

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < NR; r++) {
#pragma unroll
        for (int j = 0; j < OPW; j++) {
            float s = acc[r][j];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                s += __shfl_xor_sync(0xffffffffu, s, off);
            if (lane == 0) part[warp][r * OPW + j] = s;
        }
        if (NORM) {
            float s = ss[r];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                s += __shfl_xor_sync(0xffffffffu, s, off);
            if (lane == 0) part[warp][NR * OPW + r] = s;
        }
    }
    __syncthreads();
    float scale[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        scale[r] = 1.0f;
        if (NORM) {
            float t = 0.0f;
#pragma unroll
            for (int k = 0; k < GEMV_WARPS; k++)
                t += part[k][NR * OPW + r];
            scale[r] = 1.0f / sqrtf(t / (float)in + eps);
        }
    }
    if constexpr (EPI == CUDA_GEMV_SWIGLU) {
        const int half = out / 2;
        for (int t = threadIdx.x; t < NR * OPW / 2; t += GEMV_THREADS) {
            int r = t / (OPW / 2), jp = t % (OPW / 2);
            if (o0 + 2 * jp + 1 >= out) continue;
            float g = 0.0f, u = 0.0f;
#pragma unroll
            for (int k = 0; k < GEMV_WARPS; k++) {
                g += part[k][r * OPW + 2 * jp];
                u += part[k][r * OPW + 2 * jp + 1];
            }
            if (NORM) g *= scale[r], u *= scale[r];
            y[(size_t)r * half + o0 / 2 + jp] = silu_mul1(g, u);
        }
    } else {
        for (int t = threadIdx.x; t < NR * OPW; t += GEMV_THREADS) { /* t == threadIdx.x: y_old is t's */
            int r = t / OPW, j = t % OPW;
            if (o0 + j >= out) continue;
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < GEMV_WARPS; k++)
                s += part[k][t];
            if (NORM) s *= scale[r];
            y[(size_t)r * out + o0 + j] = EPI == CUDA_GEMV_ADD ? __fadd_rn(y_old, s) : s;
        }
    }
}

/* More outputs per warp amortise the x reads over more weight bytes; with few rows
 * keep it small so that narrow matrices (1024 outputs) still fill the SMs. */
static int gemv_default_opw(int n_rows)
{
    return n_rows <= 4 ? 4 : 8;
}

template <int NR, int OPW>
static int gemv_launch_opw(float *y, const float *x, const uint16_t *w, int in, int out, bool vec, cudaStream_t s)
{
    dim3 grid((unsigned)((out + OPW - 1) / OPW));
    const float *no_norm = NULL;
    if (vec)
        return launch_pdl("gemv_bf16_kernel", gemv_bf16_kernel<NR, OPW, true>, grid, GEMV_THREADS, 0, s, y, x, w, in,
                          out, no_norm, 0.0f);
    return launch_pdl("gemv_bf16_kernel", gemv_bf16_kernel<NR, OPW, false>, grid, GEMV_THREADS, 0, s, y, x, w, in, out,
                      no_norm, 0.0f);
}

template <int NR>
static int gemv_launch(float *y, const float *x, const uint16_t *w, int in, int out, bool vec, int opw, cudaStream_t s)
{
    switch (opw) {
    case 2:
        return gemv_launch_opw<NR, 2>(y, x, w, in, out, vec, s);
    case 4:
        return gemv_launch_opw<NR, 4>(y, x, w, in, out, vec, s);
    case 8:
        return gemv_launch_opw<NR, 8>(y, x, w, in, out, vec, s);
    default:
        return mm3_errorf(-EINVAL, "gemv: %d outputs per warp, expected 2, 4 or 8", opw);
    }
}

static int gemv_dispatch(float *y, const float *x, const uint16_t *w, int n, int in, int out, bool vec, int opw,
                         cudaStream_t s)
{
    switch (n) {
    case 1:
        return gemv_launch<1>(y, x, w, in, out, vec, opw, s);
    case 2:
        return gemv_launch<2>(y, x, w, in, out, vec, opw, s);
    case 3:
        return gemv_launch<3>(y, x, w, in, out, vec, opw, s);
    case 4:
        return gemv_launch<4>(y, x, w, in, out, vec, opw, s);
    case 5:
        return gemv_launch<5>(y, x, w, in, out, vec, opw, s);
    case 6:
        return gemv_launch<6>(y, x, w, in, out, vec, opw, s);
    case 7:
        return gemv_launch<7>(y, x, w, in, out, vec, opw, s);
    case 8:
        return gemv_launch<8>(y, x, w, in, out, vec, opw, s);
    case 9:
        return gemv_launch<9>(y, x, w, in, out, vec, opw, s);
    case 10:
        return gemv_launch<10>(y, x, w, in, out, vec, opw, s);
    case 11:
        return gemv_launch<11>(y, x, w, in, out, vec, opw, s);
    case 12:
        return gemv_launch<12>(y, x, w, in, out, vec, opw, s);
    case 13:
        return gemv_launch<13>(y, x, w, in, out, vec, opw, s);
    case 14:
        return gemv_launch<14>(y, x, w, in, out, vec, opw, s);
    case 15:
        return gemv_launch<15>(y, x, w, in, out, vec, opw, s);
    case 16:
        return gemv_launch<16>(y, x, w, in, out, vec, opw, s);
    default:
        return mm3_errorf(-EINVAL, "gemv: %d rows, expected 1..%d", n, CUDA_OPS_GEMV_MAX_ROWS);
    }
}

/* ---- cuBLASLt path (> 16 rows) ------------------------------------------------ */

enum { LT_WORKSPACE = 32 << 20 };

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static cublasLtHandle_t lt_handle;
static cublasStatus_t lt_create_status;

/* Largest power of two (<= 256) dividing the address: cuBLASLt assumes 256 unless told. */
static uint32_t ptr_alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a)
        a >>= 1;
    return a;
}

static void lt_create(void)
{
    lt_create_status = cublasLtCreate(&lt_handle);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

#define LT_TRY(call)                                                                                                   \
    do {                                                                                                               \
        cublasStatus_t st_ = (call);                                                                                   \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                            \
            rc = mm3_errorf(-ENODEV, "cuBLASLt %s: status %d", #call, (int)st_);                                       \
            goto done;                                                                                                 \
        }                                                                                                              \
    } while (0)

/* Column-major view: y^T[out, n] = W_cm[in, out]^T . x^T[in, n] (the "TN" GEMM). */
static int lt_matmul(float *y, const float *x, const uint16_t *w, int n, int in, int out, cudaStream_t s)
{
    pthread_once(&lt_once, lt_create);
    if (lt_create_status != CUBLAS_STATUS_SUCCESS)
        return mm3_errorf(-ENODEV, "cublasLtCreate: status %d", (int)lt_create_status);

    int rc = 0;
    void *xb = NULL, *ws = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    size_t ws_size = LT_WORKSPACE;
    float alpha = 1.0f, beta = 0.0f;
    size_t nx = (size_t)n * in;
    uint32_t align_a, align_c;

    rc = cuda_status(cudaMallocAsync(&xb, nx * 2, s), "cudaMallocAsync (bf16 x)");
    if (rc < 0) return rc;
    rc = cuda_status(cudaMallocAsync(&ws, ws_size, s), "cudaMallocAsync (cuBLASLt workspace)");
    if (rc < 0) goto done;
    f32_to_bf16_kernel<<<(unsigned)((nx + 255) / 256 < 4096 ? (nx + 255) / 256 : 4096), 256, 0, s>>>(
        (__nv_bfloat16 *)xb, x, nx);
    rc = cuda_launch_status("f32_to_bf16_kernel");
    if (rc < 0) goto done;

    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
    LT_TRY(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, (uint64_t)in, (uint64_t)out, (int64_t)in));
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, (uint64_t)in, (uint64_t)n, (int64_t)in));
    LT_TRY(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)out, (uint64_t)n, (int64_t)out));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_size, sizeof ws_size));
    align_a = ptr_alignment(w);
    align_c = ptr_alignment(y);
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                sizeof align_a));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                sizeof align_c));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                sizeof align_c));
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(lt_handle, op, la, lb, lc, lc, pref, 1, &heur, &found));
    if (found < 1) {
        rc = mm3_errorf(-ENODEV, "cuBLASLt: no algorithm for bf16 GEMM %d x %d x %d", n, out, in);
        goto done;
    }
    LT_TRY(cublasLtMatmul(lt_handle, op, &alpha, w, la, xb, lb, &beta, y, lc, y, lc, &heur.algo, ws, ws_size, s));

done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (ws) (void)cudaFreeAsync(ws, s);
    if (xb) (void)cudaFreeAsync(xb, s);
    return rc;
}

extern "C" int cuda_ops_matmul_bf16(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out,
                                    void *stream)
{
    if (n_rows < 1 || in < 1 || out < 1)
        return mm3_errorf(-EINVAL, "cuda_ops_matmul_bf16: %d rows, in %d, out %d: expected all >= 1", n_rows, in, out);
    if (!y || !x || !w) return mm3_errorf(-EINVAL, "cuda_ops_matmul_bf16: NULL pointer");
    cudaStream_t s = cuda_stream_of(stream);
    /* The float32 kernel is short of ALU and L1 for many rows; the tensor-core kernel
     * serves them (docs/performance.md). */
    const bool mma_fits = in % 32 == 0 && (((uintptr_t)w | (uintptr_t)x) & 15) == 0;
    if (n_rows > (mma_fits ? CUDA_OPS_GEMV_MMA_MAX_ROWS : CUDA_OPS_GEMV_MAX_ROWS))
        return lt_matmul(y, x, w, n_rows, in, out, s);
    /* Wide products as the fused path runs them: the same kernel, the same bits. */
    if ((n_rows > mma_rows() || gemv_mma_wide(in, out)) && mma_fits) {
        const struct cuda_gemv_fused g = {.y = y, .x = x, .w = w, .n_rows = n_rows, .in = in, .out = out};
        return gemv_mma_launch(&g, 0, s);
    }
    bool vec = in % 8 == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0;
    return gemv_dispatch(y, x, w, n_rows, in, out, vec, gemv_default_opw(n_rows), s);
}

extern "C" int cuda_ops_gemv_bf16_opw(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out,
                                      int outputs_per_warp, void *stream)
{
    if (n_rows < 1 || n_rows > CUDA_OPS_GEMV_MAX_ROWS || in < 1 || out < 1 || !y || !x || !w)
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_bf16_opw: %d rows, in %d, out %d: expected rows 1..%d", n_rows, in,
                          out, CUDA_OPS_GEMV_MAX_ROWS);
    bool vec = in % 8 == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0;
    return gemv_dispatch(y, x, w, n_rows, in, out, vec, outputs_per_warp, cuda_stream_of(stream));
}

/* The fused variants of the float32 kernel, for up to mma_rows() rows (more go to
 * the tensor-core kernel): instantiated only for the combinations the decode
 * layers use, with 4 outputs per warp (even: a block holds whole gate/up pairs). */
template <int NR, int EPI, bool NORM> static int gemv_fused_launch(const struct cuda_gemv_fused &g, cudaStream_t s)
{
    dim3 grid((unsigned)((g.out + 3) / 4));
    return launch_pdl("gemv_bf16_kernel (fused)", gemv_bf16_kernel<NR, 4, true, EPI, NORM>, grid, GEMV_THREADS, 0, s,
                      g.y, g.x, g.w, g.in, g.out, g.norm_w, g.eps);
}

template <int NR> static int gemv_fused_rows(const struct cuda_gemv_fused &g, cudaStream_t s)
{
    return gemv_epi_dispatch(g.epi, g.norm_w != NULL, [&](auto e, auto norm) {
        return gemv_fused_launch<NR, decltype(e)::value, decltype(norm)::value>(g, s);
    });
}

extern "C" int cuda_ops_gemv_max_rows(int in)
{
    return in > 0 && in % 32 == 0 ? CUDA_OPS_GEMV_MMA_MAX_ROWS : CUDA_OPS_GEMV_MAX_ROWS;
}

extern "C" int cuda_ops_gemv_fused_pays(int n_rows)
{
    if (n_rows < 1 || n_rows > CUDA_OPS_GEMV_MMA_MAX_ROWS) return 0;
    return n_rows <= 2 || n_rows > mma_rows();
}

extern "C" int cuda_ops_gemv_fused_ok(int n_rows, int in, int out, enum cuda_gemv_epi epi, int norm)
{
    if (n_rows < 1 || n_rows > cuda_ops_gemv_max_rows(in) || in < 8 || in % 8 || out < 1) return 0;
    if (n_rows > mma_rows() && in % 32) return 0;
    if (epi == CUDA_GEMV_SWIGLU && out % 2) return 0;
    if (norm && epi == CUDA_GEMV_ADD) return 0;
    return epi == CUDA_GEMV_STORE || epi == CUDA_GEMV_SWIGLU || epi == CUDA_GEMV_ADD;
}

extern "C" int cuda_ops_gemv_bf16_fused(const struct cuda_gemv_fused *g, void *stream)
{
    const float *x = g->x, *norm_w = g->norm_w;
    const uint16_t *w = g->w;
    int n_rows = g->n_rows, in = g->in, out = g->out;
    enum cuda_gemv_epi epi = g->epi;
    if (!cuda_ops_gemv_fused_ok(n_rows, in, out, epi, norm_w != NULL))
        return mm3_errorf(-ENOTSUP,
                          "cuda_ops_gemv_bf16_fused: %d rows, in %d, out %d, epilogue %d%s: not a fused shape (see "
                          "cuda_ops_gemv_fused_ok)",
                          n_rows, in, out, (int)epi, norm_w ? " with norm" : "");
    if (!g->y || !x || !w) return mm3_errorf(-EINVAL, "cuda_ops_gemv_bf16_fused: NULL pointer");
    if ((((uintptr_t)w | (uintptr_t)x) & 15) || (norm_w && ((uintptr_t)norm_w & 15)))
        return mm3_errorf(-EINVAL, "cuda_ops_gemv_bf16_fused: w, x and the norm weights must be 16-byte aligned");
    cudaStream_t s = cuda_stream_of(stream);
    if (n_rows > mma_rows() || gemv_mma_wide(in, out)) return gemv_mma_launch(g, 0, s);
    switch (n_rows) {
    case 1:
        return gemv_fused_rows<1>(*g, s);
    case 2:
        return gemv_fused_rows<2>(*g, s);
    case 3:
        return gemv_fused_rows<3>(*g, s);
    default:
        return gemv_fused_rows<4>(*g, s);
    }
}

extern "C" int cuda_ops_matmul_bf16_swiglu(float *y, float *gu, const float *x, const uint16_t *w_gu, int n_rows,
                                           int in, int ffn, void *stream)
{
    if (n_rows < 1 || in < 1 || ffn < 1)
        return mm3_errorf(-EINVAL, "cuda_ops_matmul_bf16_swiglu: %d rows, in %d, ffn %d: expected all >= 1", n_rows, in,
                          ffn);
    if (!y || !x || !w_gu) return mm3_errorf(-EINVAL, "cuda_ops_matmul_bf16_swiglu: NULL pointer");
    const int out = 2 * ffn;
    if (cuda_ops_gemv_fused_ok(n_rows, in, out, CUDA_GEMV_SWIGLU, 0) &&
        ((((uintptr_t)w_gu | (uintptr_t)x) & 15) == 0)) {
        const struct cuda_gemv_fused g = {
            .y = y, .x = x, .w = w_gu, .n_rows = n_rows, .in = in, .out = out, .epi = CUDA_GEMV_SWIGLU};
        return cuda_ops_gemv_bf16_fused(&g, stream);
    }
    if (!gu) return mm3_errorf(-EINVAL, "cuda_ops_matmul_bf16_swiglu: %d rows need the gu scratch", n_rows);
    int rc = cuda_ops_matmul_bf16(gu, x, w_gu, n_rows, in, out, stream);
    return rc < 0 ? rc : cuda_ops_silu_mul_interleaved(y, gu, n_rows, ffn, stream);
}
