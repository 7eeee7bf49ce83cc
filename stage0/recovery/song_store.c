#include "stage0/recovery/song_store.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* A list in the order the songs were put (oldest first): eviction takes the head. */
struct song_node {
    struct song_record rec;
    int64_t bytes;
    struct song_node *next;
};

struct song_store {
    struct song_store_limits lim;
    pthread_mutex_t mu;
    struct song_node *head, *tail;
    int n;
    int64_t bytes;
};

int song_store_create(struct song_store **out, const struct song_store_limits *lim)
{
    *out = NULL;
    if (lim->max_songs < 0 || lim->max_bytes < 0 || !(lim->max_age_s >= 0))
        return mm3_errorf(-EINVAL, "song store: max_songs %d, max_bytes %lld, max_age_s %g: expected >= 0",
                          lim->max_songs, (long long)lim->max_bytes, lim->max_age_s);
    struct song_store *st = calloc(1, sizeof *st);
    if (!st) return mm3_errorf(-ENOMEM, "song store: out of memory");
    st->lim = *lim;
    pthread_mutex_init(&st->mu, NULL);
    *out = st;
    return 0;
}

void song_record_free(struct song_record *r)
{
    if (!r) return;
    mm3_job_params_free(&r->params);
    free(r->codes);
    r->codes = NULL;
}

static void node_free(struct song_node *n)
{
    song_record_free(&n->rec);
    free(n);
}

void song_store_destroy(struct song_store *st)
{
    if (!st) return;
    for (struct song_node *n = st->head, *next; n; n = next) {
        next = n->next;
        node_free(n);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

int64_t song_store_bytes(const struct mm3_job_params *p, int n_steps, int n_codebooks)
{
    return (int64_t)sizeof(int32_t) * n_steps * n_codebooks + (int64_t)strlen(p->caption) + strlen(p->lyrics) +
           (int64_t)sizeof(struct song_node);
}

/* Unlink node n (prev before it, NULL for the head); st->mu held. */
static void unlink_locked(struct song_store *st, struct song_node *prev, struct song_node *n)
{
    if (prev)
        prev->next = n->next;
    else
        st->head = n->next;
    if (st->tail == n) st->tail = prev;
    st->n--;
    st->bytes -= n->bytes;
}

/* The node of id and the one before it, or NULL; st->mu held. */
static struct song_node *find_locked(struct song_store *st, const char *id, struct song_node **prev)
{
    *prev = NULL;
    for (struct song_node *n = st->head; n; *prev = n, n = n->next)
        if (strcmp(n->rec.id, id) == 0) return n;
    return NULL;
}

static int record_copy(struct song_record *dst, const struct song_record *src)
{
    *dst = *src;
    dst->params.caption = strdup(src->params.caption);
    dst->params.lyrics = strdup(src->params.lyrics);
    dst->params.replay_file = NULL;
    dst->params.journal = NULL;
    dst->params.journal_len = 0;
    size_t nc = (size_t)src->n_steps * src->n_codebooks;
    dst->codes = malloc(sizeof(int32_t) * (nc ? nc : 1));
    if (!dst->params.caption || !dst->params.lyrics || !dst->codes) {
        song_record_free(dst);
        return mm3_errorf(-ENOMEM, "song store: out of memory");
    }
    memcpy(dst->codes, src->codes, sizeof(int32_t) * nc);
    return 0;
}

int song_store_put(struct song_store *st, const char *id, const struct mm3_job_params *p, const int32_t *codes,
                   int n_steps, int n_codebooks, int64_t now_ns)
{
    if (!id || strlen(id) != MM3_JOB_PUBLIC_ID_LEN || !p->caption || !p->lyrics || n_steps < 0 || n_codebooks < 1 ||
        (n_steps > 0 && !codes))
        return mm3_errorf(-EINVAL, "song store: put needs a %d-character id, caption, lyrics and codes",
                          MM3_JOB_PUBLIC_ID_LEN);
    int64_t bytes = song_store_bytes(p, n_steps, n_codebooks);
    if (st->lim.max_songs == 0 || bytes > st->lim.max_bytes) return 0;
    struct song_node *n = calloc(1, sizeof *n);
    if (!n) return mm3_errorf(-ENOMEM, "song store: out of memory");
    struct song_record src = {.params = *p, .codes = (int32_t *)codes, .n_steps = n_steps,
                              .n_codebooks = n_codebooks, .put_ns = now_ns};
    memcpy(src.id, id, MM3_JOB_PUBLIC_ID_LEN + 1);
    int rc = record_copy(&n->rec, &src);
    if (rc < 0) {
        free(n);
        return rc;
    }
    n->bytes = bytes;
    pthread_mutex_lock(&st->mu);
    struct song_node *prev, *old = find_locked(st, id, &prev);
    if (old) {
        unlink_locked(st, prev, old);
        node_free(old);
    }
    while (st->head && (st->n + 1 > st->lim.max_songs || st->bytes + bytes > st->lim.max_bytes)) {
        struct song_node *h = st->head;
        unlink_locked(st, NULL, h);
        node_free(h);
    }
    if (st->tail)
        st->tail->next = n;
    else
        st->head = n;
    st->tail = n;
    st->n++;
    st->bytes += bytes;
    pthread_mutex_unlock(&st->mu);
    return 0;
}

int song_store_get(struct song_store *st, const char *id, int64_t now_ns, struct song_record *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&st->mu);
    struct song_node *prev, *n = find_locked(st, id, &prev);
    if (n && (double)(now_ns - n->rec.put_ns) > st->lim.max_age_s * 1e9) {
        unlink_locked(st, prev, n);
        node_free(n);
        n = NULL;
    }
    int rc = n ? record_copy(out, &n->rec) : -ENOENT;
    pthread_mutex_unlock(&st->mu);
    return rc;
}

void song_store_usage(struct song_store *st, int *songs, int64_t *bytes)
{
    pthread_mutex_lock(&st->mu);
    *songs = st->n;
    *bytes = st->bytes;
    pthread_mutex_unlock(&st->mu);
}
