/* The frame spool: layout and policy in stage0/recovery/frame_spool.h, the why in
 * docs/journal.md. Written with stdio (buffered appends, a few hundred KB a second
 * per song); read with two passes over the file (check, then deliver) so that a
 * short spool is known before any frame goes out, without holding the song in memory. */
#include "stage0/recovery/frame_spool.h"

#include <blake2.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"

#define MAGIC "MM3SPOOL"         /* 8 bytes, no NUL */
#define HEADER_FIXED (8 + 4 * 4) /* magic, version, dtype, width, id length */

struct frame_spool {
    FILE *f;
    char *path;
    size_t frame_bytes;
    int frames;    /* appended */
    int unflushed; /* frames appended since the last flush */
    int disabled;
    char id[JOURNAL_ID_MAX];
    int width;
    enum mm3_dtype dtype;
};

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> 8 * i);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> 8 * i);
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static void hash_init(blake2b_state *s)
{
    blake2b_init(s, 8);
}

static uint64_t hash_final(blake2b_state *s)
{
    uint8_t d[8];
    blake2b_final(s, d, sizeof d);
    return get_u64(d);
}

int frame_spool_path_for(const char *journal_path, char **path, char id[JOURNAL_ID_MAX])
{
    *path = NULL;
    size_t n = strlen(journal_path), sl = strlen(JOURNAL_SUFFIX);
    if (n <= sl || strcmp(journal_path + n - sl, JOURNAL_SUFFIX))
        return mm3_errorf(-EINVAL, "frame spool: journal path '%s' does not end in %s", journal_path, JOURNAL_SUFFIX);
    const char *base = strrchr(journal_path, '/');
    base = base ? base + 1 : journal_path;
    size_t idl = (size_t)(journal_path + n - sl - base);
    if (idl == 0 || idl >= JOURNAL_ID_MAX)
        return mm3_errorf(-EINVAL, "frame spool: journal path '%s': request id of %zu characters, expected 1..%d",
                          journal_path, idl, JOURNAL_ID_MAX - 1);
    size_t pl = n - sl + sizeof FRAME_SPOOL_SUFFIX;
    if (!(*path = malloc(pl))) return mm3_errorf(-ENOMEM, "frame spool: out of memory");
    snprintf(*path, pl, "%.*s%s", (int)(n - sl), journal_path, FRAME_SPOOL_SUFFIX);
    memcpy(id, base, idl);
    id[idl] = '\0';
    return 0;
}

/* ---- writing ---- */

/* The first write error disables the writer: the request goes on without a spool. */
static int writer_fail(struct frame_spool *sp, int rc, const char *what)
{
    if (sp->disabled) return 0;
    sp->disabled = 1;
    mm3_errorf(rc, "frame spool %s: %s failed: %s; spooling disabled for this request (a re-send teacher-forces)",
               sp->path, what, strerror(-rc));
    LOG_WARN("%s", mm3_last_error());
    return rc;
}

static int put(struct frame_spool *sp, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, sp->f) != n) return writer_fail(sp, errno ? -errno : -EIO, "write");
    return 0;
}

static void writer_free(struct frame_spool *sp)
{
    if (sp->f) fclose(sp->f); /* errors here lose only what a crash would */
    free(sp->path);
    free(sp);
}

