/* cuBLASLt GEMMs in fp32 / tf32 / bf16 / fp16 / fp8 with bias and accumulate epilogues (dit_gemm.h). */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cublasLt.h>

#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/dit_gemm.h"

extern "C" {
#include "common/log.h"
}

enum { GEMM_WORKSPACE = 64 << 20, GEMM_MAX_PLANS = 64, GEMM_CANDIDATES = 8 };

/* How a plan computes: dit_gemm_run's operands, or e4m3 with the row scales applied by
 * cuBLASLt (outer-vector scale modes) or by fp8_epilogue_kernel after a unit-scale GEMM. */
enum { MODE_PLAIN = 0, MODE_FP8_OUTER, MODE_FP8_UNIT };

struct gemm_key {
    int M, K, N, lda, ldd, has_bias, has_c, mode;
    uint32_t align_a, align_w, align_d;
};

struct gemm_plan {
    struct gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lw, ld;
    cublasLtMatmulAlgo_t algo;
    int bias_kernel; /* cuBLASLt offered no bias epilogue here: add it with add_bias_kernel */
    int refused;     /* an fp8 shape cuBLASLt has no outer-vector-scaled kernel for: run it unit-scaled */
};

struct dit_gemm {
    enum mm3_matmul_precision prec;
    float alpha; /* scales every product: undoes an operand scale (dit_gemm_set_alpha) */
    int autotune;
    int fp8_unit_logged; /* the log said once that some fp8 GEMMs apply their scales themselves */
    int fp8_epilogue;    /* dit_gemm_set_fp8_epilogue: every fp8 GEMM unit-scaled */
    cublasLtHandle_t lt;
    void *workspace;
    float *fp8_acc; /* MODE_FP8_UNIT: the unscaled products, fp8_acc_elems floats */
    size_t fp8_acc_elems;
    int n_plans;
    struct gemm_plan plans[GEMM_MAX_PLANS];
};

static uint32_t ptr_alignment(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a)
        a >>= 1;
    return a;
}

__global__ void add_bias_kernel(float *d, int ldd, const float *bias, int M, int N)
{
    size_t n = (size_t)M * N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        d[(e / N) * ldd + e % N] += bias[e % N];
}

/* d = sa[m] sw[n] acc (+ bias[n]) (+ c): the row and column scales of a unit-scale fp8 GEMM. */
__global__ void fp8_epilogue_kernel(float *d, int ldd, const float *acc, const float *sa, const float *sw,
                                    const float *bias, const float *c, int M, int N)
{
    size_t n = (size_t)M * N;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t m = e / N, j = e % N, o = m * ldd + j;
        float v = acc[e] * sa[m] * sw[j];
        if (bias) v += bias[j];
        if (c) v += c[o];
        d[o] = v;
    }
}

static int lt_error(cublasStatus_t st, const char *what)
{
    return mm3_errorf(-ENODEV, "cuBLASLt %s: status %d", what, (int)st);
}

extern "C" size_t dit_gemm_operand_size(enum mm3_matmul_precision prec)
{
    return prec == MM3_MATMUL_BF16 || prec == MM3_MATMUL_FP16 || prec == MM3_MATMUL_FP8 ? 2 : 4;
}

extern "C" int dit_gemm_fp8_fits(int K, int N, int lda, int ldd)
{
    return K > 0 && N > 0 && K % 16 == 0 && N % 16 == 0 && lda % 16 == 0 && ldd % 4 == 0;
}

