/* The frame spool (stage0/recovery/frame_spool.h): round trip in uneven records and pieces,
 * a torn tail at every byte and a flipped byte anywhere (the intact prefix, never an
 * error), a header of another request / width / dtype / version (refused, naming the
 * file and field), a missing file, a full disk (the writer disables itself), appends
 * out of order, a large count; then, served end to end (tiny-a on the CPU), a kill -9
 * of stage 1 mid-song: the re-send reads the spool back (the log says so) and the
 * song equals the uninterrupted one byte for byte, streamed (async_chunk) and held
 * (async_chunk: false, raw frames); with the spool deleted the re-send falls back to
 * teacher forcing from the journal (the log says so); no spool is left behind.
 * The served part skips without the golden directory or the programs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/http_client.h"
#include "stage0/recovery/frame_spool.h"
#include "support/test_replica.h"
#include "support/test_support.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float next_float(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(int32_t)(rng >> 32) / 2147483648.0f;
}

static float *random_frames(int n, int width)
{
    float *f = malloc(sizeof(float) * (size_t)n * width);
    assert_non_null(f);
    for (size_t i = 0; i < (size_t)n * width; i++)
        f[i] = next_float();
    return f;
}

/* A sink that gathers frames in order and checks the pieces. */
struct gather {
    float *got;
    int width, n, max_piece, pieces, stop_at;
};

static int gather_emit(void *ctx, int first, const void *frames, int n)
{
    struct gather *g = ctx;
    if (first != g->n || n < 1 || n > g->max_piece) return -1000; /* out of order or oversized */
    memcpy(g->got + (size_t)first * g->width, frames, sizeof(float) * (size_t)n * g->width);
    g->n += n;
    g->pieces++;
    return g->stop_at && g->n >= g->stop_at ? 7 : 0;
}

/* Spool n frames in records of 1..7 frames (uneven, as a scheduler appends). */
static char *write_spool(const char *dir, const char *id, const float *frames, int n, int width,
                         struct frame_spool **keep)
{
    char *path;
    asprintf(&path, "%s/%s" FRAME_SPOOL_SUFFIX, dir, id);
    struct frame_spool *sp;
    assert_int_equal(frame_spool_open(&sp, path, id, width, MM3_DTYPE_F32), 0);
    for (int t = 0; t < n;) {
        int k = 1 + t % 7;
        if (k > n - t) k = n - t;
        assert_int_equal(frame_spool_append(sp, t, k, frames + (size_t)t * width), 0);
        t += k;
    }
    assert_int_equal(frame_spool_frames(sp), n);
    if (keep)
        *keep = sp;
    else
        frame_spool_close(sp);
    return path;
}

