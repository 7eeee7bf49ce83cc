/* Consumer side: open and attach, read and validate messages, per-request
 * deadlines, cancel notices back to the producer, out-of-order release. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "shmconn/shmconn_msg.h"
#include "shmconn/shmconn_region.h"

int shmconn_open(shmconn_t **out, const struct shmconn_config *cfg, double wait_s)
{
    *out = NULL;
    int rc = shmconn_config_check(cfg);
    if (rc < 0) return rc;
    struct shmconn *c = malloc(sizeof *c);
    if (!c) return mm3_errorf(-ENOMEM, "shmconn: out of memory");
    shmconn_handle_init(c, cfg, SHMCONN_ROLE_CONSUMER);
    c->released = calloc(cfg->n_slots, 1);
    c->slot_end = calloc(cfg->n_slots, sizeof *c->slot_end);
    c->dropped = calloc(SHMCONN_ID_RING, sizeof *c->dropped);
    if (!c->released || !c->slot_end || !c->dropped) {
        shmconn_handle_free(c);
        return mm3_errorf(-ENOMEM, "shmconn: out of memory");
    }
    rc = shmconn_region_open(c, wait_s);
    if (rc < 0) {
        shmconn_handle_free(c);
        return rc;
    }
    /* One consumer per region lifetime: a second one, or a restarted one, would
     * not know which slots the first had read. The producer recreates the region. */
    int32_t none = 0;
    if (!atomic_compare_exchange_strong(&c->hdr->cons.pid, &none, (int32_t)getpid())) {
        rc = mm3_errorf(-EBUSY, "shmconn %s: region already had a consumer (pid %d)", c->shm_name, (int)none);
        shmconn_handle_free(c);
        return rc;
    }
    if (atomic_load(&c->hdr->cons.head) != 0 || atomic_load(&c->hdr->cons.payload_tail) != 0) {
        rc = mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: fresh region has consumer counters set", c->shm_name);
        shmconn_handle_free(c);
        return rc;
    }
    atomic_store_explicit(&c->hdr->cons.state, SHMCONN_SIDE_OPEN, memory_order_seq_cst);
    shmconn_peer_check(c, 1); /* opens the producer's pidfd now, while its pid is surely its own */
    *out = c;
    return 0;
}

/* ---- request tracking ---- */

static struct shmconn_track *track_find(struct shmconn *c, uint64_t req_id)
{
    for (uint32_t i = 0; i < c->n_tracks; i++)
        if (c->tracks[i].req_id == req_id) return &c->tracks[i];
    return NULL;
}

static void track_remove(struct shmconn *c, struct shmconn_track *t)
{
    *t = c->tracks[--c->n_tracks];
}

static int dropped_has(const struct shmconn *c, uint64_t req_id)
{
    uint32_t n = c->n_dropped < SHMCONN_ID_RING ? c->n_dropped : SHMCONN_ID_RING;
    for (uint32_t i = 0; i < n; i++)
        if (c->dropped[i] == req_id) return 1;
    return 0;
}

/* Tell the producer to stop producing req_id. Never blocks: a full notice ring
 * (the producer is not reading it) loses the notice, and the messages that keep
 * coming are dropped here anyway. */
static void consumer_post_cancel(struct shmconn *c, uint64_t req_id, uint32_t reason)
{
    c->dropped[c->n_dropped++ % SHMCONN_ID_RING] = req_id;
    uint32_t ct = atomic_load_explicit(&c->hdr->cons.cancel_tail, memory_order_relaxed);
    uint32_t ch = atomic_load_explicit(&c->hdr->prod.cancel_head, memory_order_acquire);
    if (ct - ch >= SHMCONN_CANCEL_SLOTS) {
        LOG_WARN("shmconn %s: cancel ring full, request %llu not announced", c->shm_name, (unsigned long long)req_id);
        return;
    }
    struct shmconn_cancel *e = &c->cancels[ct % SHMCONN_CANCEL_SLOTS];
    e->req_id = req_id;
    e->reason = reason;
    atomic_store_explicit(&c->hdr->cons.cancel_tail, ct + 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&c->hdr->cons.wake, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&c->hdr->prod.waiting, memory_order_seq_cst)) shmconn_futex_wake(&c->hdr->cons.wake);
}

