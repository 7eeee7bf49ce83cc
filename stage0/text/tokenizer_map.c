/* Hash tables of the tokenizer (see tokenizer_map.h): linear probing, load <= 1/2. */
#include "stage0/text/tokenizer_map.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static size_t cap_for(size_t expected)
{
    size_t cap = 16;
    while (cap < 2 * expected + 2) cap *= 2;
    return cap;
}

static uint64_t mix64(uint64_t x) /* splitmix64 finaliser */
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t hash_bytes(const char *s, size_t n) /* FNV-1a */
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return mix64(h);
}

/* ---- u64 -> (int32, int32) ---- */

int tok_pairmap_init(struct tok_pairmap *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    m->cap = cap_for(expected);
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->vals = malloc(m->cap * 2 * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        tok_pairmap_free(m);
        return mm3_errorf(-ENOMEM, "tokenizer: out of memory for a %zu-slot table", cap_for(expected));
    }
    for (size_t i = 0; i < m->cap; i++) m->keys[i] = TOK_PAIRMAP_EMPTY;
    return 0;
}

void tok_pairmap_free(struct tok_pairmap *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t pairmap_slot(const struct tok_pairmap *m, uint64_t key)
{
    size_t i = (size_t)mix64(key) & (m->cap - 1);
    while (m->keys[i] != TOK_PAIRMAP_EMPTY && m->keys[i] != key) i = (i + 1) & (m->cap - 1);
    return i;
}

int tok_pairmap_put(struct tok_pairmap *m, uint64_t key, int32_t a, int32_t b)
{
    if (2 * (m->n + 1) > m->cap) {
        struct tok_pairmap big;
        int rc = tok_pairmap_init(&big, m->cap);
        if (rc < 0) return rc;
        for (size_t i = 0; i < m->cap; i++) {
            if (m->keys[i] == TOK_PAIRMAP_EMPTY) continue;
            size_t j = pairmap_slot(&big, m->keys[i]);
            big.keys[j] = m->keys[i];
            big.vals[2 * j] = m->vals[2 * i];
            big.vals[2 * j + 1] = m->vals[2 * i + 1];
            big.n++;
        }
        tok_pairmap_free(m);
        *m = big;
    }
    size_t i = pairmap_slot(m, key);
    if (m->keys[i] == TOK_PAIRMAP_EMPTY) m->n++;
    m->keys[i] = key;
    m->vals[2 * i] = a;
    m->vals[2 * i + 1] = b;
    return 0;
}

const int32_t *tok_pairmap_get(const struct tok_pairmap *m, uint64_t key)
{
    if (!m->cap) return NULL;
    size_t i = pairmap_slot(m, key);
    return m->keys[i] == TOK_PAIRMAP_EMPTY ? NULL : &m->vals[2 * i];
}

/* ---- bytes -> int32 ---- */

int tok_strmap_init(struct tok_strmap *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    m->cap = cap_for(expected);
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->lens = malloc(m->cap * sizeof *m->lens);
    m->hashes = malloc(m->cap * sizeof *m->hashes);
    m->vals = malloc(m->cap * sizeof *m->vals);
    if (!m->keys || !m->lens || !m->hashes || !m->vals) {
        tok_strmap_free(m);
        return mm3_errorf(-ENOMEM, "tokenizer: out of memory for a %zu-slot table", cap_for(expected));
    }
    return 0;
}

void tok_strmap_free(struct tok_strmap *m)
{
    free(m->keys);
    free(m->lens);
    free(m->hashes);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t strmap_slot(const struct tok_strmap *m, const char *key, size_t len, uint64_t h)
{
    size_t i = (size_t)h & (m->cap - 1);
    while (m->keys[i] && !(m->hashes[i] == h && m->lens[i] == len && memcmp(m->keys[i], key, len) == 0))
        i = (i + 1) & (m->cap - 1);
    return i;
}

int tok_strmap_put(struct tok_strmap *m, const char *key, size_t len, int32_t val)
{
    if (2 * (m->n + 1) > m->cap) {
        struct tok_strmap big;
        int rc = tok_strmap_init(&big, m->cap);
        if (rc < 0) return rc;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->keys[i]) continue;
            size_t j = strmap_slot(&big, m->keys[i], m->lens[i], m->hashes[i]);
            big.keys[j] = m->keys[i];
            big.lens[j] = m->lens[i];
            big.hashes[j] = m->hashes[i];
            big.vals[j] = m->vals[i];
            big.n++;
        }
        tok_strmap_free(m);
        *m = big;
    }
    uint64_t h = hash_bytes(key, len);
    size_t i = strmap_slot(m, key, len, h);
    if (!m->keys[i]) m->n++;
    m->keys[i] = key;
    m->lens[i] = len;
    m->hashes[i] = h;
    m->vals[i] = val;
    return 0;
}

int32_t tok_strmap_get(const struct tok_strmap *m, const char *key, size_t len)
{
    if (!m->cap) return -1;
    size_t i = strmap_slot(m, key, len, hash_bytes(key, len));
    return m->keys[i] ? m->vals[i] : -1;
}
