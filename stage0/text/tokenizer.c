/* Qwen2 byte-level BPE tokenizer (see tokenizer.h): tokenizer.json validation,
 * added-token tries, NFC, the split regex and the encode driver. The merge loop
 * is in tokenizer_bpe.c, the hash tables in tokenizer_map.c. */
#include "stage0/text/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "common/log.h"
#include "stage0/text/prompt_pystr.h"
#include "stage0/text/tokenizer_bpe.h"
#include "stage0/text/tokenizer_map.h"
#include "stage0/text/tokenizer_nfc.h"
#include "stage0/text/tokenizer_regex.h"

/* The ids the model was trained with (docs/model.md §3.3): a tokenizer.json that
 * puts them elsewhere would silently produce a different prompt. */
static const struct {
    const char *text;
    int32_t id;
} pinned_tokens[] = {
    {"<|im_start|>", 151644},      {"<|im_end|>", 151645},        {"<|audio_cfg|>", 151654},
    {"<|audio_start|>", 151669},   {"<|audio_end|>", 151670},     {"<|caption_start|>", 151671},
    {"<|caption_end|>", 151672},   {"<|lyrics_start|>", 151673},  {"<|lyrics_end|>", 151674},
};

/* Unicode White_Space, which is what `\s` means to the Oniguruma engine of HF
 * `tokenizers`; PCRE2's own `\s` differs (it lacks U+0085). */
#define ONIG_WS_CLASS \
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Letters and numbers of Unicode 15.0-16.0, which the Oniguruma of HF
 * `tokenizers` 0.23 knows and PCRE2 10.42 (Unicode 14) does not; found by
 * comparing the two on every code point. Added to \p{L} / \p{N}: harmless
 * where PCRE2 already knows them. */
#define HF_EXTRA_L \
    "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}" \
    "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}" \
    "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}" \
    "\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}" \
    "\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}" \
    "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}" \
    "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}\\x{2B739}" \
    "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define HF_EXTRA_N \
    "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}" \
    "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}" \
    "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"

struct tok_added {
    char *text;
    size_t len;
    int32_t id;
};

/* Byte trie of added-token strings; edges keyed (node << 8 | byte). */
struct tok_trie {
    struct tok_pairmap edges;
    int32_t *term; /* id ending at each node, or -1 */
    int32_t n_nodes;
    int32_t cap_nodes;
    bool first[256]; /* bytes that can start a token: a cheap filter */
};

struct tokenizer {
    struct tok_bpe bpe;
    struct tok_added *added;
    int n_added;
    struct tok_trie raw;  /* normalized: false, matched on the raw text */
    struct tok_trie norm; /* normalized: true, matched after NFC */
    pcre2_code *split_re;
    bool nfc;
};

/* ---- tries ---- */

static int trie_init(struct tok_trie *t)
{
    memset(t, 0, sizeof *t);
    int rc = tok_pairmap_init(&t->edges, 64);
    if (rc < 0) return rc;
    t->cap_nodes = 64;
    t->term = malloc((size_t)t->cap_nodes * sizeof *t->term);
    if (!t->term) return mm3_errorf(-ENOMEM, "tokenizer: out of memory");
    t->term[0] = -1;
    t->n_nodes = 1;
    return 0;
}

static void trie_free(struct tok_trie *t)
{
    tok_pairmap_free(&t->edges);
    free(t->term);
    memset(t, 0, sizeof *t);
}

static int trie_insert(struct tok_trie *t, const char *s, size_t n, int32_t id)
{
    int32_t node = 0;
    t->first[(unsigned char)s[0]] = true;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (uint64_t)node << 8 | (unsigned char)s[i];
        const int32_t *child = tok_pairmap_get(&t->edges, key);
        if (child) {
            node = child[0];
            continue;
        }
        if (t->n_nodes == t->cap_nodes) {
            int32_t *term = realloc(t->term, 2 * (size_t)t->cap_nodes * sizeof *term);
            if (!term) return mm3_errorf(-ENOMEM, "tokenizer: out of memory");
            t->term = term;
            t->cap_nodes *= 2;
        }
        int32_t fresh = t->n_nodes++;
        t->term[fresh] = -1;
        int rc = tok_pairmap_put(&t->edges, key, fresh, 0);
        if (rc < 0) return rc;
        node = fresh;
    }
    t->term[node] = id;
    return 0;
}

