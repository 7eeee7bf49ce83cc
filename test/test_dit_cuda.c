/* The CUDA DiT (stage1/cuda/dit_cuda.h) and its kernels (stage1/cuda/dit_kernels.h)
 * against the float32 CPU reference (stage1/dit.h, common/ops.h).
 *
 * Tolerances are relative L2 errors ||gpu - cpu|| / ||cpu|| (see each TOL_*): fp32
 * GEMMs differ from the CPU only in summation order; tf32 and fp16 keep 10 mantissa bits
 * of each operand, bf16 7, all with float32 accumulation, so their bounds follow the
 * operand rounding (~2^-11 and ~2^-8 per product, averaged over long sums). fp16 also
 * runs rescued (every operand stored scaled down, the GEMMs scaling back), which must
 * stay within the same bound. fp8 (e4m3 operands of the block GEMMs, per-row scales) has
 * its own bound: see TOL_FWD_FP8.
 * Outputs are poisoned (NaN) before each run so an unwritten element fails.
 * The seed comes from the clock (MM3_TEST_SEED replays it).
 * MM3_TEST_DIT_QUICK=1 skips the release-width forward (its CPU reference takes ~1 min).
 * Exit 77 (skip) without CUDA compiled in or without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/ops.h"
#include "common/safetensors.h"
#include "stage1/dit.h"
#include "support/test_rand.h"
#include "support/test_stage1.h"
#include "support/test_support.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/dit_cuda.h"
#include "stage1/cuda/dit_fp8.h"
#include "stage1/cuda/dit_gemm.h"
#include "stage1/cuda/dit_kernels.h"

/* Whole forward (see the header comment); measured on the H200 (2026-11-30), tiny-a and
 * the release-width block alike: fp32 2e-7..1.7e-6, tf32 4.7e-4..5.2e-4, bf16 3.9e-3..4.2e-3. */
#define TOL_FWD_FP32 1e-4
#define TOL_FWD_TF32 2e-3
#define TOL_FWD_BF16 1.5e-2
#define TOL_FWD_FP16 TOL_FWD_TF32 /* the same operand mantissa as tf32 */
/* fp8: the block GEMMs' operands rounded to e4m3 (3 mantissa bits); the per-row scales keep
 * every value in e4m3's normal range but the smallest (< amax / 2^15 of its row), so rounding
 * is the only error. A rounding step of 2^-3 of the binade gives an RMS relative error per
 * operand of 2^-3 / sqrt(12) * E[1 / (1 + f)^2]^(1/2) ~ 0.036 * 0.74 ~ 0.027 (mantissas f
 * log-uniform), against bf16's 2^-7 / sqrt(12) * 0.74 ~ 0.0017: 16x. Errors propagate
 * linearly to first order, so the forward's error should be ~16x bf16's measured 4.2e-3
 * (~0.067, less since the io GEMMs stay fp16; ~0.03-0.07 expected); bound 1.5x that. */
#define TOL_FWD_FP8 1e-1
/* One value rounded to e4m3 after its row's scaling: at most half a step, 2^-4 relative, in
 * the normal range; what falls below it (|v| < amax / 2^15) loses at most 2^-10 of the scale. */
#define TOL_E4M3_OUT 6.25e-2
/* Single kernels (measured: rows <= 2e-6, attention fp32 7e-7, tf32 3.6e-4, bf16 2.9e-3). */
#define TOL_ROW 1e-5      /* LayerNorm, RoPE, gating: one reordered sum, 1-2 ulp trig/exp */
#define TOL_BF16_OUT 8e-3 /* a float32 result rounded to bf16 (2^-9 relative per element) */
#define TOL_F16_OUT 1e-3  /* ... to fp16 (2^-12 relative per element) */
#define TOL_ATT_FP32 2e-5
#define TOL_ATT_TF32 1.5e-3
#define TOL_ATT_BF16 1e-2

static uint64_t rng;

static float *rnd_array(size_t n, float a, float offset)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = offset + test_rand_uniform(&rng, a);
    return p;
}

static void *dev_upload(const void *host, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cuda_malloc(&d, bytes), 0);
    assert_int_equal(cuda_memcpy_h2d(d, host, bytes), 0);
    return d;
}

static void *dev_poisoned(size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cuda_malloc(&d, bytes), 0);
    assert_int_equal(cuda_memset(d, 0xff, bytes), 0);
    return d;
}

/* Download n results of operand type fmt (enum dit_operand) as the floats they stand for
 * (a scaled fp16 operand times the scale); every one must be finite. */
static float *dev_download(const void *d, size_t n, int fmt)
{
    assert_int_equal(cuda_stream_sync(NULL), 0);
    float *h = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(h);
    if (fmt != DIT_OPERAND_F32) {
        uint16_t *b = malloc(2 * (n ? n : 1));
        assert_non_null(b);
        assert_int_equal(cuda_memcpy_d2h(b, d, 2 * n), 0);
        for (size_t i = 0; i < n; i++)
            h[i] = fmt == DIT_OPERAND_BF16         ? mm3_bf16_to_f32(b[i])
                   : fmt == DIT_OPERAND_F16_SCALED ? mm3_f16_to_f32(b[i]) * DIT_F16_RESCUE_SCALE
                                                   : mm3_f16_to_f32(b[i]);
        free(b);
    } else {
        assert_int_equal(cuda_memcpy_d2h(h, d, 4 * n), 0);
    }
    for (size_t i = 0; i < n; i++)
        if (!isfinite(h[i])) fail_msg("element %zu of %zu not written or not finite: %g", i, n, h[i]);
    return h;
}

/* Every operand type, its name and what rounding to it adds to a float32 result. */
static const struct {
    int fmt;
    const char *name;
    double tol;
} out_fmts[] = {{DIT_OPERAND_F32, "f32", 0.0},
                {DIT_OPERAND_BF16, "bf16", TOL_BF16_OUT},
                {DIT_OPERAND_F16, "fp16", TOL_F16_OUT},
                {DIT_OPERAND_F16_SCALED, "fp16 scaled", TOL_F16_OUT}};
#define N_OUT_FMTS (sizeof out_fmts / sizeof out_fmts[0])

static const char *prec_name(enum mm3_matmul_precision p)
{
    return mm3_matmul_precision_name(p);
}

/* ---- kernels ------------------------------------------------------------------------ */