static void test_path_for(void **state)
{
    (void)state;
    char *p, id[JOURNAL_ID_MAX];
    assert_int_equal(frame_spool_path_for("/var/j/1700000000-42-7" JOURNAL_SUFFIX, &p, id), 0);
    assert_string_equal(p, "/var/j/1700000000-42-7" FRAME_SPOOL_SUFFIX);
    assert_string_equal(id, "1700000000-42-7");
    free(p);
    assert_int_equal(frame_spool_path_for("rel" JOURNAL_SUFFIX, &p, id), 0);
    assert_string_equal(p, "rel" FRAME_SPOOL_SUFFIX);
    assert_string_equal(id, "rel");
    free(p);
    assert_int_equal(frame_spool_path_for("/var/j/x.wav", &p, id), -EINVAL);
    assert_null(p);
    assert_non_null(strstr(mm3_last_error(), "/var/j/x.wav"));
    assert_int_equal(frame_spool_path_for("/var/j/" JOURNAL_SUFFIX, &p, id), -EINVAL);
}

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("spool_rt");
    const int n = 500, w = 24;
    float *frames = random_frames(n, w);
    struct frame_spool *sp;
    char *path = write_spool(dir, "1-2-3", frames, n, w, &sp);
    assert_string_equal(frame_spool_path(sp), path);
    assert_false(frame_spool_disabled(sp));
    /* read back through the live writer, in pieces of 5 (records are 1..7 frames) */
    struct gather g = {.got = calloc((size_t)n * w, sizeof(float)), .width = w, .max_piece = 5};
    int got = -1;
    assert_int_equal(frame_spool_read_back(sp, 5, &(struct frame_spool_sink){&g, gather_emit}, &got), 0);
    assert_int_equal(got, n);
    assert_int_equal(g.n, n);
    assert_int_equal(g.pieces, n / 5);
    assert_memory_equal(g.got, frames, sizeof(float) * (size_t)n * w);
    /* a prefix that ends inside a record, in one piece */
    memset(g.got, 0, sizeof(float) * (size_t)n * w);
    g = (struct gather){.got = g.got, .width = w, .max_piece = 1000};
    assert_int_equal(
        frame_spool_read(path, "1-2-3", w, MM3_DTYPE_F32, 333, 1000, &(struct frame_spool_sink){&g, gather_emit}), 0);
    assert_int_equal(g.n, 333);
    assert_int_equal(g.pieces, 1);
    assert_memory_equal(g.got, frames, sizeof(float) * 333 * w);
    /* the sink's nonzero value stops the read and comes back */
    g = (struct gather){.got = g.got, .width = w, .max_piece = 10, .stop_at = 40};
    assert_int_equal(
        frame_spool_read(path, "1-2-3", w, MM3_DTYPE_F32, n, 10, &(struct frame_spool_sink){&g, gather_emit}), 7);
    assert_int_equal(g.n, 40);
    /* appending goes on after a read-back */
    assert_int_equal(frame_spool_append(sp, n, 1, frames), 0);
    int nf, torn;
    assert_int_equal(frame_spool_flush(sp), 0);
    assert_int_equal(frame_spool_scan(path, "1-2-3", w, MM3_DTYPE_F32, &nf, &torn), 0);
    assert_int_equal(nf, n + 1);
    assert_int_equal(torn, 0);
    /* zero frames is a valid read */
    assert_int_equal(frame_spool_read(path, "1-2-3", w, MM3_DTYPE_F32, 0, 1, &(struct frame_spool_sink){&g, NULL}), 0);
    frame_spool_remove(sp);
    assert_int_equal(access(path, F_OK), -1); /* deleted */
    frame_spool_remove(NULL);                 /* no-op */
    free(g.got);
    free(frames);
    free(path);
    test_remove_tree(dir);
    free(dir);
}

/* Frames of the complete records of write_spool() that fit before byte cut, and
 * where the last of them ends (*end). */
static int frames_before(long cut, long header, int n, int width, long *end)
{
    long at = header;
    int t = 0;
    while (t < n) {
        int k = 1 + t % 7;
        if (k > n - t) k = n - t;
        long rec = 16 + (long)k * width * 4;
        if (at + rec > cut) break;
        at += rec;
        t += k;
    }
    if (end) *end = at;
    return t;
}

