/* mm3: command-line client of the mm3 server.
 *
 *   mm3 generate (--caption TEXT | --caption-file F) (--lyrics-file F | --lyrics TEXT)
 *                [--duration S] [--seed N] [-o song.wav] [--format wav|pcm|flac|mp3|opus]
 *                [--sample-rate 44100|32000] [--steps N] [--quiet] [--url URL] [--api-key KEY]
 *   mm3 continue (ID | --journal FILE) [--duration S] [--min-duration S] [--whole] [-o new.wav]
 *                [--format F] [--sample-rate 44100|32000] [--quiet] [--url URL] [--api-key KEY]
 *   mm3 health [--url URL]
 *   mm3 rerender ARGS...   (= mm3-rerender ARGS..., docs/journal.md)
 *
 * continue goes on with the finished song the server answered with X-Request-Id ID
 * (continue_from), or with the song of a journal file it uploads (continue_journal):
 * --duration seconds more, the new part or with --whole the whole song.
 * generate and continue always stream (stream: true): audio is written as stage 1 finishes
 * each window, into OUT.part, renamed to OUT when the stream ended properly (a
 * streamed WAV's "unknown" sizes are patched then); on any failure, and on
 * SIGINT/SIGTERM/SIGHUP, OUT.part is removed. Every numeric flag is checked in
 * full (range, NaN, trailing junk) before anything is sent: exit 2. Progress comes from
 * GET /v1/audio/speech/{X-Request-Id}, polled from a second thread; on a
 * terminal it is a bar, otherwise a plain line per window. See docs/api.md. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/error.h"
#include "common/http_client.h"
#include "stage0/api/base64.h"

#define DEFAULT_URL "http://127.0.0.1:8000"
#define MAX_TEXT_FILE (1 << 20)
/* An uploaded journal: a 6-minute song's is ~110 KB; the server's body cap decides the rest. */
#define MAX_JOURNAL_FILE (8 << 20)
/* Bodies the client holds in memory: an error answer, a progress or health report.
 * The audio itself goes to the output file as it arrives. */
#define MAX_ERROR_BODY (64 * 1024)
#define MAX_JSON_BODY (1 << 20)
/* The model's own cap: 9000 frames at 25 per second; a deploy may cap lower (the server says so). */
#define MAX_DURATION_S 360.0
/* The server's range of num_inference_steps (stage0/api/api_request.c). */
#define MAX_STEPS 200

/* Sent as `Authorization: Bearer` on /v1 requests; NULL = none. */
static const char *api_key;

