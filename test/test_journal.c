/* The request journal (stage0/recovery/journal.h): round trip of every field, a torn tail at
 * every byte, corrupt and truncated files (clear errors, no crash), unwritable folder
 * and a full disk (the writer disables itself), the unfinished list, reopening, the
 * size per frame, completion of an interrupted song from its journal, and
 * mm3-rerender against the direct mm3-stage0 + mm3-stage1 path. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* cmocka needs the headers above */
#include <cmocka.h>

#include "common/ckpt_gen.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "common/sampler.h"
#include "stage0/generate.h"
#include "stage0/model/talker_lora.h"
#include "stage0/recovery/frame_spool.h"
#include "stage0/recovery/journal.h"
#include "stage0/recovery/journal_sweep.h"
#include "stage0/teacher_force.h"
#include "stage0/text/generate_prompt.h"
#include "support/test_stage0.h"
#include "support/test_support.h"

#define NCB 8

static uint64_t rng = 88172645463325252ull;

static uint32_t next_rand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static int32_t *random_codes(int n_steps)
{
    int32_t *c = malloc(sizeof(int32_t) * (size_t)n_steps * NCB);
    for (int i = 0; i < n_steps * NCB; i++)
        c[i] = (int32_t)(next_rand() % (i % NCB == 0 ? SAMPLER_N_CODES : 1024));
    return c;
}

static uint8_t *slurp(const char *path, size_t *n);

static struct mm3_job_params test_params(void)
{
    struct mm3_job_params p = {
        .lyrics = "[verse]\nla la \xc3\xa9t\xc3\xa9\n\"quoted\" \\ back",
        .caption = "a bright synth pop song",
        .max_frames = 1234,
        .min_frames = 600,
        .seed = 18446744073709551557ull, /* above INT64_MAX: must survive JSON */
        .sample_rate = 32000,
        .num_inference_steps = 7,
        .guidance_scale = 1.7f,
        .flow_shift = 2.3f, /* not a short binary fraction: read back bit for bit */
        .cfg_scale = 1.3f,
        .format = MM3_AUDIO_FLAC,
        .stream = true,
    };
    return p;
}

static const int32_t k_ids[2][3] = {{1, 2, 3}, {1, 151654, 3}};

static char *write_journal(const char *dir, const char *id, const int32_t *codes, int n_steps, enum journal_status st,
                           enum journal_stop stop)
{
    struct mm3_job_params p = test_params();
    struct journal *j;
    assert_int_equal(journal_open_write(&j, dir, id, &p, NCB, 1024, &k_ids[0][0], 3), 0);
    /* in uneven pieces, as a scheduler appends */
    for (int s = 0; s < n_steps;) {
        int k = 1 + s % 4;
        if (k > n_steps - s) k = n_steps - s;
        assert_int_equal(journal_append_codes(j, codes + (size_t)s * NCB, k), 0);
        s += k;
    }
    assert_int_equal(journal_steps(j), n_steps);
    char *path = strdup(journal_path(j));
    assert_int_equal(journal_close(j, st, stop, n_steps - 1), 0);
    return path;
}

/* Every response format survives the journal (a re-sent song keeps its container). */
static void test_format_round_trip(void **state)
{
    char *dir = test_make_tmpdir("journal_fmt");
    const enum mm3_audio_format fmts[] = {MM3_AUDIO_WAV, MM3_AUDIO_PCM, MM3_AUDIO_FLAC, MM3_AUDIO_MP3, MM3_AUDIO_OPUS};
    for (int k = 0; k < 5; k++) {
        struct mm3_job_params p = test_params();
        p.format = fmts[k];
        char id[16];
        snprintf(id, sizeof id, "fmt-%d", k);
        struct journal *j;
        assert_int_equal(journal_open_write(&j, dir, id, &p, NCB, 1024, &k_ids[0][0], 3), 0);
        char *path = strdup(journal_path(j));
        assert_int_equal(journal_close(j, JOURNAL_DONE, JOURNAL_STOP_TOKEN, 0), 0);
        struct journal_record r;
        assert_int_equal(journal_read(path, &r), 0);
        assert_int_equal(r.h.params.format, fmts[k]);
        journal_record_free(&r);
        free(path);
    }
    test_remove_tree(dir);
    free(dir);
}

/* A song's per-request adapter travels in the header (version 2, which a reader must
 * honour); a song without one is written as version 1, as before adapters existed. */
static void test_lora_round_trip(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_lora");
    for (int k = 0; k < 2; k++) {
        struct mm3_job_params p = test_params();
        if (k) snprintf(p.lora, sizeof p.lora, "rock.v2");
        char id[16];
        snprintf(id, sizeof id, "lora-%d", k);
        struct journal *j;
        assert_int_equal(journal_open_write(&j, dir, id, &p, NCB, 1024, &k_ids[0][0], 3), 0);
        char *path = strdup(journal_path(j));
        assert_int_equal(journal_close(j, JOURNAL_DONE, JOURNAL_STOP_TOKEN, 0), 0);
        size_t n;
        uint8_t *b = slurp(path, &n);
        assert_int_equal(b[8], k ? JOURNAL_VERSION : JOURNAL_VERSION_NO_LORA);
        free(b);
        struct journal_record r;
        assert_int_equal(journal_read(path, &r), 0);
        assert_string_equal(r.h.params.lora, k ? "rock.v2" : "");
        journal_record_free(&r);
        free(path);
    }
    test_remove_tree(dir);
    free(dir);
}

/* An uploaded journal is read from memory with a cap on its steps: within the cap it
 * reads as the file does; past it, only a prefix within the cap (torn), so a small file
 * cannot inflate into a large allocation; garbage is -EINVAL naming the upload. */
static void test_read_buffer_capped(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_buf");
    int32_t *codes = random_codes(300);
    char *path = write_journal(dir, "req-buf", codes, 300, JOURNAL_DONE, JOURNAL_STOP_BUDGET);
    size_t n;
    uint8_t *b = (uint8_t *)test_file_read(path, &n);
    assert_non_null(b);
    struct journal_record whole, r;
    assert_int_equal(journal_read(path, &whole), 0);
    assert_int_equal(journal_read_buffer("upload", b, n, 301, &r), 0);
    assert_int_equal(r.n_steps, 300);
    assert_false(r.torn);
    assert_int_equal(r.status, JOURNAL_DONE);
    assert_string_equal(r.h.params.caption, whole.h.params.caption);
    assert_memory_equal(r.codes, whole.codes, sizeof(int32_t) * 300 * NCB);
    journal_record_free(&r);
    assert_int_equal(journal_read_buffer("upload", b, n, 120, &r), 0);
    assert_true(r.torn);
    assert_true(r.n_steps <= 120 && r.n_steps > 0);
    assert_memory_equal(r.codes, whole.codes, sizeof(int32_t) * (size_t)r.n_steps * NCB);
    journal_record_free(&r);
    static const uint8_t junk[] = "not a journal at all, just some bytes";
    assert_int_equal(journal_read_buffer("upload", junk, sizeof junk, 301, &r), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "upload"));
    journal_record_free(&whole);
    free(b);
    free(codes);
    free(path);
    test_remove_tree(dir);
    free(dir);
}

