/* The CUDA vocoder (stage1/cuda/vocoder_cuda.h) against the CPU one (stage1/vocoder.h),
 * in each matmul precision.
 *
 * Bounds (relative RMS error against the CPU, test_rel_error):
 *   fp32: 1e-5 everywhere: float32 GEMMs, only the summation order differs (~1e-6).
 *   tf32: operands rounded to 11 significant bits (unit roundoff 2^-11, ~2.8e-4 RMS per
 *     product for round-to-nearest, up to ~2x if a kernel truncates): one layer <= 3e-3; a whole
 *     decode (~30 layers) measured 2.3e-4 .. 1.5e-3 with the earlier round-to-nearest
 *     TF32 kernel, bound 1e-2.
 *   bf16: operands rounded to 8 significant bits (unit roundoff 2^-8, 8x TF32's 2^-11):
 *     one layer ~2.2e-3 RMS, bound 6e-3; a decode ~8x the TF32 figures (~2e-3 .. 1.2e-2),
 *     bound 4e-2.
 *   conv_out (float32 in every precision) and the Snake inside the gathers: 1e-5.
 * 1. Each layer at the release's channel counts (short T), all three precisions, with
 *    and without the Snake in front: conv1d k7 at dilations 1/3/9, k1, conv_in
 *    (1024 -> 1536), dec_in_proj; the transposed conv at every release stride; conv_out;
 *    odd sizes that leave partial tiles and a conv whose taps fall outside T = 3.
 * 2. Whole decodes: tiny-a (case0 window 0 latents), test/data/vocoder/geom-b
 *    (diffusers-made, strides 2,4,2) and a release-shaped random vocoder (1024 -> 1536
 *    -> 768 -> 384 -> 192 -> 96, ratios 8,8,4,2; the CPU reference costs ~0.7 s per
 *    latent and track, so L = 6). Each handle is created for max_L = L and then also
 *    decodes L = 1 and L - 3 (shorter windows reuse the buffers and meet new GEMM shapes
 *    after autotuning is off), each against the CPU; bad lengths are refused; a vocoder
 *    whose weights were dropped is refused.
 * 3. MM3_TEST_VOCODER_BENCH=1: also the release window timing (L = 689, median of 10)
 *    per precision, printed as "vocoder_cuda bench:" lines.
 * Exit 77 without CUDA compiled in or without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "support/test_rand.h"
#include "support/test_support.h"

#ifdef MM3_HAVE_CUDA
#include "common/ckpt_gen.h"
#include "common/cuda/ops_cuda.h"
#include "common/ops_conv.h"
#include "common/safetensors.h"
#include "stage1/cuda/dit_kernels.h"
#include "stage1/cuda/vocoder_cuda.h"
#include "stage1/cuda/vocoder_cuda_internal.h"
#include "stage1/render.h"
#include "stage1/vocoder.h"

#define N_PRECS 4
static const enum mm3_matmul_precision precs[N_PRECS] = {MM3_MATMUL_FP32, MM3_MATMUL_TF32, MM3_MATMUL_BF16,
                                                         MM3_MATMUL_FP16};
/* fp16 keeps tf32's operand mantissa */
static const double tol_layer[N_PRECS] = {1e-5, 3e-3, 6e-3, 3e-3};
static const double tol_decode[N_PRECS] = {1e-5, 1e-2, 4e-2, 1e-2};
#define TOL_F32 1e-5

static uint64_t rng = 0x5eed5eedull;

/* ---- 1. layers ---- */

/* Snake alphas like a trained vocoder's (positive, ~0.5 .. 2). */
static float *rand_alpha(int c)
{
    float *a = test_rand_array(&rng, (size_t)c, 0.75f);
    for (int i = 0; i < c; i++)
        a[i] += 1.25f;
    return a;
}