int shmconn_request_begin(shmconn_t *c, uint64_t req_id)
{
    if (c->role != SHMCONN_ROLE_CONSUMER)
        return mm3_errorf(-EINVAL, "shmconn %s: request_begin on the producer side", c->shm_name);
    pthread_mutex_lock(&c->lock);
    int rc = 0;
    if (track_find(c, req_id)) {
        rc =
            mm3_errorf(-EEXIST, "shmconn %s: request %llu is already tracked", c->shm_name, (unsigned long long)req_id);
    } else {
        if (c->n_tracks == c->cap_tracks) {
            uint32_t cap = c->cap_tracks ? 2 * c->cap_tracks : 16;
            struct shmconn_track *t = realloc(c->tracks, cap * sizeof *t);
            if (!t) {
                pthread_mutex_unlock(&c->lock);
                return mm3_errorf(-ENOMEM, "shmconn: out of memory");
            }
            c->tracks = t;
            c->cap_tracks = cap;
        }
        struct shmconn_track *t = &c->tracks[c->n_tracks++];
        memset(t, 0, sizeof *t);
        t->req_id = req_id;
        t->clock_start = shmconn_now();
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int shmconn_request_end(shmconn_t *c, uint64_t req_id)
{
    pthread_mutex_lock(&c->lock);
    struct shmconn_track *t = track_find(c, req_id);
    if (t) track_remove(c, t);
    pthread_mutex_unlock(&c->lock);
    return t ? 0
             : mm3_errorf(-ENOENT, "shmconn %s: request %llu is not tracked", c->shm_name, (unsigned long long)req_id);
}

int shmconn_request_cancel(shmconn_t *c, uint64_t req_id)
{
    if (c->role != SHMCONN_ROLE_CONSUMER)
        return mm3_errorf(-EINVAL, "shmconn %s: request_cancel on the producer side", c->shm_name);
    pthread_mutex_lock(&c->lock);
    struct shmconn_track *t = track_find(c, req_id);
    if (t) track_remove(c, t);
    consumer_post_cancel(c, req_id, SHMCONN_CANCEL_BY_CONSUMER);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

/* ---- reading ---- */

/* Copy slot `seq` out of the region and validate every field before use: the
 * peer may be a different build, buggy, or scribbling. Fills m with views. */
static int consumer_read_slot(struct shmconn *c, uint32_t seq, struct shmconn_msg *m)
{
    struct shmconn_slot s;
    memcpy(&s, shmconn_slot_at(c, seq), sizeof s);
    const struct shmconn_geometry *g = &c->hdr->geo;
    uint64_t cap = g->payload_bytes;
    if (s.seq != seq)
        return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: slot %u holds sequence %llu", c->shm_name, seq,
                          (unsigned long long)s.seq);
    if (s.n_tensors > SHMCONN_MAX_TENSORS)
        return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: slot %u: n_tensors %u", c->shm_name, seq, s.n_tensors);
    const uint8_t *data;
    if (s.payload_pos == SHMCONN_INLINE) {
        if (s.payload_len > g->inline_bytes || s.payload_end != SHMCONN_INLINE)
            return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: slot %u: inline payload of %llu bytes", c->shm_name,
                              seq, (unsigned long long)s.payload_len);
        data = (const uint8_t *)shmconn_slot_at(c, seq) + SHMCONN_SLOT_HEADER_BYTES;
        c->slot_end[seq & c->mask] = SHMCONN_INLINE;
    } else {
        uint64_t ptail = atomic_load_explicit(&c->hdr->cons.payload_tail, memory_order_relaxed);
        if (cap == 0 || s.payload_len > cap || s.payload_pos < c->last_end || s.payload_pos % SHMCONN_ALIGN ||
            s.payload_pos % cap + s.payload_len > cap || s.payload_end != s.payload_pos + s.payload_len ||
            s.payload_end - ptail > cap)
            return mm3_errorf(SHMCONN_E_BAD_REGION,
                              "shmconn %s: slot %u: payload [%llu, +%llu) outside the area or not 64-byte aligned",
                              c->shm_name, seq, (unsigned long long)s.payload_pos, (unsigned long long)s.payload_len);
        data = c->payload + s.payload_pos % cap;
        c->slot_end[seq & c->mask] = s.payload_end;
        c->last_end = s.payload_end;
    }
    memset(m, 0, sizeof *m);
    m->req_id = s.req_id;
    m->chunk = s.chunk;
    m->kind = s.kind;
    m->flags = s.flags;
    m->n_tensors = s.n_tensors;
    m->seq = seq;
    for (uint32_t i = 0; i < s.n_tensors; i++) {
        const struct shmconn_slot_tensor *d = &s.tensors[i];
        struct shmconn_tensor *t = &m->tensors[i];
        int rc = shmconn_tensor_check(d->name, d->dtype, d->ndim, d->shape, d->nbytes, c->shm_name, i);
        if (rc < 0) return mm3_error_prefix(SHMCONN_E_BAD_REGION, "slot %u: ", seq);
        if (d->offset > s.payload_len || d->nbytes > s.payload_len - d->offset)
            return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: slot %u: tensor %u outside its payload", c->shm_name,
                              seq, i);
        /* The stages cast views to float * and the like: keep the layout's alignment a guarantee. */
        if (d->offset % SHMCONN_ALIGN)
            return mm3_errorf(SHMCONN_E_BAD_REGION,
                              "shmconn %s: slot %u: tensor %u at payload offset %llu: expected a multiple of %u",
                              c->shm_name, seq, i, (unsigned long long)d->offset, SHMCONN_ALIGN);
        memcpy(t->name, d->name, SHMCONN_TENSOR_NAME);
        t->dtype = d->dtype;
        t->ndim = d->ndim;
        for (uint32_t k = 0; k < d->ndim; k++)
            t->shape[k] = d->shape[k];
        t->nbytes = d->nbytes;
        t->data = (void *)(data + d->offset);
    }
    return 0;
}