/* Length of the longest token starting at s[i] (0 if none) and its id. */
static size_t trie_longest(const struct tok_trie *t, const char *s, size_t n, size_t i, int32_t *id)
{
    if (!t->first[(unsigned char)s[i]]) return 0;
    size_t best = 0;
    int32_t node = 0;
    for (size_t j = i; j < n; j++) {
        const int32_t *child = tok_pairmap_get(&t->edges, (uint64_t)node << 8 | (unsigned char)s[j]);
        if (!child) break;
        node = child[0];
        if (t->term[node] >= 0) {
            best = j + 1 - i;
            *id = t->term[node];
        }
    }
    return best;
}

/* ---- tokenizer.json validation ---- */

static bool json_is_false_or_absent(const json_t *v)
{
    return !v || json_is_false(v);
}

static bool json_is_empty_or_null(const json_t *v)
{
    return !v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0);
}

static bool json_type_is(const json_t *obj, const char *type)
{
    const char *t = json_string_value(json_object_get(obj, "type"));
    return t && strcmp(t, type) == 0;
}

static int check_normalizer(struct tokenizer *tok, const json_t *root, const char *path)
{
    const json_t *n = json_object_get(root, "normalizer");
    if (!n || json_is_null(n)) return 0;
    if (json_is_object(n) && json_type_is(n, "NFC")) {
        tok->nfc = true;
        return 0;
    }
    return mm3_errorf(-EINVAL, "%s: 'normalizer': expected {\"type\": \"NFC\"} or null", path);
}

/* A class body (no brackets) in place of an escape: inside a class it is
 * spliced in, outside it becomes a class of its own. */
static int append_class(struct pystr_buf *b, bool in_class, const char *neg, const char *body)
{
    int rc = in_class ? 0 : pystr_buf_append(b, "[", 1);
    if (rc == 0 && !in_class) rc = pystr_buf_append(b, neg, strlen(neg));
    if (rc == 0) rc = pystr_buf_append(b, body, strlen(body));
    if (rc == 0 && !in_class) rc = pystr_buf_append(b, "]", 1);
    return rc;
}

/* Make PCRE2 see the classes Oniguruma sees: `\s` / `\S` are White_Space, and
 * `\p{L}` / `\p{N}` include the letters and digits of newer Unicode. */
