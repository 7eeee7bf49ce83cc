/* mm3-bench-stage0: stage 0 as the server runs it, timed against its memory floor.
 *
 *   mm3-bench-stage0 --ckpt DIR [--backend cuda|cpu] [--pairs 1,2,4,8] [--contexts 1000,5000]
 *                    [--frames N] [--warmup N] [--utilization F] [--ttff-tokens N]
 *                    [--max-batched-tokens N] [--copy-mib N] [--time-limit S]
 *                    [--capture-sizes LIST|none] [--kv-dtype auto|bfloat16|float32]
 *                    [--env-sets "A=1,B=0;A=0"] [--lora RANKS]
 *
 * It drives the server's own code: one stage-0 scheduler (stage0/scheduler.h) over the
 * chosen talker backend, requests made as the HTTP layer makes them (ignore_eos set, so a
 * song on random weights never stops), and sched_step called here with a sink that
 * timestamps frames. Whatever the scheduler does per step is what is measured.
 *
 * Per context C (prompts that tokenize to C tokens, at most the 5000-token cap) the pair
 * counts are reached by growing: 1 song is submitted, then more until 2, 4, 8 run, so the
 * 8 prompts are prefilled once per context instead of 1 + 2 + 4 + 8 times. For each count:
 *   - prefill: submit -> every new song has its first frame (s, tokens/s);
 *   - ms/frame: wall time of sched_step while all N songs decode and nothing else runs
 *     (each step gives exactly one frame per song; `warmup` such steps are skipped first),
 *     median over `frames` steps;
 *   - the floor: bytes one step must read (LM matrices, the 16,385 drawable head rows,
 *     n_codebooks - 1 depth-decoder passes and their heads, in the backend's weight dtype,
 *     plus the KV cache of all 2N rows at their mean position in the cache's dtype from
 *     talker_backend_plan_compute) over the device-to-device copy bandwidth measured here
 *     (1 GiB cudaMemcpy, CUDA events, median; the CPU backend: memcpy);
 *   - ratio = ms/frame / floor.
 * Time to first frame: the first song of the context equal to --ttff-tokens (1000), alone:
 * submit -> first frame (tokenisation and prefill included), after one warm-up request.
 * Peak GPU memory: cudaMemGetInfo after every step (device-wide used), against the plan and
 * utilization x total.
 *
 * Output: a Markdown table, then one `S0BENCH kind=...` line per figure (key=value, strings
 * quoted) for scripts/bench/parse_tools.py. --time-limit S: a phase that would start, or a
 * prefill still running, after S seconds is skipped and reported as skipped (the device
 * commands have a hard limit). Exit 0 when every configuration was measured or skipped for
 * time, 1 on an error, 2 on bad arguments, 77 when the CUDA backend is not available.
 * Decode steps replay CUDA graphs at --capture-sizes (default the shipped deploy file's
 * cudagraph_capture_sizes, one eager warm-up each), as the server does; `none` = eager.
 * --env-sets: the whole grid once per ';'-separated set of ','-separated VAR=value
 * assignments (the GPU paths' measuring switches, docs/operations.md), the checkpoint
 * loaded once: each set gets a fresh scheduler (weights uploaded, graphs captured) with the
 * switches read again, so an A/B costs one load instead of one per setting.
 * --lora RANKS: after the plain grid, the grid again for each rank R of the ','-separated
 * list with a random rank-R adapter on every linear layer of the talker (mm3-mkckpt
 * --lora's, lora_alpha 2R, written under $TMPDIR) served per request, twice: loaded but
 * used by no song (the no-adapter path with adapters loaded), then used by the first song
 * of each configuration (1 of 1 at one pair, 1 of 8 at eight). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "common/ckpt_gen.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sampler.h"
#include "stage0/model/depth.h"
#include "stage0/api/job.h"
#include "stage0/text/prompt.h"
#include "stage0/scheduler.h"
#include "stage0/model/talker.h"
#include "stage0/model/talker_backend.h"
#include "stage0/model/talker_lora.h"
#include "stage0/text/tokenizer.h"
#include "tools/bench_median.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage0/model/cuda/depth_cuda.h"
#endif

#define MAX_LIST 16
#define MAX_PAIRS 64
#define MAX_ENV_SETS 8
#define MAX_ENV_VARS 8

struct args {
    const char *ckpt;
    enum talker_backend_kind backend;
    enum mm3_kv_cache_dtype kv_dtype; /* --kv-dtype, as the deploy key kv_cache_dtype */
    int pairs[MAX_LIST], n_pairs;
    int contexts[MAX_LIST], n_contexts;
    int frames, warmup, ttff_tokens, max_batched_tokens, copy_mib;
    int profile_frame; /* --profile-frame: 1-based timed step run inside cuda_profiler_range, 0 none */
    double utilization, time_limit;
    int capture[MAX_LIST], n_capture; /* rows; n_capture 0: eager decode */
    const char *env_sets;             /* --env-sets as given; NULL: the environment as it is */
    int lora_ranks[MAX_LIST], n_lora_ranks; /* --lora */
};

/* --env-sets parsed: set k assigns value[k][i] to name[k][i]. `vars` are the distinct
 * names any set assigns with their values at start (`start` NULL: unset), restored before
 * each set's assignments. */
struct env_sets {
    int n, n_vars[MAX_ENV_SETS];
    char name[MAX_ENV_SETS][MAX_ENV_VARS][64], value[MAX_ENV_SETS][MAX_ENV_VARS][64];
    char label[MAX_ENV_SETS][MAX_ENV_VARS * 130];
    int n_distinct;
    const char *distinct[MAX_ENV_SETS * MAX_ENV_VARS]; /* points into name[][] */
    char *start[MAX_ENV_SETS * MAX_ENV_VARS];          /* strdup'd, kept for the process's life */
};

/* ---- small helpers ---------------------------------------------------------------- */

static double now_s(void)
{
    return (double)mm3_job_now_ns() * 1e-9;
}

static double gib(double bytes)
{
    return bytes / (1024.0 * 1024.0 * 1024.0);
}

/* "1,2,4" -> sorted ascending, duplicates dropped, each in [lo, hi]. */
static int parse_list(const char *name, const char *s, int lo, int hi, int *out, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < lo || v > hi || (*end && *end != ','))
            return mm3_errorf(-EINVAL, "%s '%s': expected comma-separated integers in %d..%d", name, s, lo, hi);
        if (*n == MAX_LIST) return mm3_errorf(-EINVAL, "%s '%s': at most %d values", name, s, MAX_LIST);
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return mm3_errorf(-EINVAL, "%s: empty list", name);
    for (int i = 1; i < *n; i++) /* insertion sort of a handful */
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    int k = 1;
    for (int i = 1; i < *n; i++)
        if (out[i] != out[k - 1]) out[k++] = out[i];
    *n = k;
    return 0;
}

static int parse_int(const char *name, const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return mm3_errorf(-EINVAL, "%s '%s': expected an integer in %d..%d", name, s, lo, hi);
    *out = (int)v;
    return 0;
}