/* Hand slots back in order as far as they are released; wake a waiting producer. */
static void consumer_advance_head(struct shmconn *c)
{
    uint32_t head = atomic_load_explicit(&c->hdr->cons.head, memory_order_relaxed);
    uint32_t h = head;
    uint64_t ptail = atomic_load_explicit(&c->hdr->cons.payload_tail, memory_order_relaxed);
    while (h != c->rd && c->released[h & c->mask]) {
        c->released[h & c->mask] = 0;
        if (c->slot_end[h & c->mask] != SHMCONN_INLINE) ptail = c->slot_end[h & c->mask];
        h++;
    }
    if (h == head) return;
    atomic_store_explicit(&c->hdr->cons.payload_tail, ptail, memory_order_seq_cst);
    atomic_store_explicit(&c->hdr->cons.head, h, memory_order_seq_cst);
    atomic_fetch_add_explicit(&c->hdr->cons.wake, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&c->hdr->prod.waiting, memory_order_seq_cst)) shmconn_futex_wake(&c->hdr->cons.wake);
}

static int consumer_release_locked(struct shmconn *c, uint32_t seq)
{
    uint32_t head = atomic_load_explicit(&c->hdr->cons.head, memory_order_relaxed);
    if (seq - head >= c->rd - head || c->released[seq & c->mask])
        return mm3_errorf(-EINVAL, "shmconn %s: release of message %u that is not held", c->shm_name, seq);
    c->released[seq & c->mask] = 1;
    consumer_advance_head(c);
    return 0;
}

