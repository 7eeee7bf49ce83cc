/* Producer side: create the region, reserve and publish messages (blocking with
 * a bound while the ring or the payload area is full), read cancel notices. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "shmconn/shmconn_msg.h"
#include "shmconn/shmconn_region.h"

int shmconn_create(shmconn_t **out, const struct shmconn_config *cfg)
{
    *out = NULL;
    int rc = shmconn_config_check(cfg);
    if (rc < 0) return rc;
    struct shmconn *c = malloc(sizeof *c);
    if (!c) return mm3_errorf(-ENOMEM, "shmconn: out of memory");
    shmconn_handle_init(c, cfg, SHMCONN_ROLE_PRODUCER);
    c->cancelled = calloc(SHMCONN_ID_RING, sizeof *c->cancelled);
    c->cancelled_reason = calloc(SHMCONN_ID_RING, sizeof *c->cancelled_reason);
    if (!c->cancelled || !c->cancelled_reason) {
        shmconn_handle_free(c);
        return mm3_errorf(-ENOMEM, "shmconn: out of memory");
    }
    rc = shmconn_region_create(c);
    if (rc < 0) {
        shmconn_handle_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Move the consumer's cancel notices into the local ring. A notice count the
 * consumer could not have written (more than the ring holds) is clamped. */
static void producer_drain_cancels(struct shmconn *c)
{
    uint32_t ct = atomic_load_explicit(&c->hdr->cons.cancel_tail, memory_order_acquire);
    uint32_t ch = atomic_load_explicit(&c->hdr->prod.cancel_head, memory_order_relaxed);
    if (ct - ch > SHMCONN_CANCEL_SLOTS) ch = ct - SHMCONN_CANCEL_SLOTS;
    for (; ch != ct; ch++) {
        const struct shmconn_cancel *e = &c->cancels[ch % SHMCONN_CANCEL_SLOTS];
        uint32_t k = c->n_cancelled++ % SHMCONN_ID_RING;
        c->cancelled[k] = e->req_id;
        c->cancelled_reason[k] = e->reason;
    }
    atomic_store_explicit(&c->hdr->prod.cancel_head, ch, memory_order_release);
}

/* Reason code when the consumer gave up on req_id, else 0. */
static uint32_t producer_cancel_reason(const struct shmconn *c, uint64_t req_id)
{
    uint32_t n = c->n_cancelled < SHMCONN_ID_RING ? c->n_cancelled : SHMCONN_ID_RING;
    for (uint32_t i = 0; i < n; i++)
        if (c->cancelled[i] == req_id)
            return c->cancelled_reason[i] ? c->cancelled_reason[i] : SHMCONN_CANCEL_BY_CONSUMER;
    return 0;
}

int shmconn_cancel_poll(shmconn_t *c, uint64_t *req_id, uint32_t *reason)
{
    if (c->role != SHMCONN_ROLE_PRODUCER)
        return mm3_errorf(-EINVAL, "shmconn %s: cancel_poll on the consumer side", c->shm_name);
    pthread_mutex_lock(&c->lock);
    producer_drain_cancels(c);
    if (c->n_cancelled - c->cancel_polled > SHMCONN_ID_RING) c->cancel_polled = c->n_cancelled - SHMCONN_ID_RING;
    int got = 0;
    if (c->cancel_polled != c->n_cancelled) {
        uint32_t k = c->cancel_polled++ % SHMCONN_ID_RING;
        *req_id = c->cancelled[k];
        *reason = c->cancelled_reason[k];
        got = 1;
    }
    pthread_mutex_unlock(&c->lock);
    return got;
}

/* Where a payload of len bytes would go: SHMCONN_INLINE, or a free-running
 * position in the payload area (skipping the area's end when it does not fit there). */
static uint64_t producer_payload_pos(const struct shmconn *c, uint64_t len, int is_inline)
{
    if (is_inline) return SHMCONN_INLINE;
    uint64_t cap = c->hdr->geo.payload_bytes;
    uint64_t pos = c->pay_head;
    uint64_t off = pos % cap;
    if (off + len > cap) pos += cap - off;
    return pos;
}

