/* File layout (little-endian; docs/journal.md):
 *   header:  "MM3JRNL\0" | u32 version | u32 n | n bytes of JSON | u64 BLAKE2b-64(JSON)
 *   records: u8 type | u32 n | n bytes of payload | u64 BLAKE2b-64(type, n, payload)
 *     'S' segment start: u32 first step. A new zstd stream begins (fresh file, or
 *         reopened after a restart, whose previous stream may have no frame end).
 *     'C' codes: u32 first step | zstd stream bytes up to a flush. The stream
 *         decompresses to packed steps: code k of a step takes bits(limit_k - 1)
 *         bits, LSB first, the step padded to whole bytes (14 + 7 x 10 bits -> 11
 *         bytes in the release), limit_0 = c0_codes, the others audio_vocab.
 *     'E' end: u32 steps | u32 frames | u8 status | u8 stop. The last one counts; an
 *         'S' after it reopens the journal.
 * A record is written with one write(2); a crash leaves at most one torn record at
 * the end, which its length or hash gives away. */
#include "stage0/recovery/journal.h"

#include <blake2.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sampler.h"

#define MAGIC "MM3JRNL" /* 8 bytes with its NUL */
#define ZSTD_LEVEL 9    /* a few hundred bytes a second per request: level costs nothing */
#define MAX_FILE (256 << 20)
#define MAX_STEPS (1 << 24)

struct journal {
    char *path;
    int fd;
    int ncb;
    int bits[JOURNAL_MAX_CODEBOOKS];
    int32_t limit[JOURNAL_MAX_CODEBOOKS];
    size_t step_bytes;
    int disabled;
    int steps;   /* appended */
    int pending; /* steps staged since the last flush */
    ZSTD_CCtx *cc;
    uint8_t *in; /* staged packed steps */
    size_t in_len, in_cap;
};

static uint64_t hash64(const void *a, size_t na, const void *b, size_t nb)
{
    uint8_t d[8];
    blake2b_state s;
    blake2b_init(&s, sizeof d);
    blake2b_update(&s, a, na);
    if (nb) blake2b_update(&s, b, nb);
    blake2b_final(&s, d, sizeof d);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | d[i];
    return v;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> 8 * i);
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> 8 * i);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

uint64_t journal_prompt_hash(const int32_t *ids_pair, int prompt_len)
{
    size_t n = 2 * (size_t)(prompt_len > 0 ? prompt_len : 0);
    uint8_t *b = malloc(4 * n + 1);
    CHECK(b);
    for (size_t i = 0; i < n; i++)
        put_u32(b + 4 * i, (uint32_t)ids_pair[i]);
    uint64_t h = hash64(b, 4 * n, NULL, 0);
    free(b);
    return h;
}

void journal_make_id(char out[JOURNAL_ID_MAX], uint64_t job_id)
{
    snprintf(out, JOURNAL_ID_MAX, "%lld-%d-%" PRIu64, (long long)time(NULL), (int)getpid(), job_id);
}

const char *journal_status_name(enum journal_status s)
{
    switch (s) {
    case JOURNAL_OPEN:
        return "open";
    case JOURNAL_DONE:
        return "done";
    case JOURNAL_FAILED:
        return "failed";
    case JOURNAL_CANCELLED:
        return "cancelled";
    case JOURNAL_INTERRUPTED:
        return "interrupted";
    }
    return "?";
}

static const char *format_name(enum mm3_audio_format f)
{
    return f == MM3_AUDIO_PCM    ? "pcm"
           : f == MM3_AUDIO_FLAC ? "flac"
           : f == MM3_AUDIO_MP3  ? "mp3"
           : f == MM3_AUDIO_OPUS ? "opus"
                                 : "wav";
}

/* ---- writing ---- */

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -errno;
        if (w == 0) return -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The first write error disables the writer: the request goes on without a journal. */
static int writer_fail(struct journal *j, int rc, const char *what)
{
    if (j->disabled) return 0;
    j->disabled = 1;
    mm3_errorf(rc, "journal %s: %s failed: %s; journaling disabled for this request", j->path, what, strerror(-rc));
    LOG_WARN("%s", mm3_last_error());
    return rc;
}

