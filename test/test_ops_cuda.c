/* CUDA decode kernels (common/cuda/ops_cuda.h) against the float32 reference ops
 * (common/ops.h) on fresh random inputs, release shapes and odd ones.
 *
 * Every output buffer is poisoned (all bits set: a NaN) with guard bands of
 * GUARD floats on both sides: the test checks that every element was written,
 * nothing is NaN or infinite, and no guard word changed. The seed comes from the
 * clock (MM3_TEST_SEED overrides it) and is printed, so a failure can be replayed.
 * Exit 77 (skip) without CUDA compiled in or without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/ops.h"
#include "support/test_rand.h"
#include "support/test_support.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"

enum { GUARD = 64 };
static const uint32_t POISON = 0xffffffffu;

/* Relative L2 bounds (see each use for why). */
#define TOL_F32_SUM 2e-5   /* float32 dot products, other summation order: ~1e-6 seen typical */
/* The tensor-core GEMVs split x into bf16 hi + lo (16 significant bits, x - hi - lo
 * below 2^-16 |x|): after the norm and SwiGLU up to 2.01e-5 seen (n = 9-17, 24576 outputs). */
#define TOL_SPLIT_SUM 4e-5
#define TOL_F32_ROW 4e-6   /* row-wise norms: one rsqrt of a reordered sum of squares */
#define TOL_F32_TRIG 8e-6  /* norm + sincosf on device vs glibc (1-2 ulp) */
#define TOL_F32_EXP 4e-6   /* expf on device (<= 2 ulp) vs glibc */

static uint64_t rng;

/* Uniform in [-a, a), never exactly zero. */
static float rnd(float a)
{
    float u = (float)((test_rand_next(&rng) >> 40) + 1) / (float)(1 << 24); /* (0, 1] */
    return a * (2.0f * u - 1.0f) + (u == 0.5f ? 1e-3f : 0.0f);
}

static float *rnd_array(size_t n, float a)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = rnd(a);
    return p;
}

/* Random bf16 values: bits for the device, widened floats for the reference. */
static uint16_t *rnd_bf16(size_t n, float a, float **widened)
{
    uint16_t *b = malloc(2 * (n ? n : 1));
    float *f = malloc(sizeof(float) * (n ? n : 1));
    assert_true(b && f);
    for (size_t i = 0; i < n; i++) {
        b[i] = mm3_f32_to_bf16(rnd(a));
        f[i] = mm3_bf16_to_f32(b[i]);
    }
    *widened = f;
    return b;
}

static void *dev_upload(const void *host, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cuda_malloc(&d, bytes ? bytes : 4), 0);
    if (bytes) assert_int_equal(cuda_memcpy_h2d(d, host, bytes), 0);
    return d;
}

/* A poisoned device buffer of n floats plus guard bands; returns the base and
 * sets *inner to the first float of the payload. */
static float *dev_guarded(size_t n, float **inner)
{
    float *d = NULL;
    size_t bytes = sizeof(float) * (n + 2 * GUARD);
    assert_int_equal(cuda_malloc((void **)&d, bytes), 0);
    assert_int_equal(cuda_memset(d, 0xff, bytes), 0);
    *inner = d + GUARD;
    return d;
}

/* Sync, copy back payload, check guards untouched and every payload value
 * finite (so written: the poison is a NaN). Returns the payload (malloc'd). */
static float *dev_fetch_checked(const float *base, size_t n, const char *what)
{
    assert_int_equal(cuda_stream_sync(NULL), 0);
    size_t total = n + 2 * GUARD;
    float *h = malloc(sizeof(float) * total);
    assert_non_null(h);
    assert_int_equal(cuda_memcpy_d2h(h, base, sizeof(float) * total), 0);
    for (size_t i = 0; i < total; i++) {
        uint32_t u;
        memcpy(&u, &h[i], 4);
        int guard = i < GUARD || i >= GUARD + n;
        if (guard && u != POISON) fail_msg("%s: guard word %zu overwritten", what, i);
        if (!guard && !isfinite(h[i])) fail_msg("%s: element %zu not finite (unwritten?)", what, i - GUARD);
    }
    float *out = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(out);
    memcpy(out, h + GUARD, sizeof(float) * n);
    free(h);
    return out;
}

static void expect_close(const float *got, const float *ref, size_t n, double tol, const char *what)
{
    double e = test_rel_error(got, ref, n);
    printf("  %-58s rel L2 %.2e (limit %.0e)\n", what, e, tol);
    if (!(e <= tol)) fail_msg("%s: relative L2 error %.3e > %.1e", what, e, tol);
}

/* ---- how the products see x ------------------------------------------------------ */

/* The tensor-core GEMVs round x to bf16 above 8 rows (cuda_ops_gemv_set_x_round) and
 * split it into hi + lo (float32 accuracy) below; the references round the same x, so
 * every product keeps a float32 summation-order tolerance and a product that rounds
 * where it should not (or the reverse) fails it (bf16 rounding moves a product by
 * ~1e-3). Tests change the settings through these setters only. */
static int x_round_mode;  /* what cuda_ops_gemv_set_x_round was last given */
static int gemv_mma_rows = 2; /* the float32 kernel's row limit (cuda_ops_gemv_set_mma_rows) */
enum { GEMV_WIDE_OUT_DEFAULT = 6 * 4096 };
static int gemv_wide_out = GEMV_WIDE_OUT_DEFAULT; /* cuda_ops_gemv_set_mma_wide's n x 4096 (0: never) */

static void set_x_round(int mode)
{
    assert_int_equal(cuda_ops_gemv_set_x_round(mode), 0);
    x_round_mode = mode;
}

static void set_mma_rows(int rows)
{
    assert_int_equal(cuda_ops_gemv_set_mma_rows(rows), 0);
    gemv_mma_rows = rows ? rows : 2;
}

/* n: cuda_ops_gemv_set_mma_wide's value; -1: the default. */
static void set_gemv_wide(int n)
{
    assert_int_equal(cuda_ops_gemv_set_mma_wide(n), 0);
    gemv_wide_out = n >= 0 ? n * 4096 : GEMV_WIDE_OUT_DEFAULT;
}

/* Whether a tensor-core GEMV at n rows rounds x. */
static int tc_rounds(int n)
{
    return x_round_mode == 1 || (x_round_mode == 0 && n > 8);
}

/* Whether the public products (matmul, fused GEMV) of n rows x in -> out run on the
 * tensor cores: above the float32 kernel's rows, or at any GEMV row count when wide;
 * in % 32 == 0 and x 16-byte aligned. */
static int tc_serves(int n, int in, int out, int x_aligned)
{
    const int wide = gemv_wide_out && out >= gemv_wide_out;
    return (n > gemv_mma_rows || wide) && n <= cuda_ops_gemv_max_rows(in) && in % 32 == 0 && x_aligned;
}

static float as_bf16(float v)
{
    return mm3_bf16_to_f32(mm3_f32_to_bf16(v));
}

/* ---- matmul ------------------------------------------------------------------ */

/* opw 0: the public entry point; 2, 4, 8: the float32 GEMV kernel with that many
 * outputs per warp; 1 / -2 / -4: the tensor-core GEMV kernel, default / 2 / 4 weight tiles. */
static void check_matmul_opw(int n, int in, int out, int x_offset, int opw)
{
    char what[128];
    snprintf(what, sizeof what, "matmul_bf16 n=%d in=%d out=%d%s%s", n, in, out, x_offset ? " (x misaligned)" : "",
             opw == 1 ? " mma" : opw == -2 ? " mma mt=2" : opw == -4 ? " mma mt=4" : opw == 2 ? " opw=2" : opw == 4 ? " opw=4" : opw == 8 ? " opw=8" : "");
    float *wf;
    uint16_t *wb = rnd_bf16((size_t)out * in, 0.05f, &wf);
    float *x = rnd_array((size_t)n * in + (size_t)x_offset, 1.0f);
    float *xs = x + x_offset;
    /* Beyond the GEMV rows cuBLASLt takes bf16 x, and so do the tensor-core GEMVs where
     * they round: the reference sees the same rounding. */
    float *xr = malloc(sizeof(float) * (size_t)n * in);
    assert_non_null(xr);
    const int lt = n > (x_offset % 4 ? CUDA_OPS_GEMV_MAX_ROWS : cuda_ops_gemv_max_rows(in));
    const int tc = opw == 1 || opw < 0 || (opw == 0 && tc_serves(n, in, out, x_offset % 4 == 0));
    const int round = lt || (tc && tc_rounds(n));
    for (size_t i = 0; i < (size_t)n * in; i++)
        xr[i] = round ? as_bf16(xs[i]) : xs[i];
    float *ref = malloc(sizeof(float) * (size_t)n * out);
    assert_non_null(ref);
    op_matmul(ref, xr, wf, NULL, n, in, out);

    uint16_t *dw = dev_upload(wb, 2 * (size_t)out * in);
    float *dx = dev_upload(x, sizeof(float) * ((size_t)n * in + x_offset));
    float *dy_inner, *dy = dev_guarded((size_t)n * out, &dy_inner);
    int rc = opw == 1    ? cuda_ops_gemv_bf16_mma(dy_inner, dx + x_offset, dw, n, in, out, 0, NULL)
             : opw < 0 ? cuda_ops_gemv_bf16_mma(dy_inner, dx + x_offset, dw, n, in, out, -opw, NULL)
             : opw     ? cuda_ops_gemv_bf16_opw(dy_inner, dx + x_offset, dw, n, in, out, opw, NULL)
                 : cuda_ops_matmul_bf16(dy_inner, dx + x_offset, dw, n, in, out, NULL);
    if (rc) fail_msg("%s: %s", what, mm3_last_error());
    float *got = dev_fetch_checked(dy, (size_t)n * out, what);
    expect_close(got, ref, (size_t)n * out, TOL_F32_SUM, what);

    cuda_free(dw);
    cuda_free(dx);
    cuda_free(dy);
    free(got);
    free(ref);
    free(xr);
    free(x);
    free(wb);
    free(wf);
}

static void check_matmul(int n, int in, int out, int x_offset)
{
    check_matmul_opw(n, in, out, x_offset, 0);
}

static void test_matmul_release_shapes(void **state)
{
    (void)state;
    check_matmul(2, 4096, 4096, 0);   /* LM q, o; depth q/k/v/o */
    check_matmul(2, 4096, 1024, 0);   /* LM k, v; depth audio head */
    check_matmul(16, 4096, 12288, 0); /* LM gate/up, 8 CFG pairs */
    check_matmul(16, 12288, 4096, 0); /* LM down */
    check_matmul(2, 4096, 6144, 0);   /* depth gate/up */
    check_matmul(14, 6144, 4096, 0);  /* depth down, 7 rows */
    check_matmul(2, 4096, 16385, 0);  /* sliced LM head */
    check_matmul(1, 4096, 6144, 0);   /* fused qkv, one row */
}

