#include "common/file_reader.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"

#define FR_DEFAULT_QD 16
#define FR_MAX_QD 256
#define FR_DEFAULT_BLOCK (4u << 20)
#define FR_MAX_BLOCK (64u << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void opts_resolve(const struct file_reader_opts *in, struct file_reader_opts *o)
{
    if (in)
        *o = *in;
    else
        memset(o, 0, sizeof *o);
    if (o->queue_depth <= 0) o->queue_depth = FR_DEFAULT_QD;
    if (o->queue_depth > FR_MAX_QD) o->queue_depth = FR_MAX_QD;
    if (o->block_bytes == 0) o->block_bytes = FR_DEFAULT_BLOCK;
    if (o->block_bytes > FR_MAX_BLOCK) o->block_bytes = FR_MAX_BLOCK;
    o->block_bytes = (o->block_bytes + 4095) & ~(uint64_t)4095;
    const char *env = getenv("MM3_IO");
    if (o->mode == FILE_READER_AUTO && env && !strcmp(env, "pread")) o->mode = FILE_READER_PREAD;
    if (env && !strcmp(env, "inline")) o->inline_reads = 1;
}

static int short_file_error(const struct file_read *r, uint64_t off)
{
    return mm3_errorf(-EIO, "%s: end of file at byte %llu while reading [%llu, %llu): file truncated while loading?",
                      r->path ? r->path : "(file)", (unsigned long long)off, (unsigned long long)r->offset,
                      (unsigned long long)(r->offset + r->nbytes));
}

static int read_error(const struct file_read *r, int err)
{
    return mm3_errorf(err, "%s: read of [%llu, %llu) failed: %s", r->path ? r->path : "(file)",
                      (unsigned long long)r->offset, (unsigned long long)(r->offset + r->nbytes), strerror(-err));
}

static int run_pread(const struct file_read *reads, int n, const struct file_reader_opts *o,
                     struct file_reader_stats *st)
{
    for (int i = 0; i < n; i++) {
        const struct file_read *r = &reads[i];
        uint8_t *dst = r->dst;
        uint64_t off = r->offset, left = r->nbytes;
        while (left) {
            size_t want = left > o->block_bytes ? (size_t)o->block_bytes : (size_t)left;
            ssize_t got = pread(r->fd, dst, want, (off_t)off);
            st->reads++;
            if (got < 0) {
                if (errno == EINTR) continue;
                return read_error(r, -errno);
            }
            if (got == 0) return short_file_error(r, off);
            dst += got;
            off += (uint64_t)got;
            left -= (uint64_t)got;
            st->bytes += (uint64_t)got;
        }
    }
    return 0;
}

/* One block read in flight: what remains of it after short reads. */
struct fr_slot {
    int req;
    uint64_t off;
    uint64_t len;
    uint8_t *dst;
};

static void slot_prep(struct io_uring *ring, const struct file_read *reads, struct fr_slot *s, int inline_reads)
{
    /* The SQ holds queue_depth entries and at most queue_depth slots are live, so
     * an entry is always free here. */
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    CHECK(sqe != NULL);
    io_uring_prep_read(sqe, reads[s->req].fd, s->dst, (unsigned)s->len, s->off);
    io_uring_sqe_set_data(sqe, s);
    /* IOSQE_ASYNC hands every read to io_uring's worker threads, so page-cache
     * copies and arena page faults run on several cores at once: several times the
     * inline rate from a warm page cache, and no slower cold (docs/checkpoint.md). */
    if (!inline_reads) sqe->flags |= IOSQE_ASYNC;
}

/* Returns 0, a negative errno with the message set, or -ENOSYS/-EOPNOTSUPP/-EINVAL
 * from the ring itself (then *ring_refused is set and no message is kept). */
