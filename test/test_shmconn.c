/* shmconn in one process: round trips (inline, payload area, zero-copy), ordering
 * under backpressure, many requests interleaved with out-of-order release,
 * deadlines, cancel, clean close, corrupt regions refused, stale reclaim. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/error.h"
#include "pipe/pipe_channel.h"
#include "shmconn/shmconn.h"
#include "shmconn/shmconn_region.h"
#include "support/test_shm.h"

/* Deterministic bytes of (request, chunk, tensor). */
static void fill_pattern(uint8_t *p, size_t n, uint64_t req, uint32_t chunk, uint32_t t)
{
    uint64_t x = req * 0x9E3779B97F4A7C15ull ^ ((uint64_t)chunk << 20) ^ t;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(x >> 56);
    }
}

static int check_pattern(const uint8_t *p, size_t n, uint64_t req, uint32_t chunk, uint32_t t)
{
    uint8_t *want = malloc(n ? n : 1);
    fill_pattern(want, n, req, chunk, t);
    int ok = memcmp(p, want, n) == 0;
    free(want);
    return ok;
}

/* A message of one u8 tensor of n bytes (plus a tiny i64 tensor), data owned by caller. */
static void msg_make(struct shmconn_msg *m, uint64_t req, uint32_t chunk, uint32_t flags, uint8_t *buf, size_t n,
                     int64_t *meta)
{
    memset(m, 0, sizeof *m);
    m->req_id = req;
    m->chunk = chunk;
    m->kind = 7;
    m->flags = flags;
    m->n_tensors = 2;
    fill_pattern(buf, n, req, chunk, 0);
    test_shm_tensor_1d(&m->tensors[0], "frames", SHMCONN_DTYPE_U8, buf, (int64_t)n, 1);
    meta[0] = (int64_t)req;
    meta[1] = chunk;
    test_shm_tensor_1d(&m->tensors[1], "meta", MM3_DTYPE_I64, meta, 2, sizeof *meta);
}

static void msg_check(const struct shmconn_msg *m, uint64_t req, uint32_t chunk, size_t n)
{
    assert_int_equal(m->req_id, req);
    assert_int_equal(m->chunk, chunk);
    assert_int_equal(m->kind, 7);
    assert_int_equal(m->n_tensors, 2);
    assert_string_equal(m->tensors[0].name, "frames");
    assert_int_equal(m->tensors[0].nbytes, n);
    assert_int_equal(m->tensors[0].shape[0], (int64_t)n);
    assert_int_equal((uintptr_t)m->tensors[0].data % 64, 0);
    assert_true(check_pattern(m->tensors[0].data, n, req, chunk, 0));
    const int64_t *meta = m->tensors[1].data;
    assert_int_equal(meta[0], (int64_t)req);
    assert_int_equal(meta[1], chunk);
}

/* A producer and a consumer on one fresh channel. */
static void pair_open(const struct shmconn_config *cfg, shmconn_t **p, shmconn_t **c)
{
    assert_int_equal(shmconn_create(p, cfg), 0);
    assert_int_equal(shmconn_open(c, cfg, 1.0), 0);
}

/* Sends a 64-byte msg_make message of (req, chunk); shmconn_send's status. */
static int send_small(shmconn_t *p, uint64_t req, uint32_t chunk, uint32_t flags, double wait_s)
{
    uint8_t buf[64];
    int64_t meta[2];
    struct shmconn_msg m;
    msg_make(&m, req, chunk, flags, buf, sizeof buf, meta);
    return shmconn_send(p, &m, wait_s);
}

static void test_config_rejected(void **state)
{
    (void)state;
    shmconn_t *c;
    struct shmconn_config cfg = test_shm_config("bad", 1024, 0, 6); /* not a power of two */
    assert_int_equal(shmconn_create(&c, &cfg), -EINVAL);
    cfg = test_shm_config("bad/slash", 1024, 0, 8);
    assert_int_equal(shmconn_create(&c, &cfg), -EINVAL);
    cfg = test_shm_config("bad", 1024, 0, 8);
    cfg.steady_deadline_s = 0;
    assert_int_equal(shmconn_create(&c, &cfg), -EINVAL);
    assert_int_equal(test_shm_count(), 0);
}

