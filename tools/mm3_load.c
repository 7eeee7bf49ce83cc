/* mm3-load: a bounded load generator for one mm3 server on loopback.
 *
 *   mm3-load [--url URL] [--clients N] [--seconds T] [--mix VALID:INVALID:ABANDON]
 *            [--duration S] [--steps N] [--timeout-ms MS] [--retry-ms MS] [--seed N]
 *            [--quiet]
 *
 * N client threads send requests back to back for T seconds (both capped, so a
 * typo cannot turn a test into a storm). Each request is drawn with the --mix
 * weights from three kinds (a client pauses --retry-ms after a rejection):
 *   valid    a short song (--duration, 1 s by default, +1 s every other request),
 *            --steps Euler steps, whole file: expects 200 with a complete WAV, or a
 *            rejection (429/503 with Retry-After);
 *   invalid  malformed JSON, an unknown field, blank lyrics or a prompt over 5000
 *            tokens: expects 400 (a too-long prompt may also be rejected first);
 *   abandon  a streamed song whose connection is closed after the first audio
 *            bytes: expects 200 headers then our own abort, or a rejection.
 * It prints a table (sent, completed, abandoned, rejected, bad, failed, unexpected,
 * p50/p95 latency of completed songs) and exits 1 when any answer was unexpected,
 * a request failed at the transport level (refused, reset, timed out: a crashed
 * server) or /health does not answer 200 at the end; 2 on a bad command line. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/http_client.h"

#define LOAD_MAX_CLIENTS 64
#define LOAD_MAX_SECONDS 600
#define LOAD_MAX_LAT 100000

enum load_kind { KIND_VALID, KIND_INVALID, KIND_ABANDON, KIND_COUNT };

struct load_opts {
    const char *url;
    int clients;
    double seconds;
    int weight[KIND_COUNT];
    double duration_s;
    int steps;
    int timeout_ms;
    int retry_ms;
    unsigned seed;
    bool quiet;
};

struct load_stats {
    pthread_mutex_t mu;
    long sent[KIND_COUNT];
    long completed;  /* valid: 200 with a complete body */
    long abandoned;  /* abandon: 200 and closed by us after the first audio */
    long rejected;   /* 429 / 503 */
    long bad;        /* 400 / 413 as expected */
    long failed;     /* transport errors: refused, reset, timeout, cut body */
    long unexpected; /* any other status, or 400 for a valid request... */
    double *lat;     /* seconds of completed songs */
    long n_lat;
};

struct load_shared {
    const struct load_opts *o;
    struct load_stats st;
    double deadline;
    char speech_url[512];
};

struct load_worker {
    struct load_shared *sh;
    int id;
    unsigned rng;
    long serial;
    bool backoff; /* the last answer was a rejection */
    char *long_prompt;
};

static double load_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void load_note(struct load_shared *sh, const char *what, int kind, int status, const char *body)
{
    if (sh->o->quiet) return;
    static const char *names[KIND_COUNT] = {"valid", "invalid", "abandon"};
    fprintf(stderr, "mm3-load: %s %s request: status %d%s%.200s\n", what, names[kind], status, body ? ": " : "",
            body ? body : "");
}

static bool load_is_rejection(const struct http_client_response *r)
{
    return (r->status == 429 || r->status == 503) && http_client_header(r, "retry-after");
}

/* Whole-file WAV: RIFF/WAVE with a data chunk that holds the rest of the body. */
static bool load_wav_ok(const struct http_client_response *r)
{
    const unsigned char *b = (const unsigned char *)r->body;
    if (!b || r->body_len <= 44 || memcmp(b, "RIFF", 4) || memcmp(b + 8, "WAVE", 4) || memcmp(b + 36, "data", 4))
        return false;
    unsigned long ds = b[40] | (unsigned long)b[41] << 8 | (unsigned long)b[42] << 16 | (unsigned long)b[43] << 24;
    return ds == r->body_len - 44 && ds % 4 == 0;
}