static void test_matmul_odd_shapes(void **state)
{
    (void)state;
    for (int n = 1; n <= CUDA_OPS_GEMV_MAX_ROWS; n++) check_matmul(n, 264, 37 + n, 0);
    check_matmul(3, 1000, 77, 0); /* in % 8 == 0, out odd */
    check_matmul(5, 4101, 33, 0); /* in % 8 != 0: element path */
    check_matmul(7, 7, 1, 0);
    check_matmul(2, 4096, 64, 1); /* x not 16-byte aligned */
    check_matmul(17, 1000, 300, 0);  /* first cuBLASLt size where in % 32 != 0 */
    check_matmul(17, 4096, 1024, 0); /* tensor-core GEMV up to 32 rows (in % 32 == 0) */
    check_matmul(32, 4096, 1024, 0);
    check_matmul(32, 4096, 64, 1);   /* x not 16-byte aligned: cuBLASLt */
    check_matmul(33, 4096, 1024, 0); /* first cuBLASLt size */
    check_matmul(40, 1000, 300, 0);
    for (int opw = 2; opw <= 8; opw *= 2) {
        check_matmul_opw(1, 1032, 45, 0, opw);
        check_matmul_opw(16, 1032, 45, 0, opw);
        check_matmul_opw(9, 1001, 13, 0, opw);
    }
    /* Tensor-core kernel: every x-tile count, clusters of 1..8 blocks, odd out. */
    const int mma_rows[] = {1, 2, 7, 8, 9, 16, 17, 25, 32};
    for (size_t i = 0; i < sizeof mma_rows / sizeof mma_rows[0]; i++) {
        check_matmul_opw(mma_rows[i], 4096, 1024, 0, -2);
        check_matmul_opw(mma_rows[i], 4096, 1024, 0, -4);
        check_matmul_opw(mma_rows[i], 96, 45, 0, -2);
        check_matmul_opw(mma_rows[i], 96, 45, 0, -4);
    }
    check_matmul_opw(16, 12288, 4096, 0, -2);
    check_matmul_opw(16, 12288, 4096, 0, -4);
    check_matmul_opw(3, 6144, 16385, 0, 1);
    check_matmul_opw(16, 32, 1, 0, 1);
    float *d = NULL;
    assert_int_equal(cuda_malloc((void **)&d, 64), 0);
    assert_int_equal(cuda_ops_gemv_bf16_mma(d, d, (const uint16_t *)d, 1, 40, 1, 0, NULL), -EINVAL);
    assert_int_equal(cuda_ops_gemv_bf16_mma(d, d, (const uint16_t *)d, 1, 64, 1, 3, NULL), -EINVAL);
    assert_int_equal(cuda_ops_gemv_bf16_mma(d, d, (const uint16_t *)d, 33, 64, 1, 0, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "rows 1..32"));
    assert_int_equal(cuda_ops_gemv_max_rows(4096), 32);
    assert_int_equal(cuda_ops_gemv_max_rows(1000), 16);
    assert_int_equal(cuda_ops_gemv_bf16_opw(d, d, (const uint16_t *)d, 1, 8, 1, 3, NULL), -EINVAL);
    assert_int_equal(cuda_ops_gemv_bf16_opw(d, d, (const uint16_t *)d, 17, 8, 1, 4, NULL), -EINVAL);
    cuda_free(d);
}

static void test_matmul_bad_args(void **state)
{
    (void)state;
    float *d = NULL;
    assert_int_equal(cuda_malloc((void **)&d, 64), 0);
    assert_int_equal(cuda_ops_matmul_bf16(d, d, (const uint16_t *)d, 0, 4, 4, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "rows"));
    assert_int_equal(cuda_ops_matmul_bf16(d, d, NULL, 1, 4, 4, NULL), -EINVAL);
    cuda_free(d);
}

/* ---- norms ------------------------------------------------------------------- */

static void check_rmsnorm(int n, int dim)
{
    char what[128];
    snprintf(what, sizeof what, "rmsnorm n=%d dim=%d", n, dim);
    size_t len = (size_t)n * dim;
    float *x = rnd_array(len, 3.0f), *w = rnd_array((size_t)dim, 1.5f);
    float *ref = malloc(sizeof(float) * len);
    assert_non_null(ref);
    op_rmsnorm(ref, x, w, n, dim, 1e-6f);

    float *dx = dev_upload(x, sizeof(float) * len), *dw = dev_upload(w, sizeof(float) * dim);
    float *dy_inner, *dy = dev_guarded(len, &dy_inner);
    assert_int_equal(cuda_ops_rmsnorm(dy_inner, dx, dw, n, dim, 1e-6f, NULL), 0);
    float *got = dev_fetch_checked(dy, len, what);
    expect_close(got, ref, len, TOL_F32_ROW, what);
    free(got);

    /* In place (y aliases x), the way the decode loop calls it. */
    float *dz_inner, *dz = dev_guarded(len, &dz_inner);
    assert_int_equal(cuda_memcpy_h2d(dz_inner, x, sizeof(float) * len), 0);
    assert_int_equal(cuda_ops_rmsnorm(dz_inner, dz_inner, dw, n, dim, 1e-6f, NULL), 0);
    got = dev_fetch_checked(dz, len, what);
    expect_close(got, ref, len, TOL_F32_ROW, "  ... in place");
    free(got);

    /* Fused residual add: h += a; y = rmsnorm(h). */
    float *a = rnd_array(len, 2.0f);
    float *h_ref = malloc(sizeof(float) * len);
    assert_non_null(h_ref);
    memcpy(h_ref, x, sizeof(float) * len);
    op_add(h_ref, a, len);
    op_rmsnorm(ref, h_ref, w, n, dim, 1e-6f);
    float *da = dev_upload(a, sizeof(float) * len);
    float *dh_inner, *dh = dev_guarded(len, &dh_inner);
    assert_int_equal(cuda_memcpy_h2d(dh_inner, x, sizeof(float) * len), 0);
    assert_int_equal(cuda_memset(dy, 0xff, sizeof(float) * (len + 2 * GUARD)), 0);
    assert_int_equal(cuda_ops_add_rmsnorm(dh_inner, dy_inner, da, dw, n, dim, 1e-6f, NULL), 0);
    float *got_h = dev_fetch_checked(dh, len, what);
    float *got_y = dev_fetch_checked(dy, len, what);
    /* The add is one IEEE addition: bit-exact. */
    assert_memory_equal(got_h, h_ref, sizeof(float) * len);
    expect_close(got_y, ref, len, TOL_F32_ROW, "  ... add_rmsnorm");

    cuda_free(dx);
    cuda_free(dw);
    cuda_free(dy);
    cuda_free(dz);
    cuda_free(da);
    cuda_free(dh);
    free(got_h);
    free(got_y);
    free(h_ref);
    free(a);
    free(ref);
    free(x);
    free(w);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    check_rmsnorm(2, 4096);
    check_rmsnorm(16, 4096);
    check_rmsnorm(3, 1000);
    check_rmsnorm(1, 7);
    check_rmsnorm(5, 12288);
}

/* q/k norm + RoPE on a row that holds `lead` other floats before the heads, so
 * the row stride is not heads*head_dim (as for q inside a fused qkv row). */
static void check_qk_norm_rope(int n, int n_heads, int head_dim, int rotary_dim, double theta, int lead,
                               int with_norm)
{
    char what[160];
    snprintf(what, sizeof what, "qk_norm_rope n=%d heads=%d hd=%d rot=%d theta=%g%s", n, n_heads, head_dim,
             rotary_dim, theta, with_norm ? "" : " (no norm)");
    int stride = lead + n_heads * head_dim + 3;
    size_t len = (size_t)n * stride;
    float *x = rnd_array(len, 4.0f), *w = rnd_array((size_t)head_dim, 1.5f);
    int *pos = malloc(sizeof(int) * n);
    assert_non_null(pos);
    for (int t = 0; t < n; t++) pos[t] = (int)(test_rand_next(&rng) % 10240);
    pos[0] = 10239; /* largest angle */
    float *inv_freq = malloc(sizeof(float) * (rotary_dim / 2 + 1));
    assert_non_null(inv_freq);
    op_rope_inv_freq(inv_freq, theta, rotary_dim);

    float *ref = malloc(sizeof(float) * len);
    assert_non_null(ref);
    memcpy(ref, x, sizeof(float) * len);
    for (int t = 0; t < n; t++) {
        float *heads = ref + (size_t)t * stride + lead;
        if (with_norm) op_rmsnorm(heads, heads, w, n_heads, head_dim, 1e-6f);
        op_rope(heads, 1, stride, n_heads, head_dim, rotary_dim, &pos[t], inv_freq);
    }

    float *dx_inner, *dx = dev_guarded(len, &dx_inner);
    assert_int_equal(cuda_memcpy_h2d(dx_inner, x, sizeof(float) * len), 0);
    float *dw = dev_upload(w, sizeof(float) * head_dim);
    int *dpos = dev_upload(pos, sizeof(int) * n);
    float *dfreq = dev_upload(inv_freq, sizeof(float) * (rotary_dim / 2 + 1));
    int rc = cuda_ops_qk_norm_rope(
        dx_inner + lead, n, stride, n_heads, head_dim,
        &(struct cuda_head_norm_rope){
            .w = with_norm ? dw : NULL, .eps = 1e-6f, .rotary_dim = rotary_dim, .pos = dpos, .inv_freq = dfreq},
        NULL);
    if (rc) fail_msg("%s: %s", what, mm3_last_error());
    float *got = dev_fetch_checked(dx, len, what);
    expect_close(got, ref, len, TOL_F32_TRIG, what);
    /* Columns outside the heads are untouched. */
    for (int t = 0; t < n; t++) {
        for (int c = 0; c < lead; c++) assert_true(got[(size_t)t * stride + c] == x[(size_t)t * stride + c]);
        for (int c = lead + n_heads * head_dim; c < stride; c++)
            assert_true(got[(size_t)t * stride + c] == x[(size_t)t * stride + c]);
    }

    cuda_free(dx);
    cuda_free(dw);
    cuda_free(dpos);
    cuda_free(dfreq);
    free(got);
    free(ref);
    free(inv_freq);
    free(pos);
    free(w);
    free(x);
}