extern "C" int dit_gemm_create(struct dit_gemm **out, enum mm3_matmul_precision prec)
{
    *out = NULL;
    if ((int)prec < 0 || prec >= MM3_MATMUL_COUNT)
        return mm3_errorf(-EINVAL, "dit_gemm_create: matmul precision %d: expected fp32, tf32, bf16, fp16 or fp8",
                          (int)prec);
    struct dit_gemm *g = (struct dit_gemm *)calloc(1, sizeof *g);
    if (!g) return mm3_errorf(-ENOMEM, "dit_gemm_create: out of memory");
    g->prec = prec;
    g->alpha = 1.0f;
    g->autotune = 1;
    cublasStatus_t st = cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return lt_error(st, "cublasLtCreate");
    }
    int rc = dit_cuda_status(cudaMalloc(&g->workspace, GEMM_WORKSPACE), "cudaMalloc (cuBLASLt workspace)");
    if (rc < 0) {
        cublasLtDestroy(g->lt);
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

static void plan_release(struct gemm_plan *p)
{
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    if (p->lw) cublasLtMatrixLayoutDestroy(p->lw);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

extern "C" void dit_gemm_set_alpha(struct dit_gemm *g, float alpha)
{
    g->alpha = alpha;
}

extern "C" void dit_gemm_set_fp8_epilogue(struct dit_gemm *g, int on)
{
    g->fp8_epilogue = on != 0;
}

extern "C" void dit_gemm_set_autotune(struct dit_gemm *g, int on)
{
    g->autotune = on != 0;
}

extern "C" void dit_gemm_destroy(struct dit_gemm *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_plans; i++)
        plan_release(&g->plans[i]);
    cudaFree(g->fp8_acc);
    cudaFree(g->workspace);
    cublasLtDestroy(g->lt);
    free(g);
}

#define LT_TRY(call)                                                                                                   \
    do {                                                                                                               \
        cublasStatus_t st_ = (call);                                                                                   \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                            \
            rc = lt_error(st_, #call);                                                                                 \
            goto fail;                                                                                                 \
        }                                                                                                              \
    } while (0)

/* Column-major view: d^T[N, M] = W_cm[K, N]^T . a^T[K, M] (the "TN" GEMM). */
/* Time each heuristic candidate on the real operands (output into scratch, so an
 * accumulating GEMM leaves its C alone) and keep the fastest: the first heuristic
 * answer is often not the fastest kernel for token-count M. Every candidate runs once
 * before any is timed, then the candidates take turns, AUTOTUNE_ROUNDS times each, and
 * each is judged by its median: an idle GPU clocks up during the first runs, and timing
 * the candidates one after another would favour the last ones. */
enum { AUTOTUNE_ROUNDS = 3 };

static void plan_autotune(struct dit_gemm *g, struct gemm_plan *p, const cublasLtMatmulHeuristicResult_t *heur,
                          int found, const void *a, const void *w, const float *bias, cudaStream_t s)
{
    const struct gemm_key *k = &p->key;
    size_t n = (size_t)(k->M - 1) * k->ldd + k->N;
    float *scratch = NULL;
    cudaEvent_t ev[GEMM_CANDIDATES][2 * AUTOTUNE_ROUNDS]; /* start and stop of each timed run */
    float ms[GEMM_CANDIDATES][AUTOTUNE_ROUNDS];
    bool ok[GEMM_CANDIDATES];
    float alpha = 1.0f, beta = k->has_c ? 1.0f : 0.0f, best = INFINITY;
    memset(ev, 0, sizeof ev);
    if (cudaMalloc(&scratch, n * 4) != cudaSuccess || cudaMemsetAsync(scratch, 0, n * 4, s) != cudaSuccess)
        goto done;
    if (k->has_bias && !p->bias_kernel &&
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) !=
            CUBLAS_STATUS_SUCCESS)
        goto done;
    for (int i = 0; i < found; i++) {
        ok[i] = heur[i].state == CUBLAS_STATUS_SUCCESS;
        for (int r = 0; r < 2 * AUTOTUNE_ROUNDS && ok[i]; r++)
            ok[i] = cudaEventCreate(&ev[i][r]) == cudaSuccess;
    }
    for (int r = -1; r < AUTOTUNE_ROUNDS; r++) /* round -1: every candidate once, untimed */
        for (int i = 0; i < found; i++) {
            if (!ok[i]) continue;
            ok[i] = r < 0 || cudaEventRecord(ev[i][2 * r], s) == cudaSuccess;
            ok[i] = ok[i] && cublasLtMatmul(g->lt, p->op, &alpha, w, p->lw, a, p->la, &beta, scratch, p->ld, scratch,
                                            p->ld, &heur[i].algo, g->workspace, GEMM_WORKSPACE,
                                            s) == CUBLAS_STATUS_SUCCESS;
            ok[i] = ok[i] && (r < 0 || cudaEventRecord(ev[i][2 * r + 1], s) == cudaSuccess);
        }
    if (cudaStreamSynchronize(s) != cudaSuccess) goto done;
    for (int i = 0; i < found; i++) {
        if (!ok[i]) continue;
        for (int r = 0; r < AUTOTUNE_ROUNDS && ok[i]; r++)
            ok[i] = cudaEventElapsedTime(&ms[i][r], ev[i][2 * r], ev[i][2 * r + 1]) == cudaSuccess;
        if (!ok[i]) continue;
        std::sort(ms[i], ms[i] + AUTOTUNE_ROUNDS);
        if (ms[i][AUTOTUNE_ROUNDS / 2] < best) {
            best = ms[i][AUTOTUNE_ROUNDS / 2];
            p->algo = heur[i].algo;
        }
    }
done:
    (void)cudaGetLastError();
    for (int i = 0; i < GEMM_CANDIDATES; i++)
        for (int r = 0; r < 2 * AUTOTUNE_ROUNDS; r++)
            if (ev[i][r]) cudaEventDestroy(ev[i][r]);
    if (scratch) {
        cudaStreamSynchronize(s);
        cudaFree(scratch);
    }
}