static void check_layernorm(int n, int dim)
{
    float *x = rnd_array((size_t)n * dim, 3.0f, 5.0f); /* a large mean: the two-pass variance matters */
    float *w = rnd_array(dim, 0.5f, 1.0f), *b = rnd_array(dim, 0.5f, 0.0f);
    float *ref = malloc(sizeof(float) * n * dim);
    op_layernorm(ref, x, w, b, n, dim, 1e-5f);
    float *dx = dev_upload(x, 4ul * n * dim), *dw = dev_upload(w, 4ul * dim), *db = dev_upload(b, 4ul * dim);
    for (size_t f = 0; f < N_OUT_FMTS; f++) {
        void *dy = dev_poisoned(4ul * n * dim);
        const struct dit_layernorm ln = {.x = dx, .w = dw, .b = db, .n = n, .dim = dim, .eps = 1e-5f};
        assert_int_equal(dit_cuda_layernorm(dy, out_fmts[f].fmt, &ln, NULL), 0);
        float *y = dev_download(dy, (size_t)n * dim, out_fmts[f].fmt);
        double rel = test_rel_error(y, ref, (size_t)n * dim);
        printf("layernorm %d x %d %s out: rel %.3g\n", n, dim, out_fmts[f].name, rel);
        assert_true(rel <= TOL_ROW + out_fmts[f].tol);
        free(y);
        cuda_free(dy);
    }
    cuda_free(dx), cuda_free(dw), cuda_free(db);
    free(x), free(w), free(b), free(ref);
}

static void test_layernorm(void **state)
{
    (void)state;
    check_layernorm(2 * 690, 2048); /* release: B = 2 sequences of 690 tokens */
    check_layernorm(5, 64);
    check_layernorm(3, 1000);
}

static void check_rope(int B, int T, int heads, int head_dim, int rot)
{
    int D = heads * head_dim, stride = 3 * D, rows = B * T;
    float *x = rnd_array((size_t)rows * stride, 1.0f, 0.0f);
    float *ref = malloc(sizeof(float) * rows * stride);
    memcpy(ref, x, sizeof(float) * rows * stride);
    float *inv = malloc(sizeof(float) * rot / 2);
    int *pos = malloc(sizeof(int) * rows);
    for (int r = 0; r < rows; r++)
        pos[r] = r % T;
    op_rope_inv_freq(inv, 10000.0, rot);
    op_rope(ref, rows, stride, heads, head_dim, rot, pos, inv);
    float *dx = dev_upload(x, 4ul * rows * stride), *dinv = dev_upload(inv, 4ul * rot / 2);
    float *dcs = dev_poisoned(4ul * T * rot);
    assert_int_equal(dit_cuda_rope_table(dcs, dinv, T, rot, NULL), 0);
    struct dit_heads h = {.n_seq = B, .T = T, .n_heads = heads, .head_dim = head_dim, .rotary_dim = rot};
    assert_int_equal(dit_cuda_rope(dx, stride, &h, dcs, NULL), 0);
    float *y = dev_download(dx, (size_t)rows * stride, 0);
    double rel = test_rel_error(y, ref, (size_t)rows * stride);
    printf("rope %d x %d, %d heads x %d, rotary %d: rel %.3g\n", B, T, heads, head_dim, rot, rel);
    assert_true(rel <= TOL_ROW);
    /* the columns past the heads (k, v here) are untouched */
    for (int r = 0; r < rows; r++)
        assert_memory_equal(y + (size_t)r * stride + D, x + (size_t)r * stride + D, 8ul * D);
    h.rotary_dim = head_dim + 2;
    assert_true(dit_cuda_rope(dx, stride, &h, dcs, NULL) == -EINVAL);
    free(y), free(x), free(ref), free(inv), free(pos);
    cuda_free(dx), cuda_free(dinv), cuda_free(dcs);
}

static void test_rope(void **state)
{
    (void)state;
    check_rope(2, 690, 32, 64, 32); /* release */
    check_rope(1, 37, 2, 32, 16);   /* tiny-a */
    check_rope(3, 5, 3, 128, 128);  /* full rotation */
}

/* Attention of B sequences of T tokens over qkv[B*T, 3D] with RoPE (rot > 0) against
 * op_rope + op_attention, in all three precisions and both output types. */