static int write_record(struct journal *j, uint8_t type, const uint8_t *payload, size_t n)
{
    uint8_t *b = malloc(n + 13);
    if (!b) return writer_fail(j, -ENOMEM, "record allocation");
    b[0] = type;
    put_u32(b + 1, (uint32_t)n);
    if (n) memcpy(b + 5, payload, n);
    put_u64(b + 5 + n, hash64(b, 5 + n, NULL, 0));
    int rc = write_all(j->fd, b, n + 13);
    free(b);
    if (rc < 0) return writer_fail(j, rc, "write");
    return 0;
}

static int start_segment(struct journal *j)
{
    uint8_t p[4];
    put_u32(p, (uint32_t)j->steps);
    j->cc = ZSTD_createCCtx();
    if (!j->cc) return writer_fail(j, -ENOMEM, "zstd context");
    ZSTD_CCtx_setParameter(j->cc, ZSTD_c_compressionLevel, ZSTD_LEVEL);
    return write_record(j, 'S', p, 4);
}

static void writer_free(struct journal *j)
{
    if (!j) return;
    if (j->fd >= 0) close(j->fd);
    ZSTD_freeCCtx(j->cc);
    free(j->in);
    free(j->path);
    free(j);
}

static char *header_json(const char *req_id, const struct mm3_job_params *p, int ncb, int audio_vocab, int prompt_len,
                         uint64_t hash)
{
    char seed[32], h[32];
    snprintf(seed, sizeof seed, "%" PRIu64, p->seed);
    snprintf(h, sizeof h, "%016" PRIx64, hash);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:s, s:b, s:i, s:i, s:i, s:i, s:s, s:I}", "request_id",
        req_id, "seed", seed, "caption", p->caption ? p->caption : "", "lyrics", p->lyrics ? p->lyrics : "",
        "max_frames", (int)p->max_frames, "sample_rate", (int)p->sample_rate, "num_inference_steps",
        (int)p->num_inference_steps, "guidance_scale", (double)p->guidance_scale, "flow_shift", (double)p->flow_shift,
        "cfg_scale", (double)p->cfg_scale, "format", format_name(p->format), "stream", (int)p->stream, "n_codebooks",
        ncb, "c0_codes", SAMPLER_N_CODES, "audio_vocab", audio_vocab, "prompt_len", prompt_len, "prompt_hash", h,
        "created_unix_ms", (json_int_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
    /* the minimum length masks the stop code: a re-sent song must keep it to be the same song */
    if (o && json_object_set_new(o, "min_frames", json_integer(p->min_frames)) < 0) {
        json_decref(o);
        return NULL;
    }
    /* the frames depend on the adapter: a re-send or a continuation applies it again */
    if (o && p->lora[0] && json_object_set_new(o, "lora", json_string(p->lora)) < 0) {
        json_decref(o);
        return NULL;
    }
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    return s;
}

static int bits_for(int32_t limit)
{
    int b = 1;
    while (b < 31 && ((int32_t)1 << b) < limit)
        b++;
    return b;
}

/* Code limits and the packed step layout of a journal. */
static size_t layout(int ncb, int32_t c0_codes, int32_t audio_vocab, int32_t *limit, int *bits)
{
    size_t total = 0;
    for (int k = 0; k < ncb; k++) {
        limit[k] = k == 0 ? c0_codes : audio_vocab;
        bits[k] = bits_for(limit[k]);
        total += (size_t)bits[k];
    }
    return (total + 7) / 8;
}

