/* What both sides share: message layout and validation, close, stats. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "common/error.h"
#include "shmconn/shmconn_msg.h"
#include "shmconn/shmconn_region.h"

uint32_t shmconn_dtype_size(uint32_t dtype)
{
    if (dtype < (uint32_t)MM3_DTYPE_COUNT) return (uint32_t)mm3_dtype_size((enum mm3_dtype)dtype);
    switch (dtype) {
    case SHMCONN_DTYPE_I16:
        return 2;
    case SHMCONN_DTYPE_I32:
        return 4;
    case SHMCONN_DTYPE_U8:
        return 1;
    default:
        return 0;
    }
}

/* Checks one tensor descriptor (from the caller or from the peer): name
 * terminated, known dtype, sane rank and shape, nbytes = size x product. */
int shmconn_tensor_check(const char *name, uint32_t dtype, uint32_t ndim, const int64_t *shape, uint64_t nbytes,
                         const char *where, uint32_t i)
{
    if (memchr(name, 0, SHMCONN_TENSOR_NAME) == NULL)
        return mm3_errorf(-EINVAL, "%s: tensor %u: name is not NUL-terminated within %d bytes", where, i,
                          SHMCONN_TENSOR_NAME);
    uint64_t n = shmconn_dtype_size(dtype);
    if (n == 0) return mm3_errorf(-EINVAL, "%s: tensor %u '%s': unknown dtype %u", where, i, name, dtype);
    if (ndim > SHMCONN_MAX_DIMS)
        return mm3_errorf(-EINVAL, "%s: tensor %u '%s': ndim %u: expected at most %d", where, i, name, ndim,
                          SHMCONN_MAX_DIMS);
    for (uint32_t d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (uint64_t)shape[d] > (UINT64_C(1) << 40))
            return mm3_errorf(-EINVAL, "%s: tensor %u '%s': shape[%u] = %lld: expected 0..2^40", where, i, name, d,
                              (long long)shape[d]);
        if (shape[d] != 0 && n > UINT64_MAX / (uint64_t)shape[d])
            return mm3_errorf(-EINVAL, "%s: tensor %u '%s': shape overflows", where, i, name);
        n *= (uint64_t)shape[d];
    }
    if (n != nbytes)
        return mm3_errorf(-EINVAL, "%s: tensor %u '%s': nbytes %llu: expected %llu (dtype size x shape)", where, i,
                          name, (unsigned long long)nbytes, (unsigned long long)n);
    return 0;
}

int shmconn_msg_layout(const struct shmconn_msg *m, uint64_t *offsets, uint64_t *total, const char *where)
{
    if (m->n_tensors > SHMCONN_MAX_TENSORS)
        return mm3_errorf(-EINVAL, "%s: n_tensors %u: expected at most %d", where, m->n_tensors, SHMCONN_MAX_TENSORS);
    uint64_t off = 0;
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const struct shmconn_tensor *t = &m->tensors[i];
        int rc = shmconn_tensor_check(t->name, t->dtype, t->ndim, t->shape, t->nbytes, where, i);
        if (rc < 0) return rc;
        offsets[i] = off;
        off += shmconn_align(t->nbytes); /* every tensor 64-byte aligned for the reader */
    }
    *total = off;
    return 0;
}

int shmconn_peer_status(shmconn_t *c)
{
    pthread_mutex_lock(&c->lock);
    const struct shmconn_producer_line *pl = &c->hdr->prod;
    const struct shmconn_consumer_line *cl = &c->hdr->cons;
    uint32_t peer_state = c->role == SHMCONN_ROLE_PRODUCER ? atomic_load(&cl->state) : atomic_load(&pl->state);
    int rc = 0;
    if (peer_state == SHMCONN_SIDE_CLOSED)
        rc = SHMCONN_E_CLOSED;
    else if (shmconn_peer_check(c, 1) < 0)
        rc = SHMCONN_E_PEER_DEAD;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* No lock: one store into this side's own line, from any thread. */
void shmconn_heartbeat(shmconn_t *c)
{
    _Atomic uint64_t *beat = c->role == SHMCONN_ROLE_PRODUCER ? &c->hdr->prod.beat_ns : &c->hdr->cons.beat_ns;
    atomic_store_explicit(beat, monotonic_ns(), memory_order_release);
}

double shmconn_peer_heartbeat_age(shmconn_t *c)
{
    _Atomic uint64_t *beat = c->role == SHMCONN_ROLE_PRODUCER ? &c->hdr->cons.beat_ns : &c->hdr->prod.beat_ns;
    uint64_t t = atomic_load_explicit(beat, memory_order_acquire), now = monotonic_ns();
    if (t == 0) return -1;
    return t >= now ? 0.0 : (double)(now - t) * 1e-9;
}

const char *shmconn_segment_name(const shmconn_t *c)
{
    return c ? c->shm_name : "";
}

void shmconn_stats_get(const shmconn_t *c, struct shmconn_stats *out)
{
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    *out = c->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
}

void shmconn_close(shmconn_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    if (c->hdr) {
        if (c->role == SHMCONN_ROLE_PRODUCER) {
            atomic_store_explicit(&c->hdr->prod.state, SHMCONN_SIDE_CLOSED, memory_order_seq_cst);
            atomic_fetch_add_explicit(&c->hdr->prod.wake, 1, memory_order_seq_cst);
            shmconn_futex_wake(&c->hdr->prod.wake);
        } else {
            atomic_store_explicit(&c->hdr->cons.state, SHMCONN_SIDE_CLOSED, memory_order_seq_cst);
            atomic_fetch_add_explicit(&c->hdr->cons.wake, 1, memory_order_seq_cst);
            shmconn_futex_wake(&c->hdr->cons.wake);
        }
    }
    /* Either side unlinks: the name is only a rendezvous, both mappings stay valid. */
    shmconn_region_unlink_if_ours(c);
    pthread_mutex_unlock(&c->lock);
    shmconn_handle_free(c);
}