/* The row scales of an outer-vector fp8 plan: cuBLASLt's A is our w (N scales), its B our a (M). */
static cublasStatus_t set_fp8_scales(struct gemm_plan *p, const float *sa, const float *sw)
{
    cublasStatus_t st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa);
    return st;
}

static const char *mode_name(const struct dit_gemm *g, int mode)
{
    return mode != MODE_PLAIN                                        ? "fp8"
           : g->prec == MM3_MATMUL_BF16                              ? "bf16"
           : g->prec == MM3_MATMUL_FP16 || g->prec == MM3_MATMUL_FP8 ? "fp16"
           : g->prec == MM3_MATMUL_TF32                              ? "tf32"
                                                                     : "fp32";
}

static int plan_make(struct dit_gemm *g, const struct gemm_key *k, struct gemm_plan *p, int bias_kernel,
                     const struct dit_gemm_product *prod, cudaStream_t s)
{
    const void *a = prod->a, *w = prod->w;
    const float *bias = prod->bias, *sa = prod->sa, *sw = prod->sw;
    int rc = 0;
    memset(p, 0, sizeof *p);
    p->key = *k;
    p->bias_kernel = bias_kernel || k->mode != MODE_PLAIN; /* fp8: the bias is added after the scales */
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur[GEMM_CANDIDATES];
    int found = 0;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cublasComputeType_t ct =
        g->prec == MM3_MATMUL_TF32 && k->mode == MODE_PLAIN ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cudaDataType_t ot = k->mode != MODE_PLAIN                                     ? CUDA_R_8F_E4M3
                        : g->prec == MM3_MATMUL_BF16                              ? CUDA_R_16BF
                        : g->prec == MM3_MATMUL_FP16 || g->prec == MM3_MATMUL_FP8 ? CUDA_R_16F
                                                                                  : CUDA_R_32F;
    /* a unit-scale fp8 GEMM writes its unscaled products densely into g->fp8_acc */
    int64_t ld_out = k->mode == MODE_FP8_UNIT ? k->N : k->ldd;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int epi_bias = k->has_bias && !p->bias_kernel;
    cublasLtEpilogue_t epi = epi_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    size_t ws = GEMM_WORKSPACE;

    LT_TRY(cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (epi_bias) {
        cudaDataType_t bt = CUDA_R_32F;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (k->mode == MODE_FP8_OUTER) {
        int32_t sm = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &sm, sizeof sm));
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &sm, sizeof sm));
        LT_TRY(set_fp8_scales(p, sa, sw));
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&p->lw, ot, (uint64_t)k->K, (uint64_t)k->N, (int64_t)k->K));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->la, ot, (uint64_t)k->K, (uint64_t)k->M, (int64_t)k->lda));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->ld, CUDA_R_32F, (uint64_t)k->N, (uint64_t)k->M, ld_out));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->align_w,
                                                sizeof k->align_w));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->align_a,
                                                sizeof k->align_a));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->align_d,
                                                sizeof k->align_d));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->align_d,
                                                sizeof k->align_d));
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->lw, p->la, p->ld, p->ld, pref,
                                          g->autotune ? GEMM_CANDIDATES : 1, heur, &found));
    if (found < 1) {
        rc = mm3_errorf(-ENODEV, "cuBLASLt: no algorithm for the %s%s GEMM M %d K %d N %d", mode_name(g, k->mode),
                        k->mode == MODE_FP8_OUTER ? " (per-row scales)" : "", k->M, k->K, k->N);
        goto fail;
    }
    p->algo = heur[0].algo;
    cublasLtMatmulPreferenceDestroy(pref);
    /* no timing (and no synchronising allocation) inside a graph capture */
    if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) capture = cudaStreamCaptureStatusActive;
    if (g->autotune && found > 1 && capture == cudaStreamCaptureStatusNone)
        plan_autotune(g, p, heur, found, a, w, bias, s);
    return 0;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    plan_release(p);
    return rc;
}

