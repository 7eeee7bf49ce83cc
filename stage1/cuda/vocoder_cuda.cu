/* The vocoder's kernels and decode on the GPU (stage1/cuda/vocoder_cuda.h). */
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#include "stage1/cuda/vocoder_cuda.h"
#include "stage1/cuda/vocoder_cuda_internal.h"

extern "C" {
#include "common/error.h"
}

/* ---- kernels ------------------------------------------------------------------------------ */

/* One implicit-GEMM convolution: per item and phase, y[o, q*o_stride + o_off + phase] =
 * act(res + b[o] + sum_{kk,i} w[phase][o][kk][i] * x[i, q - pad + kk*dil]) for q < n_q,
 * outputs outside [0, t_out) dropped. M = c_out, N = n_q, K = c_in*k. */
struct conv_args {
    const float *x, *w, *b, *res;
    float *y;
    int c_in, c_out, k, dil, pad;
    int t_in, n_q, t_out, o_stride, o_off, n_phase, tanh_out;
    long long x_item, y_item;
};

#define CONV_BM 64
#define CONV_BN 128
#define CONV_BK 16 /* input channels per step */
#define CONV_THREADS 256
#define CONV_HALO 64 /* the most (k-1)*dilation a launch may have (the vocoder: 54) */
/* Row paddings so that the mma fragment reads (rows t4, t4+4) hit 32 distinct banks. */
#define CONV_AW (CONV_BM + 8)
#define CONV_XW (CONV_BN + CONV_HALO + 8)

/* bias + sum, then the residual, then tanh: the CPU's order of roundings. */
__device__ __forceinline__ void vc_store(const conv_args &a, float *y, const float *res, int phase, int o, int q,
                                         float acc)
{
    if (o >= a.c_out || q >= a.n_q) return;
    long long n = (long long)q * a.o_stride + a.o_off + phase;
    if (n < 0 || n >= a.t_out) return;
    size_t at = (size_t)o * a.t_out + (size_t)n;
    float v = __fadd_rn(a.b ? a.b[o] : 0.0f, acc);
    if (res) v = __fadd_rn(res[at], v);
    if (a.tanh_out) v = tanhf(v);
    y[at] = v;
}

__device__ __forceinline__ uint32_t vc_tf32(float f)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

/* Weights are [phase][c_out][tap][c_in] (tap-major K: see vc_load_tiles). TF32: warp
 * tiles of 32 x 32 on mma.sync m16n8k8 (TF32 in, fp32 accumulate); else fp32 FMAs,
 * 4 x 8 outputs per thread. */
/* Weights are [phase][c_out][tap][c_in]. Per step of CONV_BK input channels the block
 * loads their input rows once, with the halo every tap needs (Xs), and then runs the k
 * taps as k GEMM steps over shifted views of Xs. TF32: warp tiles of 32 x 32 on
 * mma.sync m16n8k8 (TF32 in, fp32 accumulate); else fp32 FMAs, 4 x 8 outputs per thread. */