static void write_bytes(const char *path, const char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A crash mid-write leaves a torn record: every cut reads back as the frames of the
 * complete records before it, never an error. A flipped byte after the header ends
 * the readable prefix at its record. */
static void test_truncated_tail(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("spool_torn");
    const int n = 40, w = 3;
    const char *id = "torn-1";
    float *frames = random_frames(n, w);
    char *path = write_spool(dir, id, frames, n, w, NULL);
    size_t len;
    char *full = test_file_read(path, &len);
    assert_non_null(full);
    long header = 8 + 16 + (long)strlen(id) + 8;
    long end;
    assert_int_equal(frames_before((long)len, header, n, w, &end), n); /* the layout is as documented */
    assert_int_equal(end, (long)len);
    char cut_path[1200];
    snprintf(cut_path, sizeof cut_path, "%s/cut" FRAME_SPOOL_SUFFIX, dir);
    float *got = malloc(sizeof(float) * n * w);
    for (long cut = header; cut <= (long)len; cut++) {
        write_bytes(cut_path, full, (size_t)cut);
        int nf = -1, torn = -1;
        assert_int_equal(frame_spool_scan(cut_path, id, w, MM3_DTYPE_F32, &nf, &torn), 0);
        int want = frames_before(cut, header, n, w, &end);
        assert_int_equal(nf, want);
        assert_int_equal(torn, cut != end); /* bytes after the last complete record */
        struct gather g = {.got = got, .width = w, .max_piece = 100};
        assert_int_equal(
            frame_spool_read(cut_path, id, w, MM3_DTYPE_F32, nf, 100, &(struct frame_spool_sink){&g, gather_emit}), 0);
        assert_int_equal(g.n, nf);
        if (nf) assert_memory_equal(got, frames, sizeof(float) * (size_t)nf * w);
        if (nf < n) { /* asking for more is "short", and the sink is not called */
            g = (struct gather){.got = got, .width = w, .max_piece = 100};
            assert_int_equal(
                frame_spool_read(cut_path, id, w, MM3_DTYPE_F32, n, 100, &(struct frame_spool_sink){&g, gather_emit}),
                -ENODATA);
            assert_int_equal(g.n, 0);
            assert_non_null(strstr(mm3_last_error(), "short"));
            assert_non_null(strstr(mm3_last_error(), cut_path));
        }
    }
    int nf, torn;
    for (long at = header; at < (long)len; at++) {
        full[at] ^= 0x10;
        write_bytes(cut_path, full, len);
        full[at] ^= 0x10;
        assert_int_equal(frame_spool_scan(cut_path, id, w, MM3_DTYPE_F32, &nf, &torn), 0);
        assert_int_equal(nf, frames_before(at, header, n, w, NULL));
        assert_int_equal(torn, 1);
    }
    free(got);
    free(full);
    free(frames);
    free(path);
    test_remove_tree(dir);
    free(dir);
}

static void expect_refused(const char *path, const char *id, int width, enum mm3_dtype dt, const char *field)
{
    int nf, torn;
    assert_int_equal(frame_spool_scan(path, id, width, dt, &nf, &torn), -EINVAL);
    if (!strstr(mm3_last_error(), field) || !strstr(mm3_last_error(), path))
        fail_msg("message '%s' should name %s and '%s'", mm3_last_error(), path, field);
    struct gather g = {.width = width, .max_piece = 1};
    assert_int_equal(frame_spool_read(path, id, width, dt, 1, 1, &(struct frame_spool_sink){&g, gather_emit}), -EINVAL);
    assert_int_equal(g.n, 0);
}

static void test_wrong_header(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("spool_hdr");
    float *frames = random_frames(4, 8);
    char *path = write_spool(dir, "req-a", frames, 4, 8, NULL);
    expect_refused(path, "req-b", 8, MM3_DTYPE_F32, "'request_id' is 'req-a', expected 'req-b'");
    expect_refused(path, "req-a1", 8, MM3_DTYPE_F32, "request_id");
    expect_refused(path, "req-a", 16, MM3_DTYPE_F32, "'width' is 8, expected 16");
    expect_refused(path, "req-a", 16, MM3_DTYPE_BF16, "width");
    expect_refused(path, "req-a", 8, MM3_DTYPE_BF16, "'dtype' is F32, expected BF16");
    size_t len;
    char *b = test_file_read(path, &len);
    char other[1200];
    snprintf(other, sizeof other, "%s/other" FRAME_SPOOL_SUFFIX, dir);
    b[0] = 'X'; /* magic */
    write_bytes(other, b, len);
    expect_refused(other, "req-a", 8, MM3_DTYPE_F32, "bad magic");
    b[0] = 'M';
    b[8] = 2; /* version */
    write_bytes(other, b, len);
    expect_refused(other, "req-a", 8, MM3_DTYPE_F32, "'version' is 2, expected 1");
    b[8] = 1;
    b[25] ^= 1; /* inside the id: the checksum gives it away */
    write_bytes(other, b, len);
    expect_refused(other, "req-a", 8, MM3_DTYPE_F32, "checksum");
    b[25] ^= 1;
    b[20] = 0; /* id length */
    write_bytes(other, b, len);
    expect_refused(other, "req-a", 8, MM3_DTYPE_F32, "request_id");
    b[20] = 5;
    for (size_t cut = 0; cut < 8 + 16 + 5 + 8; cut++) {
        write_bytes(other, b, cut);
        expect_refused(other, "req-a", 8, MM3_DTYPE_F32, "truncated header");
    }
    write_bytes(other, b, len); /* unharmed copy reads */
    int nf, torn;
    assert_int_equal(frame_spool_scan(other, "req-a", 8, MM3_DTYPE_F32, &nf, &torn), 0);
    assert_int_equal(nf, 4);
    free(b);
    free(frames);
    free(path);
    test_remove_tree(dir);
    free(dir);
}

static void test_missing_file(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("spool_missing");
    char path[1200];
    snprintf(path, sizeof path, "%s/gone" FRAME_SPOOL_SUFFIX, dir);
    int nf = -1, torn = -1;
    assert_int_equal(frame_spool_scan(path, "gone", 4, MM3_DTYPE_F32, &nf, &torn), -ENOENT);
    assert_non_null(strstr(mm3_last_error(), path));
    assert_int_equal(nf, 0);
    struct gather g = {.width = 4, .max_piece = 1};
    assert_int_equal(
        frame_spool_read(path, "gone", 4, MM3_DTYPE_F32, 3, 1, &(struct frame_spool_sink){&g, gather_emit}), -ENOENT);
    assert_int_equal(g.n, 0);
    /* no writer: every call is a no-op, a read-back says there is nothing */
    assert_int_equal(frame_spool_append(NULL, 0, 1, &nf), 0);
    assert_int_equal(frame_spool_flush(NULL), 0);
    assert_true(frame_spool_disabled(NULL));
    int got = -1;
    assert_int_equal(frame_spool_read_back(NULL, 1, &(struct frame_spool_sink){&g, gather_emit}, &got), -ENODATA);
    assert_int_equal(got, 0);
    /* a writer whose file was deleted under it: the read-back fails cleanly */
    struct frame_spool *sp;
    float *frames = random_frames(10, 4);
    char *p2 = write_spool(dir, "del", frames, 10, 4, &sp);
    unlink(p2);
    assert_int_equal(frame_spool_read_back(sp, 4, &(struct frame_spool_sink){&g, gather_emit}, &got), -ENOENT);
    assert_int_equal(g.n, 0);
    frame_spool_remove(sp); /* already gone: quiet */
    /* never overwritten; a missing folder is named */
    struct frame_spool *sp2;
    char *p3 = write_spool(dir, "dup", frames, 1, 4, NULL);
    assert_int_equal(frame_spool_open(&sp2, p3, "dup", 4, MM3_DTYPE_F32), -EEXIST);
    assert_null(sp2);
    assert_non_null(strstr(mm3_last_error(), p3));
    snprintf(path, sizeof path, "%s/no/such/dir/x" FRAME_SPOOL_SUFFIX, dir);
    assert_int_equal(frame_spool_open(&sp2, path, "x", 4, MM3_DTYPE_F32), -ENOENT);
    assert_non_null(strstr(mm3_last_error(), path));
    assert_int_equal(frame_spool_open(&sp2, path, "", 4, MM3_DTYPE_F32), -EINVAL);
    assert_int_equal(frame_spool_open(&sp2, path, "x", 0, MM3_DTYPE_F32), -EINVAL);
    free(p2);
    free(p3);
    free(frames);
    test_remove_tree(dir);
    free(dir);
}

/* A full disk (RLIMIT_FSIZE: writes past it fail with EFBIG): the failing append or
 * flush reports once, later appends are dropped, a read-back says -ENODATA (the
 * re-send teacher-forces), and the file keeps its intact prefix. */
static void test_disk_full(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("spool_full");
    const int w = 256; /* 1 KiB frames */
    float *frames = random_frames(200, w);
    struct frame_spool *sp;
    char *path = write_spool(dir, "full", frames, 50, w, &sp);
    assert_int_equal(frame_spool_flush(sp), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = (rlim_t)st.st_size + 3000; /* about 3 more frames */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int first_err = 0;
    for (int t = 50; t < 100; t++) {
        int rc = frame_spool_append(sp, t, 1, frames + (size_t)t * w);
        if (rc < 0 && !first_err) first_err = rc;
        if (rc < 0) assert_int_equal(rc, -EFBIG);
    }
    int rc = frame_spool_flush(sp);
    if (rc < 0 && !first_err) first_err = rc;
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(first_err, -EFBIG);
    assert_true(frame_spool_disabled(sp));
    assert_int_equal(frame_spool_append(sp, 100, 1, frames), 0); /* dropped quietly */
    int got = -1;
    struct gather g = {.width = w, .max_piece = 100};
    assert_int_equal(frame_spool_read_back(sp, 100, &(struct frame_spool_sink){&g, gather_emit}, &got), -ENODATA);
    assert_non_null(strstr(mm3_last_error(), "disabled"));
    assert_int_equal(g.n, 0);
    frame_spool_close(sp);
    int nf, torn;
    assert_int_equal(frame_spool_scan(path, "full", w, MM3_DTYPE_F32, &nf, &torn), 0);
    assert_true(nf >= 50 && nf < 100);
    g = (struct gather){.got = malloc(sizeof(float) * (size_t)nf * w), .width = w, .max_piece = 100};
    assert_int_equal(
        frame_spool_read(path, "full", w, MM3_DTYPE_F32, nf, 100, &(struct frame_spool_sink){&g, gather_emit}), 0);
    assert_memory_equal(g.got, frames, sizeof(float) * (size_t)nf * w);
    free(g.got);
    free(frames);
    free(path);
    test_remove_tree(dir);
    free(dir);
}

/* A gap or an overlap is a bug upstream: refused, and the writer stops. */
static void test_out_of_order(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("spool_order");
    float *frames = random_frames(10, 2);
    struct frame_spool *sp;
    char *path = write_spool(dir, "order", frames, 5, 2, &sp);
    assert_int_equal(frame_spool_append(sp, 6, 1, frames), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "expected to start at frame 5"));
    assert_true(frame_spool_disabled(sp));
    assert_int_equal(frame_spool_append(sp, 5, 1, frames), 0); /* dropped */
    assert_int_equal(frame_spool_frames(sp), 5);
    frame_spool_close(sp);
    int nf, torn;
    assert_int_equal(frame_spool_scan(path, "order", 2, MM3_DTYPE_F32, &nf, &torn), 0);
    assert_int_equal(nf, 5);
    free(frames);
    free(path);
    test_remove_tree(dir);
    free(dir);
}

/* Frame by frame as a live song (3 minutes at 25 frames/s), read back in the
 * engine's pieces of 100; a record bigger than a piece is cut into pieces. */
static void test_large_counts(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("spool_large");
    const int n = 4500, w = 16;
    float *frames = random_frames(n, w);
    char path[1200];
    snprintf(path, sizeof path, "%s/big" FRAME_SPOOL_SUFFIX, dir);
    struct frame_spool *sp;
    assert_int_equal(frame_spool_open(&sp, path, "big", w, MM3_DTYPE_F32), 0);
    for (int t = 0; t < n - 1000; t++)
        assert_int_equal(frame_spool_append(sp, t, 1, frames + (size_t)t * w), 0);
    assert_int_equal(frame_spool_append(sp, n - 1000, 1000, frames + (size_t)(n - 1000) * w), 0);
    struct gather g = {.got = calloc((size_t)n * w, sizeof(float)), .width = w, .max_piece = 100};
    int got;
    assert_int_equal(frame_spool_read_back(sp, 100, &(struct frame_spool_sink){&g, gather_emit}, &got), 0);
    assert_int_equal(got, n);
    assert_int_equal(g.pieces, n / 100);
    assert_memory_equal(g.got, frames, sizeof(float) * (size_t)n * w);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((long)st.st_size, 8 + 16 + 3 + 8 + (long)(n - 999) * 16 + (long)n * w * 4);
    frame_spool_remove(sp);
    free(g.got);
    free(frames);
    test_remove_tree(dir);
    free(dir);
}

/* ---- served end to end ---- */

static const char *k_lyrics = "[verse]\\nhello world\\n[chorus]\\nsing with me\\n";

struct served {
    char *tmp;
    char ckpt[1024];
};

static int served_ready(struct served *s)
{
    const char *g = test_golden_dir();
    char p[1200];
    snprintf(p, sizeof p, "%s/mm3-stage1", test_bin_dir());
    if (!g || access(p, X_OK) != 0) return 0;
    snprintf(s->ckpt, sizeof s->ckpt, "%s/checkpoint", g);
    s->tmp = test_make_tmpdir("spool_e2e");
    return s->tmp != NULL;
}

static int start_replica(struct test_replica *r, const struct served *s, const char *tag, int async_chunk,
                         const char *jdir)
{
    /* A held song (async_chunk false) reaches stage 1 only at its end, so stage 1's first
     * answer (its first window's progress) comes after the whole song was generated and a
     * window rendered: under ASan on 2 cores that outlasted a 60 s first-chunk wait (502 on
     * the first, unkilled song; then stage 1 was also silent until its whole render). These
     * tests are about the spool: give stage 1 300 s for the first message, 100 s for the
     * next. */
    char *yaml = test_replica_cpu_deploy(s->ckpt, async_chunk, async_chunk, jdir, 2, 2, 600, 30000, 9999);
    if (!yaml) return -1;
    /* held songs (async_chunk: false) go out raw: the spool has the raw width then */
    const char *env[] = {"MM3_STAGE0_RAW_FRAMES", async_chunk ? NULL : "1", NULL};
    int rc = test_replica_start(r, s->tmp, tag, "spool", yaml, env);
    free(yaml);
    return rc;
}

/* A replica (tag, async_chunk) journaling into <tmp>/journal (its path into jdir);
 * 0 without the tiny golden checkpoint (the test skips). */
static int served_start(struct served *s, struct test_replica *r, const char *tag, int async_chunk, char *jdir,
                        size_t jdir_size)
{
    if (!served_ready(s)) return 0;
    snprintf(jdir, jdir_size, "%s/journal", s->tmp);
    mkdir(jdir, 0755);
    /* what a stage 0 that died would have left: its spool goes at start-up (the tests
     * check at the end that no spool is left) */
    char orphan[1400];
    snprintf(orphan, sizeof orphan, "%s/1764000000-%d-1%s", jdir, test_dead_pid(), FRAME_SPOOL_SUFFIX);
    FILE *f = fopen(orphan, "w");
    assert_non_null(f);
    fputs("MM3SPOOL", f);
    fclose(f);
    assert_int_equal(start_replica(r, s, tag, async_chunk, jdir), 0);
    return 1;
}

static void song_json(char *buf, size_t cap, int seed, double seconds, int stream)
{
    snprintf(buf, cap,
             "{\"caption\":\"a bright synth pop song\",\"lyrics\":\"%s\",\"duration_s\":%g,\"seed\":%d,"
             "\"num_inference_steps\":2,\"stream\":%s,\"sample_rate\":44100}",
             k_lyrics, seconds, seed, stream ? "true" : "false");
}

/* Files of dir ending in suffix. */
static int count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    size_t sl = strlen(suffix);
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        n += l > sl && !strcmp(de->d_name + l - sl, suffix);
    }
    if (d) closedir(d);
    return n;
}