struct load_abandon_ctx {
    int status;
    size_t got;
};

static int load_abandon_headers(void *user, const struct http_client_response *resp)
{
    ((struct load_abandon_ctx *)user)->status = resp->status;
    return 0;
}

/* Leaves a 200 stream after the first audio bytes; an error body is read whole. */
static int load_abort_after_audio(void *user, const void *data, size_t n)
{
    (void)data;
    struct load_abandon_ctx *a = user;
    a->got += n;
    return a->status == 200 && a->got > 44 ? -ECONNABORTED : 0; /* the WAV header may come alone */
}

static void load_valid(struct load_worker *w)
{
    struct load_shared *sh = w->sh;
    char json[512];
    double dur = sh->o->duration_s + (double)(w->serial & 1);
    snprintf(json, sizeof json,
             "{\"caption\":\"a calm piano ballad\",\"lyrics\":\"[verse]\\nload test %d\\n\",\"duration_s\":%g,"
             "\"seed\":%ld,\"num_inference_steps\":%d}",
             w->id, dur, (long)(rand_r(&w->rng) % 1000), sh->o->steps);
    struct http_client_response r;
    double t0 = load_now();
    int rc = http_client_request(&(struct http_client_request){.url = sh->speech_url,
                                                               .method = "POST",
                                                               .body = json,
                                                               .body_len = strlen(json),
                                                               .timeout_ms = sh->o->timeout_ms},
                                 &r);
    double dt = load_now() - t0;
    pthread_mutex_lock(&sh->st.mu);
    if (rc < 0) {
        sh->st.failed++;
        if (!sh->o->quiet) fprintf(stderr, "mm3-load: valid request failed: %s\n", mm3_last_error());
    } else if (r.status == 200 && r.complete && load_wav_ok(&r)) {
        sh->st.completed++;
        if (sh->st.n_lat < LOAD_MAX_LAT) sh->st.lat[sh->st.n_lat++] = dt;
    } else if (r.status == 200) {
        sh->st.failed++;
        load_note(sh, "incomplete answer to a", KIND_VALID, r.status, NULL);
    } else if (load_is_rejection(&r)) {
        sh->st.rejected++;
        w->backoff = true;
    } else {
        sh->st.unexpected++;
        load_note(sh, "unexpected answer to a", KIND_VALID, r.status, r.body);
    }
    pthread_mutex_unlock(&sh->st.mu);
    http_client_response_free(&r);
}

static void load_invalid(struct load_worker *w)
{
    struct load_shared *sh = w->sh;
    static const char *bodies[] = {
        "{\"caption\":\"pop\",\"lyrics\":\"la la\",", /* malformed JSON */
        "{\"caption\":\"pop\",\"lyrics\":\"la la\",\"duration_s\":1,\"temprature\":0.5}",
        "{\"caption\":\"pop\",\"lyrics\":\"   \",\"duration_s\":1}",
        NULL, /* a prompt over 5000 tokens */
    };
    int which = (int)(w->serial % 4);
    const char *body = bodies[which] ? bodies[which] : w->long_prompt;
    struct http_client_response r;
    int rc = http_client_request(&(struct http_client_request){.url = sh->speech_url,
                                                               .method = "POST",
                                                               .body = body,
                                                               .body_len = strlen(body),
                                                               .timeout_ms = sh->o->timeout_ms},
                                 &r);
    pthread_mutex_lock(&sh->st.mu);
    if (rc < 0) {
        sh->st.failed++;
        if (!sh->o->quiet) fprintf(stderr, "mm3-load: invalid request failed: %s\n", mm3_last_error());
    } else if (r.status == 400 && r.body && strstr(r.body, "invalid_request_error")) {
        sh->st.bad++;
    } else if (which == 3 && load_is_rejection(&r)) {
        sh->st.rejected++;
        w->backoff = true;
    } else {
        sh->st.unexpected++;
        load_note(sh, "unexpected answer to an", KIND_INVALID, r.status, r.body);
    }
    pthread_mutex_unlock(&sh->st.mu);
    http_client_response_free(&r);
}