static void usage(FILE *f)
{
    fprintf(f, "usage:\n"
               "  mm3 generate (--caption TEXT | --caption-file F) (--lyrics-file F | --lyrics TEXT)\n"
               "               [--duration S] [--seed N] [-o song.wav] [--format wav|pcm|flac|mp3|opus]\n"
               "               [--sample-rate 44100|32000] [--steps N] [--quiet] [--url URL]\n"
               "               [--api-key KEY]\n"
               "  mm3 continue (ID | --journal FILE) [--duration S] [--min-duration S] [--whole] [-o new.wav]\n"
               "               [--format wav|pcm|flac|mp3|opus] [--sample-rate 44100|32000] [--quiet]\n"
               "               [--url URL] [--api-key KEY]\n"
               "  mm3 health [--url URL]\n"
               "  mm3 rerender --model CKPT --journal FILE [...] -o OUT.wav   (runs mm3-rerender)\n"
               "URL (with or without /v1) defaults to $MM3_URL, else " DEFAULT_URL ". KEY defaults to\n"
               "$MM3_API_KEY (a key on the command line is visible to every local user in the process list).\n"
               "The format is -o's extension (.wav .pcm .flac .mp3 .opus) or --format; they must agree.\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *read_text_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "mm3: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(MAX_TEXT_FILE + 1);
    size_t n = buf ? fread(buf, 1, MAX_TEXT_FILE + 1, f) : 0;
    bool err = ferror(f);
    fclose(f);
    if (!buf || err || n > MAX_TEXT_FILE) {
        fprintf(stderr, "mm3: %s: %s\n", path, !buf ? "out of memory" : err ? "read error" : "larger than 1 MiB");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

/* A whole binary file of at most cap bytes (malloc'ed), or NULL with a message. */
static uint8_t *read_binary_file(const char *path, size_t cap, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "mm3: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    uint8_t *buf = malloc(cap + 1);
    *n = buf ? fread(buf, 1, cap + 1, f) : 0;
    bool err = ferror(f);
    fclose(f);
    if (!buf || err || *n > cap) {
        if (buf && !err)
            fprintf(stderr, "mm3: %s: larger than %zu bytes\n", path, cap);
        else
            fprintf(stderr, "mm3: %s: %s\n", path, !buf ? "out of memory" : "read error");
        free(buf);
        return NULL;
    }
    return buf;
}

/* ---- strict flags ---- */

/* A finite decimal number in [lo, hi] with nothing after it; else a message naming the flag, and false. */
static bool flag_double(const char *flag, const char *arg, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(arg, &end);
    /* written so that NaN fails the range test too; strtod takes "inf" and "nan" */
    if (end == arg || *end || errno == ERANGE || !isfinite(x) || !(x >= lo && x <= hi)) {
        fprintf(stderr, "mm3: %s '%s': expected a number in %g..%g\n", flag, arg, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

/* A decimal integer in [lo, hi] (lo >= 0) with no sign, spaces or junk; else a message, and false. */
static bool flag_uint(const char *flag, const char *arg, unsigned long long lo, unsigned long long hi,
                      unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(arg, &end, 10);
    /* strtoull skips spaces and takes "-1" as 2^64 - 1: only digits are allowed */
    if (!arg[0] || strspn(arg, "0123456789") != strlen(arg) || errno == ERANGE || end == arg || *end || x < lo ||
        x > hi) {
        fprintf(stderr, "mm3: %s '%s': expected an integer in %llu..%llu\n", flag, arg, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

/* The server's base address: "http://h:p", "http://h:p/" and "http://h:p/v1[/]" all give
 * "http://h:p", since the client adds /v1/... and /health itself. False when too long. */
static bool base_url(const char *url, char *out, size_t cap)
{
    if (snprintf(out, cap, "%s", url) >= (int)cap) {
        fprintf(stderr, "mm3: --url: longer than %zu characters\n", cap - 1);
        return false;
    }
    size_t n = strlen(out);
    while (n && out[n - 1] == '/')
        out[--n] = 0;
    if (n >= 3 && strcmp(out + n - 3, "/v1") == 0) out[n -= 3] = 0;
    while (n && out[n - 1] == '/')
        out[--n] = 0;
    return true;
}

/* Audio formats by name and file extension, as the server's response_format takes them. */
static const char *const formats[] = {"wav", "pcm", "flac", "mp3", "opus"};

static bool format_known(const char *name)
{
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        if (strcmp(name, formats[i]) == 0) return true;
    return false;
}

/* The format to ask for, from --format and -o's extension: the two must agree; without
 * either it is WAV; an extension that is not an audio format needs --format. */
static const char *format_resolve(const char *format, const char *out_path)
{
    if (format && !format_known(format)) {
        fprintf(stderr, "mm3: --format '%s': expected wav, pcm, flac, mp3 or opus\n", format);
        return NULL;
    }
    const char *slash = out_path ? strrchr(out_path, '/') : NULL;
    const char *dot = out_path ? strrchr(slash ? slash : out_path, '.') : NULL;
    if (!dot || dot[1] == 0) return format ? format : "wav";
    const char *ext = dot + 1;
    if (!format_known(ext)) {
        if (format) return format;
        fprintf(stderr, "mm3: -o '%s': '.%s' is not an audio format mm3 knows (wav, pcm, flac, mp3, opus): "
                        "give --format\n", out_path, ext);
        return NULL;
    }
    if (format && strcmp(format, ext) != 0) {
        fprintf(stderr, "mm3: -o '%s' is .%s but --format is %s: make them agree\n", out_path, ext, format);
        return NULL;
    }
    return ext;
}

/* ---- the partial file goes away on a signal too ---- */

static char signal_part_path[4096];
static volatile sig_atomic_t signal_part_armed;

static void on_fatal_signal(int sig)
{
    if (signal_part_armed) unlink(signal_part_path); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig);
}

static void part_cleanup_arm(const char *path)
{
    snprintf(signal_part_path, sizeof signal_part_path, "%s", path);
    signal_part_armed = 1;
    struct sigaction sa = {.sa_handler = on_fatal_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* Before the rename: from then on the path is no longer ours to remove. */
static void part_cleanup_disarm(void)
{
    signal_part_armed = 0;
}

/* ---- generate ---- */

struct gen {
    const char *base_url;
    const char *out_path;
    char part_path[4096];
    FILE *out;
    bool quiet, tty;
    double t0;
    int status;
    size_t err_cap; /* error body collected here */
    char *err_body;
    size_t err_len;
    /* shared with the progress thread */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    char id[64]; /* X-Request-Id: an opaque token (hex) */
    bool have_id;
    uint64_t bytes;
    int rate, channels;
    size_t header_bytes;
    long long max_frames;
    bool wav;
    long long last_frames, last_windows; /* last progress seen, for the final bar */
};

static double audio_seconds(struct gen *g)
{
    if (g->rate <= 0 || g->channels <= 0 || g->bytes < g->header_bytes) return 0;
    return (double)(g->bytes - g->header_bytes) / ((double)g->rate * g->channels * 2);
}

static int on_headers(void *user, const struct http_client_response *r)
{
    struct gen *g = user;
    g->status = r->status;
    if (r->status != 200) return 0;
    const char *v;
    pthread_mutex_lock(&g->mu);
    if ((v = http_client_header(r, "x-request-id"))) {
        /* only a plain token goes into the progress URL */
        g->have_id = v[0] && strlen(v) < sizeof g->id && strspn(v, "0123456789abcdefABCDEF") == strlen(v);
        if (g->have_id) snprintf(g->id, sizeof g->id, "%s", v);
    }
    g->rate = (v = http_client_header(r, "x-sample-rate")) ? atoi(v) : 0;
    g->channels = (v = http_client_header(r, "x-channels")) ? atoi(v) : 0;
    g->max_frames = (v = http_client_header(r, "x-max-frames")) ? atoll(v) : 0;
    v = http_client_header(r, "content-type");
    g->wav = v && strcmp(v, "audio/wav") == 0;
    /* Compressed bytes do not map to seconds; progress then relies on the server only. */
    if (!v || (strcmp(v, "audio/wav") != 0 && strcmp(v, "audio/pcm") != 0)) g->rate = 0;
    g->header_bytes = g->wav ? 44 : 0;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
    return 0;
}

static int on_body(void *user, const void *data, size_t n)
{
    struct gen *g = user;
    if (g->status != 200) { /* keep the error body for the message */
        if (g->err_len + n > MAX_ERROR_BODY)
            return mm3_errorf(-EFBIG, "server answered %d with an error body over %d KiB: not read further",
                              g->status, MAX_ERROR_BODY / 1024);
        if (g->err_len + n + 1 > g->err_cap) {
            size_t cap = (g->err_len + n + 1) * 2;
            char *b = realloc(g->err_body, cap);
            if (!b) return mm3_errorf(-ENOMEM, "out of memory for the error body");
            g->err_body = b;
            g->err_cap = cap;
        }
        memcpy(g->err_body + g->err_len, data, n);
        g->err_len += n;
        g->err_body[g->err_len] = 0;
        return 0;
    }
    if (fwrite(data, 1, n, g->out) != n) {
        int e = errno ? errno : EIO;
        return mm3_errorf(-e, "%s: cannot write: %s", g->part_path, strerror(e));
    }
    pthread_mutex_lock(&g->mu);
    g->bytes += n;
    pthread_mutex_unlock(&g->mu);
    return 0;
}

struct progress {
    long long frames, total, windows;
    bool from_server;
};

/* Ask the server; without an answer, estimate frames from the audio received. */
static void progress_poll(struct gen *g, const char *id, struct progress *p)
{
    char url[1024 + 64];
    snprintf(url, sizeof url, "%s/v1/audio/speech/%s", g->base_url, id);
    struct http_client_response r;
    struct http_client_request rq = {
        .url = url, .method = "GET", .timeout_ms = 2000, .max_body_bytes = MAX_JSON_BODY, .bearer_token = api_key};
    p->from_server = false;
    if (http_client_request(&rq, &r) == 0 && r.status == 200) {
        json_t *o = json_loads(r.body, 0, NULL);
        if (o) {
            p->frames = json_integer_value(json_object_get(o, "frames_done"));
            p->total = json_integer_value(json_object_get(o, "frames_total"));
            p->windows = json_integer_value(json_object_get(o, "windows_done"));
            p->from_server = true;
            json_decref(o);
        }
    }
    http_client_response_free(&r);
}

static void progress_draw(struct gen *g, const struct progress *p, double audio_s, bool final)
{
    double el = now_s() - g->t0;
    long long total = p->total > 0 ? p->total : g->max_frames;
    double frac = total > 0 ? (double)p->frames / (double)total : 0;
    if (frac > 1) frac = 1;
    char eta[32] = "--:--";
    if (frac > 0.001 && !final) {
        int s = (int)(el * (1 - frac) / frac + 0.5);
        snprintf(eta, sizeof eta, "%d:%02d", s / 60, s % 60);
    }
    if (g->tty) {
        char bar[31];
        int fill = (int)(frac * 30 + 0.5);
        for (int i = 0; i < 30; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r\033[K[%s] %3d%%  frames %lld/%lld  windows %lld  audio %.1fs  ETA %s%s", bar,
                (int)(frac * 100 + 0.5), p->frames, total, p->windows, audio_s, eta, final ? "\n" : "");
    } else {
        fprintf(stderr, "progress: frames %lld/%lld windows %lld audio %.1fs elapsed %.1fs eta %s\n", p->frames, total,
                p->windows, audio_s, el, eta);
    }
}

static void *progress_thread(void *arg)
{
    struct gen *g = arg;
    long long last_windows = -1;
    double last_line = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 500 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cond, &g->mu, &ts);
        if (g->done) break;
        if (!g->have_id) continue;
        char id[sizeof g->id];
        memcpy(id, g->id, sizeof id);
        double audio_s = audio_seconds(g);
        long long maxf = g->max_frames;
        pthread_mutex_unlock(&g->mu);

        struct progress p = {0};
        progress_poll(g, id, &p);
        if (!p.from_server && maxf > 0) {
            /* fall back on audio received: frames at 25/s is the model's frame rate */
            p.frames = (long long)(audio_s * 25.0);
            p.total = maxf;
        }
        pthread_mutex_lock(&g->mu);
        g->last_frames = p.frames;
        g->last_windows = p.windows;
        pthread_mutex_unlock(&g->mu);
        bool line_due = p.windows != last_windows || now_s() - last_line > 10;
        if (g->tty || line_due) {
            progress_draw(g, &p, audio_s, false);
            last_windows = p.windows;
            last_line = now_s();
        }
        pthread_mutex_lock(&g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* A streamed WAV says "length unknown"; a finished file should say its length. */
static int wav_patch_sizes(FILE *f, uint64_t total)
{
    if (total < 44 || total - 8 > 0xFFFFFFFFu) return 0;
    uint32_t riff = (uint32_t)(total - 8), data = (uint32_t)(total - 44);
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(riff >> (8 * i));
    if (fseek(f, 4, SEEK_SET) || fwrite(b, 1, 4, f) != 4) return -EIO;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(data >> (8 * i));
    if (fseek(f, 40, SEEK_SET) || fwrite(b, 1, 4, f) != 4) return -EIO;
    return 0;
}

/* Whether the error body is about a request field (a 404 naming continue_from: the server
 * does not know the song), rather than a wrong address. */
static bool field_error(struct gen *g)
{
    json_t *o = g->err_body ? json_loads(g->err_body, 0, NULL) : NULL;
    bool ours = o && json_is_string(json_object_get(json_object_get(o, "error"), "param"));
    json_decref(o);
    return ours;
}

static const char *error_message(struct gen *g)
{
    static char msg[1024];
    json_t *o = g->err_body ? json_loads(g->err_body, 0, NULL) : NULL;
    const char *m = o ? json_string_value(json_object_get(json_object_get(o, "error"), "message")) : NULL;
    snprintf(msg, sizeof msg, "%s", m ? m : g->err_body ? g->err_body : "(no message)");
    json_decref(o);
    return msg;
}

/* POST body (freed here) to url's speech endpoint and stream the answer into OUT.part,
 * renamed to out_path when complete; progress on stderr unless quiet. The exit status:
 * 0, 1 (the server or the file failed) or 2 (-o too long). */
static int stream_song(const char *url, char *body, const char *out_path, bool quiet)
{
    struct gen g = {.base_url = url, .out_path = out_path, .quiet = quiet};
    g.tty = !quiet && isatty(STDERR_FILENO);
    if (snprintf(g.part_path, sizeof g.part_path, "%s.part", out_path) >= (int)sizeof g.part_path) {
        fprintf(stderr, "mm3: -o: path too long\n");
        free(body);
        return 2;
    }
    part_cleanup_arm(g.part_path);
    g.out = fopen(g.part_path, "wb+");
    if (!g.out) {
        fprintf(stderr, "mm3: %s: %s\n", g.part_path, strerror(errno));
        free(body);
        return 1;
    }
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cond, NULL);
    g.t0 = now_s();
    pthread_t th;
    bool progress = !quiet && pthread_create(&th, NULL, progress_thread, &g) == 0;

    char speech_url[1024 + 32];
    snprintf(speech_url, sizeof speech_url, "%s/v1/audio/speech", url);
    struct http_client_request rq = {
        .url = speech_url,
        .method = "POST",
        .body = body,
        .body_len = strlen(body),
        .timeout_ms = 600000, /* a queued request may wait minutes for its first audio */
        .bearer_token = api_key,
        .on_headers = on_headers,
        .on_body = on_body,
        .user = &g,
    };
    struct http_client_response resp;
    int rc = http_client_request(&rq, &resp);
    free(body);

    pthread_mutex_lock(&g.mu);
    g.done = true;
    pthread_cond_broadcast(&g.cond);
    pthread_mutex_unlock(&g.mu);
    if (progress) pthread_join(th, NULL);

    int ret = 0;
    if (rc < 0) {
        fprintf(stderr, "%smm3: %s\n", g.tty ? "\n" : "", mm3_last_error());
        ret = 1;
    } else if (resp.status == 404 && !field_error(&g)) {
        fprintf(stderr, "%smm3: %s answered 404 Not Found: is --url the mm3 server's address "
                        "(http://HOST:PORT, with or without /v1)?\n", g.tty ? "\n" : "", speech_url);
        ret = 1;
    } else if (resp.status != 200) {
        fprintf(stderr, "%smm3: server answered %d: %s\n", g.tty ? "\n" : "", resp.status, error_message(&g));
        ret = 1;
    } else if (!resp.complete) {
        fprintf(stderr, "%smm3: the stream was cut: the server failed mid-song (see its log)\n", g.tty ? "\n" : "");
        ret = 1;
    } else if (g.wav && wav_patch_sizes(g.out, g.bytes) < 0) {
        fprintf(stderr, "mm3: %s: cannot patch the WAV header\n", g.part_path);
        ret = 1;
    }
    if (fclose(g.out) != 0 && ret == 0) {
        fprintf(stderr, "mm3: %s: %s\n", g.part_path, strerror(errno));
        ret = 1;
    }
    /* Only this thread is left: with the signals held, the .part is either renamed or
     * still armed for removal when one arrives. */
    sigset_t fatal, old;
    sigemptyset(&fatal);
    sigaddset(&fatal, SIGINT);
    sigaddset(&fatal, SIGTERM);
    sigaddset(&fatal, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &fatal, &old);
    if (ret == 0 && rename(g.part_path, out_path) != 0) {
        fprintf(stderr, "mm3: rename to %s: %s\n", out_path, strerror(errno));
        ret = 1;
    }
    if (ret != 0) unlink(g.part_path);
    part_cleanup_disarm();
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (ret == 0 && !quiet) {
        if (g.tty) {
            /* Done: the song may have ended before its frame cap (end of music). */
            struct progress p = {g.last_frames, g.last_frames, g.last_windows, true};
            if (p.frames <= 0) p.frames = p.total = g.max_frames; /* finished before the first poll */
            progress_draw(&g, &p, audio_seconds(&g), true);
        }
        double a = audio_seconds(&g);
        if (a > 0)
            fprintf(stderr, "wrote %s: %.1f s of audio (%d Hz, %d ch) in %.1f s\n", out_path, a, g.rate, g.channels,
                    now_s() - g.t0);
        else
            fprintf(stderr, "wrote %s: %llu bytes in %.1f s\n", out_path, (unsigned long long)g.bytes, now_s() - g.t0);
    }
    http_client_response_free(&resp);
    free(g.err_body);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cond);
    return ret;
}

static int cmd_generate(int argc, char **argv, const char *url)
{
    const char *caption = NULL, *caption_file = NULL, *lyrics = NULL, *lyrics_file = NULL;
    const char *out_path = NULL, *format = NULL;
    double duration = 0;
    unsigned long long seed = 0, steps = 0, rate = 0;
    bool has_duration = false, has_seed = false, has_steps = false, has_rate = false;
    bool quiet = false;
    static const struct option opts[] = {
        {"caption", required_argument, 0, 'c'},
        {"caption-file", required_argument, 0, 'C'},
        {"lyrics", required_argument, 0, 'l'},
        {"lyrics-file", required_argument, 0, 'L'},
        {"duration", required_argument, 0, 'd'},
        {"seed", required_argument, 0, 's'},
        {"output", required_argument, 0, 'o'},
        {"format", required_argument, 0, 'f'},
        {"steps", required_argument, 0, 'n'},
        {"sample-rate", required_argument, 0, 'r'},
        {"quiet", no_argument, 0, 'q'},
        {"url", required_argument, 0, 'u'},
        {"api-key", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
        bool ok = true;
        switch (ch) {
        case 'c':
            caption = optarg;
            break;
        case 'C':
            caption_file = optarg;
            break;
        case 'l':
            lyrics = optarg;
            break;
        case 'L':
            lyrics_file = optarg;
            break;
        case 'd':
            /* the smallest length is one frame (1/25 s) */
            ok = has_duration = flag_double("--duration", optarg, 0.04, MAX_DURATION_S, &duration);
            break;
        case 's':
            ok = has_seed = flag_uint("--seed", optarg, 0, INT64_MAX, &seed);
            break;
        case 'n':
            ok = has_steps = flag_uint("--steps", optarg, 1, MAX_STEPS, &steps);
            break;
        case 'r':
            /* only the two rates stage 1 renders, spelled plainly */
            ok = has_rate = !strcmp(optarg, "44100") || !strcmp(optarg, "32000");
            if (ok)
                rate = strtoull(optarg, NULL, 10);
            else
                fprintf(stderr, "mm3: --sample-rate '%s': expected 44100 or 32000\n", optarg);
            break;
        case 'o':
            out_path = optarg;
            break;
        case 'f':
            format = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 'u':
            url = optarg;
            break;
        case 'k':
            api_key = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (!ok) return 2;
    }
    if (optind != argc || !caption == !caption_file || !lyrics == !lyrics_file) {
        fprintf(stderr, "mm3 generate: give exactly one of --caption/--caption-file and one of "
                        "--lyrics/--lyrics-file\n");
        usage(stderr);
        return 2;
    }
    if (out_path && !out_path[0]) {
        fprintf(stderr, "mm3: -o: expected a file name\n");
        return 2;
    }
    if (!(format = format_resolve(format, out_path))) return 2;
    char out_default[16];
    if (!out_path) {
        snprintf(out_default, sizeof out_default, "song.%s", format);
        out_path = out_default;
    }
    char base[1024];
    if (!base_url(url, base, sizeof base)) return 2;
    url = base;

    char *cap_buf = caption_file ? read_text_file(caption_file) : NULL;
    char *lyr_buf = lyrics_file ? read_text_file(lyrics_file) : NULL;
    if ((caption_file && !cap_buf) || (lyrics_file && !lyr_buf)) {
        free(cap_buf);
        free(lyr_buf);
        return 1;
    }
    json_t *req = json_pack("{s:s, s:s, s:s, s:b}", "lyrics", lyr_buf ? lyr_buf : lyrics, "caption",
                            cap_buf ? cap_buf : caption, "response_format", format, "stream", 1);
    free(cap_buf);
    free(lyr_buf);
    if (!req) {
        fprintf(stderr, "mm3: caption and lyrics must be UTF-8 text\n");
        return 1;
    }
    if (has_duration) json_object_set_new(req, "duration_s", json_real(duration));
    if (has_seed) json_object_set_new(req, "seed", json_integer((json_int_t)seed));
    if (has_steps) json_object_set_new(req, "num_inference_steps", json_integer((json_int_t)steps));
    if (has_rate) json_object_set_new(req, "sample_rate", json_integer((json_int_t)rate));
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);

    return stream_song(url, body, out_path, quiet);
}

/* ---- continue ---- */

/* mm3 continue ID: the song the server answered with X-Request-Id ID (or, with
 * --journal FILE, the song of that journal, uploaded) goes on for --duration seconds
 * more (the server's default without it); the new part, or with --whole the whole song,
 * streamed to -o like generate. */
static int cmd_continue(int argc, char **argv, const char *url)
{
    const char *out_path = NULL, *format = NULL, *journal = NULL;
    double duration = 0, min_duration = 0;
    unsigned long long rate = 0;
    bool has_duration = false, has_min = false, has_rate = false, whole = false, quiet = false;
    static const struct option opts[] = {
        {"duration", required_argument, 0, 'd'},
        {"min-duration", required_argument, 0, 'm'},
        {"whole", no_argument, 0, 'w'},
        {"journal", required_argument, 0, 'j'},
        {"output", required_argument, 0, 'o'},
        {"format", required_argument, 0, 'f'},
        {"sample-rate", required_argument, 0, 'r'},
        {"quiet", no_argument, 0, 'q'},
        {"url", required_argument, 0, 'u'},
        {"api-key", required_argument, 0, 'k'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "o:qh", opts, NULL)) != -1) {
        bool ok = true;
        switch (ch) {
        case 'd':
            ok = has_duration = flag_double("--duration", optarg, 0.04, MAX_DURATION_S, &duration);
            break;
        case 'm':
            ok = has_min = flag_double("--min-duration", optarg, 0, MAX_DURATION_S, &min_duration);
            break;
        case 'w':
            whole = true;
            break;
        case 'j':
            journal = optarg;
            break;
        case 'r':
            ok = has_rate = !strcmp(optarg, "44100") || !strcmp(optarg, "32000");
            if (ok)
                rate = strtoull(optarg, NULL, 10);
            else
                fprintf(stderr, "mm3: --sample-rate '%s': expected 44100 or 32000\n", optarg);
            break;
        case 'o':
            out_path = optarg;
            break;
        case 'f':
            format = optarg;
            break;
        case 'q':
            quiet = true;
            break;
        case 'u':
            url = optarg;
            break;
        case 'k':
            api_key = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (!ok) return 2;
    }
    /* the id is the server's X-Request-Id: 32 lowercase hex digits; or the song's journal file */
    const char *id = optind == argc - 1 ? argv[optind] : NULL;
    bool id_ok = id && strlen(id) == 32 && strspn(id, "0123456789abcdef") == 32;
    if (journal ? optind != argc : !id_ok) {
        fprintf(stderr, "mm3 continue: give one request id (32 lowercase hex digits, the X-Request-Id of a finished "
                        "song)%s%s, or --journal FILE alone\n", id ? ", not " : "", id ? id : "");
        usage(stderr);
        return 2;
    }
    if (has_duration && has_min && min_duration > duration) {
        fprintf(stderr, "mm3: --min-duration %g is more than --duration %g\n", min_duration, duration);
        return 2;
    }
    if (out_path && !out_path[0]) {
        fprintf(stderr, "mm3: -o: expected a file name\n");
        return 2;
    }
    if (!(format = format_resolve(format, out_path))) return 2;
    char out_default[16];
    if (!out_path) {
        snprintf(out_default, sizeof out_default, "song.%s", format);
        out_path = out_default;
    }
    char base[1024];
    if (!base_url(url, base, sizeof base)) return 2;
    char *b64 = NULL;
    if (journal) {
        size_t n;
        uint8_t *bytes = read_binary_file(journal, MAX_JOURNAL_FILE, &n);
        if (!bytes) return 1;
        int rc = base64_encode(bytes, n, &b64);
        free(bytes);
        if (rc < 0) {
            fprintf(stderr, "mm3: %s\n", mm3_last_error());
            return 1;
        }
    }
    json_t *req = json_pack("{s:s, s:s, s:b, s:s}", journal ? "continue_journal" : "continue_from", journal ? b64 : id,
                            "response_format", format, "stream", 1, "return", whole ? "whole" : "new");
    free(b64);
    if (!req) {
        fprintf(stderr, "mm3: out of memory\n");
        return 1;
    }
    if (has_duration) json_object_set_new(req, "duration_s", json_real(duration));
    if (has_min) json_object_set_new(req, "min_duration_s", json_real(min_duration));
    if (has_rate) json_object_set_new(req, "sample_rate", json_integer((json_int_t)rate));
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return stream_song(base, body, out_path, quiet);
}

/* ---- health ---- */

static int cmd_health(int argc, char **argv, const char *url)
{
    static const struct option opts[] = {{"url", required_argument, 0, 'u'}, {0, 0, 0, 0}};
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (ch != 'u') {
            usage(stderr);
            return 2;
        }
        url = optarg;
    }
    char base[1024], full[sizeof base + 16];
    if (!base_url(url, base, sizeof base)) return 2;
    snprintf(full, sizeof full, "%s/health", base);
    struct http_client_response r;
    struct http_client_request rq = {.url = full, .method = "GET", .timeout_ms = 5000, .max_body_bytes = MAX_JSON_BODY};
    if (http_client_request(&rq, &r) < 0) {
        fprintf(stderr, "mm3: %s\n", mm3_last_error());
        http_client_response_free(&r);
        return 1;
    }
    fputs(r.body ? r.body : "", stdout);
    int ret = r.status == 200 ? 0 : 1;
    if (ret) fprintf(stderr, "mm3: not ready (HTTP %d)\n", r.status);
    http_client_response_free(&r);
    return ret;
}

/* mm3 rerender: the offline re-render is its own program (it links both stages'
 * models); run the mm3-rerender installed next to this binary, else the one on PATH. */
static int cmd_rerender(char **argv)
{
    char self[4096], path[4096 + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    argv[0] = "mm3-rerender";
    if (n > 0) {
        self[n] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(path, sizeof path, "%s/mm3-rerender", self);
            if (access(path, X_OK) == 0) execv(path, argv);
        }
    }
    execvp("mm3-rerender", argv);
    fprintf(stderr, "mm3 rerender: cannot run mm3-rerender (next to mm3 or on PATH): %s\n", strerror(errno));
    return 127;
}

int main(int argc, char **argv)
{
    const char *url = getenv("MM3_URL");
    if (!url || !*url) url = DEFAULT_URL;
    api_key = getenv("MM3_API_KEY");
    if (api_key && !*api_key) api_key = NULL;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1, url);
    if (!strcmp(argv[1], "continue")) return cmd_continue(argc - 1, argv + 1, url);
    if (!strcmp(argv[1], "health")) return cmd_health(argc - 1, argv + 1, url);
    if (!strcmp(argv[1], "rerender")) return cmd_rerender(argv + 1);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "mm3: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