/* The spools left in dir once the server has let go of its requests: the entry (and
 * its spool) goes when stage 1's DONE is handled, which can come a little after the
 * client has the last byte (under ASan, noticeably after). */
static int spools_left(const char *dir)
{
    int n = count_files(dir, FRAME_SPOOL_SUFFIX);
    for (int i = 0; i < 100 && n; i++) {
        test_sleep_ms(100);
        n = count_files(dir, FRAME_SPOOL_SUFFIX);
    }
    return n;
}

static void delete_spools(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    size_t sl = strlen(FRAME_SPOOL_SUFFIX);
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= sl || strcmp(de->d_name + l - sl, FRAME_SPOOL_SUFFIX)) continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    if (d) closedir(d);
}

static void delete_spools_on_kill(void *dir)
{
    delete_spools((const char *)dir);
}

/* Print the log lines holding needle (what the re-sends said). */
static void log_print(const struct test_replica *r, const char *needle)
{
    char *s = test_replica_log(r);
    for (char *l = s; l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = '\0';
        if (strstr(l, needle)) printf("%s\n", l);
        l = nl ? nl + 1 : NULL;
    }
    free(s);
}

static int post_collect(const struct test_replica *r, const char *json, struct test_collect *c)
{
    struct http_client_response resp;
    int rc = test_replica_post_stream(r, json, 600000, test_collect_body, c, &resp);
    int ok = rc == 0 && resp.status == 200 && resp.complete;
    if (!ok) {
        fprintf(stderr, "request: rc %d status %d\n", rc, resp.status);
        log_print(r, "job "); /* why the song failed */
        log_print(r, "shmconn");
    }
    http_client_response_free(&resp);
    return ok ? 0 : -1;
}