/* ref[it] = op_conv1d(op_snake(x[it])) or without the Snake. */
static void ref_conv1d(float *ref, const float *x, const float *alpha, const float *w, const float *b, int batch,
                       const struct conv1d_geometry *g)
{
    int c_in = g->c_in, t = g->t;
    size_t nx = (size_t)c_in * t, ny = (size_t)g->c_out * t;
    float *s = malloc(sizeof(float) * nx);
    for (int it = 0; it < batch; it++) {
        const float *xi = x + it * nx;
        if (alpha) {
            op_snake(s, xi, alpha, c_in, t);
            xi = s;
        }
        op_conv1d(ref + it * ny, xi, w, b, g);
    }
    free(s);
}

static void check_conv1d(int batch, int c_in, int c_out, int t, int k, int dil, int snake)
{
    size_t nx = (size_t)c_in * t, ny = (size_t)c_out * t;
    float *x = test_rand_array(&rng, batch * nx, 1.0f),
          *w = test_rand_array(&rng, (size_t)c_out * c_in * k, 1.0f / sqrtf((float)c_in * k));
    float *b = test_rand_array(&rng, c_out, 0.1f), *alpha = snake ? rand_alpha(c_in) : NULL;
    float *y = malloc(sizeof(float) * batch * ny), *ref = malloc(sizeof(float) * batch * ny);
    struct conv1d_geometry g = {
        .c_in = c_in, .c_out = c_out, .t = t, .k = k, .dilation = dil, .stride = 1, .pad = dil * (k - 1) / 2};
    ref_conv1d(ref, x, alpha, w, b, batch, &g);
    for (int p = 0; p < N_PRECS; p++) {
        memset(y, 0xff, sizeof(float) * batch * ny); /* NaN: every output must be written */
        int rc = vocoder_cuda_conv1d_host(y, x, alpha, w, b, batch, &g, precs[p]);
        if (rc < 0) fail_msg("vocoder_cuda_conv1d_host: %s", mm3_last_error());
        double rel = test_rel_error(y, ref, batch * ny);
        printf("conv1d %s%s %d->%d k%d d%d T%d x%d: rel %.3g (bound %.0e)\n", mm3_matmul_precision_name(precs[p]),
               snake ? " +snake" : "", c_in, c_out, k, dil, t, batch, rel, tol_layer[p]);
        assert_true(rel <= tol_layer[p]);
    }
    free(x), free(w), free(b), free(alpha), free(y), free(ref);
}

static void test_conv1d(void **state)
{
    (void)state;
    for (int d = 1; d <= 9; d *= 3)
        check_conv1d(2, 768, 768, 150, 7, d, 1);
    check_conv1d(2, 96, 96, 1000, 7, 9, 1);
    check_conv1d(2, 384, 384, 300, 1, 1, 1);  /* conv2 */
    check_conv1d(2, 1024, 1536, 40, 7, 1, 0); /* conv_in */
    check_conv1d(2, 64, 1024, 33, 1, 1, 0);   /* dec_in_proj */
    check_conv1d(1, 5, 3, 3, 7, 9, 1);        /* taps all outside but the middle */
    check_conv1d(3, 17, 70, 131, 3, 2, 1);    /* partial tiles everywhere */
    check_conv1d(2, 200, 72, 45, 7, 3, 1);    /* > 128 channels: gathered in chunks of 64 */
}