int frame_spool_open(struct frame_spool **out, const char *path, const char *req_id, int width, enum mm3_dtype dtype)
{
    *out = NULL;
    size_t idl = req_id ? strlen(req_id) : 0;
    if (idl == 0 || idl >= JOURNAL_ID_MAX)
        return mm3_errorf(-EINVAL, "frame spool %s: request id of %zu characters, expected 1..%d", path, idl,
                          JOURNAL_ID_MAX - 1);
    if (width < 1 || width > FRAME_SPOOL_MAX_WIDTH || (int)dtype < 0 || dtype >= MM3_DTYPE_COUNT)
        return mm3_errorf(-EINVAL, "frame spool %s: width %d / dtype %d: expected 1..%d and a known dtype", path, width,
                          (int)dtype, FRAME_SPOOL_MAX_WIDTH);
    struct frame_spool *sp = calloc(1, sizeof *sp);
    if (!sp || !(sp->path = strdup(path))) {
        free(sp);
        return mm3_errorf(-ENOMEM, "frame spool: out of memory");
    }
    memcpy(sp->id, req_id, idl + 1);
    sp->width = width;
    sp->dtype = dtype;
    sp->frame_bytes = (size_t)width * mm3_dtype_size(dtype);
    /* O_EXCL: never overwrite (a stale file of the same name is not ours); 0600: the
     * frames are the song, for this user only */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || !(sp->f = fdopen(fd, "wb"))) {
        int err = errno;
        if (fd >= 0) close(fd);
        int rc = mm3_errorf(-err, "frame spool %s: cannot create: %s (api.journal_dir must be a writable folder)",
                            path, strerror(err));
        writer_free(sp);
        return rc;
    }
    uint8_t h[HEADER_FIXED + JOURNAL_ID_MAX + 8];
    memcpy(h, MAGIC, 8);
    put_u32(h + 8, FRAME_SPOOL_VERSION);
    put_u32(h + 12, (uint32_t)dtype);
    put_u32(h + 16, (uint32_t)width);
    put_u32(h + 20, (uint32_t)idl);
    memcpy(h + HEADER_FIXED, req_id, idl);
    blake2b_state s;
    hash_init(&s);
    blake2b_update(&s, h, HEADER_FIXED + idl);
    put_u64(h + HEADER_FIXED + idl, hash_final(&s));
    errno = 0;
    if (fwrite(h, 1, HEADER_FIXED + idl + 8, sp->f) != HEADER_FIXED + idl + 8 || fflush(sp->f) != 0) {
        int rc = mm3_errorf(errno ? -errno : -EIO, "frame spool %s: writing the header failed: %s", path,
                            strerror(errno ? errno : EIO));
        unlink(path);
        writer_free(sp);
        return rc;
    }
    *out = sp;
    return 0;
}

int frame_spool_flush(struct frame_spool *sp)
{
    if (!sp || sp->disabled) return 0;
    sp->unflushed = 0;
    errno = 0;
    if (fflush(sp->f) != 0) return writer_fail(sp, errno ? -errno : -EIO, "flush");
    return 0;
}

int frame_spool_append(struct frame_spool *sp, int first, int n, const void *frames)
{
    if (!sp || sp->disabled || n <= 0) return 0;
    if (first != sp->frames) {
        char what[96];
        snprintf(what, sizeof what, "append of frames %d..%d (expected to start at frame %d)", first, first + n - 1,
                 sp->frames);
        return writer_fail(sp, -EINVAL, what);
    }
    if (n > FRAME_SPOOL_MAX_FRAMES - sp->frames) return writer_fail(sp, -E2BIG, "append past the frame limit");
    uint8_t rh[8], tail[8];
    put_u32(rh, (uint32_t)first);
    put_u32(rh + 4, (uint32_t)n);
    size_t bytes = (size_t)n * sp->frame_bytes;
    blake2b_state s;
    hash_init(&s);
    blake2b_update(&s, rh, sizeof rh);
    blake2b_update(&s, frames, bytes);
    put_u64(tail, hash_final(&s));
    errno = 0;
    int rc;
    if ((rc = put(sp, rh, sizeof rh)) < 0 || (rc = put(sp, frames, bytes)) < 0 || (rc = put(sp, tail, sizeof tail)) < 0)
        return rc;
    sp->frames += n;
    sp->unflushed += n;
    return sp->unflushed >= FRAME_SPOOL_FLUSH_FRAMES ? frame_spool_flush(sp) : 0;
}

int frame_spool_frames(const struct frame_spool *sp)
{
    return sp ? sp->frames : 0;
}

int frame_spool_disabled(const struct frame_spool *sp)
{
    return !sp || sp->disabled;
}

const char *frame_spool_path(const struct frame_spool *sp)
{
    return sp ? sp->path : "";
}

void frame_spool_close(struct frame_spool *sp)
{
    if (sp) writer_free(sp);
}

void frame_spool_remove(struct frame_spool *sp)
{
    if (!sp) return;
    if (unlink(sp->path) < 0 && errno != ENOENT)
        LOG_WARN("frame spool %s: cannot delete: %s", sp->path, strerror(errno));
    writer_free(sp);
}

int frame_spool_read_back(struct frame_spool *sp, int chunk_frames, const struct frame_spool_sink *sink, int *n_frames)
{
    *n_frames = 0;
    if (!sp) return mm3_errorf(-ENODATA, "no frame spool");
    if (sp->disabled) return mm3_errorf(-ENODATA, "frame spool %s: disabled by a write error", sp->path);
    int rc = frame_spool_flush(sp);
    if (rc < 0) return rc;
    rc = frame_spool_read(sp->path, sp->id, sp->width, sp->dtype, sp->frames, chunk_frames, sink);
    if (rc == 0) *n_frames = sp->frames;
    return rc;
}

