/* Prompt template, tokenisation, length cap and CFG twin (docs/model.md §3.3-3.5). */
#include "stage0/text/prompt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "stage0/text/prompt_pystr.h"

#define AUDIO_CFG_ID 151654

/* The reference's check_inputs: a field that is empty after str.strip() is an error. */
static int check_field(const char *s, const char *field)
{
    size_t n = strlen(s), b, e;
    int rc = pystr_utf8_check(s, n, field);
    if (rc < 0) return rc;
    pystr_strip(s, n, &b, &e);
    if (b == e) return mm3_errorf(-EINVAL, "%s: must not be empty or whitespace only", field);
    return 0;
}

int prompt_assemble(const char *caption, const char *lyrics, char **out)
{
    *out = NULL;
    int rc = check_field(caption, "caption");
    if (rc == 0) rc = check_field(lyrics, "lyrics");
    if (rc < 0) return rc;
    char *cap = NULL, *lyr = NULL;
    rc = prompt_clean_caption(caption, &cap);
    if (rc == 0) rc = prompt_normalize_lyrics(lyrics, &lyr);
    struct pystr_buf b = {0};
    const char *parts[] = {"<|im_start|><|caption_start|>", cap, "<|caption_end|><|lyrics_start|>", lyr,
                           "<|lyrics_end|><|im_end|><|audio_start|>"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0] && rc == 0; i++)
        rc = pystr_buf_append(&b, parts[i], strlen(parts[i]));
    free(cap);
    free(lyr);
    if (rc == 0) {
        *out = pystr_buf_take(&b);
        if (!*out) rc = mm3_errorf(-ENOMEM, "prompt: out of memory");
    }
    pystr_buf_free(&b);
    return rc;
}

int prompt_encode_pair(const struct tokenizer *tok, const char *caption, const char *lyrics,
                       int32_t **ids_pair, int *n)
{
    *ids_pair = NULL;
    *n = 0;
    char *text;
    int rc = prompt_assemble(caption, lyrics, &text);
    if (rc < 0) return rc;
    int32_t *ids;
    int p;
    rc = tokenizer_encode(tok, text, strlen(text), &ids, &p);
    free(text);
    if (rc < 0) return mm3_error_prefix(rc, "prompt: ");
    if (p > PROMPT_MAX_TOKENS) {
        free(ids);
        return mm3_errorf(-E2BIG, "prompt: the assembled prompt has %d tokens; the maximum is %d", p,
                          PROMPT_MAX_TOKENS);
    }
    int32_t *pair = malloc(2 * (size_t)p * sizeof *pair);
    if (!pair) {
        free(ids);
        return mm3_errorf(-ENOMEM, "prompt: out of memory for %d ids", 2 * p);
    }
    memcpy(pair, ids, (size_t)p * sizeof *pair);
    memcpy(pair + p, ids, (size_t)p * sizeof *pair);
    /* uncond[1:-2] = <|audio_cfg|>: keep <|im_start|> and the trailing <|im_end|><|audio_start|>. */
    for (int i = 1; i < p - 2; i++) pair[p + i] = AUDIO_CFG_ID;
    free(ids);
    *ids_pair = pair;
    *n = p;
    return 0;
}