static int producer_has_room(struct shmconn *c, uint64_t pos, uint64_t len)
{
    uint32_t tail = atomic_load_explicit(&c->hdr->prod.tail, memory_order_relaxed);
    uint32_t head = atomic_load_explicit(&c->hdr->cons.head, memory_order_seq_cst);
    if (tail - head >= c->cfg.n_slots) return 0;
    if (pos == SHMCONN_INLINE) return 1;
    uint64_t ptail = atomic_load_explicit(&c->hdr->cons.payload_tail, memory_order_seq_cst);
    return pos + len - ptail <= c->hdr->geo.payload_bytes;
}

/* Wait (lock held on entry and exit) until the message fits, or fail. */
static int producer_wait_room(struct shmconn *c, const struct shmconn_msg *m, uint64_t len, int is_inline,
                              double timeout_s, uint64_t *pos_out)
{
    double end = shmconn_now() + (timeout_s > 0 ? timeout_s : 0);
    for (;;) {
        producer_drain_cancels(c);
        uint32_t why = producer_cancel_reason(c, m->req_id);
        if (why)
            return mm3_errorf(SHMCONN_E_CANCELLED, "shmconn %s: request %llu: the consumer gave up on it (%s)",
                              c->shm_name, (unsigned long long)m->req_id,
                              why == SHMCONN_CANCEL_TIMEOUT ? "its deadline expired" : "cancelled");
        if (atomic_load_explicit(&c->hdr->cons.state, memory_order_acquire) == SHMCONN_SIDE_CLOSED)
            return mm3_errorf(SHMCONN_E_CLOSED, "shmconn %s: the consumer closed the channel", c->shm_name);
        /* Checked even when there is room (at most once per slice): a dead consumer
         * must stop the producer now, not after it has filled the ring for nobody. */
        if (shmconn_peer_check(c, 0) < 0)
            return mm3_errorf(SHMCONN_E_PEER_DEAD, "shmconn %s: the consumer (pid %d) died", c->shm_name,
                              (int)c->peer_pid);
        uint64_t pos = producer_payload_pos(c, len, is_inline);
        if (producer_has_room(c, pos, len)) {
            *pos_out = pos;
            return 0;
        }
        double now = shmconn_now();
        if (now >= end)
            return mm3_errorf(SHMCONN_E_TIMEOUT,
                              "shmconn %s: request %llu: ring or payload area full for %.3f s (consumer not releasing)",
                              c->shm_name, (unsigned long long)m->req_id, timeout_s);
        double slice = end - now < c->slice_s ? end - now : c->slice_s;
        /* Announce the sleep, then look once more: a release that ran before the
         * announcement is seen here, one after it bumps `wake` and wakes us. */
        uint32_t w = atomic_load_explicit(&c->hdr->cons.wake, memory_order_seq_cst);
        atomic_store_explicit(&c->hdr->prod.waiting, 1, memory_order_seq_cst);
        if (!producer_has_room(c, pos, len) &&
            atomic_load_explicit(&c->hdr->cons.cancel_tail, memory_order_seq_cst) ==
                atomic_load_explicit(&c->hdr->prod.cancel_head, memory_order_relaxed)) {
            c->stats.waits++;
            pthread_mutex_unlock(&c->lock);
            shmconn_futex_wait(&c->hdr->cons.wake, w, slice);
            pthread_mutex_lock(&c->lock);
        }
        atomic_store_explicit(&c->hdr->prod.waiting, 0, memory_order_relaxed);
    }
}

/* Reserve the slot at tail and its payload bytes, write the descriptor, point the
 * tensors at the region. Lock held. */