static int parse_double(const char *name, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !(v >= lo && v <= hi))
        return mm3_errorf(-EINVAL, "%s '%s': expected a number in %g..%g", name, s, lo, hi);
    *out = v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mm3-bench-stage0 --ckpt DIR [--backend cuda|cpu] [--pairs 1,2,4,8] [--contexts 1000,5000]\n"
               "                        [--frames N] [--warmup N] [--utilization F] [--ttff-tokens N]\n"
               "                        [--max-batched-tokens N] [--copy-mib N] [--time-limit S]\n"
               "                        [--capture-sizes LIST|none] [--kv-dtype auto|bfloat16|float32]\n"
               "                        [--profile-frame K] [--env-sets SETS] [--lora RANKS]\n"
               "  --frames N      timed decode steps per configuration (default 32)\n"
               "  --warmup N      steady decode steps skipped before timing (default 3)\n"
               "  --utilization F gpu_memory_utilization the plan is checked against (default 0.6)\n"
               "  --ttff-tokens N prompt length of the time-to-first-frame request (default 1000)\n"
               "  --max-batched-tokens N  tokens per scheduler step (default 10240, the deploy file's)\n"
               "  --copy-mib N    bytes of the copy-bandwidth measurement (default 1024)\n"
               "  --time-limit S  skip what would run past S seconds from start (default 0: none)\n"
               "  --capture-sizes LIST|none  decode rows captured in CUDA graphs (default 1,2,4,8,16,32)\n"
               "  --kv-dtype auto|bfloat16|float32  talker KV cache elements (default auto: bfloat16 on cuda,\n"
               "                  float32 on cpu), as the deploy key kv_cache_dtype\n"
               "  --profile-frame K  timed step K of every configuration runs inside a profiler range\n"
               "                  (cuda: for ncu --profile-from-start off; default 0: none)\n"
               "  --lora RANKS    the grid again per rank with a random adapter served per request, unused\n"
               "                  and then used by the first song (e.g. 16,64)\n"
               "  --env-sets \"A=1,B=0;A=0\"  the grid once per set of environment assignments (';' between\n"
               "                  sets, ',' within one), the checkpoint loaded once\n");
}

/* "A=1,B=0;A=0" -> sets; an absent option is one set that assigns nothing, and so is an
 * empty set ("A=0;" runs A=0, then the environment as started). */
static int parse_env_sets(const char *s, struct env_sets *e)
{
    memset(e, 0, sizeof *e);
    e->n = 1;
    if (!s) return 0;
    e->n = 0;
    const char *p = s;
    for (;;) {
        if (e->n == MAX_ENV_SETS) return mm3_errorf(-EINVAL, "--env-sets '%s': at most %d sets", s, MAX_ENV_SETS);
        const int k = e->n++;
        for (; *p != ';' && *p != '\0';) {
            size_t len = strcspn(p, ",;");
            const char *eq = memchr(p, '=', len);
            size_t nl = eq ? (size_t)(eq - p) : 0, vl = eq ? len - nl - 1 : 0;
            int name_ok = nl > 0 && nl < sizeof e->name[0][0] && !isdigit((unsigned char)p[0]);
            for (size_t i = 0; i < nl && name_ok; i++)
                name_ok = p[i] == '_' || isalnum((unsigned char)p[i]);
            if (!name_ok || vl >= sizeof e->value[0][0])
                return mm3_errorf(-EINVAL,
                                  "--env-sets '%s': '%.*s' is not NAME=value (a variable name, at most 63 "
                                  "characters each)",
                                  s, (int)len, p);
            if (e->n_vars[k] == MAX_ENV_VARS)
                return mm3_errorf(-EINVAL, "--env-sets '%s': at most %d assignments per set", s, MAX_ENV_VARS);
            const int i = e->n_vars[k]++;
            memcpy(e->name[k][i], p, nl);
            memcpy(e->value[k][i], eq + 1, vl);
            int known = 0;
            for (int d = 0; d < e->n_distinct && !known; d++)
                known = !strcmp(e->distinct[d], e->name[k][i]);
            if (!known) {
                const char *v = getenv(e->name[k][i]);
                e->distinct[e->n_distinct] = e->name[k][i];
                if (v && !(e->start[e->n_distinct] = strdup(v)))
                    return mm3_errorf(-ENOMEM, "--env-sets: out of memory");
                e->n_distinct++;
            }
            size_t at = strlen(e->label[k]);
            snprintf(e->label[k] + at, sizeof e->label[k] - at, "%s%.*s", i ? "," : "", (int)len, p);
            p += len;
            if (*p != ',') break;
            p++;
            if (*p == ',' || *p == ';' || *p == '\0')
                return mm3_errorf(-EINVAL, "--env-sets '%s': an empty assignment after ','", s);
        }
        if (*p == '\0') return 0;
        p++; /* ';' */
    }
}

/* Set k's environment: every variable any set names back to its value at start, then set
 * k's assignments. */
static int env_sets_apply(const struct env_sets *e, int k)
{
    for (int d = 0; d < e->n_distinct; d++) {
        int rc = e->start[d] ? setenv(e->distinct[d], e->start[d], 1) : unsetenv(e->distinct[d]);
        if (rc != 0) return mm3_errorf(-errno, "--env-sets: cannot restore %s: %s", e->distinct[d], strerror(errno));
    }
    for (int i = 0; i < e->n_vars[k]; i++)
        if (setenv(e->name[k][i], e->value[k][i], 1) != 0)
            return mm3_errorf(-errno, "--env-sets: cannot set %s: %s", e->name[k][i], strerror(errno));
#ifdef MM3_HAVE_CUDA
    cuda_env_switches_reset(); /* no scheduler exists between sets: nothing captured under the old values */
#endif
    return 0;
}

/* What every variable the sets name holds now, "A=1,B unset" (each name once). */
static void env_sets_effective(const struct env_sets *e, char *out, size_t size)
{
    size_t at = 0;
    out[0] = '\0';
    for (int d = 0; d < e->n_distinct && at < size; d++) {
        const char *v = getenv(e->distinct[d]);
        at += (size_t)snprintf(out + at, size - at, "%s%s%s%s", at ? "," : "", e->distinct[d], v ? "=" : " unset",
                               v ? v : "");
    }
}