static void roundtrip(uint64_t threshold, uint64_t payload, size_t n)
{
    struct shmconn_config cfg = test_shm_config("rt", threshold, payload, 4);
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    uint8_t *buf = malloc(n);
    int64_t meta[2];
    struct shmconn_msg m;
    msg_make(&m, 42, 3, SHMCONN_FLAG_FIRST, buf, n, meta);
    assert_int_equal(shmconn_send(p, &m, 1.0), 0);
    memset(buf, 0, n); /* the copy in the region must not depend on the source */
    struct shmconn_event ev;
    assert_int_equal(shmconn_recv(c, &ev, 1.0), 0);
    assert_int_equal(ev.type, SHMCONN_EVENT_MESSAGE);
    assert_int_equal(ev.msg.flags, SHMCONN_FLAG_FIRST);
    msg_check(&ev.msg, 42, 3, n);
    assert_int_equal(shmconn_release(c, &ev.msg), 0);
    assert_int_equal(shmconn_release(c, &ev.msg), -EINVAL); /* double release */
    assert_int_equal(shmconn_recv(c, &ev, 0.01), SHMCONN_E_TIMEOUT);
    struct shmconn_stats st;
    shmconn_stats_get(c, &st);
    assert_int_equal(st.messages, 1);
    assert_int_equal(st.bytes, n + 16);
    free(buf);
    shmconn_close(p);
    shmconn_close(c);
    assert_int_equal(test_shm_count(), 0);
}

static void test_roundtrip_inline(void **state)
{
    (void)state;
    roundtrip(65536, 0, 16384);
}

static void test_roundtrip_payload(void **state)
{
    (void)state;
    roundtrip(4096, 4u << 20, 3u << 20);
}

static void test_too_big(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("big", 1024, 1u << 20, 4);
    shmconn_t *p;
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    size_t n = (1u << 20) + 1;
    uint8_t *buf = malloc(n);
    int64_t meta[2];
    struct shmconn_msg m;
    msg_make(&m, 1, 0, 0, buf, n, meta);
    assert_int_equal(shmconn_send(p, &m, 0.1), SHMCONN_E_TOO_BIG);
    m.tensors[0].nbytes = 5; /* disagrees with the shape */
    assert_int_equal(shmconn_send(p, &m, 0.1), -EINVAL);
    free(buf);
    shmconn_close(p);
}

static void test_zero_copy_send(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("zc", 256, 1u << 20, 4);
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    struct shmconn_msg m;
    memset(&m, 0, sizeof m);
    m.req_id = 9;
    m.n_tensors = 1;
    snprintf(m.tensors[0].name, 16, "latent");
    m.tensors[0].dtype = MM3_DTYPE_BF16;
    m.tensors[0].ndim = 2;
    m.tensors[0].shape[0] = 100;
    m.tensors[0].shape[1] = 4096;
    m.tensors[0].nbytes = 100 * 4096 * 2;
    assert_int_equal(shmconn_send_begin(p, &m, 1.0), 0);
    assert_int_equal(shmconn_send_begin(p, &m, 1.0), -EBUSY);
    uint16_t *dst = m.tensors[0].data;
    for (int i = 0; i < 100 * 4096; i++)
        dst[i] = mm3_f32_to_bf16((float)(i % 200));
    m.flags = SHMCONN_FLAG_LAST;
    assert_int_equal(shmconn_send_commit(p, &m), 0);
    struct shmconn_event ev;
    assert_int_equal(shmconn_recv(c, &ev, 1.0), 0);
    assert_int_equal(ev.msg.flags, SHMCONN_FLAG_LAST);
    assert_int_equal(ev.msg.tensors[0].dtype, MM3_DTYPE_BF16);
    assert_int_equal(ev.msg.tensors[0].shape[1], 4096);
    const uint16_t *got = ev.msg.tensors[0].data;
    for (int i = 0; i < 100 * 4096; i += 997)
        assert_true(mm3_bf16_to_f32(got[i]) == (float)(i % 200));
    assert_int_equal(shmconn_release(c, &ev.msg), 0);
    shmconn_close(c);
    shmconn_close(p);
}

/* ---- threaded: ordering and interleaving under backpressure ---- */

struct feed {
    shmconn_t *p;
    int n_req, n_chunk;
    size_t sizes[5];
    int rc;
};

static size_t feed_size(const struct feed *f, int r, int k)
{
    return f->sizes[(r * 7 + k * 3) % 5];
}

