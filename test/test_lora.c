/* LoRA adapters (common/lora.h, common/lora_merge.h, mm3-mkckpt --lora's generator):
 * the merged weights a model loads equal W + scale * s * B A with s = alpha / r (or
 * alpha / sqrt(r) with rslora), rounded once to a bf16 base's precision; stage 0's
 * bf16 upload reads the same merged values; untouched tensors stay as stored; and
 * each defect of an adapter gets its own error naming the key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/checkpoint.h"
#include "common/ckpt_gen.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/lora.h"
#include "common/lora_merge.h"
#include "common/safetensors.h"
#include "stage0/model/talker.h"
#include "stage1/dit.h"
#include "support/test_support.h"

static char *g_dir;       /* scratch folder */
static char g_ckpt[4200]; /* tiny random checkpoint */

static int group_setup(void **state)
{
    (void)state;
    g_dir = test_make_tmpdir("lora");
    snprintf(g_ckpt, sizeof g_ckpt, "%s/ckpt", g_dir);
    struct ckpt_gen_geometry g;
    struct ckpt_gen_opts o = {.seed = 5, .threads = 1};
    if (ckpt_gen_preset("tiny", &g) < 0 || ckpt_gen_write(g_ckpt, &g, &o) < 0) {
        fprintf(stderr, "checkpoint: %s\n", mm3_last_error());
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    test_remove_tree(g_dir);
    free(g_dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lora_merge_clear();
    return 0;
}

/* A generated adapter in g_dir/<name>. */
static const char *make_adapter(const char *name, const char *component, int rank, double alpha, int rslora,
                                const char *targets)
{
    static char path[4300];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    struct ckpt_gen_lora_opts o = {
        .component = component, .targets = targets, .rank = rank, .alpha = alpha, .rslora = rslora, .seed = 11};
    if (ckpt_gen_lora_write(path, g_ckpt, &o) < 0) fail_msg("ckpt_gen_lora_write: %s", mm3_last_error());
    return path;
}

/* A whole tensor as float32 (newly allocated), from a safetensors file. */
static float *load_tensor(const char *file, const char *name, int64_t shape[2])
{
    struct st_file f;
    if (st_file_open(&f, file) < 0) fail_msg("%s", mm3_last_error());
    float *x;
    int nd;
    int64_t sh[ST_MAX_DIMS];
    if (st_file_load_f32(&f, name, &x, &nd, sh) < 0) fail_msg("%s", mm3_last_error());
    assert_int_equal(nd, 2);
    shape[0] = sh[0];
    shape[1] = sh[1];
    st_file_close(&f);
    return x;
}

/* W + factor * B A computed in double from the stored factors; the base W of the
 * component as stored, unmerged. */
static double *expected_merge(const char *component, const char *weight, const char *adapter, const char *prefix,
                              double factor, int64_t *out, int64_t *in)
{
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, g_ckpt, component), 0);
    const struct ckpt_tensor *t = ckpt_find(&c, weight);
    assert_non_null(t);
    *out = t->st->shape[0];
    *in = t->st->shape[1];
    float *w = malloc(sizeof(float) * (size_t)(*out * *in));
    assert_int_equal(ckpt_read_f32(&c, weight, w, -1, NULL), 0); /* the plain reader: never merged */
    ckpt_component_close(&c);
    char file[4400], na[512], nb[512];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", adapter);
    size_t base = strlen(weight) - strlen(".weight");
    snprintf(na, sizeof na, "%s%.*s.lora_A.weight", prefix, (int)base, weight);
    snprintf(nb, sizeof nb, "%s%.*s.lora_B.weight", prefix, (int)base, weight);
    int64_t sa[2], sb[2];
    float *a = load_tensor(file, na, sa), *b = load_tensor(file, nb, sb);
    assert_int_equal(sa[1], *in);
    assert_int_equal(sb[0], *out);
    assert_int_equal(sa[0], sb[1]);
    double *e = malloc(sizeof(double) * (size_t)(*out * *in));
    for (int64_t i = 0; i < *out; i++)
        for (int64_t j = 0; j < *in; j++) {
            double acc = 0;
            for (int64_t k = 0; k < sa[0]; k++)
                acc += (double)b[i * sb[1] + k] * (double)a[k * *in + j];
            e[i * *in + j] = (double)w[i * *in + j] + factor * acc;
        }
    free(w);
    free(a);
    free(b);
    return e;
}