static int parse_args(int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof *a);
    a->backend = TALKER_BACKEND_CUDA;
    a->pairs[0] = 1, a->pairs[1] = 2, a->pairs[2] = 4, a->pairs[3] = 8, a->n_pairs = 4;
    a->contexts[0] = 1000, a->contexts[1] = 5000, a->n_contexts = 2;
    a->frames = 32;
    a->warmup = 3;
    a->ttff_tokens = 1000;
    a->max_batched_tokens = 10240;
    a->copy_mib = 1024;
    a->utilization = 0.6;
    static const int shipped_capture[] = {1, 2, 4, 8, 16, 32}; /* configs/minimax_music3.yaml */
    a->n_capture = (int)(sizeof shipped_capture / sizeof *shipped_capture);
    memcpy(a->capture, shipped_capture, sizeof shipped_capture);
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            usage(stdout);
            exit(0);
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) return mm3_errorf(-EINVAL, "option %s needs a value", k);
        int rc = 0;
        if (!strcmp(k, "--ckpt"))
            a->ckpt = v;
        else if (!strcmp(k, "--backend"))
            rc = talker_backend_parse(v, &a->backend);
        else if (!strcmp(k, "--pairs"))
            rc = parse_list("--pairs", v, 1, MAX_PAIRS, a->pairs, &a->n_pairs);
        else if (!strcmp(k, "--contexts"))
            rc = parse_list("--contexts", v, 2, PROMPT_MAX_TOKENS, a->contexts, &a->n_contexts);
        else if (!strcmp(k, "--frames"))
            rc = parse_int("--frames", v, 1, 100000, &a->frames);
        else if (!strcmp(k, "--warmup"))
            rc = parse_int("--warmup", v, 0, 1000, &a->warmup);
        else if (!strcmp(k, "--ttff-tokens"))
            rc = parse_int("--ttff-tokens", v, 2, PROMPT_MAX_TOKENS, &a->ttff_tokens);
        else if (!strcmp(k, "--max-batched-tokens"))
            rc = parse_int("--max-batched-tokens", v, 2, 1 << 20, &a->max_batched_tokens);
        else if (!strcmp(k, "--copy-mib"))
            rc = parse_int("--copy-mib", v, 1, 1 << 16, &a->copy_mib);
        else if (!strcmp(k, "--utilization"))
            rc = parse_double("--utilization", v, 0.01, 1.0, &a->utilization);
        else if (!strcmp(k, "--capture-sizes")) {
            if (!strcmp(v, "none"))
                a->n_capture = 0;
            else
                rc = parse_list("--capture-sizes", v, 1, 2 * MAX_PAIRS, a->capture, &a->n_capture);
        } else if (!strcmp(k, "--kv-dtype"))
            rc = mm3_kv_cache_dtype_parse(v, &a->kv_dtype);
        else if (!strcmp(k, "--profile-frame"))
            rc = parse_int("--profile-frame", v, 0, 100000, &a->profile_frame);
        else if (!strcmp(k, "--time-limit"))
            rc = parse_double("--time-limit", v, 0, 1e7, &a->time_limit);
        else if (!strcmp(k, "--lora"))
            rc = parse_list("--lora", v, 1, 256, a->lora_ranks, &a->n_lora_ranks);
        else if (!strcmp(k, "--env-sets"))
            a->env_sets = v;
        else
            rc = mm3_errorf(-EINVAL, "unknown option %s", k);
        if (rc < 0) return rc;
    }
    if (!a->ckpt) return mm3_errorf(-EINVAL, "--ckpt DIR is required");
    return 0;
}

/* ---- copy bandwidth: the ceiling every floor divides by ------------------------------ */

/* (bytes read + bytes written) / time of one copy, median of 15 after a warm-up. */
static int copy_bandwidth(enum talker_backend_kind kind, size_t bytes, double *bw)
{
    enum { REPS = 15 };
    double t[REPS];
    if (kind == TALKER_BACKEND_CPU) {
        char *src = malloc(bytes), *dst = malloc(bytes);
        if (!src || !dst) {
            free(src);
            free(dst);
            return mm3_errorf(-ENOMEM, "copy bandwidth: cannot allocate 2 x %zu bytes", bytes);
        }
        memset(src, 0x3c, bytes);
        memset(dst, 0, bytes);
        for (int r = -1; r < REPS; r++) {
            double t0 = now_s();
            memcpy(dst, src, bytes);
            if (r >= 0) t[r] = now_s() - t0;
        }
        free(src);
        free(dst);
        *bw = 2.0 * (double)bytes / bench_median(t, REPS);
        return 0;
    }
#ifdef MM3_HAVE_CUDA
    void *src = NULL, *dst = NULL, *e0 = NULL, *e1 = NULL;
    int rc;
    if ((rc = cuda_malloc(&src, bytes)) < 0 || (rc = cuda_malloc(&dst, bytes)) < 0 ||
        (rc = cuda_memset(src, 0x3c, bytes)) < 0 || (rc = cuda_event_create(&e0)) < 0 ||
        (rc = cuda_event_create(&e1)) < 0)
        goto out;
    for (int r = -1; r < REPS; r++) {
        float ms = 0;
        if ((rc = cuda_event_record(e0, NULL)) < 0 || (rc = cuda_memcpy_d2d(dst, src, bytes, NULL)) < 0 ||
            (rc = cuda_event_record(e1, NULL)) < 0 || (rc = cuda_event_elapsed_ms(&ms, e0, e1)) < 0)
            goto out;
        if (r >= 0) t[r] = ms * 1e-3;
    }
    *bw = 2.0 * (double)bytes / bench_median(t, REPS);
out:
    cuda_event_destroy(e0);
    cuda_event_destroy(e1);
    cuda_free(src);
    cuda_free(dst);
    return rc;
#else
    return mm3_errorf(-ENODEV, "copy bandwidth: this build has no CUDA");
#endif
}

/* ---- the floor --------------------------------------------------------------------- */

/* Matrix bytes one decode step must stream, whatever the batch: the LM layers, the drawable
 * head rows, and per residual codebook one depth-decoder pass (layers + input projection;
 * positions 0 and 1 can share a pass) plus that codebook's head. Element size as
 * talker_backend_plan_compute counts weights: bf16 on the GPU, float32 on the CPU. */
static double frame_weight_bytes(enum talker_backend_kind kind, const struct talker *lm, const struct depth *dd)
{
    const struct talker_config *c = &lm->cfg;
    const struct depth_config *e = &dd->cfg;
    double w = kind == TALKER_BACKEND_CUDA ? 2 : 4;
    double H = c->hidden, F = c->ffn, QD = (double)c->n_heads * c->head_dim, KD = (double)c->n_kv_heads * c->head_dim;
    double lm_layer = QD * H + 2 * KD * H + H * QD + 3 * F * H;
    double EH = e->hidden, EF = e->ffn, nres = e->n_codebooks - 1;
    double dd_pass = (4 * EH * EH + 3 * EF * EH) * e->n_layers + EH * EH;
    double params = lm_layer * c->n_layers + (double)SAMPLER_C0_COLS * H + nres * dd_pass + nres * e->audio_vocab * EH;
    return params * w;
}

/* Bytes of that floor a CUDA step does not stream: passes 2 .. n_codebooks-1 of the
 * depth decoder start from its tables (depth_cuda_table_spared_bytes, whose answer
 * follows the same switch and geometry as the tables it builds). The floor stays the
 * issue's definition. */
static double table_spared_bytes(enum talker_backend_kind kind, const struct depth *dd)
{
#ifdef MM3_HAVE_CUDA
    if (kind == TALKER_BACKEND_CUDA) return (double)depth_cuda_table_spared_bytes(dd);
#endif
    (void)kind, (void)dd;
    return 0;
}