static void test_qk_norm_rope(void **state)
{
    (void)state;
    check_qk_norm_rope(2, 32, 128, 128, 1e6, 0, 1);    /* LM q */
    check_qk_norm_rope(16, 8, 128, 128, 1e6, 4096, 1); /* LM k inside a fused qkv row */
    check_qk_norm_rope(3, 5, 64, 32, 1e4, 7, 1);       /* partial rotary */
    check_qk_norm_rope(2, 3, 96, 96, 1e4, 0, 0);       /* RoPE only */
    check_qk_norm_rope(4, 16, 256, 0, 1e6, 0, 1);      /* norm only */
}

static void test_qk_norm_rope_bad_args(void **state)
{
    (void)state;
    assert_int_equal(cuda_ops_qk_norm_rope(NULL, 1, 128, 1, 128,
                                           &(struct cuda_head_norm_rope){.eps = 1e-6f, .rotary_dim = 127}, NULL),
                     -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "rotary_dim"));
    assert_int_equal(cuda_ops_qk_norm_rope(NULL, 1, 100, 1, 128, &(struct cuda_head_norm_rope){.eps = 1e-6f}, NULL),
                     -EINVAL);
}

/* ---- element-wise -------------------------------------------------------------- */

static void check_silu_mul(size_t n)
{
    char what[96];
    snprintf(what, sizeof what, "silu_mul n=%zu", n);
    float *g = rnd_array(n, 8.0f), *u = rnd_array(n, 2.0f), *ref = malloc(sizeof(float) * n);
    assert_non_null(ref);
    op_silu_mul(ref, g, u, n);
    float *dg = dev_upload(g, sizeof(float) * n), *du = dev_upload(u, sizeof(float) * n);
    float *dy_inner, *dy = dev_guarded(n, &dy_inner);
    assert_int_equal(cuda_ops_silu_mul(dy_inner, dg, du, n, NULL), 0);
    float *got = dev_fetch_checked(dy, n, what);
    expect_close(got, ref, n, TOL_F32_EXP, what);
    cuda_free(dg);
    cuda_free(du);
    cuda_free(dy);
    free(got);
    free(ref);
    free(g);
    free(u);
}

/* The reference of the interleaved SwiGLU: y[i] = silu(gu[2i]) * gu[2i + 1] for i < n
 * (rows of gate/up pairs follow each other, so one run covers every row). */
static void ref_silu_mul_interleaved(float *y, const float *gu, size_t n)
{
    for (size_t i = 0; i < n; i++)
        op_silu_mul(y + i, gu + 2 * i, gu + 2 * i + 1, 1);
}

/* Interleaved gate/up rows (gate j at column 2j, up j at 2j + 1) against op_silu_mul. */
static void check_silu_mul_interleaved(int rows, int ffn)
{
    char what[96];
    snprintf(what, sizeof what, "silu_mul_interleaved rows=%d ffn=%d", rows, ffn);
    size_t n = (size_t)rows * ffn;
    float *gu = rnd_array(2 * n, 8.0f), *ref = malloc(sizeof(float) * n);
    assert_non_null(ref);
    ref_silu_mul_interleaved(ref, gu, n);
    float *dgu = dev_upload(gu, sizeof(float) * 2 * n);
    float *dy_inner, *dy = dev_guarded(n, &dy_inner);
    assert_int_equal(cuda_ops_silu_mul_interleaved(dy_inner, dgu, rows, ffn, NULL), 0);
    float *got = dev_fetch_checked(dy, n, what);
    expect_close(got, ref, n, TOL_F32_EXP, what);
    cuda_free(dgu);
    cuda_free(dy);
    free(got);
    free(ref);
    free(gu);
}

static void check_add(size_t n)
{
    char what[96];
    snprintf(what, sizeof what, "add n=%zu", n);
    float *y = rnd_array(n, 3.0f), *x = rnd_array(n, 3.0f);
    float *dy_inner, *dy = dev_guarded(n, &dy_inner);
    assert_int_equal(cuda_memcpy_h2d(dy_inner, y, sizeof(float) * n), 0);
    float *dx = dev_upload(x, sizeof(float) * n);
    assert_int_equal(cuda_ops_add(dy_inner, dx, n, NULL), 0);
    float *got = dev_fetch_checked(dy, n, what);
    op_add(y, x, n);
    assert_memory_equal(got, y, sizeof(float) * n); /* one IEEE add: exact */
    printf("  %-58s bit-exact\n", what);
    cuda_free(dx);
    cuda_free(dy);
    free(got);
    free(x);
    free(y);
}

static void test_elementwise(void **state)
{
    (void)state;
    check_silu_mul((size_t)16 * 12288);
    check_silu_mul((size_t)2 * 6144);
    check_silu_mul(7);
    check_silu_mul_interleaved(2, 12288);
    check_silu_mul_interleaved(3, 77);
    check_add((size_t)16 * 4096);
    check_add(1001);
}

/* ---- fused SwiGLU product ------------------------------------------------------------ */

/* cuda_ops_matmul_bf16_swiglu against the float32 reference silu(x.Wg) * (x.Wu)
 * (x rounded to bf16 where cuBLASLt serves, as in check_matmul), and, where a GEMV
 * fuses the epilogue, bit for bit against the unfused chain: the product into gu,
 * then cuda_ops_silu_mul_interleaved. */
static void check_swiglu(int n, int in, int ffn)
{
    char what[128];
    snprintf(what, sizeof what, "matmul_bf16_swiglu n=%d in=%d ffn=%d", n, in, ffn);
    float *gf, *uf;
    uint16_t *gb = rnd_bf16((size_t)ffn * in, 0.05f, &gf), *ub = rnd_bf16((size_t)ffn * in, 0.05f, &uf);
    uint16_t *wi = malloc(2 * (size_t)2 * ffn * in); /* rows interleaved: gate j, up j */
    assert_non_null(wi);
    for (int j = 0; j < ffn; j++) {
        memcpy(wi + (size_t)(2 * j) * in, gb + (size_t)j * in, 2 * (size_t)in);
        memcpy(wi + (size_t)(2 * j + 1) * in, ub + (size_t)j * in, 2 * (size_t)in);
    }
    float *x = rnd_array((size_t)n * in, 1.0f), *xr = malloc(sizeof(float) * (size_t)n * in);
    float *g = malloc(sizeof(float) * (size_t)n * ffn), *u = malloc(sizeof(float) * (size_t)n * ffn);
    float *ref = malloc(sizeof(float) * (size_t)n * ffn);
    assert_true(xr && g && u && ref);
    const int round = n > cuda_ops_gemv_max_rows(in) || (tc_serves(n, in, 2 * ffn, 1) && tc_rounds(n));
    for (size_t i = 0; i < (size_t)n * in; i++)
        xr[i] = round ? as_bf16(x[i]) : x[i];
    op_matmul(g, xr, gf, NULL, n, in, ffn);
    op_matmul(u, xr, uf, NULL, n, in, ffn);
    op_silu_mul(ref, g, u, (size_t)n * ffn);

    uint16_t *dw = dev_upload(wi, 2 * (size_t)2 * ffn * in);
    float *dx = dev_upload(x, sizeof(float) * (size_t)n * in);
    float *dgu, *dref;
    assert_int_equal(cuda_malloc((void **)&dgu, sizeof(float) * (size_t)n * 2 * ffn), 0);
    assert_int_equal(cuda_malloc((void **)&dref, sizeof(float) * (size_t)n * ffn), 0);
    float *dy_inner, *dy = dev_guarded((size_t)n * ffn, &dy_inner);
    if (cuda_ops_matmul_bf16_swiglu(dy_inner, dgu, dx, dw, n, in, ffn, NULL))
        fail_msg("%s: %s", what, mm3_last_error());
    float *got = dev_fetch_checked(dy, (size_t)n * ffn, what);
    /* silu's expf on the device (<= 2 ulp) on top of the summation order. */
    expect_close(got, ref, (size_t)n * ffn, n > cuda_ops_gemv_max_rows(in) ? 2e-2 : TOL_F32_SUM, what);

    assert_int_equal(cuda_ops_matmul_bf16(dgu, dx, dw, n, in, 2 * ffn, NULL), 0);
    assert_int_equal(cuda_ops_silu_mul_interleaved(dref, dgu, n, ffn, NULL), 0);
    assert_int_equal(cuda_stream_sync(NULL), 0);
    float *unfused = malloc(sizeof(float) * (size_t)n * ffn);
    assert_non_null(unfused);
    assert_int_equal(cuda_memcpy_d2h(unfused, dref, sizeof(float) * (size_t)n * ffn), 0);
    if (memcmp(unfused, got, sizeof(float) * (size_t)n * ffn))
        fail_msg("%s: fused and unfused (product, then silu * up) differ", what);
    printf("  %-58s same bits as the unfused chain\n", what);

    cuda_free(dw), cuda_free(dx), cuda_free(dgu), cuda_free(dref), cuda_free(dy);
    free(unfused), free(got), free(ref), free(u), free(g), free(xr), free(x), free(wi);
    free(gb), free(ub), free(gf), free(uf);
}

static void test_swiglu(void **state)
{
    (void)state;
    check_swiglu(2, 4096, 12288); /* LM gate/up, one CFG pair */
    check_swiglu(16, 4096, 6144); /* depth gate/up, 8 pairs (tensor-core kernel) */
    const int rows[] = {1, 3, 4, 5, 8, 9, 16};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        check_swiglu(rows[i], 96, 37);
    check_swiglu(17, 264, 40); /* cuBLASLt, then the interleaved silu kernel */
    check_swiglu(32, 4096, 6144); /* depth gate/up, two positions of 8 pairs */
    check_swiglu(33, 96, 37);     /* cuBLASLt */
    check_swiglu(3, 100, 9);   /* in % 8 != 0: unfused through gu */
    float *d = NULL;
    assert_int_equal(cuda_malloc((void **)&d, 4096), 0);
    assert_int_equal(cuda_ops_matmul_bf16_swiglu(d, NULL, d, (const uint16_t *)d, 17, 8, 4, NULL), -EINVAL);
    assert_int_equal(cuda_ops_matmul_bf16_swiglu(d, d, d, (const uint16_t *)d, 0, 8, 4, NULL), -EINVAL);
    cuda_free(d);
}

/* ---- products queued back to back (programmatic dependent launch) ------------------ */