static void *feed_main(void *arg)
{
    struct feed *f = arg;
    size_t max = 0;
    for (int i = 0; i < 5; i++)
        max = f->sizes[i] > max ? f->sizes[i] : max;
    uint8_t *buf = malloc(max);
    int64_t meta[2];
    for (int k = 0; k < f->n_chunk && f->rc == 0; k++)
        for (int r = 0; r < f->n_req && f->rc == 0; r++) {
            struct shmconn_msg m;
            uint32_t flags = (k == 0 ? SHMCONN_FLAG_FIRST : 0) | (k == f->n_chunk - 1 ? SHMCONN_FLAG_LAST : 0);
            msg_make(&m, (uint64_t)r + 1000, (uint32_t)k, flags, buf, feed_size(f, r, k), meta);
            f->rc = shmconn_send(f->p, &m, 10.0);
        }
    free(buf);
    return NULL;
}

static void interleave(int n_req, int n_chunk, uint32_t slots, uint64_t threshold, uint64_t payload,
                       const size_t sizes[5], int hold)
{
    struct shmconn_config cfg = test_shm_config("il", threshold, payload, slots);
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    for (int r = 0; r < n_req; r++)
        assert_int_equal(shmconn_request_begin(c, (uint64_t)r + 1000), 0);
    struct feed f = {.p = p, .n_req = n_req, .n_chunk = n_chunk};
    memcpy(f.sizes, sizes, sizeof f.sizes);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, feed_main, &f), 0);
    int *next = calloc((size_t)n_req, sizeof *next);
    struct shmconn_msg held[8];
    int n_held = 0, total = 0;
    while (total < n_req * n_chunk) {
        struct shmconn_event ev;
        int rc = shmconn_recv(c, &ev, 10.0);
        assert_int_equal(rc, 0);
        assert_int_equal(ev.type, SHMCONN_EVENT_MESSAGE);
        int r = (int)(ev.msg.req_id - 1000);
        assert_true(r >= 0 && r < n_req);
        assert_int_equal(ev.msg.chunk, next[r]); /* per-request order kept */
        msg_check(&ev.msg, ev.msg.req_id, ev.msg.chunk, feed_size(&f, r, next[r]));
        next[r]++;
        total++;
        /* Hold a few views and hand them back newest first: out-of-order release. */
        held[n_held++] = ev.msg;
        if (n_held == hold || total == n_req * n_chunk) {
            while (n_held > 0)
                assert_int_equal(shmconn_release(c, &held[--n_held]), 0);
        }
    }
    pthread_join(th, NULL);
    assert_int_equal(f.rc, 0);
    struct shmconn_event ev;
    assert_int_equal(shmconn_recv(c, &ev, 0.01), SHMCONN_E_TIMEOUT); /* all LAST: nothing tracked, no timeout */
    free(next);
    shmconn_close(p);
    shmconn_close(c);
}

static void test_ordering_backpressure(void **state)
{
    (void)state;
    /* 2 slots and a payload area of 3 messages: the producer blocks constantly. */
    const size_t sizes[5] = {100000, 100000, 100000, 100000, 100000};
    interleave(1, 300, 2, 1024, 3 * 100032 + 64, sizes, 1);
}

static void test_many_requests_interleaved(void **state)
{
    (void)state;
    /* Mixed inline and payload-area sizes, a payload area that wraps many times. */
    const size_t sizes[5] = {10, 4000, 70000, 250000, 0};
    interleave(16, 25, 16, 4096, 1u << 20, sizes, 5);
}

/* ---- deadlines, cancel, close ---- */