/* ---- the benchmark state ----------------------------------------------------------------- */

struct song {
    struct mm3_job *job;
    int frames;               /* frames received */
    double t_submit, t_first; /* seconds; t_first 0 until the first frame */
};

struct bench {
    const struct args *a;
    struct talker lm;
    struct depth dd;
    struct tokenizer *tok;
    struct sched *s;
    struct talker_backend_plan plan;
    double t_start;
    double copy_bw;
    double kv_bytes_per_pos;
    double weight_bytes;
    struct song songs[MAX_PAIRS + 1];
    int n_songs;
    int step_frames; /* frames delivered during the current step */
    int ended;       /* songs that ended on their own (must not happen: ignore_eos) */
    double mem_peak_used, mem_total, mem_after_create;
    double ready_s; /* sched_create: weight upload, KV cache, graphs */
    int mem_ok;
    int failures;        /* configurations that failed (not skipped for time) */
    int lora_songs;      /* the first songs of a configuration use the adapter "bench" */
    char lora_label[64]; /* the --lora variant ("" without one) */
    char timed_out[256]; /* why the rest is skipped; "" while there is time */
};

static struct song *song_of(struct bench *b, struct mm3_job *job)
{
    for (int i = 0; i < b->n_songs; i++)
        if (b->songs[i].job == job) return &b->songs[i];
    return NULL;
}

static int sink_start(void *ctx, struct mm3_job *job)
{
    (void)ctx, (void)job;
    return 0;
}

static int sink_frames(void *ctx, struct mm3_job *job, int first, int n, const float *frames, int width)
{
    (void)frames, (void)width;
    struct bench *b = ctx;
    struct song *s = song_of(b, job);
    if (!s) return 0; /* the warm-up request */
    if (s->t_first == 0) s->t_first = now_s();
    s->frames = first + n;
    b->step_frames += n;
    return 0;
}

static int sink_end(void *ctx, struct mm3_job *job, int total)
{
    (void)total;
    struct bench *b = ctx;
    if (song_of(b, job)) b->ended++;
    mm3_job_finish(job);
    return 0;
}

static void sink_abort(void *ctx, struct mm3_job *job)
{
    (void)ctx, (void)job;
}

static void sample_memory(struct bench *b)
{
    if (b->a->backend != TALKER_BACKEND_CUDA) return;
    size_t free_b = 0, total_b = 0;
    if (talker_backend_device_memory(&free_b, &total_b) < 0) return;
    double used = (double)(total_b - free_b);
    b->mem_total = (double)total_b;
    if (used > b->mem_peak_used) b->mem_peak_used = used;
    b->mem_ok = 1;
}

/* profile: the step runs inside the profiler's range (--profile-frame); its wall time then
 * includes the profiler's own and is not meant to be read. */
static int step(struct bench *b, double *wall, int profile)
{
    b->step_frames = 0;
    int rc = 0;
#ifdef MM3_HAVE_CUDA
    if (profile && (rc = cuda_profiler_range(1)) < 0) return rc;
#else
    (void)profile;
#endif
    double t0 = now_s();
    rc = sched_step(b->s);
    if (wall) *wall = now_s() - t0;
#ifdef MM3_HAVE_CUDA
    if (profile) {
        int rs = cuda_profiler_range(0);
        if (rc >= 0 && rs < 0) rc = rs;
    }
#endif
    sample_memory(b);
    return rc < 0 ? rc : 0;
}

static int out_of_time(struct bench *b, const char *what)
{
    if (b->timed_out[0]) return 1;
    double el = now_s() - b->t_start;
    if (b->a->time_limit > 0 && el > b->a->time_limit) {
        snprintf(b->timed_out, sizeof b->timed_out, "time limit %g s reached %s (at %.1f s)", b->a->time_limit, what,
                 el);
        return 1;
    }
    return 0;
}

static int submit(struct bench *b, const char *caption, const char *lyrics, uint64_t seed, int adapted,
                  struct song *slot)
{
    struct mm3_job_params p = {.lyrics = (char *)lyrics,
                               .caption = (char *)caption,
                               .max_frames = 9000, /* the scheduler lowers it to max_model_len - prompt */
                               .seed = seed,
                               .sample_rate = 44100,
                               .num_inference_steps = 30,
                               .guidance_scale = 1.7f,
                               .cfg_scale = SAMPLER_CFG_SCALE,
                               .ignore_eos = true};
    if (adapted) snprintf(p.lora, sizeof p.lora, "bench");
    memset(slot, 0, sizeof *slot);
    int rc = mm3_job_create(&slot->job, &p, 2, 44100, 1);
    if (rc < 0) return rc;
    slot->t_submit = now_s();
    if ((rc = sched_submit(b->s, slot->job)) < 0) {
        char msg[256];
        mm3_job_error(slot->job, msg, sizeof msg);
        mm3_job_unref(slot->job);
        slot->job = NULL;
        return mm3_errorf(rc, "sched_submit: %s", msg[0] ? msg : mm3_last_error());
    }
    return 0;
}

/* Cancel every song; one step lets the scheduler free their rows. */
static int drop_all(struct bench *b)
{
    for (int i = 0; i < b->n_songs; i++)
        if (b->songs[i].job) mm3_job_cancel(b->songs[i].job);
    int rc = step(b, NULL, 0);
    for (int i = 0; i < b->n_songs; i++)
        if (b->songs[i].job) mm3_job_unref(b->songs[i].job);
    b->n_songs = 0;
    return rc;
}

/* ---- prompts of a given token count --------------------------------------------------- */

static const char *const k_caption = "benchmark song, steady drums, warm bass, bright synth lead, 120 bpm";
static const char *const k_words[] = {"light",  "river", "dance", "shadow", "morning", "fire",  "stone", "heart",
                                      "window", "song",  "city",  "golden", "rain",    "night", "open",  "sky"};

/* Lyrics of `words` words, 8 per line. */
static char *lyrics_make(int words)
{
    size_t cap = (size_t)words * 9 + 16, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    uint32_t x = 12345;
    for (int i = 0; i < words; i++) {
        x = x * 1664525u + 1013904223u;
        const char *w = k_words[(x >> 16) % (sizeof k_words / sizeof *k_words)];
        n += (size_t)snprintf(s + n, cap - n, "%s%s", w, i % 8 == 7 ? "\n" : " ");
    }
    if (n == 0) n += (size_t)snprintf(s, cap, "la");
    s[n] = 0;
    return s;
}

static int prompt_tokens(struct bench *b, const char *lyrics, int *n)
{
    int32_t *ids = NULL;
    int rc = prompt_encode_pair(b->tok, k_caption, lyrics, &ids, n);
    free(ids);
    if (rc == -E2BIG) {
        *n = PROMPT_MAX_TOKENS + 1;
        return 0;
    }
    return rc;
}