static void check_conv_t(int batch, int c_in, int c_out, int t_in, int s, int snake)
{
    int k = 2 * s, t_out = op_conv_transpose1d_out_len(t_in, k, s, (s + 1) / 2);
    struct conv1d_geometry g = {
        .c_in = c_in, .c_out = c_out, .t = t_in, .k = k, .dilation = 1, .stride = s, .pad = (s + 1) / 2};
    assert_int_equal(t_out, s * t_in);
    size_t nx = (size_t)c_in * t_in, ny = (size_t)c_out * t_out;
    float *x = test_rand_array(&rng, batch * nx, 1.0f),
          *w = test_rand_array(&rng, (size_t)c_in * c_out * k, 1.0f / sqrtf((float)c_in * 2));
    float *b = test_rand_array(&rng, c_out, 0.1f), *alpha = snake ? rand_alpha(c_in) : NULL;
    float *y = malloc(sizeof(float) * batch * ny), *ref = malloc(sizeof(float) * batch * ny),
          *sx = malloc(sizeof(float) * nx);
    for (int it = 0; it < batch; it++) {
        const float *xi = x + it * nx;
        if (alpha) {
            op_snake(sx, xi, alpha, c_in, t_in);
            xi = sx;
        }
        op_conv_transpose1d(ref + it * ny, xi, w, b, &g);
    }
    for (int p = 0; p < N_PRECS; p++) {
        memset(y, 0xff, sizeof(float) * batch * ny);
        int rc = vocoder_cuda_conv_transpose1d_host(y, x, alpha, w, b, batch, &g, precs[p]);
        if (rc < 0) fail_msg("vocoder_cuda_conv_transpose1d_host: %s", mm3_last_error());
        double rel = test_rel_error(y, ref, batch * ny);
        printf("conv_transpose1d %s%s %d->%d s%d T%d x%d: rel %.3g (bound %.0e)\n", mm3_matmul_precision_name(precs[p]),
               snake ? " +snake" : "", c_in, c_out, s, t_in, batch, rel, tol_layer[p]);
        assert_true(rel <= tol_layer[p]);
    }
    free(x), free(w), free(b), free(alpha), free(y), free(ref), free(sx);
}

static void test_conv_transpose(void **state)
{
    (void)state;
    check_conv_t(2, 1536, 768, 20, 8, 1);
    check_conv_t(2, 768, 384, 60, 8, 1);
    check_conv_t(2, 384, 192, 200, 4, 1);
    check_conv_t(2, 192, 96, 500, 2, 1);
    check_conv_t(1, 7, 5, 1, 6, 0); /* one input sample */
    check_conv_t(3, 33, 65, 129, 2, 1);
}

static void check_conv_out(int batch, int c_in, int t)
{
    int k = 7;
    size_t nx = (size_t)c_in * t;
    float *x = test_rand_array(&rng, batch * nx, 1.0f), *w = test_rand_array(&rng, (size_t)c_in * k, 0.05f);
    float *b = test_rand_array(&rng, 1, 0.1f), *alpha = rand_alpha(c_in);
    float *y = malloc(sizeof(float) * batch * t), *ref = malloc(sizeof(float) * batch * t);
    struct conv1d_geometry g = {
        .c_in = c_in, .c_out = 1, .t = t, .k = k, .dilation = 1, .stride = 1, .pad = (k - 1) / 2};
    ref_conv1d(ref, x, alpha, w, b, batch, &g);
    for (int i = 0; i < batch * t; i++)
        ref[i] = tanhf(ref[i]);
    memset(y, 0xff, sizeof(float) * batch * t);
    if (vocoder_cuda_conv_out_host(y, x, alpha, w, b, batch, &g) < 0)
        fail_msg("vocoder_cuda_conv_out_host: %s", mm3_last_error());
    double rel = test_rel_error(y, ref, (size_t)batch * t);
    printf("conv_out +snake +tanh %d->1 k%d T%d x%d: rel %.3g\n", c_in, k, t, batch, rel);
    assert_true(rel <= TOL_F32);
    free(x), free(w), free(b), free(alpha), free(y), free(ref);
}

static void test_conv_out(void **state)
{
    (void)state;
    check_conv_out(2, 96, 2000); /* release */
    check_conv_out(2, 300, 131); /* channels in 3 chunks, a partial row tile */
    check_conv_out(1, 3, 2);     /* T shorter than the taps */
}

/* A geometry the decode never runs is refused with a message naming the field, before
 * any upload (y stays untouched). */