static void check_attention(int B, int T, int heads, int head_dim, int rot)
{
    int D = heads * head_dim, rows = B * T;
    float *qkv = rnd_array((size_t)rows * 3 * D, 1.5f, 0.0f);
    float *roped = malloc(sizeof(float) * rows * 3 * D), *ref = malloc(sizeof(float) * rows * D);
    memcpy(roped, qkv, sizeof(float) * rows * 3 * D);
    float *inv = malloc(sizeof(float) * (rot / 2 + 1));
    int *pos = malloc(sizeof(int) * rows);
    for (int r = 0; r < rows; r++)
        pos[r] = r % T;
    float *dcs = NULL, *dinv = NULL;
    if (rot) {
        op_rope_inv_freq(inv, 10000.0, rot);
        op_rope(roped, rows, 3 * D, heads, head_dim, rot, pos, inv);
        op_rope(roped + D, rows, 3 * D, heads, head_dim, rot, pos, inv);
        dinv = dev_upload(inv, 4ul * rot / 2);
        dcs = dev_poisoned(4ul * T * rot);
        assert_int_equal(dit_cuda_rope_table(dcs, dinv, T, rot, NULL), 0);
    }
    float scale = 1.0f / sqrtf((float)head_dim);
    for (int b = 0; b < B; b++) {
        const float *s = roped + (size_t)b * T * 3 * D;
        const struct attention_heads h = {heads, heads, head_dim, scale};
        op_attention(&(struct attention_rows){.out = ref + (size_t)b * T * D,
                                              .out_stride = D,
                                              .q = s,
                                              .q_stride = 3 * D,
                                              .k = s + D,
                                              .v = s + 2 * D,
                                              .kv_stride = 3 * D,
                                              .n_q = T,
                                              .n_kv = T},
                     &h);
    }
    float *dqkv = dev_upload(qkv, 4ul * rows * 3 * D);
    const struct dit_heads dh = {.n_seq = B, .T = T, .n_heads = heads, .head_dim = head_dim, .rotary_dim = rot};
    static const struct {
        enum mm3_matmul_precision prec;
        enum dit_attn_kernel kernel;
        const char *name;
        double tol;
    } variants[] = {{MM3_MATMUL_FP32, DIT_ATTN_SIMT, "SIMT", TOL_ATT_FP32},
                    {MM3_MATMUL_TF32, DIT_ATTN_WMMA, "WMMA", TOL_ATT_TF32},
                    {MM3_MATMUL_TF32, DIT_ATTN_FLASH, "FLASH", TOL_ATT_TF32},
                    {MM3_MATMUL_BF16, DIT_ATTN_WMMA, "WMMA", TOL_ATT_BF16},
                    {MM3_MATMUL_BF16, DIT_ATTN_MMA, "MMA", TOL_ATT_BF16},
                    {MM3_MATMUL_BF16, DIT_ATTN_FLASH, "FLASH", TOL_ATT_BF16},
                    {MM3_MATMUL_FP32, DIT_ATTN_AUTO, "AUTO", TOL_ATT_FP32},
                    {MM3_MATMUL_TF32, DIT_ATTN_AUTO, "AUTO", TOL_ATT_TF32},
                    {MM3_MATMUL_BF16, DIT_ATTN_AUTO, "AUTO", TOL_ATT_BF16},
                    {MM3_MATMUL_FP16, DIT_ATTN_WMMA, "WMMA", TOL_ATT_TF32},
                    {MM3_MATMUL_FP16, DIT_ATTN_FLASH, "FLASH", TOL_ATT_TF32},
                    {MM3_MATMUL_FP16, DIT_ATTN_AUTO, "AUTO", TOL_ATT_TF32}};
    for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++)
        for (size_t f = 0; f < N_OUT_FMTS; f++) {
            void *dout = dev_poisoned(4ul * rows * D);
            const struct dit_attention a = {.out = dout,
                                            .out_fmt = out_fmts[f].fmt,
                                            .qkv = dqkv,
                                            .heads = dh,
                                            .cs = dcs,
                                            .scale = scale,
                                            .prec = variants[k].prec};
            assert_int_equal(dit_cuda_attention_kernel(&a, variants[k].kernel, NULL), 0);
            float *o = dev_download(dout, (size_t)rows * D, out_fmts[f].fmt);
            double rel = test_rel_error(o, ref, (size_t)rows * D);
            printf("attention %d x %d, %d heads x %d, rotary %d, %s %s, %s out: rel %.3g\n", B, T, heads, head_dim, rot,
                   prec_name(variants[k].prec), variants[k].name, out_fmts[f].name, rel);
            assert_true(rel <= variants[k].tol + out_fmts[f].tol);
            free(o);
            cuda_free(dout);
        }
    /* MMA computes in bf16 only, the FLASH kernels in tf32, bf16 and fp16 */
    struct dit_attention bad = {
        .out = dqkv, .qkv = dqkv, .heads = dh, .cs = dcs, .scale = scale, .prec = MM3_MATMUL_TF32};
    assert_true(dit_cuda_attention_kernel(&bad, DIT_ATTN_MMA, NULL) == -EINVAL);
    bad.prec = MM3_MATMUL_FP32;
    assert_true(dit_cuda_attention_kernel(&bad, DIT_ATTN_FLASH, NULL) == -EINVAL);
    bad.heads.head_dim = 48, bad.heads.rotary_dim = 0, bad.cs = NULL;
    assert_true(dit_cuda_attention(&bad, NULL) == -EINVAL);
    cuda_free(dqkv), cuda_free(dcs), cuda_free(dinv);
    free(qkv), free(roped), free(ref), free(inv), free(pos);
}

static void test_attention(void **state)
{
    (void)state;
    check_attention(2, 690, 32, 64, 32); /* release: 689 latents + the time token */
    check_attention(1, 38, 2, 32, 16);   /* tiny-a */
    check_attention(3, 129, 2, 128, 0);  /* no RoPE, a partial last tile */
    check_attention(1, 1, 1, 64, 32);    /* a single token */
    check_attention(2, 70, 2, 32, 4);    /* rotary halves of 2: the element-wise load path (FLASH falls back) */
    check_attention(4, 37, 3, 64, 32);   /* odd T: one partial query and key tile, B 4 */
    check_attention(5, 131, 2, 64, 8);   /* rotary halves of 4; tiles of 128 queries + 3 */
    check_attention(2, 77, 2, 128, 64);  /* head_dim 128 with RoPE */
    check_attention(2, 45, 4, 16, 8);    /* small heads (golden geometries): the float32 kernel for every kernel asked */
    check_attention(1, 20, 2, 8, 4);
}

/* Bytes of one attention run (bf16 output) of kernel k on qkv; the kernels are
 * deterministic, so equal bytes mean the same kernel ran. */
static uint16_t *attention_bytes(const float *dqkv, int B, int T, int heads, int head_dim, int rot, const float *dcs,
                                 enum mm3_matmul_precision prec, enum dit_attn_kernel k)
{
    size_t n = (size_t)B * T * heads * head_dim;
    void *dout = dev_poisoned(2 * n);
    const struct dit_attention a = {
        .out = dout,
        .out_fmt = 1,
        .qkv = dqkv,
        .heads = {.n_seq = B, .T = T, .n_heads = heads, .head_dim = head_dim, .rotary_dim = rot},
        .cs = dcs,
        .scale = 1.0f / sqrtf((float)head_dim),
        .prec = prec};
    assert_int_equal(dit_cuda_attention_kernel(&a, k, NULL), 0);
    uint16_t *h = malloc(2 * n);
    assert_non_null(h);
    assert_int_equal(cuda_stream_sync(NULL), 0);
    assert_int_equal(cuda_memcpy_d2h(h, dout, 2 * n), 0);
    cuda_free(dout);
    return h;
}

