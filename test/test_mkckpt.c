/* Checkpoint generator: the tiny preset has tiny-a's exact tensor set, loads fully,
 * is byte-identical for a seed whatever the thread count, keeps the promised
 * initialisation; the full preset's headers carry the release parameter counts;
 * the tokenizer is a consistent byte-level BPE with the real special ids. */
/* cmocka.h needs these first */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/ckpt_gen.h"
#include "common/error.h"
#include "support/test_support.h"

static const char *const components[] = {"language_model", "rvq_depth_decoder", "condition_encoder", "transformer",
                                         "vocoder"};
static const char *const all_components[] = {"language_model", "rvq_depth_decoder", "condition_encoder", "transformer",
                                             "vocoder",        "scheduler",         "tokenizer"};

static const char *const tiny_files[] = {
    "modular_model_index.json",
    "language_model/config.json",
    "language_model/generation_config.json",
    "language_model/model.safetensors.index.json",
    "language_model/model-00001-of-00003.safetensors",
    "language_model/model-00002-of-00003.safetensors",
    "language_model/model-00003-of-00003.safetensors",
    "rvq_depth_decoder/config.json",
    "rvq_depth_decoder/diffusion_pytorch_model.safetensors",
    "condition_encoder/config.json",
    "condition_encoder/diffusion_pytorch_model.safetensors",
    "transformer/config.json",
    "transformer/diffusion_pytorch_model.safetensors",
    "vocoder/config.json",
    "vocoder/diffusion_pytorch_model.safetensors",
    "scheduler/scheduler_config.json",
    "tokenizer/tokenizer.json",
    "tokenizer/tokenizer_config.json",
};
#define N_TINY_FILES (sizeof tiny_files / sizeof tiny_files[0])

static char *slurp(const char *dir, const char *name, size_t *len)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return test_file_read(p, len);
}

/* 1 identical, 0 different; fails when a file is missing. */
static int same_file(const char *a, const char *b, const char *name)
{
    size_t la, lb;
    char *x = slurp(a, name, &la), *y = slurp(b, name, &lb);
    if (!x || !y) fail_msg("%s missing in %s or %s", name, a, b);
    int same = la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

struct gen_dirs {
    char *a, *b, *c;
};

static int setup(void **state)
{
    struct gen_dirs *d = calloc(1, sizeof *d);
    d->a = test_make_tmpdir("mk-a");
    d->b = test_make_tmpdir("mk-b");
    d->c = test_make_tmpdir("mk-c");
    struct ckpt_gen_geometry g;
    if (ckpt_gen_preset("tiny", &g) < 0) return -1;
    struct ckpt_gen_opts oa = {.seed = 7, .threads = 1}, ob = {.seed = 7, .threads = 4}, oc = {.seed = 8};
    if (ckpt_gen_write(d->a, &g, &oa) < 0 || ckpt_gen_write(d->b, &g, &ob) < 0 || ckpt_gen_write(d->c, &g, &oc) < 0) {
        fprintf(stderr, "generation failed: %s\n", mm3_last_error());
        return -1;
    }
    *state = d;
    return 0;
}

static int teardown(void **state)
{
    struct gen_dirs *d = *state;
    test_remove_tree(d->a);
    test_remove_tree(d->b);
    test_remove_tree(d->c);
    free(d->a);
    free(d->b);
    free(d->c);
    free(d);
    return 0;
}

static void test_deterministic(void **state)
{
    struct gen_dirs *d = *state;
    int differ = 0;
    for (size_t i = 0; i < N_TINY_FILES; i++) {
        if (!same_file(d->a, d->b, tiny_files[i])) fail_msg("%s differs between two runs with seed 7", tiny_files[i]);
        if (strstr(tiny_files[i], ".safetensors") && !strstr(tiny_files[i], ".json"))
            differ += !same_file(d->a, d->c, tiny_files[i]);
        else if (!same_file(d->a, d->c, tiny_files[i]))
            fail_msg("%s depends on the seed", tiny_files[i]);
    }
    assert_int_equal(differ, 7); /* every weight file changes with the seed */
}

/* The same names, dtypes and shapes as golden tiny-a, and the same configs. Skipped where
 * the golden directory holds another geometry (its manifest's variant is not "a"). */
static void test_matches_tiny_a(void **state)
{
    struct gen_dirs *d = *state;
    const char *gd = test_golden_dir();
    if (!gd) skip();
    char gold[1024];
    snprintf(gold, sizeof gold, "%s/manifest.json", gd);
    json_t *manifest = json_load_file(gold, 0, NULL);
    const char *variant = json_string_value(json_object_get(manifest, "variant"));
    const int tiny_a = variant && !strcmp(variant, "a");
    json_decref(manifest);
    if (!tiny_a) {
        printf("golden %s is not tiny-a (variant %s): skipped\n", gd, variant ? variant : "missing");
        skip();
    }
    snprintf(gold, sizeof gold, "%s/checkpoint", gd);
    assert_int_equal(ckpt_root_check(d->a, (const char **)all_components, 7), 0);
    for (int k = 0; k < 5; k++) {
        struct ckpt_component a, g;
        if (ckpt_component_open(&a, d->a, components[k]) < 0) fail_msg("%s", mm3_last_error());
        assert_int_equal(ckpt_component_open(&g, gold, components[k]), 0);
        assert_int_equal(a.n_tensors, g.n_tensors);
        assert_int_equal(a.n_files, g.n_files);
        for (int i = 0; i < g.n_tensors; i++) {
            const struct ckpt_tensor *t = ckpt_find(&a, g.tensors[i].st->name);
            if (!t) fail_msg("%s: tensor %s missing", components[k], g.tensors[i].st->name);
            assert_int_equal(t->st->dtype, g.tensors[i].st->dtype);
            assert_int_equal(t->st->ndim, g.tensors[i].st->ndim);
            for (int j = 0; j < t->st->ndim; j++)
                assert_int_equal(t->st->shape[j], g.tensors[i].st->shape[j]);
        }
        /* configs: every key of tiny-a's config is there with the same value */
        const char *key;
        json_t *v;
        json_object_foreach(g.config, key, v)
        {
            if (!strcmp(key, "max_window_layers")) continue;
            if (!json_equal(v, json_object_get(a.config, key)))
                fail_msg("%s/config.json: key %s differs", components[k], key);
        }
        ckpt_component_close(&a);
        ckpt_component_close(&g);
    }
}

static double slice_norm(const float *v, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)v[i] * v[i];
    return sqrt(s);
}