static void test_first_chunk_timeout(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("fc", 1024, 0, 8);
    cfg.first_chunk_deadline_s = 0.2;
    cfg.steady_deadline_s = 0.1;
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    double t0 = shmconn_now();
    assert_int_equal(shmconn_request_begin(c, 5), 0);
    assert_int_equal(shmconn_request_begin(c, 5), -EEXIST);
    struct shmconn_event ev;
    assert_int_equal(shmconn_recv(c, &ev, 5.0), 0);
    double dt = shmconn_now() - t0;
    assert_int_equal(ev.type, SHMCONN_EVENT_TIMEOUT);
    assert_int_equal(ev.req_id, 5);
    assert_int_equal(ev.first_chunk, 1);
    assert_true(dt >= 0.2 && dt < 0.45); /* the first-chunk deadline, not the steady one */
    /* The producer learns of it and stops: poll says so, send refuses. */
    uint64_t id = 0;
    uint32_t why = 0;
    assert_int_equal(shmconn_cancel_poll(p, &id, &why), 1);
    assert_int_equal(id, 5);
    assert_int_equal(why, SHMCONN_CANCEL_TIMEOUT);
    assert_int_equal(shmconn_cancel_poll(p, &id, &why), 0);
    assert_int_equal(send_small(p, 5, 0, 0, 0.1), SHMCONN_E_CANCELLED);
    /* No more events for it. */
    assert_int_equal(shmconn_recv(c, &ev, 0.3), SHMCONN_E_TIMEOUT);
    shmconn_close(p);
    shmconn_close(c);
}

static void test_steady_timeout(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("st", 1024, 0, 8);
    cfg.first_chunk_deadline_s = 2.0;
    cfg.steady_deadline_s = 0.15;
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    assert_int_equal(shmconn_request_begin(c, 6), 0);
    assert_int_equal(shmconn_request_begin(c, 7), 0);
    struct shmconn_event ev;
    /* Request 7 keeps sending every 50 ms; 6 sends once and then stalls. */
    assert_int_equal(send_small(p, 6, 0, SHMCONN_FLAG_FIRST, 1.0), 0);
    double t_last6 = 0;
    int got_timeout = 0;
    for (int k = 0; k < 8 && !got_timeout; k++) {
        assert_int_equal(send_small(p, 7, (uint32_t)k, 0, 1.0), 0);
        double until = shmconn_now() + 0.05;
        while (!got_timeout && shmconn_now() < until) {
            int rc = shmconn_recv(c, &ev, until - shmconn_now());
            if (rc == SHMCONN_E_TIMEOUT) break;
            assert_int_equal(rc, 0);
            if (ev.type == SHMCONN_EVENT_MESSAGE) {
                if (ev.msg.req_id == 6) t_last6 = shmconn_now();
                assert_int_equal(shmconn_release(c, &ev.msg), 0);
            } else {
                assert_int_equal(ev.type, SHMCONN_EVENT_TIMEOUT);
                assert_int_equal(ev.req_id, 6); /* 7 is alive */
                assert_int_equal(ev.first_chunk, 0);
                double dt = shmconn_now() - t_last6;
                assert_true(dt >= 0.15 && dt < 0.4);
                got_timeout = 1;
            }
        }
    }
    assert_true(got_timeout);
    /* Messages of 6 that were already under way are dropped, 7 still flows. */
    assert_int_equal(send_small(p, 6, 1, 0, 1.0), SHMCONN_E_CANCELLED);
    assert_int_equal(send_small(p, 7, 100, SHMCONN_FLAG_LAST, 1.0), 0);
    assert_int_equal(shmconn_recv(c, &ev, 1.0), 0);
    assert_int_equal(ev.req_id, 7);
    assert_int_equal(ev.msg.chunk, 100);
    shmconn_release(c, &ev.msg);
    shmconn_close(p);
    shmconn_close(c);
}

static void test_cancel_drops(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("cx", 1024, 0, 8);
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    assert_int_equal(send_small(p, 11, 0, 0, 1.0), 0); /* already in the ring when cancelled */
    assert_int_equal(shmconn_request_cancel(c, 11), 0);
    assert_int_equal(send_small(p, 12, 0, 0, 1.0), 0);
    struct shmconn_event ev;
    assert_int_equal(shmconn_recv(c, &ev, 1.0), 0);
    assert_int_equal(ev.req_id, 12);
    shmconn_release(c, &ev.msg);
    struct shmconn_stats st;
    shmconn_stats_get(c, &st);
    assert_int_equal(st.dropped, 1);
    uint64_t id;
    uint32_t why;
    assert_int_equal(shmconn_cancel_poll(p, &id, &why), 1);
    assert_int_equal(id, 11);
    assert_int_equal(why, SHMCONN_CANCEL_BY_CONSUMER);
    shmconn_close(p);
    shmconn_close(c);
}