template <bool TF32> __global__ void __launch_bounds__(CONV_THREADS) vc_conv_kernel(conv_args a)
{
    __shared__ float As[CONV_BK][CONV_AW];
    __shared__ float Xs[CONV_BK][CONV_XW];
    int tid = threadIdx.x;
    int q0 = blockIdx.x * CONV_BN, o0 = blockIdx.y * CONV_BM;
    int item = blockIdx.z / a.n_phase, phase = blockIdx.z % a.n_phase;
    const float *x = a.x + item * a.x_item;
    const float *w = a.w + (size_t)phase * a.c_out * a.c_in * a.k;
    int K = a.c_in * a.k, width = CONV_BN + (a.k - 1) * a.dil, x0 = q0 - a.pad;
    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; i++)
        acc[i] = 0.0f;
    int lane = tid % 32, warp = tid / 32, g = lane >> 2, t4 = lane & 3;
    int wm = (warp / 4) * 32, wn = (warp % 4) * 32; /* TF32 warp tile origin */
    int tx = tid % 16, ty = tid / 16;               /* fp32 thread tile */
    for (int i0 = 0; i0 < a.c_in; i0 += CONV_BK) {
#pragma unroll 4
        for (int kk = 0; kk < CONV_BK; kk++) {
            bool ch = i0 + kk < a.c_in;
            const float *xr = x + (size_t)(i0 + kk) * a.t_in;
            for (int col = tid; col < width; col += CONV_THREADS) {
                int src = x0 + col;
                Xs[kk][col] = (ch && src >= 0 && src < a.t_in) ? xr[src] : 0.0f;
            }
        }
        for (int tap = 0; tap < a.k; tap++) {
#pragma unroll
            for (int j = 0; j < (CONV_BM * CONV_BK) / CONV_THREADS; j++) {
                int e = tid + j * CONV_THREADS, m = e / CONV_BK, kk = e % CONV_BK;
                int o = o0 + m, i = i0 + kk;
                As[kk][m] = (o < a.c_out && i < a.c_in) ? w[(size_t)o * K + (size_t)tap * a.c_in + i] : 0.0f;
            }
            __syncthreads();
            int sh = tap * a.dil;
            if (TF32) {
#pragma unroll
                for (int kb = 0; kb < CONV_BK; kb += 8) {
                    uint32_t af[2][4], bf[4][2];
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        int m = wm + mt * 16 + g;
                        af[mt][0] = vc_tf32(As[kb + t4][m]);
                        af[mt][1] = vc_tf32(As[kb + t4][m + 8]);
                        af[mt][2] = vc_tf32(As[kb + t4 + 4][m]);
                        af[mt][3] = vc_tf32(As[kb + t4 + 4][m + 8]);
                    }
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        int n = wn + nt * 8 + g + sh;
                        bf[nt][0] = vc_tf32(Xs[kb + t4][n]);
                        bf[nt][1] = vc_tf32(Xs[kb + t4 + 4][n]);
                    }
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int nt = 0; nt < 4; nt++) {
                            float *c = &acc[(mt * 4 + nt) * 4];
                            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                                         : "r"(af[mt][0]), "r"(af[mt][1]), "r"(af[mt][2]), "r"(af[mt][3]),
                                           "r"(bf[nt][0]), "r"(bf[nt][1]));
                        }
                }
            } else {
#pragma unroll
                for (int kk = 0; kk < CONV_BK; kk++) {
                    float av[4], bv[8];
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        av[i] = As[kk][ty * 4 + i];
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        bv[j] = Xs[kk][tx + 16 * j + sh];
#pragma unroll
                    for (int i = 0; i < 4; i++)
#pragma unroll
                        for (int j = 0; j < 8; j++)
                            acc[i * 8 + j] = fmaf(av[i], bv[j], acc[i * 8 + j]);
                }
            }
            __syncthreads();
        }
    }
    float *y = a.y + item * a.y_item;
    const float *res = a.res ? a.res + item * a.y_item : nullptr;
    if (TF32) {
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const float *c = &acc[(mt * 4 + nt) * 4];
                int o = o0 + wm + mt * 16 + g, q = q0 + wn + nt * 8 + 2 * t4;
                vc_store(a, y, res, phase, o, q, c[0]);
                vc_store(a, y, res, phase, o, q + 1, c[1]);
                vc_store(a, y, res, phase, o + 8, q, c[2]);
                vc_store(a, y, res, phase, o + 8, q + 1, c[3]);
            }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 8; j++)
                vc_store(a, y, res, phase, o0 + ty * 4 + i, q0 + tx + 16 * j, acc[i * 8 + j]);
    }
}

/* y = x + (1 / (alpha + 1e-9)) * sin(alpha x)^2 per channel, separately rounded like op_snake. */
__global__ void vc_snake_kernel(float *y, const float *x, const float *alpha, int c, long long t, long long n)
{
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x) {
        int ch = (int)((e / t) % c);
        float al = alpha[ch];
        float inv = __fdiv_rn(1.0f, __fadd_rn(al, 1e-9f));
        float xv = x[e];
        float s = sinf(__fmul_rn(al, xv));
        y[e] = __fadd_rn(xv, __fmul_rn(inv, __fmul_rn(s, s)));
    }
}

