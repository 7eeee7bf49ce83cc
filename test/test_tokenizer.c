/* Qwen2 byte-level BPE tokenizer: ids equal HF `tokenizers` on the tiny-a
 * tokenizer.json (fixtures made with tokenizers 0.23), both merge notations,
 * pinned special ids, refusal of other pipelines, invalid UTF-8. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "stage0/text/tokenizer.h"
#include "stage0/text/tokenizer_nfc.h"
#include "support/test_support.h"

static char *data_path(const char *name)
{
    static const char dir[] = "/test/data/tokenizer/";
    size_t n = strlen(test_source_dir()) + sizeof dir + strlen(name);
    char *p = malloc(n);
    snprintf(p, n, "%s%s%s", test_source_dir(), dir, name);
    return p;
}

static json_t *load_json(const char *name)
{
    char *path = data_path(name);
    json_error_t err;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &err);
    if (!j) fprintf(stderr, "%s: %s\n", path, err.text);
    free(path);
    assert_non_null(j);
    return j;
}

static struct tokenizer *load_tiny(void)
{
    char *path = data_path("tiny-tokenizer.json");
    struct tokenizer *tok = NULL;
    int rc = tokenizer_load(&tok, path);
    if (rc < 0) fprintf(stderr, "%s\n", mm3_last_error());
    free(path);
    assert_int_equal(rc, 0);
    return tok;
}

/* Every fixture case encodes to exactly the ids HF produced. */
static void check_cases(const struct tokenizer *tok)
{
    json_t *fx = load_json("encode_cases.json");
    json_t *cases = json_object_get(fx, "cases");
    assert_true(json_array_size(cases) >= 20);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const json_t *text = json_object_get(c, "text"), *want = json_object_get(c, "ids");
        int32_t *ids;
        int n;
        assert_int_equal(tokenizer_encode(tok, json_string_value(text), json_string_length(text), &ids, &n), 0);
        assert_non_null(ids);
        int same = n == (int)json_array_size(want);
        for (int k = 0; same && k < n; k++) same = ids[k] == json_integer_value(json_array_get(want, (size_t)k));
        if (!same) {
            fprintf(stderr, "case \"%s\": got", json_string_value(json_object_get(c, "name")));
            for (int k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, "\n");
        }
        free(ids);
        assert_true(same);
    }
    json_decref(fx);
}

static void test_encode_matches_hf(void **state)
{
    (void)state;
    struct tokenizer *tok = load_tiny();
    check_cases(tok);
    tokenizer_free(tok);
}

/* Writes a modified copy of the tiny tokenizer.json and loads it. */
static int load_variant(void (*mutate)(json_t *root), struct tokenizer **tok)
{
    json_t *root = load_json("tiny-tokenizer.json");
    mutate(root);
    char *dir = test_make_tmpdir("tok");
    assert_non_null(dir);
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(json_dump_file(root, path, JSON_COMPACT), 0);
    json_decref(root);
    *tok = NULL;
    int rc = tokenizer_load(tok, path);
    test_remove_tree(dir);
    free(dir);
    return rc;
}

static void merges_to_strings(json_t *root)
{
    json_t *merges = json_object_get(json_object_get(root, "model"), "merges");
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(m, 0)),
                 json_string_value(json_array_get(m, 1)));
        json_array_set_new(merges, i, json_string(buf));
    }
}

static void test_legacy_merge_strings(void **state)
{
    (void)state;
    struct tokenizer *tok;
    assert_int_equal(load_variant(merges_to_strings, &tok), 0);
    check_cases(tok);
    tokenizer_free(tok);
}

static void test_token_ids(void **state)
{
    (void)state;
    struct tokenizer *tok = load_tiny();
    assert_int_equal(tokenizer_token_id(tok, "<|im_start|>"), 151644);
    assert_int_equal(tokenizer_token_id(tok, "<|im_end|>"), 151645);
    assert_int_equal(tokenizer_token_id(tok, "<|audio_cfg|>"), 151654);
    assert_int_equal(tokenizer_token_id(tok, "<|audio_start|>"), 151669);
    assert_int_equal(tokenizer_token_id(tok, "<|audio_end|>"), 151670);
    assert_int_equal(tokenizer_token_id(tok, "<|lyrics_end|>"), 151674);
    assert_int_equal(tokenizer_token_id(tok, "<|endoftext|>"), 151643);
    assert_int_equal(tokenizer_token_id(tok, "<|im_start"), -1);
    assert_int_equal(tokenizer_token_id(tok, "hello"), -1);
    assert_int_equal(tokenizer_token_id(tok, ""), -1);
    tokenizer_free(tok);
}