static void test_round_trip(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_rt");
    int32_t *codes = random_codes(60);
    char *path = write_journal(dir, "req-1", codes, 60, JOURNAL_DONE, JOURNAL_STOP_TOKEN);
    struct journal_record r;
    assert_int_equal(journal_read(path, &r), 0);
    struct mm3_job_params p = test_params();
    assert_string_equal(r.h.request_id, "req-1");
    assert_string_equal(r.h.params.caption, p.caption);
    assert_string_equal(r.h.params.lyrics, p.lyrics);
    assert_true(r.h.params.seed == p.seed);
    assert_int_equal(r.h.params.max_frames, p.max_frames);
    assert_int_equal(r.h.params.min_frames, 600);
    assert_int_equal(r.h.params.sample_rate, 32000);
    assert_int_equal(r.h.params.num_inference_steps, 7);
    assert_true(r.h.params.guidance_scale == p.guidance_scale);
    assert_true(r.h.params.flow_shift == p.flow_shift);
    assert_true(r.h.params.cfg_scale == p.cfg_scale);
    assert_int_equal(r.h.params.format, MM3_AUDIO_FLAC);
    assert_true(r.h.params.stream);
    assert_int_equal(r.h.n_codebooks, NCB);
    assert_int_equal(r.h.prompt_len, 3);
    assert_true(r.h.prompt_hash == journal_prompt_hash(&k_ids[0][0], 3));
    assert_true(r.h.prompt_hash != journal_prompt_hash(&k_ids[1][0], 1));
    assert_int_equal(r.n_steps, 60);
    assert_memory_equal(r.codes, codes, sizeof(int32_t) * 60 * NCB);
    assert_int_equal(r.status, JOURNAL_DONE);
    assert_int_equal(r.stop, JOURNAL_STOP_TOKEN);
    assert_int_equal(r.n_frames, 59);
    assert_int_equal(r.torn, 0);
    journal_record_free(&r);
    /* the same id again: refused, the first journal is kept */
    struct journal *j;
    assert_int_equal(journal_open_write(&j, dir, "req-1", &p, NCB, 1024, &k_ids[0][0], 3), -EEXIST);
    assert_null(j);
    assert_non_null(strstr(mm3_last_error(), "req-1.mm3j"));
    assert_int_equal(journal_read(path, &r), 0);
    assert_int_equal(r.n_steps, 60);
    journal_record_free(&r);
    /* ids that could escape the folder are refused */
    assert_int_equal(journal_open_write(&j, dir, "../x", &p, NCB, 1024, &k_ids[0][0], 3), -EINVAL);
    assert_int_equal(journal_open_write(&j, dir, "", &p, NCB, 1024, &k_ids[0][0], 3), -EINVAL);
    char id[JOURNAL_ID_MAX];
    journal_make_id(id, 42);
    assert_int_equal(journal_open_write(&j, dir, id, &p, NCB, 1024, &k_ids[0][0], 3), 0);
    assert_int_equal(journal_close(j, JOURNAL_CANCELLED, JOURNAL_STOP_NONE, 0), 0);
    /* a code out of range is a bug upstream: refused, the journal disabled, not a crash */
    assert_int_equal(journal_open_write(&j, dir, "range", &p, NCB, 1024, &k_ids[0][0], 3), 0);
    int32_t bad[NCB] = {0, 1, 2, 1024};
    assert_int_equal(journal_append_codes(j, codes, 2), 0);
    assert_int_equal(journal_append_codes(j, bad, 1), -EINVAL);
    assert_true(journal_disabled(j));
    assert_int_equal(journal_close(j, JOURNAL_DONE, JOURNAL_STOP_TOKEN, 1), 0);
    free(path);
    free(codes);
    test_remove_tree(dir);
    free(dir);
}

static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spill(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* A crash can leave any prefix of the file: every cut reads back as a prefix of the
 * codes at a flush boundary, never an error once the header is whole. */
static void test_torn_tail(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_torn");
    int32_t *codes = random_codes(60);
    char *path = write_journal(dir, "torn", codes, 60, JOURNAL_DONE, JOURNAL_STOP_BUDGET);
    size_t n;
    uint8_t *b = slurp(path, &n);
    char cut[4096];
    snprintf(cut, sizeof cut, "%s/cut.mm3j", dir);
    int prev = 0, header_ok_at = -1, saw[4] = {0};
    for (size_t len = 0; len <= n; len++) {
        spill(cut, b, len);
        struct journal_record r;
        int rc = journal_read(cut, &r);
        if (rc < 0) {
            assert_int_equal(header_ok_at, -1); /* once readable, always readable */
            assert_true(strstr(mm3_last_error(), "cut.mm3j") != NULL);
            continue;
        }
        if (header_ok_at < 0) header_ok_at = (int)len;
        assert_true(r.n_steps >= prev);
        assert_true(r.n_steps == 0 || r.n_steps == 25 || r.n_steps == 50 || r.n_steps == 60);
        saw[r.n_steps == 0 ? 0 : r.n_steps / 25]++;
        if (r.n_steps) assert_memory_equal(r.codes, codes, sizeof(int32_t) * r.n_steps * NCB);
        assert_int_equal(r.status, len == n ? JOURNAL_DONE : JOURNAL_OPEN);
        assert_int_equal(r.n_frames, len == n ? 59 : r.n_steps > 0 ? r.n_steps - 1 : 0);
        assert_int_equal(r.torn, r.valid_bytes != (int64_t)len);
        assert_true(r.valid_bytes <= (int64_t)len);
        prev = r.n_steps;
        journal_record_free(&r);
    }
    assert_true(header_ok_at > 16);
    assert_true(saw[0] && saw[1] && saw[2]);
    free(b);
    free(path);
    free(codes);
    test_remove_tree(dir);
    free(dir);
}

static void test_corrupt(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_corrupt");
    int32_t *codes = random_codes(60);
    char *path = write_journal(dir, "c", codes, 60, JOURNAL_DONE, JOURNAL_STOP_TOKEN);
    size_t n;
    uint8_t *b = slurp(path, &n);
    char bad[4096];
    snprintf(bad, sizeof bad, "%s/bad.mm3j", dir);
    struct journal_record r;
    /* header byte flipped: a clear error */
    b[40] ^= 0x20;
    spill(bad, b, n);
    assert_int_equal(journal_read(bad, &r), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "checksum"));
    b[40] ^= 0x20;
    /* magic, version */
    b[0] = 'X';
    spill(bad, b, n);
    assert_int_equal(journal_read(bad, &r), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "magic"));
    b[0] = 'M';
    b[8] = 9;
    spill(bad, b, n);
    assert_int_equal(journal_read(bad, &r), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "version"));
    b[8] = JOURNAL_VERSION_NO_LORA;
    /* a byte of every position after the header flipped in turn: a prefix survives */
    assert_int_equal(journal_read(path, &r), 0);
    journal_record_free(&r);
    size_t hdr = 16 + (b[12] | b[13] << 8 | b[14] << 16 | (size_t)b[15] << 24) + 8;
    for (size_t at = hdr; at < n; at++) {
        b[at] ^= 0x5a;
        spill(bad, b, n);
        assert_int_equal(journal_read(bad, &r), 0);
        assert_int_equal(r.torn, 1);
        assert_true(r.n_steps <= 60);
        if (r.n_steps) assert_memory_equal(r.codes, codes, sizeof(int32_t) * r.n_steps * NCB);
        assert_int_equal(r.status, JOURNAL_OPEN);
        journal_record_free(&r);
        b[at] ^= 0x5a;
    }
    /* empty, missing, garbage */
    spill(bad, b, 0);
    assert_int_equal(journal_read(bad, &r), -EINVAL);
    assert_true(journal_read("/nonexistent/j.mm3j", &r) < 0);
    assert_non_null(strstr(mm3_last_error(), "/nonexistent/j.mm3j"));
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)next_rand();
    spill(bad, b, n);
    assert_int_equal(journal_read(bad, &r), -EINVAL);
    free(b);
    free(path);
    free(codes);
    test_remove_tree(dir);
    free(dir);
}