static void test_backpressure_timeout(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("bp", 1024, 0, 2);
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    assert_int_equal(send_small(p, 1, 0, 0, 1.0), 0);
    assert_int_equal(send_small(p, 1, 0, 0, 1.0), 0);
    double t0 = shmconn_now();
    assert_int_equal(send_small(p, 1, 0, 0, 0.15), SHMCONN_E_TIMEOUT); /* full: never drops, never grows */
    double dt = shmconn_now() - t0;
    assert_true(dt >= 0.15 && dt < 0.4);
    shmconn_close(c);
    assert_int_equal(send_small(p, 1, 0, 0, 1.0), SHMCONN_E_CLOSED);
    shmconn_close(p);
}

static void test_producer_close(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("pc", 1024, 0, 8);
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    shmconn_t *c2;
    assert_int_equal(shmconn_open(&c2, &cfg, 0.1), -EBUSY); /* one consumer per region */
    assert_int_equal(shmconn_request_begin(c, 1), 0);
    assert_int_equal(shmconn_request_begin(c, 2), 0);
    assert_int_equal(send_small(p, 1, 0, 0, 1.0), 0);
    assert_int_equal(shmconn_peer_status(c), 0);
    shmconn_close(p);
    assert_int_equal(shmconn_peer_status(c), SHMCONN_E_CLOSED);
    assert_int_equal(test_shm_count(), 0);
    struct shmconn_event ev;
    assert_int_equal(shmconn_recv(c, &ev, 1.0), 0); /* published before the close: delivered */
    assert_int_equal(ev.type, SHMCONN_EVENT_MESSAGE);
    shmconn_release(c, &ev.msg);
    int lost = 0;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(shmconn_recv(c, &ev, 1.0), 0);
        assert_int_equal(ev.type, SHMCONN_EVENT_PEER_LOST);
        assert_int_equal(ev.status, SHMCONN_E_CLOSED);
        lost |= 1 << ev.req_id;
    }
    assert_int_equal(lost, 6);
    assert_int_equal(shmconn_recv(c, &ev, 1.0), SHMCONN_E_CLOSED);
    shmconn_close(c);
}

/* ---- regions that must be refused ---- */

static void test_corrupt_header_refused(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("cor", 1024, 4096, 4);
    shmconn_t *p, *c;
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    char path[128];
    snprintf(path, sizeof path, "/%scor", test_shm_prefix());
    int fd = shm_open(path, O_RDWR, 0);
    assert_true(fd >= 0);
    struct shmconn_geometry g, orig;
    assert_int_equal(pread(fd, &orig, sizeof orig, 0), sizeof orig);

    g = orig;
    g.magic ^= 1;
    assert_int_equal(pwrite(fd, &g, sizeof g, 0), sizeof g);
    assert_int_equal(shmconn_open(&c, &cfg, 0.05), SHMCONN_E_BAD_REGION);
    g = orig;
    g.version = 99;
    assert_int_equal(pwrite(fd, &g, sizeof g, 0), sizeof g);
    assert_int_equal(shmconn_open(&c, &cfg, 0.05), SHMCONN_E_BAD_REGION);
    g = orig;
    g.payload_bytes *= 1024; /* would let the reader run off the mapping */
    assert_int_equal(pwrite(fd, &g, sizeof g, 0), sizeof g);
    assert_int_equal(shmconn_open(&c, &cfg, 0.05), SHMCONN_E_BAD_REGION);
    assert_int_equal(pwrite(fd, &orig, sizeof orig, 0), sizeof orig);
    struct shmconn_config other = cfg;
    other.n_slots = 8; /* consumer configured differently */
    assert_int_equal(shmconn_open(&c, &other, 0.05), SHMCONN_E_BAD_REGION);

    /* A valid header but a corrupt slot: refused at receive. */
    assert_int_equal(shmconn_open(&c, &cfg, 0.05), 0);
    struct shmconn_slot s;
    memset(&s, 0, sizeof s);
    s.seq = 0;
    s.n_tensors = 1;
    s.payload_pos = SHMCONN_INLINE;
    s.payload_end = SHMCONN_INLINE;
    s.payload_len = 64;
    snprintf(s.tensors[0].name, 16, "x");
    s.tensors[0].dtype = SHMCONN_DTYPE_U8;
    s.tensors[0].ndim = 1;
    s.tensors[0].shape[0] = 1u << 20; /* far beyond the slot */
    s.tensors[0].nbytes = 1u << 20;
    off_t slot0 = SHMCONN_HEADER_BYTES + SHMCONN_CANCEL_BYTES;
    assert_int_equal(pwrite(fd, &s, sizeof s, slot0), sizeof s);
    uint32_t tail = 1;
    assert_int_equal(pwrite(fd, &tail, 4, offsetof(struct shmconn_header, prod.tail)), 4);
    struct shmconn_event ev;
    assert_int_equal(shmconn_recv(c, &ev, 0.1), SHMCONN_E_BAD_REGION);
    close(fd);
    shmconn_close(c);
    shmconn_close(p);

    /* A truncated segment that is not a region at all. */
    fd = shm_open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    struct shmconn_geometry junk;
    memset(&junk, 0xab, sizeof junk);
    assert_int_equal(pwrite(fd, &junk, sizeof junk, 0), sizeof junk);
    close(fd);
    assert_int_equal(shmconn_open(&c, &cfg, 0.05), SHMCONN_E_BAD_REGION);
    shm_unlink(path);
}

