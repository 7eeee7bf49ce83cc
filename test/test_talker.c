/* Talker (stage-0 LM) on the tiny-a checkpoint: the sliced head equals the full
 * head's columns, KV-cached decode equals a full prefill, rows of a batch are
 * independent, the feedback embedding formula, bad inputs, and the load for the GPU
 * (host parts only, matrices left in the checkpoint). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* cmocka needs the headers above */
#include <cmocka.h>

#include "common/checkpoint.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/ops.h"
#include "common/sampler.h"
#include "stage0/model/depth.h"
#include "stage0/model/talker.h"
#include "stage0/model/talker_backend.h"
#include "support/test_stage0.h"
#include "support/test_support.h"

#define NEED_GOLDEN(f)                                                                                                 \
    do {                                                                                                               \
        if (!(f)) skip();                                                                                              \
    } while (0)

/* Deterministic pseudo-random floats in [-1, 1). */
static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
    }
}

static void test_head_slice_equals_full(void **state)
{
    struct test_stage0 *f = *state;
    NEED_GOLDEN(f);
    int H = f->lm.cfg.hidden, V = f->lm.cfg.vocab;
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, f->root, "language_model"), 0);
    float *w = malloc(sizeof(float) * (size_t)V * H);
    assert_int_equal(ckpt_read_f32(&c, "lm_head.weight", w, 2, (int64_t[]){V, H}), 0);
    ckpt_component_close(&c);
    float hid[3 * 64];
    assert_true(H <= 64);
    fill(hid, (size_t)3 * H, 7);
    float *full = malloc(sizeof(float) * 3 * (size_t)V), *part = malloc(sizeof(float) * 3 * SAMPLER_C0_COLS);
    op_matmul(full, hid, w, NULL, 3, H, V);
    talker_head_drawable(&f->lm, hid, 3, part);
    for (int r = 0; r < 3; r++) {
        assert_true(part[r * SAMPLER_C0_COLS] == full[(size_t)r * V + SAMPLER_STOP_ID]);
        for (int k = 0; k < SAMPLER_N_CODES; k++)
            assert_true(part[r * SAMPLER_C0_COLS + 1 + k] == full[(size_t)r * V + SAMPLER_CODE_OFFSET + k]);
    }
    free(w), free(full), free(part);
}

static void test_decode_equals_prefill(void **state)
{
    struct test_stage0 *f = *state;
    NEED_GOLDEN(f);
    enum { N = 9 };
    int H = f->lm.cfg.hidden;
    float *emb = malloc(sizeof(float) * N * H), *a = malloc(sizeof(float) * N * H), *b = malloc(sizeof(float) * N * H);
    fill(emb, (size_t)N * H, 3);
    int row[N], pos[N];
    for (int i = 0; i < N; i++)
        row[i] = 0, pos[i] = i;
    struct talker_state s1, s2;
    assert_int_equal(talker_state_init(&s1, &f->lm, 1, N), 0);
    assert_int_equal(talker_state_init(&s2, &f->lm, 1, N), 0);
    assert_int_equal(talker_forward(&f->lm, &s1, N, row, pos, emb, a), 0);
    /* 4-token prefill, then one token at a time through the cache */
    assert_int_equal(talker_forward(&f->lm, &s2, 4, row, pos, emb, b), 0);
    for (int t = 4; t < N; t++)
        assert_int_equal(talker_forward(&f->lm, &s2, 1, row + t, pos + t, emb + (size_t)t * H, b + (size_t)t * H), 0);
    assert_true(test_rel_error(b, a, (size_t)N * H) <= 1e-6);
    /* and the last row genuinely depends on the earlier tokens: the last token alone, as a
     * sequence of its own (position 0: at position N - 1 it would attend to cache entries
     * 0..N - 2 that nothing wrote) */
    float *c = malloc(sizeof(float) * H);
    struct talker_state s3;
    assert_int_equal(talker_state_init(&s3, &f->lm, 1, N), 0);
    assert_int_equal(talker_forward(&f->lm, &s3, 1, row, pos, emb + (size_t)(N - 1) * H, c), 0);
    assert_true(test_rel_error(c, a + (size_t)(N - 1) * H, (size_t)H) > 1e-3);
    talker_state_free(&s1), talker_state_free(&s2), talker_state_free(&s3);
    free(emb), free(a), free(b), free(c);
}