/* The launcher restarts a killed stage 1; wait for the new one. */
static void wait_stage1_restart(const struct test_replica *r, pid_t old)
{
    for (int i = 0; i < 600 && test_replica_pid(r, "stage1.pid") == old; i++)
        test_sleep_ms(100);
    assert_true(test_replica_pid(r, "stage1.pid") != old);
}

/* Number of times needle occurs in the replica's log. */
static int log_count(const struct test_replica *r, const char *needle)
{
    char *s = test_replica_log(r);
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, needle)); p++)
        n++;
    free(s);
    return n;
}

static double metric(const struct test_replica *r, const char *name)
{
    char url[256];
    snprintf(url, sizeof url, "%s/metrics", r->url);
    struct http_client_response resp;
    double v = -1;
    if (http_client_request(&(struct http_client_request){.url = url, .method = "GET", .timeout_ms = 10000}, &resp) ==
            0 &&
        resp.body) {
        size_t n = strlen(name);
        for (const char *l = resp.body; l && *l;) {
            if (!strncmp(l, name, n) && l[n] == ' ') {
                v = atof(l + n + 1);
                break;
            }
            const char *nl = strchr(l, '\n');
            l = nl ? nl + 1 : NULL;
        }
    }
    http_client_response_free(&resp);
    return v;
}

