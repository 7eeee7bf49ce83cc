/* The vocoder's kernels and decode on the GPU (stage1/cuda/vocoder_cuda.h).
 *
 * Layout: every activation is time-major float32, element (track, n, ch) at
 * p + track*track_stride + n*C + ch (struct vc_act). Time-major turns a convolution
 * into a GEMM over rows = time with dit_gemm's row-major d[M, N] = a[M, K] . w[N, K]^T:
 *   Conv1d k taps, dilation d: vc_gather writes a[track*T + n][tap*C + i] =
 *     snake(x[n + tap*d - pad][i]) (zero outside [0, T)), then one GEMM with K = k*C,
 *     N = c_out, bias in the epilogue, the residual as its accumulated C.
 *   ConvTranspose1d k 2s, stride s, pad s/2: gather the 2-tap operand [x[q-1], x[q]] for
 *     q in [0, T], one GEMM with N = s*c_out whose row q, column (r, o) is output
 *     n = q*s + r - s/2: the GEMM's output read as [(T+1)*s][c_out] rows IS the
 *     upsampled sequence, shifted by s/2 rows, with s rows of slack per track.
 * Both tracks run as one GEMM (M = 2T) except the first residual add of a block, whose
 * accumulated C (the ConvTranspose output with its slack rows) has a different track
 * stride: there one GEMM per track. */
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/dit_gemm.h"
#include "stage1/cuda/vocoder_cuda.h"
#include "stage1/cuda/vocoder_cuda_internal.h"

extern "C" {
#include "common/dtype.h"
#include "common/error.h"
#include "stage1/vocoder.h"
}

/* ---- kernels ------------------------------------------------------------------------------ */

/* y = x + (1 / (alpha + 1e-9)) * sin(alpha x)^2, separately rounded like op_snake. */
__device__ __forceinline__ float vc_snake(float x, float al)
{
    float inv = __fdiv_rn(1.0f, __fadd_rn(al, 1e-9f));
    float s = sinf(__fmul_rn(al, x));
    return __fadd_rn(x, __fmul_rn(inv, __fmul_rn(s, s)));
}

/* dst[(track*rows + n)][tap*c + ch] = snake(src(track, n + tap*dil - pad, ch)), zero where
 * the source row is outside [0, t_src); src element at track*src_track + row*src_row +
 * ch*src_col (time-major activations, or the channels-first latents). */
struct gather_args {
    const float *src;
    long long src_track, src_row, src_col;
    int t_src;
    const float *alpha; /* [c] or NULL: no Snake */
    void *dst;
    int rows, c, k, dil, pad;
};

#define GATHER_ROWS 32
#define GATHER_TX 32 /* threads along channels: one warp writes 32 consecutive elements */
#define GATHER_TY 8
#define GATHER_SMEM_MAX (48 << 10)

/* A block stages rows [n0 - pad, n0 + GATHER_ROWS + span) of a chunk of cc channels in
 * shared memory once (the Snake evaluated once per source element, not once per tap),
 * then writes the k shifted copies of its GATHER_ROWS output rows. */
template <int FMT> __global__ void __launch_bounds__(GATHER_TX *GATHER_TY) vc_gather_kernel(gather_args a, int cc)
{
    extern __shared__ float tile[]; /* [GATHER_ROWS + span][cc] */
    int span = (a.k - 1) * a.dil;
    int n0 = blockIdx.x * GATHER_ROWS, c0 = blockIdx.y * cc, track = blockIdx.z;
    int tx = threadIdx.x, ty = threadIdx.y;
    const float *src = a.src + track * a.src_track;
    for (int lr = ty; lr < GATHER_ROWS + span; lr += GATHER_TY) {
        int n = n0 - a.pad + lr;
        for (int ci = tx; ci < cc; ci += GATHER_TX) {
            int ch = c0 + ci;
            float v = 0.0f;
            if (ch < a.c && n >= 0 && n < a.t_src) {
                v = src[(long long)n * a.src_row + (long long)ch * a.src_col];
                if (a.alpha) v = vc_snake(v, a.alpha[ch]);
            }
            tile[lr * cc + ci] = v;
        }
    }
    __syncthreads();
    size_t K = (size_t)a.k * a.c;
    for (int rr = ty; rr < GATHER_ROWS; rr += GATHER_TY) {
        int row = n0 + rr;
        if (row >= a.rows) break;
        size_t base = ((size_t)track * a.rows + row) * K;
        for (int tap = 0; tap < a.k; tap++)
            for (int ci = tx; ci < cc && c0 + ci < a.c; ci += GATHER_TX)
                dit_store_operand(a.dst, base + (size_t)tap * a.c + c0 + ci, tile[(rr + tap * a.dil) * cc + ci], FMT);
    }
}

#define OUT_ROWS 64
#define OUT_CC 128
#define OUT_MAX_SPAN 16
#define OUT_WARPS 8