int shmconn_release(shmconn_t *c, const struct shmconn_msg *msg)
{
    if (c->role != SHMCONN_ROLE_CONSUMER)
        return mm3_errorf(-EINVAL, "shmconn %s: release on the producer side", c->shm_name);
    pthread_mutex_lock(&c->lock);
    int rc = consumer_release_locked(c, (uint32_t)msg->seq);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static double track_deadline(const struct shmconn *c, const struct shmconn_track *t)
{
    return t->clock_start + (t->n_received == 0 ? c->cfg.first_chunk_deadline_s : c->cfg.steady_deadline_s);
}

/* One pass without sleeping: 1 with *ev filled, 0 when there is nothing, < 0 on error. */
static int consumer_poll(struct shmconn *c, struct shmconn_event *ev)
{
    for (;;) {
        uint32_t tail = atomic_load_explicit(&c->hdr->prod.tail, memory_order_acquire);
        if (tail == c->rd) break;
        uint32_t head = atomic_load_explicit(&c->hdr->cons.head, memory_order_relaxed);
        if (tail - head > c->cfg.n_slots) {
            c->peer_gone = SHMCONN_E_BAD_REGION;
            return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: producer tail %u runs %u slots ahead of head %u",
                              c->shm_name, tail, tail - head, head);
        }
        uint32_t seq = c->rd;
        int rc = consumer_read_slot(c, seq, &ev->msg);
        if (rc < 0) {
            c->peer_gone = SHMCONN_E_BAD_REGION;
            return rc;
        }
        c->rd++;
        const struct shmconn_msg *m = &ev->msg;
        struct shmconn_track *t = track_find(c, m->req_id);
        if (!t && dropped_has(c, m->req_id)) {
            c->stats.dropped++;
            consumer_release_locked(c, seq);
            continue;
        }
        if (t) {
            t->n_received++;
            t->clock_start = shmconn_now();
            if (m->flags & (SHMCONN_FLAG_LAST | SHMCONN_FLAG_ERROR | SHMCONN_FLAG_CANCELLED)) track_remove(c, t);
        }
        c->stats.messages++;
        for (uint32_t i = 0; i < m->n_tensors; i++)
            c->stats.bytes += m->tensors[i].nbytes;
        ev->type = SHMCONN_EVENT_MESSAGE;
        ev->req_id = m->req_id;
        return 1;
    }
    double now = shmconn_now();
    for (uint32_t i = 0; i < c->n_tracks; i++) {
        struct shmconn_track *t = &c->tracks[i];
        if (now < track_deadline(c, t)) continue;
        ev->type = SHMCONN_EVENT_TIMEOUT;
        ev->req_id = t->req_id;
        ev->first_chunk = t->n_received == 0;
        ev->status = SHMCONN_E_TIMEOUT;
        ev->waited_s = now - t->clock_start;
        c->stats.timeouts++;
        LOG_WARN("shmconn %s: request %llu: no %s message within %.3f s; cancelling it", c->shm_name,
                 (unsigned long long)t->req_id, ev->first_chunk ? "first" : "next", ev->waited_s);
        consumer_post_cancel(c, t->req_id, SHMCONN_CANCEL_TIMEOUT);
        track_remove(c, t);
        return 1;
    }
    if (!c->peer_gone) {
        int gone = 0;
        if (atomic_load_explicit(&c->hdr->prod.state, memory_order_acquire) == SHMCONN_SIDE_CLOSED)
            gone = SHMCONN_E_CLOSED;
        else if (shmconn_peer_check(c, 0) < 0)
            gone = SHMCONN_E_PEER_DEAD;
        if (gone) {
            /* Messages published before the close or the death are complete: deliver them first. */
            if (atomic_load_explicit(&c->hdr->prod.tail, memory_order_acquire) != c->rd) return consumer_poll(c, ev);
            c->peer_gone = gone;
        }
    }
    if (c->peer_gone) {
        if (c->n_tracks) {
            struct shmconn_track *t = &c->tracks[c->n_tracks - 1];
            ev->type = SHMCONN_EVENT_PEER_LOST;
            ev->req_id = t->req_id;
            ev->status = c->peer_gone;
            c->n_tracks--;
            return 1;
        }
        if (c->peer_gone == SHMCONN_E_CLOSED)
            return mm3_errorf(SHMCONN_E_CLOSED, "shmconn %s: the producer closed the channel", c->shm_name);
        if (c->peer_gone == SHMCONN_E_PEER_DEAD)
            return mm3_errorf(SHMCONN_E_PEER_DEAD, "shmconn %s: the producer (pid %d) died", c->shm_name,
                              (int)c->peer_pid);
        return mm3_errorf(c->peer_gone, "shmconn %s: the region is corrupt; reopen it", c->shm_name);
    }
    return 0;
}

int shmconn_recv(shmconn_t *c, struct shmconn_event *ev, double timeout_s)
{
    if (c->role != SHMCONN_ROLE_CONSUMER)
        return mm3_errorf(-EINVAL, "shmconn %s: recv on the producer side", c->shm_name);
    memset(ev, 0, sizeof *ev);
    double end = shmconn_now() + (timeout_s > 0 ? timeout_s : 0);
    pthread_mutex_lock(&c->lock);
    int rc;
    for (;;) {
        rc = consumer_poll(c, ev);
        if (rc != 0) break;
        double now = shmconn_now();
        if (now >= end) {
            rc = mm3_errorf(SHMCONN_E_TIMEOUT, "shmconn %s: no message within %.3f s", c->shm_name, timeout_s);
            break;
        }
        double until = end;
        if (now + c->slice_s < until) until = now + c->slice_s;
        for (uint32_t i = 0; i < c->n_tracks; i++) {
            double d = track_deadline(c, &c->tracks[i]);
            if (d < until) until = d;
        }
        /* Announce, re-check, sleep: see producer_wait_room for why this order. */
        uint32_t w = atomic_load_explicit(&c->hdr->prod.wake, memory_order_seq_cst);
        atomic_store_explicit(&c->hdr->cons.waiting, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&c->hdr->prod.tail, memory_order_seq_cst) == c->rd) {
            c->stats.waits++;
            pthread_mutex_unlock(&c->lock);
            shmconn_futex_wait(&c->hdr->prod.wake, w, until - now);
            pthread_mutex_lock(&c->lock);
        }
        atomic_store_explicit(&c->hdr->cons.waiting, 0, memory_order_relaxed);
    }
    pthread_mutex_unlock(&c->lock);
    return rc < 0 ? rc : 0;
}