static void test_unwritable(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_unwritable");
    char file[4096], sub[4200];
    snprintf(file, sizeof file, "%s/plain-file", dir);
    spill(file, (const uint8_t *)"x", 1);
    snprintf(sub, sizeof sub, "%s/journal", file); /* a folder inside a file: never writable, even for root */
    struct mm3_job_params p = test_params();
    struct journal *j = (struct journal *)&p;
    assert_true(journal_open_write(&j, sub, "r", &p, NCB, 1024, &k_ids[0][0], 3) < 0);
    assert_null(j);
    assert_non_null(strstr(mm3_last_error(), sub));
    assert_non_null(strstr(mm3_last_error(), "journal_dir"));
    assert_true(journal_open_write(&j, "/nonexistent-journal-dir", "r", &p, NCB, 1024, &k_ids[0][0], 3) < 0);
    assert_true(journal_open_write(&j, "", "r", &p, NCB, 1024, &k_ids[0][0], 3) < 0);
    /* the request goes on with a NULL writer */
    int32_t c[NCB] = {0};
    assert_int_equal(journal_append_codes(NULL, c, 1), 0);
    assert_int_equal(journal_close(NULL, JOURNAL_DONE, JOURNAL_STOP_TOKEN, 0), 0);
    assert_true(journal_disabled(NULL));
    test_remove_tree(dir);
    free(dir);
}

/* A full disk (simulated with RLIMIT_FSIZE: writes past it fail with EFBIG): the
 * first failing flush reports once, later appends are silently dropped, and the file
 * still reads back as its intact prefix. */
static void test_disk_full(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_full");
    int32_t *codes = random_codes(200);
    struct mm3_job_params p = test_params();
    struct journal *j;
    assert_int_equal(journal_open_write(&j, dir, "full", &p, NCB, 1024, &k_ids[0][0], 3), 0);
    assert_int_equal(journal_append_codes(j, codes, 50), 0);
    struct stat st;
    assert_int_equal(stat(journal_path(j), &st), 0);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = (rlim_t)st.st_size + 40; /* room for part of one more block */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = journal_append_codes(j, codes + 50 * NCB, 25);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_int_equal(rc, -EFBIG);
    assert_non_null(strstr(mm3_last_error(), "journaling disabled"));
    assert_true(journal_disabled(j));
    assert_int_equal(journal_append_codes(j, codes + 75 * NCB, 100), 0); /* dropped quietly */
    char *path = strdup(journal_path(j));
    assert_int_equal(journal_close(j, JOURNAL_DONE, JOURNAL_STOP_TOKEN, 174), 0);
    struct journal_record r;
    assert_int_equal(journal_read(path, &r), 0);
    assert_int_equal(r.n_steps, 50);
    assert_memory_equal(r.codes, codes, sizeof(int32_t) * 50 * NCB);
    assert_int_equal(r.status, JOURNAL_OPEN); /* no end record made it: completion would redo it */
    journal_record_free(&r);
    free(path);
    free(codes);
    test_remove_tree(dir);
    free(dir);
}

static void test_list_and_reopen(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_list");
    int32_t *codes = random_codes(90);
    free(write_journal(dir, "a-done", codes, 30, JOURNAL_DONE, JOURNAL_STOP_TOKEN));
    free(write_journal(dir, "b-cancelled", codes, 30, JOURNAL_CANCELLED, JOURNAL_STOP_NONE));
    free(write_journal(dir, "c-failed", codes, 30, JOURNAL_FAILED, JOURNAL_STOP_NONE));
    char *open_path = write_journal(dir, "d-open", codes, 60, JOURNAL_OPEN, JOURNAL_STOP_NONE);
    char *intr_path = write_journal(dir, "e-interrupted", codes, 40, JOURNAL_INTERRUPTED, JOURNAL_STOP_BUDGET);
    char junk[4096];
    snprintf(junk, sizeof junk, "%s/f-junk.mm3j", dir);
    spill(junk, (const uint8_t *)"not a journal", 13);
    snprintf(junk, sizeof junk, "%s/notes.txt", dir);
    spill(junk, (const uint8_t *)"x", 1);
    char **paths;
    int n;
    assert_int_equal(journal_list_unfinished(dir, &paths, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(paths[0], open_path);
    assert_string_equal(paths[1], intr_path);
    journal_list_free(paths, n);
    assert_true(journal_list_unfinished("/nonexistent-journal-dir", &paths, &n) < 0);

    /* a journal cut inside its header is skipped (with a warning), not fatal */
    assert_int_equal(truncate(open_path, 10), 0);
    /* tear a journal, reopen it: the torn bytes are cut, codes continue */
    free(write_journal(dir, "g-torn", codes, 60, JOURNAL_OPEN, JOURNAL_STOP_NONE));
    char torn[4096];
    snprintf(torn, sizeof torn, "%s/g-torn.mm3j", dir);
    struct stat st;
    assert_int_equal(stat(torn, &st), 0);
    assert_int_equal(truncate(torn, st.st_size - 3), 0); /* the 50..59 block is torn */
    struct journal *j;
    struct journal_record r;
    assert_int_equal(journal_open_append(&j, torn, &r), 0);
    assert_int_equal(r.n_steps, 50);
    assert_int_equal(r.torn, 1);
    journal_record_free(&r);
    assert_int_equal(journal_append_codes(j, codes + 50 * NCB, 40), 0);
    assert_int_equal(journal_close(j, JOURNAL_DONE, JOURNAL_STOP_TOKEN, 89), 0);
    assert_int_equal(journal_read(torn, &r), 0);
    assert_int_equal(r.n_steps, 90);
    assert_int_equal(r.torn, 0);
    assert_memory_equal(r.codes, codes, sizeof(int32_t) * 90 * NCB);
    assert_int_equal(r.status, JOURNAL_DONE);
    assert_int_equal(r.n_frames, 89);
    journal_record_free(&r);

    /* an interrupted one reopened is open until closed again */
    assert_int_equal(journal_open_append(&j, intr_path, &r), 0);
    assert_int_equal(r.status, JOURNAL_INTERRUPTED);
    journal_record_free(&r);
    assert_int_equal(journal_append_codes(j, codes + 40 * NCB, 5), 0);
    assert_int_equal(journal_flush(j), 0);
    assert_int_equal(journal_read(intr_path, &r), 0);
    assert_int_equal(r.status, JOURNAL_OPEN);
    assert_int_equal(r.n_steps, 45);
    journal_record_free(&r);
    assert_int_equal(journal_close(j, JOURNAL_DONE, JOURNAL_STOP_BUDGET, 44), 0);
    assert_int_equal(journal_read(intr_path, &r), 0);
    assert_int_equal(r.status, JOURNAL_DONE);
    assert_memory_equal(r.codes, codes, sizeof(int32_t) * 45 * NCB);
    journal_record_free(&r);
    assert_int_equal(journal_list_unfinished(dir, &paths, &n), 0);
    assert_int_equal(n, 0); /* everything closed; d-open is unreadable now */
    journal_list_free(paths, n);

    free(open_path);
    free(intr_path);
    free(codes);
    test_remove_tree(dir);
    free(dir);
}

static void touch_spool(const char *dir, const char *id)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s%s", dir, id, FRAME_SPOOL_SUFFIX);
    spill(p, (const uint8_t *)"MM3SPOOL", 8);
}

static int spool_exists(const char *dir, const char *id)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s%s", dir, id, FRAME_SPOOL_SUFFIX);
    return access(p, F_OK) == 0;
}