static int translate_split_regex(const char *src, char **out, const char *path)
{
    struct pystr_buf b = {0};
    bool in_class = false;
    int rc = 0;
    for (size_t i = 0; src[i] && rc == 0; i++) {
        char c = src[i];
        if (c == '\\') {
            char e = src[i + 1];
            if (!e) {
                rc = mm3_errorf(-EINVAL, "%s: pre-tokenizer regex ends with a lone backslash", path);
            } else if (e == 's') {
                rc = append_class(&b, in_class, "", ONIG_WS_CLASS);
            } else if (e == 'S' && !in_class) {
                rc = append_class(&b, false, "^", ONIG_WS_CLASS);
            } else if (e == 'S') {
                rc = mm3_errorf(-EINVAL, "%s: pre-tokenizer regex: \\S inside a character class is not supported",
                                path);
            } else if (e == 'p' && (strncmp(src + i + 2, "{L}", 3) == 0 || strncmp(src + i + 2, "{N}", 3) == 0)) {
                bool letter = src[i + 3] == 'L';
                rc = append_class(&b, in_class, "", letter ? "\\p{L}" HF_EXTRA_L : "\\p{N}" HF_EXTRA_N);
                i += 3;
            } else {
                rc = pystr_buf_append(&b, src + i, 2);
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            size_t head = 1;
            if (src[i + head] == '^') head++;
            if (src[i + head] == ']') head++; /* a leading ] is a literal */
            rc = pystr_buf_append(&b, src + i, head);
            i += head - 1;
            continue;
        }
        if (in_class && c == '[' && src[i + 1] != ':') {
            rc = mm3_errorf(-EINVAL, "%s: pre-tokenizer regex: nested character classes are not supported",
                            path);
            continue;
        }
        if (in_class && c == ']') in_class = false;
        rc = pystr_buf_append(&b, &c, 1);
    }
    if (rc < 0) {
        pystr_buf_free(&b);
        return rc;
    }
    *out = pystr_buf_take(&b);
    return *out ? 0 : mm3_errorf(-ENOMEM, "tokenizer: out of memory");
}

static int check_pre_tokenizer(struct tokenizer *tok, const json_t *root, const char *path)
{
    const json_t *pt = json_object_get(root, "pre_tokenizer");
    const json_t *seq = json_object_get(pt, "pretokenizers");
    const json_t *split = json_array_get(seq, 0), *bl = json_array_get(seq, 1);
    if (!json_is_object(pt) || !json_type_is(pt, "Sequence") || json_array_size(seq) != 2 ||
        !json_type_is(split, "Split") || !json_type_is(bl, "ByteLevel"))
        return mm3_errorf(-EINVAL, "%s: 'pre_tokenizer': expected Sequence[Split(Regex), ByteLevel]", path);
    const char *pattern = json_string_value(json_object_get(json_object_get(split, "pattern"), "Regex"));
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    if (!pattern)
        return mm3_errorf(-EINVAL, "%s: 'pre_tokenizer.pretokenizers[0].pattern': expected {\"Regex\": string}",
                          path);
    if (!behavior || strcmp(behavior, "Isolated") != 0 || !json_is_false_or_absent(json_object_get(split, "invert")))
        return mm3_errorf(-EINVAL, "%s: 'pre_tokenizer.pretokenizers[0]': expected behavior \"Isolated\", invert false",
                          path);
    if (!json_is_false_or_absent(json_object_get(bl, "add_prefix_space")) ||
        !json_is_false_or_absent(json_object_get(bl, "use_regex")))
        return mm3_errorf(-EINVAL, "%s: 'pre_tokenizer.pretokenizers[1]': expected ByteLevel with add_prefix_space "
                          "false and use_regex false", path);
    char *pcre = NULL;
    int rc = translate_split_regex(pattern, &pcre, path);
    if (rc < 0) return rc;
    rc = tok_regex_compile(&tok->split_re, pcre, 0, path);
    free(pcre);
    return rc;
}

static int check_model_options(const json_t *model, const char *path)
{
    const json_t *dropout = json_object_get(model, "dropout");
    if (!json_is_object(model) || (json_object_get(model, "type") && !json_type_is(model, "BPE")))
        return mm3_errorf(-EINVAL, "%s: 'model': expected a BPE model object", path);
    if (dropout && !json_is_null(dropout))
        return mm3_errorf(-EINVAL, "%s: 'model.dropout': expected null", path);
    if (!json_is_empty_or_null(json_object_get(model, "continuing_subword_prefix")) ||
        !json_is_empty_or_null(json_object_get(model, "end_of_word_suffix")))
        return mm3_errorf(-EINVAL, "%s: 'model': expected no continuing_subword_prefix / end_of_word_suffix", path);
    if (!json_is_false_or_absent(json_object_get(model, "byte_fallback")))
        return mm3_errorf(-EINVAL, "%s: 'model.byte_fallback': expected false", path);
    if (!json_is_false_or_absent(json_object_get(model, "ignore_merges")))
        return mm3_errorf(-EINVAL, "%s: 'model.ignore_merges': expected false", path);
    return 0;
}

/* Nothing may add, drop or pad tokens behind the template's back. */
static int check_post_processing(const json_t *root, const char *path)
{
    const json_t *pp = json_object_get(root, "post_processor");
    if (pp && !json_is_null(pp) && !json_type_is(pp, "ByteLevel"))
        return mm3_errorf(-EINVAL, "%s: 'post_processor': expected null or ByteLevel (no added BOS/EOS)", path);
    const json_t *tr = json_object_get(root, "truncation"), *pad = json_object_get(root, "padding");
    if ((tr && !json_is_null(tr)) || (pad && !json_is_null(pad)))
        return mm3_errorf(-EINVAL, "%s: 'truncation' and 'padding': expected null", path);
    return 0;
}

/* GPT-2's byte -> printable code point alphabet. */
static uint32_t byte_level_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned k = 0; /* rank of b among the remapped bytes */
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) k++;
    return 256 + k;
}

static int build_vocab(struct tok_strmap *vocab, const json_t *v, const char *path)
{
    if (!json_is_object(v)) return mm3_errorf(-EINVAL, "%s: 'model.vocab': expected an object", path);
    int rc = tok_strmap_init(vocab, json_object_size(v));
    if (rc < 0) return rc;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= INT32_MAX)
            return mm3_errorf(-EINVAL, "%s: 'model.vocab' entry \"%s\": expected an id in [0, 2^31-1)", path, key);
        rc = tok_strmap_put(vocab, key, strlen(key), (int32_t)id);
        if (rc < 0) return rc;
    }
    return 0;
}