struct killer {
    const struct test_replica *r;
    pid_t s1;
    int done;
};

/* Kill stage 1 once the song is generating (its rows taken), so that it is held
 * while generation goes on: its frames go to the spool only. */
static void *kill_when_running(void *arg)
{
    struct killer *k = arg;
    for (int i = 0; i < 2000 && metric(k->r, "mm3_active_rows") <= 0; i++)
        test_sleep_ms(5);
    test_sleep_ms(50);
    kill(k->s1, SIGKILL);
    k->done = 1;
    return NULL;
}

/* Kill stage 1 once the song has been generated (its rows taken, then freed): its END
 * has gone to stage 1, which is still rendering the last windows. (Killing when half
 * the audio had arrived raced with generation: under ASan stage 0 once had 393 of 400
 * frames when stage 1 came back.) metric() is -1 when /metrics does not answer: only
 * 0 counts as freed. */
static void *kill_when_generated(void *arg)
{
    struct killer *k = arg;
    for (int i = 0; i < 2000 && metric(k->r, "mm3_active_rows") <= 0; i++)
        test_sleep_ms(5);
    for (int i = 0; i < 60000 && metric(k->r, "mm3_active_rows") != 0; i++)
        test_sleep_ms(5);
    kill(k->s1, SIGKILL);
    k->done = 1;
    return NULL;
}