/* dit_cuda_attention_default_set picks what AUTO (the forward's attention) runs. */
static void test_attention_default(void **state)
{
    (void)state;
    assert_true(dit_cuda_attention_default_set(MM3_MATMUL_FP32, DIT_ATTN_FLASH) == -EINVAL);
    assert_true(dit_cuda_attention_default_set(MM3_MATMUL_TF32, DIT_ATTN_MMA) == -EINVAL);
    assert_int_equal(dit_cuda_attention_default_set(MM3_MATMUL_TF32, DIT_ATTN_WMMA), 0);
    assert_int_equal(dit_cuda_attention_default_set(MM3_MATMUL_BF16, DIT_ATTN_MMA), 0);
    check_attention(1, 38, 2, 32, 16); /* AUTO rows now run the old kernels */

    int B = 2, T = 45, heads = 2, hd = 64, rot = 32;
    size_t n = (size_t)B * T * heads * hd;
    float *qkv = rnd_array(3 * n, 1.5f, 0.0f), *inv = malloc(sizeof(float) * rot / 2);
    assert_non_null(inv);
    op_rope_inv_freq(inv, 10000.0, rot);
    float *dqkv = dev_upload(qkv, 12 * n), *dinv = dev_upload(inv, 2ul * rot), *dcs = dev_poisoned(4ul * T * rot);
    assert_int_equal(dit_cuda_rope_table(dcs, dinv, T, rot, NULL), 0);
    static const struct {
        enum mm3_matmul_precision prec;
        enum dit_attn_kernel kernel;
    } cases[] = {{MM3_MATMUL_TF32, DIT_ATTN_WMMA},  {MM3_MATMUL_BF16, DIT_ATTN_MMA},
                 {MM3_MATMUL_TF32, DIT_ATTN_FLASH}, {MM3_MATMUL_BF16, DIT_ATTN_FLASH},
                 {MM3_MATMUL_FP16, DIT_ATTN_WMMA},  {MM3_MATMUL_FP16, DIT_ATTN_FLASH}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(dit_cuda_attention_default_set(cases[i].prec, cases[i].kernel), 0);
        uint16_t *a = attention_bytes(dqkv, B, T, heads, hd, rot, dcs, cases[i].prec, DIT_ATTN_AUTO);
        uint16_t *k = attention_bytes(dqkv, B, T, heads, hd, rot, dcs, cases[i].prec, cases[i].kernel);
        assert_memory_equal(a, k, 2 * n);
        free(a), free(k);
    }
    assert_int_equal(dit_cuda_attention_default_set(MM3_MATMUL_TF32, DIT_ATTN_AUTO), 0);
    assert_int_equal(dit_cuda_attention_default_set(MM3_MATMUL_BF16, DIT_ATTN_AUTO), 0);
    cuda_free(dqkv), cuda_free(dinv), cuda_free(dcs);
    free(qkv), free(inv);
}

static void check_gating(int n, int ff)
{
    float *g = rnd_array((size_t)n * 2 * ff, 4.0f, 0.0f);
    float *ref = malloc(sizeof(float) * n * ff);
    for (int r = 0; r < n; r++)
        op_silu_mul(ref + (size_t)r * ff, g + (size_t)r * 2 * ff + ff, g + (size_t)r * 2 * ff, (size_t)ff);
    float *dg = dev_upload(g, 8ul * n * ff);
    for (size_t f = 0; f < N_OUT_FMTS; f++) {
        void *d = dev_poisoned(4ul * n * ff);
        assert_int_equal(dit_cuda_silu_gate(d, out_fmts[f].fmt, dg, n, ff, NULL), 0);
        float *y = dev_download(d, (size_t)n * ff, out_fmts[f].fmt);
        double rel = test_rel_error(y, ref, (size_t)n * ff);
        printf("silu gate %d x %d %s: rel %.3g\n", n, ff, out_fmts[f].name, rel);
        assert_true(rel <= TOL_ROW + out_fmts[f].tol);
        free(y);
        cuda_free(d);
    }
    cuda_free(dg);
    free(g), free(ref);
}

static void test_gating(void **state)
{
    (void)state;
    check_gating(7, 300);   /* 16-byte path */
    check_gating(5, 301);   /* element path */
    check_gating(70, 8192); /* release FFN width */
}

/* ---- fp8 operands ------------------------------------------------------------------------- */

/* The CPU's per-row quantization (stage1/cuda/dit_fp8.h): scale s = amax / 448 (1 for a row
 * whose scale would be below FLT_MIN), q = e4m3(v * (1 / s)). */
static void cpu_quantize_rows(uint8_t *q, float *s, const float *x, int n, int dim, int ldx)
{
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * ldx;
        float amax = 0.0f;
        for (int i = 0; i < dim; i++)
            if (fabsf(xr[i]) > amax) amax = fabsf(xr[i]);
        float sc = amax / 448.0f;
        if (!(sc >= 1.17549435e-38f)) sc = 1.0f;
        float inv = 1.0f / sc;
        s[r] = sc;
        for (int i = 0; i < dim; i++)
            q[(size_t)r * dim + i] = mm3_f32_to_e4m3(xr[i] * inv);
    }
}

static void download_fp8(const void *dq, const void *ds, uint8_t *q, float *s, int n, int dim)
{
    assert_int_equal(cuda_stream_sync(NULL), 0);
    assert_int_equal(cuda_memcpy_d2h(q, dq, (size_t)n * dim), 0);
    assert_int_equal(cuda_memcpy_d2h(s, ds, 4ul * n), 0);
}

static float *dequantize(const uint8_t *q, const float *s, int n, int dim)
{
    float *y = malloc(sizeof(float) * ((size_t)n * dim + 1));
    assert_non_null(y);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < dim; i++)
            y[(size_t)r * dim + i] = mm3_e4m3_to_f32(q[(size_t)r * dim + i]) * s[r];
    return y;
}

/* dit_fp8_quantize_rows is bit-exact against the CPU: rows of magnitudes 1e-30 .. 1e30, an
 * all-zero row, a row with a subnormal amax, a row stride past the width. */
static void check_quantize(int n, int dim, int ldx)
{
    float *x = rnd_array((size_t)n * ldx, 1.0f, 0.0f);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < ldx; i++)
            x[(size_t)r * ldx + i] *= powf(10.0f, (float)(r % 61 - 30));
    if (n > 1) memset(x + ldx, 0, sizeof(float) * ldx);
    if (n > 2)
        for (int i = 0; i < ldx; i++)
            x[2ul * ldx + i] = i % 3 ? 1e-42f : 2e-41f;
    uint8_t *q = malloc((size_t)n * dim), *gq = malloc((size_t)n * dim);
    float *s = malloc(4ul * n), *gs = malloc(4ul * n);
    assert_true(q && gq && s && gs);
    cpu_quantize_rows(q, s, x, n, dim, ldx);
    float *dx = dev_upload(x, 4ul * n * ldx);
    void *dq = dev_poisoned((size_t)n * dim), *ds = dev_poisoned(4ul * n);
    assert_int_equal(dit_fp8_quantize_rows(dq, ds, dx, n, dim, ldx, NULL), 0);
    download_fp8(dq, ds, gq, gs, n, dim);
    for (int r = 0; r < n; r++)
        if (gs[r] != s[r]) fail_msg("row %d of %d x %d: scale %g, CPU %g", r, n, dim, gs[r], s[r]);
    for (size_t i = 0; i < (size_t)n * dim; i++)
        if (gq[i] != q[i]) fail_msg("element %zu of %d x %d: 0x%02x, CPU 0x%02x", i, n, dim, gq[i], q[i]);
    /* each row's largest magnitude is e4m3's largest finite value */
    for (int r = 0; r < n && dim > 0; r++) {
        int top = 0;
        for (int i = 0; i < dim; i++)
            if ((q[(size_t)r * dim + i] & 0x7f) == 0x7e) top = 1;
        if (r != 1 && r != 2 && !top) fail_msg("row %d: no element at 448", r);
    }
    printf("fp8 quantize %d x %d (stride %d): bit-exact\n", n, dim, ldx);
    assert_true(dit_fp8_quantize_rows(dq, ds, dx, n, dim, dim - 1, NULL) == -EINVAL);
    cuda_free(dx), cuda_free(dq), cuda_free(ds);
    free(x), free(q), free(gq), free(s), free(gs);
}