static int build_byte_ids(struct tokenizer *tok, const struct tok_strmap *vocab, const char *path)
{
    for (unsigned b = 0; b < 256; b++) {
        utf8proc_uint8_t enc[4];
        utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)byte_level_cp(b), enc);
        tok->bpe.byte_id[b] = tok_strmap_get(vocab, (const char *)enc, (size_t)n);
        if (tok->bpe.byte_id[b] < 0)
            return mm3_errorf(-EINVAL, "%s: 'model.vocab' lacks the byte-level token of byte 0x%02x", path, b);
    }
    return 0;
}

static int build_merges(struct tokenizer *tok, const struct tok_strmap *vocab, const json_t *merges,
                        const char *path)
{
    if (!json_is_array(merges)) return mm3_errorf(-EINVAL, "%s: 'model.merges': expected an array", path);
    size_t n = json_array_size(merges);
    if (n >= INT32_MAX) return mm3_errorf(-EINVAL, "%s: 'model.merges': too many merges (%zu)", path, n);
    int rc = tok_pairmap_init(&tok->bpe.merges, n);
    if (rc < 0) return rc;
    struct pystr_buf joined = {0};
    for (size_t i = 0; i < n && rc == 0; i++) {
        const json_t *m = json_array_get(merges, i);
        const char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
            json_is_string(json_array_get(m, 1))) { /* [["a", "b"], ...] */
            a = json_string_value(json_array_get(m, 0));
            la = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            lb = json_string_length(json_array_get(m, 1));
        } else if (json_is_string(m)) { /* older ["a b", ...]: split at the first space */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (sp) {
                la = (size_t)(sp - a);
                b = sp + 1;
                lb = json_string_length(m) - la - 1;
            }
        }
        if (!b) {
            rc = mm3_errorf(-EINVAL, "%s: 'model.merges[%zu]': expected [\"a\", \"b\"] or \"a b\"", path, i);
            break;
        }
        joined.len = 0;
        rc = pystr_buf_append(&joined, a, la);
        if (rc == 0) rc = pystr_buf_append(&joined, b, lb);
        if (rc < 0) break;
        int32_t ia = tok_strmap_get(vocab, a, la), ib = tok_strmap_get(vocab, b, lb);
        int32_t ij = tok_strmap_get(vocab, joined.p, joined.len);
        if (ia < 0 || ib < 0 || ij < 0) {
            rc = mm3_errorf(-EINVAL, "%s: 'model.merges[%zu]' (\"%.*s\" + \"%.*s\"): token \"%.*s\" is not in "
                            "model.vocab", path, i, (int)la, a, (int)lb, b,
                            ia < 0 ? (int)la : ib < 0 ? (int)lb : (int)joined.len,
                            ia < 0 ? a : ib < 0 ? b : joined.p);
            break;
        }
        /* A repeated pair keeps its last rank, as HF's HashMap collect does. */
        rc = tok_pairmap_put(&tok->bpe.merges, tok_bpe_pair_key(ia, ib), (int32_t)i, ij);
    }
    pystr_buf_free(&joined);
    return rc;
}

/* Ids as HF `tokenizers` assigns them when it reads the file: the "id" field is
 * only advisory. A content that model.vocab has keeps that id, a repeated
 * content keeps its first id, and every other token takes the next id counting
 * from the number of model.vocab entries, in file order. */
static int32_t added_effective_id(const struct tok_strmap *vocab, const struct tok_strmap *seen,
                                  const char *content, size_t len, int32_t *next_id)
{
    int32_t id = tok_strmap_get(vocab, content, len);
    if (id < 0) id = tok_strmap_get(seen, content, len);
    if (id < 0) id = (*next_id)++;
    return id;
}

