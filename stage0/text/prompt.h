/* The stage-0 prompt contract (docs/model.md §3): caption cleaning and
 * lyrics normalisation with the reference's Python semantics, the special-token
 * template, tokenisation, the 5000-token cap and the unconditional (CFG) twin.
 *
 *   <|im_start|><|caption_start|>{clean(caption)}<|caption_end|>
 *   <|lyrics_start|>{norm(lyrics)}<|lyrics_end|><|im_end|><|audio_start|>
 * (one line, nothing between the pieces). All functions are thread-safe. */
#ifndef MM3_PROMPT_H
#define MM3_PROMPT_H

#include <stdint.h>

#include "stage0/text/prompt_clean.h"
#include "stage0/text/tokenizer.h"

#define PROMPT_MAX_TOKENS 5000

/* The assembled template text (malloc'ed). Rejects empty (after strip) caption/lyrics
 * and invalid UTF-8 with a message naming the field ("caption" / "lyrics"). */
int prompt_assemble(const char *caption, const char *lyrics, char **out);

/* Full contract: assemble + tokenize + cap check (> PROMPT_MAX_TOKENS is -E2BIG
 * naming the count) + unconditional twin (every id but the first and the last two
 * replaced by <|audio_cfg|>). ids_pair: [2][n] row-major (row 0 cond, row 1
 * uncond), malloc'ed. */
int prompt_encode_pair(const struct tokenizer *tok, const char *caption, const char *lyrics,
                       int32_t **ids_pair, int *n);

#endif