static void test_batch_rows_independent(void **state)
{
    struct test_stage0 *f = *state;
    NEED_GOLDEN(f);
    enum { N = 6 };
    int H = f->lm.cfg.hidden;
    float *e0 = malloc(sizeof(float) * N * H), *e1 = malloc(sizeof(float) * N * H);
    fill(e0, (size_t)N * H, 11);
    fill(e1, (size_t)N * H, 12);
    int zero[N], pos[N];
    for (int i = 0; i < N; i++)
        zero[i] = 0, pos[i] = i;
    float *r0 = malloc(sizeof(float) * N * H), *r1 = malloc(sizeof(float) * N * H);
    struct talker_state s;
    assert_int_equal(talker_state_init(&s, &f->lm, 1, N), 0);
    assert_int_equal(talker_forward(&f->lm, &s, N, zero, pos, e0, r0), 0);
    talker_state_free(&s);
    assert_int_equal(talker_state_init(&s, &f->lm, 1, N), 0);
    assert_int_equal(talker_forward(&f->lm, &s, N, zero, pos, e1, r1), 0);
    talker_state_free(&s);
    /* both rows together: prefill of 3 tokens each in one batch, then decode pairs */
    struct talker_state sb;
    assert_int_equal(talker_state_init(&sb, &f->lm, 2, N), 0);
    float *in = malloc(sizeof(float) * 2 * N * H), *out = malloc(sizeof(float) * 2 * N * H);
    int brow[2 * N], bpos[2 * N];
    for (int i = 0; i < 3; i++) {
        memcpy(in + (size_t)i * H, e0 + (size_t)i * H, sizeof(float) * H);
        memcpy(in + (size_t)(3 + i) * H, e1 + (size_t)i * H, sizeof(float) * H);
        brow[i] = 0, bpos[i] = i, brow[3 + i] = 1, bpos[3 + i] = i;
    }
    assert_int_equal(talker_forward(&f->lm, &sb, 6, brow, bpos, in, out), 0);
    for (int i = 0; i < 3; i++) {
        assert_true(test_rel_error(out + (size_t)i * H, r0 + (size_t)i * H, (size_t)H) <= 1e-6);
        assert_true(test_rel_error(out + (size_t)(3 + i) * H, r1 + (size_t)i * H, (size_t)H) <= 1e-6);
    }
    for (int t = 3; t < N; t++) {
        /* uncond row first this time: order inside a batch must not matter */
        memcpy(in, e1 + (size_t)t * H, sizeof(float) * H);
        memcpy(in + H, e0 + (size_t)t * H, sizeof(float) * H);
        int rr[2] = {1, 0}, pp[2] = {t, t};
        assert_int_equal(talker_forward(&f->lm, &sb, 2, rr, pp, in, out), 0);
        assert_true(test_rel_error(out, r1 + (size_t)t * H, (size_t)H) <= 1e-6);
        assert_true(test_rel_error(out + H, r0 + (size_t)t * H, (size_t)H) <= 1e-6);
    }
    talker_state_free(&sb);
    free(e0), free(e1), free(r0), free(r1), free(in), free(out);
}

static void test_feedback_embedding(void **state)
{
    struct test_stage0 *f = *state;
    NEED_GOLDEN(f);
    int H = f->lm.cfg.hidden, ncb = f->dd.cfg.n_codebooks, V = f->dd.cfg.audio_vocab;
    int32_t codes[16];
    assert_true(ncb <= 16);
    codes[0] = 16383;
    for (int j = 1; j < ncb; j++)
        codes[j] = (j * 131) % V;
    float *out = malloc(sizeof(float) * H);
    assert_int_equal(talker_feedback_embedding(&f->lm, &f->dd, codes, out), 0);
    /* by hand from the checkpoint tables, in double */
    int ids[1] = {SAMPLER_CODE_OFFSET + 16383};
    float *e = malloc(sizeof(float) * H);
    assert_int_equal(talker_embed_tokens(&f->lm, ids, 1, e), 0);
    double max_err = 0, max_val = 0;
    for (int i = 0; i < H; i++) {
        double s = e[i];
        for (int j = 1; j < ncb; j++)
            s += f->dd.audio_emb[((size_t)(j - 1) * V + codes[j]) * H + i];
        s /= sqrt((double)ncb);
        max_err = fmax(max_err, fabs(s - out[i]));
        max_val = fmax(max_val, fabs(s));
    }
    assert_true(max_val > 0 && max_err <= 1e-6 * (1 + max_val));
    /* out-of-range codes are errors, not reads past the tables */
    codes[0] = 16384;
    assert_true(talker_feedback_embedding(&f->lm, &f->dd, codes, out) < 0);
    codes[0] = 0;
    codes[ncb - 1] = V;
    assert_true(talker_feedback_embedding(&f->lm, &f->dd, codes, out) < 0);
    free(out), free(e);
}