static int build_added(struct tokenizer *tok, const json_t *root, const struct tok_strmap *vocab,
                       const char *path)
{
    const json_t *arr = json_object_get(root, "added_tokens");
    if (arr && !json_is_array(arr)) return mm3_errorf(-EINVAL, "%s: 'added_tokens': expected an array", path);
    size_t n = json_array_size(arr);
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    if (!tok->added) return mm3_errorf(-ENOMEM, "tokenizer: out of memory");
    struct tok_strmap seen;
    int rc = tok_strmap_init(&seen, n);
    if (rc == 0) rc = trie_init(&tok->raw);
    if (rc == 0) rc = trie_init(&tok->norm);
    int32_t next_id = (int32_t)vocab->n;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const json_t *t = json_array_get(arr, i);
        const json_t *content = json_object_get(t, "content"), *id = json_object_get(t, "id");
        if (!json_is_string(content) || !json_is_integer(id)) {
            rc = mm3_errorf(-EINVAL, "%s: 'added_tokens[%zu]': expected a string \"content\" and an integer \"id\"",
                            path, i);
            break;
        }
        if (json_string_length(content) == 0) continue; /* HF ignores empty tokens */
        if (!json_is_false_or_absent(json_object_get(t, "lstrip")) ||
            !json_is_false_or_absent(json_object_get(t, "rstrip")) ||
            !json_is_false_or_absent(json_object_get(t, "single_word"))) {
            rc = mm3_errorf(-EINVAL, "%s: 'added_tokens[%zu]' (\"%s\"): lstrip, rstrip and single_word must be false",
                            path, i, json_string_value(content));
            break;
        }
        struct tok_added *a = &tok->added[tok->n_added];
        a->len = json_string_length(content);
        a->text = malloc(a->len + 1);
        if (!a->text) {
            rc = mm3_errorf(-ENOMEM, "tokenizer: out of memory");
            break;
        }
        memcpy(a->text, json_string_value(content), a->len + 1);
        tok->n_added++;
        a->id = added_effective_id(vocab, &seen, a->text, a->len, &next_id);
        if (a->id != json_integer_value(id))
            LOG_WARN("%s: added token \"%s\" says id %lld but gets id %d (HF tokenizers assigns it)", path, a->text,
                     (long long)json_integer_value(id), a->id);
        rc = tok_strmap_put(&seen, a->text, a->len, a->id);
        /* HF's default for a missing flag: special tokens are not normalised. */
        const json_t *normalized = json_object_get(t, "normalized");
        bool is_norm = normalized ? json_is_true(normalized) : !json_is_true(json_object_get(t, "special"));
        if (rc < 0) break;
        if (!is_norm || !tok->nfc) {
            rc = trie_insert(is_norm ? &tok->norm : &tok->raw, a->text, a->len, a->id);
        } else { /* matched against normalised text, so normalise the content too */
            char *norm_text = NULL;
            size_t norm_len = 0;
            rc = tok_nfc(a->text, a->len, &norm_text, &norm_len);
            if (rc == 0 && norm_len) rc = trie_insert(&tok->norm, norm_text, norm_len, a->id);
            free(norm_text);
        }
    }
    tok_strmap_free(&seen);
    return rc;
}

static int check_pinned(const struct tokenizer *tok, const char *path)
{
    for (size_t i = 0; i < sizeof pinned_tokens / sizeof pinned_tokens[0]; i++) {
        int id = tokenizer_token_id(tok, pinned_tokens[i].text);
        if (id != pinned_tokens[i].id)
            return mm3_errorf(-EINVAL, "%s: added token \"%s\" %s %d, expected %d (the model's pinned id)", path,
                              pinned_tokens[i].text, id < 0 ? "is missing:" : "has id", id, pinned_tokens[i].id);
    }
    return 0;
}

static int load_from_json(struct tokenizer *tok, const json_t *root, const char *path)
{
    if (!json_is_object(root)) return mm3_errorf(-EINVAL, "%s: expected a JSON object", path);
    const json_t *model = json_object_get(root, "model");
    int rc = check_model_options(model, path);
    if (rc == 0) rc = check_post_processing(root, path);
    if (rc == 0) rc = check_normalizer(tok, root, path);
    if (rc == 0) rc = check_pre_tokenizer(tok, root, path);
    if (rc < 0) return rc;
    struct tok_strmap vocab;
    memset(&vocab, 0, sizeof vocab);
    rc = build_vocab(&vocab, json_object_get(model, "vocab"), path);
    if (rc == 0) rc = build_added(tok, root, &vocab, path);
    if (rc == 0) rc = check_pinned(tok, path);
    if (rc == 0) rc = build_byte_ids(tok, &vocab, path);
    if (rc == 0) rc = build_merges(tok, &vocab, json_object_get(model, "merges"), path);
    tok_strmap_free(&vocab);
    return rc;
}