static void test_fp8_quantize(void **state)
{
    (void)state;
    check_quantize(70, 2048, 2048);
    check_quantize(5, 301, 320);
    check_quantize(3, 1, 1);
}

/* The fused producers against the float32 kernels' CPU references: the row scales within
 * float32 rounding of amax / 448 and the dequantized rows within e4m3's rounding. */
static void check_fp8_rows(const char *what, const float *ref, const void *dq, const void *ds, int n, int dim)
{
    uint8_t *q = malloc((size_t)n * dim);
    float *s = malloc(4ul * n);
    assert_true(q && s);
    download_fp8(dq, ds, q, s, n, dim);
    for (int r = 0; r < n; r++) {
        float amax = 0.0f;
        for (int i = 0; i < dim; i++)
            if (fabsf(ref[(size_t)r * dim + i]) > amax) amax = fabsf(ref[(size_t)r * dim + i]);
        if (!(fabs(s[r] - amax / 448.0) <= 1e-5 * amax / 448.0))
            fail_msg("%s row %d: scale %g, expected %g", what, r, s[r], amax / 448.0);
    }
    float *y = dequantize(q, s, n, dim);
    double rel = test_rel_error(y, ref, (size_t)n * dim);
    printf("%s %d x %d fp8 out: rel %.3g\n", what, n, dim, rel);
    assert_true(rel <= TOL_ROW + TOL_E4M3_OUT);
    assert_true(rel > 1e-3); /* it did round to e4m3 */
    free(q), free(s), free(y);
}

static void test_fp8_producers(void **state)
{
    (void)state;
    static const int shapes[][2] = {{2 * 690, 2048}, {5, 64}, {3, 1000}};
    for (size_t k = 0; k < 3; k++) {
        int n = shapes[k][0], dim = shapes[k][1];
        float *x = rnd_array((size_t)n * dim, 3.0f, 5.0f);
        float *w = rnd_array(dim, 0.5f, 1.0f), *b = rnd_array(dim, 0.5f, 0.0f);
        float *ref = malloc(sizeof(float) * n * dim);
        op_layernorm(ref, x, w, b, n, dim, 1e-5f);
        float *dx = dev_upload(x, 4ul * n * dim), *dw = dev_upload(w, 4ul * dim), *db = dev_upload(b, 4ul * dim);
        void *dq = dev_poisoned((size_t)n * dim), *ds = dev_poisoned(4ul * n);
        const struct dit_layernorm ln = {.x = dx, .w = dw, .b = db, .n = n, .dim = dim, .eps = 1e-5f};
        assert_int_equal(dit_fp8_layernorm(dq, ds, &ln, NULL), 0);
        check_fp8_rows("layernorm", ref, dq, ds, n, dim);
        cuda_free(dx), cuda_free(dw), cuda_free(db), cuda_free(dq), cuda_free(ds);
        free(x), free(w), free(b), free(ref);
    }
    static const int gates[][2] = {{7, 300}, {5, 301}, {70, 8192}};
    for (size_t k = 0; k < 3; k++) {
        int n = gates[k][0], ff = gates[k][1];
        float *g = rnd_array((size_t)n * 2 * ff, 4.0f, 0.0f), *bias = rnd_array(2ul * ff, 1.0f, 0.0f);
        float *u = malloc(sizeof(float) * n * 2 * ff), *ref = malloc(sizeof(float) * n * ff);
        assert_true(u && ref);
        float *dg = dev_upload(g, 8ul * n * ff), *dbias = dev_upload(bias, 8ul * ff);
        void *dq = dev_poisoned((size_t)n * ff), *ds = dev_poisoned(4ul * n);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            for (size_t i = 0; i < (size_t)n * 2 * ff; i++)
                u[i] = g[i] + (with_bias ? bias[i % (2 * ff)] : 0.0f);
            for (int r = 0; r < n; r++)
                op_silu_mul(ref + (size_t)r * ff, u + (size_t)r * 2 * ff + ff, u + (size_t)r * 2 * ff, (size_t)ff);
            assert_int_equal(dit_fp8_silu_gate(dq, ds, dg, with_bias ? dbias : NULL, n, ff, NULL), 0);
            check_fp8_rows(with_bias ? "silu gate + bias" : "silu gate", ref, dq, ds, n, ff);
        }
        cuda_free(dg), cuda_free(dbias), cuda_free(dq), cuda_free(ds);
        free(g), free(bias), free(u), free(ref);
    }
}

/* dit_gemm_run_fp8 against the CPU product (in double) of the same e4m3 operands and scales,
 * with bias and C, C == D. The products of e4m3 values are exact; Hopper's fp8 tensor cores
 * keep only ~14 bits of the partial sums within the span cuBLASLt promotes to float32 after,
 * so the sums differ by ~2^-14 (6e-5) relative: bound 5e-4, where a misapplied scale gives ~1. */
