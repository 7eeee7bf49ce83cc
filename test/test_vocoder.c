/* Vocoder against the golden tiny-a reference: case0 window 0 waveform from its latents,
 * case2's stitched audio from two windows (one full 689-latent window). Always (no
 * golden data needed): a second geometry made with diffusers' MiniMaxMusic3Vocoder,
 * and copies of it with a wrong-shape, missing or extra tensor or a bad config, refused
 * with a message naming the tensor or key. Exits 77 (after the always-run part) without
 * MM3_GOLDEN_DIR.
 *
 * test/data/vocoder/geom-b: diffusers 0.42.1 MiniMaxMusic3Vocoder(latent_channels 16,
 * decoder_input_dim 12, decoder_hidden_dim 24, upsampling_ratios (2, 4, 2), sampling_rate
 * 32000) with torch.manual_seed(20261130), weight_g scaled by U(0.5, 2), alphas U(0.3, 2),
 * biases U(-0.1, 0.1), saved with save_pretrained; io.safetensors holds latents [16, 24]
 * = randn and waveform [2, 384] = model(latents) in float32 on the CPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/error.h"
#include "common/safetensors.h"
#include "stage1/vocoder.h"
#include "support/test_support.h"

static struct vocoder *voc;
static char ckpt_root[1024];
static char geom_root[1024];

static int setup(void **state)
{
    (void)state;
    snprintf(ckpt_root, sizeof ckpt_root, "%s/checkpoint", test_golden_dir());
    if (vocoder_load(&voc, ckpt_root) < 0) {
        fprintf(stderr, "vocoder_load: %s\n", mm3_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    vocoder_free(voc);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Decode window w of a case: returns pcm [2, hop*L] and L. */
static float *decode_window(struct st_file *f, int w, int *L_out)
{
    char key[64];
    float *lat;
    int nd;
    int64_t shp[ST_MAX_DIMS];
    snprintf(key, sizeof key, "window.%d.latents", w);
    assert_int_equal(st_file_load_f32(f, key, &lat, &nd, shp), 0);
    assert_int_equal(nd, 2);
    assert_int_equal(shp[0], vocoder_latent_channels(voc));
    int L = (int)shp[1];
    float *pcm = malloc(sizeof(float) * 2 * (size_t)vocoder_hop(voc) * L);
    double t0 = now_s();
    assert_int_equal(vocoder_decode(voc, lat, L, pcm), 0);
    printf("vocoder: window %d, %d latents decoded in %.3f s\n", w, L, now_s() - t0);
    free(lat);
    *L_out = L;
    return pcm;
}

static void test_config(void **state)
{
    (void)state;
    assert_int_equal(vocoder_hop(voc), 512);
    assert_int_equal(vocoder_latent_channels(voc), 128);
    assert_int_equal(vocoder_sample_rate(voc), 44100);
}

static void test_case0_window0(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/case0.safetensors", test_golden_dir());
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    int L;
    float *pcm = decode_window(&f, 0, &L);
    float *want;
    int nd;
    int64_t shp[ST_MAX_DIMS];
    assert_int_equal(st_file_load_f32(&f, "window.0.waveform", &want, &nd, shp), 0);
    assert_int_equal(shp[0], 2);
    assert_int_equal(shp[1], (int64_t)512 * L);
    double rel = test_rel_error(pcm, want, (size_t)(2 * shp[1]));
    printf("vocoder case0 window 0: rel %.3g\n", rel);
    assert_true(rel <= 1e-4);
    /* tanh-bounded, and the two tracks really are decoded from different halves */
    for (int64_t i = 0; i < 2 * shp[1]; i++)
        assert_true(pcm[i] >= -1.0f && pcm[i] <= 1.0f);
    assert_true(test_rel_error(pcm, pcm + shp[1], (size_t)shp[1]) > 1e-2);
    free(pcm);
    free(want);
    st_file_close(&f);
}