/* The talker's q_proj (BF16 base): merged in float32, rounded once to bf16; the
 * result is within one bf16 step of the exact merge and is itself a bf16 value. */
static void test_talker_merge_bf16(void **state)
{
    (void)state;
    const char *ad = make_adapter("lm", "language_model", 4, 8.0, 0, "q_proj,down_proj");
    const double scale = 1.5, factor = scale * 8.0 / 4.0;
    assert_int_equal(lora_merge_add("language_model", ad, scale), 0);
    assert_int_equal(lora_merge_count("language_model"), 1);
    struct talker m;
    assert_int_equal(talker_load(&m, g_ckpt), 0);
    int64_t out, in;
    double *e = expected_merge("language_model", "model.layers.1.self_attn.q_proj.weight", ad, "base_model.model.",
                               factor, &out, &in);
    for (int64_t k = 0; k < out * in; k++) {
        float got = m.layers[1].wq[k];
        assert_true(mm3_bf16_to_f32(mm3_f32_to_bf16(got)) == got); /* a bf16 value */
        double ulp = fabs(e[k]) * (1.0 / 128.0) + 1e-6;            /* one bf16 step at |e| (8 bits) */
        if (fabs(got - e[k]) > ulp) fail_msg("wq[%lld] = %.9g, expected %.9g", (long long)k, got, e[k]);
    }
    free(e);
    /* The adapter moved the weights (the test would pass an unmerged load otherwise). */
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, g_ckpt, "language_model"), 0);
    float *w = malloc(sizeof(float) * (size_t)(out * in));
    assert_int_equal(ckpt_read_f32(&c, "model.layers.1.self_attn.q_proj.weight", w, -1, NULL), 0);
    int changed = 0;
    for (int64_t k = 0; k < out * in; k++)
        changed += w[k] != m.layers[1].wq[k];
    assert_true(changed > out * in / 2);
    /* k_proj is not a target: as stored. */
    float *wk = malloc(sizeof(float) * (size_t)(m.cfg.n_kv_heads * m.cfg.head_dim * in));
    assert_int_equal(ckpt_read_f32(&c, "model.layers.1.self_attn.k_proj.weight", wk, -1, NULL), 0);
    assert_memory_equal(wk, m.layers[1].wk, sizeof(float) * (size_t)(m.cfg.n_kv_heads * m.cfg.head_dim * in));
    /* Stage 0's GPU upload reads bf16 rows: the same merged values, rows 3..5. */
    uint16_t rows[3 * 4096];
    assert_true(in <= 4096);
    assert_int_equal(lora_merge_read_rows_bf16(&c, "model.layers.1.self_attn.q_proj.weight", 3, 3, rows), 0);
    for (int64_t k = 0; k < 3 * in; k++)
        assert_true(mm3_bf16_to_f32(rows[k]) == m.layers[1].wq[3 * in + k]);
    free(w);
    free(wk);
    ckpt_component_close(&c);
    talker_free(&m);
}