static void test_bad_inputs(void **state)
{
    struct test_stage0 *f = *state;
    NEED_GOLDEN(f);
    int H = f->lm.cfg.hidden;
    int bad_id[1] = {f->lm.cfg.vocab};
    float *e = malloc(sizeof(float) * H);
    assert_true(talker_embed_tokens(&f->lm, bad_id, 1, e) < 0);
    struct talker_state s;
    assert_int_equal(talker_state_init(&s, &f->lm, 1, 4), 0);
    int row[1] = {0}, pos[1] = {4}, row1[1] = {1}, pos0[1] = {0};
    assert_true(talker_forward(&f->lm, &s, 1, row, pos, e, e) < 0);   /* position past max_ctx */
    assert_true(talker_forward(&f->lm, &s, 1, row1, pos0, e, e) < 0); /* row past max_rows */
    talker_state_free(&s);
    free(e);
    struct talker m;
    assert_true(talker_load(&m, "/nonexistent-checkpoint") < 0);
}

/* A language_model whose vocab cannot hold the semantic codes is refused by name. */
static void test_small_vocab_refused(void **state)
{
    struct test_stage0 *f = *state;
    NEED_GOLDEN(f);
    char *dir = test_make_tmpdir("talker_vocab");
    char p[1024], q[4096];
    snprintf(p, sizeof p, "%s/language_model", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, f->root, "language_model"), 0);
    json_t *cfg = json_deep_copy(c.config);
    for (int i = 0; i < c.n_files; i++) {
        const char *base = strrchr(c.files[i].path, '/') + 1;
        snprintf(q, sizeof q, "%s/%s", p, base);
        assert_int_equal(symlink(c.files[i].path, q), 0);
    }
    snprintf(q, sizeof q, "%s/language_model/model.safetensors.index.json", f->root);
    char r[4096];
    snprintf(r, sizeof r, "%s/model.safetensors.index.json", p);
    if (access(q, F_OK) == 0) assert_int_equal(symlink(q, r), 0);
    ckpt_component_close(&c);
    json_object_set_new(cfg, "vocab_size", json_integer(SAMPLER_CODE_OFFSET + SAMPLER_N_CODES - 1));
    snprintf(q, sizeof q, "%s/config.json", p);
    assert_int_equal(json_dump_file(cfg, q, 0), 0);
    json_decref(cfg);
    struct talker m;
    assert_true(talker_load(&m, dir) < 0);
    assert_non_null(strstr(mm3_last_error(), "vocab_size"));
    test_remove_tree(dir);
    free(dir);
}

/* The rows a deferred field names, read as bf16 the way the CUDA upload reads them,
 * equal the fully loaded model's floats (exactly: the checkpoint is bf16). */
static void check_deferred_rows(const struct weight_deferred *d, float *const *field, const float *want, size_t n)
{
    int k;
    const struct weight_spec *s = weight_deferred_find(d, field, &k);
    assert_non_null(s);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, d->root, d->component), 0);
    uint16_t *got = malloc(sizeof(uint16_t) * n);
    size_t at = 0;
    for (int i = 0; i < k; i++) {
        int64_t rows = s[i].kind == WEIGHT_ROWS ? s[i].n_rows : s[i].shape[0];
        assert_true(at + (size_t)(rows * s[i].shape[1]) <= n);
        assert_int_equal(ckpt_read_rows_bf16(&c, s[i].name, s[i].kind == WEIGHT_ROWS ? s[i].row0 : 0, rows, got + at), 0);
        at += (size_t)(rows * s[i].shape[1]);
    }
    assert_int_equal(at, n);
    for (size_t e = 0; e < n; e++)
        assert_true(mm3_bf16_to_f32(got[e]) == want[e]);
    free(got);
    ckpt_component_close(&c);
}

/* A layer's seven matrices: NULL on the host, deferred with the full load's values. */
static void check_layer_deferred(const struct weight_deferred *d, float *const *const field[7], const float *const want[7],
                                 const size_t n[7])
{
    for (int i = 0; i < 7; i++) {
        assert_null(*field[i]);
        check_deferred_rows(d, field[i], want[i], n[i]);
    }
}