/* ---- refused files ---- */

static json_t *added_token(json_t *root, const char *content)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(root, "added_tokens"), i, t)
        if (strcmp(json_string_value(json_object_get(t, "content")), content) == 0) return t;
    return NULL;
}

/* Model vocab and added token agree on another id: HF would use it, we refuse. */
static void move_audio_cfg(json_t *root)
{
    json_object_set_new(added_token(root, "<|audio_cfg|>"), "id", json_integer(151655));
    json_object_set_new(json_object_get(json_object_get(root, "model"), "vocab"), "<|audio_cfg|>",
                        json_integer(151655));
}

static void drop_lyrics_end(json_t *root)
{
    json_t *arr = json_object_get(root, "added_tokens");
    size_t i;
    json_t *t;
    json_array_foreach(arr, i, t)
        if (strcmp(json_string_value(json_object_get(t, "content")), "<|lyrics_end|>") == 0) break;
    json_array_remove(arr, i);
    json_object_del(json_object_get(json_object_get(root, "model"), "vocab"), "<|lyrics_end|>");
}

/* Without the vocab entry, HF numbers the token itself (557 here), whatever "id" says. */
static void unvocab_im_end(json_t *root)
{
    json_object_del(json_object_get(json_object_get(root, "model"), "vocab"), "<|im_end|>");
}

static void set_nfkc(json_t *root)
{
    json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFKC"));
}

static void set_prefix_space(json_t *root)
{
    json_t *bl = json_array_get(json_object_get(json_object_get(root, "pre_tokenizer"), "pretokenizers"), 1);
    json_object_set_new(bl, "add_prefix_space", json_true());
}

static void set_template(json_t *root)
{
    json_object_set_new(root, "post_processor", json_pack("{s:s}", "type", "TemplateProcessing"));
}

static void set_byte_fallback(json_t *root)
{
    json_object_set_new(json_object_get(root, "model"), "byte_fallback", json_true());
}

static void set_bad_merge(json_t *root)
{
    json_array_append_new(json_object_get(json_object_get(root, "model"), "merges"),
                          json_pack("[ss]", "zq", "x"));
}

static void drop_byte_token(json_t *root)
{
    json_object_del(json_object_get(json_object_get(root, "model"), "vocab"), "\xc4\x80"); /* byte 0x00 */
}

static void set_lstrip(json_t *root)
{
    json_object_set_new(added_token(root, "<|im_end|>"), "lstrip", json_true());
}

static void set_truncation(json_t *root)
{
    json_object_set_new(root, "truncation", json_pack("{s:i}", "max_length", 16));
}

static void expect_refused(void (*mutate)(json_t *), const char *want_a, const char *want_b)
{
    struct tokenizer *tok;
    int rc = load_variant(mutate, &tok);
    const char *msg = mm3_last_error();
    if (rc == 0 || !strstr(msg, want_a) || (want_b && !strstr(msg, want_b)))
        fprintf(stderr, "rc %d, message: %s (wanted \"%s\")\n", rc, msg, want_a);
    assert_true(rc < 0);
    assert_null(tok);
    assert_non_null(strstr(msg, want_a));
    if (want_b) assert_non_null(strstr(msg, want_b));
}

static void test_refuses_wrong_files(void **state)
{
    (void)state;
    expect_refused(move_audio_cfg, "<|audio_cfg|>", "151654");
    expect_refused(drop_lyrics_end, "<|lyrics_end|>", "missing");
    expect_refused(unvocab_im_end, "<|im_end|>", "151645");
    expect_refused(set_nfkc, "normalizer", NULL);
    expect_refused(set_prefix_space, "pre_tokenizer", NULL);
    expect_refused(set_template, "post_processor", NULL);
    expect_refused(set_byte_fallback, "byte_fallback", NULL);
    expect_refused(set_bad_merge, "merges[", "zq");
    expect_refused(drop_byte_token, "byte 0x00", NULL);
    expect_refused(set_lstrip, "lstrip", NULL);
    expect_refused(set_truncation, "truncation", NULL);

    struct tokenizer *tok = NULL;
    assert_true(tokenizer_load(&tok, "/nonexistent/tokenizer.json") < 0);
    assert_non_null(strstr(mm3_last_error(), "/nonexistent/tokenizer.json"));
    char *dir = test_make_tmpdir("tok");
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model\": {\"vocab\": {\"a\": 0}", f);
    fclose(f);
    assert_true(tokenizer_load(&tok, path) < 0);
    assert_non_null(strstr(mm3_last_error(), "line 1"));
    assert_null(tok);
    test_remove_tree(dir);
    free(dir);
}