static int id_valid(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n >= JOURNAL_ID_MAX || id[0] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

int journal_dir_prepare(const char *dir)
{
    if (!dir || !*dir) return mm3_errorf(-EINVAL, "journal: no journal_dir given");
    if (mkdir(dir, 0700) == 0) return 0;
    if (errno != EEXIST)
        return mm3_errorf(-errno, "journal_dir %s: cannot create: %s (its parent folder must exist and be writable)",
                          dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) < 0) return mm3_errorf(-errno, "journal_dir %s: cannot stat: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return mm3_errorf(-ENOTDIR, "journal_dir %s: exists and is not a folder", dir);
    if (st.st_mode & 077)
        LOG_WARN("journal_dir %s: mode %04o lets other users list the requests: chmod 700 it", dir,
                 (unsigned)(st.st_mode & 07777));
    return 0;
}

int journal_open_write(struct journal **out, const char *dir, const char *req_id, const struct mm3_job_params *params,
                       int n_codebooks, int audio_vocab, const int32_t *ids_pair, int prompt_len)
{
    *out = NULL;
    if (!dir || !*dir) return mm3_errorf(-EINVAL, "journal: no journal_dir given");
    if (!req_id || !id_valid(req_id))
        return mm3_errorf(-EINVAL, "journal: request id '%s': expected 1..%d characters of [A-Za-z0-9._-]",
                          req_id ? req_id : "(null)", JOURNAL_ID_MAX - 1);
    if (n_codebooks < 1 || n_codebooks > JOURNAL_MAX_CODEBOOKS || audio_vocab < 1 || prompt_len < 1 || !params)
        return mm3_errorf(-EINVAL,
                          "journal: n_codebooks %d / audio_vocab %d / prompt_len %d: expected 1..%d, >= 1, >= 1",
                          n_codebooks, audio_vocab, prompt_len, JOURNAL_MAX_CODEBOOKS);
    struct journal *j = calloc(1, sizeof *j);
    if (!j) return mm3_errorf(-ENOMEM, "journal: out of memory");
    j->fd = -1;
    j->ncb = n_codebooks;
    j->step_bytes = layout(n_codebooks, SAMPLER_N_CODES, audio_vocab, j->limit, j->bits);
    size_t n = strlen(dir) + strlen(req_id) + sizeof JOURNAL_SUFFIX + 2;
    j->path = malloc(n);
    char *json =
        header_json(req_id, params, n_codebooks, audio_vocab, prompt_len, journal_prompt_hash(ids_pair, prompt_len));
    int rc;
    if (!j->path || !json) {
        rc = mm3_errorf(-ENOMEM, "journal: out of memory");
        goto fail;
    }
    snprintf(j->path, n, "%s/%s%s", dir, req_id, JOURNAL_SUFFIX);
    j->fd = open(j->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (j->fd < 0) {
        rc = mm3_errorf(-errno, "journal %s: cannot create: %s (api.journal_dir must be a writable folder)", j->path,
                        strerror(errno));
        goto fail;
    }
    size_t jl = strlen(json);
    uint8_t *h = malloc(16 + jl + 8);
    if (!h) {
        rc = mm3_errorf(-ENOMEM, "journal: out of memory");
        goto fail_file;
    }
    memcpy(h, MAGIC, 8);
    put_u32(h + 8, params->lora[0] ? JOURNAL_VERSION : JOURNAL_VERSION_NO_LORA);
    put_u32(h + 12, (uint32_t)jl);
    memcpy(h + 16, json, jl);
    put_u64(h + 16 + jl, hash64(json, jl, NULL, 0));
    rc = write_all(j->fd, h, 16 + jl + 8);
    free(h);
    if (rc < 0) {
        rc = mm3_errorf(rc, "journal %s: writing the header failed: %s", j->path, strerror(-rc));
        goto fail_file;
    }
    if ((rc = start_segment(j)) < 0) goto fail_file;
    free(json);
    *out = j;
    return 0;
fail_file:
    unlink(j->path);
fail:
    free(json);
    writer_free(j);
    return rc;
}

int journal_flush(struct journal *j)
{
    if (!j || j->disabled || j->pending == 0) return 0;
    size_t cap = ZSTD_compressBound(j->in_len) + 64, len = 4;
    uint8_t *out = malloc(cap);
    if (!out) return writer_fail(j, -ENOMEM, "flush allocation");
    put_u32(out, (uint32_t)(j->steps - j->pending)); /* first step of the block */
    ZSTD_inBuffer in = {j->in, j->in_len, 0};
    size_t left;
    do {
        if (cap - len < 64) {
            uint8_t *o2 = realloc(out, cap *= 2);
            if (!o2) {
                free(out);
                return writer_fail(j, -ENOMEM, "flush allocation");
            }
            out = o2;
        }
        ZSTD_outBuffer ob = {out + len, cap - len, 0};
        left = ZSTD_compressStream2(j->cc, &ob, &in, ZSTD_e_flush);
        if (ZSTD_isError(left)) {
            free(out);
            return writer_fail(j, -EIO, ZSTD_getErrorName(left));
        }
        len += ob.pos;
    } while (left != 0);
    j->in_len = 0;
    j->pending = 0;
    int rc = write_record(j, 'C', out, len);
    free(out);
    return rc;
}

int journal_append_codes(struct journal *j, const int32_t *codes, int n_steps)
{
    if (!j || j->disabled || n_steps <= 0) return 0;
    if (j->steps > MAX_STEPS - n_steps) return writer_fail(j, -E2BIG, "append past the step limit");
    size_t need = j->in_len + (size_t)JOURNAL_FLUSH_STEPS * j->step_bytes;
    if (need > j->in_cap) {
        uint8_t *b = realloc(j->in, need);
        if (!b) return writer_fail(j, -ENOMEM, "staging allocation");
        j->in = b;
        j->in_cap = need;
    }
    for (int s = 0; s < n_steps; s++) {
        uint8_t *o = j->in + j->in_len;
        memset(o, 0, j->step_bytes);
        size_t bit = 0;
        for (int k = 0; k < j->ncb; k++) {
            int32_t c = codes[(size_t)s * j->ncb + k];
            if (c < 0 || c >= j->limit[k]) {
                char what[128];
                snprintf(what, sizeof what, "append of step %d (codebook %d: code %d outside [0, %d))", j->steps, k, c,
                         j->limit[k]);
                return writer_fail(j, -EINVAL, what);
            }
            for (int b = 0; b < j->bits[k]; b++, bit++)
                if ((uint32_t)c >> b & 1) o[bit / 8] |= (uint8_t)(1u << bit % 8);
        }
        j->in_len += j->step_bytes;
        j->steps++;
        if (++j->pending >= JOURNAL_FLUSH_STEPS) {
            int rc = journal_flush(j);
            if (rc < 0) return rc;
        }
    }
    return 0;
}

int journal_close(struct journal *j, enum journal_status status, enum journal_stop stop, int n_frames)
{
    if (!j) return 0;
    int rc = journal_flush(j);
    if (rc == 0 && status != JOURNAL_OPEN && !j->disabled) {
        uint8_t p[10];
        put_u32(p, (uint32_t)j->steps);
        put_u32(p + 4, (uint32_t)(n_frames > 0 ? n_frames : 0));
        p[8] = (uint8_t)status;
        p[9] = (uint8_t)stop;
        rc = write_record(j, 'E', p, sizeof p);
    }
    writer_free(j);
    return rc;
}

const char *journal_path(const struct journal *j)
{
    return j ? j->path : "";
}

int journal_disabled(const struct journal *j)
{
    return !j || j->disabled;
}

int journal_steps(const struct journal *j)
{
    return j ? j->steps : 0;
}

/* ---- reading ---- */

static int read_file(const char *path, uint8_t **buf, size_t *n)
{
    /* never through a symbolic link: whoever can write the folder must not make us read or append elsewhere */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        int err = errno;
        if (fd >= 0) close(fd);
        return mm3_errorf(-err, "journal %s: cannot open: %s", path, strerror(err));
    }
    size_t cap = 1 << 16, len = 0, r;
    uint8_t *b = malloc(cap);
    while (b && (r = fread(b + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            if (cap >= MAX_FILE) {
                free(b);
                fclose(f);
                return mm3_errorf(-EFBIG, "journal %s: larger than %d MiB", path, MAX_FILE >> 20);
            }
            uint8_t *b2 = realloc(b, cap *= 2);
            if (!b2) free(b);
            b = b2;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!b) return mm3_errorf(-ENOMEM, "journal %s: out of memory", path);
    if (err) {
        free(b);
        return mm3_errorf(-EIO, "journal %s: read error", path);
    }
    *buf = b;
    *n = len;
    return 0;
}

static int json_get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *v)
{
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x) || json_integer_value(x) < lo || json_integer_value(x) > hi) return -1;
    *v = json_integer_value(x);
    return 0;
}