/* The longest lyrics whose prompt has at most `target` tokens (binary search on words). */
static int prompt_for(struct bench *b, int target, char **lyrics, int *n)
{
    int lo = 1, hi = 1, t = 0, rc;
    char *s;
    for (;;) { /* grow hi until it overshoots */
        if (!(s = lyrics_make(hi))) return mm3_errorf(-ENOMEM, "out of memory");
        rc = prompt_tokens(b, s, &t);
        free(s);
        if (rc < 0) return rc;
        if (t > target) break;
        lo = hi;
        if (hi > 4 * PROMPT_MAX_TOKENS) break;
        hi *= 2;
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (!(s = lyrics_make(mid))) return mm3_errorf(-ENOMEM, "out of memory");
        rc = prompt_tokens(b, s, &t);
        free(s);
        if (rc < 0) return rc;
        if (t <= target)
            lo = mid;
        else
            hi = mid;
    }
    if (!(*lyrics = lyrics_make(lo))) return mm3_errorf(-ENOMEM, "out of memory");
    if ((rc = prompt_tokens(b, *lyrics, n)) < 0) {
        free(*lyrics);
        *lyrics = NULL;
        return rc;
    }
    if (*n > target) {
        rc = mm3_errorf(-EINVAL, "no lyrics give a prompt of <= %d tokens (the template alone has %d)", target, *n);
        free(*lyrics);
        *lyrics = NULL;
        return rc;
    }
    return 0;
}

/* ---- results ------------------------------------------------------------------------------- */

struct result {
    int context, pairs, prompt_tokens;
    int measured; /* 0: skipped (reason) */
    char reason[256];
    double ms_median, ms_mean, ms_min, ms_max;
    double forward_ms, sample_ms; /* medians of the step's two parts (sched_last_step_ns) */
    double gpu_forward_ms, gpu_sample_ms; /* medians of their graphs' GPU time (MM3_GRAPH_TIMING=1), else 0 */
    long ahead_taken;                     /* timed steps the backend had queued ahead */
    int steps;
    double mean_pos, kv_bytes, floor_ms;
    double prefill_s, prefill_tokens;
};

static struct result results[MAX_LIST * MAX_LIST];
static int n_results;
static const char *env_label; /* the current --env-sets set, NULL without the option */

static struct result *result_new(int context, int pairs, int prompt)
{
    struct result *r = &results[n_results++];
    memset(r, 0, sizeof *r);
    r->context = context;
    r->pairs = pairs;
    r->prompt_tokens = prompt;
    return r;
}

/* Every song of the phase decodes: a step gave each one a frame. Two in a row mean the
 * second one fed no prompt (a song's last prefill chunk and its first frame share a step). */
static int wait_steady(struct bench *b, int n, const char *what, double t_sub)
{
    int streak = 0;
    while (streak < 2 + b->a->warmup) {
        char why[160];
        snprintf(why, sizeof why, "%s, %.1f s after its submit", what, now_s() - t_sub);
        if (out_of_time(b, why)) return 1;
        int rc = step(b, NULL, 0);
        if (rc < 0) return rc;
        if (b->ended) return mm3_errorf(-EIO, "a song ended during %s (max_model_len too small?)", what);
        streak = b->step_frames == n ? streak + 1 : 0;
    }
    return 0;
}

/* Grow from the songs running to `pairs`, wait for steady decoding, time `frames` steps. */
static int run_level(struct bench *b, struct result *r, const char *lyrics, int *ttff_done, double *ttff_s)
{
    const struct args *a = b->a;
    int have = b->n_songs;
    char what[96];
    snprintf(what, sizeof what, "before context %d, %d pairs", r->context, r->pairs);
    if (out_of_time(b, what)) return 1;
    snprintf(what, sizeof what, "while prefilling context %d, %d pairs", r->context, r->pairs);
    double t_sub = now_s();
    for (int i = have; i < r->pairs; i++) {
        int rc = submit(b, k_caption, lyrics, 1000u + (uint64_t)r->context * 64u + (uint64_t)i, i < b->lora_songs,
                        &b->songs[i]);
        if (rc < 0) return rc;
        b->n_songs++;
    }
    int rc = wait_steady(b, r->pairs, what, t_sub);
    if (rc != 0) return rc;
    double last_first = 0;
    for (int i = have; i < r->pairs; i++)
        if (b->songs[i].t_first > last_first) last_first = b->songs[i].t_first;
    r->prefill_s = last_first - t_sub;
    r->prefill_tokens = 2.0 * r->prompt_tokens * (r->pairs - have);
    if (have == 0 && r->pairs == 1 && r->prompt_tokens <= a->ttff_tokens && !*ttff_done &&
        r->context == a->ttff_tokens) {
        *ttff_s = b->songs[0].t_first - b->songs[0].t_submit;
        *ttff_done = 1;
    }
    double *ms = malloc(sizeof(double) * 5 * (size_t)a->frames);
    if (!ms) return mm3_errorf(-ENOMEM, "out of memory");
    double *fwd_ms = ms + a->frames, *smp_ms = ms + 2 * a->frames;
    double *gpu_fwd_ms = ms + 3 * a->frames, *gpu_smp_ms = ms + 4 * a->frames;
    double pos_sum = 0;
    struct talker_backend_counts before, after;
    talker_backend_counts(sched_backend(b->s), &before);
    for (int k = 0; k < a->frames; k++) {
        for (int i = 0; i < r->pairs; i++)
            pos_sum += r->prompt_tokens + b->songs[i].frames;
        double wall;
        if ((rc = step(b, &wall, k + 1 == a->profile_frame && a->backend == TALKER_BACKEND_CUDA)) < 0) break;
        if (b->step_frames != r->pairs || b->ended) {
            rc = mm3_errorf(-EIO, "context %d, %d pairs: a timed step gave %d frames, expected one per song%s",
                            r->context, r->pairs, b->step_frames, b->ended ? " (a song ended)" : "");
            break;
        }
        ms[k] = wall * 1e3;
        int64_t fwd_ns, smp_ns;
        sched_last_step_ns(b->s, &fwd_ns, &smp_ns);
        fwd_ms[k] = fwd_ns * 1e-6;
        smp_ms[k] = smp_ns * 1e-6;
        sched_last_step_gpu_ms(b->s, &gpu_fwd_ms[k], &gpu_smp_ms[k]);
    }
    talker_backend_counts(sched_backend(b->s), &after);
    r->ahead_taken = after.ahead_taken - before.ahead_taken;
    if (rc == 0) {
        double sum = 0, lo = ms[0], hi = ms[0];
        for (int k = 0; k < a->frames; k++) {
            sum += ms[k];
            lo = ms[k] < lo ? ms[k] : lo;
            hi = ms[k] > hi ? ms[k] : hi;
        }
        r->ms_mean = sum / a->frames;
        r->ms_min = lo;
        r->ms_max = hi;
        r->ms_median = bench_median(ms, a->frames);
        r->forward_ms = bench_median(fwd_ms, a->frames);
        r->sample_ms = bench_median(smp_ms, a->frames);
        r->gpu_forward_ms = bench_median(gpu_fwd_ms, a->frames);
        r->gpu_sample_ms = bench_median(gpu_smp_ms, a->frames);
        r->steps = a->frames;
        r->mean_pos = pos_sum / ((double)a->frames * r->pairs);
        r->kv_bytes = 2.0 * r->pairs * r->mean_pos * b->kv_bytes_per_pos;
        r->floor_ms = (b->weight_bytes + r->kv_bytes) / b->copy_bw * 1e3;
        r->measured = 1;
    }
    free(ms);
    return rc;
}