/* A decode layer's chain of fused products, each reading the previous one's output:
 * a = norm1(h) . Wa^T, h += a . Wo^T, f = silu * up of norm2(h) . Wgu^T, h += f . Wd^T,
 * for `layers` layers queued on one stream without a sync, so each kernel starts
 * while the one before it finishes (PDL). The checks above launch one product after a
 * copy, with nothing to overlap: this is where a kernel reading its input before
 * pdl_wait shows (the x-staged GEMV did with __ldg: rel 0.1-0.4 in the talker's tests).
 * Then the same chain as a CUDA graph must give the same bits. Shapes: the 12288-output
 * products take the x-staged kernel at 17-32 rows (and at 9-16 with x split), the
 * 1024-output ones gemv_mma.cu. */
enum { CHAIN_H = 1024, CHAIN_A = 12288, CHAIN_F = 6144, CHAIN_LAYERS = 3 };

struct chain_dev {
    uint16_t *wa, *wo, *wgu, *wd;
    float *n1, *n2, *h, *a, *f;
};

static int chain_queue(const struct chain_dev *d, int n, void *st)
{
    const float eps = 1e-6f;
    for (int l = 0; l < CHAIN_LAYERS; l++) {
        const size_t wa = (size_t)l * CHAIN_A * CHAIN_H, wgu = (size_t)l * 2 * CHAIN_F * CHAIN_H;
        if (cuda_ops_gemv_bf16_fused(&(struct cuda_gemv_fused){.y = d->a,
                                                               .x = d->h,
                                                               .w = d->wa + wa,
                                                               .n_rows = n,
                                                               .in = CHAIN_H,
                                                               .out = CHAIN_A,
                                                               .norm_w = d->n1,
                                                               .eps = eps},
                                     st) ||
            cuda_ops_gemv_bf16_fused(&(struct cuda_gemv_fused){.y = d->h,
                                                               .x = d->a,
                                                               .w = d->wo + wa,
                                                               .n_rows = n,
                                                               .in = CHAIN_A,
                                                               .out = CHAIN_H,
                                                               .epi = CUDA_GEMV_ADD},
                                     st) ||
            cuda_ops_gemv_bf16_fused(&(struct cuda_gemv_fused){.y = d->f,
                                                               .x = d->h,
                                                               .w = d->wgu + wgu,
                                                               .n_rows = n,
                                                               .in = CHAIN_H,
                                                               .out = 2 * CHAIN_F,
                                                               .epi = CUDA_GEMV_SWIGLU,
                                                               .norm_w = d->n2,
                                                               .eps = eps},
                                     st) ||
            cuda_ops_gemv_bf16_fused(&(struct cuda_gemv_fused){.y = d->h,
                                                               .x = d->f,
                                                               .w = d->wd + wgu / 2,
                                                               .n_rows = n,
                                                               .in = CHAIN_F,
                                                               .out = CHAIN_H,
                                                               .epi = CUDA_GEMV_ADD},
                                     st))
            return -1;
    }
    return 0;
}

static void check_chain(int n)
{
    char what[96];
    snprintf(what, sizeof what, "fused products chained, n=%d, %d layers", n, CHAIN_LAYERS);
    const float eps = 1e-6f;
    const size_t na = (size_t)CHAIN_LAYERS * CHAIN_A * CHAIN_H, nf = (size_t)CHAIN_LAYERS * CHAIN_F * CHAIN_H;
    float *waf, *wof, *wguf, *wdf; /* per-layer scales keep h near unit size */
    uint16_t *wa = rnd_bf16(na, 0.053f, &waf), *wo = rnd_bf16(na, 0.015f, &wof);
    uint16_t *wgu = rnd_bf16(2 * nf, 0.053f, &wguf), *wd = rnd_bf16(nf, 0.022f, &wdf);
    float *n1 = rnd_array(CHAIN_H, 1.0f), *n2 = rnd_array(CHAIN_H, 1.0f), *h0 = rnd_array((size_t)n * CHAIN_H, 1.0f);

    /* The reference: the same chain on the CPU ops (gate and up rows interleaved). */
    float *h = malloc(sizeof(float) * (size_t)n * CHAIN_H), *xn = malloc(sizeof(float) * (size_t)n * CHAIN_H);
    float *a = malloc(sizeof(float) * (size_t)n * CHAIN_A), *gu = malloc(sizeof(float) * (size_t)n * 2 * CHAIN_F);
    float *f = malloc(sizeof(float) * (size_t)n * CHAIN_F), *o = malloc(sizeof(float) * (size_t)n * CHAIN_H);
    assert_true(h && xn && a && gu && f && o);
    memcpy(h, h0, sizeof(float) * (size_t)n * CHAIN_H);
    for (int l = 0; l < CHAIN_LAYERS; l++) {
        const size_t la = (size_t)l * CHAIN_A * CHAIN_H, lf = (size_t)l * CHAIN_F * CHAIN_H;
        op_rmsnorm(xn, h, n1, n, CHAIN_H, eps);
        op_matmul(a, xn, waf + la, NULL, n, CHAIN_H, CHAIN_A);
        op_matmul(o, a, wof + la, NULL, n, CHAIN_A, CHAIN_H);
        op_add(h, o, (size_t)n * CHAIN_H);
        op_rmsnorm(xn, h, n2, n, CHAIN_H, eps);
        op_matmul(gu, xn, wguf + 2 * lf, NULL, n, CHAIN_H, 2 * CHAIN_F);
        ref_silu_mul_interleaved(f, gu, (size_t)n * CHAIN_F);
        op_matmul(o, f, wdf + lf, NULL, n, CHAIN_F, CHAIN_H);
        op_add(h, o, (size_t)n * CHAIN_H);
    }

    struct chain_dev d = {dev_upload(wa, 2 * na),
                          dev_upload(wo, 2 * na),
                          dev_upload(wgu, 4 * nf),
                          dev_upload(wd, 2 * nf),
                          dev_upload(n1, sizeof(float) * CHAIN_H),
                          dev_upload(n2, sizeof(float) * CHAIN_H),
                          NULL,
                          NULL,
                          NULL};
    float *h_inner;
    float *dh = dev_guarded((size_t)n * CHAIN_H, &h_inner);
    d.h = h_inner;
    assert_int_equal(cuda_malloc((void **)&d.a, sizeof(float) * (size_t)n * CHAIN_A), 0);
    assert_int_equal(cuda_malloc((void **)&d.f, sizeof(float) * (size_t)n * CHAIN_F), 0);
    void *st = NULL;
    assert_int_equal(cuda_stream_create(&st), 0);
    /* The default routing, then each tensor-core kernel for every product, x split
     * into bf16 hi + lo; then (mode 3, above 8 rows) as served, x rounded to bf16. */
    for (int mode = 0; mode <= 3; mode++) {
        if (mode == 3 && n <= 8) break;
        char run[128];
        snprintf(run, sizeof run, "%s, x-staged %s", what,
                 mode == 0 ? "default" : mode == 1 ? "always" : mode == 2 ? "never" : "default, x rounded");
        assert_int_equal(cuda_ops_gemv_set_xs(mode % 3), 0);
        set_x_round(mode == 3 ? 0 : 2);
        assert_int_equal(cuda_memcpy_h2d(d.h, h0, sizeof(float) * (size_t)n * CHAIN_H), 0);
        if (chain_queue(&d, n, st)) fail_msg("%s: %s", run, mm3_last_error());
        assert_int_equal(cuda_stream_sync(st), 0);
        float *eager = dev_fetch_checked(dh, (size_t)n * CHAIN_H, run);
        /* 12 products with x split into bf16 hi + lo (~2e-5 each), or with x rounded to
         * bf16 (2.6e-3 seen at 16 rows); a stale input is ~1e-1 */
        expect_close(eager, h, (size_t)n * CHAIN_H, mode == 3 ? 1e-2 : 5e-4, run);

        void *graph = NULL;
        assert_int_equal(cuda_memcpy_h2d(d.h, h0, sizeof(float) * (size_t)n * CHAIN_H), 0);
        assert_int_equal(cuda_graph_capture_begin(st), 0);
        if (chain_queue(&d, n, st)) fail_msg("%s (capture): %s", run, mm3_last_error());
        assert_int_equal(cuda_graph_capture_end(st, &graph), 0);
        assert_int_equal(cuda_graph_launch(graph, st), 0);
        assert_int_equal(cuda_stream_sync(st), 0);
        float *replayed = dev_fetch_checked(dh, (size_t)n * CHAIN_H, run);
        if (memcmp(eager, replayed, sizeof(float) * (size_t)n * CHAIN_H))
            fail_msg("%s: the graph replay differs from the eager chain", run);
        printf("  %-58s graph replay: same bits\n", run);
        cuda_graph_destroy(graph);
        free(eager), free(replayed);
    }
    assert_int_equal(cuda_ops_gemv_set_xs(0), 0);
    set_x_round(0);

    cuda_stream_destroy(st);
    cuda_free(d.wa), cuda_free(d.wo), cuda_free(d.wgu), cuda_free(d.wd), cuda_free(d.n1), cuda_free(d.n2);
    cuda_free(dh), cuda_free(d.a), cuda_free(d.f);
    free(h), free(xn), free(a), free(gu), free(f), free(o), free(h0), free(n1), free(n2);
    free(wa), free(wo), free(wgu), free(wd), free(waf), free(wof), free(wguf), free(wdf);
}

static void test_gemv_chain(void **state)
{
    (void)state;
    check_chain(2);  /* the float32 kernel */
    check_chain(16); /* 8 pairs */
    check_chain(32); /* the depth decoder's two-position pass at 8 pairs */
}

/* ---- fused decode GEMV (norm in, SwiGLU / residual add out) ------------------------ */

/* cuda_ops_gemv_bf16_fused against the float32 chain it replaces: RMSNorm (op_rmsnorm)
 * when norm, the product, then store / silu(gate) * up over interleaved rows / add to
 * what y held. The norm's scale is applied to the sums instead of to x: float32
 * rounding in another place (~1e-7), inside TOL_F32_SUM. Where the kernel rounds x
 * (tc_rounds), it rounds x times the norm weight, and the row's scale stays on the
 * sums: so does the reference. */