int tokenizer_load(struct tokenizer **out, const char *path)
{
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return mm3_errorf(-EINVAL, "%s: line %d column %d: %s", path, jerr.line, jerr.column, jerr.text);
    struct tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        json_decref(root);
        return mm3_errorf(-ENOMEM, "%s: out of memory", path);
    }
    int rc = load_from_json(tok, root, path);
    json_decref(root);
    if (rc < 0) {
        tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

void tokenizer_free(struct tokenizer *tok)
{
    if (!tok) return;
    for (int i = 0; i < tok->n_added; i++) free(tok->added[i].text);
    free(tok->added);
    trie_free(&tok->raw);
    trie_free(&tok->norm);
    tok_pairmap_free(&tok->bpe.merges);
    pcre2_code_free(tok->split_re);
    free(tok);
}

int tokenizer_token_id(const struct tokenizer *tok, const char *token)
{
    size_t n = strlen(token);
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && memcmp(tok->added[i].text, token, n) == 0) return tok->added[i].id;
    return -1;
}

/* ---- encoding ---- */

struct encoder {
    const struct tokenizer *tok;
    struct tok_ids ids;
    struct tok_bpe_scratch scratch;
    struct tok_regex_matcher re;
};

/* Split by the pre-tokenizer regex (Isolated: matches and the gaps between them
 * are pre-tokens) and BPE each piece. */
static int encode_pretokens(struct encoder *e, const char *s, size_t n)
{
    size_t pos = 0, piece = 0;
    while (pos < n) {
        int rc = tok_regex_find(&e->re, e->tok->split_re, s, n, pos, 0, "text");
        if (rc < 0) return rc;
        if (rc == 0) break;
        const PCRE2_SIZE *ov = tok_regex_ovector(&e->re);
        if (ov[1] == ov[0]) { /* an empty match splits nothing; move one character on */
            pystr_next_cp(s, n, &pos);
            continue;
        }
        if (ov[0] > piece) {
            rc = tok_bpe_encode_word(&e->tok->bpe, (const unsigned char *)s + piece, ov[0] - piece, &e->ids,
                                     &e->scratch);
            if (rc < 0) return rc;
        }
        rc = tok_bpe_encode_word(&e->tok->bpe, (const unsigned char *)s + ov[0], ov[1] - ov[0], &e->ids,
                                 &e->scratch);
        if (rc < 0) return rc;
        pos = piece = ov[1];
    }
    if (piece < n)
        return tok_bpe_encode_word(&e->tok->bpe, (const unsigned char *)s + piece, n - piece, &e->ids,
                                   &e->scratch);
    return 0;
}

/* Cut s at the added tokens of trie t (leftmost-longest): tokens become their ids,
 * gaps go to next(). */
static int split_added(struct encoder *e, const struct tok_trie *t, const char *s, size_t n,
                       int (*next)(struct encoder *, const char *, size_t))
{
    size_t gap = 0, i = 0;
    while (i < n) {
        int32_t id;
        size_t len = t->n_nodes > 1 ? trie_longest(t, s, n, i, &id) : 0;
        if (!len) {
            i++;
            continue;
        }
        int rc = gap < i ? next(e, s + gap, i - gap) : 0;
        if (rc == 0) rc = tok_ids_push(&e->ids, id);
        if (rc < 0) return rc;
        i += len;
        gap = i;
    }
    return gap < n ? next(e, s + gap, n - gap) : 0;
}

static int encode_normalized(struct encoder *e, const char *s, size_t n)
{
    return split_added(e, &e->tok->norm, s, n, encode_pretokens);
}

static int encode_gap(struct encoder *e, const char *s, size_t n)
{
    if (!e->tok->nfc) return encode_normalized(e, s, n);
    char *norm = NULL;
    size_t norm_len = 0;
    int rc = tok_nfc(s, n, &norm, &norm_len);
    if (rc < 0) return rc;
    rc = encode_normalized(e, norm, norm_len);
    free(norm);
    return rc;
}

int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    int rc = pystr_utf8_check(text, len, "text");
    if (rc < 0) return rc;
    struct encoder e = {.tok = tok};
    rc = tok_regex_matcher_init(&e.re);
    if (rc == 0) rc = split_added(&e, &tok->raw, text, len, encode_gap);
    if (rc == 0 && e.ids.n > INT32_MAX) rc = mm3_errorf(-E2BIG, "text: %zu tokens is too many", e.ids.n);
    if (rc == 0 && !e.ids.v) { /* never hand out NULL, even for no ids */
        e.ids.v = malloc(sizeof *e.ids.v);
        if (!e.ids.v) rc = mm3_errorf(-ENOMEM, "tokenizer: out of memory");
    }
    tok_regex_matcher_free(&e.re);
    tok_bpe_scratch_free(&e.scratch);
    if (rc < 0) {
        free(e.ids.v);
        return rc;
    }
    *ids = e.ids.v;
    *n_ids = (int)e.ids.n;
    return 0;
}