#define TOL_GEMM_FP8 5e-4
static void check_gemm_fp8(int M, int K, int N, int with_bias, int with_c)
{
    float *a = rnd_array((size_t)M * K, 2.0f, 0.0f), *w = rnd_array((size_t)N * K, 0.05f, 0.0f);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            a[(size_t)m * K + k] *= (float)(1 + m % 5); /* rows of different ranges */
    float *bias = rnd_array(N, 0.1f, 0.0f), *c = rnd_array((size_t)M * N, 1.0f, 0.0f);
    uint8_t *qa = malloc((size_t)M * K), *qw = malloc((size_t)N * K);
    float *sa = malloc(4ul * M), *sw = malloc(4ul * N), *ref = malloc(sizeof(float) * M * N);
    assert_true(qa && qw && sa && sw && ref);
    cpu_quantize_rows(qa, sa, a, M, K, K);
    cpu_quantize_rows(qw, sw, w, N, K, K);
    float *da = dequantize(qa, sa, M, K), *dw = dequantize(qw, sw, N, K);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0.0;
            for (int k = 0; k < K; k++)
                acc += (double)da[(size_t)m * K + k] * dw[(size_t)n * K + k];
            ref[(size_t)m * N + n] =
                (float)(acc + (with_bias ? bias[n] : 0.0f) + (with_c ? c[(size_t)m * N + n] : 0.0f));
        }
    void *dqa = dev_upload(qa, (size_t)M * K), *dqw = dev_upload(qw, (size_t)N * K);
    float *dsa = dev_upload(sa, 4ul * M), *dsw = dev_upload(sw, 4ul * N), *dbias = dev_upload(bias, 4ul * N);
    float *dd = with_c ? dev_upload(c, 4ul * M * N) : dev_poisoned(4ul * M * N);
    struct dit_gemm *g = NULL;
    for (int epilogue = 0; epilogue < 2; epilogue++) { /* cuBLASLt's row scales, then the fallback's */
        if (with_c) assert_int_equal(cuda_memcpy_h2d(dd, c, 4ul * M * N), 0);
        dit_gemm_destroy(g);
        assert_int_equal(dit_gemm_create(&g, MM3_MATMUL_FP8), 0);
        dit_gemm_set_fp8_epilogue(g, epilogue);
        if (dit_gemm_run_fp8(g,
                             &(struct dit_gemm_product){.d = dd,
                                                        .a = dqa,
                                                        .sa = dsa,
                                                        .w = dqw,
                                                        .sw = dsw,
                                                        .bias = with_bias ? dbias : NULL,
                                                        .c = with_c ? dd : NULL,
                                                        .M = M,
                                                        .K = K,
                                                        .N = N,
                                                        .lda = K,
                                                        .ldd = N},
                             NULL) < 0)
            fail_msg("dit_gemm_run_fp8: %s", mm3_last_error());
        float *d = dev_download(dd, (size_t)M * N, 0);
        double rel = test_rel_error(d, ref, (size_t)M * N);
        printf("fp8 GEMM M %d K %d N %d%s%s, %s: rel %.3g\n", M, K, N, with_bias ? " + bias" : "",
               with_c ? " + C (in place)" : "", epilogue ? "scaling epilogue" : "cuBLASLt's scales", rel);
        assert_true(rel <= TOL_GEMM_FP8);
        free(d);
    }
    assert_false(dit_gemm_fp8_fits(K + 8, N, K + 8, N));
    assert_true(
        dit_gemm_run_fp8(
            g,
            &(struct dit_gemm_product){
                .d = dd, .a = dqa, .sa = dsa, .w = dqw, .sw = dsw, .M = M, .K = K - 8, .N = N, .lda = K, .ldd = N},
            NULL) == -EINVAL);
    dit_gemm_destroy(g);
    /* a non-fp8 handle refuses */
    assert_int_equal(dit_gemm_create(&g, MM3_MATMUL_FP16), 0);
    assert_true(dit_gemm_run_fp8(
                    g,
                    &(struct dit_gemm_product){
                        .d = dd, .a = dqa, .sa = dsa, .w = dqw, .sw = dsw, .M = M, .K = K, .N = N, .lda = K, .ldd = N},
                    NULL) == -EINVAL);
    dit_gemm_destroy(g);
    cuda_free(dqa), cuda_free(dqw), cuda_free(dsa), cuda_free(dsw), cuda_free(dbias), cuda_free(dd);
    free(a), free(w), free(bias), free(c), free(qa), free(qw), free(sa), free(sw), free(ref), free(da), free(dw);
}

static void test_gemm_fp8(void **state)
{
    (void)state;
    check_gemm_fp8(37, 64, 48, 0, 0);
    check_gemm_fp8(37, 64, 48, 1, 1);
    check_gemm_fp8(300, 2048, 512, 1, 0);
    check_gemm_fp8(129, 512, 2048, 0, 1);
}

/* ---- whole forward ---------------------------------------------------------------------- */

struct ref_job {
    const struct dit_model *m;
    int L;
    const float *x, *cond;
    float t, *v;
};

static void *ref_thread(void *arg)
{
    struct ref_job *j = arg;
    struct dit_workspace *ws;
    if (dit_workspace_alloc(&ws, j->m, j->L) < 0) return arg;
    const float *conds[1] = {j->cond};
    int rc = dit_forward(j->m, ws, 1, j->L, j->x, &j->t, conds, j->v);
    dit_workspace_free(ws);
    return rc < 0 ? arg : NULL;
}

/* CPU reference of B sequences, one thread each (the release-width case is ~100 GFLOP). */
static void reference(const struct dit_model *m, int B, int L, const float *x, const float *t, const float *const *cond,
                      float *v)
{
    size_t per = (size_t)m->cfg.in_ch * L;
    pthread_t th[16];
    struct ref_job jobs[16];
    assert_true(B <= 16);
    for (int b = 0; b < B; b++) {
        jobs[b] = (struct ref_job){m, L, x + b * per, cond ? cond[b] : NULL, t[b], v + b * per};
        assert_int_equal(pthread_create(&th[b], NULL, ref_thread, &jobs[b]), 0);
    }
    for (int b = 0; b < B; b++) {
        void *r;
        pthread_join(th[b], &r);
        assert_null(r);
    }
}

/* CUDA forward in every precision, and fp16 rescued, against ref (or, for golden data,
 * the recorded output). */
static void check_forward(const struct dit_model *m, const char *what, int B, int L, const float *x, const float *t,
                          const float *const *cond, const float *ref, const double tol[MM3_MATMUL_COUNT])
{
    size_t per = (size_t)m->cfg.in_ch * L, n = B * per;
    float *dx = dev_upload(x, 4 * n), *dt = dev_upload(t, 4ul * B);
    const float *dcond[16] = {0};
    for (int b = 0; b < B; b++)
        if (cond && cond[b]) dcond[b] = dev_upload(cond[b], 4ul * L * m->cfg.cond_dim);
    for (int run = 0; run <= MM3_MATMUL_COUNT; run++) {
        int rescue = run == MM3_MATMUL_COUNT; /* the last run: fp16 rescued */
        enum mm3_matmul_precision p = rescue ? MM3_MATMUL_FP16 : (enum mm3_matmul_precision)run;
        struct dit_cuda *h;
        if (dit_cuda_load(&h, m, p) < 0) fail_msg("dit_cuda_load: %s", mm3_last_error());
        assert_int_equal(dit_cuda_set_rescue(h, rescue), 0);
        float *dv = dev_poisoned(4 * n);
        if (dit_cuda_forward(h, B, L, dx, dt, cond ? dcond : NULL, dv, NULL) < 0)
            fail_msg("dit_cuda_forward: %s", mm3_last_error());
        float *v = dev_download(dv, n, 0);
        double rel = test_rel_error(v, ref, n);
        printf("forward %s, B %d, L %d, %s%s: rel %.3g (bound %.1g)\n", what, B, L, prec_name(p),
               rescue ? " rescued" : "", rel, tol[p]);
        assert_true(rel <= tol[p]);
        free(v);
        cuda_free(dv);
        dit_cuda_free(h);
    }
    for (int b = 0; b < B; b++)
        cuda_free((void *)dcond[b]);
    cuda_free(dx), cuda_free(dt);
}