static int vc_check(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return mm3_errorf(-EIO, "vocoder_cuda: %s: %s", what, cudaGetErrorString(e));
    return 0;
}

static int vc_conv_launch(const conv_args &a, int batch, int tf32, cudaStream_t st)
{
    if ((a.k - 1) * a.dil > CONV_HALO)
        return mm3_errorf(-EINVAL, "vocoder_cuda: conv k %d dilation %d spans more than %d samples", a.k, a.dil,
                          CONV_HALO);
    dim3 grid((unsigned)((a.n_q + CONV_BN - 1) / CONV_BN), (unsigned)((a.c_out + CONV_BM - 1) / CONV_BM),
              (unsigned)(batch * a.n_phase));
    if (tf32)
        vc_conv_kernel<true><<<grid, CONV_THREADS, 0, st>>>(a);
    else
        vc_conv_kernel<false><<<grid, CONV_THREADS, 0, st>>>(a);
    return vc_check("conv kernel launch");
}

/* Conv1d, stride 1, odd k, pad dil*(k-1)/2 (length kept); res: y = res + conv (may alias y). */
static int vc_conv1d(float *y, const float *x, const float *w, const float *b, const float *res, int batch, int c_in,
                     int c_out, int t, int k, int dil, int tanh_out, int tf32, cudaStream_t st)
{
    conv_args a = {};
    a.x = x, a.w = w, a.b = b, a.res = res, a.y = y;
    a.c_in = c_in, a.c_out = c_out, a.k = k, a.dil = dil, a.pad = dil * (k - 1) / 2;
    a.t_in = t, a.n_q = t, a.t_out = t, a.o_stride = 1, a.o_off = 0, a.n_phase = 1, a.tanh_out = tanh_out;
    a.x_item = (long long)c_in * t, a.y_item = (long long)c_out * t;
    return vc_conv_launch(a, batch, tf32, st);
}

/* ConvTranspose1d k 2s, stride s, pad s/2 with phase weights [s][c_out][c_in][2]. */
static int vc_conv_t(float *y, const float *x, const float *wp, const float *b, int batch, int c_in, int c_out,
                     int t_in, int s, int tf32, cudaStream_t st)
{
    conv_args a = {};
    a.x = x, a.w = wp, a.b = b, a.y = y;
    a.c_in = c_in, a.c_out = c_out, a.k = 2, a.dil = 1, a.pad = 1;
    a.t_in = t_in, a.n_q = t_in + 1, a.t_out = t_in * s, a.o_stride = s, a.o_off = -((s + 1) / 2), a.n_phase = s;
    a.x_item = (long long)c_in * t_in, a.y_item = (long long)c_out * t_in * s;
    return vc_conv_launch(a, batch, tf32, st);
}

static int vc_snake(float *y, const float *x, const float *alpha, int batch, int c, int t, cudaStream_t st)
{
    long long n = (long long)batch * c * t;
    long long blocks = std::min<long long>((n + 255) / 256, 65536);
    vc_snake_kernel<<<(unsigned)std::max<long long>(blocks, 1), 256, 0, st>>>(y, x, alpha, c, t, n);
    return vc_check("snake kernel launch");
}

/* ---- the vocoder --------------------------------------------------------------------------- */

struct vocoder_cuda {
    struct vocoder_cuda_weights w; /* sizes and offsets; the host arena is freed after upload */
    float *dw;                     /* device weights */
    float *a, *r1, *r2;            /* [2, max activation] each */
    float *lat, *pcm;              /* [latent_channels, max_L], [2, hop * max_L] */
    int max_L;
    int tf32; /* vocoder_cuda_set_tf32 */
    cudaStream_t st;
};

static int vc_cuda(cudaError_t e, const char *what)
{
    return e == cudaSuccess ? 0 : mm3_errorf(-EIO, "vocoder_cuda: %s: %s", what, cudaGetErrorString(e));
}

static size_t vc_max_floats(const struct vocoder_cuda_weights *w, int L)
{
    size_t t = (size_t)L, m = (size_t)std::max(w->input_dim, w->hidden_dim) * t;
    for (int b = 0; b < w->n_blocks; b++) {
        t *= (size_t)w->stride[b];
        m = std::max(m, (size_t)w->up[b].c_out * t);
    }
    return m;
}