static float *load(const struct ckpt_component *c, const char *name, size_t *n)
{
    const struct ckpt_tensor *t = ckpt_find(c, name);
    if (!t) fail_msg("%s: missing %s", c->name, name);
    *n = (size_t)st_tensor_numel(t->st);
    float *p = malloc(*n * sizeof(float) + 4);
    assert_int_equal(ckpt_read_f32(c, name, p, -1, NULL), 0);
    return p;
}

static void test_loads_with_promised_init(void **state)
{
    struct gen_dirs *d = *state;
    for (int k = 0; k < 5; k++) {
        struct ckpt_component c;
        assert_int_equal(ckpt_component_open(&c, d->a, components[k]), 0);
        assert_int_equal(ckpt_component_load(&c), 0);
        /* every value finite */
        for (int i = 0; i < c.n_tensors; i++) {
            size_t n;
            float *p = load(&c, c.tensors[i].st->name, &n);
            for (size_t j = 0; j < n; j++)
                if (!isfinite(p[j])) fail_msg("%s: %s[%zu] not finite", components[k], c.tensors[i].st->name, j);
            free(p);
        }
        if (k == 0) {
            size_t n;
            int64_t h;
            assert_int_equal(ckpt_config_int(&c, "hidden_size", &h), 0);
            float *w = load(&c, "model.layers.0.mlp.gate_proj.weight", &n);
            double s = 0, m = 0;
            for (size_t j = 0; j < n; j++)
                m += w[j];
            m /= (double)n;
            for (size_t j = 0; j < n; j++)
                s += (w[j] - m) * (w[j] - m);
            double sd = sqrt(s / (double)n), want = 1.0 / sqrt((double)h);
            assert_true(fabs(m) < 0.2 * want);
            assert_true(sd > 0.8 * want && sd < 1.2 * want);
            free(w);
            w = load(&c, "model.layers.1.self_attn.q_norm.weight", &n);
            for (size_t j = 0; j < n; j++)
                assert_true(w[j] == 1.0f);
            free(w);
            double theta;
            assert_int_equal(ckpt_config_rope_theta(&c, &theta), 0);
            assert_true(theta == 1000000.0);
        }
        if (k == 4) {
            size_t nv, ng, na;
            float *v = load(&c, "blocks.1.conv_t1.weight_v", &nv);
            float *g = load(&c, "blocks.1.conv_t1.weight_g", &ng);
            size_t slice = nv / ng;
            for (size_t o = 0; o < ng; o++) {
                double want = slice_norm(v + o * slice, slice);
                assert_true(fabs(g[o] - want) <= 1e-5 * want);
            }
            free(v);
            free(g);
            float *a = load(&c, "blocks.0.res_unit2.snake1.alpha", &na);
            for (size_t j = 0; j < na; j++)
                assert_true(a[j] >= 0.5f && a[j] < 1.5f);
            free(a);
        }
        ckpt_component_close(&c);
    }
}