static void test_rejects_invalid_utf8(void **state)
{
    (void)state;
    struct tokenizer *tok = load_tiny();
    static const struct {
        const char *bytes;
        size_t len;
    } bad[] = {
        {"\xC0\xAF", 2},         /* overlong '/' */
        {"a\xE0\x80\xAF", 4},    /* overlong, 3 bytes */
        {"\xF0\x80\x80\xAF", 4}, /* overlong, 4 bytes */
        {"ok\x80", 3},           /* lone continuation byte */
        {"\xED\xA0\x80", 3},     /* UTF-16 surrogate D800 */
        {"\xED\xBF\xBF", 3},     /* surrogate DFFF */
        {"\xF4\x90\x80\x80", 4}, /* past U+10FFFF */
        {"\xE4\xB8", 2},         /* truncated */
        {"\xFF", 1},
        {"<|im_start|>\xFE", 13},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)&tok; /* must be reset */
        int n = 7;
        assert_int_equal(tokenizer_encode(tok, bad[i].bytes, bad[i].len, &ids, &n), -EINVAL);
        assert_null(ids);
        assert_int_equal(n, 0);
        assert_non_null(strstr(mm3_last_error(), "invalid UTF-8"));
    }
    /* The largest code point and a noncharacter are valid. */
    int32_t *ids;
    int n;
    assert_int_equal(tokenizer_encode(tok, "\xF4\x8F\xBF\xBF\xEF\xBF\xBF", 7, &ids, &n), 0);
    assert_true(n > 0);
    free(ids);
    tokenizer_free(tok);
}

/* Long runs exercise the regex backtracking and the BPE queue on big pre-tokens. */
static void test_long_runs(void **state)
{
    (void)state;
    struct tokenizer *tok = load_tiny();
    size_t n = 200000;
    char *text = malloc(n + 2);
    memset(text, ' ', n);
    text[n] = 'x';
    int32_t *ids, *one;
    int n_ids, n_one;
    assert_int_equal(tokenizer_encode(tok, text, n + 1, &ids, &n_ids), 0);
    /* A run of spaces before a word: the run minus one space, then " x". */
    assert_int_equal(tokenizer_encode(tok, " x", 2, &one, &n_one), 0);
    assert_true(n_ids > n_one);
    assert_memory_equal(ids + n_ids - n_one, one, (size_t)n_one * sizeof *one);
    free(ids);
    free(one);
    for (size_t i = 0; i < n; i++) text[i] = "0123456789"[i % 10];
    assert_int_equal(tokenizer_encode(tok, text, n, &ids, &n_ids), 0);
    assert_int_equal(n_ids, (int)n); /* digits are split one by one */
    for (size_t i = 0; i < n; i += 9973) assert_int_equal(ids[i], 15 + (int)(i % 10));
    free(ids);
    assert_int_equal(tokenizer_encode(tok, "", 0, &ids, &n_ids), 0);
    assert_non_null(ids);
    assert_int_equal(n_ids, 0);
    free(ids);
    free(text);
    tokenizer_free(tok);
}

static size_t put_utf8(char *p, uint32_t cp)
{
    return (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)p);
}

/* NFC of short random texts of starters, precomposed letters, Hangul and combining
 * marks of several classes equals utf8proc's own (quadratic) normalisation. */
static void test_nfc_matches_reference_on_short_runs(void **state)
{
    (void)state;
    static const uint32_t alphabet[] = {
        'a',    'e',    'o',    'A',    ' ',    0x00E9, 0x1E0B, 0x212B, 0x0300, 0x0301, 0x0307, 0x0308,
        0x0316, 0x0323, 0x0327, 0x0328, 0x031B, 0x0345, 0x05B0, 0x05B4, 0x0E38, 0x0F71, 0x0F72, 0x0F73,
        0x0344, 0x3099, 0x309A, 0x304B, 0x1100, 0x1161, 0x11A8, 0xD55C, 0x0F74, 0x0655, 0x0627, 0x1D165,
    };
    const size_t n_alpha = sizeof alphabet / sizeof alphabet[0];
    uint32_t rng = 12345;
    char text[16 * 4 + 1];
    for (int round = 0; round < 20000; round++) {
        size_t len = 0;
        rng = rng * 1664525u + 1013904223u;
        int n = 1 + (int)(rng >> 28);
        for (int k = 0; k < n; k++) {
            rng = rng * 1664525u + 1013904223u;
            len += put_utf8(text + len, alphabet[(rng >> 16) % n_alpha]);
        }
        text[len] = 0;
        utf8proc_uint8_t *want = NULL;
        utf8proc_ssize_t wn = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &want,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        assert_true(wn >= 0);
        char *got;
        size_t gn;
        assert_int_equal(tok_nfc(text, len, &got, &gn), 0);
        if (gn != (size_t)wn || memcmp(got, want, gn)) fprintf(stderr, "round %d: NFC differs for \"%s\"\n", round, text);
        assert_int_equal(gn, (size_t)wn);
        assert_memory_equal(got, want, gn);
        free(got);
        free(want);
    }
}

