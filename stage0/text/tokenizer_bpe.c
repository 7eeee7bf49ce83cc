/* Byte-level BPE merge loop (see tokenizer_bpe.h). The priority queue, the stale
 * entry test (same merged id) and the neighbour updates follow HF's Word::merge_all
 * so that the result is the same on every input, not only on typical ones. */
#include "stage0/text/tokenizer_bpe.h"

#include <errno.h>
#include <stdlib.h>

#include "common/error.h"

struct tok_bpe_sym {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    int32_t len;        /* bytes covered; 0 once merged into its left neighbour */
};

struct tok_bpe_merge {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
};

int tok_ids_push(struct tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? 2 * ids->cap : 256;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return mm3_errorf(-ENOMEM, "tokenizer: out of memory for %zu ids", cap);
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

void tok_bpe_scratch_free(struct tok_bpe_scratch *sc)
{
    free(sc->syms);
    free(sc->heap);
    sc->syms = NULL;
    sc->heap = NULL;
    sc->cap = 0;
}

static int scratch_reserve(struct tok_bpe_scratch *sc, size_t n)
{
    if (n <= sc->cap) return 0;
    if (n > INT32_MAX / 4) return mm3_errorf(-E2BIG, "tokenizer: a pre-token of %zu bytes is too long", n);
    tok_bpe_scratch_free(sc);
    sc->syms = malloc(n * sizeof *sc->syms);
    /* n-1 initial pairs plus at most two new pairs per merge */
    sc->heap = malloc(3 * n * sizeof *sc->heap);
    if (!sc->syms || !sc->heap) {
        tok_bpe_scratch_free(sc);
        return mm3_errorf(-ENOMEM, "tokenizer: out of memory for a %zu-byte pre-token", n);
    }
    sc->cap = n;
    return 0;
}

static int merge_before(const struct tok_bpe_merge *a, const struct tok_bpe_merge *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct tok_bpe_merge *h, size_t *n, struct tok_bpe_merge m)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_before(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct tok_bpe_merge heap_pop(struct tok_bpe_merge *h, size_t *n)
{
    struct tok_bpe_merge top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_before(&h[c + 1], &h[c])) c++;
        if (!merge_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(const struct tok_bpe *bpe, struct tok_bpe_merge *h, size_t *nh,
                      const struct tok_bpe_sym *syms, int32_t pos)
{
    int32_t next = syms[pos].next;
    const int32_t *hit = tok_pairmap_get(&bpe->merges, tok_bpe_pair_key(syms[pos].id, syms[next].id));
    if (hit) heap_push(h, nh, (struct tok_bpe_merge){hit[0], pos, hit[1]});
}

int tok_bpe_encode_word(const struct tok_bpe *bpe, const unsigned char *s, size_t n, struct tok_ids *out,
                        struct tok_bpe_scratch *sc)
{
    if (n == 0) return 0;
    int rc = scratch_reserve(sc, n);
    if (rc < 0) return rc;
    struct tok_bpe_sym *syms = sc->syms;
    struct tok_bpe_merge *heap = sc->heap;
    size_t nh = 0;
    for (size_t i = 0; i < n; i++)
        syms[i] = (struct tok_bpe_sym){bpe->byte_id[s[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
    for (size_t i = 0; i + 1 < n; i++) push_pair(bpe, heap, &nh, syms, (int32_t)i);

    while (nh) {
        struct tok_bpe_merge top = heap_pop(heap, &nh);
        struct tok_bpe_sym *cur = &syms[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        struct tok_bpe_sym right = syms[cur->next];
        const int32_t *now = tok_pairmap_get(&bpe->merges, tok_bpe_pair_key(cur->id, right.id));
        if (!now || now[1] != top.new_id) continue; /* stale: a neighbour changed since the push */
        syms[cur->next].len = 0;
        cur->id = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        if (right.next >= 0) syms[right.next].prev = top.pos;
        if (cur->prev >= 0) push_pair(bpe, heap, &nh, syms, cur->prev);
        if (cur->next >= 0) push_pair(bpe, heap, &nh, syms, top.pos);
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) {
        rc = tok_ids_push(out, syms[i].id);
        if (rc < 0) return rc;
    }
    return 0;
}
