/* Prompt -> token id pair for one request: loads the checkpoint's tokenizer and
 * builds the conditional row and its unconditional twin (docs/model.md §3). */
#ifndef MM3_STAGE0_GENERATE_PROMPT_H
#define MM3_STAGE0_GENERATE_PROMPT_H

#include <stdint.h>

/* *ids_pair = malloc'ed [2, P] (row 0 conditional), *n = 2 * P.
 * Errors name the field (caption / lyrics) or the tokenizer file. */
int generate_prompt_ids(const char *ckpt_root, const char *caption, const char *lyrics, int32_t **ids_pair, int *n);

#endif