static void test_reclaim_stale(void **state)
{
    (void)state;
    /* A region whose creator exited without closing (its _exit skips shmconn_close). */
    struct shmconn_config cfg = test_shm_config("stale", 1024, 0, 4);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        shmconn_t *p;
        _exit(shmconn_create(&p, &cfg) == 0 ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(test_shm_count(), 1);
    shmconn_t *c;
    assert_int_equal(shmconn_open(&c, &cfg, 0.1), SHMCONN_E_TIMEOUT); /* never attaches to a dead producer */
    /* A live region of another name is left alone. */
    struct shmconn_config live = test_shm_config("live", 1024, 0, 4);
    shmconn_t *p;
    assert_int_equal(shmconn_create(&p, &live), 0);
    assert_int_equal(shmconn_create(&(shmconn_t *){0}, &live), -EEXIST);
    assert_int_equal(shmconn_reclaim_stale(test_shm_prefix()), 1);
    assert_int_equal(test_shm_count(), 1);
    shmconn_close(p);
    /* create over a stale name also works (the producer restarting). */
    pid = fork();
    if (pid == 0) {
        shmconn_t *q;
        _exit(shmconn_create(&q, &cfg) == 0 ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    shmconn_close(p);
    assert_int_equal(test_shm_count(), 0);
}

/* ---- who may be mapped: owner, mode, run token ---- */

/* A segment another user owns (chown'ed to nobody, as CI runs as root) or that group
 * or others may access is refused before it is mapped, naming the segment and owner. */
static void test_foreign_owner_refused(void **state)
{
    (void)state;
    if (geteuid() != 0) skip(); /* chown needs root; CI runs as root */
    struct shmconn_config cfg = test_shm_config("own", 1024, 0, 4);
    shmconn_t *p, *c;
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    char path[300];
    snprintf(path, sizeof path, "/dev/shm%s", shmconn_segment_name(p));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    assert_int_equal(chown(path, 65534, 65534), 0);
    assert_int_equal(shmconn_open(&c, &cfg, 0.2), SHMCONN_E_FOREIGN);
    assert_non_null(strstr(mm3_last_error(), shmconn_segment_name(p)));
    assert_non_null(strstr(mm3_last_error(), "owned by uid 65534"));
    assert_int_equal(chown(path, 0, 0), 0);

    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(shmconn_open(&c, &cfg, 0.2), SHMCONN_E_FOREIGN);
    assert_non_null(strstr(mm3_last_error(), "mode 0644"));
    assert_int_equal(chmod(path, 0600), 0);

    assert_int_equal(shmconn_open(&c, &cfg, 0.2), 0);
    shmconn_close(c);
    shmconn_close(p);
}

/* The run id is part of the name; the opener must find the run's token in the header. */
static void test_run_token(void **state)
{
    (void)state;
    struct shmconn_config pc = test_shm_config("tok", 1024, 0, 4);
    snprintf(pc.run_id, sizeof pc.run_id, "0123456789abcdef0123456789abcdef");
    memset(pc.token, 0x5a, sizeof pc.token);
    shmconn_t *p, *c;
    assert_int_equal(shmconn_create(&p, &pc), 0);
    assert_non_null(strstr(shmconn_segment_name(p), "0123456789abcdef0123456789abcdef-tok"));

    struct shmconn_config cc = pc;
    cc.token[7] ^= 1;
    assert_int_equal(shmconn_open(&c, &cc, 0.2), SHMCONN_E_FOREIGN);
    assert_non_null(strstr(mm3_last_error(), "token"));
    assert_non_null(strstr(mm3_last_error(), shmconn_segment_name(p)));
    memset(cc.token, 0, sizeof cc.token); /* no token at all is no better */
    assert_int_equal(shmconn_open(&c, &cc, 0.2), SHMCONN_E_FOREIGN);
    cc.run_id[0] = 0; /* without the run id the name is another one: nothing to open */
    cc = pc;
    cc.run_id[0] = 0;
    assert_int_equal(shmconn_open(&c, &cc, 0.05), SHMCONN_E_TIMEOUT);

    assert_int_equal(shmconn_open(&c, &pc, 0.2), 0);
    shmconn_close(c);
    shmconn_close(p);

    struct shmconn_config bad = pc;
    snprintf(bad.run_id, sizeof bad.run_id, "0123456789ABCDEF0123456789abcdef");
    assert_int_equal(shmconn_create(&p, &bad), -EINVAL);
    snprintf(bad.run_id, sizeof bad.run_id, "../../tmp/x");
    assert_int_equal(shmconn_create(&p, &bad), -EINVAL);
}

/* The stages' run identity from the environment: a prefix that is not one plain file
 * name part, a run id that is not 32 lowercase hex digits, a token that is not 32 hex
 * digits, or only one of id and token, is refused naming the variable. */
static void test_run_from_env(void **state)
{
    (void)state;
    struct pipe_run run;
    const char *id = "00112233445566778899aabbccddeeff", *tok = "0F1e2d3c4b5a69788796a5b4c3d2e1f0";
    unsetenv("MM3_RUN_ID");
    unsetenv("MM3_RUN_TOKEN");
    unsetenv("MM3_SHM_PREFIX");
    assert_int_equal(pipe_run_from_env(&run), 0);
    assert_string_equal(run.prefix, SHMCONN_DEFAULT_PREFIX);
    assert_string_equal(run.run_id, "");
    const char *bad_prefixes[] = {
        "../../tmp/x-", "..", "a..b", "a/b", "a b", "x\n", "0123456789012345678901234567890123"};
    for (size_t i = 0; i < sizeof bad_prefixes / sizeof *bad_prefixes; i++) {
        setenv("MM3_SHM_PREFIX", bad_prefixes[i], 1);
        assert_int_equal(pipe_run_from_env(&run), -EINVAL);
        assert_non_null(strstr(mm3_last_error(), "MM3_SHM_PREFIX"));
    }
    setenv("MM3_SHM_PREFIX", "mm3.a_b-", 1);
    setenv("MM3_RUN_ID", id, 1);
    assert_int_equal(pipe_run_from_env(&run), -EINVAL); /* id without token */
    assert_non_null(strstr(mm3_last_error(), "MM3_RUN_TOKEN"));
    setenv("MM3_RUN_TOKEN", tok, 1);
    assert_int_equal(pipe_run_from_env(&run), 0);
    assert_string_equal(run.prefix, "mm3.a_b-");
    assert_string_equal(run.run_id, id);
    assert_int_equal(run.token[0], 0x0f);
    assert_int_equal(run.token[15], 0xf0);
    struct shmconn_config c = test_shm_config("x", 64, 0, 2);
    pipe_run_apply(&run, &c);
    assert_string_equal(c.run_id, id);
    assert_memory_equal(c.token, run.token, sizeof c.token);
    char name[160];
    assert_non_null(strstr(pipe_segment_name(&c, name, sizeof name), id));
    setenv("MM3_RUN_ID", "00112233445566778899AABBCCDDEEFF", 1);
    assert_int_equal(pipe_run_from_env(&run), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "MM3_RUN_ID"));
    setenv("MM3_RUN_ID", id, 1);
    setenv("MM3_RUN_TOKEN", "0011", 1);
    assert_int_equal(pipe_run_from_env(&run), -EINVAL);
    setenv("MM3_RUN_TOKEN", "zz112233445566778899aabbccddeeff", 1);
    assert_int_equal(pipe_run_from_env(&run), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "MM3_RUN_TOKEN"));
    unsetenv("MM3_RUN_ID");
    unsetenv("MM3_RUN_TOKEN");
    unsetenv("MM3_SHM_PREFIX");
}

/* Heartbeats: each side stamps its own line, the other reads the age. */
static void test_heartbeat(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("hb", 1024, 0, 4);
    shmconn_t *p, *c;
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    assert_int_equal(shmconn_open(&c, &cfg, 0.2), 0);
    assert_true(shmconn_peer_heartbeat_age(c) < 0);
    assert_true(shmconn_peer_heartbeat_age(p) < 0);
    shmconn_heartbeat(p);
    double a = shmconn_peer_heartbeat_age(c);
    assert_true(a >= 0 && a < 1.0);
    assert_true(shmconn_peer_heartbeat_age(p) < 0);
    struct timespec ts = {0, 60000000};
    nanosleep(&ts, NULL);
    assert_true(shmconn_peer_heartbeat_age(c) >= 0.05);
    shmconn_heartbeat(c);
    assert_true(shmconn_peer_heartbeat_age(p) >= 0 && shmconn_peer_heartbeat_age(p) < 1.0);
    shmconn_close(c);
    shmconn_close(p);
}

/* ---- one consumer handle used from two threads (TSan checks the locking) ---- */

struct releaser {
    shmconn_t *c;
    struct shmconn_msg q[64];
    int n, done;
    pthread_mutex_t mu;
};

static void *releaser_main(void *arg)
{
    struct releaser *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->mu);
        int n = r->n, done = r->done;
        struct shmconn_msg m;
        if (n > 0) m = r->q[--r->n];
        pthread_mutex_unlock(&r->mu);
        if (n > 0)
            shmconn_release(r->c, &m);
        else if (done)
            return NULL;
        else
            sched_yield();
    }
}

