/* Fuzz target: arbitrary bytes as text through the tokenizer and the prompt
 * contract, with the tiny test tokenizer (test/data/tokenizer/tiny-tokenizer.json,
 * the release pipeline with a small vocabulary) loaded once.
 *
 * Input: byte 0 picks the entry point, the rest is the text:
 *   0: tokenizer_encode(text)
 *   1: prompt_encode_pair(caption, lyrics), the two split at "\n--\n"
 *   2: prompt_clean_caption, prompt_normalize_lyrics, prompt_assemble (same split)
 * Oracles: invalid UTF-8 is refused (-EINVAL), valid UTF-8 is encoded; ids are
 * non-negative; the unconditional twin keeps the first and last two ids. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"
#include "common/log.h"
#include "stage0/text/prompt.h"
#include "stage0/text/tokenizer.h"
#include "test/fuzz/fuzz_support.h"

static struct tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mm3_log_set_level(MM3_LOG_ERROR);
    char path[4096];
    snprintf(path, sizeof path, "%s/test/data/tokenizer/tiny-tokenizer.json", fuzz_source_dir());
    if (tokenizer_load(&g_tok, path) < 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", mm3_last_error());
        abort();
    }
    return 0;
}

/* Independent of the code under test: utf8proc's strict decoder over the bytes. */
static int utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

static void run_encode(const uint8_t *text, size_t n)
{
    char *s = fuzz_strndup(text, n);
    int32_t *ids = NULL;
    int n_ids = -1;
    int rc = tokenizer_encode(g_tok, s, n, &ids, &n_ids);
    fuzz_note("tokenizer_encode", rc);
    int valid = utf8_valid(text, n);
    if (valid && rc < 0) fuzz_fail("valid UTF-8 of %zu bytes refused: %s", n, mm3_last_error());
    if (!valid && rc != -EINVAL) fuzz_fail("invalid UTF-8 gave %d, expected -EINVAL", rc);
    if (rc == 0) {
        if (!ids || n_ids < 0) fuzz_fail("success without ids");
        if (n > 0 && n_ids == 0) fuzz_fail("%zu bytes of text gave no ids", n);
        for (int i = 0; i < n_ids; i++)
            if (ids[i] < 0) fuzz_fail("id %d at %d", ids[i], i);
    }
    free(ids);
    free(s);
}

static void run_pair(const char *caption, const char *lyrics, int valid)
{
    int32_t *ids = NULL;
    int n = -1;
    int rc = prompt_encode_pair(g_tok, caption, lyrics, &ids, &n);
    fuzz_note("prompt_encode_pair", rc);
    if (!valid && rc == 0) fuzz_fail("invalid UTF-8 prompt accepted");
    if (rc == 0) {
        if (n < 3 || n > PROMPT_MAX_TOKENS) fuzz_fail("prompt of %d ids", n);
        const int32_t *c = ids, *u = ids + n;
        if (c[0] != u[0] || c[n - 1] != u[n - 1] || c[n - 2] != u[n - 2]) fuzz_fail("twin changed the fixed ids");
        free(ids);
    }
}

static void run_clean(const char *caption, const char *lyrics, int valid_c, int valid_l)
{
    char *out = NULL;
    int rc = prompt_clean_caption(caption, &out);
    fuzz_note("prompt_clean_caption", rc);
    if (!valid_c && rc == 0) fuzz_fail("invalid UTF-8 caption cleaned");
    if (rc == 0 && !utf8_valid((const uint8_t *)out, strlen(out))) fuzz_fail("cleaned caption is not UTF-8");
    free(out);
    out = NULL;
    rc = prompt_normalize_lyrics(lyrics, &out);
    if (!valid_l && rc == 0) fuzz_fail("invalid UTF-8 lyrics normalised");
    if (rc == 0 && !utf8_valid((const uint8_t *)out, strlen(out))) fuzz_fail("normalised lyrics are not UTF-8");
    free(out);
    out = NULL;
    if (prompt_assemble(caption, lyrics, &out) == 0) free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    int mode = data[0] % 3;
    data++;
    size--;
    if (mode == 0) {
        run_encode(data, size);
    } else {
        struct fuzz_part p[2];
        int n = fuzz_split(data, size, p, 2);
        char *caption = fuzz_strndup(p[0].data, p[0].size);
        char *lyrics = fuzz_strndup(n > 1 ? p[1].data : (const uint8_t *)"", n > 1 ? p[1].size : 0);
        int valid_c = utf8_valid((const uint8_t *)caption, strlen(caption));
        int valid_l = utf8_valid((const uint8_t *)lyrics, strlen(lyrics));
        if (mode == 1) run_pair(caption, lyrics, valid_c && valid_l);
        else run_clean(caption, lyrics, valid_c, valid_l);
        free(caption);
        free(lyrics);
    }
    mm3_error_clear();
    return 0;
}