static void load_abandon(struct load_worker *w)
{
    struct load_shared *sh = w->sh;
    char json[512];
    /* 250 frames: the first window's audio comes while 50 frames are still to make. */
    snprintf(json, sizeof json,
             "{\"caption\":\"a loud rock song\",\"lyrics\":\"[chorus]\\nwalk away %d\\n\",\"duration_s\":10,"
             "\"seed\":%d,\"num_inference_steps\":%d,\"stream\":true}",
             w->id, rand_r(&w->rng) % 1000, sh->o->steps);
    struct load_abandon_ctx a = {0, 0};
    struct http_client_response r;
    int rc = http_client_request(&(struct http_client_request){.url = sh->speech_url,
                                                               .method = "POST",
                                                               .body = json,
                                                               .body_len = strlen(json),
                                                               .timeout_ms = sh->o->timeout_ms,
                                                               .on_headers = load_abandon_headers,
                                                               .on_body = load_abort_after_audio,
                                                               .user = &a},
                                 &r);
    pthread_mutex_lock(&sh->st.mu);
    if ((rc == -ECONNABORTED || (rc == 0 && r.complete)) && r.status == 200) {
        sh->st.abandoned++; /* or it ended before its first audio went past the header */
    } else if (rc < 0) {
        sh->st.failed++;
        if (!sh->o->quiet) fprintf(stderr, "mm3-load: abandoned request failed early: %s\n", mm3_last_error());
    } else if (load_is_rejection(&r)) {
        sh->st.rejected++;
        w->backoff = true;
    } else {
        sh->st.unexpected++;
        load_note(sh, "unexpected answer to an", KIND_ABANDON, r.status, r.body);
    }
    pthread_mutex_unlock(&sh->st.mu);
    http_client_response_free(&r);
}