extern "C" int vocoder_cuda_create(struct vocoder_cuda **out, const char *ckpt_root, int max_L)
{
    *out = nullptr;
    if (max_L < 1) return mm3_errorf(-EINVAL, "vocoder_cuda_create: max_L %d, expected >= 1", max_L);
    struct vocoder_cuda *h = (struct vocoder_cuda *)calloc(1, sizeof *h);
    if (!h) return mm3_errorf(-ENOMEM, "vocoder_cuda_create: out of memory");
    int rc = vocoder_cuda_weights_load(&h->w, ckpt_root);
    if (rc < 0) {
        free(h);
        return rc;
    }
    if ((int64_t)max_L * h->w.hop > INT32_MAX / 2) {
        vocoder_cuda_weights_free(&h->w);
        free(h);
        return mm3_errorf(-EINVAL, "vocoder_cuda_create: max_L %d gives more than 2^30 samples per channel", max_L);
    }
    h->max_L = max_L;
    size_t mf = 2 * vc_max_floats(&h->w, max_L);
    rc = vc_cuda(cudaStreamCreateWithFlags(&h->st, cudaStreamNonBlocking), "stream");
    if (rc == 0) rc = vc_cuda(cudaMalloc(&h->dw, sizeof(float) * h->w.n_floats), "weights alloc");
    if (rc == 0)
        rc = vc_cuda(cudaMemcpy(h->dw, h->w.arena, sizeof(float) * h->w.n_floats, cudaMemcpyHostToDevice), "upload");
    if (rc == 0) rc = vc_cuda(cudaMalloc(&h->a, sizeof(float) * mf), "activation alloc");
    if (rc == 0) rc = vc_cuda(cudaMalloc(&h->r1, sizeof(float) * mf), "activation alloc");
    if (rc == 0) rc = vc_cuda(cudaMalloc(&h->r2, sizeof(float) * mf), "activation alloc");
    if (rc == 0) rc = vc_cuda(cudaMalloc(&h->lat, sizeof(float) * h->w.latent_channels * max_L), "latent alloc");
    if (rc == 0) rc = vc_cuda(cudaMalloc(&h->pcm, sizeof(float) * 2 * (size_t)h->w.hop * max_L), "pcm alloc");
    vocoder_cuda_weights_free(&h->w);
    if (rc < 0) {
        vocoder_cuda_free(h);
        return rc;
    }
    *out = h;
    return 0;
}

extern "C" void vocoder_cuda_free(struct vocoder_cuda *h)
{
    if (!h) return;
    cudaFree(h->dw);
    cudaFree(h->a);
    cudaFree(h->r1);
    cudaFree(h->r2);
    cudaFree(h->lat);
    cudaFree(h->pcm);
    if (h->st) cudaStreamDestroy(h->st);
    vocoder_cuda_weights_free(&h->w);
    free(h);
}

extern "C" int vocoder_cuda_hop(const struct vocoder_cuda *h)
{
    return h->w.hop;
}
extern "C" int vocoder_cuda_latent_channels(const struct vocoder_cuda *h)
{
    return h->w.latent_channels;
}
extern "C" void vocoder_cuda_set_tf32(struct vocoder_cuda *h, int on)
{
    h->tf32 = on != 0;
}

extern "C" int vocoder_cuda_max_L(const struct vocoder_cuda *h)
{
    return h->max_L;
}