static int vocab_has(json_t *vocab, const char *tok)
{
    return json_object_get(vocab, tok) != NULL;
}

static void test_tokenizer(void **state)
{
    struct gen_dirs *d = *state;
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizer/tokenizer.json", d->a);
    json_error_t e;
    json_t *t = json_load_file(p, 0, &e);
    if (!t) fail_msg("%s: %s", p, e.text);
    static const struct {
        int id;
        const char *s;
    } want[] = {{151643, "<|endoftext|>"},     {151644, "<|im_start|>"},    {151645, "<|im_end|>"},
                {151654, "<|audio_cfg|>"},     {151669, "<|audio_start|>"}, {151670, "<|audio_end|>"},
                {151671, "<|caption_start|>"}, {151672, "<|caption_end|>"}, {151673, "<|lyrics_start|>"},
                {151674, "<|lyrics_end|>"}};
    json_t *added = json_object_get(t, "added_tokens");
    assert_int_equal(json_array_size(added), 10);
    json_t *model = json_object_get(t, "model"), *vocab = json_object_get(model, "vocab"),
           *merges = json_object_get(model, "merges");
    for (int i = 0; i < 10; i++) {
        json_t *a = json_array_get(added, (size_t)i);
        assert_int_equal(json_integer_value(json_object_get(a, "id")), want[i].id);
        assert_string_equal(json_string_value(json_object_get(a, "content")), want[i].s);
        assert_true(json_is_true(json_object_get(a, "special")));
        assert_true(json_is_false(json_object_get(a, "normalized")));
        assert_int_equal(json_integer_value(json_object_get(vocab, want[i].s)), want[i].id);
    }
    assert_string_equal(json_string_value(json_object_get(model, "type")), "BPE");
    assert_string_equal(json_string_value(json_object_get(json_object_get(t, "normalizer"), "type")), "NFC");
    size_t nm = json_array_size(merges);
    assert_true(nm >= 250);
    assert_int_equal(json_object_size(vocab), 256 + nm + 10);
    /* ids 0..255 are the 256 byte symbols: "!" is 0, "Ġ" (space) 220 */
    assert_int_equal(json_integer_value(json_object_get(vocab, "!")), 0);
    assert_int_equal(json_integer_value(json_object_get(vocab, "\xc4\xa0")), 220);
    /* every merge joins two known tokens into the token with the next id */
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
        assert_true(vocab_has(vocab, a) && vocab_has(vocab, b));
        char joined[256];
        snprintf(joined, sizeof joined, "%s%s", a, b);
        assert_int_equal(json_integer_value(json_object_get(vocab, joined)), 256 + (json_int_t)i);
    }
    /* the same pipeline as the release file (and tiny-a) */
    const char *gd = test_golden_dir();
    if (gd) {
        snprintf(p, sizeof p, "%s/checkpoint/tokenizer/tokenizer.json", gd);
        json_t *g = json_load_file(p, 0, NULL);
        assert_non_null(g);
        assert_true(json_equal(json_object_get(g, "pre_tokenizer"), json_object_get(t, "pre_tokenizer")));
        assert_true(json_equal(json_object_get(g, "added_tokens"), json_object_get(t, "added_tokens")));
        json_decref(g);
    }
    json_decref(t);
}

static void test_rope_top_level(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("mk-rope");
    struct ckpt_gen_geometry g;
    assert_int_equal(ckpt_gen_preset("tiny", &g), 0);
    g.lm_rope_theta = 250000.0;
    struct ckpt_gen_opts o = {.seed = 1, .rope_top_level = 1, .sparse = 1};
    assert_int_equal(ckpt_gen_write(dir, &g, &o), 0);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, dir, "language_model"), 0);
    assert_non_null(json_object_get(c.config, "rope_theta"));
    assert_null(json_object_get(c.config, "rope_parameters"));
    double theta;
    assert_int_equal(ckpt_config_rope_theta(&c, &theta), 0);
    assert_true(theta == 250000.0);
    /* sparse: real headers, zero data */
    assert_int_equal(ckpt_component_load(&c), 0);
    const struct ckpt_tensor *t = ckpt_find(&c, "model.norm.weight");
    for (uint64_t i = 0; i < t->st->nbytes; i++)
        assert_int_equal(((uint8_t *)t->data)[i], 0);
    ckpt_component_close(&c);
    test_remove_tree(dir);
    free(dir);
}

/* The release geometry, headers only (sparse files): parameter counts from
 * docs/model.md §2. */