static void check_fused(int n, int in, int out, enum cuda_gemv_epi epi, int norm)
{
    static const char *names[] = {"store", "swiglu", "add"};
    char what[128];
    snprintf(what, sizeof what, "gemv_bf16_fused n=%d in=%d out=%d %s%s", n, in, out, names[epi],
             norm ? " + norm" : "");
    assert_true(cuda_ops_gemv_fused_ok(n, in, out, epi, norm));
    const float eps = 1e-6f;
    float *wf, *x = rnd_array((size_t)n * in, 3.0f), *wn = rnd_array((size_t)in, 1.0f);
    uint16_t *wb = rnd_bf16((size_t)out * in, 0.05f, &wf);
    const int yw = epi == CUDA_GEMV_SWIGLU ? out / 2 : out;
    float *y0 = rnd_array((size_t)n * yw, 1.0f);
    float *xn = malloc(sizeof(float) * (size_t)n * in), *prod = malloc(sizeof(float) * (size_t)n * out);
    float *ref = malloc(sizeof(float) * (size_t)n * yw);
    assert_true(xn && prod && ref);
    const int round = tc_serves(n, in, out, 1) && tc_rounds(n);
    if (round) {
        for (size_t i = 0; i < (size_t)n * in; i++)
            xn[i] = as_bf16(norm ? x[i] * wn[i % (size_t)in] : x[i]);
        op_matmul(prod, xn, wf, NULL, n, in, out);
        for (int r = 0; r < n && norm; r++) {
            float ss = 0.0f;
            for (int i = 0; i < in; i++)
                ss += x[(size_t)r * in + i] * x[(size_t)r * in + i];
            const float scale = 1.0f / sqrtf(ss / (float)in + eps);
            for (int j = 0; j < out; j++)
                prod[(size_t)r * out + j] *= scale;
        }
    } else {
        if (norm)
            op_rmsnorm(xn, x, wn, n, in, eps);
        else
            memcpy(xn, x, sizeof(float) * (size_t)n * in);
        op_matmul(prod, xn, wf, NULL, n, in, out);
    }
    for (int r = 0; r < n; r++)
        for (int j = 0; j < yw; j++) {
            const float *pr = prod + (size_t)r * out;
            float *o = ref + (size_t)r * yw + j;
            if (epi == CUDA_GEMV_SWIGLU)
                op_silu_mul(o, pr + 2 * j, pr + 2 * j + 1, 1);
            else
                *o = epi == CUDA_GEMV_ADD ? y0[(size_t)r * yw + j] + pr[j] : pr[j];
        }

    uint16_t *dw = dev_upload(wb, 2 * (size_t)out * in);
    float *dx = dev_upload(x, sizeof(float) * (size_t)n * in), *dwn = dev_upload(wn, sizeof(float) * in);
    float *dy_inner, *dy = dev_guarded((size_t)n * yw, &dy_inner);
    if (epi == CUDA_GEMV_ADD) /* the others write every output over the poison */
        assert_int_equal(cuda_memcpy_h2d(dy_inner, y0, sizeof(float) * (size_t)n * yw), 0);
    if (cuda_ops_gemv_bf16_fused(&(struct cuda_gemv_fused){.y = dy_inner,
                                                           .x = dx,
                                                           .w = dw,
                                                           .n_rows = n,
                                                           .in = in,
                                                           .out = out,
                                                           .epi = epi,
                                                           .norm_w = norm ? dwn : NULL,
                                                           .eps = eps},
                                 NULL))
        fail_msg("%s: %s", what, mm3_last_error());
    float *got = dev_fetch_checked(dy, (size_t)n * yw, what);
    /* x split in two bf16 halves on the tensor cores (above 2 rows, or wide products). */
    const int split_x = n > 2 || tc_serves(n, in, out, 1);
    expect_close(got, ref, (size_t)n * yw, split_x ? TOL_SPLIT_SUM : TOL_F32_SUM, what);

    cuda_free(dw), cuda_free(dx), cuda_free(dwn), cuda_free(dy);
    free(got), free(ref), free(prod), free(xn), free(y0), free(wb), free(wf), free(wn), free(x);
}

/* Small shapes at n rows: both epilogues with the norm, the add, a k split. */
static void check_fused_small(int n)
{
    check_fused(n, 96, 46, CUDA_GEMV_STORE, 1);
    check_fused(n, 96, 46, CUDA_GEMV_SWIGLU, 1);
    check_fused(n, 96, 45, CUDA_GEMV_ADD, 0);
    check_fused(n, 4096, 130, CUDA_GEMV_SWIGLU, 0);
}

static void test_gemv_fused(void **state)
{
    (void)state;
    /* Release shapes: the LM layer at 1 and 8 CFG pairs, the depth layer at 1 pair. */
    const int rows[] = {2, 16};
    for (int i = 0; i < 2; i++) {
        check_fused(rows[i], 4096, 6144, CUDA_GEMV_STORE, 1);   /* QKV of the normed h */
        check_fused(rows[i], 4096, 4096, CUDA_GEMV_ADD, 0);     /* h += o . Wo^T */
        check_fused(rows[i], 4096, 24576, CUDA_GEMV_SWIGLU, 1); /* silu * up of the normed h */
        check_fused(rows[i], 12288, 4096, CUDA_GEMV_ADD, 0);    /* h += g . Wd^T */
    }
    check_fused(2, 4096, 12288, CUDA_GEMV_SWIGLU, 1);
    /* Wide products at 1-2 rows on the tensor cores (cuda_ops_gemv_set_mma_wide: the
     * talker's gate|up above by default, here from 12288 outputs) and on float32 (0). */
    const int wide[] = {3, 0};
    for (int i = 0; i < 2; i++) {
        set_gemv_wide(wide[i]);
        for (int n = 1; n <= 2; n++) {
            check_fused(n, 4096, 24576, CUDA_GEMV_SWIGLU, 1);
            check_fused(n, 4096, 12288, CUDA_GEMV_STORE, 1);
        }
    }
    set_gemv_wide(-1);
    assert_int_equal(cuda_ops_gemv_set_mma_wide(65), -EINVAL);
    /* Every row count (both kernels, every x tile count of the tensor-core one), k splits. */
    for (int n = 1; n <= CUDA_OPS_GEMV_MMA_MAX_ROWS; n++)
        check_fused_small(n);
    /* 17-32 rows: the depth decoder's two-position pass at 8 pairs (all four products,
     * several tiles per block at 12288 outputs) and a shape beyond the slice. */
    check_fused(32, 4096, 12288, CUDA_GEMV_STORE, 1);
    check_fused(32, 4096, 4096, CUDA_GEMV_ADD, 0);
    check_fused(32, 4096, 12288, CUDA_GEMV_SWIGLU, 1);
    check_fused(32, 6144, 4096, CUDA_GEMV_ADD, 0);
    check_fused(17, 4096, 1024, CUDA_GEMV_STORE, 1);
    assert_false(cuda_ops_gemv_fused_ok(33, 4096, 1024, CUDA_GEMV_STORE, 1));
    assert_false(cuda_ops_gemv_fused_ok(17, 264, 40, CUDA_GEMV_STORE, 0));
    /* Both weight tile counts of the tensor-core kernel for every variant (the
     * small shapes above take 2 per block, the release ones 2 or 4; 17-32 rows always
     * 2), and its products at 12288 outputs (several tiles per block) with the x-staged
     * kernel off. */
    for (int m = 2; m <= 4; m += 2) {
        assert_int_equal(cuda_ops_gemv_set_mma_tiles(m), 0);
        check_fused_small(5);
        check_fused_small(16);
        check_fused(16, 4096, 4096, CUDA_GEMV_ADD, 0);
        assert_int_equal(cuda_ops_gemv_set_xs(2), 0);
        check_fused(32, 4096, 4096, CUDA_GEMV_ADD, 0);
        check_fused(32, 4096, 12288, CUDA_GEMV_SWIGLU, 1);
        check_fused(16, 4096, 12288, CUDA_GEMV_STORE, 1);
        assert_int_equal(cuda_ops_gemv_set_xs(0), 0);
    }
    assert_int_equal(cuda_ops_gemv_set_mma_tiles(0), 0);
    assert_int_equal(cuda_ops_gemv_set_mma_tiles(3), -EINVAL);
    /* Both places for the weights in flight at both x tile counts (the default uses
     * registers at 3-16 rows, the ring at 9-16 where x is split), with several tiles per
     * block (24576 and 12288 outputs: the next tile's loads overlap the merge) and k
     * splits. */
    for (int mode = 1; mode <= 2; mode++) {
        assert_int_equal(cuda_ops_gemv_set_mma_ring(mode), 0);
        check_fused_small(5);
        check_fused_small(16);
        check_fused(16, 4096, 24576, CUDA_GEMV_SWIGLU, 1);
        check_fused(7, 4096, 12288, CUDA_GEMV_STORE, 1);
        check_fused(12, 12288, 4096, CUDA_GEMV_ADD, 0);
        check_matmul_opw(3, 6144, 16385, 0, 1);
        check_matmul_opw(16, 4096, 1024, 0, -2);
    }
    assert_int_equal(cuda_ops_gemv_set_mma_ring(0), 0);
    assert_int_equal(cuda_ops_gemv_set_mma_ring(3), -EINVAL);
    /* Both tensor-core kernels at every row count either may serve: the x-staged one
     * (the default at 17-32 rows) also at 3-16, gemv_mma.cu's also at 17-32; the release
     * shapes run one output group per block (24576 outputs) or clusters of 8 blocks
     * splitting k (4096), 1376 = 43 k steps splits unevenly with a part chunk. */
    const int xs_rows[] = {3, 8, 9, 16, 17, 32};
    for (int mode = 1; mode <= 2; mode++) {
        assert_int_equal(cuda_ops_gemv_set_xs(mode), 0);
        for (size_t i = 0; i < sizeof xs_rows / sizeof xs_rows[0]; i++) {
            const int n = xs_rows[i];
            check_fused_small(n);
            check_fused(n, 1376, 300, CUDA_GEMV_STORE, 1);
            check_fused(n, 4096, 4096, CUDA_GEMV_ADD, 0);
            check_fused(n, 4096, 24576, CUDA_GEMV_SWIGLU, 1);
        }
        check_fused(16, 4096, 6144, CUDA_GEMV_STORE, 1);
        check_fused(16, 12288, 4096, CUDA_GEMV_ADD, 0);
        check_matmul_opw(32, 4096, 16385, 0, 1);
    }
    assert_int_equal(cuda_ops_gemv_set_xs(0), 0);
    assert_int_equal(cuda_ops_gemv_set_xs(3), -EINVAL);
    /* x rounded to bf16 at every tensor-core row count (1), then at none (2: the split's
     * float32 accuracy at 9-32 rows too): both tensor-core kernels, both places for the
     * weights in flight (at 17-32 rows registers only where x is rounded), 2 and 4 weight
     * tiles, every x tile count. */
    for (int mode = 1; mode <= 2; mode++) {
        set_x_round(mode);
        for (int xs = 1; xs <= 2; xs++) {
            assert_int_equal(cuda_ops_gemv_set_xs(xs), 0);
            check_fused_small(5);
            check_fused_small(16);
            check_fused_small(32);
        }
        assert_int_equal(cuda_ops_gemv_set_xs(0), 0);
        assert_int_equal(cuda_ops_gemv_set_mma_ring(2), 0);
        check_fused_small(16);
        assert_int_equal(cuda_ops_gemv_set_xs(2), 0); /* 17-32 rows on registers where rounded */
        check_fused_small(32);
        check_fused(32, 4096, 12288, CUDA_GEMV_STORE, 1);
        check_fused(17, 6144, 4096, CUDA_GEMV_ADD, 0);
        assert_int_equal(cuda_ops_gemv_set_xs(0), 0);
        assert_int_equal(cuda_ops_gemv_set_mma_ring(0), 0);
        check_fused(16, 4096, 4096, CUDA_GEMV_ADD, 0);     /* gemv_mma.cu, clusters splitting k */
        check_fused(16, 4096, 24576, CUDA_GEMV_SWIGLU, 1); /* the x-staged kernel */
        check_matmul_opw(16, 4096, 1024, 0, -4);
        check_matmul_opw(3, 4096, 1000, 0, 1);
    }
    set_x_round(0);
    assert_int_equal(cuda_ops_gemv_set_x_round(3), -EINVAL);
    /* The same with 3-4 rows on the float32 kernel (the tuning setting). */
    set_mma_rows(4);
    for (int n = 3; n <= 4; n++)
        check_fused_small(n);
    check_fused(3, 40, 7, CUDA_GEMV_STORE, 1); /* in % 32 != 0 on the float32 kernel */
    set_mma_rows(0);
    assert_int_equal(cuda_ops_gemv_set_mma_rows(5), -EINVAL);
    check_fused(2, 40, 7, CUDA_GEMV_STORE, 1);
    assert_false(cuda_ops_gemv_fused_ok(3, 40, 8, CUDA_GEMV_STORE, 1)); /* tensor cores need in % 32 == 0 */
    assert_false(cuda_ops_gemv_fused_ok(5, 40, 8, CUDA_GEMV_STORE, 1));
    assert_false(cuda_ops_gemv_fused_ok(2, 44, 8, CUDA_GEMV_STORE, 0));
    assert_false(cuda_ops_gemv_fused_ok(2, 64, 7, CUDA_GEMV_SWIGLU, 0));
    assert_false(cuda_ops_gemv_fused_ok(2, 64, 8, CUDA_GEMV_ADD, 1));
    assert_false(cuda_ops_gemv_fused_ok(33, 64, 8, CUDA_GEMV_STORE, 0)); /* beyond the 32-row slice */
    float *d = NULL;
    assert_int_equal(cuda_malloc((void **)&d, 4096), 0);
    assert_int_equal(
        cuda_ops_gemv_bf16_fused(
            &(struct cuda_gemv_fused){.y = d, .x = d, .w = (const uint16_t *)d, .n_rows = 5, .in = 40, .out = 8}, NULL),
        -ENOTSUP);
    assert_non_null(strstr(mm3_last_error(), "cuda_ops_gemv_bf16_fused"));
    cuda_free(d);
}