/* A long run of marks of mixed classes normalises to the stable sort by class, then
 * composition; the ids are those of the text written in that order to begin with. */
static void test_long_mark_runs(void **state)
{
    (void)state;
    struct tokenizer *tok = load_tiny();
    const size_t n = 40000; /* marks: U+0301 (class 230) and U+0316 (class 220) alternating */
    char *run = malloc(1 + 2 * n + 2), *sorted = malloc(2 + 2 * n + 2);
    assert_non_null(run);
    assert_non_null(sorted);
    size_t rl = 0, sl = 0;
    run[rl++] = 'a';
    for (size_t i = 0; i < n; i++) rl += put_utf8(run + rl, i % 2 ? 0x0316 : 0x0301);
    run[rl++] = 'x';
    sl += put_utf8(sorted + sl, 0x00E1); /* a + the first U+0301: nothing of class >= 230 blocks it */
    for (size_t i = 0; i < n / 2; i++) sl += put_utf8(sorted + sl, 0x0316);
    for (size_t i = 1; i < n / 2; i++) sl += put_utf8(sorted + sl, 0x0301);
    sorted[sl++] = 'x';
    char *norm;
    size_t norm_len;
    assert_int_equal(tok_nfc(run, rl, &norm, &norm_len), 0);
    assert_int_equal(norm_len, sl);
    assert_memory_equal(norm, sorted, sl);
    free(norm);
    int32_t *a, *b;
    int na, nb;
    assert_int_equal(tokenizer_encode(tok, run, rl, &a, &na), 0);
    assert_int_equal(tokenizer_encode(tok, sorted, sl, &b, &nb), 0);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    free(a);
    free(b);
    /* marks of one class keep their order; a starter ends a run */
    rl = 0;
    for (size_t i = 0; i < n; i++) rl += put_utf8(run + rl, i % 3 ? 0x0300 : 0x0301);
    assert_int_equal(tok_nfc(run, rl, &norm, &norm_len), 0);
    assert_int_equal(norm_len, rl);
    assert_memory_equal(norm, run, rl);
    free(norm);
    free(run);
    free(sorted);
    tokenizer_free(tok);
}

/* One tokenizer shared by several threads gives every thread the same ids. */
struct encode_job {
    const struct tokenizer *tok;
    const char *text;
    size_t len;
    int32_t *ids;
    int n;
    int rc;
};

static void *encode_many(void *arg)
{
    struct encode_job *job = arg;
    for (int round = 0; round < 20 && job->rc == 0; round++) {
        int32_t *ids;
        int n;
        job->rc = tokenizer_encode(job->tok, job->text, job->len, &ids, &n);
        if (job->rc == 0 && (n != job->n || memcmp(ids, job->ids, (size_t)n * sizeof *ids) != 0)) job->rc = -1;
        if (job->rc == 0) free(ids);
    }
    return NULL;
}

static void test_concurrent_encode(void **state)
{
    (void)state;
    struct tokenizer *tok = load_tiny();
    const char *text = "<|im_start|><|caption_start|>Caf\xC3\xA9 \xE6\x9D\xB1\xE4\xBA\xAC it's 130 BPM   \n\n"
                       "hello<|audio_cfg|>world<|caption_end|><|im_end|><|audio_start|>";
    struct encode_job jobs[4];
    pthread_t threads[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (struct encode_job){.tok = tok, .text = text, .len = strlen(text)};
        assert_int_equal(tokenizer_encode(tok, text, jobs[t].len, &jobs[t].ids, &jobs[t].n), 0);
        assert_int_equal(pthread_create(&threads[t], NULL, encode_many, &jobs[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(threads[t], NULL);
        assert_int_equal(jobs[t].rc, 0);
        free(jobs[t].ids);
    }
    tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_matches_hf),   cmocka_unit_test(test_legacy_merge_strings),
        cmocka_unit_test(test_token_ids),           cmocka_unit_test(test_refuses_wrong_files),
        cmocka_unit_test(test_rejects_invalid_utf8), cmocka_unit_test(test_long_runs),
        cmocka_unit_test(test_concurrent_encode),   cmocka_unit_test(test_nfc_matches_reference_on_short_runs),
        cmocka_unit_test(test_long_mark_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
