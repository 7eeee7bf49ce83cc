/* Vocoder against the golden tiny-a reference: case0 window 0 waveform from its latents,
 * case2's stitched audio from two windows (one full 689-latent window). Always (no
 * golden data needed): a second geometry made with diffusers' MiniMaxMusic3Vocoder,
 * and copies of it with a wrong-shape, missing or extra tensor or a bad config, refused
 * with a message naming the tensor or key; the layers vocoder_layers_get hands a GPU
 * backend decode bit for bit like vocoder_decode, and vocoder_drop_weights makes decoding
 * refuse. Exits 77 (after the always-run part) without
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/error.h"
#include "common/ops.h"
#include "common/ops_conv.h"
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

/* The loaded sizes are config.json's (hop = the product of the upsampling ratios), read
 * here on their own: whatever the golden directory's geometry. */
static void test_config(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/vocoder/config.json", ckpt_root);
    json_error_t err;
    json_t *cfg = json_load_file(path, 0, &err);
    if (!cfg) fail_msg("%s: %s", path, err.text);
    json_t *ratios = json_object_get(cfg, "upsampling_ratios"), *r;
    size_t i;
    int hop = 1;
    assert_true(json_array_size(ratios) > 0);
    json_array_foreach(ratios, i, r) hop *= (int)json_integer_value(r);
    assert_int_equal(vocoder_hop(voc), hop);
    assert_int_equal(vocoder_latent_channels(voc), json_integer_value(json_object_get(cfg, "latent_channels")));
    assert_int_equal(vocoder_sample_rate(voc), json_integer_value(json_object_get(cfg, "sampling_rate")));
    json_decref(cfg);
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

/* One track through the layers vocoder_layers_get hands out, with the same ops in the
 * order vocoder.h documents: must equal vocoder_decode bit for bit, so a GPU backend
 * built from these layers starts from exactly the CPU's weights. */
static void decode_track_from_layers(const struct vocoder_layers *l, const float *u, int L, float *y)
{
    size_t t = (size_t)L, big = (size_t)L * l->hidden_dim;
    for (int b = 0; b < l->n_blocks; b++) {
        t *= (size_t)l->stride[b];
        if ((size_t)l->up[b].c_out * t > big) big = (size_t)l->up[b].c_out * t;
    }
    float *a = malloc(sizeof(float) * big), *r1 = malloc(sizeof(float) * big), *r2 = malloc(sizeof(float) * big);
    const struct vocoder_conv_ref *cv = &l->in_proj;
    op_conv1d(r1, u, cv->w, cv->b,
              &(struct conv1d_geometry){.c_in = cv->c_in, .c_out = cv->c_out, .t = L, .k = cv->k, .dilation = 1});
    cv = &l->conv_in;
    op_conv1d(a, r1, cv->w, cv->b,
              &(struct conv1d_geometry){
                  .c_in = cv->c_in, .c_out = cv->c_out, .t = L, .k = cv->k, .dilation = 1, .pad = (cv->k - 1) / 2});
    int n = L;
    for (int b = 0; b < l->n_blocks; b++) {
        const struct vocoder_conv_ref *up = &l->up[b];
        int s = l->stride[b], c = up->c_out;
        assert_int_equal(up->k, 2 * s);
        op_snake(r1, a, l->alpha[b], up->c_in, n);
        op_conv_transpose1d(a, r1, up->w, up->b,
                            &(struct conv1d_geometry){
                                .c_in = up->c_in, .c_out = c, .t = n, .k = up->k, .stride = s, .pad = (s + 1) / 2});
        n *= s;
        for (int r = 0; r < VOCODER_RES_UNITS; r++) {
            const struct vocoder_conv_ref *c1 = &l->conv1[b][r], *c2 = &l->conv2[b][r];
            int d = l->dilation[r];
            op_snake(r1, a, l->alpha1[b][r], c, n);
            op_conv1d(r2, r1, c1->w, c1->b,
                      &(struct conv1d_geometry){
                          .c_in = c, .c_out = c, .t = n, .k = c1->k, .dilation = d, .pad = d * (c1->k - 1) / 2});
            op_snake(r2, r2, l->alpha2[b][r], c, n);
            op_conv1d(r1, r2, c2->w, c2->b,
                      &(struct conv1d_geometry){.c_in = c, .c_out = c, .t = n, .k = c2->k, .dilation = 1});
            op_add(a, r1, (size_t)c * n);
        }
    }
    cv = &l->conv_out;
    op_snake(r1, a, l->alpha_out, cv->c_in, n);
    op_conv1d(y, r1, cv->w, cv->b,
              &(struct conv1d_geometry){
                  .c_in = cv->c_in, .c_out = 1, .t = n, .k = cv->k, .dilation = 1, .pad = (cv->k - 1) / 2});
    for (int i = 0; i < n; i++)
        y[i] = tanhf(y[i]);
    free(a), free(r1), free(r2);
}

/* vocoder_layers_get describes geom-b's geometry and decodes like vocoder_decode;
 * vocoder_drop_weights leaves the sizes and makes decoding refuse. */
static void test_layers_and_drop(void **state)
{
    (void)state;
    struct vocoder *v;
    assert_int_equal(vocoder_load(&v, geom_root), 0);
    struct vocoder_layers l;
    assert_int_equal(vocoder_layers_get(v, &l), 0);
    assert_int_equal(l.latent_channels, 16);
    assert_int_equal(l.n_blocks, 3);
    assert_int_equal(l.hop, 16);
    int strides[3] = {2, 4, 2}, dil[3] = {1, 3, 9};
    for (int b = 0; b < 3; b++) {
        assert_int_equal(l.stride[b], strides[b]);
        assert_int_equal(l.up[b].c_in, 24 >> b);
        assert_int_equal(l.up[b].c_out, 24 >> (b + 1));
        for (int r = 0; r < VOCODER_RES_UNITS; r++) {
            assert_int_equal(l.conv1[b][r].k, 7);
            assert_int_equal(l.conv2[b][r].k, 1);
        }
    }
    for (int r = 0; r < VOCODER_RES_UNITS; r++)
        assert_int_equal(l.dilation[r], dil[r]);
    assert_int_equal(l.in_proj.c_in, 8);
    assert_int_equal(l.in_proj.c_out, 12);
    assert_int_equal(l.conv_in.c_out, 24);
    assert_int_equal(l.conv_out.c_in, 3);
    assert_int_equal(l.conv_out.c_out, 1);

    int L = 5, hop = vocoder_hop(v);
    float lat[16 * 5], *pcm = malloc(sizeof(float) * 2 * hop * L), *mine = malloc(sizeof(float) * 2 * hop * L);
    for (int i = 0; i < 16 * L; i++)
        lat[i] = sinf(0.37f * (float)i) * 1.5f;
    assert_int_equal(vocoder_decode(v, lat, L, pcm), 0);
    for (int track = 0; track < 2; track++)
        decode_track_from_layers(&l, lat + track * 8 * L, L, mine + track * hop * L);
    assert_memory_equal(pcm, mine, sizeof(float) * 2 * hop * L);

    vocoder_drop_weights(v);
    assert_int_equal(vocoder_hop(v), 16);
    assert_int_equal(vocoder_latent_channels(v), 16);
    assert_int_equal(vocoder_sample_rate(v), 32000);
    assert_int_equal(vocoder_decode(v, lat, L, pcm), -ENODATA);
    assert_non_null(strstr(mm3_last_error(), "vocoder_drop_weights"));
    assert_int_equal(vocoder_layers_get(v, &l), -ENODATA);
    vocoder_drop_weights(v); /* twice is harmless */
    free(pcm), free(mine);
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
        cmocka_unit_test(test_layers_and_drop),
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