static void test_id_parse(void **state)
{
    (void)state;
    char id[JOURNAL_ID_MAX];
    journal_make_id(id, 42);
    long long t = 0;
    assert_int_equal(journal_id_parse(id, &t), (int)getpid());
    assert_true(t > 1700000000LL);
    assert_int_equal(journal_id_parse("1764000000-123-7", &t), 123);
    assert_true(t == 1764000000LL);
    const char *bad[] = {"",       "req-1",    "a-done",   "12-34",  "12--7",
                         "12-0-7", "x12-34-7", "12-34-7x", "12-34-", "12-99999999999-7"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(journal_id_parse(bad[i], NULL), -1);
}

/* What a stage 0 that died leaves (journals with no end record, spools) is closed
 * "interrupted" / removed at the next start, also under this process's pid when made
 * before it started (a restarted container); a live writer's files (this process's),
 * finished journals, foreign names and other files are left as they were, and a
 * second sweep finds nothing. */
static void test_sweep_orphans(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_sweep");
    int32_t *codes = random_codes(60);
    char dead_open[JOURNAL_ID_MAX], dead_done[JOURNAL_ID_MAX], dead_torn[JOURNAL_ID_MAX], live_open[JOURNAL_ID_MAX],
        stray[JOURNAL_ID_MAX], own_old[JOURNAL_ID_MAX];
    const long long started = (long long)time(NULL);
    snprintf(own_old, sizeof own_old, "%lld-%d-4", started - 60, (int)getpid()); /* a predecessor with our pid */
    const int pid = test_dead_pid();
    snprintf(dead_open, sizeof dead_open, "1764000000-%d-1", pid);
    snprintf(dead_done, sizeof dead_done, "1764000000-%d-2", pid);
    snprintf(dead_torn, sizeof dead_torn, "1764000000-%d-3", pid);
    snprintf(stray, sizeof stray, "1764000000-%d-9", pid);
    journal_make_id(live_open, 5);
    char *p_open = write_journal(dir, dead_open, codes, 40, JOURNAL_OPEN, JOURNAL_STOP_NONE);
    char *p_done = write_journal(dir, dead_done, codes, 30, JOURNAL_DONE, JOURNAL_STOP_TOKEN);
    char *p_torn = write_journal(dir, dead_torn, codes, 60, JOURNAL_OPEN, JOURNAL_STOP_NONE);
    char *p_live = write_journal(dir, live_open, codes, 20, JOURNAL_OPEN, JOURNAL_STOP_NONE);
    char *p_own_old = write_journal(dir, own_old, codes, 12, JOURNAL_OPEN, JOURNAL_STOP_NONE);
    free(write_journal(dir, "d-open", codes, 10, JOURNAL_OPEN, JOURNAL_STOP_NONE)); /* not a request id */
    struct stat st;
    assert_int_equal(stat(p_torn, &st), 0);
    assert_int_equal(truncate(p_torn, st.st_size - 3), 0); /* its last block (50..59) torn by the crash */
    touch_spool(dir, dead_open);
    touch_spool(dir, stray); /* a spool whose journal is gone */
    touch_spool(dir, live_open);
    size_t n_done;
    uint8_t *done_before = slurp(p_done, &n_done);
    assert_int_equal(journal_ended(p_done), 1);
    assert_int_equal(journal_ended(p_open), 0);
    assert_true(journal_ended("/nonexistent-journal-dir/x.mm3j") < 0);

    struct journal_sweep_result res;
    assert_int_equal(journal_sweep_orphans(dir, started, &res), 0);
    assert_int_equal(res.closed, 3);
    assert_int_equal(res.spools_removed, 2);
    assert_int_equal(res.live, 2); /* this process's journal and spool */
    struct journal_record r;
    assert_int_equal(journal_read(p_open, &r), 0);
    assert_int_equal(r.status, JOURNAL_INTERRUPTED);
    assert_int_equal(r.stop, JOURNAL_STOP_NONE);
    assert_int_equal(r.n_steps, 40);
    assert_int_equal(r.n_frames, 39);
    assert_memory_equal(r.codes, codes, sizeof(int32_t) * 40 * NCB);
    journal_record_free(&r);
    assert_int_equal(journal_read(p_torn, &r), 0);
    assert_int_equal(r.status, JOURNAL_INTERRUPTED);
    assert_int_equal(r.n_steps, 50); /* the intact prefix */
    assert_int_equal(r.torn, 0);
    journal_record_free(&r);
    assert_int_equal(journal_read(p_live, &r), 0);
    assert_int_equal(r.status, JOURNAL_OPEN);
    journal_record_free(&r);
    assert_int_equal(journal_read(p_own_old, &r), 0);
    assert_int_equal(r.status, JOURNAL_INTERRUPTED);
    assert_int_equal(r.n_steps, 12);
    journal_record_free(&r);
    size_t n_after;
    uint8_t *done_after = slurp(p_done, &n_after);
    assert_int_equal(n_after, n_done);
    assert_memory_equal(done_after, done_before, n_done);
    assert_false(spool_exists(dir, dead_open));
    assert_false(spool_exists(dir, stray));
    assert_true(spool_exists(dir, live_open));
    char **paths;
    int n;
    assert_int_equal(journal_list_unfinished(dir, &paths, &n), 0);
    assert_int_equal(n, 5); /* the three interrupted, the live one, d-open */
    journal_list_free(paths, n);

    assert_int_equal(journal_sweep_orphans(dir, started, &res), 0);
    assert_int_equal(res.closed, 0);
    assert_int_equal(res.spools_removed, 0);
    assert_true(journal_sweep_orphans("/nonexistent-journal-dir", started, &res) < 0);

    free(done_before), free(done_after);
    free(p_open), free(p_done), free(p_torn), free(p_live), free(p_own_old), free(codes);
    test_remove_tree(dir);
    free(dir);
}

/* Journals and spools are the songs' captions, lyrics and frames: 0600 in a 0700
 * folder whatever the umask; an existing folder's mode is never loosened. */
static void test_permissions(void **state)
{
    (void)state;
    mode_t old_mask = umask(022);
    char *tmp = test_make_tmpdir("journal_perm");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/journals", tmp);
    assert_int_equal(journal_dir_prepare(dir), 0);
    struct stat st;
    assert_int_equal(lstat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0700);
    int32_t *codes = random_codes(4);
    char *path = write_journal(dir, "1764000000-1-1", codes, 4, JOURNAL_DONE, JOURNAL_STOP_TOKEN);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    char spool[1200];
    snprintf(spool, sizeof spool, "%s/1764000000-1-1" FRAME_SPOOL_SUFFIX, dir);
    struct frame_spool *sp;
    assert_int_equal(frame_spool_open(&sp, spool, "1764000000-1-1", 4, MM3_DTYPE_F32), 0);
    frame_spool_close(sp);
    assert_int_equal(stat(spool, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    /* an existing folder keeps its mode (0750 stays 0750, 0700 stays 0700) */
    assert_int_equal(chmod(dir, 0750), 0);
    assert_int_equal(journal_dir_prepare(dir), 0);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0750);
    assert_true(journal_dir_prepare(path) < 0); /* a file, not a folder */
    assert_non_null(strstr(mm3_last_error(), path));
    free(path);
    free(codes);
    test_remove_tree(tmp);
    free(tmp);
    umask(old_mask);
}

/* Whoever can write the folder plants symbolic links under a dead writer's names: the
 * sweep neither appends to, reads, nor removes what they point at. */
static void test_sweep_ignores_symlinks(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("journal_sweep_link");
    int32_t *codes = random_codes(10);
    const int pid = test_dead_pid();
    char victim_id[JOURNAL_ID_MAX], link_id[JOURNAL_ID_MAX];
    snprintf(victim_id, sizeof victim_id, "1764000000-%d-1", pid);
    snprintf(link_id, sizeof link_id, "1764000000-%d-2", pid);
    /* an open journal outside the folder: what the link's target would be turned into */
    char *outside = test_make_tmpdir("journal_sweep_target");
    char *victim = write_journal(outside, victim_id, codes, 10, JOURNAL_OPEN, JOURNAL_STOP_NONE);
    size_t n_before;
    uint8_t *before = slurp(victim, &n_before);
    char link_path[1200], spool_link[1200], spool_target[1200];
    snprintf(link_path, sizeof link_path, "%s/%s" JOURNAL_SUFFIX, dir, link_id);
    assert_int_equal(symlink(victim, link_path), 0);
    snprintf(spool_target, sizeof spool_target, "%s/keep.bin", outside);
    FILE *f = fopen(spool_target, "wb");
    assert_non_null(f);
    fputs("keep", f);
    fclose(f);
    snprintf(spool_link, sizeof spool_link, "%s/%s" FRAME_SPOOL_SUFFIX, dir, link_id);
    assert_int_equal(symlink(spool_target, spool_link), 0);

    struct journal_sweep_result res;
    assert_int_equal(journal_sweep_orphans(dir, (long long)time(NULL), &res), 0);
    assert_int_equal(res.closed, 0);
    assert_int_equal(res.spools_removed, 0);
    size_t n_after;
    uint8_t *after = slurp(victim, &n_after);
    assert_int_equal(n_after, n_before);
    assert_memory_equal(after, before, n_before);
    struct stat st;
    assert_int_equal(stat(spool_target, &st), 0);
    assert_int_equal(st.st_size, 4);
    /* and the journal code refuses to go through a link at all */
    struct journal *j;
    struct journal_record r;
    assert_true(journal_open_append(&j, link_path, &r) < 0);
    assert_true(journal_ended(link_path) < 0);
    free(before), free(after), free(victim), free(codes);
    test_remove_tree(dir);
    test_remove_tree(outside);
    free(dir);
    free(outside);
}

/* ---- with the tiny-a checkpoint ---- */

static const char k_caption[] = "a bright synth pop song";
static const char k_lyrics[] = "[verse]\nhello world\n[chorus]\nsing with me\n";

struct frames {
    int width, n;
    float *f;
};

static void keep_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    (void)codes;
    struct frames *s = ctx;
    assert_int_equal(t, s->n);
    memcpy(s->f + (size_t)t * s->width, frame, sizeof(float) * s->width);
    s->n++;
}

/* A seeded song journaled as the scheduler would: every step's codes after each
 * step, the stop or budget in the end record. stop_after < 0: to the end; else the
 * writer "crashes" after that many steps (no end record). With `lora` (NULL: none) the
 * song is made with its adapter 0 on both rows, fed as the scheduler feeds a pair, and
 * the journal names the adapter. */
static char *journaled_song_lora(struct test_stage0 *m, const char *dir, const char *id, uint64_t seed, int max_frames,
                                 int stop_after, const struct talker_lora_set *lora, struct frames *out)
{
    int32_t *ids;
    int n;
    assert_int_equal(generate_prompt_ids(m->root, k_caption, k_lyrics, &ids, &n), 0);
    struct mm3_job_params p = {.lyrics = (char *)k_lyrics,
                               .caption = (char *)k_caption,
                               .max_frames = max_frames,
                               .seed = seed,
                               .sample_rate = 44100,
                               .num_inference_steps = 2,
                               .guidance_scale = 1.7f,
                               .cfg_scale = SAMPLER_CFG_SCALE};
    if (lora) snprintf(p.lora, sizeof p.lora, "%s", lora->a[0].name);
    struct journal *j;
    assert_int_equal(journal_open_write(&j, dir, id, &p, m->dd.cfg.n_codebooks, m->dd.cfg.audio_vocab, ids, n / 2), 0);
    struct sampler sp;
    sampler_init_seeded(&sp, seed);
    struct generate g;
    struct generate_hooks hooks = {.ctx = out, .on_frame = keep_frame};
    int steps = 0;
    struct talker_state ts = {0};
    if (lora) {
        int H = m->lm.cfg.hidden, P = n / 2;
        struct generate_batch b;
        assert_int_equal(talker_state_init(&ts, &m->lm, 2, P + max_frames + 1), 0);
        talker_state_set_lora(&ts, lora);
        assert_int_equal(generate_batch_init(&b, H, 2 * P + 2), 0);
        assert_int_equal(
            generate_attach(&g, &m->lm, &m->dd, &sp, &ts, 0, 1, ids, P, max_frames, SAMPLER_CFG_SCALE, &hooks), 0);
        assert_int_equal(generate_set_lora(&g, 0), 0);
        b.n = 0;
        assert_int_equal(generate_feed(&g, &b, 2 * P), 2 * P);
        assert_int_equal(generate_batch_forward(&m->lm, &ts, &b), 0);
        generate_take(&g, &b);
        while (stop_after < 0 || steps < stop_after) {
            assert_int_equal(generate_sample(&g), 0);
            if (g.stop == GENERATE_STOP_TOKEN) break;
            assert_int_equal(journal_append_codes(j, g.codes, 1), 0);
            steps++;
            if (g.done) break;
            b.n = 0;
            assert_int_equal(generate_feed(&g, &b, 2), 2);
            assert_int_equal(generate_batch_forward(&m->lm, &ts, &b), 0);
            generate_take(&g, &b);
        }
        generate_batch_free(&b);
    } else {
        assert_int_equal(generate_begin(&g, &m->lm, &m->dd, &sp, ids, n / 2, max_frames, SAMPLER_CFG_SCALE, &hooks), 0);
        while (!g.done && (stop_after < 0 || steps < stop_after)) {
            assert_int_equal(generate_step(&g), 0);
            if (g.stop == GENERATE_STOP_TOKEN) break; /* the stop draw has no codes */
            assert_int_equal(journal_append_codes(j, g.codes, 1), 0);
            steps++;
        }
    }
    char *path = strdup(journal_path(j));
    if (stop_after >= 0 && !g.done)
        journal_close(j, JOURNAL_OPEN, JOURNAL_STOP_NONE, 0);
    else
        journal_close(j, JOURNAL_DONE, g.stop == GENERATE_STOP_TOKEN ? JOURNAL_STOP_TOKEN : JOURNAL_STOP_BUDGET,
                      g.n_frames);
    generate_end(&g);
    if (lora) talker_state_free(&ts);
    free(ids);
    return path;
}

static char *journaled_song(struct test_stage0 *m, const char *dir, const char *id, uint64_t seed, int max_frames,
                            int stop_after, struct frames *out)
{
    return journaled_song_lora(m, dir, id, seed, max_frames, stop_after, NULL, out);
}

static void frames_alloc(struct frames *f, const struct test_stage0 *m, int max_frames)
{
    f->width = m->dd.cfg.n_codebooks * m->lm.cfg.hidden;
    f->n = 0;
    f->f = malloc(sizeof(float) * (size_t)max_frames * f->width);
}

static void test_bytes_per_frame(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    char *dir = test_make_tmpdir("journal_size");
    int F = 300;
    struct frames fr;
    frames_alloc(&fr, m, F);
    char *path = journaled_song(m, dir, "size", 3, F, -1, &fr);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    struct journal_record r;
    assert_int_equal(journal_read(path, &r), 0);
    assert_int_equal(r.n_frames, fr.n);
    size_t n;
    uint8_t *b = slurp(path, &n);
    size_t header = 16 + (b[12] | b[13] << 8 | b[14] << 16 | (size_t)b[15] << 24) + 8;
    free(b);
    double per_frame = (double)(n - header) / fr.n;
    printf("journal: %zu bytes = header %zu + %zu for %d frames of %d codes: %.2f bytes/frame\n", n, header, n - header,
           fr.n, r.h.n_codebooks, per_frame);
    /* A step packs each code in the bits its range needs (tiny-a: 14 + 7 x 10 bits, 10.5
     * bytes, padded to 11), then zstd. tiny-a's random weights draw nearly uniform codes, so
     * zstd gains little and its frames and the flush records add about a byte: within half a
     * byte below and a byte and a half above the packed size. Other geometries' codes may be
     * less uniform (more compressible): there only the upper bound, and at least a quarter
     * of the packed size (the steps are all there). */
    int bits = 0;
    for (int k = 0; k < r.h.n_codebooks; k++) {
        int32_t limit = k == 0 ? r.h.c0_codes : r.h.audio_vocab;
        int b = 1;
        while ((1 << b) < limit)
            b++;
        bits += b;
    }
    const double packed = (double)((bits + 7) / 8);
    const int tiny_a = r.h.n_codebooks == 8 && r.h.audio_vocab == 1024;
    assert_true(per_frame > (tiny_a ? packed - 0.5 : packed / 4) && per_frame < packed + 1.5);
    journal_record_free(&r);
    free(fr.f);
    free(path);
    test_remove_tree(dir);
    free(dir);
}

/* The stage-1 restart path: mid-song, the frames so far come back from the live
 * writer (including steps not yet flushed) equal to the generated ones. */
static void test_resend_from_live_journal(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    char *dir = test_make_tmpdir("journal_resend");
    int F = 80, stop_at = 37; /* not a flush boundary */
    int32_t *ids;
    int n;
    assert_int_equal(generate_prompt_ids(m->root, k_caption, k_lyrics, &ids, &n), 0);
    struct mm3_job_params p = {.lyrics = (char *)k_lyrics, .caption = (char *)k_caption, .max_frames = F, .seed = 4};
    struct journal *j;
    assert_int_equal(journal_open_write(&j, dir, "live", &p, m->dd.cfg.n_codebooks, m->dd.cfg.audio_vocab, ids, n / 2),
                     0);
    struct frames fr;
    frames_alloc(&fr, m, F);
    struct sampler sp;
    sampler_init_seeded(&sp, 4);
    struct generate g;
    struct generate_hooks hooks = {.ctx = &fr, .on_frame = keep_frame};
    assert_int_equal(generate_begin(&g, &m->lm, &m->dd, &sp, ids, n / 2, F, SAMPLER_CFG_SCALE, &hooks), 0);
    for (int s = 0; s < stop_at && !g.done; s++) {
        assert_int_equal(generate_step(&g), 0);
        assert_int_equal(journal_append_codes(j, g.codes, 1), 0);
    }
    struct test_frames c = {malloc(sizeof(float) * (size_t)F * fr.width), (size_t)fr.width, 0};
    struct teacher_force_sink sink = {&c, test_frames_emit};
    int got;
    /* On row 2 of a backend as the scheduler's spare row; 2 depth rows, so the frames
     * go through the depth decoder two at a time. */
    struct talker_backend be;
    assert_int_equal(talker_backend_open(&be, TALKER_BACKEND_CPU, &m->lm, &m->dd, 3, n / 2 + F, 2), 0);
    assert_int_equal(teacher_force_journal(&be, 2, j, ids, n / 2, &sink, &got), 0);
    assert_int_equal(got, fr.n);
    assert_int_equal(c.n, fr.n);
    assert_true(test_rel_error(c.f, fr.f, (size_t)fr.n * fr.width) <= 1e-5);
    /* the same frames as the direct recomputation, bit for bit */
    struct journal_record rec;
    assert_int_equal(journal_read(journal_path(j), &rec), 0);
    float *direct = malloc(sizeof(float) * (size_t)F * fr.width);
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, ids, n / 2, rec.codes, rec.n_steps, direct), 0);
    assert_memory_equal(direct, c.f, sizeof(float) * (size_t)fr.n * fr.width);
    free(direct);
    journal_record_free(&rec);
    /* a row the backend does not have, another prompt, no journal: refused */
    assert_int_equal(teacher_force_journal(&be, 3, j, ids, n / 2, &sink, &got), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "row 3"));
    ids[1] ^= 1;
    assert_int_equal(teacher_force_journal(&be, 2, j, ids, n / 2, &sink, &got), -EINVAL);
    assert_int_equal(teacher_force_journal(&be, 2, NULL, ids, n / 2, &sink, &got), -ENODATA);
    talker_backend_close(&be);
    journal_close(j, JOURNAL_CANCELLED, JOURNAL_STOP_NONE, fr.n);
    generate_end(&g);
    free(c.f);
    free(fr.f);
    free(ids);
    test_remove_tree(dir);
    free(dir);
}