static const double fwd_tol[MM3_MATMUL_COUNT] = {TOL_FWD_FP32, TOL_FWD_TF32, TOL_FWD_BF16, TOL_FWD_FP16, TOL_FWD_FP8};

/* tiny-a: the two recorded DiT calls of case 0 (reference outputs of the real
 * pipeline), and the CPU forward of a batch of two with one zero condition. */
static void test_forward_tiny_a(void **state)
{
    (void)state;
    const char *gd = test_golden_dir();
    if (!gd) skip();
    char path[1200];
    snprintf(path, sizeof path, "%s/checkpoint", gd);
    struct dit_model *m;
    if (dit_load(&m, path) < 0) fail_msg("dit_load: %s", mm3_last_error());
    snprintf(path, sizeof path, "%s/case0.safetensors", gd);
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    for (int call = 0; call < 2; call++) {
        char key[64];
        float *hs, *ts, *ehs, *out;
        int nd;
        int64_t sh[ST_MAX_DIMS];
        snprintf(key, sizeof key, "dit_call.%d.timestep", call);
        assert_int_equal(st_file_load_f32(&f, key, &ts, &nd, sh), 0);
        snprintf(key, sizeof key, "dit_call.%d.encoder_hidden_states", call);
        assert_int_equal(st_file_load_f32(&f, key, &ehs, &nd, sh), 0);
        snprintf(key, sizeof key, "dit_call.%d.out", call);
        assert_int_equal(st_file_load_f32(&f, key, &out, &nd, sh), 0);
        snprintf(key, sizeof key, "dit_call.%d.hidden_states", call);
        assert_int_equal(st_file_load_f32(&f, key, &hs, &nd, sh), 0);
        int L = (int)sh[2];
        const float *conds[1] = {ehs};
        check_forward(m, call ? "tiny-a dit_call.1" : "tiny-a dit_call.0", 1, L, hs, ts, conds, out, fwd_tol);

        /* batch of two: the recorded sequence and a shifted copy with no condition */
        size_t per = (size_t)m->cfg.in_ch * L;
        float *x2 = malloc(sizeof(float) * 2 * per), *v2 = malloc(sizeof(float) * 2 * per);
        memcpy(x2, hs, sizeof(float) * per);
        for (size_t i = 0; i < per; i++)
            x2[per + i] = -0.5f * hs[(i + 7) % per];
        float t2[2] = {ts[0], 0.9f};
        const float *c2[2] = {ehs, NULL};
        reference(m, 2, L, x2, t2, c2, v2);
        check_forward(m, "tiny-a batch of 2", 2, L, x2, t2, c2, v2, fwd_tol);
        free(x2), free(v2), free(hs), free(ts), free(ehs), free(out);
    }
    st_file_close(&f);
    dit_free(m);
}

/* A CPU model with the given geometry and random weights (no files). */
static struct dit_model *random_model(const struct dit_config *cfg)
{
    struct dit_model *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->cfg = *cfg;
    struct dit_config *g = &m->cfg;
    g->hidden = g->n_heads * g->head_dim;
    g->cat_dim = 2 * g->in_ch + g->cond_dim;
    size_t D = g->hidden, F = g->ff_inner, Cc = g->cat_dim, C = g->in_ch, Fd = g->fourier_dim;
    size_t per_layer = 4 * D + 4 * D * D + 2 * F * D + 2 * F + D * F + D;
    size_t total = Fd / 2 + D * Fd + D + D * D + D + Cc * Cc + D * Cc + C * D + C * C + g->n_layers * per_layer;
    m->arena = malloc(sizeof(float) * total);
    m->w.layers = calloc((size_t)g->n_layers, sizeof *m->w.layers);
    m->inv_freq = malloc(sizeof(float) * (g->rotary_dim / 2 + 1));
    assert_true(m->arena && m->w.layers && m->inv_freq);
    m->arena_floats = total;
    float *p = m->arena;
#define TAKE(dst, n, a, off)                                                                                           \
    do {                                                                                                               \
        dst = p;                                                                                                       \
        for (size_t i_ = 0; i_ < (size_t)(n); i_++)                                                                    \
            p[i_] = (off) + test_rand_uniform(&rng, a);                                                                \
        p += (n);                                                                                                      \
    } while (0)
    struct dit_weights *w = &m->w;
    TAKE(w->time_proj, Fd / 2, 1.0f, 0.0f);
    TAKE(w->t1_w, D * Fd, 1.0f / sqrtf((float)Fd), 0.0f);
    TAKE(w->t1_b, D, 0.02f, 0.0f);
    TAKE(w->t2_w, D * D, 1.0f / sqrtf((float)D), 0.0f);
    TAKE(w->t2_b, D, 0.02f, 0.0f);
    TAKE(w->pre_w, Cc * Cc, 1.0f / sqrtf((float)Cc), 0.0f);
    TAKE(w->proj_in, D * Cc, 1.0f / sqrtf((float)Cc), 0.0f);
    TAKE(w->proj_out, C * D, 1.0f / sqrtf((float)D), 0.0f);
    TAKE(w->post_w, C * C, 1.0f / sqrtf((float)C), 0.0f);
    for (int i = 0; i < g->n_layers; i++) {
        struct dit_layer *l = &w->layers[i];
        TAKE(l->norm1_w, D, 0.1f, 1.0f);
        TAKE(l->norm1_b, D, 0.1f, 0.0f);
        TAKE(l->wq, D * D, 1.0f / sqrtf((float)D), 0.0f);
        TAKE(l->wk, D * D, 1.0f / sqrtf((float)D), 0.0f);
        TAKE(l->wv, D * D, 1.0f / sqrtf((float)D), 0.0f);
        TAKE(l->wo, D * D, 1.0f / sqrtf((float)D), 0.0f);
        TAKE(l->norm2_w, D, 0.1f, 1.0f);
        TAKE(l->norm2_b, D, 0.1f, 0.0f);
        TAKE(l->ff_in_w, 2 * F * D, 1.0f / sqrtf((float)D), 0.0f);
        TAKE(l->ff_in_b, 2 * F, 0.02f, 0.0f);
        TAKE(l->ff_out_w, D * F, 1.0f / sqrtf((float)F), 0.0f);
        TAKE(l->ff_out_b, D, 0.02f, 0.0f);
    }
#undef TAKE
    assert_true(p == m->arena + total);
    op_rope_inv_freq(m->inv_freq, 10000.0, g->rotary_dim);
    return m;
}

