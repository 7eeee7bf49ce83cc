/* Qwen2-style byte-level BPE tokenizer read from a HF `tokenizer.json`.
 *
 * Encoding gives the ids HF `tokenizers` (0.23, the reference's) gives for the
 * pipeline the checkpoint ships:
 *   1. added tokens with normalized: false are found in the raw text first,
 *      leftmost-longest, and become their ids;
 *   2. each gap is NFC-normalised (utf8proc, held to HF's Unicode 9 tables:
 *      tokenizer_nfc.h), then normalized added tokens are found in it;
 *   3. the rest is split by the pre-tokenizer regex (PCRE2 with UTF, UCP and JIT;
 *      `\s`, `\p{L}`, `\p{N}` widened to what HF's Oniguruma matches; Isolated:
 *      matches and gaps are both pre-tokens), and each pre-token is BPE-merged by
 *      merge rank over its bytes (tokenizer_bpe.h).
 * No BOS/EOS is added. Added tokens get the ids HF assigns on load (the model.vocab
 * id of the same content, else the next id after model.vocab), not the advisory
 * "id" field. tokenizer_load() refuses a tokenizer.json whose pipeline differs
 * (another normalizer, pre-tokenizer, model option, post-processor, truncation or
 * padding) and one whose special tokens are not at the ids the model was trained
 * with (<|im_start|> 151644 ... <|lyrics_end|> 151674). Merges may be given as
 * [["a", "b"], ...] or as the older ["a b", ...].
 *
 * A loaded tokenizer is immutable: encode may run on several threads at once. */
#ifndef MM3_TOKENIZER_H
#define MM3_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer; /* opaque */

/* Read and validate tokenizer.json; the JSON tree is freed before returning. */
int tokenizer_load(struct tokenizer **tok, const char *tokenizer_json_path);
void tokenizer_free(struct tokenizer *tok);

/* Encode UTF-8 text (special tokens recognised anywhere in the raw text). *ids
 * malloc'ed (never NULL on success, even for 0 ids). Invalid UTF-8 is -EINVAL. */
int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, int32_t **ids, int *n_ids);

/* Id of an added/special token string, or -1. */
int tokenizer_token_id(const struct tokenizer *tok, const char *token);

#endif