static void test_geometry_refused(void **state)
{
    (void)state;
    float x[8] = {0}, w[16] = {0}, b[2] = {0}, y[8] = {7};
    struct conv1d_geometry even_k = {.c_in = 1, .c_out = 1, .t = 8, .k = 2, .dilation = 1, .pad = 0};
    assert_int_equal(vocoder_cuda_conv1d_host(y, x, NULL, w, b, 1, &even_k, MM3_MATMUL_FP32), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "k 2"));
    struct conv1d_geometry bad_pad = {.c_in = 1, .c_out = 1, .t = 8, .k = 3, .dilation = 2, .pad = 1};
    assert_int_equal(vocoder_cuda_conv1d_host(y, x, NULL, w, b, 1, &bad_pad, MM3_MATMUL_FP32), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "pad 1, expected 2"));
    struct conv1d_geometry bad_k = {.c_in = 1, .c_out = 1, .t = 4, .k = 3, .stride = 2, .pad = 1};
    assert_int_equal(vocoder_cuda_conv_transpose1d_host(y, x, NULL, w, b, 1, &bad_k, MM3_MATMUL_FP32), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "k = 2 * stride"));
    struct conv1d_geometry two_out = {.c_in = 1, .c_out = 2, .t = 8, .k = 3, .dilation = 1, .pad = 1};
    assert_int_equal(vocoder_cuda_conv_out_host(y, x, NULL, w, b, 1, &two_out), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "c_out 2, expected 1"));
    assert_true(y[0] == 7.0f);
}

/* ---- 2. whole decodes ---- */

/* The first L latents of each channel of lat [C, L_full]. */
static float *latents_prefix(const float *lat, int c, int L_full, int L)
{
    float *p = malloc(sizeof(float) * (size_t)c * L);
    for (int i = 0; i < c; i++)
        memcpy(p + (size_t)i * L, lat + (size_t)i * L_full, sizeof(float) * L);
    return p;
}

/* GPU (created for max_L = L) vs CPU at L, 1 and L - 3, in every precision; returns the
 * worst fp32 relative error. */
static double compare_decode(const char *what, const char *root, const float *lat, int L)
{
    struct vocoder *v;
    if (vocoder_load(&v, root) < 0) fail_msg("vocoder_load %s: %s", root, mm3_last_error());
    int hop = vocoder_hop(v), c = vocoder_latent_channels(v);
    int lens[3] = {L, 1, L - 3}, n_lens = L > 4 ? 3 : 2;
    float *ref[3], *in[3];
    for (int i = 0; i < n_lens; i++) {
        in[i] = latents_prefix(lat, c, L, lens[i]);
        ref[i] = malloc(sizeof(float) * 2 * hop * lens[i]);
        assert_int_equal(vocoder_decode(v, in[i], lens[i], ref[i]), 0);
        /* the tails are not all zero (a broken last stage would still pass on zeros) */
        double e = 0;
        for (size_t j = 0; j < 2 * (size_t)hop * lens[i]; j++)
            e += (double)ref[i][j] * ref[i][j];
        assert_true(e > 0);
    }
    float *pcm = malloc(sizeof(float) * 2 * hop * L);
    double worst_fp32 = 0;
    for (int p = 0; p < N_PRECS; p++) {
        struct vocoder_cuda *h;
        if (vocoder_cuda_create(&h, v, precs[p], L) < 0) fail_msg("vocoder_cuda_create %s: %s", root, mm3_last_error());
        assert_int_equal(vocoder_cuda_hop(h), hop);
        assert_int_equal(vocoder_cuda_latent_channels(h), c);
        assert_int_equal(vocoder_cuda_max_L(h), L);
        assert_int_equal(vocoder_cuda_precision(h), precs[p]);
        /* through the render decoder, as the renderer calls it */
        struct render_decoder dec;
        assert_int_equal(vocoder_cuda_render_decoder(h, &dec), 0);
        assert_int_equal(dec.hop, hop);
        for (int i = 0; i < n_lens; i++) {
            size_t n = 2 * (size_t)hop * lens[i];
            memset(pcm, 0xff, sizeof(float) * n);
            if (dec.decode(dec.ctx, in[i], lens[i], pcm) < 0) fail_msg("decode: %s", mm3_last_error());
            double rel = test_rel_error(pcm, ref[i], n);
            printf("%s: L %d (max_L %d), hop %d, %s: rel %.3g (bound %.0e)\n", what, lens[i], L, hop,
                   mm3_matmul_precision_name(precs[p]), rel, tol_decode[p]);
            assert_true(rel <= tol_decode[p]);
            if (p == 0 && rel > worst_fp32) worst_fp32 = rel;
        }
        assert_int_equal(vocoder_cuda_decode(h, in[0], 0, pcm), -EINVAL);
        assert_int_equal(vocoder_cuda_decode(h, in[0], L + 1, pcm), -EINVAL);
        vocoder_cuda_free(h);
    }
    /* a vocoder whose host weights were dropped cannot be uploaded again */
    vocoder_drop_weights(v);
    struct vocoder_cuda *h = NULL;
    assert_int_equal(vocoder_cuda_create(&h, v, MM3_MATMUL_FP32, L), -ENODATA);
    assert_null(h);
    for (int i = 0; i < n_lens; i++)
        free(in[i]), free(ref[i]);
    free(pcm);
    vocoder_free(v);
    return worst_fp32;
}