/* One request with a short prompt, two frames, then cancelled: module loads, handles and
 * pools are created before anything is timed (a serving process has done this long ago). */
static int warm_up(struct bench *b)
{
    int rc = submit(b, "warm up", "la la la", 1, b->lora_songs > 0, &b->songs[0]);
    if (rc < 0) return rc;
    b->n_songs = 1;
    for (int i = 0; i < 10000 && rc == 0 && b->songs[0].frames < 2 && !b->ended; i++)
        rc = step(b, NULL, 0);
    int frames = b->songs[0].frames;
    int rc2 = drop_all(b);
    if (rc == 0) rc = rc2;
    if (rc == 0 && frames < 2) rc = mm3_errorf(-EIO, "warm-up request: %d frames, expected 2", frames);
    b->ended = 0;
    return rc;
}

static void print_results(struct bench *b, int ttff_done, double ttff_s, int ttff_prompt, double load_s)
{
    const struct args *a = b->a;
    const char *be = a->backend == TALKER_BACKEND_CUDA ? "cuda" : "cpu";
    char lora_note[96] = "";
    if (b->lora_label[0]) snprintf(lora_note, sizeof lora_note, "; %s", b->lora_label);
    if (env_label)
        printf("\n## Stage 0 through the scheduler (%s backend; environment %s%s)\n\n", be,
               env_label[0] ? env_label : "as started", lora_note);
    else
        printf("\n## Stage 0 through the scheduler (%s backend%s)\n\n", be, lora_note);
    const double spared = table_spared_bytes(a->backend, &b->dd);
    printf("copy bandwidth %.1f GB/s (read + write, %d MiB, median of 15); weights per step %.3f GB",
           b->copy_bw * 1e-9, a->copy_mib, b->weight_bytes * 1e-9);
    if (spared > 0)
        printf(" (the floor's; the depth decoder's tables spare %.3f GB of it, %.3f ms at the copy rate)",
               spared * 1e-9, spared / b->copy_bw * 1e3);
    printf("; KV %.0f bytes per row and position (%s)\n\n", b->kv_bytes_per_pos,
           mm3_kv_cache_dtype_name(b->plan.kv_dtype));
    printf("| figure | context | pairs | value | floor | ratio | notes |\n|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n_results; i++) {
        struct result *r = &results[i];
        if (!r->measured) {
            printf("| ms per frame | %d | %d | n/a (%s) | | | |\n", r->context, r->pairs, r->reason);
            continue;
        }
        char parts[256];
        if (r->sample_ms > 0)
            snprintf(parts, sizeof parts, "forward %.2f, sampling %.2f", r->forward_ms, r->sample_ms);
        else /* the scheduler's steady path: both in one decode_pairs call */
            snprintf(parts, sizeof parts, "forward and sampling in one call, %.2f", r->forward_ms);
        if (r->ahead_taken > 0)
            snprintf(parts + strlen(parts), sizeof parts - strlen(parts), "; %ld of %d steps queued ahead",
                     r->ahead_taken, r->steps);
        if (r->gpu_forward_ms > 0 || r->gpu_sample_ms > 0)
            snprintf(parts + strlen(parts), sizeof parts - strlen(parts), "; in the graphs %.3f + %.3f, idle %.3f",
                     r->gpu_forward_ms, r->gpu_sample_ms, r->ms_median - r->gpu_forward_ms - r->gpu_sample_ms);
        printf("| ms per frame | %d | %d | %.2f | %.2f | %.2f | prompt %d tokens, mean position %.0f, median of %d "
               "(min %.2f, max %.2f; %s); prefill %.2f s for %.0f tokens |\n",
               r->context, r->pairs, r->ms_median, r->floor_ms, r->ms_median / r->floor_ms, r->prompt_tokens,
               r->mean_pos, r->steps, r->ms_min, r->ms_max, parts, r->prefill_s, r->prefill_tokens);
    }
    if (ttff_done)
        printf("| time to first frame, alone | %d | 1 | %.3f s | | | submit -> first frame, prefill included |\n",
               ttff_prompt, ttff_s);
    else
        printf("| time to first frame, alone | %d | 1 | n/a (%s) | | | |\n", a->ttff_tokens,
               b->timed_out[0] ? b->timed_out : "not measured");
    printf("| start-up | | | %.1f s + %.1f s | | | models loaded as the backend needs them (%s), then the scheduler "
           "ready: weights on the device, KV cache, graphs |\n",
           load_s, b->ready_s,
           a->backend == TALKER_BACKEND_CUDA ? "host parts; bf16 matrices read from the checkpoint by the upload"
                                             : "float32");
    double budget = a->utilization * b->mem_total;
    if (b->mem_ok)
        printf("| peak GPU memory (device-wide) | | | %.2f GiB | %.2f GiB budget | %.2f | plan %.2f GiB (%d rows x "
               "%d positions), %.2f GiB used after start-up |\n",
               gib(b->mem_peak_used), gib(budget), b->mem_peak_used / budget, gib((double)b->plan.total_bytes),
               b->plan.rows, b->plan.ctx, gib(b->mem_after_create));
    else
        printf("| peak GPU memory | | | n/a (%s backend) | | | plan %.2f GiB (%d rows x %d positions) |\n", be,
               gib((double)b->plan.total_bytes), b->plan.rows, b->plan.ctx);
    printf("\n");

    printf("S0BENCH kind=setup backend=%s load_s=%.3f ready_s=%.3f weight_bytes=%.0f kv_bytes_per_pos=%.0f kv_dtype=%s "
           "max_rows=%d max_ctx=%d max_batched_tokens=%d frames=%d warmup=%d\n",
           be, load_s, b->ready_s, b->weight_bytes, b->kv_bytes_per_pos, mm3_kv_cache_dtype_name(b->plan.kv_dtype), b->plan.rows,
           b->plan.ctx, a->max_batched_tokens, a->frames, a->warmup);
    printf("S0BENCH kind=copy GBps=%.2f bytes=%zu\n", b->copy_bw * 1e-9, (size_t)a->copy_mib << 20);
    for (int i = 0; i < n_results; i++) {
        struct result *r = &results[i];
        if (!r->measured) {
            printf("S0BENCH kind=skipped context=%d pairs=%d prompt_tokens=%d reason=\"%s\"\n", r->context, r->pairs,
                   r->prompt_tokens, r->reason);
            continue;
        }
        printf("S0BENCH kind=frame context=%d pairs=%d prompt_tokens=%d ms_median=%.4f ms_mean=%.4f ms_min=%.4f "
               "ms_max=%.4f steps=%d mean_pos=%.1f weight_bytes=%.0f kv_bytes=%.0f floor_ms=%.4f ratio=%.4f "
               "prefill_s=%.4f prefill_tokens=%.0f forward_ms=%.4f sample_ms=%.4f gpu_forward_ms=%.4f "
               "gpu_sample_ms=%.4f ahead_taken=%ld lora=\"%s\"%s%s%s\n",
               r->context, r->pairs, r->prompt_tokens, r->ms_median, r->ms_mean, r->ms_min, r->ms_max, r->steps,
               r->mean_pos, b->weight_bytes, r->kv_bytes, r->floor_ms, r->ms_median / r->floor_ms, r->prefill_s,
               r->prefill_tokens, r->forward_ms, r->sample_ms, r->gpu_forward_ms, r->gpu_sample_ms, r->ahead_taken,
               b->lora_label, env_label ? " env=\"" : "", env_label ? env_label : "", env_label ? "\"" : "");
    }
    if (ttff_done)
        printf("S0BENCH kind=ttff prompt_tokens=%d s=%.4f\n", ttff_prompt, ttff_s);
    else
        printf("S0BENCH kind=ttff prompt_tokens=%d reason=\"%s\"\n", a->ttff_tokens,
               b->timed_out[0] ? b->timed_out : "not measured");
    if (b->mem_ok)
        printf("S0BENCH kind=memory peak_used_bytes=%.0f after_start_bytes=%.0f plan_bytes=%zu total_bytes=%.0f "
               "utilization=%.3f budget_bytes=%.0f\n",
               b->mem_peak_used, b->mem_after_create, b->plan.total_bytes, b->mem_total, a->utilization, budget);
    else
        printf("S0BENCH kind=memory plan_bytes=%zu utilization=%.3f\n", b->plan.total_bytes, a->utilization);
}