static int parse_header(const char *path, const char *json, size_t n, struct journal_header *h)
{
    json_error_t e;
    json_t *o = json_loadb(json, n, 0, &e);
    if (!o) return mm3_errorf(-EINVAL, "journal %s: header JSON: %s", path, e.text);
    int64_t mf, sr, steps, ncb, c0n, av, pl, ms = 0, minf = 0;
    json_t *id = json_object_get(o, "request_id"), *seed = json_object_get(o, "seed");
    json_t *cap = json_object_get(o, "caption"), *lyr = json_object_get(o, "lyrics");
    json_t *gs = json_object_get(o, "guidance_scale"), *cs = json_object_get(o, "cfg_scale");
    json_t *fmt = json_object_get(o, "format"), *st = json_object_get(o, "stream");
    json_t *ph = json_object_get(o, "prompt_hash");
    /* absent in journals written before the field existed: stage 1's default */
    json_t *fs = json_object_get(o, "flow_shift");
    json_t *lora = json_object_get(o, "lora"); /* absent: the base model */
    const char *bad = NULL;
    if (!json_is_string(id) || strlen(json_string_value(id)) >= JOURNAL_ID_MAX)
        bad = "request_id";
    else if (!json_is_string(seed))
        bad = "seed";
    else if (!json_is_string(cap))
        bad = "caption";
    else if (!json_is_string(lyr))
        bad = "lyrics";
    else if (json_get_int(o, "max_frames", 0, INT32_MAX, &mf) < 0)
        bad = "max_frames";
    /* absent in journals written before the field existed: no minimum */
    else if (json_object_get(o, "min_frames") && json_get_int(o, "min_frames", 0, mf, &minf) < 0)
        bad = "min_frames";
    else if (json_get_int(o, "sample_rate", 0, INT32_MAX, &sr) < 0)
        bad = "sample_rate";
    else if (json_get_int(o, "num_inference_steps", 0, INT32_MAX, &steps) < 0)
        bad = "num_inference_steps";
    else if (!json_is_number(gs))
        bad = "guidance_scale";
    else if (!json_is_number(cs))
        bad = "cfg_scale";
    else if (fs && !(json_is_number(fs) && json_number_value(fs) >= 0.0 && json_number_value(fs) <= 20.0))
        bad = "flow_shift";
    else if (!json_is_string(fmt))
        bad = "format";
    else if (!json_is_boolean(st))
        bad = "stream";
    else if (json_get_int(o, "n_codebooks", 1, JOURNAL_MAX_CODEBOOKS, &ncb) < 0)
        bad = "n_codebooks";
    else if (json_get_int(o, "c0_codes", 1, INT32_MAX, &c0n) < 0)
        bad = "c0_codes";
    else if (json_get_int(o, "audio_vocab", 1, INT32_MAX, &av) < 0)
        bad = "audio_vocab";
    else if (json_get_int(o, "prompt_len", 1, INT32_MAX, &pl) < 0)
        bad = "prompt_len";
    else if (!json_is_string(ph) || strlen(json_string_value(ph)) != 16)
        bad = "prompt_hash";
    else if (lora && (!json_is_string(lora) || strlen(json_string_value(lora)) != json_string_length(lora) ||
                      !mm3_lora_name_valid(json_string_value(lora))))
        bad = "lora";
    if (bad) {
        json_decref(o);
        return mm3_errorf(-EINVAL, "journal %s: header field '%s' missing or of the wrong type", path, bad);
    }
    json_get_int(o, "created_unix_ms", INT64_MIN, INT64_MAX, &ms);
    char *e1, *e2;
    errno = 0;
    uint64_t sv = strtoull(json_string_value(seed), &e1, 10);
    uint64_t hv = strtoull(json_string_value(ph), &e2, 16);
    if (errno || *e1 || *e2 || !*json_string_value(seed) || json_string_value(seed)[0] == '-') {
        json_decref(o);
        return mm3_errorf(-EINVAL, "journal %s: header field 'seed' or 'prompt_hash' is not a number", path);
    }
    memset(h, 0, sizeof *h);
    snprintf(h->request_id, sizeof h->request_id, "%s", json_string_value(id));
    h->params.caption = strdup(json_string_value(cap));
    h->params.lyrics = strdup(json_string_value(lyr));
    h->params.seed = sv;
    h->params.max_frames = (int32_t)mf;
    h->params.min_frames = (int32_t)minf;
    h->params.sample_rate = (int32_t)sr;
    h->params.num_inference_steps = (int32_t)steps;
    h->params.guidance_scale = (float)json_number_value(gs);
    h->params.cfg_scale = (float)json_number_value(cs);
    h->params.flow_shift = fs ? (float)json_number_value(fs) : 0.0f;
    if (lora) snprintf(h->params.lora, sizeof h->params.lora, "%s", json_string_value(lora));
    const char *f = json_string_value(fmt);
    h->params.format = !strcmp(f, "pcm")    ? MM3_AUDIO_PCM
                       : !strcmp(f, "flac") ? MM3_AUDIO_FLAC
                       : !strcmp(f, "mp3")  ? MM3_AUDIO_MP3
                       : !strcmp(f, "opus") ? MM3_AUDIO_OPUS
                                            : MM3_AUDIO_WAV;
    h->params.stream = json_is_true(st);
    h->n_codebooks = (int32_t)ncb;
    h->c0_codes = (int32_t)c0n;
    h->audio_vocab = (int32_t)av;
    h->prompt_len = (int32_t)pl;
    h->prompt_hash = hv;
    h->created_unix_ms = ms;
    json_decref(o);
    if (!h->params.caption || !h->params.lyrics) {
        mm3_job_params_free(&h->params);
        return mm3_errorf(-ENOMEM, "journal %s: out of memory", path);
    }
    return 0;
}