/* The cached plan of key k (made on first use; NULL with the error set). */
static struct gemm_plan *plan_for(struct dit_gemm *g, const struct gemm_key *k, const struct dit_gemm_product *prod,
                                  cudaStream_t s, int *rc)
{
    for (int i = 0; i < g->n_plans; i++)
        if (!memcmp(&g->plans[i].key, k, sizeof *k)) {
            if (!g->plans[i].refused) return &g->plans[i];
            *rc = -ENOTSUP;
            return NULL;
        }
    /* the table is full only with many shapes; recycle the oldest slot */
    int slot = g->n_plans < GEMM_MAX_PLANS ? g->n_plans : 0;
    if (g->n_plans == GEMM_MAX_PLANS) plan_release(&g->plans[0]);
    *rc = plan_make(g, k, &g->plans[slot], 0, prod, s);
    if (*rc < 0 && prod->bias && k->mode == MODE_PLAIN) *rc = plan_make(g, k, &g->plans[slot], 1, prod, s);
    if (*rc < 0 && k->mode == MODE_FP8_OUTER) {
        /* remember the refusal (an empty plan), so the shape does not ask cuBLASLt again */
        g->plans[slot].key = *k;
        g->plans[slot].refused = 1;
        if (slot == g->n_plans) g->n_plans++;
        *rc = -ENOTSUP;
        return NULL;
    }
    if (*rc < 0) return NULL;
    if (slot == g->n_plans) g->n_plans++;
    return &g->plans[slot];
}

/* The key of product p in mode; MODE_FP8_UNIT adds c in its epilogue, not in the GEMM. */
static void key_init(struct gemm_key *k, int mode, const struct dit_gemm_product *p)
{
    float *d = p->d;
    const void *a = p->a, *w = p->w;
    const float *bias = p->bias, *c = mode == MODE_FP8_UNIT ? NULL : p->c;
    int M = p->M, K = p->K, N = p->N, lda = p->lda, ldd = p->ldd;
    memset(k, 0, sizeof *k);
    k->M = M, k->K = K, k->N = N, k->lda = lda, k->ldd = ldd, k->has_bias = bias != NULL, k->has_c = c != NULL;
    k->mode = mode;
    k->align_a = ptr_alignment(a);
    k->align_w = ptr_alignment(w);
    k->align_d = mode == MODE_FP8_UNIT ? 256 : ptr_alignment(d); /* unit: g->fp8_acc, from cudaMalloc */
    if (c && ptr_alignment(c) < k->align_d) k->align_d = ptr_alignment(c);
}

extern "C" int dit_gemm_run(struct dit_gemm *g, const struct dit_gemm_product *prod, void *stream)
{
    float *d = prod->d;
    const void *a = prod->a, *w = prod->w;
    const float *bias = prod->bias, *c = prod->c;
    int M = prod->M, K = prod->K, N = prod->N, lda = prod->lda, ldd = prod->ldd;
    if (M < 1 || K < 1 || N < 1 || lda < K || ldd < N || !d || !a || !w)
        return mm3_errorf(-EINVAL,
                          "dit_gemm_run: M %d K %d N %d, lda %d, ldd %d: expected positive sizes, "
                          "lda >= K, ldd >= N, non-NULL pointers",
                          M, K, N, lda, ldd);
    struct gemm_key k;
    key_init(&k, MODE_PLAIN, prod);
    int rc = 0;
    struct gemm_plan *p = plan_for(g, &k, prod, (cudaStream_t)stream, &rc);
    if (!p) return rc;
    if (bias && !p->bias_kernel)
        LT_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    {
        float beta = c ? 1.0f : 0.0f;
        LT_TRY(cublasLtMatmul(g->lt, p->op, &g->alpha, w, p->lw, a, p->la, &beta, c ? c : d, p->ld, d, p->ld, &p->algo,
                              g->workspace, GEMM_WORKSPACE, (cudaStream_t)stream));
    }
    if (bias && p->bias_kernel) {
        size_t n = (size_t)M * N;
        add_bias_kernel<<<dit_cuda_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>(d, ldd, bias, M, N);
        return dit_cuda_launched("add_bias_kernel");
    }
    return 0;
fail:
    return rc;
}

