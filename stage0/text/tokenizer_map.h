/* Open-addressing hash tables for the tokenizer: (u64 key -> two int32) for BPE
 * merges and trie edges, and (borrowed byte string -> int32) for the vocabulary
 * while tokenizer.json is being read. Both grow as needed. */
#ifndef MM3_TOKENIZER_MAP_H
#define MM3_TOKENIZER_MAP_H

#include <stddef.h>
#include <stdint.h>

struct tok_pairmap {
    uint64_t *keys; /* TOK_PAIRMAP_EMPTY marks a free slot */
    int32_t *vals;  /* two per slot */
    size_t cap;     /* power of two */
    size_t n;
};

#define TOK_PAIRMAP_EMPTY UINT64_MAX

int tok_pairmap_init(struct tok_pairmap *m, size_t expected);
void tok_pairmap_free(struct tok_pairmap *m);
/* Insert or overwrite. key must not be TOK_PAIRMAP_EMPTY. */
int tok_pairmap_put(struct tok_pairmap *m, uint64_t key, int32_t a, int32_t b);
/* The two values of key, or NULL. */
const int32_t *tok_pairmap_get(const struct tok_pairmap *m, uint64_t key);

struct tok_strmap {
    const char **keys; /* borrowed, NULL = free slot */
    size_t *lens;
    uint64_t *hashes; /* compared first: most probes then never touch the key bytes */
    int32_t *vals;
    size_t cap;
    size_t n;
};

int tok_strmap_init(struct tok_strmap *m, size_t expected);
void tok_strmap_free(struct tok_strmap *m);
/* Insert or overwrite; the key bytes must outlive the map. */
int tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int32_t val);
/* Value of key, or -1. */
int32_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len);

#endif