/* Packed steps decoded so far (of every segment). */
struct decoded {
    size_t step_bytes;
    uint8_t *b;
    size_t n, cap;    /* bytes */
    size_t max_steps; /* more decoded steps than this end the readable prefix */
};

static int decoded_push(struct decoded *d, const uint8_t *p, size_t n)
{
    if ((d->n + n) / d->step_bytes > d->max_steps) return -1;
    if (d->n + n > d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 1 << 16;
        while (cap < d->n + n)
            cap *= 2;
        if (cap / d->step_bytes > 2 * (size_t)MAX_STEPS) return -1;
        uint8_t *b = realloc(d->b, cap);
        if (!b) return -ENOMEM;
        d->b = b;
        d->cap = cap;
    }
    memcpy(d->b + d->n, p, n);
    d->n += n;
    return 0;
}

/* Unpack the steps into codes[n_steps, ncb]; stops at the first code out of range. */
static int unpack(const struct decoded *d, int ncb, const int32_t *limit, const int *bits, int32_t **codes)
{
    int n_steps = (int)(d->n / d->step_bytes), s;
    *codes = malloc(sizeof(int32_t) * ((size_t)n_steps * ncb + 1));
    if (!*codes) return -ENOMEM;
    for (s = 0; s < n_steps; s++) {
        const uint8_t *p = d->b + (size_t)s * d->step_bytes;
        size_t bit = 0;
        int ok = 1;
        for (int k = 0; k < ncb; k++) {
            uint32_t v = 0;
            for (int b = 0; b < bits[k]; b++, bit++)
                v |= (uint32_t)(p[bit / 8] >> bit % 8 & 1) << b;
            if (v >= (uint32_t)limit[k]) ok = 0;
            (*codes)[(size_t)s * ncb + k] = (int32_t)v;
        }
        if (!ok) break;
    }
    return s;
}