static int producer_reserve(struct shmconn *c, struct shmconn_msg *m, double timeout_s)
{
    if (c->role != SHMCONN_ROLE_PRODUCER)
        return mm3_errorf(-EINVAL, "shmconn %s: send on the consumer side", c->shm_name);
    if (c->reserved)
        return mm3_errorf(-EBUSY, "shmconn %s: a send_begin reservation is still waiting for its commit", c->shm_name);
    uint64_t offsets[SHMCONN_MAX_TENSORS], total;
    int rc = shmconn_msg_layout(m, offsets, &total, c->shm_name);
    if (rc < 0) return rc;
    int is_inline = total <= c->hdr->geo.inline_bytes;
    if (!is_inline && total > c->hdr->geo.payload_bytes)
        return mm3_errorf(SHMCONN_E_TOO_BIG,
                          "shmconn %s: request %llu: message of %llu bytes exceeds both shm_threshold_bytes %llu "
                          "and the payload area %llu",
                          c->shm_name, (unsigned long long)m->req_id, (unsigned long long)total,
                          (unsigned long long)c->hdr->geo.inline_bytes, (unsigned long long)c->hdr->geo.payload_bytes);
    uint64_t pos = 0;
    rc = producer_wait_room(c, m, total, is_inline, timeout_s, &pos);
    if (rc < 0) return rc;
    uint32_t tail = atomic_load_explicit(&c->hdr->prod.tail, memory_order_relaxed);
    struct shmconn_slot *s = shmconn_slot_at(c, tail);
    memset(s, 0, sizeof *s);
    s->req_id = m->req_id;
    s->chunk = m->chunk;
    s->kind = m->kind;
    s->flags = m->flags;
    s->n_tensors = m->n_tensors;
    s->payload_pos = pos;
    s->payload_len = shmconn_align(total);
    s->seq = tail;
    uint8_t *data;
    if (is_inline) {
        s->payload_end = SHMCONN_INLINE;
        data = (uint8_t *)s + SHMCONN_SLOT_HEADER_BYTES;
    } else {
        s->payload_end = pos + s->payload_len;
        data = c->payload + pos % c->hdr->geo.payload_bytes;
        c->pay_head = s->payload_end;
    }
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        struct shmconn_slot_tensor *d = &s->tensors[i];
        const struct shmconn_tensor *t = &m->tensors[i];
        memcpy(d->name, t->name, SHMCONN_TENSOR_NAME);
        d->dtype = t->dtype;
        d->ndim = t->ndim;
        for (uint32_t k = 0; k < t->ndim; k++)
            d->shape[k] = t->shape[k];
        d->offset = offsets[i];
        d->nbytes = t->nbytes;
        m->tensors[i].data = data + offsets[i];
    }
    m->seq = tail;
    c->reserved = 1;
    return 0;
}

static void producer_publish(struct shmconn *c, const struct shmconn_msg *m)
{
    uint32_t tail = atomic_load_explicit(&c->hdr->prod.tail, memory_order_relaxed);
    shmconn_slot_at(c, tail)->flags = m->flags;
    /* Release: the consumer that sees tail+1 sees the slot and payload bytes. */
    atomic_store_explicit(&c->hdr->prod.tail, tail + 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&c->hdr->prod.wake, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&c->hdr->cons.waiting, memory_order_seq_cst)) shmconn_futex_wake(&c->hdr->prod.wake);
    c->reserved = 0;
    c->stats.messages++;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        c->stats.bytes += m->tensors[i].nbytes;
}

int shmconn_send_begin(shmconn_t *c, struct shmconn_msg *msg, double timeout_s)
{
    pthread_mutex_lock(&c->lock);
    int rc = producer_reserve(c, msg, timeout_s);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int shmconn_send_commit(shmconn_t *c, const struct shmconn_msg *msg)
{
    pthread_mutex_lock(&c->lock);
    int rc = 0;
    if (!c->reserved || msg->seq != atomic_load_explicit(&c->hdr->prod.tail, memory_order_relaxed))
        rc = mm3_errorf(-EINVAL, "shmconn %s: send_commit without a matching send_begin", c->shm_name);
    else
        producer_publish(c, msg);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int shmconn_send(shmconn_t *c, const struct shmconn_msg *msg, double timeout_s)
{
    struct shmconn_msg m = *msg;
    pthread_mutex_lock(&c->lock);
    int rc = producer_reserve(c, &m, timeout_s);
    if (rc == 0) {
        for (uint32_t i = 0; i < m.n_tensors; i++)
            if (m.tensors[i].nbytes) memcpy(m.tensors[i].data, msg->tensors[i].data, m.tensors[i].nbytes);
        producer_publish(c, &m);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}