/* Whether the log line holding needle also holds what. */
static int log_line_has(const struct test_replica *r, const char *needle, const char *what)
{
    char *s = test_replica_log(r);
    char *at = s ? strstr(s, needle) : NULL, *nl = at ? strchr(at, '\n') : NULL;
    if (nl) *nl = '\0';
    int has = at && strstr(at, what);
    free(s);
    return has;
}

/* Streamed (async_chunk), three kills -9 of stage 1 mid-song, each song the
 * uninterrupted one byte for byte:
 *   0. while the song is generated (frames sent live, then spooled only while it
 *      is held): the re-send reads the spool back, live frames continue;
 *   1. once the song is generated (END delivered), while stage 1 renders its last
 *      windows: the re-send reads the spool back and ends the song again;
 *   2. after the first audio, the spool deleted right after the kill: teacher
 *      forcing from the journal (bit-identical on the CPU path too).
 * No spool is left behind. */
static void test_served_stage1_killed(void **state)
{
    (void)state;
    struct served s;
    struct test_replica r;
    char jdir[1200], json[1024];
    if (!served_start(&s, &r, "a", 1, jdir, sizeof jdir)) skip();
    song_json(json, sizeof json, 31, 16, 1);
    struct test_collect whole = {0};
    assert_int_equal(post_collect(&r, json, &whole), 0);
    assert_true(whole.len > 44 + 4 * 44100);
    assert_int_equal(spools_left(jdir), 0); /* removed once delivered */
    for (int c = 0; c < 3; c++) {
        pid_t s1 = test_replica_pid(&r, "stage1.pid");
        assert_true(s1 > 0);
        struct test_collect cut = {0};
        struct killer k = {&r, s1, 0};
        pthread_t t;
        if (c < 2)
            assert_int_equal(pthread_create(&t, NULL, c == 0 ? kill_when_running : kill_when_generated, &k), 0);
        else
            cut = (struct test_collect){
                .kill_pid = s1, .kill_after = 44 + 4096, .on_kill = delete_spools_on_kill, .on_kill_ctx = jdir};
        int rc = post_collect(&r, json, &cut);
        if (c < 2) pthread_join(t, NULL);
        assert_int_equal(rc, 0);
        assert_true(c < 2 ? k.done : cut.kill_pid == 0); /* it was killed mid-song */
        assert_int_equal(cut.len, whole.len);
        assert_memory_equal(cut.buf, whole.buf, whole.len);
        assert_int_equal(log_count(&r, "from the frame spool"), c < 1 ? 1 : 2);
        assert_int_equal(log_count(&r, "journaled frames (teacher forcing)"), c == 2);
        assert_int_equal(log_count(&r, "re-sending by teacher forcing from the journal"), c == 2);
        free(cut.buf);
        wait_stage1_restart(&r, s1);
    }
    log_print(&r, "stage 1 is back");
    assert_true(log_line_has(&r, "job 3: stage 1 is back", "from the frame spool"));
    assert_true(log_line_has(&r, "job 3: stage 1 is back", "and the end"));
    assert_true(test_replica_log_contains(&r, "No such file or directory: re-sending by teacher forcing"));
    assert_true(test_replica_log_contains(&r, "its writer (pid")); /* the start-up sweep */
    assert_int_equal(spools_left(jdir), 0);
    assert_int_equal(count_files(jdir, JOURNAL_SUFFIX), 4);
    free(whole.buf);
    assert_int_equal(test_replica_stop(&r), 0);
    test_remove_tree(s.tmp);
    free(s.tmp);
}