/* Decompress one 'C' payload into d; 0, -1 (corrupt) or -ENOMEM. */
static int decode_block(ZSTD_DCtx *dc, struct decoded *d, const uint8_t *z, size_t n)
{
    uint8_t buf[4096];
    ZSTD_inBuffer in = {z, n, 0};
    for (;;) {
        ZSTD_outBuffer out = {buf, sizeof buf, 0};
        size_t r = ZSTD_decompressStream(dc, &out, &in);
        if (ZSTD_isError(r)) return -1;
        int rc = decoded_push(d, buf, out.pos);
        if (rc < 0) return rc;
        /* done with this block once all input is taken and the output was not full */
        if (in.pos == in.size && out.pos < out.size) return 0;
    }
}

int journal_read(const char *path, struct journal_record *rec)
{
    memset(rec, 0, sizeof *rec);
    uint8_t *b = NULL;
    size_t n = 0;
    int rc = read_file(path, &b, &n);
    if (rc < 0) return rc;
    rc = journal_read_buffer(path, b, n, MAX_STEPS, rec);
    free(b);
    return rc;
}

int journal_read_buffer(const char *path, const uint8_t *b, size_t n, int max_steps, struct journal_record *rec)
{
    memset(rec, 0, sizeof *rec);
    int rc;
    if (max_steps < 0 || max_steps > MAX_STEPS) max_steps = MAX_STEPS;
    if (n < 16 || memcmp(b, MAGIC, 8) != 0) {
        return mm3_errorf(-EINVAL, "journal %s: not a journal (bad magic or shorter than a header)", path);
    }
    uint32_t ver = get_u32(b + 8), jl = get_u32(b + 12);
    if (ver != JOURNAL_VERSION && ver != JOURNAL_VERSION_NO_LORA) {
        return mm3_errorf(-EINVAL, "journal %s: version %u, expected %d or %d", path, ver, JOURNAL_VERSION_NO_LORA,
                          JOURNAL_VERSION);
    }
    if ((size_t)jl + 24 > n) {
        return mm3_errorf(-EINVAL, "journal %s: truncated header (%u bytes of JSON announced, file has %zu bytes)",
                          path, jl, n);
    }
    if (hash64(b + 16, jl, NULL, 0) != get_u64(b + 16 + jl)) {
        return mm3_errorf(-EINVAL, "journal %s: header checksum mismatch (corrupt header)", path);
    }
    if ((rc = parse_header(path, (const char *)b + 16, jl, &rec->h)) < 0) return rc;
    int32_t limit[JOURNAL_MAX_CODEBOOKS];
    int bits[JOURNAL_MAX_CODEBOOKS];
    struct decoded d = {.step_bytes = layout(rec->h.n_codebooks, rec->h.c0_codes, rec->h.audio_vocab, limit, bits),
                        .max_steps = (size_t)max_steps};
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    if (!dc) {
        rc = mm3_errorf(-ENOMEM, "journal %s: out of memory", path);
        goto out;
    }
    size_t at = 16 + (size_t)jl + 8, good = at;
    int in_segment = 0;
    rec->status = JOURNAL_OPEN;
    while (at < n) {
        if (n - at < 13) break;
        uint8_t type = b[at];
        uint32_t len = get_u32(b + at + 1);
        if (len > n - at - 13) break;
        const uint8_t *p = b + at + 5;
        if (hash64(b + at, 5 + (size_t)len, NULL, 0) != get_u64(p + len)) break;
        size_t steps_so_far = d.n / d.step_bytes;
        int ok = 0;
        if (type == 'S' && len == 4 && get_u32(p) == steps_so_far) {
            ZSTD_DCtx_reset(dc, ZSTD_reset_session_only);
            in_segment = 1;
            rec->status = JOURNAL_OPEN; /* codes after an end record: reopened */
            rec->stop = JOURNAL_STOP_NONE;
            ok = 1;
        } else if (type == 'C' && len >= 4 && in_segment && get_u32(p) == steps_so_far) {
            size_t before = d.n;
            int r = decode_block(dc, &d, p + 4, len - 4);
            if (r == -ENOMEM) {
                rc = mm3_errorf(-ENOMEM, "journal %s: out of memory", path);
                goto out;
            }
            /* every block ends on a flush at a step boundary */
            ok = r == 0 && d.n % d.step_bytes == 0 && d.n > before;
            if (!ok) d.n = before;
        } else if (type == 'E' && len == 10 && get_u32(p) == steps_so_far && p[8] >= JOURNAL_DONE &&
                   p[8] <= JOURNAL_INTERRUPTED && p[9] <= JOURNAL_STOP_BUDGET) {
            rec->status = (enum journal_status)p[8];
            rec->stop = (enum journal_stop)p[9];
            rec->n_frames = (int)get_u32(p + 4);
            ok = 1;
        }
        if (!ok) break;
        at += 13 + (size_t)len;
        good = at;
    }
    rec->torn = good != n;
    rec->valid_bytes = (int64_t)good;
    rec->n_steps = unpack(&d, rec->h.n_codebooks, limit, bits, &rec->codes);
    if (rec->n_steps < 0) {
        rec->n_steps = 0;
        rc = mm3_errorf(-ENOMEM, "journal %s: out of memory", path);
        goto out;
    }
    if ((size_t)rec->n_steps * d.step_bytes != d.n) {
        /* a code out of range passed the checksum (another layout): keep the prefix */
        rec->torn = 1;
        rec->status = JOURNAL_OPEN;
    }
    if (rec->status == JOURNAL_OPEN || rec->n_frames > rec->n_steps)
        rec->n_frames = rec->n_steps > 0 ? rec->n_steps - 1 : 0;
    if (rec->torn) LOG_DEBUG("journal %s: ignoring %zu bytes of torn tail", path, n - good);
    rc = rec->codes ? 0 : mm3_errorf(-ENOMEM, "journal %s: out of memory", path);
out:
    ZSTD_freeDCtx(dc);
    free(d.b);
    if (rc < 0) journal_record_free(rec);
    return rc;
}

