/* Byte-level BPE of one pre-token, exactly as HF `tokenizers` BPE::merge_word does
 * it without dropout: every byte starts as its own symbol, then the pair of
 * lowest merge rank is merged (leftmost first on equal rank) until no adjacent
 * pair has a merge. */
#ifndef MM3_TOKENIZER_BPE_H
#define MM3_TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "stage0/text/tokenizer_map.h"

struct tok_bpe {
    int32_t byte_id[256];      /* id of the token of each single byte */
    struct tok_pairmap merges; /* (left id << 32 | right id) -> (rank, merged id) */
};

static inline uint64_t tok_bpe_pair_key(int32_t left, int32_t right)
{
    return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

/* A growable id list. */
struct tok_ids {
    int32_t *v;
    size_t n;
    size_t cap;
};

int tok_ids_push(struct tok_ids *ids, int32_t id);

/* Work arrays reused across the words of one encode call. */
struct tok_bpe_scratch {
    struct tok_bpe_sym *syms;
    struct tok_bpe_merge *heap;
    size_t cap;
};

void tok_bpe_scratch_free(struct tok_bpe_scratch *sc);

/* Append the ids of the byte string s[0..n) to out. */
int tok_bpe_encode_word(const struct tok_bpe *bpe, const unsigned char *s, size_t n, struct tok_ids *out,
                        struct tok_bpe_scratch *sc);

#endif