/* The scenario without the processes: a song interrupted mid-way (journal
 * without end record) is found by journal_list_unfinished, completed by
 * teacher_force_resume + the seeded sampler, and equals the uninterrupted song. */
static void test_complete_interrupted(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    char *dir = test_make_tmpdir("journal_resume");
    int F = 150;
    struct frames full, cut, done;
    frames_alloc(&full, m, F);
    frames_alloc(&cut, m, F);
    frames_alloc(&done, m, F);
    char *full_path = journaled_song(m, dir, "full", 21, F, -1, &full);
    char *cut_path = journaled_song(m, dir, "cut", 21, F, 63, &cut);
    char **paths;
    int n;
    assert_int_equal(journal_list_unfinished(dir, &paths, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(paths[0], cut_path);
    journal_list_free(paths, n);

    struct journal *j;
    struct journal_record r;
    assert_int_equal(journal_open_append(&j, cut_path, &r), 0);
    assert_int_equal(r.n_steps, 63);
    int32_t *ids;
    assert_int_equal(generate_prompt_ids(m->root, r.h.params.caption, r.h.params.lyrics, &ids, &n), 0);
    assert_true(journal_prompt_hash(ids, n / 2) == r.h.prompt_hash);
    struct sampler sp;
    sampler_init_seeded(&sp, r.h.params.seed);
    struct generate g;
    struct generate_hooks hooks = {.ctx = &done, .on_frame = keep_frame};
    assert_int_equal(teacher_force_resume(&g, &m->lm, &m->dd, &sp, ids, n / 2, r.h.params.max_frames,
                                          r.h.params.cfg_scale, &hooks, r.codes, r.n_steps),
                     0);
    assert_int_equal(done.n, 62);
    while (!g.done) {
        assert_int_equal(generate_step(&g), 0);
        if (g.stop != GENERATE_STOP_TOKEN) assert_int_equal(journal_append_codes(j, g.codes, 1), 0);
    }
    assert_int_equal(journal_close(j, JOURNAL_DONE, JOURNAL_STOP_BUDGET, g.n_frames), 0);
    generate_end(&g);
    assert_int_equal(done.n, full.n);
    assert_true(test_rel_error(done.f, full.f, (size_t)full.n * full.width) <= 1e-5);
    struct journal_record a, b;
    assert_int_equal(journal_read(full_path, &a), 0);
    assert_int_equal(journal_read(cut_path, &b), 0);
    assert_int_equal(a.n_steps, b.n_steps);
    assert_memory_equal(a.codes, b.codes, sizeof(int32_t) * a.n_steps * a.h.n_codebooks);
    assert_int_equal(b.status, JOURNAL_DONE);
    journal_record_free(&a);
    journal_record_free(&b);
    journal_record_free(&r);
    free(ids);
    free(full.f), free(cut.f), free(done.f);
    free(full_path), free(cut_path);
    test_remove_tree(dir);
    free(dir);
}

/* Run a shell command built like printf; its exit status. */
static int run_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run_cmd(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *cmd;
    int n = vasprintf(&cmd, fmt, ap);
    va_end(ap);
    assert_true(n > 0);
    int rc = system(cmd);
    free(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int files_equal(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = slurp(a, &na), *y = slurp(b, &nb);
    int eq = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return eq;
}

/* mm3-rerender of a journal written during a seeded generation = mm3-stage0
 * --frames-out + mm3-stage1 --frames with the same seed and steps, byte for byte. */
static void test_rerender_equals_direct(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    const char *bin = test_bin_dir();
    char s0[4096], s1[4096], rr[4096];
    snprintf(s0, sizeof s0, "%s/mm3-stage0", bin);
    snprintf(s1, sizeof s1, "%s/mm3-stage1", bin);
    snprintf(rr, sizeof rr, "%s/mm3-rerender", bin);
    if (access(s0, X_OK) || access(s1, X_OK) || access(rr, X_OK)) skip();
    char *dir = test_make_tmpdir("journal_rerender");
    double fps;
    int F;
    assert_int_equal(generate_frame_rate(m->root, &fps), 0);
    assert_int_equal(generate_frame_budget(3.0, fps, &F), 0);
    struct frames fr;
    frames_alloc(&fr, m, F);
    char *jpath = journaled_song(m, dir, "song", 9, F, -1, &fr);
    assert_int_equal(
        run_cmd(
            "cd '%s' && printf '%%s' '%s' > lyrics.txt && '%s' --model '%s' --caption '%s' --lyrics-file lyrics.txt "
            "--duration 3 --seed 9 --frames-out a.st 2>/dev/null && '%s' --model '%s' --frames a.st --seed 9 "
            "--steps 2 --guidance 1.7 -o direct.wav 2>/dev/null && '%s' --model '%s' --journal '%s' -o re.wav "
            "2>/dev/null",
            dir, k_lyrics, s0, m->root, k_caption, s1, m->root, rr, m->root, jpath),
        0);
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/direct.wav", dir);
    snprintf(b, sizeof b, "%s/re.wav", dir);
    assert_true(files_equal(a, b));
    /* overrides: another seed and step count, as mm3-stage1 would render them */
    assert_int_equal(
        run_cmd(
            "cd '%s' && '%s' --model '%s' --frames a.st --seed 4 --steps 3 --guidance 2.5 -o direct2.wav 2>/dev/null "
            "&& '%s' --model '%s' --journal '%s' --seed 4 --steps 3 --guidance 2.5 -o re2.wav 2>/dev/null && "
            "'%s' --model '%s' --journal '%s' --sample-rate 32000 -o re32.wav 2>/dev/null",
            dir, s1, m->root, rr, m->root, jpath, rr, m->root, jpath),
        0);
    snprintf(a, sizeof a, "%s/direct2.wav", dir);
    snprintf(b, sizeof b, "%s/re2.wav", dir);
    assert_true(files_equal(a, b));
    snprintf(a, sizeof a, "%s/direct.wav", dir);
    assert_false(files_equal(a, b));
    /* 32 kHz: the header says so, and the length is the resampler's for the 44.1 kHz song */
    size_t n44, n32;
    free(slurp(a, &n44));
    snprintf(b, sizeof b, "%s/re32.wav", dir);
    uint8_t *w = slurp(b, &n32);
    assert_int_equal(w[24] | w[25] << 8 | w[26] << 16, 32000);
    int64_t f44 = (int64_t)(n44 - 44) / 4, f32 = (int64_t)(n32 - 44) / 4;
    assert_true(f44 > 0);
    assert_int_equal(f32, (f44 * 320 + 440) / 441);
    free(w);
    /* bad use: exit 2 for arguments, 1 with a message for a bad journal */
    assert_int_equal(run_cmd("'%s' --model '%s' -o x.wav >/dev/null 2>&1", rr, m->root), 2);
    assert_int_equal(
        run_cmd("'%s' --model '%s' --journal '%s' --sample-rate 22050 -o x.wav >/dev/null 2>&1", rr, m->root, jpath),
        2);
    assert_int_equal(run_cmd("cd '%s' && '%s' --model '%s' --journal lyrics.txt -o x.wav 2>err.txt", dir, rr, m->root),
                     1);
    assert_int_equal(run_cmd("grep -q 'lyrics.txt: not a journal' '%s/err.txt'", dir), 0);
    /* a journal whose prompt ids are not what this tokenizer makes of its text */
    struct mm3_job_params p = {.lyrics = (char *)k_lyrics,
                               .caption = (char *)k_caption,
                               .sample_rate = 44100,
                               .num_inference_steps = 2,
                               .guidance_scale = 1.7f};
    struct journal *j;
    int32_t *codes = random_codes(5);
    assert_int_equal(journal_open_write(&j, dir, "other", &p, NCB, 1024, &k_ids[0][0], 3), 0);
    assert_int_equal(journal_append_codes(j, codes, 5), 0);
    assert_int_equal(journal_close(j, JOURNAL_DONE, JOURNAL_STOP_TOKEN, 4), 0);
    free(codes);
    assert_int_equal(run_cmd("cd '%s' && '%s' --model '%s' --journal other.mm3j -o x.wav 2>err.txt", dir, rr, m->root),
                     1);
    assert_int_equal(run_cmd("grep -q 'tokenizer' '%s/err.txt'", dir), 0);
    free(fr.f);
    free(jpath);
    test_remove_tree(dir);
    free(dir);
}

/* A song made with a per-request adapter: mm3-rerender --lora DIR:SCALE recomputes its
 * frames with the adapter and equals mm3-stage1 rendering the frames the song was made
 * with, byte for byte; another scale gives other audio; without --lora it names the
 * adapter, --lora on a song made without one is refused, a bad scale is a usage error. */
static void test_rerender_with_adapter(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    const char *bin = test_bin_dir();
    char s1[4096], rr[4096];
    snprintf(s1, sizeof s1, "%s/mm3-stage1", bin);
    snprintf(rr, sizeof rr, "%s/mm3-rerender", bin);
    if (access(s1, X_OK) || access(rr, X_OK)) skip();
    char *dir = test_make_tmpdir("journal_rerender_lora");
    char ad[4200];
    snprintf(ad, sizeof ad, "%s/adapter", dir);
    const struct ckpt_gen_lora_opts lo = {.component = "language_model", .rank = 4, .alpha = 8, .seed = 6};
    assert_int_equal(ckpt_gen_lora_write(ad, m->root, &lo), 0);
    struct talker_lora_set set = {0};
    assert_int_equal(talker_lora_set_add(&set, &m->lm.cfg, "warm-voice", ad, 0.5), 0);
    double fps;
    int F;
    assert_int_equal(generate_frame_rate(m->root, &fps), 0);
    assert_int_equal(generate_frame_budget(2.0, fps, &F), 0);
    struct frames fr, plain;
    frames_alloc(&fr, m, F);
    frames_alloc(&plain, m, F);
    char *jpath = journaled_song_lora(m, dir, "adapted", 9, F, -1, &set, &fr);
    char *ppath = journaled_song(m, dir, "plain", 9, F, -1, &plain);
    assert_true(fr.n > 0);
    /* the adapter made another song */
    assert_true(fr.n != plain.n || memcmp(fr.f, plain.f, sizeof(float) * (size_t)fr.n * fr.width) != 0);
    char st[4200];
    snprintf(st, sizeof st, "%s/adapted.st", dir);
    struct st_writer_tensor t = {"frame_hiddens", MM3_DTYPE_F32, 2, {fr.n, fr.width}, fr.f};
    assert_int_equal(st_write_file(st, &t, 1, NULL), 0);
    assert_int_equal(run_cmd("cd '%s' && '%s' --model '%s' --frames adapted.st --seed 9 --steps 2 --guidance 1.7 -o "
                             "direct.wav 2>/dev/null && '%s' --model '%s' --journal '%s' --lora '%s:0.5' -o re.wav "
                             "2>/dev/null && '%s' --model '%s' --journal '%s' --lora '%s' -o re1.wav 2>/dev/null",
                             dir, s1, m->root, rr, m->root, jpath, ad, rr, m->root, jpath, ad),
                     0);
    char a[4300], b[4300];
    snprintf(a, sizeof a, "%s/direct.wav", dir);
    snprintf(b, sizeof b, "%s/re.wav", dir);
    assert_true(files_equal(a, b));
    snprintf(b, sizeof b, "%s/re1.wav", dir); /* scale 1, not the song's 0.5 */
    assert_false(files_equal(a, b));
    assert_int_equal(run_cmd("cd '%s' && '%s' --model '%s' --journal '%s' -o x.wav 2>err.txt", dir, rr, m->root, jpath),
                     1);
    assert_int_equal(
        run_cmd("grep -q \"adapter 'warm-voice': give its folder and scale with --lora\" '%s/err.txt'", dir), 0);
    assert_int_equal(run_cmd("cd '%s' && '%s' --model '%s' --journal '%s' --lora '%s' -o x.wav 2>err.txt", dir, rr,
                             m->root, ppath, ad),
                     1);
    assert_int_equal(run_cmd("grep -q 'made without an adapter' '%s/err.txt'", dir), 0);
    assert_int_equal(
        run_cmd("'%s' --model '%s' --journal '%s' --lora '%s:lots' -o x.wav >/dev/null 2>&1", rr, m->root, jpath, ad),
        2);
    talker_lora_set_free(&set);
    free(fr.f), free(plain.f), free(jpath), free(ppath);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_read_buffer_capped),
        cmocka_unit_test(test_format_round_trip),
        cmocka_unit_test(test_lora_round_trip),
        cmocka_unit_test(test_torn_tail),
        cmocka_unit_test(test_corrupt),
        cmocka_unit_test(test_unwritable),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_list_and_reopen),
        cmocka_unit_test(test_id_parse),
        cmocka_unit_test(test_sweep_orphans),
        cmocka_unit_test(test_permissions),
        cmocka_unit_test(test_sweep_ignores_symlinks),
        cmocka_unit_test(test_bytes_per_frame),
        cmocka_unit_test(test_resend_from_live_journal),
        cmocka_unit_test(test_complete_interrupted),
        cmocka_unit_test(test_rerender_equals_direct),
        cmocka_unit_test(test_rerender_with_adapter),
    };
    return cmocka_run_group_tests(tests, test_stage0_golden_setup, test_stage0_golden_teardown);
}