/* ---- decode attention ------------------------------------------------------------ */

struct att_case {
    int n_seq, n_heads, n_kv_heads, head_dim, max_len;
    int kv_len[4];
    enum cuda_kv_dtype dtype;
    int chunk; /* 0: automatic split */
};

static void check_attention(const struct att_case *c)
{
    char what[160];
    snprintf(what, sizeof what, "attention_decode %s seqs=%d heads=%d/%d hd=%d len=%d,%d,%d chunk=%d",
             c->dtype == CUDA_KV_BF16 ? "bf16" : "f32", c->n_seq, c->n_heads, c->n_kv_heads, c->head_dim,
             c->kv_len[0], c->n_seq > 1 ? c->kv_len[1] : -1, c->n_seq > 2 ? c->kv_len[2] : -1, c->chunk);
    const size_t row = (size_t)c->n_kv_heads * c->head_dim + 8; /* padded rows: strides are honoured */
    const size_t seq = (size_t)c->max_len * row;
    const size_t n_cache = seq * c->n_seq, qn = (size_t)c->n_seq * c->n_heads * c->head_dim;
    float *kf, *vf;
    uint16_t *kb = rnd_bf16(n_cache, 2.0f, &kf), *vb = rnd_bf16(n_cache, 1.0f, &vf);
    float *q = rnd_array(qn, 2.0f), *ref = malloc(sizeof(float) * qn);
    assert_non_null(ref);
    const float scale = 1.0f / sqrtf((float)c->head_dim);
    for (int s = 0; s < c->n_seq; s++) {
        size_t qo = (size_t)s * c->n_heads * c->head_dim;
        const struct attention_heads h = {c->n_heads, c->n_kv_heads, c->head_dim, scale};
        op_attention(&(struct attention_rows){.out = ref + qo,
                                              .out_stride = c->n_heads * c->head_dim,
                                              .q = q + qo,
                                              .q_stride = c->n_heads * c->head_dim,
                                              .k = kf + s * seq,
                                              .v = vf + s * seq,
                                              .kv_stride = (int)row,
                                              .n_q = 1,
                                              .n_kv = c->kv_len[s],
                                              .causal = 1,
                                              .q_pos0 = c->kv_len[s] - 1},
                     &h);
    }

    void *dk, *dv;
    if (c->dtype == CUDA_KV_BF16) {
        dk = dev_upload(kb, 2 * n_cache);
        dv = dev_upload(vb, 2 * n_cache);
    } else {
        dk = dev_upload(kf, sizeof(float) * n_cache);
        dv = dev_upload(vf, sizeof(float) * n_cache);
    }
    float *dq = dev_upload(q, sizeof(float) * qn);
    int *dlen = dev_upload(c->kv_len, sizeof(int) * c->n_seq);
    float *dout_inner, *dout = dev_guarded(qn, &dout_inner);
    const struct cuda_attention_decode a = {.out = dout_inner,
                                            .q = dq,
                                            .kv = {dk, dv, c->dtype, seq, row},
                                            .kv_len = dlen,
                                            .n_seq = c->n_seq,
                                            .max_kv_len = c->max_len,
                                            .heads = {c->n_heads, c->n_kv_heads, c->head_dim, scale},
                                            .chunk_positions = c->chunk};
    int rc = cuda_ops_attention_decode(&a, NULL);
    if (rc) fail_msg("%s: %s", what, mm3_last_error());
    float *got = dev_fetch_checked(dout, qn, what);
    /* float32 softmax and sums in another order, device expf: ~1e-6 typical. */
    expect_close(got, ref, qn, TOL_F32_SUM, what);

    cuda_free(dk);
    cuda_free(dv);
    cuda_free(dq);
    cuda_free(dlen);
    cuda_free(dout);
    free(got);
    free(ref);
    free(q);
    free(kb);
    free(vb);
    free(kf);
    free(vf);
}