/* pcm[track][n] = tanh(b + sum_{tap, i} w[tap][i] * snake(x(track, n + tap - pad, i))),
 * float32 in every precision: conv_out has one output channel, a GEMV that the Snake
 * and tanh are fused into. Warp wi owns rows wi, wi + 8, ...; lanes split the channels. */
__global__ void __launch_bounds__(OUT_WARPS * 32)
    vc_conv_out_kernel(float *pcm, const float *x, long long x_track, int t, int c, const float *alpha, const float *w,
                       const float *b, int k)
{
    __shared__ float tile[(OUT_ROWS + OUT_MAX_SPAN) * OUT_CC];
    int n0 = blockIdx.x * OUT_ROWS, track = blockIdx.y, pad = (k - 1) / 2, span = k - 1;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *xs = x + track * x_track;
    float acc[OUT_ROWS / OUT_WARPS];
#pragma unroll
    for (int j = 0; j < OUT_ROWS / OUT_WARPS; j++)
        acc[j] = 0.0f;
    for (int c0 = 0; c0 < c; c0 += OUT_CC) {
        int cc = min(OUT_CC, c - c0);
        __syncthreads(); /* the previous chunk is consumed */
        for (int lr = warp; lr < OUT_ROWS + span; lr += OUT_WARPS) {
            int n = n0 - pad + lr;
            for (int ci = lane; ci < cc; ci += 32) {
                float v = 0.0f;
                if (n >= 0 && n < t) v = xs[(size_t)n * c + c0 + ci];
                if (alpha) v = vc_snake(v, alpha[c0 + ci]);
                tile[lr * OUT_CC + ci] = v;
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < OUT_ROWS / OUT_WARPS; j++) {
            int rr = warp + OUT_WARPS * j;
            for (int tap = 0; tap < k; tap++)
                for (int ci = lane; ci < cc; ci += 32)
                    acc[j] = fmaf(w[(size_t)tap * c + c0 + ci], tile[(rr + tap) * OUT_CC + ci], acc[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < OUT_ROWS / OUT_WARPS; j++) {
        float v = acc[j];
        for (int off = 16; off > 0; off >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, off);
        int n = n0 + warp + OUT_WARPS * j;
        if (lane == 0 && n < t) pcm[(size_t)track * t + n] = tanhf(__fadd_rn(b[0], v));
    }
}

/* ---- layers: gather + GEMM ------------------------------------------------------------------ */

/* What a layer needs besides its operands: the GEMM handle, the stream and the operand
 * scratch (op_elems elements of operand type fmt, enum dit_operand). */
struct vc_ops {
    struct dit_gemm *g;
    cudaStream_t st;
    int fmt;
    void *op;
    size_t op_elems;
};

/* A time-major activation view (see the top of the file). */
struct vc_act {
    const float *p;
    long long track_stride;
    int t, c;
};

static int vc_gather(const struct vc_ops *o, const gather_args &a, int batch)
{
    if ((size_t)batch * a.rows * a.k * a.c > o->op_elems)
        return mm3_errorf(-EINVAL,
                          "vocoder_cuda: gathered operand of %d x %d x %d x %d elements exceeds the %zu reserved",
                          batch, a.rows, a.k, a.c, o->op_elems);
    int span = (a.k - 1) * a.dil, cc = a.c <= 128 ? a.c : 64;
    while (cc > 1 && (size_t)(GATHER_ROWS + span) * cc * sizeof(float) > GATHER_SMEM_MAX)
        cc = (cc + 1) / 2;
    size_t smem = (size_t)(GATHER_ROWS + span) * cc * sizeof(float);
    if (smem > GATHER_SMEM_MAX)
        return mm3_errorf(-EINVAL, "vocoder_cuda: a conv of k %d and dilation %d spans too many rows", a.k, a.dil);
    dim3 grid((unsigned)((a.rows + GATHER_ROWS - 1) / GATHER_ROWS), (unsigned)((a.c + cc - 1) / cc), (unsigned)batch);
    dim3 block(GATHER_TX, GATHER_TY);
    switch (o->fmt) {
    case DIT_OPERAND_BF16:
        vc_gather_kernel<DIT_OPERAND_BF16><<<grid, block, smem, o->st>>>(a, cc);
        break;
    case DIT_OPERAND_F16:
        vc_gather_kernel<DIT_OPERAND_F16><<<grid, block, smem, o->st>>>(a, cc);
        break;
    case DIT_OPERAND_F16_SCALED:
        vc_gather_kernel<DIT_OPERAND_F16_SCALED><<<grid, block, smem, o->st>>>(a, cc);
        break;
    default:
        vc_gather_kernel<DIT_OPERAND_F32><<<grid, block, smem, o->st>>>(a, cc);
    }
    return dit_cuda_launched("vc_gather_kernel");
}

/* Operand element i of a weight arena as a GEMM's w pointer. */
static const void *vc_operand_at(const struct vc_ops *o, const void *base, size_t i)
{
    return (const char *)base + i * dit_operand_size(o->fmt);
}

/* One layer on the device: the Snake alphas applied to its input (NULL: none), its
 * weights (GEMM operands; conv_out's float32 [k][c_in]) and bias, and its shape: c_out
 * outputs of k taps at dilation dil (Conv1d), or of stride `stride` (ConvTranspose1d). */
struct vc_layer {
    const float *alpha;
    const void *w;
    const float *b;
    int c_out, k, dil, stride;
};

/* y[track][n][o] (gapless, track stride t*c_out) = b[o] + (res) + sum_{tap, i}
 * w[o][tap][i] * snake(x(track, n + tap*dil - pad, i)), pad = dil*(k-1)/2. res: NULL
 * (res.p) or a view of y's shape with any track stride; it may be y itself. */
static int vc_conv1d(const struct vc_ops *o, float *y, const struct vc_act &x, const struct vc_layer &l,
                     const struct vc_act *res, int batch)
{
    const float *alpha = l.alpha, *b = l.b;
    const void *w = l.w;
    const int c_out = l.c_out, k = l.k, dil = l.dil;
    gather_args a = {};
    a.src = x.p, a.src_track = x.track_stride, a.src_row = x.c, a.src_col = 1, a.t_src = x.t;
    a.alpha = alpha, a.dst = o->op, a.rows = x.t, a.c = x.c, a.k = k, a.dil = dil, a.pad = dil * (k - 1) / 2;
    int rc = vc_gather(o, a, batch);
    if (rc < 0) return rc;
    int K = k * x.c, t = x.t;
    long long y_track = (long long)t * c_out;
    if (!res || res->track_stride == y_track) {
        const struct dit_gemm_product prod = {.d = y,
                                              .a = o->op,
                                              .w = w,
                                              .bias = b,
                                              .c = res ? res->p : nullptr,
                                              .M = batch * t,
                                              .K = K,
                                              .N = c_out,
                                              .lda = K,
                                              .ldd = c_out};
        return dit_gemm_run(o->g, &prod, o->st);
    }
    for (int tr = 0; rc == 0 && tr < batch; tr++) {
        const struct dit_gemm_product prod = {.d = y + tr * y_track,
                                              .a = vc_operand_at(o, o->op, (size_t)tr * t * K),
                                              .w = w,
                                              .bias = b,
                                              .c = res->p + tr * res->track_stride,
                                              .M = t,
                                              .K = K,
                                              .N = c_out,
                                              .lda = K,
                                              .ldd = c_out};
        rc = dit_gemm_run(o->g, &prod, o->st);
    }
    return rc;
}

/* ConvTranspose1d (k 2s, stride s, pad s/2) of x into ybuf [batch][(t+1)*s][c_out] with
 * phase weights w and the per-phase bias b [s][c_out]; *out views the result. */
static int vc_conv_t(const struct vc_ops *o, float *ybuf, const struct vc_act &x, const struct vc_layer &l, int batch,
                     struct vc_act *out)
{
    const float *alpha = l.alpha, *b = l.b;
    const void *w = l.w;
    const int c_out = l.c_out, s = l.stride;
    gather_args a = {};
    a.src = x.p, a.src_track = x.track_stride, a.src_row = x.c, a.src_col = 1, a.t_src = x.t;
    a.alpha = alpha, a.dst = o->op, a.rows = x.t + 1, a.c = x.c, a.k = 2, a.dil = 1, a.pad = 1;
    int rc = vc_gather(o, a, batch);
    if (rc < 0) return rc;
    int K = 2 * x.c, N = s * c_out;
    const struct dit_gemm_product prod = {
        .d = ybuf, .a = o->op, .w = w, .bias = b, .M = batch * (x.t + 1), .K = K, .N = N, .lda = K, .ldd = N};
    rc = dit_gemm_run(o->g, &prod, o->st);
    *out = {ybuf + (size_t)(s / 2) * c_out, (long long)(x.t + 1) * N, x.t * s, c_out};
    return rc;
}

static int vc_conv_out(const struct vc_ops *o, float *pcm, const struct vc_act &x, const struct vc_layer &l, int batch)
{
    const float *alpha = l.alpha, *w = (const float *)l.w, *b = l.b;
    const int k = l.k;
    if (k < 1 || k % 2 == 0 || k - 1 > OUT_MAX_SPAN)
        return mm3_errorf(-EINVAL, "vocoder_cuda: conv_out kernel size %d, expected odd and <= %d", k,
                          OUT_MAX_SPAN + 1);
    dim3 grid((unsigned)((x.t + OUT_ROWS - 1) / OUT_ROWS), (unsigned)batch);
    vc_conv_out_kernel<<<grid, OUT_WARPS * 32, 0, o->st>>>(pcm, x.p, x.track_stride, x.t, x.c, alpha, w, b, k);
    return dit_cuda_launched("vc_conv_out_kernel");
}

/* ---- the vocoder --------------------------------------------------------------------------- */

struct vocoder_cuda {
    struct vocoder_cuda_weights w; /* sizes and offsets; the host arrays are freed after upload */
    enum mm3_matmul_precision prec;
    struct vc_ops ops;
    void *dgemm;            /* GEMM weights in the operand type */
    float *df32;            /* biases, alphas, conv_out */
    float *a, *hbuf, *ybuf; /* residual stream, conv1 output, ConvTranspose output */
    float *lat, *pcm;       /* [latent_channels, max_L], [2, hop * max_L] */
    int max_L;
};

/* Element counts of the buffers for windows of L latents (both tracks). */
struct vc_sizes {
    size_t a, h, y, op;
};

static struct vc_sizes vc_sizes_for(const struct vocoder_cuda_weights *w, int L)
{
    struct vc_sizes z = {};
    size_t t = (size_t)L;
    z.h = 2 * t * w->input_dim;
    z.a = 2 * t * w->hidden_dim;
    z.op = std::max(2 * t * (w->latent_channels / 2), 2 * t * w->conv_in.k * w->input_dim);
    for (int b = 0; b < w->n_blocks; b++) {
        size_t s = (size_t)w->stride[b], c_in = (size_t)w->up[b].c_in, c = (size_t)w->up[b].c_out;
        z.y = std::max(z.y, 2 * (t + 1) * s * c);
        z.op = std::max(z.op, 2 * (t + 1) * 2 * c_in);
        t *= s;
        z.a = std::max(z.a, 2 * t * c);
        z.h = std::max(z.h, 2 * t * c);
        for (int r = 0; r < VOCODER_RES_UNITS; r++)
            z.op = std::max(z.op, 2 * t * c * (size_t)std::max(w->conv1[b][r].k, w->conv2[b][r].k));
    }
    return z;
}

static int vc_decode_device(struct vocoder_cuda *h, int L)
{
    const struct vocoder_cuda_weights *w = &h->w;
    const struct vc_ops *o = &h->ops;
    const float *F = h->df32;
    const void *G = h->dgemm;
    int half = w->latent_channels / 2;

    /* dec_in_proj (k1) straight from the channels-first latents */
    gather_args g = {};
    g.src = h->lat, g.src_track = (long long)half * L, g.src_row = 1, g.src_col = L, g.t_src = L;
    g.dst = o->op, g.rows = L, g.c = half, g.k = 1, g.dil = 1, g.pad = 0;
    int rc = vc_gather(o, g, 2);
    const struct vocoder_cuda_conv *cv = &w->in_proj;
    if (rc == 0) {
        const struct dit_gemm_product prod = {.d = h->hbuf,
                                              .a = o->op,
                                              .w = vc_operand_at(o, G, cv->w),
                                              .bias = F + cv->b,
                                              .M = 2 * L,
                                              .K = half,
                                              .N = cv->c_out,
                                              .lda = half,
                                              .ldd = cv->c_out};
        rc = dit_gemm_run(o->g, &prod, o->st);
    }
    cv = &w->conv_in;
    struct vc_act x = {h->hbuf, (long long)L * w->input_dim, L, w->input_dim};
    const struct vc_layer conv_in = {
        .alpha = nullptr, .w = vc_operand_at(o, G, cv->w), .b = F + cv->b, .c_out = cv->c_out, .k = cv->k, .dil = 1};
    if (rc == 0) rc = vc_conv1d(o, h->a, x, conv_in, nullptr, 2);
    struct vc_act cur = {h->a, (long long)L * cv->c_out, L, cv->c_out};
    for (int b = 0; rc == 0 && b < w->n_blocks; b++) {
        const struct vocoder_cuda_conv *up = &w->up[b];
        struct vc_act stream;
        const struct vc_layer upsample = {.alpha = F + w->alpha[b],
                                          .w = vc_operand_at(o, G, up->w),
                                          .b = F + up->b,
                                          .c_out = up->c_out,
                                          .k = 2,
                                          .dil = 1,
                                          .stride = w->stride[b]};
        rc = vc_conv_t(o, h->ybuf, cur, upsample, 2, &stream);
        int t = stream.t, c = stream.c;
        for (int r = 0; rc == 0 && r < VOCODER_RES_UNITS; r++) {
            const struct vocoder_cuda_conv *c1 = &w->conv1[b][r], *c2 = &w->conv2[b][r];
            const struct vc_layer conv1 = {.alpha = F + w->alpha1[b][r],
                                           .w = vc_operand_at(o, G, c1->w),
                                           .b = F + c1->b,
                                           .c_out = c,
                                           .k = c1->k,
                                           .dil = w->dilation[r]};
            const struct vc_layer conv2 = {.alpha = F + w->alpha2[b][r],
                                           .w = vc_operand_at(o, G, c2->w),
                                           .b = F + c2->b,
                                           .c_out = c,
                                           .k = c2->k,
                                           .dil = 1};
            rc = vc_conv1d(o, h->hbuf, stream, conv1, nullptr, 2);
            struct vc_act hv = {h->hbuf, (long long)t * c, t, c};
            if (rc == 0) rc = vc_conv1d(o, h->a, hv, conv2, &stream, 2);
            stream = {h->a, (long long)t * c, t, c};
        }
        cur = stream;
    }
    cv = &w->conv_out;
    const struct vc_layer conv_out = {
        .alpha = F + w->alpha_out, .w = F + cv->w, .b = F + cv->b, .c_out = 1, .k = cv->k};
    if (rc == 0) rc = vc_conv_out(o, h->pcm, cur, conv_out, 2);
    return rc;
}

static int vc_cuda(cudaError_t e, const char *what)
{
    return dit_cuda_status(e, what);
}

/* Upload n float32 host values as GEMM operands of type fmt (plain fp16 for both fp16
 * types: only activations are ever stored scaled). */
static int vc_upload_operands(void **dst, const float *src, size_t n, int fmt)
{
    int rc = vc_cuda(cudaMalloc(dst, std::max<size_t>(n, 1) * dit_operand_size(fmt)), "cudaMalloc (vocoder weights)");
    if (rc < 0 || !n) return rc;
    if (fmt == DIT_OPERAND_F32) return vc_cuda(cudaMemcpy(*dst, src, n * 4, cudaMemcpyHostToDevice), "vocoder weights upload");
    std::vector<uint16_t> hb(n);
    for (size_t i = 0; i < n; i++) {
        if (fmt != DIT_OPERAND_BF16 && !(fabsf(src[i]) <= 65504.0f))
            return mm3_errorf(-ERANGE,
                              "vocoder_cuda: GEMM weight %zu is %g, beyond fp16's range (65504): use matmul_precision "
                              "tf32 or bf16 for this checkpoint",
                              i, (double)src[i]);
        hb[i] = fmt == DIT_OPERAND_BF16 ? mm3_f32_to_bf16(src[i]) : mm3_f32_to_f16(src[i]);
    }
    return vc_cuda(cudaMemcpy(*dst, hb.data(), n * 2, cudaMemcpyHostToDevice), "vocoder weights upload");
}

static int vc_malloc(float **p, size_t n, const char *what)
{
    return vc_cuda(cudaMalloc((void **)p, std::max<size_t>(n, 1) * sizeof(float)), what);
}

extern "C" int vocoder_cuda_create(struct vocoder_cuda **out, const struct vocoder *v, enum mm3_matmul_precision prec,
                                   int max_L)
{
    *out = nullptr;
    if (max_L < 1) return mm3_errorf(-EINVAL, "vocoder_cuda_create: max_L %d, expected >= 1", max_L);
    if ((int64_t)max_L * vocoder_hop(v) > INT32_MAX / 2)
        return mm3_errorf(-EINVAL, "vocoder_cuda_create: max_L %d gives more than 2^30 samples per channel", max_L);
    if (prec == MM3_MATMUL_FP8) prec = MM3_MATMUL_FP16; /* fp8 is the DiT's: the vocoder stays fp16 */
    struct vocoder_layers l;
    int rc = vocoder_layers_get(v, &l);
    if (rc < 0) return rc;
    struct vocoder_cuda *h = (struct vocoder_cuda *)calloc(1, sizeof *h);
    if (!h) return mm3_errorf(-ENOMEM, "vocoder_cuda_create: out of memory");
    h->prec = prec;
    h->max_L = max_L;
    h->ops.fmt = dit_operand_of(prec);
    if ((rc = vocoder_cuda_weights_build(&h->w, &l)) < 0) {
        free(h);
        return rc;
    }
    struct vc_sizes z = vc_sizes_for(&h->w, max_L);
    h->ops.op_elems = z.op;
    rc = dit_gemm_create(&h->ops.g, prec);
    if (rc == 0)
        rc = vc_cuda(cudaStreamCreateWithPriority(&h->ops.st, cudaStreamNonBlocking, cuda_stream_priority()),
                     "cudaStreamCreate");
    if (rc == 0) rc = vc_upload_operands(&h->dgemm, h->w.gemm, h->w.n_gemm, h->ops.fmt);
    if (rc == 0) rc = vc_malloc(&h->df32, h->w.n_f32, "cudaMalloc (vocoder weights)");
    if (rc == 0)
        rc = vc_cuda(cudaMemcpy(h->df32, h->w.f32, sizeof(float) * h->w.n_f32, cudaMemcpyHostToDevice),
                     "vocoder weights upload");
    vocoder_cuda_weights_free(&h->w); /* offsets and sizes stay */
    if (rc == 0) rc = vc_malloc(&h->a, z.a, "cudaMalloc (vocoder activations)");
    if (rc == 0) rc = vc_malloc(&h->hbuf, z.h, "cudaMalloc (vocoder activations)");
    if (rc == 0) rc = vc_malloc(&h->ybuf, z.y, "cudaMalloc (vocoder activations)");
    if (rc == 0)
        rc = vc_cuda(cudaMalloc(&h->ops.op, std::max<size_t>(z.op, 1) * dit_operand_size(h->ops.fmt)),
                     "cudaMalloc (vocoder GEMM operand)");
    if (rc == 0) rc = vc_malloc(&h->lat, (size_t)h->w.latent_channels * max_L, "cudaMalloc (vocoder latents)");
    if (rc == 0) rc = vc_malloc(&h->pcm, 2 * (size_t)h->w.hop * max_L, "cudaMalloc (vocoder pcm)");
    /* one decode at the window shape while autotuning is on picks every GEMM's algorithm;
     * shapes first met later (a song's short last window) take the heuristic's first */
    if (rc == 0)
        rc = vc_cuda(cudaMemsetAsync(h->lat, 0, sizeof(float) * h->w.latent_channels * max_L, h->ops.st),
                     "cudaMemset (vocoder latents)");
    if (rc == 0) rc = vc_decode_device(h, max_L);
    if (rc == 0) rc = vc_cuda(cudaStreamSynchronize(h->ops.st), "vocoder warm-up decode");
    if (rc < 0) {
        vocoder_cuda_free(h);
        return rc;
    }
    dit_gemm_set_autotune(h->ops.g, 0);
    *out = h;
    return 0;
}

extern "C" void vocoder_cuda_free(struct vocoder_cuda *h)
{
    if (!h) return;
    if (h->ops.st) cudaStreamSynchronize(h->ops.st);
    cudaFree(h->dgemm);
    cudaFree(h->df32);
    cudaFree(h->a);
    cudaFree(h->hbuf);
    cudaFree(h->ybuf);
    cudaFree(h->ops.op);
    cudaFree(h->lat);
    cudaFree(h->pcm);
    dit_gemm_destroy(h->ops.g);
    if (h->ops.st) cudaStreamDestroy(h->ops.st);
    vocoder_cuda_weights_free(&h->w);
    free(h);
}

extern "C" enum mm3_matmul_precision vocoder_cuda_precision(const struct vocoder_cuda *h)
{
    return h->prec;
}
extern "C" int vocoder_cuda_hop(const struct vocoder_cuda *h)
{
    return h->w.hop;
}
extern "C" int vocoder_cuda_latent_channels(const struct vocoder_cuda *h)
{
    return h->w.latent_channels;
}
extern "C" int vocoder_cuda_max_L(const struct vocoder_cuda *h)
{
    return h->max_L;
}

static int vc_decode_once(struct vocoder_cuda *h, const float *latents, int L, float *pcm)
{
    size_t n_lat = (size_t)h->w.latent_channels * L, n_pcm = 2 * (size_t)h->w.hop * L;
    cudaStream_t st = h->ops.st;
    int rc = vc_cuda(cudaMemcpyAsync(h->lat, latents, sizeof(float) * n_lat, cudaMemcpyHostToDevice, st),
                     "vocoder latents upload");
    if (rc == 0) rc = vc_decode_device(h, L);
    if (rc == 0)
        rc = vc_cuda(cudaMemcpyAsync(pcm, h->pcm, sizeof(float) * n_pcm, cudaMemcpyDeviceToHost, st),
                     "vocoder pcm download");
    /* also after a failed launch: nothing may still run on the caller's buffers */
    int rs = vc_cuda(cudaStreamSynchronize(st), "vocoder decode");
    return rc ? rc : rs;
}

static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!std::isfinite(x[i])) return false;
    return true;
}

extern "C" int vocoder_cuda_decode(struct vocoder_cuda *h, const float *latents, int L, float *pcm)
{
    if (L < 1 || L > h->max_L)
        return mm3_errorf(-EINVAL, "vocoder_cuda_decode: latent length %d, expected 1..%d (max_L)", L, h->max_L);
    int rc = vc_decode_once(h, latents, L, pcm);
    size_t n_pcm = 2 * (size_t)h->w.hop * L;
    /* fp16 operands that overflowed turn into inf/NaN samples: decode again with every
     * operand scaled down, unless the latents themselves were not finite */
    if (rc < 0 || h->ops.fmt != DIT_OPERAND_F16 || all_finite(pcm, n_pcm) ||
        !all_finite(latents, (size_t)h->w.latent_channels * L))
        return rc;
    dit_cuda_count_f16_rescue();
    h->ops.fmt = DIT_OPERAND_F16_SCALED;
    dit_gemm_set_alpha(h->ops.g, DIT_F16_RESCUE_SCALE);
    rc = vc_decode_once(h, latents, L, pcm);
    h->ops.fmt = DIT_OPERAND_F16;
    dit_gemm_set_alpha(h->ops.g, 1.0f);
    if (rc == 0 && !all_finite(pcm, n_pcm))
        rc = mm3_errorf(-ERANGE, "vocoder_cuda_decode: the audio is not finite even with the fp16 operands scaled "
                                 "by 1/%g: use matmul_precision tf32",
                        (double)DIT_F16_RESCUE_SCALE);
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
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    int rc = vc_cuda(cudaEventCreate(&e0), "cudaEventCreate");
    if (rc == 0) rc = vc_cuda(cudaEventCreate(&e1), "cudaEventCreate");
    for (int i = 0; rc == 0 && i < 2; i++)
        rc = vocoder_cuda_decode(h, lat.data(), L, pcm.data());
    for (int i = 0; rc == 0 && i < reps; i++) {
        rc = vc_cuda(cudaEventRecord(e0, h->ops.st), "cudaEventRecord");
        if (rc == 0) rc = vocoder_cuda_decode(h, lat.data(), L, pcm.data());
        if (rc == 0) rc = vc_cuda(cudaEventRecord(e1, h->ops.st), "cudaEventRecord");
        if (rc == 0) rc = vc_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
        if (rc == 0) rc = vc_cuda(cudaEventElapsedTime(&ms[i], e0, e1), "cudaEventElapsedTime");
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (rc < 0) return rc;
    std::sort(ms.begin(), ms.end());
    *ms_median = ms[reps / 2];
    return 0;
}

/* ---- single layers on host arrays (tests) ---------------------------------------------------- */

namespace
{
/* Device buffers, a GEMM handle and the operand scratch of one test call, freed at scope exit. */
struct host_run {
    std::vector<void *> p;
    struct vc_ops o = {};
    int rc = 0;
    ~host_run()
    {
        if (o.st) cudaStreamSynchronize(o.st);
        for (void *q : p)
            cudaFree(q);
        dit_gemm_destroy(o.g);
        if (o.st) cudaStreamDestroy(o.st);
    }
    void open(enum mm3_matmul_precision prec, size_t op_elems)
    {
        o.fmt = dit_operand_of(prec);
        o.op_elems = op_elems;
        if (rc == 0) rc = dit_gemm_create(&o.g, prec);
        if (rc == 0) dit_gemm_set_autotune(o.g, 0);
        if (rc == 0)
            rc = vc_cuda(cudaStreamCreateWithPriority(&o.st, cudaStreamNonBlocking, cuda_stream_priority()),
                         "cudaStreamCreate");
        if (rc == 0) rc = vc_cuda(cudaMalloc(&o.op, std::max<size_t>(op_elems, 1) * dit_operand_size(o.fmt)), "cudaMalloc");
        if (rc == 0) p.push_back(o.op);
    }
    float *up(const float *h, size_t n)
    {
        float *d = nullptr;
        if (rc == 0) rc = vc_cuda(cudaMalloc((void **)&d, sizeof(float) * std::max<size_t>(n, 1)), "cudaMalloc");
        if (rc == 0) p.push_back(d);
        if (rc == 0 && h) rc = vc_cuda(cudaMemcpy(d, h, sizeof(float) * n, cudaMemcpyHostToDevice), "upload");
        return d;
    }
    const void *up_operands(const float *h, size_t n)
    {
        void *d = nullptr;
        if (rc == 0) rc = vc_upload_operands(&d, h, n, o.fmt);
        if (d) p.push_back(d);
        return d;
    }
    void down(float *h, const float *d, size_t n)
    {
        if (rc == 0) rc = vc_cuda(cudaStreamSynchronize(o.st), "test layer");
        if (rc == 0) rc = vc_cuda(cudaMemcpy(h, d, sizeof(float) * n, cudaMemcpyDeviceToHost), "download");
    }
};

/* Channels-first items [batch][c][t] -> time-major [batch][t][c]. */
std::vector<float> to_time_major(const float *x, int batch, int c, int t)
{
    std::vector<float> y((size_t)batch * c * t);
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < c; i++)
            for (int n = 0; n < t; n++)
                y[((size_t)b * t + n) * c + i] = x[((size_t)b * c + i) * t + n];
    return y;
}

/* Whether g is the shape the decode runs for that layer kind (the host twins below run
 * only those): 0 or -EINVAL naming the field. */
int check_geometry(const char *fn, const struct conv1d_geometry *g, int pad, int c_out)
{
    if (g->c_in < 1 || g->c_out < 1 || g->t < 1 || g->k < 1)
        return mm3_errorf(-EINVAL, "%s: c_in %d, c_out %d, t %d, k %d: expected all >= 1", fn, g->c_in, g->c_out, g->t,
                          g->k);
    if (g->pad != pad) return mm3_errorf(-EINVAL, "%s: pad %d, expected %d", fn, g->pad, pad);
    if (c_out > 0 && g->c_out != c_out) return mm3_errorf(-EINVAL, "%s: c_out %d, expected %d", fn, g->c_out, c_out);
    return 0;
}
} // namespace

extern "C" int vocoder_cuda_conv1d_host(float *y, const float *x, const float *alpha, const float *w, const float *b,
                                        int batch, const struct conv1d_geometry *g, enum mm3_matmul_precision prec)
{
    int c_in = g->c_in, c_out = g->c_out, t = g->t, k = g->k, dilation = g->dilation;
    if (k % 2 == 0 || dilation < 1)
        return mm3_errorf(-EINVAL, "vocoder_cuda_conv1d_host: k %d, dilation %d: expected odd k and dilation >= 1", k,
                          dilation);
    int rc = check_geometry("vocoder_cuda_conv1d_host", g, dilation * (k - 1) / 2, 0);
    if (rc < 0) return rc;
    std::vector<float> wt((size_t)c_out * c_in * k), xt = to_time_major(x, batch, c_in, t);
    vocoder_cuda_tap_major(wt.data(), w, c_out, c_in, k);
    host_run r;
    r.open(prec, (size_t)batch * t * k * c_in);
    const float *dx = r.up(xt.data(), xt.size()), *da = alpha ? r.up(alpha, (size_t)c_in) : nullptr;
    const float *db = r.up(b, (size_t)c_out);
    const void *dw = r.up_operands(wt.data(), wt.size());
    float *dy = r.up(nullptr, (size_t)batch * t * c_out);
    if (r.rc == 0)
        r.rc = vc_conv1d(&r.o, dy, {dx, (long long)t * c_in, t, c_in},
                         {.alpha = da, .w = dw, .b = db, .c_out = c_out, .k = k, .dil = dilation}, nullptr, batch);
    std::vector<float> yt((size_t)batch * t * c_out);
    r.down(yt.data(), dy, yt.size());
    for (int it = 0; r.rc == 0 && it < batch; it++)
        for (int n = 0; n < t; n++)
            for (int o = 0; o < c_out; o++)
                y[((size_t)it * c_out + o) * t + n] = yt[((size_t)it * t + n) * c_out + o];
    return r.rc;
}

extern "C" int vocoder_cuda_conv_transpose1d_host(float *y, const float *x, const float *alpha, const float *w,
                                                  const float *b, int batch, const struct conv1d_geometry *g,
                                                  enum mm3_matmul_precision prec)
{
    int c_in = g->c_in, c_out = g->c_out, t_in = g->t, s = g->stride;
    if (s < 1 || g->k != 2 * s)
        return mm3_errorf(-EINVAL, "vocoder_cuda_conv_transpose1d_host: k %d and stride %d, expected k = 2 * stride",
                          g->k, s);
    int rc = check_geometry("vocoder_cuda_conv_transpose1d_host", g, (s + 1) / 2, 0);
    if (rc < 0) return rc;
    std::vector<float> wp((size_t)c_in * c_out * 2 * s), bias((size_t)s * c_out),
        xt = to_time_major(x, batch, c_in, t_in);
    vocoder_cuda_phase_weights(wp.data(), w, c_in, c_out, s);
    for (int p = 0; p < s; p++)
        std::copy(b, b + c_out, bias.begin() + (size_t)p * c_out);
    host_run r;
    r.open(prec, (size_t)batch * (t_in + 1) * 2 * c_in);
    const float *dx = r.up(xt.data(), xt.size()), *da = alpha ? r.up(alpha, (size_t)c_in) : nullptr;
    const float *db = r.up(bias.data(), bias.size());
    const void *dw = r.up_operands(wp.data(), wp.size());
    size_t ny = (size_t)batch * (t_in + 1) * s * c_out;
    float *dy = r.up(nullptr, ny);
    struct vc_act v = {};
    if (r.rc == 0)
        r.rc = vc_conv_t(&r.o, dy, {dx, (long long)t_in * c_in, t_in, c_in},
                         {.alpha = da, .w = dw, .b = db, .c_out = c_out, .k = 2, .dil = 1, .stride = s}, batch, &v);
    std::vector<float> yt(ny);
    r.down(yt.data(), dy, ny);
    /* the view *v says where each track's output starts inside the slack layout */
    size_t first = (size_t)(v.p - dy);
    for (int it = 0; r.rc == 0 && it < batch; it++)
        for (int n = 0; n < v.t; n++)
            for (int o = 0; o < c_out; o++)
                y[((size_t)it * c_out + o) * v.t + n] = yt[first + it * v.track_stride + (size_t)n * c_out + o];
    return r.rc;
}

extern "C" int vocoder_cuda_conv_out_host(float *y, const float *x, const float *alpha, const float *w, const float *b,
                                          int batch, const struct conv1d_geometry *g)
{
    int c_in = g->c_in, t = g->t, k = g->k;
    if (g->dilation != 1)
        return mm3_errorf(-EINVAL, "vocoder_cuda_conv_out_host: dilation %d, expected 1", g->dilation);
    int rc = check_geometry("vocoder_cuda_conv_out_host", g, (k - 1) / 2, 1);
    if (rc < 0) return rc;
    std::vector<float> wt((size_t)c_in * k), xt = to_time_major(x, batch, c_in, t);
    vocoder_cuda_tap_major(wt.data(), w, 1, c_in, k);
    host_run r;
    r.open(MM3_MATMUL_FP32, 1);
    const float *dx = r.up(xt.data(), xt.size()), *da = alpha ? r.up(alpha, (size_t)c_in) : nullptr;
    const float *dw = r.up(wt.data(), wt.size()), *db = r.up(b, 1);
    float *dy = r.up(nullptr, (size_t)batch * t);
    if (r.rc == 0)
        r.rc = vc_conv_out(&r.o, dy, {dx, (long long)t * c_in, t, c_in},
                           {.alpha = da, .w = dw, .b = db, .c_out = 1, .k = k}, batch);
    r.down(y, dy, (size_t)batch * t);
    return r.rc;
}
