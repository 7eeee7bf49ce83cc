/* The CUDA vocoder (stage1/cuda/vocoder_cuda.h) against the CPU one (stage1/vocoder.h).
 *
 * 1. Each kernel against common/ops_conv.h at the release's channel counts (short T):
 *    conv1d k7 at dilations 1/3/9, k1, k7 in (1024 -> 1536) and out (96 -> 1), the
 *    transposed conv at every release stride, Snake; plus odd sizes that leave partial
 *    tiles. fp32: rel <= 1e-5 (only the summation order differs); the TF32 variant
 *    rel <= 3e-3.
 * 2. Whole decodes, rel <= 1e-5 against vocoder_decode: tiny-a (case0 window 0 latents),
 *    test/data/vocoder/geom-b (diffusers-made, strides 2,4,2) and a release-shaped random
 *    vocoder (1024 -> 1536 -> 768 -> 384 -> 192 -> 96, ratios 8,8,4,2) written by
 *    ckpt_gen at L = 8 (the CPU reference costs ~0.7 s per latent and track); TF32
 *    decodes of the same rel <= 2e-2.
 * 3. Bad lengths are refused. MM3_TEST_VOCODER_BENCH=1: also the release window timing
 *    (L = 689, median of 10) printed as one "vocoder_cuda bench:" line.
 * Exit 77 without CUDA compiled in or without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
/* cmocka needs the four above first */
#include <cmocka.h>

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
#include "stage1/cuda/vocoder_cuda.h"
#include "stage1/cuda/vocoder_cuda_internal.h"
#include "stage1/render.h"
#include "stage1/vocoder.h"

#define TOL 1e-5
/* TF32 rounds each operand to 10 mantissa bits (2^-11 relative): ~5e-4 per kernel,
 * growing through the ~40 layers of a decode. */
#define TOL_TF32_KERNEL 3e-3
#define TOL_TF32_DECODE 2e-2

static uint64_t rng = 0x5eed5eedull;

/* ---- 1. kernels ---- */

static void check_conv1d_prec(int batch, int c_in, int c_out, int t, int k, int dil, int tf32);
static void check_conv_t_prec(int batch, int c_in, int c_out, int t_in, int s, int tf32);

static void check_conv1d(int batch, int c_in, int c_out, int t, int k, int dil)
{
    check_conv1d_prec(batch, c_in, c_out, t, k, dil, 0);
    check_conv1d_prec(batch, c_in, c_out, t, k, dil, 1);
}

static void check_conv1d_prec(int batch, int c_in, int c_out, int t, int k, int dil, int tf32)
{
    size_t nx = (size_t)c_in * t, ny = (size_t)c_out * t;
    float *x = test_rand_array(&rng, batch * nx, 1.0f),
          *w = test_rand_array(&rng, (size_t)c_out * c_in * k, 1.0f / sqrtf((float)c_in * k));
    float *b = test_rand_array(&rng, c_out, 0.1f), *y = malloc(sizeof(float) * batch * ny),
          *ref = malloc(sizeof(float) * batch * ny);
    for (int it = 0; it < batch; it++)
        op_conv1d(ref + it * ny, x + it * nx, w, b, c_in, c_out, t, k, dil, dil * (k - 1) / 2);
    assert_int_equal(vocoder_cuda_conv1d_host(y, x, w, b, batch, c_in, c_out, t, k, dil, tf32), 0);
    double rel = test_rel_error(y, ref, batch * ny);
    printf("conv1d %s %d->%d k%d d%d T%d x%d: rel %.3g\n", tf32 ? "tf32" : "fp32", c_in, c_out, k, dil, t, batch, rel);
    assert_true(rel <= (tf32 ? TOL_TF32_KERNEL : TOL));
    free(x), free(w), free(b), free(y), free(ref);
}

static void test_conv1d(void **state)
{
    (void)state;
    for (int d = 1; d <= 9; d *= 3)
        check_conv1d(2, 768, 768, 150, 7, d);
    check_conv1d(2, 96, 96, 1000, 7, 9);
    check_conv1d(2, 384, 384, 300, 1, 1);
    check_conv1d(2, 1024, 1536, 40, 7, 1); /* conv_in */
    check_conv1d(2, 64, 1024, 33, 1, 1);   /* dec_in_proj */
    check_conv1d(2, 96, 1, 2000, 7, 1);    /* conv_out */
    check_conv1d(1, 5, 3, 3, 7, 9);        /* taps all outside but the middle */
    check_conv1d(3, 17, 70, 131, 3, 2);
}

static void check_conv_t(int batch, int c_in, int c_out, int t_in, int s)
{
    check_conv_t_prec(batch, c_in, c_out, t_in, s, 0);
    check_conv_t_prec(batch, c_in, c_out, t_in, s, 1);
}

static void check_conv_t_prec(int batch, int c_in, int c_out, int t_in, int s, int tf32)
{
    int k = 2 * s, t_out = op_conv_transpose1d_out_len(t_in, k, s, (s + 1) / 2);
    assert_int_equal(t_out, s * t_in);
    size_t nx = (size_t)c_in * t_in, ny = (size_t)c_out * t_out;
    float *x = test_rand_array(&rng, batch * nx, 1.0f),
          *w = test_rand_array(&rng, (size_t)c_in * c_out * k, 1.0f / sqrtf((float)c_in * 2));
    float *b = test_rand_array(&rng, c_out, 0.1f), *y = malloc(sizeof(float) * batch * ny),
          *ref = malloc(sizeof(float) * batch * ny);
    for (int it = 0; it < batch; it++)
        op_conv_transpose1d(ref + it * ny, x + it * nx, w, b, c_in, c_out, t_in, k, s, (s + 1) / 2);
    assert_int_equal(vocoder_cuda_conv_transpose1d_host(y, x, w, b, batch, c_in, c_out, t_in, s, tf32), 0);
    double rel = test_rel_error(y, ref, batch * ny);
    printf("conv_transpose1d %s %d->%d s%d T%d x%d: rel %.3g\n", tf32 ? "tf32" : "fp32", c_in, c_out, s, t_in, batch,
           rel);
    assert_true(rel <= (tf32 ? TOL_TF32_KERNEL : TOL));
    free(x), free(w), free(b), free(y), free(ref);
}