/* Both tracks as a batch of 2: latents [2][half][L] are already that layout. */
static int vc_decode_device(struct vocoder_cuda *h, int L)
{
    const struct vocoder_cuda_weights *w = &h->w;
    const float *W = h->dw;
    cudaStream_t st = h->st;
    const struct vocoder_cuda_conv *cv = &w->in_proj;
    int rc = vc_conv1d(h->r1, h->lat, W + cv->w, W + cv->b, nullptr, 2, cv->c_in, cv->c_out, L, 1, 1, 0, h->tf32, st);
    cv = &w->conv_in;
    if (rc == 0)
        rc = vc_conv1d(h->a, h->r1, W + cv->w, W + cv->b, nullptr, 2, cv->c_in, cv->c_out, L, cv->k, 1, 0, h->tf32, st);
    int t = L;
    static const int dil[VOCODER_CUDA_RES_UNITS] = {1, 3, 9};
    for (int b = 0; rc == 0 && b < w->n_blocks; b++) {
        const struct vocoder_cuda_conv *up = &w->up[b];
        int s = w->stride[b], c = up->c_out;
        rc = vc_snake(h->r1, h->a, W + w->alpha[b], 2, up->c_in, t, st);
        if (rc == 0) rc = vc_conv_t(h->a, h->r1, W + up->w, W + up->b, 2, up->c_in, c, t, s, h->tf32, st);
        t *= s;
        for (int r = 0; rc == 0 && r < VOCODER_CUDA_RES_UNITS; r++) {
            const struct vocoder_cuda_conv *c1 = &w->conv1[b][r], *c2 = &w->conv2[b][r];
            rc = vc_snake(h->r1, h->a, W + w->alpha1[b][r], 2, c, t, st);
            if (rc == 0)
                rc = vc_conv1d(h->r2, h->r1, W + c1->w, W + c1->b, nullptr, 2, c, c, t, c1->k, dil[r], 0, h->tf32, st);
            if (rc == 0) rc = vc_snake(h->r2, h->r2, W + w->alpha2[b][r], 2, c, t, st);
            if (rc == 0) rc = vc_conv1d(h->a, h->r2, W + c2->w, W + c2->b, h->a, 2, c, c, t, c2->k, 1, 0, h->tf32, st);
        }
    }
    cv = &w->conv_out;
    if (rc == 0) rc = vc_snake(h->r1, h->a, W + w->alpha_out, 2, cv->c_in, t, st);
    if (rc == 0)
        rc = vc_conv1d(h->pcm, h->r1, W + cv->w, W + cv->b, nullptr, 2, cv->c_in, 1, t, cv->k, 1, 1, h->tf32, st);
    return rc;
}

extern "C" int vocoder_cuda_decode(struct vocoder_cuda *h, const float *latents, int L, float *pcm)
{
    if (L < 1 || L > h->max_L)
        return mm3_errorf(-EINVAL, "vocoder_cuda_decode: latent length %d, expected 1..%d (max_L)", L, h->max_L);
    size_t n_lat = (size_t)h->w.latent_channels * L, n_pcm = 2 * (size_t)h->w.hop * L;
    int rc = vc_cuda(cudaMemcpyAsync(h->lat, latents, sizeof(float) * n_lat, cudaMemcpyHostToDevice, h->st),
                     "latents upload");
    if (rc == 0) rc = vc_decode_device(h, L);
    if (rc == 0)
        rc =
            vc_cuda(cudaMemcpyAsync(pcm, h->pcm, sizeof(float) * n_pcm, cudaMemcpyDeviceToHost, h->st), "pcm download");
    if (rc == 0) rc = vc_cuda(cudaStreamSynchronize(h->st), "decode");
    return rc;
}