/* case2: two windows, cropped 86 latents left / 258 right and hard-cut, then clamped. */
static void test_case2_stitched(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/case2.safetensors", test_golden_dir());
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    float *want;
    int nd;
    int64_t shp[ST_MAX_DIMS];
    assert_int_equal(st_file_load_f32(&f, "audio", &want, &nd, shp), 0);
    int64_t S = shp[1];
    float *got = calloc((size_t)(2 * S), sizeof(float));
    int64_t at = 0;
    const int hop = vocoder_hop(voc), n_win = 2;
    for (int w = 0; w < n_win; w++) {
        int L;
        float *pcm = decode_window(&f, w, &L);
        int64_t left = w == 0 ? 0 : 86 * hop, right = w == n_win - 1 ? 0 : 258 * hop;
        int64_t n = (int64_t)hop * L - left - right;
        assert_true(at + n <= S);
        for (int c = 0; c < 2; c++)
            memcpy(got + c * S + at, pcm + c * (int64_t)hop * L + left, (size_t)n * 4);
        at += n;
        free(pcm);
    }
    assert_int_equal(at, S);
    for (int64_t i = 0; i < 2 * S; i++)
        got[i] = got[i] < -1.0f ? -1.0f : got[i] > 1.0f ? 1.0f : got[i];
    double rel = test_rel_error(got, want, (size_t)(2 * S));
    printf("vocoder case2 stitched audio: rel %.3g\n", rel);
    assert_true(rel <= 1e-4);
    free(got);
    free(want);
    st_file_close(&f);
}

/* ---- broken checkpoints: a copy of the golden vocoder with one thing changed ---- */

enum mutation { MUT_SHAPE, MUT_MISSING, MUT_EXTRA, MUT_CONFIG_ODD_LATENT, MUT_CONFIG_RATIOS, MUT_CONFIG_ODD_STRIDE };

static char *make_broken(enum mutation m)
{
    char *root = test_make_tmpdir("vocoder-ckpt");
    char dir[1200], src[1200], dst[1300];
    snprintf(dir, sizeof dir, "%s/vocoder", root);
    assert_int_equal(mkdir(dir, 0755), 0);

    snprintf(src, sizeof src, "%s/vocoder/config.json", geom_root);
    json_error_t je;
    json_t *cfg = json_load_file(src, 0, &je);
    assert_non_null(cfg);
    if (m == MUT_CONFIG_ODD_LATENT) json_object_set_new(cfg, "latent_channels", json_integer(127));
    if (m == MUT_CONFIG_RATIOS) json_object_set_new(cfg, "upsampling_ratios", json_pack("[i,i]", 2, 4));
    if (m == MUT_CONFIG_ODD_STRIDE) json_object_set_new(cfg, "upsampling_ratios", json_pack("[i,i,i]", 2, 3, 2));
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, dst, 0), 0);
    json_decref(cfg);

    snprintf(src, sizeof src, "%s/vocoder/diffusion_pytorch_model.safetensors", geom_root);
    struct st_file f;
    assert_int_equal(st_file_open(&f, src), 0);
    struct st_writer_tensor *t = calloc((size_t)f.n_tensors + 1, sizeof *t);
    float **data = calloc((size_t)f.n_tensors + 1, sizeof *data);
    int n = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const struct st_tensor *s = &f.tensors[i];
        if (m == MUT_MISSING && !strcmp(s->name, "blocks.2.res_unit3.snake2.alpha")) continue;
        int nd;
        assert_int_equal(st_file_load_f32(&f, s->name, &data[n], &nd, t[n].shape), 0);
        t[n].name = s->name;
        t[n].dtype = MM3_DTYPE_F32;
        t[n].ndim = nd;
        t[n].data = data[n];
        /* [12, 6, 8] -> [12, 6, 7]: same rank, a kernel one tap short */
        if (m == MUT_SHAPE && !strcmp(s->name, "blocks.1.conv_t1.weight_v")) t[n].shape[2] -= 1;
        n++;
    }
    static float extra[4] = {1, 2, 3, 4};
    if (m == MUT_EXTRA) t[n++] = (struct st_writer_tensor){"blocks.4.snake1.alpha", MM3_DTYPE_F32, 3, {1, 4, 1}, extra};
    snprintf(dst, sizeof dst, "%s/diffusion_pytorch_model.safetensors", dir);
    assert_int_equal(st_write_file(dst, t, n, NULL), 0);
    for (int i = 0; i < n; i++)
        if (t[i].data != extra) free(data[i]);
    free(data);
    free(t);
    st_file_close(&f);
    return root;
}