/* ---- reading ---- */

/* Open path and check its header; on success the file is at the first record. */
static int header_check(FILE **out, const char *path, const char *req_id, int width, enum mm3_dtype dtype)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        if (fd >= 0) close(fd);
        return mm3_errorf(-err, "frame spool %s: cannot open: %s", path, strerror(err));
    }
    uint8_t h[HEADER_FIXED + JOURNAL_ID_MAX + 8];
    size_t got = fread(h, 1, HEADER_FIXED, f);
    int rc = 0;
    uint32_t idl = got == HEADER_FIXED ? get_u32(h + 20) : 0;
    if (got == HEADER_FIXED && memcmp(h, MAGIC, 8) != 0)
        rc = mm3_errorf(-EINVAL, "frame spool %s: not a frame spool (bad magic)", path);
    else if (got == HEADER_FIXED && get_u32(h + 8) != FRAME_SPOOL_VERSION)
        rc = mm3_errorf(-EINVAL, "frame spool %s: header field 'version' is %u, expected %d", path, get_u32(h + 8),
                        FRAME_SPOOL_VERSION);
    else if (got == HEADER_FIXED && (idl == 0 || idl >= JOURNAL_ID_MAX))
        rc = mm3_errorf(-EINVAL, "frame spool %s: header field 'request_id' length %u, expected 1..%d", path, idl,
                        JOURNAL_ID_MAX - 1);
    else if (got < HEADER_FIXED || fread(h + HEADER_FIXED, 1, idl + 8, f) != idl + 8)
        rc = mm3_errorf(-EINVAL, "frame spool %s: truncated header", path);
    if (rc < 0) {
        fclose(f);
        return rc;
    }
    blake2b_state s;
    hash_init(&s);
    blake2b_update(&s, h, HEADER_FIXED + idl);
    uint32_t fdt = get_u32(h + 12), fw = get_u32(h + 16);
    size_t want_idl = strlen(req_id);
    if (hash_final(&s) != get_u64(h + HEADER_FIXED + idl))
        rc = mm3_errorf(-EINVAL, "frame spool %s: header checksum mismatch (corrupt header)", path);
    else if (idl != want_idl || memcmp(h + HEADER_FIXED, req_id, idl) != 0)
        rc = mm3_errorf(-EINVAL, "frame spool %s: header field 'request_id' is '%.*s', expected '%s'", path, (int)idl,
                        (const char *)h + HEADER_FIXED, req_id);
    else if (fw != (uint32_t)width)
        rc = mm3_errorf(-EINVAL, "frame spool %s: header field 'width' is %u, expected %d", path, fw, width);
    else if (fdt != (uint32_t)dtype)
        rc = mm3_errorf(-EINVAL, "frame spool %s: header field 'dtype' is %s, expected %s", path,
                        fdt < MM3_DTYPE_COUNT ? mm3_dtype_name((enum mm3_dtype)fdt) : "unknown", mm3_dtype_name(dtype));
    if (rc < 0) {
        fclose(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* One pass over the records (walk_records). */
struct walk {
    FILE *f;
    const char *path;
    size_t frame_bytes;
    int limit, chunk;
    const struct frame_spool_sink *sink;
    uint8_t *buf; /* sink: pending frames, room for chunk + one record */
    size_t cap;   /* bytes */
    int n, torn;
};

/* Read n bytes into dst (or a scratch piece at a time when dst is NULL) and hash them. */
static int read_hashed(FILE *f, blake2b_state *s, uint8_t *dst, size_t n)
{
    uint8_t scratch[16384];
    while (n > 0) {
        size_t k = dst ? n : n < sizeof scratch ? n : sizeof scratch;
        uint8_t *p = dst ? dst : scratch;
        if (fread(p, 1, k, f) != k) return -1;
        blake2b_update(s, p, k);
        if (dst) dst += k;
        n -= k;
    }
    return 0;
}

/* Without sink: count the intact frames. With sink: deliver frames 0..limit-1 in
 * pieces of at most chunk, each record only once its checksum matched. w->n = frames
 * taken; w->torn = 1 when a record was cut or corrupt. */
static int walk_records(struct walk *w)
{
    int pending = 0; /* frames in buf, starting at frame w->n - pending */
    w->n = 0;
    w->torn = 0;
    while (w->n < w->limit) {
        uint8_t rh[8], tail[8];
        size_t got = fread(rh, 1, sizeof rh, w->f);
        if (got < sizeof rh) {
            w->torn = got > 0;
            break;
        }
        uint32_t first = get_u32(rh), n = get_u32(rh + 4);
        if (first != (uint32_t)w->n || n == 0 || n > (uint32_t)(FRAME_SPOOL_MAX_FRAMES - w->n)) {
            w->torn = 1;
            break;
        }
        size_t bytes = (size_t)n * w->frame_bytes;
        uint8_t *dst = NULL;
        if (w->sink) {
            size_t need = (size_t)pending * w->frame_bytes + bytes;
            if (need > w->cap) {
                uint8_t *b = realloc(w->buf, need);
                if (!b) return mm3_errorf(-ENOMEM, "frame spool %s: out of memory for %u frames", w->path, n);
                w->buf = b;
                w->cap = need;
            }
            dst = w->buf + (size_t)pending * w->frame_bytes;
        }
        blake2b_state s;
        hash_init(&s);
        blake2b_update(&s, rh, sizeof rh);
        if (read_hashed(w->f, &s, dst, bytes) < 0 || fread(tail, 1, sizeof tail, w->f) != sizeof tail ||
            hash_final(&s) != get_u64(tail)) {
            w->torn = 1;
            break;
        }
        int take = (int)n < w->limit - w->n ? (int)n : w->limit - w->n;
        w->n += take;
        if (!w->sink) continue;
        pending += take;
        /* full pieces go out; the rest waits for the next record */
        int sent = 0;
        while (pending - sent >= w->chunk || (w->n == w->limit && pending > sent)) {
            int k = pending - sent < w->chunk ? pending - sent : w->chunk;
            int rc = w->sink->emit(w->sink->ctx, w->n - pending + sent, w->buf + (size_t)sent * w->frame_bytes, k);
            if (rc) return rc;
            sent += k;
        }
        if (sent) memmove(w->buf, w->buf + (size_t)sent * w->frame_bytes, (size_t)(pending - sent) * w->frame_bytes);
        pending -= sent;
    }
    if (ferror(w->f)) return mm3_errorf(-EIO, "frame spool %s: read error", w->path);
    return 0;
}

int frame_spool_scan(const char *path, const char *req_id, int width, enum mm3_dtype dtype, int *n_frames, int *torn)
{
    *n_frames = 0;
    *torn = 0;
    FILE *f;
    int rc = header_check(&f, path, req_id, width, dtype);
    if (rc < 0) return rc;
    struct walk w = {
        .f = f, .path = path, .frame_bytes = (size_t)width * mm3_dtype_size(dtype), .limit = FRAME_SPOOL_MAX_FRAMES};
    rc = walk_records(&w);
    fclose(f);
    if (rc < 0) return rc;
    *n_frames = w.n;
    *torn = w.torn;
    return 0;
}

int frame_spool_read(const char *path, const char *req_id, int width, enum mm3_dtype dtype, int n_frames,
                     int chunk_frames, const struct frame_spool_sink *sink)
{
    if (n_frames < 0 || chunk_frames < 1)
        return mm3_errorf(-EINVAL, "frame spool %s: read of %d frames in pieces of %d", path, n_frames, chunk_frames);
    int have, torn;
    int rc = frame_spool_scan(path, req_id, width, dtype, &have, &torn);
    if (rc < 0) return rc;
    if (have < n_frames)
        return mm3_errorf(-ENODATA, "frame spool %s: short: %d intact frames%s, expected %d", path, have,
                          torn ? " before a torn or corrupt record" : "", n_frames);
    if (n_frames == 0) return 0;
    FILE *f;
    if ((rc = header_check(&f, path, req_id, width, dtype)) < 0) return rc;
    struct walk w = {.f = f,
                     .path = path,
                     .frame_bytes = (size_t)width * mm3_dtype_size(dtype),
                     .limit = n_frames,
                     .chunk = chunk_frames,
                     .sink = sink};
    rc = walk_records(&w);
    fclose(f);
    free(w.buf);
    if (rc == 0 && w.n < n_frames)
        rc =
            mm3_errorf(-EIO, "frame spool %s: changed while being read (%d frames intact, %d before)", path, w.n, have);
    return rc;
}