extern "C" int vocoder_cuda_bench(struct vocoder_cuda *h, int L, int reps, float *ms_median)
{
    if (L < 1 || L > h->max_L || reps < 1)
        return mm3_errorf(-EINVAL, "vocoder_cuda_bench: L %d (max %d), reps %d", L, h->max_L, reps);
    size_t n_lat = (size_t)h->w.latent_channels * L;
    std::vector<float> lat(n_lat), pcm(2 * (size_t)h->w.hop * L), ms(reps);
    uint64_t z = 12345;
    for (size_t i = 0; i < n_lat; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        lat[i] = (float)((z >> 40) / 16777216.0) * 2.0f - 1.0f;
    }
    cudaEvent_t e0, e1;
    int rc = vc_cuda(cudaEventCreate(&e0), "event");
    if (rc == 0) rc = vc_cuda(cudaEventCreate(&e1), "event");
    for (int i = 0; rc == 0 && i < 2; i++)
        rc = vocoder_cuda_decode(h, lat.data(), L, pcm.data());
    for (int i = 0; rc == 0 && i < reps; i++) {
        rc = vc_cuda(cudaEventRecord(e0, h->st), "event");
        if (rc == 0) rc = vocoder_cuda_decode(h, lat.data(), L, pcm.data());
        if (rc == 0) rc = vc_cuda(cudaEventRecord(e1, h->st), "event");
        if (rc == 0) rc = vc_cuda(cudaEventSynchronize(e1), "event");
        if (rc == 0) rc = vc_cuda(cudaEventElapsedTime(&ms[i], e0, e1), "event");
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    if (rc < 0) return rc;
    std::sort(ms.begin(), ms.end());
    *ms_median = ms[reps / 2];
    return 0;
}

/* ---- single kernels on host arrays (tests) ------------------------------------------------ */

namespace
{
struct dev_bufs {
    std::vector<float *> p;
    ~dev_bufs()
    {
        for (float *q : p)
            cudaFree(q);
    }
    float *up(const float *h, size_t n, int *rc)
    {
        float *d = nullptr;
        if (*rc == 0) *rc = vc_cuda(cudaMalloc(&d, sizeof(float) * std::max<size_t>(n, 1)), "alloc");
        if (*rc == 0) p.push_back(d);
        if (*rc == 0 && h) *rc = vc_cuda(cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice), "upload");
        return d;
    }
};
} // namespace

extern "C" int vocoder_cuda_conv1d_host(float *y, const float *x, const float *w, const float *b, int batch, int c_in,
                                        int c_out, int t, int k, int dilation, int tf32)
{
    std::vector<float> wt((size_t)c_out * c_in * k);
    vocoder_cuda_tap_major(wt.data(), w, c_out, c_in, k);
    dev_bufs d;
    int rc = 0;
    float *dx = d.up(x, (size_t)batch * c_in * t, &rc), *dw = d.up(wt.data(), wt.size(), &rc);
    float *db = b ? d.up(b, (size_t)c_out, &rc) : nullptr, *dy = d.up(nullptr, (size_t)batch * c_out * t, &rc);
    if (rc == 0) rc = vc_conv1d(dy, dx, dw, db, nullptr, batch, c_in, c_out, t, k, dilation, 0, tf32, 0);
    if (rc == 0) rc = vc_cuda(cudaMemcpy(y, dy, sizeof(float) * batch * c_out * t, cudaMemcpyDeviceToHost), "download");
    return rc;
}

extern "C" int vocoder_cuda_conv_transpose1d_host(float *y, const float *x, const float *w, const float *b, int batch,
                                                  int c_in, int c_out, int t_in, int s, int tf32)
{
    size_t nw = (size_t)c_in * c_out * 2 * s;
    std::vector<float> wp(nw);
    vocoder_cuda_phase_weights(wp.data(), w, c_in, c_out, s);
    dev_bufs d;
    int rc = 0;
    float *dx = d.up(x, (size_t)batch * c_in * t_in, &rc), *dw = d.up(wp.data(), nw, &rc);
    float *db = b ? d.up(b, (size_t)c_out, &rc) : nullptr;
    float *dy = d.up(nullptr, (size_t)batch * c_out * t_in * s, &rc);
    if (rc == 0) rc = vc_conv_t(dy, dx, dw, db, batch, c_in, c_out, t_in, s, tf32, 0);
    if (rc == 0)
        rc = vc_cuda(cudaMemcpy(y, dy, sizeof(float) * batch * c_out * t_in * s, cudaMemcpyDeviceToHost), "download");
    return rc;
}

extern "C" int vocoder_cuda_snake_host(float *y, const float *x, const float *alpha, int batch, int c, int t)
{
    dev_bufs d;
    int rc = 0;
    size_t n = (size_t)batch * c * t;
    float *dx = d.up(x, n, &rc), *da = d.up(alpha, (size_t)c, &rc);
    if (rc == 0) rc = vc_snake(dx, dx, da, batch, c, t, 0);
    if (rc == 0) rc = vc_cuda(cudaMemcpy(y, dx, sizeof(float) * n, cudaMemcpyDeviceToHost), "download");
    return rc;
}