void journal_record_free(struct journal_record *rec)
{
    mm3_job_params_free(&rec->h.params);
    free(rec->codes);
    memset(rec, 0, sizeof *rec);
}

int journal_open_append(struct journal **out, const char *path, struct journal_record *rec)
{
    *out = NULL;
    int rc = journal_read(path, rec);
    if (rc < 0) return rc;
    struct journal *j = calloc(1, sizeof *j);
    if (!j || !(j->path = strdup(path))) {
        free(j);
        journal_record_free(rec);
        return mm3_errorf(-ENOMEM, "journal: out of memory");
    }
    j->ncb = rec->h.n_codebooks;
    j->step_bytes = layout(j->ncb, rec->h.c0_codes, rec->h.audio_vocab, j->limit, j->bits);
    j->steps = rec->n_steps;
    j->fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
    if (j->fd < 0) {
        rc = mm3_errorf(-errno, "journal %s: cannot open for appending: %s", path, strerror(errno));
    } else if (ftruncate(j->fd, rec->valid_bytes) < 0) {
        rc = mm3_errorf(-errno, "journal %s: cannot cut the torn tail: %s", path, strerror(errno));
    } else if ((rc = start_segment(j)) < 0) {
        /* message set by writer_fail */
    }
    if (rc < 0) {
        writer_free(j);
        journal_record_free(rec);
        return rc;
    }
    *out = j;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int journal_list_unfinished(const char *dir, char ***paths, int *n)
{
    *paths = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return mm3_errorf(-errno, "journal_dir %s: cannot open: %s", dir, strerror(errno));
    char **v = NULL;
    int k = 0, cap = 0, rc = 0;
    struct dirent *e;
    size_t sl = strlen(JOURNAL_SUFFIX);
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l <= sl || strcmp(e->d_name + l - sl, JOURNAL_SUFFIX) || e->d_name[0] == '.') continue;
        size_t pl = strlen(dir) + l + 2;
        char *p = malloc(pl);
        if (!p) {
            rc = mm3_errorf(-ENOMEM, "journal_dir %s: out of memory", dir);
            break;
        }
        snprintf(p, pl, "%s/%s", dir, e->d_name);
        struct journal_record r;
        if (journal_read(p, &r) < 0) {
            LOG_WARN("skipping %s", mm3_last_error());
            free(p);
            continue;
        }
        int unfinished = r.status == JOURNAL_OPEN || r.status == JOURNAL_INTERRUPTED;
        journal_record_free(&r);
        if (!unfinished) {
            free(p);
            continue;
        }
        if (k == cap) {
            char **v2 = realloc(v, sizeof(char *) * (cap = cap ? 2 * cap : 16));
            if (!v2) {
                free(p);
                rc = mm3_errorf(-ENOMEM, "journal_dir %s: out of memory", dir);
                break;
            }
            v = v2;
        }
        v[k++] = p;
    }
    closedir(d);
    if (rc < 0) {
        journal_list_free(v, k);
        return rc;
    }
    if (k) qsort(v, (size_t)k, sizeof *v, cmp_str);
    *paths = v;
    *n = k;
    return 0;
}

int journal_ended(const char *path)
{
    enum { END_RECORD = 1 + 4 + 10 + 8 };
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return mm3_errorf(-errno, "journal %s: cannot open: %s", path, strerror(errno));
    uint8_t b[END_RECORD];
    const off_t size = lseek(fd, 0, SEEK_END);
    const ssize_t got = size >= END_RECORD ? pread(fd, b, sizeof b, size - END_RECORD) : 0;
    const int err = errno;
    close(fd);
    if (size < 0 || got < 0) return mm3_errorf(-err, "journal %s: cannot read: %s", path, strerror(err));
    if (got != END_RECORD || b[0] != 'E' || get_u32(b + 1) != 10) return 0;
    return get_u64(b + 15) == hash64(b, 15, NULL, 0) && b[13] != JOURNAL_OPEN;
}

void journal_list_free(char **paths, int n)
{
    for (int i = 0; i < n; i++)
        free(paths[i]);
    free(paths);
}