/* Held songs (async_chunk: false, raw frames): stage 1 killed while the song is
 * generated; the frames made meanwhile go to the spool only, and the re-send holds
 * them from the spool and ends the song: the same WAV byte for byte. */
static void test_served_held_song(void **state)
{
    (void)state;
    struct served s;
    struct test_replica r;
    char jdir[1200], json[1024];
    if (!served_start(&s, &r, "b", 0, jdir, sizeof jdir)) skip();
    song_json(json, sizeof json, 32, 16, 0);
    struct test_collect whole = {0}, cut = {0};
    assert_int_equal(post_collect(&r, json, &whole), 0);
    assert_true(whole.len > 44 + 4 * 44100);
    struct killer k = {&r, test_replica_pid(&r, "stage1.pid"), 0};
    assert_true(k.s1 > 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, kill_when_running, &k), 0);
    int rc = post_collect(&r, json, &cut);
    pthread_join(t, NULL);
    assert_int_equal(rc, 0);
    assert_true(k.done);
    assert_true(test_replica_log_contains(&r, "journaled, waiting up to"));
    log_print(&r, "stage 1 is back");
    assert_int_equal(log_count(&r, "from the frame spool"), 1);
    assert_int_equal(log_count(&r, "teacher forcing"), 0);
    assert_int_equal(cut.len, whole.len);
    assert_memory_equal(cut.buf, whole.buf, whole.len);
    assert_int_equal(spools_left(jdir), 0);
    free(whole.buf);
    free(cut.buf);
    wait_stage1_restart(&r, k.s1);
    assert_int_equal(test_replica_stop(&r), 0);
    test_remove_tree(s.tmp);
    free(s.tmp);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path_for),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncated_tail),
        cmocka_unit_test(test_wrong_header),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_large_counts),
        cmocka_unit_test(test_served_stage1_killed),
        cmocka_unit_test(test_served_held_song),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