/* Two adapters on one component add up; a tensor both adapt gets both deltas. */
static void test_two_adapters_add(void **state)
{
    (void)state;
    const char *a1 = make_adapter("lm1", "language_model", 2, 2.0, 0, "o_proj");
    char p1[4300];
    snprintf(p1, sizeof p1, "%s", a1);
    assert_int_equal(lora_merge_add("language_model", p1, 1.0), 0);
    assert_int_equal(lora_merge_add("language_model", p1, -1.0), 0); /* cancels the first */
    struct talker m;
    assert_int_equal(talker_load(&m, g_ckpt), 0);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, g_ckpt, "language_model"), 0);
    int64_t n = (int64_t)m.cfg.hidden * m.cfg.n_heads * m.cfg.head_dim;
    float *w = malloc(sizeof(float) * (size_t)n);
    assert_int_equal(ckpt_read_f32(&c, "model.layers.0.self_attn.o_proj.weight", w, -1, NULL), 0);
    /* +delta then -delta in float32 returns W up to rounding, then rounds to bf16: W exactly
     * except where the float32 sum lost a bit at a rounding tie. */
    int same = 0;
    for (int64_t k = 0; k < n; k++)
        same += w[k] == m.layers[0].wo[k];
    assert_true(same > n * 99 / 100);
    free(w);
    ckpt_component_close(&c);
    talker_free(&m);
}

/* The DiT (F32 base) with rslora: s = alpha / sqrt(r), no rounding. */
static void test_dit_merge_rslora(void **state)
{
    (void)state;
    const char *ad = make_adapter("dit", "transformer", 4, 3.0, 1, NULL);
    const double factor = 0.75 * 3.0 / 2.0;
    assert_int_equal(lora_merge_add("transformer", ad, 0.75), 0);
    struct dit_model *m;
    assert_int_equal(dit_load(&m, g_ckpt), 0);
    int64_t out, in;
    double *e =
        expected_merge("transformer", "transformer_blocks.1.ff_out.weight", ad, "transformer.", factor, &out, &in);
    for (int64_t k = 0; k < out * in; k++)
        if (fabs(m->w.layers[1].ff_out_w[k] - e[k]) > 1e-5 * (1 + fabs(e[k])))
            fail_msg("ff_out[%lld] = %.9g, expected %.9g", (long long)k, m->w.layers[1].ff_out_w[k], e[k]);
    free(e);
    e = expected_merge("transformer", "transformer_blocks.0.attn.to_out.0.weight", ad, "transformer.", factor, &out,
                       &in);
    for (int64_t k = 0; k < out * in; k++)
        assert_true(fabs(m->w.layers[0].wo[k] - e[k]) <= 1e-5 * (1 + fabs(e[k])));
    free(e);
    dit_free(m);
}

/* ---- bad adapters -------------------------------------------------------- */

/* Rewrite adapter folder `dir`'s config with `config` (NULL: keep) and its tensors
 * with the listed ones (n < 0: keep). */
static void write_adapter(const char *dir, const char *config, const struct st_writer_tensor *t, int n)
{
    char path[4400];
    mkdir(dir, 0755);
    if (config) {
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(config, f);
        fclose(f);
    }
    if (n >= 0) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        assert_int_equal(st_write_file(path, t, n, NULL), 0);
    }
}

static void expect_refused(const char *dir, const char *component, const char *needle)
{
    int rc = lora_merge_add(component, dir, 1.0);
    if (rc == 0) {
        /* Key and shape checks against the base happen at load. */
        struct talker m;
        rc = talker_load(&m, g_ckpt);
        if (rc == 0) talker_free(&m);
    }
    assert_true(rc < 0);
    if (!strstr(mm3_last_error(), needle)) fail_msg("error '%s' lacks '%s'", mm3_last_error(), needle);
    lora_merge_clear();
}

#define CFG(extra)                                                                                                     \
    "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"q_proj\"], \"bias\": "              \
    "\"none\"" extra "}"
#define QA "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
#define QB "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"