static int run_uring(const struct file_read *reads, int n, const struct file_reader_opts *o,
                     struct file_reader_stats *st, int *ring_refused)
{
    struct io_uring ring;
    int qd = o->queue_depth;
    *ring_refused = 0;
    int rc = io_uring_queue_init((unsigned)qd, &ring, 0);
    if (rc < 0) {
        *ring_refused = 1;
        return rc;
    }
    struct fr_slot *slots = calloc((size_t)qd, sizeof *slots);
    int *free_ix = calloc((size_t)qd, sizeof *free_ix);
    if (!slots || !free_ix) {
        free(slots);
        free(free_ix);
        io_uring_queue_exit(&ring);
        return mm3_errorf(-ENOMEM, "file reader: out of memory for %d slots", qd);
    }
    int n_free = qd;
    for (int i = 0; i < qd; i++)
        free_ix[i] = qd - 1 - i;
    int ri = 0, inflight = 0, err = 0;
    uint64_t roff = 0;
    for (;;) {
        while (!err && n_free > 0 && ri < n) {
            const struct file_read *r = &reads[ri];
            if (roff >= r->nbytes) {
                ri++;
                roff = 0;
                continue;
            }
            struct fr_slot *s = &slots[free_ix[--n_free]];
            uint64_t len = r->nbytes - roff;
            if (len > o->block_bytes) len = o->block_bytes;
            *s = (struct fr_slot){ri, r->offset + roff, len, (uint8_t *)r->dst + roff};
            roff += len;
            slot_prep(&ring, reads, s, o->inline_reads);
            inflight++;
            st->reads++;
        }
        if (inflight == 0) break;
        rc = io_uring_submit_and_wait(&ring, 1);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
            /* Submission itself failed: nothing further completes reliably. */
            if (!err) err = rc;
            *ring_refused = rc == -EINVAL || rc == -ENOSYS || rc == -EOPNOTSUPP;
            if (!*ring_refused) read_error(&reads[0], rc);
            break;
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe)
        {
            seen++;
            struct fr_slot *s = io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            if (res == -EINTR || res == -EAGAIN) {
                slot_prep(&ring, reads, s, o->inline_reads);
                st->reads++;
                continue;
            }
            if (res <= 0) {
                if (!err) {
                    if (res == 0)
                        err = short_file_error(&reads[s->req], s->off);
                    else if (res == -EINVAL || res == -EOPNOTSUPP || res == -ENOSYS) {
                        err = res;
                        *ring_refused = 1;
                    } else
                        err = read_error(&reads[s->req], res);
                }
                inflight--;
                free_ix[n_free++] = (int)(s - slots);
                continue;
            }
            st->bytes += (uint64_t)res;
            s->off += (uint64_t)res;
            s->dst += res;
            s->len -= (uint64_t)res;
            if (s->len > 0 && !err) {
                slot_prep(&ring, reads, s, o->inline_reads); /* short read: ask for the rest */
                st->reads++;
            } else {
                inflight--;
                free_ix[n_free++] = (int)(s - slots);
            }
        }
        io_uring_cq_advance(&ring, seen);
    }
    io_uring_queue_exit(&ring);
    free(slots);
    free(free_ix);
    return err;
}

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_ok;

static void probe(void)
{
    struct io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) == 0) {
        probe_ok = 1;
        io_uring_queue_exit(&ring);
    }
}

int file_reader_uring_available(void)
{
    pthread_once(&probe_once, probe);
    return probe_ok;
}

int file_reader_run(const struct file_read *reads, int n, const struct file_reader_opts *opts,
                    struct file_reader_stats *stats)
{
    struct file_reader_opts o;
    struct file_reader_stats st = {0};
    opts_resolve(opts, &o);
    double t0 = now_s();
    int rc;
    if (o.mode == FILE_READER_PREAD) {
        rc = run_pread(reads, n, &o, &st);
    } else {
        int refused = 0;
        rc = run_uring(reads, n, &o, &st, &refused);
        st.used_uring = rc == 0;
        if (rc < 0 && refused) {
            if (o.mode == FILE_READER_URING)
                return mm3_errorf(-ENOSYS, "io_uring unavailable here (%s)", strerror(-rc));
            LOG_INFO("io_uring unavailable (%s): reading with pread", strerror(-rc));
            memset(&st, 0, sizeof st);
            rc = run_pread(reads, n, &o, &st);
        }
    }
    st.seconds = now_s() - t0;
    if (stats) *stats = st;
    return rc;
}