/* The release's block shapes (2048 wide, 32 x 64 heads, rotary 32, FFN 8192 gated,
 * condition 2048, Fourier 256, 128 latent channels) with one block, L = 689, B = 2
 * (one sequence without condition). */
static void test_forward_release_block(void **state)
{
    (void)state;
    if (getenv("MM3_TEST_DIT_QUICK")) skip(); /* e.g. under compute-sanitizer: the CPU side takes a minute */
    struct dit_config cfg = test_stage1_release_dit(1);
    const char *env = getenv("MM3_TEST_DIT_LAYERS");
    if (env) cfg.n_layers = atoi(env) > 0 ? atoi(env) : 1;
    struct dit_model *m = random_model(&cfg);
    int B = 2, L = 689;
    size_t per = (size_t)cfg.in_ch * L;
    float *x = rnd_array(B * per, 1.7f, 0.0f), *cond = rnd_array((size_t)L * cfg.cond_dim, 1.0f, 0.0f);
    float *ref = malloc(sizeof(float) * B * per);
    float t[2] = {0.3f, 0.0333333611f};
    const float *conds[2] = {cond, NULL};
    time_t t0 = time(NULL);
    reference(m, B, L, x, t, conds, ref);
    printf("CPU reference: %lds\n", (long)(time(NULL) - t0));
    check_forward(m, "release block", B, L, x, t, conds, ref, fwd_tol);
    free(x), free(cond), free(ref);
    dit_free(m);
}

/* ff_inner 24: ff_out's K is no multiple of 16, so an fp8 DiT runs it in fp16 (and ff_in with
 * its own bias) while qkv, out and ff_in stay e4m3; every precision against the CPU. */
static void test_forward_fp8_mixed(void **state)
{
    (void)state;
    struct dit_config cfg = {.in_ch = 16,
                             .cond_dim = 32,
                             .n_layers = 2,
                             .n_heads = 2,
                             .head_dim = 32,
                             .ff_inner = 24,
                             .rotary_dim = 16,
                             .fourier_dim = 16};
    struct dit_model *m = random_model(&cfg);
    int B = 2, L = 21;
    size_t per = (size_t)cfg.in_ch * L;
    float *x = rnd_array(B * per, 1.7f, 0.0f), *cond = rnd_array((size_t)L * cfg.cond_dim, 1.0f, 0.0f);
    float *ref = malloc(sizeof(float) * B * per);
    assert_non_null(ref);
    float t[2] = {0.7f, 0.2f};
    const float *conds[2] = {cond, NULL};
    reference(m, B, L, x, t, conds, ref);
    check_forward(m, "ff_inner 24", B, L, x, t, conds, ref, fwd_tol);
    free(x), free(cond), free(ref);
    dit_free(m);
}

static void test_bad_args(void **state)
{
    (void)state;
    struct dit_config cfg = {.in_ch = 4,
                             .cond_dim = 8,
                             .n_layers = 1,
                             .n_heads = 2,
                             .head_dim = 48,
                             .ff_inner = 16,
                             .rotary_dim = 8,
                             .fourier_dim = 8};
    struct dit_cuda *h = NULL;
    assert_true(dit_cuda_load_random(&h, &cfg, MM3_MATMUL_FP32, 1) == -EINVAL); /* head_dim 48 */
    assert_null(h);
    assert_non_null(strstr(mm3_last_error(), "attention_head_dim 48"));
    cfg.head_dim = 32;
    assert_int_equal(dit_cuda_load_random(&h, &cfg, MM3_MATMUL_BF16, 1), 0);
    assert_true(dit_cuda_set_rescue(h, 1) == -EINVAL); /* only fp16 has operands to rescale */
    assert_int_equal(dit_cuda_set_rescue(h, 0), 0);
    assert_true(dit_cuda_forward(h, 0, 5, (float *)8, (float *)8, NULL, (float *)8, NULL) == -EINVAL);
    assert_true(dit_cuda_forward(h, 1, 5, NULL, (float *)8, NULL, (float *)8, NULL) == -EINVAL);
    /* random weights run and give finite velocities */
    int L = 9;
    float *x = rnd_array((size_t)cfg.in_ch * L, 1.0f, 0.0f), t = 0.5f;
    float *dx = dev_upload(x, 4ul * cfg.in_ch * L), *dt = dev_upload(&t, 4), *dv = dev_poisoned(4ul * cfg.in_ch * L);
    assert_int_equal(dit_cuda_forward(h, 1, L, dx, dt, NULL, dv, NULL), 0);
    float *v = dev_download(dv, (size_t)cfg.in_ch * L, 0);
    free(v);
    dit_cuda_free(h);
    /* fp8, hidden 64 and ff 16: every block matrix fits e4m3; the fp16 rescue applies too */
    assert_int_equal(dit_cuda_load_random(&h, &cfg, MM3_MATMUL_FP8, 1), 0);
    assert_int_equal(dit_cuda_set_rescue(h, 1), 0);
    assert_int_equal(dit_cuda_set_rescue(h, 0), 0);
    assert_int_equal(dit_cuda_forward(h, 1, L, dx, dt, NULL, dv, NULL), 0);
    v = dev_download(dv, (size_t)cfg.in_ch * L, 0);
    free(v), free(x);
    cuda_free(dx), cuda_free(dt), cuda_free(dv);
    dit_cuda_free(h);
}

int main(void)
{
    if (cuda_device_count_safe() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *seed_env = getenv("MM3_TEST_SEED");
    rng = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("seed %llu (MM3_TEST_SEED to replay)\n", (unsigned long long)rng);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layernorm),      cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention),      cmocka_unit_test(test_attention_default),
        cmocka_unit_test(test_gating),         cmocka_unit_test(test_fp8_quantize),
        cmocka_unit_test(test_fp8_producers),  cmocka_unit_test(test_gemm_fp8),
        cmocka_unit_test(test_bad_args),       cmocka_unit_test(test_forward_fp8_mixed),
        cmocka_unit_test(test_forward_tiny_a), cmocka_unit_test(test_forward_release_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
    printf("built without CUDA (MM3_HAVE_CUDA undefined): skipped\n");
    return 77;
}

#endif