static void test_bad_adapters(void **state)
{
    (void)state;
    struct talker probe;
    assert_int_equal(talker_load(&probe, g_ckpt), 0);
    const int64_t H = probe.cfg.hidden, QD = (int64_t)probe.cfg.n_heads * probe.cfg.head_dim;
    talker_free(&probe);
    float *z = calloc((size_t)(4 * (H + QD + 8) * 4), sizeof(float));
    const struct st_writer_tensor good[] = {
        {QA, MM3_DTYPE_F32, 2, {2, H}, z},
        {QB, MM3_DTYPE_F32, 2, {QD, 2}, z},
    };
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/bad", g_dir);

    /* The good one loads: every failure below is the one defect. */
    write_adapter(dir, CFG(""), good, 2);
    assert_int_equal(lora_merge_add("language_model", dir, 1.0), 0);
    struct talker m;
    assert_int_equal(talker_load(&m, g_ckpt), 0);
    talker_free(&m);
    lora_merge_clear();

    char missing[4400];
    snprintf(missing, sizeof missing, "%s/none", g_dir);
    expect_refused(missing, "language_model", "adapter_config.json");
    write_adapter(dir, "{\"r\": 2,", NULL, -1);
    expect_refused(dir, "language_model", "adapter_config.json:1");
    write_adapter(dir, CFG(", \"use_dora\": true"), NULL, -1);
    expect_refused(dir, "language_model", "DoRA");
    write_adapter(dir, "{\"r\": 2, \"target_modules\": [\"q_proj\"], \"bias\": \"all\"}", NULL, -1);
    expect_refused(dir, "language_model", "bias training");
    write_adapter(dir, CFG(", \"modules_to_save\": [\"lm_head\"]"), NULL, -1);
    expect_refused(dir, "language_model", "modules_to_save");
    write_adapter(dir, CFG(", \"rank_pattern\": {\"q_proj\": 4}"), NULL, -1);
    expect_refused(dir, "language_model", "rank_pattern");
    write_adapter(dir, "{\"peft_type\": \"LOHA\", \"r\": 2, \"target_modules\": [\"q_proj\"]}", NULL, -1);
    expect_refused(dir, "language_model", "peft_type");
    write_adapter(dir, "{\"r\": 0, \"target_modules\": [\"q_proj\"]}", NULL, -1);
    expect_refused(dir, "language_model", "key 'r'");
    write_adapter(dir, "{\"r\": 2, \"target_modules\": \".*q_proj\"}", NULL, -1);
    expect_refused(dir, "language_model", "regular expressions");
    write_adapter(dir, "{\"r\": 2, \"target_modules\": [\"v_proj\"]}", NULL, -1);
    expect_refused(dir, "language_model", "not named by target_modules");
    write_adapter(dir, "{\"r\": 3, \"target_modules\": [\"q_proj\"]}", NULL, -1);
    expect_refused(dir, "language_model", "with r = 3");
    write_adapter(dir, CFG(""), good, 1);
    expect_refused(dir, "language_model", "exactly one lora_A and one lora_B");

    struct st_writer_tensor t[3] = {good[0], good[1]};
    t[2] = (struct st_writer_tensor){
        "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", MM3_DTYPE_F32, 1, {QD}, z};
    write_adapter(dir, NULL, t, 3);
    expect_refused(dir, "language_model", "DoRA");
    t[2] = (struct st_writer_tensor){
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.bias", MM3_DTYPE_F32, 1, {QD}, z};
    write_adapter(dir, NULL, t, 3);
    expect_refused(dir, "language_model", "lora_bias");
    t[2] =
        (struct st_writer_tensor){"base_model.model.model.layers.0.self_attn.q_proj.bias", MM3_DTYPE_F32, 1, {QD}, z};
    write_adapter(dir, NULL, t, 3);
    expect_refused(dir, "language_model", "bias training");
    t[2] =
        (struct st_writer_tensor){"base_model.model.model.embed_tokens.lora_embedding_A", MM3_DTYPE_F32, 2, {2, H}, z};
    write_adapter(dir, NULL, t, 3);
    expect_refused(dir, "language_model", "embedding adapters");
    t[2] = (struct st_writer_tensor){"base_model.model.lm_head.weight", MM3_DTYPE_F32, 2, {2, H}, z};
    write_adapter(dir, NULL, t, 3);
    expect_refused(dir, "language_model", "not a LoRA tensor");
    t[2] = (struct st_writer_tensor){
        "base_model.model.model.layers.1.self_attn.q_proj.lora_A.default.weight", MM3_DTYPE_F32, 2, {2, H}, z};
    write_adapter(dir, NULL, t, 3);
    expect_refused(dir, "language_model", "adapter name");

    /* "all-linear" (in any case, as PEFT lowercases it) names every linear layer but the
     * talker's output layer, which PEFT leaves out of a transformers model: an lm_head
     * factor is refused there, accepted when the list names it, and a diffusers model
     * (the depth decoder) keeps all its layers, heads included. */
    write_adapter(dir, "{\"r\": 2, \"target_modules\": \"All-Linear\"}", good, 2);
    assert_int_equal(lora_merge_add("language_model", dir, 1.0), 0);
    lora_merge_clear();
    const struct st_writer_tensor head[] = {
        good[0],
        good[1],
        {"base_model.model.lm_head.lora_A.weight", MM3_DTYPE_F32, 2, {2, H}, z},
        {"base_model.model.lm_head.lora_B.weight", MM3_DTYPE_F32, 2, {QD, 2}, z},
    };
    write_adapter(dir, NULL, head, 4);
    expect_refused(dir, "language_model", "which target_modules \"all-linear\"");
    write_adapter(dir, "{\"r\": 2, \"target_modules\": [\"q_proj\", \"lm_head\"]}", NULL, -1);
    assert_int_equal(lora_merge_add("language_model", dir, 1.0), 0);
    lora_merge_clear();
    const struct st_writer_tensor depth_head[] = {
        {"base_model.model.audio_heads.0.lora_A.weight", MM3_DTYPE_F32, 2, {2, H}, z},
        {"base_model.model.audio_heads.0.lora_B.weight", MM3_DTYPE_F32, 2, {QD, 2}, z},
    };
    write_adapter(dir, "{\"r\": 2, \"target_modules\": \"all-linear\"}", depth_head, 2);
    assert_int_equal(lora_merge_add("rvq_depth_decoder", dir, 1.0), 0);
    lora_merge_clear();
    write_adapter(dir, CFG(""), good, 2);

    /* Shapes: A of the wrong width (checked against the base at load), a 4-D factor. */
    t[0] = (struct st_writer_tensor){QA, MM3_DTYPE_F32, 2, {2, H + 1}, z};
    write_adapter(dir, CFG(""), t, 2);
    expect_refused(dir, "language_model", "has shape");
    t[0] = (struct st_writer_tensor){QA, MM3_DTYPE_F32, 4, {2, H, 1, 1}, z};
    write_adapter(dir, NULL, t, 2);
    expect_refused(dir, "language_model", "convolution");
    /* A module the base does not have (an adapter for another model). */
    t[0] = (struct st_writer_tensor){
        "base_model.model.model.layers.99.self_attn.q_proj.lora_A.weight", MM3_DTYPE_F32, 2, {2, H}, z};
    t[1] = (struct st_writer_tensor){
        "base_model.model.model.layers.99.self_attn.q_proj.lora_B.weight", MM3_DTYPE_F32, 2, {QD, 2}, z};
    write_adapter(dir, NULL, t, 2);
    expect_refused(dir, "language_model", "does not hold");
    free(z);
}

/* A truncated or garbled adapter_model.safetensors: the reader's own checks. */
static void test_bad_safetensors(void **state)
{
    (void)state;
    char dir[4300], path[4400];
    snprintf(dir, sizeof dir, "%s/garbled", g_dir);
    write_adapter(dir, CFG(""), NULL, -1);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("\x10\0\0\0\0\0\0\0{\"a\":", f);
    fclose(f);
    expect_refused(dir, "language_model", "adapter_model.safetensors");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_talker_merge_bf16, teardown),
        cmocka_unit_test_teardown(test_two_adapters_add, teardown),
        cmocka_unit_test_teardown(test_dit_merge_rslora, teardown),
        cmocka_unit_test_teardown(test_bad_adapters, teardown),
        cmocka_unit_test_teardown(test_bad_safetensors, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