static void test_tiny_a(void **state)
{
    (void)state;
    const char *g = test_golden_dir();
    if (!g) skip();
    char root[1024], path[1024];
    snprintf(root, sizeof root, "%s/checkpoint", g);
    snprintf(path, sizeof path, "%s/case0.safetensors", g);
    struct st_file sf, *f = &sf;
    assert_int_equal(st_file_open(f, path), 0);
    float *lat;
    int nd;
    int64_t shp[ST_MAX_DIMS];
    assert_int_equal(st_file_load_f32(f, "window.0.latents", &lat, &nd, shp), 0);
    assert_int_equal(nd, 2);
    assert_true(compare_decode("tiny-a case0 window 0", root, lat, (int)shp[1]) <= TOL_F32);
    free(lat);
    st_file_close(f);
}

static void test_geom_b(void **state)
{
    (void)state;
    char root[1024], path[1024];
    snprintf(root, sizeof root, "%s/test/data/vocoder/geom-b", test_source_dir());
    snprintf(path, sizeof path, "%s/test/data/vocoder/geom-b/io.safetensors", test_source_dir());
    struct st_file sf, *f = &sf;
    if (st_file_open(f, path) < 0) skip();
    float *lat;
    int nd;
    int64_t shp[ST_MAX_DIMS];
    assert_int_equal(st_file_load_f32(f, "latents", &lat, &nd, shp), 0);
    assert_true(compare_decode("geom-b", root, lat, (int)shp[1]) <= TOL_F32);
    free(lat);
    st_file_close(f);
}

/* Latents beyond fp16's range overflow the fp16 operands to inf: the decode is rerun
 * with scaled operands, counted, and matches the CPU. Plain latents are held to the fp16
 * bound; latents near 1e5 to a looser one, because the Snake's sin^2 of arguments that
 * large turns any operand rounding into a different phase (a missing or doubled scale
 * still gives rel ~1, and inf/NaN fails outright). */