/* Loaded for the GPU: the host parts equal the full load's, every matrix is left in
 * the checkpoint (NULL, found by its field with the right rows), and the CPU
 * backend refuses the model. */
static void test_host_parts(void **state)
{
    struct test_stage0 *f = *state;
    NEED_GOLDEN(f);
    struct talker lm;
    struct depth dd;
    assert_int_equal(talker_backend_load_models(TALKER_BACKEND_CUDA, f->root, &lm, &dd), 0);
    assert_false(talker_has_matrices(&lm));
    assert_false(depth_has_matrices(&dd));
    assert_true(talker_has_matrices(&f->lm) && depth_has_matrices(&f->dd));
    const struct talker_config *c = &lm.cfg;
    size_t H = (size_t)c->hidden, FF = (size_t)c->ffn, D = (size_t)c->head_dim;
    size_t QD = (size_t)c->n_heads * D, KD = (size_t)c->n_kv_heads * D;
    assert_memory_equal(lm.embed, f->lm.embed, sizeof(float) * (size_t)c->vocab * H);
    assert_memory_equal(lm.norm, f->lm.norm, sizeof(float) * H);
    assert_memory_equal(lm.inv_freq, f->lm.inv_freq, sizeof(float) * D / 2);
    assert_null(lm.head);
    check_deferred_rows(&lm.deferred, &lm.head, f->lm.head, (size_t)SAMPLER_C0_COLS * H);
    for (int l = 0; l < c->n_layers; l++) {
        struct talker_layer *L = &lm.layers[l];
        const struct talker_layer *W = &f->lm.layers[l];
        assert_memory_equal(L->attn_norm, W->attn_norm, sizeof(float) * H);
        assert_memory_equal(L->q_norm, W->q_norm, sizeof(float) * D);
        assert_memory_equal(L->ffn_norm, W->ffn_norm, sizeof(float) * H);
        float *const *field[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        const float *want[] = {W->wq, W->wk, W->wv, W->wo, W->wg, W->wu, W->wd};
        const size_t n[] = {QD * H, KD * H, KD * H, H * QD, FF * H, FF * H, H * FF};
        check_layer_deferred(&lm.deferred, field, want, n);
    }
    const struct depth_config *dc = &dd.cfg;
    size_t DH = (size_t)dc->hidden, DF = (size_t)dc->ffn, V = (size_t)dc->audio_vocab, nres = (size_t)dc->n_codebooks - 1;
    assert_memory_equal(dd.audio_emb, f->dd.audio_emb, sizeof(float) * nres * V * DH);
    assert_memory_equal(dd.pos_emb, f->dd.pos_emb, sizeof(float) * (size_t)dc->max_pos * DH);
    assert_memory_equal(dd.norm, f->dd.norm, sizeof(float) * DH);
    assert_null(dd.proj);
    assert_null(dd.heads);
    check_deferred_rows(&dd.deferred, &dd.proj, f->dd.proj, DH * DH);
    check_deferred_rows(&dd.deferred, &dd.heads, f->dd.heads, nres * V * DH);
    for (int l = 0; l < dc->n_layers; l++) {
        struct depth_layer *L = &dd.layers[l];
        const struct depth_layer *W = &f->dd.layers[l];
        assert_memory_equal(L->attn_norm, W->attn_norm, sizeof(float) * DH);
        float *const *field[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        const float *want[] = {W->wq, W->wk, W->wv, W->wo, W->wg, W->wu, W->wd};
        const size_t n[] = {DH * DH, DH * DH, DH * DH, DH * DH, DF * DH, DF * DH, DH * DF};
        check_layer_deferred(&dd.deferred, field, want, n);
    }
    struct talker_backend b;
    assert_int_equal(talker_backend_open(&b, TALKER_BACKEND_CPU, &lm, &dd, 2, 16, 2), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "loaded for the GPU"));
    talker_free(&lm);
    depth_free(&dd);
}

int main(void)
{
    if (!test_golden_dir()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_slice_equals_full),
        cmocka_unit_test(test_decode_equals_prefill),
        cmocka_unit_test(test_batch_rows_independent),
        cmocka_unit_test(test_feedback_embedding),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_small_vocab_refused),
        cmocka_unit_test(test_host_parts),
    };
    return cmocka_run_group_tests(tests, test_stage0_golden_setup, test_stage0_golden_teardown);
}