static void test_release_from_other_thread(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("thr", 64, 1u << 16, 8);
    shmconn_t *p, *c;
    pair_open(&cfg, &p, &c);
    struct feed f = {.p = p, .n_req = 3, .n_chunk = 200, .sizes = {8, 100, 3000, 9000, 40}};
    pthread_t tf, tr;
    struct releaser r = {.c = c};
    pthread_mutex_init(&r.mu, NULL);
    pthread_create(&tf, NULL, feed_main, &f);
    pthread_create(&tr, NULL, releaser_main, &r);
    for (int i = 0; i < 600; i++) {
        struct shmconn_event ev;
        assert_int_equal(shmconn_recv(c, &ev, 10.0), 0);
        int rq = (int)(ev.msg.req_id - 1000);
        msg_check(&ev.msg, ev.msg.req_id, ev.msg.chunk, feed_size(&f, rq, (int)ev.msg.chunk));
        for (;;) {
            pthread_mutex_lock(&r.mu);
            int ok = r.n < 64;
            if (ok) r.q[r.n++] = ev.msg;
            pthread_mutex_unlock(&r.mu);
            if (ok) break;
            sched_yield();
        }
    }
    pthread_mutex_lock(&r.mu);
    r.done = 1;
    pthread_mutex_unlock(&r.mu);
    pthread_join(tf, NULL);
    pthread_join(tr, NULL);
    assert_int_equal(f.rc, 0);
    pthread_mutex_destroy(&r.mu);
    shmconn_close(p);
    shmconn_close(c);
}

static int group_setup(void **state)
{
    (void)state;
    test_shm_prefix_init("mm3t");
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_rejected),
        cmocka_unit_test(test_roundtrip_inline),
        cmocka_unit_test(test_roundtrip_payload),
        cmocka_unit_test(test_too_big),
        cmocka_unit_test(test_zero_copy_send),
        cmocka_unit_test(test_ordering_backpressure),
        cmocka_unit_test(test_many_requests_interleaved),
        cmocka_unit_test(test_first_chunk_timeout),
        cmocka_unit_test(test_steady_timeout),
        cmocka_unit_test(test_cancel_drops),
        cmocka_unit_test(test_backpressure_timeout),
        cmocka_unit_test(test_producer_close),
        cmocka_unit_test(test_corrupt_header_refused),
        cmocka_unit_test(test_reclaim_stale),
        cmocka_unit_test(test_foreign_owner_refused),
        cmocka_unit_test(test_run_token),
        cmocka_unit_test(test_heartbeat),
        cmocka_unit_test(test_run_from_env),
        cmocka_unit_test(test_release_from_other_thread),
    };
    return cmocka_run_group_tests(tests, group_setup, test_shm_group_teardown);
}