static void *load_worker_run(void *arg)
{
    struct load_worker *w = arg;
    struct load_shared *sh = w->sh;
    int total = sh->o->weight[0] + sh->o->weight[1] + sh->o->weight[2];
    while (load_now() < sh->deadline) {
        int pick = rand_r(&w->rng) % total, kind = 0;
        while (pick >= sh->o->weight[kind]) pick -= sh->o->weight[kind++];
        pthread_mutex_lock(&sh->st.mu);
        sh->st.sent[kind]++;
        pthread_mutex_unlock(&sh->st.mu);
        if (kind == KIND_VALID) load_valid(w);
        else if (kind == KIND_INVALID) load_invalid(w);
        else load_abandon(w);
        w->serial++;
        if (w->backoff) {
            /* A real client waits Retry-After (seconds); a short pause keeps the
             * pressure on without turning the run into a 503 storm. */
            struct timespec ts = {sh->o->retry_ms / 1000, (long)(sh->o->retry_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            w->backoff = false;
        }
    }
    return NULL;
}

/* Digits tokenize one per character: 8000 of them exceed the 5000-token prompt cap
 * while staying under the 20000-character field limit. */
static char *load_long_prompt(void)
{
    size_t n = 8000;
    char *s = malloc(n + 128);
    if (!s) return NULL;
    int k = sprintf(s, "{\"caption\":\"pop\",\"lyrics\":\"");
    for (size_t i = 0; i < n; i++)
        s[k++] = (char)('0' + i % 10);
    strcpy(s + k, "\",\"duration_s\":1}");
    return s;
}

static int load_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double load_percentile(const double *v, long n, double p)
{
    if (n == 0) return 0;
    long i = (long)(p * (double)(n - 1) + 0.5);
    return v[i];
}

static int load_health(const char *base, int timeout_ms)
{
    char url[600];
    snprintf(url, sizeof url, "%s/health", base);
    struct http_client_response r;
    int rc = http_client_request(&(struct http_client_request){.url = url, .method = "GET", .timeout_ms = timeout_ms},
                                 &r);
    int st = rc < 0 ? rc : r.status;
    http_client_response_free(&r);
    return st;
}

static void load_usage(FILE *f)
{
    fprintf(f, "usage: mm3-load [--url URL] [--clients N (1..%d, 4)] [--seconds T (1..%d, 10)]\n"
               "                [--mix VALID:INVALID:ABANDON (6:3:1)] [--duration S (1)] [--steps N (2)]\n"
               "                [--timeout-ms MS (120000)] [--retry-ms MS (100)] [--seed N] [--quiet]\n",
            LOAD_MAX_CLIENTS, LOAD_MAX_SECONDS);
}

static int load_parse(int argc, char **argv, struct load_opts *o)
{
    const char *env = getenv("MM3_URL");
    *o = (struct load_opts){.url = env && *env ? env : "http://127.0.0.1:8000",
                            .clients = 4,
                            .seconds = 10,
                            .weight = {6, 3, 1},
                            .duration_s = 1,
                            .steps = 2,
                            .timeout_ms = 120000,
                            .retry_ms = 100,
                            .seed = 1};
    static const struct option opts[] = {
        {"url", required_argument, 0, 'u'},      {"clients", required_argument, 0, 'c'},
        {"seconds", required_argument, 0, 't'},  {"mix", required_argument, 0, 'm'},
        {"duration", required_argument, 0, 'd'}, {"steps", required_argument, 0, 's'},
        {"timeout-ms", required_argument, 0, 'T'}, {"seed", required_argument, 0, 'S'},
        {"retry-ms", required_argument, 0, 'R'},
        {"quiet", no_argument, 0, 'q'},          {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "qh", opts, NULL)) != -1) {
        char *end = NULL;
        switch (ch) {
        case 'u': o->url = optarg; break;
        case 'c': o->clients = (int)strtol(optarg, &end, 10); break;
        case 't': o->seconds = strtod(optarg, &end); break;
        case 'd': o->duration_s = strtod(optarg, &end); break;
        case 's': o->steps = (int)strtol(optarg, &end, 10); break;
        case 'T': o->timeout_ms = (int)strtol(optarg, &end, 10); break;
        case 'R': o->retry_ms = (int)strtol(optarg, &end, 10); break;
        case 'S': o->seed = (unsigned)strtoul(optarg, &end, 10); break;
        case 'q': o->quiet = true; break;
        case 'm': {
            int n = 0;
            if (sscanf(optarg, "%d:%d:%d%n", &o->weight[0], &o->weight[1], &o->weight[2], &n) != 3 ||
                optarg[n] || o->weight[0] < 0 || o->weight[1] < 0 || o->weight[2] < 0 ||
                o->weight[0] + o->weight[1] + o->weight[2] <= 0) {
                fprintf(stderr, "mm3-load: --mix '%s': expected VALID:INVALID:ABANDON, non-negative weights, "
                                "not all 0\n", optarg);
                return -1;
            }
            break;
        }
        case 'h': load_usage(stdout); exit(0);
        default: load_usage(stderr); return -1;
        }
        if (end && *end) {
            fprintf(stderr, "mm3-load: '%s' is not a number\n", optarg);
            return -1;
        }
    }
    if (optind != argc) {
        load_usage(stderr);
        return -1;
    }
    if (o->clients < 1 || o->clients > LOAD_MAX_CLIENTS) {
        fprintf(stderr, "mm3-load: --clients %d: expected 1..%d\n", o->clients, LOAD_MAX_CLIENTS);
        return -1;
    }
    if (!(o->seconds >= 1 && o->seconds <= LOAD_MAX_SECONDS)) {
        fprintf(stderr, "mm3-load: --seconds %g: expected 1..%d\n", o->seconds, LOAD_MAX_SECONDS);
        return -1;
    }
    if (!(o->duration_s >= 0.04 && o->duration_s <= 60)) {
        fprintf(stderr, "mm3-load: --duration %g: expected 0.04..60 seconds\n", o->duration_s);
        return -1;
    }
    if (o->steps < 1 || o->steps > 200 || o->timeout_ms < 100 || o->retry_ms < 0 || o->retry_ms > 10000) {
        fprintf(stderr, "mm3-load: --steps expects 1..200, --timeout-ms at least 100, --retry-ms 0..10000\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct load_opts o;
    if (load_parse(argc, argv, &o) < 0) return 2;
    struct load_shared sh = {.o = &o};
    size_t ul = strlen(o.url);
    while (ul && o.url[ul - 1] == '/') ul--;
    snprintf(sh.speech_url, sizeof sh.speech_url, "%.*s/v1/audio/speech", (int)ul, o.url);
    char base[512];
    snprintf(base, sizeof base, "%.*s", (int)ul, o.url);
    int h = load_health(base, 10000);
    if (h != 200) {
        if (h < 0) fprintf(stderr, "mm3-load: %s/health before the run: %s\n", base, mm3_last_error());
        else fprintf(stderr, "mm3-load: %s/health before the run: status %d, expected 200\n", base, h);
        return 1;
    }
    pthread_mutex_init(&sh.st.mu, NULL);
    sh.st.lat = calloc(LOAD_MAX_LAT, sizeof *sh.st.lat);
    struct load_worker w[LOAD_MAX_CLIENTS];
    pthread_t th[LOAD_MAX_CLIENTS];
    if (!sh.st.lat) return 1;
    double t0 = load_now();
    sh.deadline = t0 + o.seconds;
    int started = 0;
    for (int i = 0; i < o.clients; i++) {
        w[i] = (struct load_worker){.sh = &sh, .id = i, .rng = o.seed * 7919u + (unsigned)i, .serial = i};
        w[i].long_prompt = load_long_prompt();
        if (!w[i].long_prompt || pthread_create(&th[i], NULL, load_worker_run, &w[i]) != 0) {
            fprintf(stderr, "mm3-load: cannot start client thread %d\n", i);
            free(w[i].long_prompt);
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        free(w[i].long_prompt);
    }
    double wall = load_now() - t0;
    h = load_health(base, 10000);
    struct load_stats *s = &sh.st;
    qsort(s->lat, (size_t)s->n_lat, sizeof *s->lat, load_cmp_double);
    long sent = s->sent[0] + s->sent[1] + s->sent[2];
    printf("clients %d, %.1f s, mix %d:%d:%d\n", o.clients, wall, o.weight[0], o.weight[1], o.weight[2]);
    printf("%-12s %8s\n", "outcome", "count");
    printf("%-12s %8ld   (valid %ld, invalid %ld, abandon %ld)\n", "sent", sent, s->sent[0], s->sent[1], s->sent[2]);
    printf("%-12s %8ld\n", "completed", s->completed);
    printf("%-12s %8ld\n", "abandoned", s->abandoned);
    printf("%-12s %8ld   (429/503)\n", "rejected", s->rejected);
    printf("%-12s %8ld   (400)\n", "bad", s->bad);
    printf("%-12s %8ld\n", "failed", s->failed);
    printf("%-12s %8ld\n", "unexpected", s->unexpected);
    printf("latency of completed songs: p50 %.3f s, p95 %.3f s\n", load_percentile(s->lat, s->n_lat, 0.50),
           load_percentile(s->lat, s->n_lat, 0.95));
    printf("health after the run: %d\n", h);
    fflush(stdout);
    int bad_run = started != o.clients || s->failed || s->unexpected || h != 200 ||
                  s->completed + s->abandoned + s->rejected + s->bad != sent;
    free(s->lat);
    pthread_mutex_destroy(&s->mu);
    return bad_run ? 1 : 0;
}