#define TOL_DECODE_FP16_HUGE 5e-2
static void test_fp16_rescue(void **state)
{
    (void)state;
    const char *g = test_golden_dir();
    if (!g) skip();
    char root[1024];
    snprintf(root, sizeof root, "%s/checkpoint", g);
    struct vocoder *v;
    if (vocoder_load(&v, root) < 0) fail_msg("vocoder_load: %s", mm3_last_error());
    int L = 24, hop = vocoder_hop(v), c = vocoder_latent_channels(v);
    size_t n = 2 * (size_t)hop * L;
    float *ref = malloc(sizeof(float) * n), *pcm = malloc(sizeof(float) * n);
    assert_true(ref && pcm);
    struct vocoder_cuda *h;
    /* fp8 is the DiT's: its vocoder is this fp16 one */
    if (vocoder_cuda_create(&h, v, MM3_MATMUL_FP8, L) < 0) fail_msg("vocoder_cuda_create: %s", mm3_last_error());
    assert_int_equal(vocoder_cuda_precision(h), MM3_MATMUL_FP16);
    for (int big = 0; big < 2; big++) {
        float *lat = test_rand_array(&rng, (size_t)c * L, big ? 2e5f : 1.0f);
        assert_int_equal(vocoder_decode(v, lat, L, ref), 0);
        unsigned long long r0 = dit_cuda_f16_rescues();
        if (vocoder_cuda_decode(h, lat, L, pcm) < 0) fail_msg("decode: %s", mm3_last_error());
        double rel = test_rel_error(pcm, ref, n);
        double bound = big ? TOL_DECODE_FP16_HUGE : tol_decode[3];
        printf("fp16 decode, latents %s: rel %.3g (bound %.0e), rescued %llu\n", big ? "beyond fp16's range" : "plain",
               rel, bound, dit_cuda_f16_rescues() - r0);
        assert_true(rel <= bound);
        assert_true(dit_cuda_f16_rescues() == r0 + (unsigned long long)big);
        free(lat);
    }
    vocoder_cuda_free(h);
    vocoder_free(v);
    free(ref), free(pcm);
}

static void test_release_shape(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("vocoder_cuda_release");
    assert_non_null(dir);
    struct ckpt_gen_geometry g;
    assert_int_equal(ckpt_gen_preset("tiny", &g), 0);
    assert_int_equal(ckpt_gen_geometry_set(&g, "dit_in", "128"), 0);
    assert_int_equal(ckpt_gen_geometry_set(&g, "voc_input_dim", "1024"), 0);
    assert_int_equal(ckpt_gen_geometry_set(&g, "voc_hidden", "1536"), 0);
    assert_int_equal(ckpt_gen_geometry_set(&g, "ratios", "8,8,4,2"), 0);
    struct ckpt_gen_opts o = {.seed = 7};
    if (ckpt_gen_write(dir, &g, &o) < 0) fail_msg("ckpt_gen_write: %s", mm3_last_error());
    int L = 6; /* with 1 and L - 3: 10 latents x 2 tracks of CPU reference, ~14 s */
    float *lat = test_rand_array(&rng, (size_t)128 * L, 1.0f);
    assert_true(compare_decode("release-shaped random vocoder", dir, lat, L) <= TOL_F32);
    if (getenv("MM3_TEST_VOCODER_BENCH")) {
        struct vocoder *v;
        assert_int_equal(vocoder_load(&v, dir), 0);
        for (int p = 0; p < N_PRECS; p++) {
            struct vocoder_cuda *h;
            float ms = 0;
            assert_int_equal(vocoder_cuda_create(&h, v, precs[p], 689), 0);
            assert_int_equal(vocoder_cuda_bench(h, 689, 10, &ms), 0);
            printf("vocoder_cuda bench: release geometry, L 689, both tracks, %s: %.2f ms per window (median of 10)\n",
                   mm3_matmul_precision_name(precs[p]), ms);
            vocoder_cuda_free(h);
        }
        vocoder_free(v);
    }
    free(lat);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    if (cuda_device_count_safe() < 1) {
        fprintf(stderr, "test_vocoder_cuda: no CUDA device, skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv1d),           cmocka_unit_test(test_conv_transpose), cmocka_unit_test(test_conv_out),
        cmocka_unit_test(test_geometry_refused), cmocka_unit_test(test_geom_b),         cmocka_unit_test(test_tiny_a),
        cmocka_unit_test(test_fp16_rescue),      cmocka_unit_test(test_release_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
    fprintf(stderr, "test_vocoder_cuda: built without CUDA, skipped\n");
    return 77;
}

#endif