static void test_conv_transpose(void **state)
{
    (void)state;
    check_conv_t(2, 1536, 768, 20, 8);
    check_conv_t(2, 768, 384, 60, 8);
    check_conv_t(2, 384, 192, 200, 4);
    check_conv_t(2, 192, 96, 500, 2);
    check_conv_t(1, 7, 5, 1, 6);
    check_conv_t(3, 33, 65, 129, 2);
}

static void test_snake(void **state)
{
    (void)state;
    int c = 96, t = 1001;
    float *x = test_rand_array(&rng, 2 * (size_t)c * t, 3.0f), *a = test_rand_array(&rng, c, 1.0f),
          *y = malloc(sizeof(float) * 2 * c * t);
    float *ref = malloc(sizeof(float) * 2 * c * t);
    for (int i = 0; i < c; i++)
        a[i] += 1.5f;
    op_snake(ref, x, a, c, t);
    op_snake(ref + (size_t)c * t, x + (size_t)c * t, a, c, t);
    assert_int_equal(vocoder_cuda_snake_host(y, x, a, 2, c, t), 0);
    double rel = test_rel_error(y, ref, 2 * (size_t)c * t);
    printf("snake %d x %d x2: rel %.3g\n", c, t, rel);
    assert_true(rel <= 1e-6);
    free(x), free(a), free(y), free(ref);
}

/* ---- 2. whole decodes ---- */

/* GPU vs CPU on latents of L; prints and returns the relative error. */
static double compare_decode(const char *what, const char *root, const float *lat, int L)
{
    struct vocoder *v;
    struct vocoder_cuda *h;
    if (vocoder_load(&v, root) < 0) fail_msg("vocoder_load %s: %s", root, mm3_last_error());
    if (vocoder_cuda_create(&h, root, L) < 0) fail_msg("vocoder_cuda_create %s: %s", root, mm3_last_error());
    int hop = vocoder_hop(v);
    assert_int_equal(vocoder_cuda_hop(h), hop);
    assert_int_equal(vocoder_cuda_latent_channels(h), vocoder_latent_channels(v));
    size_t n = 2 * (size_t)hop * L;
    float *ref = malloc(sizeof(float) * n), *pcm = malloc(sizeof(float) * n);
    assert_int_equal(vocoder_decode(v, lat, L, ref), 0);
    /* through the render decoder, as the renderer calls it */
    struct render_decoder dec;
    assert_int_equal(vocoder_cuda_render_decoder(h, &dec), 0);
    assert_int_equal(dec.hop, hop);
    assert_int_equal(dec.decode(dec.ctx, lat, L, pcm), 0);
    double rel = test_rel_error(pcm, ref, n);
    printf("%s: L %d, hop %d: fp32 rel %.3g\n", what, L, hop, rel);
    vocoder_cuda_set_tf32(h, 1);
    assert_int_equal(vocoder_cuda_decode(h, lat, L, pcm), 0);
    double rel_tf32 = test_rel_error(pcm, ref, n);
    printf("%s: L %d, hop %d: tf32 rel %.3g\n", what, L, hop, rel_tf32);
    assert_true(rel_tf32 <= TOL_TF32_DECODE);
    /* the tails are not all zero (a broken last stage would still pass a rel test on zeros) */
    double e = 0;
    for (size_t i = 0; i < n; i++)
        e += (double)ref[i] * ref[i];
    assert_true(e > 0);
    /* refused lengths */
    assert_int_equal(vocoder_cuda_decode(h, lat, 0, pcm), -EINVAL);
    assert_int_equal(vocoder_cuda_decode(h, lat, L + 1, pcm), -EINVAL);
    free(ref), free(pcm);
    vocoder_cuda_free(h);
    vocoder_free(v);
    return rel;
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
    assert_true(compare_decode("tiny-a case0 window 0", root, lat, (int)shp[1]) <= TOL);
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
    assert_true(compare_decode("geom-b", root, lat, (int)shp[1]) <= TOL);
    free(lat);
    st_file_close(f);
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
    int L = 8;
    float *lat = test_rand_array(&rng, (size_t)128 * L, 1.0f);
    assert_true(compare_decode("release-shaped random vocoder", dir, lat, L) <= TOL);
    if (getenv("MM3_TEST_VOCODER_BENCH")) {
        struct vocoder_cuda *h;
        float ms = 0;
        assert_int_equal(vocoder_cuda_create(&h, dir, 689), 0);
        for (int tf32 = 0; tf32 < 2; tf32++) {
            vocoder_cuda_set_tf32(h, tf32);
            assert_int_equal(vocoder_cuda_bench(h, 689, 10, &ms), 0);
            printf("vocoder_cuda bench: release geometry, L 689, both tracks, %s: %.2f ms per window (median of 10)\n",
                   tf32 ? "tf32" : "fp32", ms);
        }
        vocoder_cuda_free(h);
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
        cmocka_unit_test(test_snake),  cmocka_unit_test(test_conv1d), cmocka_unit_test(test_conv_transpose),
        cmocka_unit_test(test_geom_b), cmocka_unit_test(test_tiny_a), cmocka_unit_test(test_release_shape),
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