static void expect_refused(enum mutation m, const char *needle1, const char *needle2)
{
    char *root = make_broken(m);
    struct vocoder *v = (struct vocoder *)1;
    int rc = vocoder_load(&v, root);
    printf("refused as expected: %s\n", mm3_last_error());
    assert_true(rc < 0);
    assert_null(v);
    assert_non_null(strstr(mm3_last_error(), needle1));
    if (needle2) assert_non_null(strstr(mm3_last_error(), needle2));
    test_remove_tree(root);
    free(root);
}

static void test_broken_checkpoints(void **state)
{
    (void)state;
    expect_refused(MUT_SHAPE, "blocks.1.conv_t1.weight_v", "[12, 6, 8]");
    expect_refused(MUT_MISSING, "blocks.2.res_unit3.snake2.alpha", "missing");
    expect_refused(MUT_EXTRA, "blocks.4.snake1.alpha", "unexpected");
    expect_refused(MUT_CONFIG_ODD_LATENT, "latent_channels", NULL);
    /* 2 blocks: snake_out / conv_out no longer fit the last block's channels */
    expect_refused(MUT_CONFIG_RATIOS, "snake_out.alpha", "[1, 6, 1]");
    expect_refused(MUT_CONFIG_ODD_STRIDE, "upsampling_ratios", "even");
}

/* Another geometry, straight from diffusers: every size from config.json. */
static void test_geometry_b(void **state)
{
    (void)state;
    struct vocoder *v;
    int rc = vocoder_load(&v, geom_root);
    if (rc < 0) fprintf(stderr, "%s\n", mm3_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(vocoder_hop(v), 16);
    assert_int_equal(vocoder_latent_channels(v), 16);
    assert_int_equal(vocoder_sample_rate(v), 32000);
    char path[1100];
    snprintf(path, sizeof path, "%s/io.safetensors", geom_root);
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    float *lat, *want;
    int nd;
    int64_t shp[ST_MAX_DIMS];
    assert_int_equal(st_file_load_f32(&f, "latents", &lat, &nd, shp), 0);
    int L = (int)shp[1];
    assert_int_equal(st_file_load_f32(&f, "waveform", &want, &nd, shp), 0);
    assert_int_equal(shp[1], 16 * L);
    float *pcm = malloc(sizeof(float) * 2 * 16 * L);
    assert_int_equal(vocoder_decode(v, lat, L, pcm), 0);
    double rel = test_rel_error(pcm, want, (size_t)(2 * 16 * L));
    printf("vocoder geometry b (16 latent ch, 12 -> 24, ratios 2,4,2): rel %.3g\n", rel);
    assert_true(rel <= 1e-5);
    free(pcm);
    free(lat);
    free(want);
    st_file_close(&f);
    vocoder_free(v);
}

static void test_bad_length(void **state)
{
    (void)state;
    float x[128] = {0}, y[2 * 512];
    assert_int_equal(vocoder_decode(voc, x, 0, y), -EINVAL);
}

int main(void)
{
    snprintf(geom_root, sizeof geom_root, "%s/test/data/vocoder/geom-b", test_source_dir());
    const struct CMUnitTest always[] = {
        cmocka_unit_test(test_geometry_b),
        cmocka_unit_test(test_broken_checkpoints),
    };
    int rc = cmocka_run_group_tests_name("vocoder_fixture", always, NULL, NULL);
    if (rc) return rc;
    if (!test_golden_dir()) {
        fprintf(stderr, "MM3_GOLDEN_DIR not set or missing: golden tests skipped\n");
        return 77;
    }
    const struct CMUnitTest golden[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_case0_window0),
        cmocka_unit_test(test_case2_stitched),
        cmocka_unit_test(test_bad_length),
    };
    return cmocka_run_group_tests_name("vocoder_golden", golden, setup, teardown);
}