static void test_attention_release(void **state)
{
    (void)state;
    const struct att_case cases[] = {
        {2, 32, 8, 128, 10240, {1, 1000}, CUDA_KV_BF16, 0},     /* LM, CFG pair */
        {2, 32, 8, 128, 10240, {5000, 10240}, CUDA_KV_BF16, 0},
        {2, 32, 8, 128, 10240, {10240, 257}, CUDA_KV_F32, 0},
        {2, 16, 16, 256, 16, {8, 3}, CUDA_KV_BF16, 0},          /* depth decoder */
        {2, 16, 16, 256, 16, {1, 16}, CUDA_KV_F32, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_attention(&cases[i]);
}

static void test_attention_odd(void **state)
{
    (void)state;
    const struct att_case cases[] = {
        {3, 12, 4, 64, 600, {0, 257, 513}, CUDA_KV_F32, 0},  /* group 3, empty cache -> zeros */
        {3, 12, 4, 64, 600, {600, 1, 255}, CUDA_KV_BF16, 0},
        {2, 16, 2, 32, 300, {300, 33}, CUDA_KV_BF16, 0},    /* group 8 */
        {1, 6, 6, 128, 2000, {1999}, CUDA_KV_F32, 0},
        {2, 32, 8, 128, 3000, {3000, 2999}, CUDA_KV_BF16, 64},   /* forced chunks: many splits */
        {2, 32, 8, 128, 3000, {1, 2100}, CUDA_KV_BF16, 2048},    /* ... few, one partly empty */
        {2, 16, 16, 256, 700, {700, 65}, CUDA_KV_BF16, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_attention(&cases[i]);
}

/* Both combine kernels (the staged one is the default above 4 splits, the per-split one
 * below), each forced for every split count: 16 splits (a CFG pair), 2 with one chunk
 * partly empty, 47 (more than a warp's lanes), an empty cache (zeros). */
static void test_attention_combine_kernels(void **state)
{
    (void)state;
    const struct att_case cases[] = {
        {2, 32, 8, 128, 10240, {1, 1000}, CUDA_KV_BF16, 0},
        {2, 32, 8, 128, 3000, {1, 2100}, CUDA_KV_BF16, 2048},
        {2, 32, 8, 128, 3000, {3000, 2999}, CUDA_KV_BF16, 64},
        {3, 12, 4, 64, 600, {0, 257, 513}, CUDA_KV_F32, 0},
    };
    for (int mode = 1; mode <= 2; mode++) {
        assert_int_equal(cuda_ops_attention_set_combine(mode), 0);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            check_attention(&cases[i]);
    }
    assert_int_equal(cuda_ops_attention_set_combine(0), 0);
    assert_int_equal(cuda_ops_attention_set_combine(3), -EINVAL);
}

/* cuda_ops_attention_decode_qkv against the chain it replaces, on the CPU: q and k
 * heads normed (op_rmsnorm) and rotated (op_rope) at pos, k and v stored at pos of
 * the sequence's cache row (rounded to the cache's type), op_attention over kv_len.
 * pad: the last sequence is a graph padding token (pos past its kv_len of 1). The
 * call runs on a poisoned output with stream-ordered partials, then with a workspace
 * of the caller (as the graphs do). */
struct att_qkv_case {
    int n_seq, n_heads, n_kv_heads, head_dim, rotary_dim, with_norm, max_len;
    int kv_len[3];
    int pad;
    enum cuda_kv_dtype dtype;
};

static void check_attention_qkv(const struct att_qkv_case *c)
{
    char what[160];
    snprintf(what, sizeof what, "attention_decode_qkv %s seqs=%d heads=%d/%d hd=%d rot=%d%s len=%d,%d%s",
             c->dtype == CUDA_KV_BF16 ? "bf16" : "f32", c->n_seq, c->n_heads, c->n_kv_heads, c->head_dim,
             c->rotary_dim, c->with_norm ? "" : " no-norm", c->kv_len[0], c->n_seq > 1 ? c->kv_len[1] : -1,
             c->pad ? " +pad" : "");
    const int D = c->head_dim, QD = c->n_heads * D, KD = c->n_kv_heads * D, S = c->n_seq;
    const size_t row = (size_t)KD + 8, seq = (size_t)(c->max_len + 1) * row, n_cache = seq * S;
    const size_t qkv_stride = (size_t)QD + 2 * KD + 5;
    float *kf, *vf;
    uint16_t *kb = rnd_bf16(n_cache, 2.0f, &kf), *vb = rnd_bf16(n_cache, 1.0f, &vf);
    float *qkv = rnd_array(S * qkv_stride, 3.0f), *qn = rnd_array(D, 1.5f), *kn = rnd_array(D, 1.5f);
    float *inv_freq = malloc(sizeof(float) * (c->rotary_dim / 2 + 1));
    float *ref = malloc(sizeof(float) * (size_t)S * QD), *qr = malloc(sizeof(float) * qkv_stride);
    int pos[3], seq_row[3];
    assert_true(inv_freq && ref && qr);
    op_rope_inv_freq(inv_freq, 1e6, c->rotary_dim);
    if (c->dtype == CUDA_KV_F32) /* the float cache holds any float: not only bf16 values */
        for (size_t i = 0; i < n_cache; i++) kf[i] += 1e-3f * rnd(1.0f), vf[i] += 1e-3f * rnd(1.0f);
    float *kf0 = malloc(sizeof(float) * n_cache), *vf0 = malloc(sizeof(float) * n_cache);
    assert_true(kf0 && vf0);
    memcpy(kf0, kf, sizeof(float) * n_cache), memcpy(vf0, vf, sizeof(float) * n_cache);
    int len[3];
    for (int s = 0; s < S; s++) {
        const int pad = c->pad && s == S - 1;
        len[s] = pad ? 1 : c->kv_len[s];
        pos[s] = pad ? c->max_len : len[s] - 1;
        seq_row[s] = S - 1 - s;
        memcpy(qr, qkv + s * qkv_stride, sizeof(float) * qkv_stride);
        if (c->with_norm) {
            op_rmsnorm(qr, qr, qn, c->n_heads, D, 1e-6f);
            op_rmsnorm(qr + QD, qr + QD, kn, c->n_kv_heads, D, 1e-6f);
        }
        op_rope(qr, 1, QD + KD, c->n_heads + c->n_kv_heads, D, c->rotary_dim, &pos[s], inv_freq);
        size_t at = (size_t)seq_row[s] * seq + (size_t)pos[s] * row;
        for (int i = 0; i < KD; i++) {
            float k = qr[QD + i], v = qr[QD + KD + i];
            if (c->dtype == CUDA_KV_BF16) k = mm3_bf16_to_f32(mm3_f32_to_bf16(k)), v = mm3_bf16_to_f32(mm3_f32_to_bf16(v));
            kf[at + i] = k, vf[at + i] = v;
        }
        const struct attention_heads h = {c->n_heads, c->n_kv_heads, D, 1.0f / sqrtf((float)D)};
        op_attention(&(struct attention_rows){.out = ref + (size_t)s * QD,
                                              .out_stride = QD,
                                              .q = qr,
                                              .q_stride = QD,
                                              .k = kf + (size_t)seq_row[s] * seq,
                                              .v = vf + (size_t)seq_row[s] * seq,
                                              .kv_stride = (int)row,
                                              .n_q = 1,
                                              .n_kv = len[s],
                                              .causal = 1,
                                              .q_pos0 = len[s] - 1},
                     &h);
    }

    const size_t elem = c->dtype == CUDA_KV_BF16 ? 2 : 4;
    void *dk = c->dtype == CUDA_KV_BF16 ? dev_upload(kb, 2 * n_cache) : dev_upload(kf0, 4 * n_cache);
    void *dv = c->dtype == CUDA_KV_BF16 ? dev_upload(vb, 2 * n_cache) : dev_upload(vf0, 4 * n_cache);
    float *dqkv = dev_upload(qkv, sizeof(float) * S * qkv_stride), *dqn = dev_upload(qn, sizeof(float) * D);
    float *dkn = dev_upload(kn, sizeof(float) * D), *dfreq = dev_upload(inv_freq, sizeof(float) * (c->rotary_dim / 2 + 1));
    int *dlen = dev_upload(len, sizeof(int) * S), *dpos = dev_upload(pos, sizeof(int) * S);
    int *drow = dev_upload(seq_row, sizeof(int) * S);
    size_t ws_bytes = cuda_ops_attention_decode_workspace_bytes(S, c->n_heads, c->n_kv_heads, D, c->max_len);
    void *ws = NULL;
    assert_int_equal(cuda_malloc(&ws, ws_bytes), 0);
    struct cuda_qkv_prep prep = {c->with_norm ? dqn : NULL, c->with_norm ? dkn : NULL, 1e-6f, c->rotary_dim, dfreq, dpos};
    float *dout_inner, *dout = dev_guarded((size_t)S * QD, &dout_inner);
    /* The same k/v stored again at the same places each run: partials in stream-ordered
     * memory, then twice in the caller's workspace, with the same bits each time. */
    float *first = NULL;
    for (int run = 0; run < 3; run++) {
        assert_int_equal(cuda_memset(dout_inner, 0xff, sizeof(float) * (size_t)S * QD), 0);
        const struct cuda_attention_decode a = {.out = dout_inner,
                                                .q = dqkv,
                                                .q_stride = qkv_stride,
                                                .kv = {dk, dv, c->dtype, seq, row},
                                                .kv_len = dlen,
                                                .seq_row = drow,
                                                .n_seq = S,
                                                .max_kv_len = c->max_len,
                                                .heads = {c->n_heads, c->n_kv_heads, D, 1.0f / sqrtf((float)D)},
                                                .workspace = run ? ws : NULL,
                                                .workspace_bytes = run ? ws_bytes : 0};
        int rc = cuda_ops_attention_decode_qkv(&a, &prep, NULL);
        if (rc) fail_msg("%s: %s", what, mm3_last_error());
        float *got = dev_fetch_checked(dout, (size_t)S * QD, what);
        expect_close(got, ref, (size_t)S * QD, TOL_F32_SUM, what);
        if (!first)
            first = got;
        else {
            if (memcmp(got, first, sizeof(float) * (size_t)S * QD))
                fail_msg("%s: run %d (workspace) differs from run 0's bits", what, run);
            free(got);
        }
    }
    free(first);
    /* The cache: the new k/v rows as the reference stored them, nothing else touched. */
    void *hk = malloc(elem * n_cache), *hv = malloc(elem * n_cache);
    float *gk = malloc(sizeof(float) * KD), *gv = malloc(sizeof(float) * KD);
    assert_true(hk && hv && gk && gv);
    assert_int_equal(cuda_memcpy_d2h(hk, dk, elem * n_cache), 0);
    assert_int_equal(cuda_memcpy_d2h(hv, dv, elem * n_cache), 0);
    for (int s = 0; s < S; s++) {
        size_t at = (size_t)seq_row[s] * seq + (size_t)pos[s] * row;
        for (int i = 0; i < KD; i++) {
            gk[i] = elem == 2 ? mm3_bf16_to_f32(((uint16_t *)hk)[at + i]) : ((float *)hk)[at + i];
            gv[i] = elem == 2 ? mm3_bf16_to_f32(((uint16_t *)hv)[at + i]) : ((float *)hv)[at + i];
        }
        expect_close(gk, kf + at, KD, elem == 2 ? 2e-3 : TOL_F32_TRIG, "  new k row");
        expect_close(gv, vf + at, KD, 0.0, "  new v row");
    }
    size_t changed = 0;
    for (size_t i = 0; i < n_cache; i++) {
        int same_k = elem == 2 ? ((uint16_t *)hk)[i] == kb[i] : ((float *)hk)[i] == kf0[i];
        int same_v = elem == 2 ? ((uint16_t *)hv)[i] == vb[i] : ((float *)hv)[i] == vf0[i];
        changed += !same_k || !same_v;
    }
    assert_true(changed <= (size_t)S * KD); /* only the new rows (a value may round to itself) */

    cuda_free(dk), cuda_free(dv), cuda_free(dqkv), cuda_free(dqn), cuda_free(dkn), cuda_free(dfreq);
    cuda_free(dlen), cuda_free(dpos), cuda_free(drow), cuda_free(ws), cuda_free(dout);
    free(hk), free(hv), free(gk), free(gv), free(kf0), free(vf0), free(ref), free(qr), free(inv_freq);
    free(qkv), free(qn), free(kn), free(kb), free(vb), free(kf), free(vf);
}

static void test_attention_qkv(void **state)
{
    (void)state;
    const struct att_qkv_case cases[] = {
        {2, 32, 8, 128, 128, 1, 10240, {1, 1000}, 0, CUDA_KV_BF16},  /* LM, CFG pair */
        {3, 32, 8, 128, 128, 1, 6000, {5000, 4097}, 1, CUDA_KV_BF16}, /* + a graph padding token */
        {3, 12, 4, 64, 32, 1, 700, {700, 65}, 1, CUDA_KV_F32},        /* partial rotary, group 3 */
        {3, 12, 4, 64, 32, 1, 700, {700, 65}, 1, CUDA_KV_BF16},       /* ... on the tensor-core kernel */
        {2, 16, 16, 256, 128, 0, 300, {300, 2}, 0, CUDA_KV_BF16},     /* no norm, group 1 */
        {2, 16, 2, 32, 32, 1, 200, {129, 64}, 0, CUDA_KV_F32},        /* group 8 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_attention_qkv(&cases[i]);
}

static void test_attention_bad_args(void **state)
{
    (void)state;
    int dummy[4] = {0, 0, 0, 0};
    /* one sequence, cache rows of 1024 positions x 8 kv heads x 128 */
    const struct cuda_attention_decode good = {.kv = {dummy, dummy, CUDA_KV_BF16, 1024 * 1024, 1024},
                                               .n_seq = 1,
                                               .max_kv_len = 1,
                                               .heads = {32, 8, 128, 1.0f}};
    struct cuda_attention_decode a = good;
    assert_int_equal(cuda_ops_attention_decode(NULL, NULL), -EINVAL);
    a.heads.head_dim = 96;
    assert_int_equal(cuda_ops_attention_decode(&a, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "head_dim"));
    a = good;
    a.chunk_positions = 100;
    assert_int_equal(cuda_ops_attention_decode(&a, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "chunk"));
    a = good;
    a.heads.n_kv_heads = 3;
    assert_int_equal(cuda_ops_attention_decode(&a, NULL), -EINVAL);
    a = good;
    a.kv.row_stride = 100;
    assert_int_equal(cuda_ops_attention_decode(&a, NULL), -EINVAL);
    a = good;
    a.q_stride = 6144;
    assert_int_equal(cuda_ops_attention_decode_qkv(&a, NULL, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "prep"));
    struct cuda_qkv_prep prep = {NULL, NULL, 1e-6f, 127, NULL, dummy};
    assert_int_equal(cuda_ops_attention_decode_qkv(&a, &prep, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "rotary_dim"));
    prep.rotary_dim = 128;
    a.q_stride = 4096;
    assert_int_equal(cuda_ops_attention_decode_qkv(&a, &prep, NULL), -EINVAL); /* a q|k|v row is 6144 floats */
    assert_non_null(strstr(mm3_last_error(), "q|k|v"));
}

/* ---- LoRA deltas, rows with different adapters ------------------------------------ */

/* Adapter slots of check_lora: slot 0 adapts every target at rank r0, slot 1 only the
 * first at rank r1, slot 2 is empty; rows cycle through none, 0, 1, 0, 2. */
static void check_lora(int n, int in, int n_targets, const int *out, const int *offset, int step, int r0, int r1,
                       const char *what)
{
    int y_stride = 0;
    for (int j = 0; j < n_targets; j++) {
        int end = offset[j] + (out[j] - 1) * step + 1;
        if (end > y_stride) y_stride = end;
    }
    struct cuda_lora l = {.rank = {r0, r1}, .scale = {0.75f, -1.5f}, .n_targets = n_targets, .in = in};
    l.rank_max = r0 > r1 ? r0 : r1;
    float *ha[2][CUDA_LORA_TARGETS] = {{0}}, *hb[2][CUDA_LORA_TARGETS] = {{0}};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < n_targets; j++) {
            int r = l.rank[k];
            if (k == 1 && j > 0) break;
            ha[k][j] = rnd_array((size_t)r * in, 0.5f);
            hb[k][j] = rnd_array((size_t)out[j] * r, 0.5f);
            l.target[j].a[k] = dev_upload(ha[k][j], sizeof(float) * r * in);
            float *bt = malloc(sizeof(float) * out[j] * r); /* the kernel reads B transposed */
            assert_non_null(bt);
            for (int o = 0; o < out[j]; o++)
                for (int q = 0; q < r; q++)
                    bt[(size_t)q * out[j] + o] = hb[k][j][(size_t)o * r + q];
            l.target[j].bt[k] = dev_upload(bt, sizeof(float) * out[j] * r);
            free(bt);
        }
    for (int j = 0; j < n_targets; j++) {
        l.target[j].out = out[j];
        l.target[j].y_offset = offset[j];
        l.target[j].y_step = step;
    }
    static const int cycle[5] = {-1, 0, 1, 0, 2};
    int *adapter = malloc(sizeof(int) * n);
    float *x = rnd_array((size_t)n * in, 1.0f), *y0 = rnd_array((size_t)n * y_stride + 2 * GUARD, 1.0f);
    float *ref = malloc(sizeof(float) * ((size_t)n * y_stride + 2 * GUARD));
    float *t = malloc(sizeof(float) * l.rank_max), *delta = malloc(sizeof(float) * (size_t)y_stride);
    assert_true(adapter && ref && t && delta);
    memcpy(ref, y0, sizeof(float) * ((size_t)n * y_stride + 2 * GUARD));
    for (int i = 0; i < n; i++) {
        int k = adapter[i] = cycle[i % 5];
        for (int j = 0; k >= 0 && k < 2 && j < n_targets; j++) {
            if (!ha[k][j]) continue;
            memset(delta, 0, sizeof(float) * out[j]);
            op_lora_down(t, x + (size_t)i * in, ha[k][j], 1, in, l.rank[k]);
            op_lora_up(delta, t, hb[k][j], l.scale[k], 1, l.rank[k], out[j]);
            for (int o = 0; o < out[j]; o++)
                ref[GUARD + (size_t)i * y_stride + offset[j] + (size_t)o * step] += delta[o];
        }
    }
    float *dy = dev_upload(y0, sizeof(float) * ((size_t)n * y_stride + 2 * GUARD));
    l.n_rows = n;
    l.adapter = dev_upload(adapter, sizeof(int) * n);
    l.x = dev_upload(x, sizeof(float) * n * in);
    l.x_stride = in;
    l.y = dy + GUARD;
    l.y_stride = y_stride;
    assert_int_equal(cuda_malloc((void **)&l.t, sizeof(float) * n * n_targets * l.rank_max), 0);
    assert_int_equal(cuda_ops_lora_down(&l, NULL), 0);
    assert_int_equal(cuda_ops_lora_up(&l, NULL), 0);
    assert_int_equal(cuda_stream_sync(NULL), 0);
    size_t total = (size_t)n * y_stride + 2 * GUARD;
    float *got = malloc(sizeof(float) * total);
    assert_non_null(got);
    assert_int_equal(cuda_memcpy_d2h(got, dy, sizeof(float) * total), 0);
    /* Guards and the rows without a delta (no adapter, the empty slot) are untouched
     * bit for bit; elsewhere the deltas agree within float32 summation order. */
    for (size_t e = 0; e < total; e++) {
        size_t row = e < GUARD ? 0 : (e - GUARD) / (size_t)y_stride;
        int untouched = e < GUARD || e >= total - GUARD || adapter[row] < 0 || adapter[row] >= 2;
        if (untouched && memcmp(&got[e], &y0[e], 4) != 0) fail_msg("%s: element %zu changed", what, e);
        got[e] -= y0[e];
        ref[e] -= y0[e];
    }
    expect_close(got, ref, total, TOL_F32_SUM, what);
    double moved = 0;
    for (size_t e = 0; e < total; e++)
        moved += fabs(ref[e]);
    assert_true(moved > 0); /* the deltas are there to compare */
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < n_targets; j++) {
            cuda_free((void *)l.target[j].a[k]), cuda_free((void *)l.target[j].bt[k]);
            free(ha[k][j]), free(hb[k][j]);
        }
    cuda_free((void *)l.adapter), cuda_free((void *)l.x), cuda_free(l.t), cuda_free(dy);
    free(adapter), free(x), free(y0), free(ref), free(t), free(delta), free(got);
}

static void test_lora(void **state)
{
    (void)state;
    /* q|k|v of the release talker in one fused row, ranks 16 and 64 */
    const int qkv_out[3] = {4096, 1024, 1024}, qkv_off[3] = {0, 4096, 5120};
    check_lora(10, 4096, 3, qkv_out, qkv_off, 1, 16, 8, "lora q|k|v 10 rows x 4096, ranks 16/8");
    check_lora(3, 4096, 3, qkv_out, qkv_off, 1, 64, 64, "lora q|k|v 3 rows x 4096, ranks 64/64");
    /* gate|up interleaved and a lone down product */
    const int gu_out[2] = {12288, 12288}, gu_off[2] = {0, 1}, down_out[1] = {4096}, zero[1] = {0};
    check_lora(5, 4096, 2, gu_out, gu_off, 2, 16, 32, "lora gate|up interleaved 5 rows, ranks 16/32");
    check_lora(7, 12288, 1, down_out, zero, 1, 16, 4, "lora down 7 rows x 12288, ranks 16/4");
    /* odd widths */
    const int odd_out[3] = {5, 3, 7}, odd_off[3] = {0, 5, 8};
    check_lora(6, 37, 3, odd_out, odd_off, 1, 3, 1, "lora odd 6 rows x 37, ranks 3/1");
}

static void test_lora_bad_args(void **state)
{
    (void)state;
    float buf[4];
    int ad[1] = {0};
    struct cuda_lora l = {.rank = {4},
                          .rank_max = 4,
                          .n_targets = 1,
                          .in = 4,
                          .n_rows = 1,
                          .adapter = ad,
                          .x = buf,
                          .t = buf,
                          .y = buf,
                          .y_stride = 1};
    l.target[0].out = 1;
    l.target[0].y_step = 1;
    l.n_targets = 0;
    assert_int_equal(cuda_ops_lora_down(&l, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "targets"));
    l.n_targets = 1;
    l.rank[1] = 5; /* above rank_max */
    assert_int_equal(cuda_ops_lora_up(&l, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "slot 1 has rank 5"));
    l.rank[1] = 0;
    l.rank_max = CUDA_LORA_MAX_RANK + 1;
    assert_int_equal(cuda_ops_lora_down(&l, NULL), -EINVAL);
    l.rank_max = 4;
    l.target[0].y_step = 0;
    assert_int_equal(cuda_ops_lora_up(&l, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "step 0"));
}

static void test_device_helpers(void **state)
{
    (void)state;
    char desc[256];
    assert_int_equal(cuda_device_describe(desc, sizeof desc), 0);
    printf("  device: %s\n", desc);
    void *p = NULL;
    /* An absurd allocation fails with a message instead of aborting. */
    assert_int_equal(cuda_malloc(&p, (size_t)1 << 60), -ENOMEM);
    assert_null(p);
    assert_non_null(strstr(mm3_last_error(), "cudaMalloc"));
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
        cmocka_unit_test(test_device_helpers),
        cmocka_unit_test(test_matmul_bad_args),
        cmocka_unit_test(test_matmul_odd_shapes),
        cmocka_unit_test(test_matmul_release_shapes),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_qk_norm_rope),
        cmocka_unit_test(test_qk_norm_rope_bad_args),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_gemv_fused),
        cmocka_unit_test(test_gemv_chain),
        cmocka_unit_test(test_attention_release),
        cmocka_unit_test(test_attention_odd),
        cmocka_unit_test(test_attention_combine_kernels),
        cmocka_unit_test(test_attention_qkv),
        cmocka_unit_test(test_attention_bad_args),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_lora_bad_args),
    };
    /* One test alone (e.g. on the device): MM3_TEST_FILTER=test_gemv_fused */
    const char *filter = getenv("MM3_TEST_FILTER");
    if (filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
    printf("built without CUDA (MM3_HAVE_CUDA undefined): skipped\n");
    return 77;
}

#endif