static void skip_rest(struct bench *b, int ci, int li, const int *prompt_of_ctx)
{
    const struct args *a = b->a;
    for (int c = ci; c < a->n_contexts; c++)
        for (int l = c == ci ? li : 0; l < a->n_pairs; l++) {
            struct result *r = result_new(a->contexts[c], a->pairs[l], prompt_of_ctx[c]);
            snprintf(r->reason, sizeof r->reason, "%s", b->timed_out);
        }
}

/* One pass of the whole grid on a fresh scheduler, in the environment of the current
 * --env-sets set: 0 when it ran (failed configurations are counted in b->failures), 1 when
 * the scheduler could not start or warm up. */
static int bench_grid(struct bench *b, struct args *a, const struct sched_config *cfg, char *const *lyrics,
                      const int *prompt_of_ctx, double load_s)
{
    int rc;
    struct sched_sink sink = {
        .ctx = b, .on_start = sink_start, .on_frames = sink_frames, .on_end = sink_end, .on_abort = sink_abort};
    double t0 = now_s();
    if ((rc = sched_create(&b->s, cfg, &b->lm, &b->dd, b->tok, &sink)) < 0) {
        fprintf(stderr, "mm3-bench-stage0: sched_create: %s\n", mm3_last_error());
        return 1;
    }
    b->ready_s = now_s() - t0;
    LOG_INFO("scheduler on %s: %d rows x %d positions, %d tokens per step, decode %s, ready in %.1f s",
             a->backend == TALKER_BACKEND_CUDA ? "cuda" : "cpu", cfg->max_rows, cfg->max_ctx, cfg->max_batched_tokens,
             a->n_capture ? "in CUDA graphs" : "eager", b->ready_s);
    sample_memory(b);
    b->mem_after_create = b->mem_peak_used;

    int ttff_done = 0, ttff_prompt = 0;
    double ttff_s = 0;
    if ((rc = warm_up(b)) < 0) {
        fprintf(stderr, "mm3-bench-stage0: warm-up: %s\n", mm3_last_error());
        sched_destroy(b->s, "benchmark failed");
        return 1;
    }
    /* TTFF needs a context of exactly --ttff-tokens measured from one song alone; without
     * one, a separate request does it first. */
    int ttff_in_grid = a->pairs[0] == 1;
    int ttff_ctx = -1;
    for (int c = 0; c < a->n_contexts; c++)
        if (a->contexts[c] == a->ttff_tokens) ttff_ctx = c;
    if (!(ttff_in_grid && ttff_ctx >= 0)) {
        char *ly = NULL;
        int n = 0;
        if ((rc = prompt_for(b, a->ttff_tokens, &ly, &n)) == 0) {
            struct result tmp = {.context = a->ttff_tokens, .pairs = 1, .prompt_tokens = n};
            int save_frames = a->frames;
            a->frames = 1;
            rc = run_level(b, &tmp, ly, &ttff_done, &ttff_s);
            a->frames = save_frames;
            if (rc == 0 && !ttff_done) {
                ttff_s = b->songs[0].t_first - b->songs[0].t_submit;
                ttff_done = 1;
            }
            ttff_prompt = n;
            if (rc >= 0 && drop_all(b) < 0) rc = -EIO;
        }
        free(ly);
        if (rc < 0) {
            fprintf(stderr, "mm3-bench-stage0: time to first frame: %s\n", mm3_last_error());
            b->failures++;
            drop_all(b);
        }
    } else {
        ttff_prompt = prompt_of_ctx[ttff_ctx];
    }

    for (int c = 0; c < a->n_contexts; c++) {
        for (int l = 0; l < a->n_pairs; l++) {
            struct result *r = result_new(a->contexts[c], a->pairs[l], prompt_of_ctx[c]);
            rc = run_level(b, r, lyrics[c], &ttff_done, &ttff_s);
            if (rc == 1) { /* out of time */
                n_results--;
                skip_rest(b, c, l, prompt_of_ctx);
                c = a->n_contexts;
                break;
            }
            if (rc < 0) {
                snprintf(r->reason, sizeof r->reason, "failed: %s", mm3_last_error());
                fprintf(stderr, "mm3-bench-stage0: context %d, %d pairs: %s\n", r->context, r->pairs, mm3_last_error());
                b->failures++;
                /* The songs of this context are in an unknown state: on to the next context. */
                for (int k = l + 1; k < a->n_pairs; k++)
                    snprintf(result_new(a->contexts[c], a->pairs[k], prompt_of_ctx[c])->reason, sizeof r->reason,
                             "not run: %d pairs at this context failed", a->pairs[l]);
                break;
            }
            LOG_INFO("context %d, %d pairs: %.2f ms/frame (floor %.2f ms), prefill %.2f s", r->context, r->pairs,
                     r->ms_median, r->floor_ms, r->prefill_s);
        }
        if (drop_all(b) < 0) {
            fprintf(stderr, "mm3-bench-stage0: %s\n", mm3_last_error());
            b->failures++;
        }
    }
    print_results(b, ttff_done, ttff_s, ttff_prompt, load_s);
    sched_destroy(b->s, "benchmark done");
    return 0;
}

/* A random rank-R adapter on every linear layer of the talker, written under $TMPDIR and
 * loaded into set as "bench" (scale 1). */