static void test_full_preset_headers(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("mk-full");
    struct ckpt_gen_geometry g;
    assert_int_equal(ckpt_gen_preset("full", &g), 0);
    struct ckpt_gen_opts o = {.sparse = 1};
    if (ckpt_gen_write(dir, &g, &o) < 0) {
        print_message("sparse files unsupported here? %s\n", mm3_last_error());
        test_remove_tree(dir);
        free(dir);
        skip();
    }
    static const struct {
        const char *name;
        int tensors, files;
        uint64_t params;
        enum mm3_dtype dtype;
    } want[] = {
        {"language_model", 399, 4, 8584475648ull, MM3_DTYPE_BF16},
        {"rvq_depth_decoder", 47, 1, 646025216ull, MM3_DTYPE_BF16},
        {"condition_encoder", 4, 1, 25167881ull, MM3_DTYPE_F32},
        {"transformer", 441, 2, 2431905920ull, MM3_DTYPE_F32},
        {"vocoder", 121, 1, 54170722ull, MM3_DTYPE_F32},
    };
    for (int k = 0; k < 5; k++) {
        struct ckpt_component c;
        if (ckpt_component_open(&c, dir, want[k].name) < 0) fail_msg("%s", mm3_last_error());
        assert_int_equal(c.n_tensors, want[k].tensors);
        assert_int_equal(c.n_files, want[k].files);
        uint64_t params = 0;
        for (int i = 0; i < c.n_tensors; i++) {
            params += st_tensor_numel(c.tensors[i].st);
            assert_int_equal(c.tensors[i].st->dtype, want[k].dtype);
        }
        if (params != want[k].params)
            fail_msg("%s: %llu parameters, release has %llu", want[k].name, (unsigned long long)params,
                     (unsigned long long)want[k].params);
        ckpt_component_close(&c);
    }
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, dir, "transformer"), 0);
    const struct ckpt_tensor *t = ckpt_find(&c, "preprocess_conv.weight");
    assert_int_equal(t->st->shape[0], 2304);
    ckpt_component_close(&c);
    test_remove_tree(dir);
    free(dir);
}

static int run(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_program(void **state)
{
    struct gen_dirs *d = *state;
    char bin[1024], cmd[4096];
    snprintf(bin, sizeof bin, "%s/mm3-mkckpt", test_bin_dir());
    if (access(bin, X_OK) != 0) skip();
    char *out = test_make_tmpdir("mk-prog");
    snprintf(cmd, sizeof cmd, "'%s' --preset tiny --out '%s' --seed 7 --threads 3 2>/dev/null", bin, out);
    assert_int_equal(run(cmd), 0);
    for (size_t i = 0; i < N_TINY_FILES; i++)
        if (!same_file(d->a, out, tiny_files[i])) fail_msg("mm3-mkckpt: %s differs from the library's", tiny_files[i]);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' --set no_such_field=3 2>/dev/null", bin, out);
    assert_int_equal(run(cmd), 1);
    snprintf(cmd, sizeof cmd,
             "'%s' --out '%s/odd' --sparse --set lm_hidden=24 --set ratios=4,2 --set voc_hidden=16 "
             "2>/dev/null",
             bin, out);
    assert_int_equal(run(cmd), 0);
    /* the load benchmark runs on it and prints its table */
    snprintf(bin, sizeof bin, "%s/mm3-bench-load", test_bin_dir());
    if (access(bin, X_OK) == 0) {
        char log[1024];
        snprintf(log, sizeof log, "%s/bench.txt", out);
        snprintf(cmd, sizeof cmd, "'%s' --ckpt '%s' > '%s' 2>/dev/null", bin, out, log);
        assert_int_equal(run(cmd), 0);
        size_t n;
        char *text = slurp(out, "bench.txt", &n);
        assert_non_null(text);
        assert_non_null(strstr(text, "language_model"));
        assert_non_null(strstr(text, "total"));
        free(text);
        snprintf(cmd, sizeof cmd, "'%s' --ckpt '%s' --components nothing_here > /dev/null 2>&1", bin, out);
        assert_int_equal(run(cmd), 1);
    }
    snprintf(bin, sizeof bin, "%s/mm3-mkckpt", test_bin_dir());
    snprintf(cmd, sizeof cmd, "'%s' --preset huge --out '%s' 2>/dev/null", bin, out);
    assert_int_not_equal(run(cmd), 0);
    snprintf(cmd, sizeof cmd, "'%s' --seed 1 2>/dev/null", bin);
    assert_int_equal(run(cmd), 2);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' --seed x1 2>/dev/null", bin, out);
    assert_int_equal(run(cmd), 2);
    test_remove_tree(out);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_matches_tiny_a),
        cmocka_unit_test(test_loads_with_promised_init),
        cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_rope_top_level),
        cmocka_unit_test(test_full_preset_headers),
        cmocka_unit_test(test_program),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
