#include "stage0/text/generate_prompt.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "stage0/text/prompt.h"
#include "stage0/text/tokenizer.h"

int generate_prompt_ids(const char *ckpt_root, const char *caption, const char *lyrics, int32_t **ids_pair, int *n)
{
    *ids_pair = NULL;
    *n = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", ckpt_root);
    struct tokenizer *tok;
    int rc = tokenizer_load(&tok, path);
    if (rc < 0) return rc;
    int len = 0;
    rc = prompt_encode_pair(tok, caption, lyrics, ids_pair, &len);
    tokenizer_free(tok);
    if (rc < 0) return rc;
    *n = 2 * len;
    return 0;
}