/* Room for elems unscaled fp8 products (grows only; synchronises the device when it does). */
static int fp8_acc_reserve(struct dit_gemm *g, size_t elems)
{
    if (elems <= g->fp8_acc_elems) return 0;
    int rc = dit_cuda_status(cudaDeviceSynchronize(), "fp8 GEMM products");
    if (rc < 0) return rc;
    cudaFree(g->fp8_acc);
    g->fp8_acc = NULL;
    g->fp8_acc_elems = 0;
    rc = dit_cuda_status(cudaMalloc((void **)&g->fp8_acc, elems * sizeof(float)), "cudaMalloc (fp8 GEMM products)");
    if (rc == 0) g->fp8_acc_elems = elems;
    return rc;
}

/* One fp8 GEMM in mode MODE_FP8_OUTER or MODE_FP8_UNIT; -ENOTSUP (no message) when
 * cuBLASLt has no outer-vector-scaled kernel for it. */
static int run_fp8_mode(struct dit_gemm *g, int mode, const struct dit_gemm_product *prod, cudaStream_t s)
{
    float *d = prod->d;
    const void *a8 = prod->a, *w8 = prod->w;
    const float *sa = prod->sa, *sw = prod->sw, *bias = prod->bias, *c = prod->c;
    int M = prod->M, N = prod->N, ldd = prod->ldd;
    int rc = 0;
    if (mode == MODE_FP8_UNIT && (rc = fp8_acc_reserve(g, (size_t)M * N)) < 0) return rc;
    struct gemm_key k;
    key_init(&k, mode, prod);
    struct gemm_plan *p = plan_for(g, &k, prod, s, &rc);
    if (!p) return rc;
    float one = 1.0f, beta = mode == MODE_FP8_OUTER && c ? 1.0f : 0.0f;
    if (mode == MODE_FP8_OUTER) {
        if (set_fp8_scales(p, sa, sw) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmul(g->lt, p->op, &one, w8, p->lw, a8, p->la, &beta, c ? c : d, p->ld, d, p->ld, &p->algo,
                           g->workspace, GEMM_WORKSPACE, s) != CUBLAS_STATUS_SUCCESS) {
            p->refused = 1;
            return -ENOTSUP;
        }
        if (!bias) return 0;
        add_bias_kernel<<<dit_cuda_blocks((size_t)M * N, 256), 256, 0, s>>>(d, ldd, bias, M, N);
        return dit_cuda_launched("add_bias_kernel");
    }
    LT_TRY(cublasLtMatmul(g->lt, p->op, &one, w8, p->lw, a8, p->la, &beta, g->fp8_acc, p->ld, g->fp8_acc, p->ld,
                          &p->algo, g->workspace, GEMM_WORKSPACE, s));
    fp8_epilogue_kernel<<<dit_cuda_blocks((size_t)M * N, 256), 256, 0, s>>>(d, ldd, g->fp8_acc, sa, sw, bias, c, M, N);
    return dit_cuda_launched("fp8_epilogue_kernel");
fail:
    return rc;
}

extern "C" int dit_gemm_run_fp8(struct dit_gemm *g, const struct dit_gemm_product *prod, void *stream)
{
    int M = prod->M, K = prod->K, N = prod->N, lda = prod->lda, ldd = prod->ldd;
    if (g->prec != MM3_MATMUL_FP8 || M < 1 || lda < K || ldd < N || !dit_gemm_fp8_fits(K, N, lda, ldd) || !prod->d ||
        !prod->a || !prod->sa || !prod->w || !prod->sw)
        return mm3_errorf(-EINVAL,
                          "dit_gemm_run_fp8: M %d K %d N %d, lda %d, ldd %d: expected an fp8 handle, M >= 1, K, N "
                          "and lda multiples of 16, ldd of 4, non-NULL pointers",
                          M, K, N, lda, ldd);
    cudaStream_t s = (cudaStream_t)stream;
    if (g->fp8_epilogue) return run_fp8_mode(g, MODE_FP8_UNIT, prod, s);
    int rc = run_fp8_mode(g, MODE_FP8_OUTER, prod, s);
    if (rc == -ENOTSUP) {
        /* no per-row scales for e4m3 in this cuBLASLt for this shape: unit scales and our own epilogue */
        if (!g->fp8_unit_logged)
            LOG_INFO("fp8 GEMMs: cuBLASLt offers no per-row (outer vector) scales for M %d K %d N %d (and maybe "
                     "others): such GEMMs apply their scales in an epilogue kernel",
                     M, K, N);
        g->fp8_unit_logged = 1;
        rc = run_fp8_mode(g, MODE_FP8_UNIT, prod, s);
    }
    return rc;
}