static int bench_adapter(struct bench *b, const struct args *a, int rank, struct talker_lora_set *set)
{
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/mm3-bench-lora-r%d", tmp && tmp[0] ? tmp : "/tmp", rank);
    const struct ckpt_gen_lora_opts o = {.component = "language_model", .rank = rank, .alpha = 2.0 * rank, .seed = 5};
    int rc = ckpt_gen_lora_write(dir, a->ckpt, &o);
    if (rc == 0) rc = talker_lora_set_add(set, &b->lm.cfg, "bench", dir, 1.0);
    return rc;
}

int main(int argc, char **argv)
{
    mm3_log_set_tag("bench-s0");
    struct args a;
    static struct env_sets sets; /* static: its saved start values stay reachable to the end */
    if (parse_args(argc, argv, &a) < 0 || parse_env_sets(a.env_sets, &sets) < 0) {
        fprintf(stderr, "mm3-bench-stage0: %s\n", mm3_last_error());
        usage(stderr);
        return 2;
    }
    if (!talker_backend_available(a.backend)) {
        printf("mm3-bench-stage0: no CUDA device (or built without CUDA); --backend cpu runs on the CPU\n");
        return 77;
    }
    static struct bench b;
    b.a = &a;
    b.t_start = now_s();
    int rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", a.ckpt);
    double t0 = now_s();
    if ((rc = tokenizer_load(&b.tok, path)) < 0 || (rc = talker_backend_load_models(a.backend, a.ckpt, &b.lm, &b.dd)) < 0) {
        fprintf(stderr, "mm3-bench-stage0: %s\n", mm3_last_error());
        return 1;
    }
    double load_s = now_s() - t0;
    LOG_INFO("checkpoint %s loaded in %.1f s", a.ckpt, load_s);

    /* Before the scheduler allocates anything: the copy buffers must not count in its peak. */
    if ((rc = copy_bandwidth(a.backend, (size_t)a.copy_mib << 20, &b.copy_bw)) < 0) {
        fprintf(stderr, "mm3-bench-stage0: copy bandwidth: %s\n", mm3_last_error());
        return 1;
    }
    LOG_INFO("copy bandwidth %.1f GB/s", b.copy_bw * 1e-9);

    /* Prompts first: their lengths size max_model_len. */
    char *lyrics[MAX_LIST] = {0};
    int prompt_of_ctx[MAX_LIST] = {0};
    for (int c = 0; c < a.n_contexts; c++)
        if ((rc = prompt_for(&b, a.contexts[c], &lyrics[c], &prompt_of_ctx[c])) < 0) {
            fprintf(stderr, "mm3-bench-stage0: prompt of %d tokens: %s\n", a.contexts[c], mm3_last_error());
            return 1;
        }
    int max_pairs = a.pairs[a.n_pairs - 1], max_prompt = 0;
    for (int c = 0; c < a.n_contexts; c++)
        max_prompt = prompt_of_ctx[c] > max_prompt ? prompt_of_ctx[c] : max_prompt;
    /* Room for every frame the first song of a context can make: the steps of every
     * prefill (one chunk of max_batched_tokens each at worst) and of every timed phase. */
    long steps = 0;
    for (int l = 0; l < a.n_pairs; l++)
        steps += a.warmup + a.frames + 4;
    steps += 2L * max_pairs * max_prompt / a.max_batched_tokens + 2L * a.n_pairs + 16;
    int max_ctx = (int)(max_prompt + steps + 64);

    talker_backend_plan_compute_kv(a.backend, a.kv_dtype, &b.lm, &b.dd, 2 * max_pairs, max_ctx, &b.plan);
    struct talker_backend_plan one;
    talker_backend_plan_compute_kv(a.backend, a.kv_dtype, &b.lm, &b.dd, 1, 1, &one);
    b.kv_bytes_per_pos = (double)one.kv_bytes_per_row;
    b.weight_bytes = frame_weight_bytes(a.backend, &b.lm, &b.dd);
    if ((rc = talker_backend_plan_check(a.backend, &b.plan, a.utilization)) < 0) {
        fprintf(stderr, "mm3-bench-stage0: %s\n", mm3_last_error());
        return 1;
    }
    struct sched_config cfg = {.max_rows = 2 * max_pairs,
                               .max_ctx = max_ctx,
                               .max_batched_tokens = a.max_batched_tokens,
                               .max_queue = max_pairs + 1,
                               .backend = a.backend,
                               .kv_dtype = a.kv_dtype,
                               .n_capture_sizes = a.n_capture,
                               .capture_sizes = a.capture,
                               .graph_warmups = 1};
    for (int k = 0; k < sets.n; k++) {
        if (a.env_sets) {
            if ((rc = env_sets_apply(&sets, k)) < 0) {
                fprintf(stderr, "mm3-bench-stage0: %s\n", mm3_last_error());
                return 1;
            }
            env_label = sets.label[k];
            char effective[sizeof sets.label];
            env_sets_effective(&sets, effective, sizeof effective);
            printf("\n# Environment set %d of %d: %s (in effect: %s)\n", k + 1, sets.n,
                   env_label[0] ? env_label : "nothing set", effective);
            printf("S0BENCH kind=set index=%d env=\"%s\" effective=\"%s\"\n", k, env_label, effective);
            fflush(stdout);
        }
        /* The plain grid, then per --lora rank: the adapter (made and loaded once) unused, then used. */
        struct talker_lora_set set = {0};
        for (int v = 0; v < 1 + 2 * a.n_lora_ranks; v++) {
            b.lora_songs = v > 0 ? (v - 1) % 2 : 0;
            b.lora_label[0] = 0;
            cfg.lora = NULL;
            if (v > 0) {
                int rank = a.lora_ranks[(v - 1) / 2];
                snprintf(b.lora_label, sizeof b.lora_label, "rank-%d adapter loaded, %s", rank,
                         b.lora_songs ? "used by the first song" : "used by no song");
                if (!b.lora_songs && (rc = bench_adapter(&b, &a, rank, &set)) < 0) {
                    fprintf(stderr, "mm3-bench-stage0: --lora %d: %s\n", rank, mm3_last_error());
                    return 1;
                }
                cfg.lora = &set;
            }
            n_results = 0;
            b.mem_peak_used = 0;
            rc = bench_grid(&b, &a, &cfg, lyrics, prompt_of_ctx, load_s);
            if (b.lora_songs) talker_lora_set_free(&set);
            if (rc) return 1;
        }
    }
    for (int c = 0; c < a.n_contexts; c++)
        free(lyrics[c]);
    talker_free(&b.lm);
    depth_free(&b.dd);
    tokenizer_free(b.tok);
    if (a.backend == TALKER_BACKEND_CPU) {
        struct rusage ru;
        if (getrusage(RUSAGE_SELF, &ru) == 0) LOG_INFO("peak host memory %.1f MiB", ru.ru_maxrss / 1024.0);
    }
    return b.failures ? 1 : 0;
}
