/* The GPU sampler (common/cuda/sampler_cuda.h) against the CPU one (common/sampler.h):
 * the same guided logits bit for bit and the same drawn column, on random rows of
 * several widths and pair counts, with ties at the thresholds, NaN, +-inf, all-equal
 * and coarsely quantised rows, guidance on and off, both rules, the stop mask, top_k
 * below, at and above n; a graph-captured call; many random draws counting
 * mismatches; the Gumbel noise itself against glibc's; and the time per call.
 *
 * The seed comes from the clock (MM3_TEST_SEED replays one). MM3_SAMPLER_DRAWS sets
 * the number of rows of the many-draws test (default 12288), MM3_TEST_FILTER picks
 * tests by name (cmocka_set_test_filter). Exit 77 (skip) without
 * CUDA compiled in or without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above */
#include <cmocka.h>

#include <float.h>
#include <gnu/libc-version.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/sampler.h"
#include "support/test_rand.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "common/cuda/sampler_cuda.h"

static uint64_t rng;

static int rnd_int(int n)
{
    return (int)(test_rand_next(&rng) % (uint64_t)n);
}

/* Uniform in [-a, a). */
static float rnd(float a)
{
    return a * (float)((double)(test_rand_next(&rng) >> 11) * 0x1p-52 - 1.0);
}

/* One call's inputs on the host. */
struct batch {
    int n, ld, n_pairs, c0_rule, top_k;
    float *logits; /* [n_pairs][2][ld] */
    float *scale;
    uint64_t *seed;
    uint32_t *pos;
    unsigned char *mask; /* NULL or [n_pairs] */
};

enum fill { FILL_UNIFORM, FILL_QUANT, FILL_EQUAL, FILL_SPECIAL, FILL_NAN_HEAVY, FILL_TOP_NAN, FILL_COUNT };
static const char *const fill_name[FILL_COUNT] = {"uniform", "quantised", "all-equal",
                                                  "special", "nan-heavy", "top-k-nan"};

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The k-th largest finite-or-inf value of x[n] (NaN ignored), or 0 when none. */
static float kth_value(const float *x, int n, int k)
{
    float *t = malloc(sizeof(float) * (size_t)n);
    assert_non_null(t);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i])) t[m++] = x[i];
    float v = 0.0f;
    if (m > 0) {
        qsort(t, (size_t)m, sizeof(float), cmp_desc);
        v = t[(k < 1 ? 1 : k > m ? m : k) - 1];
    }
    free(t);
    return v;
}

/* A conditional / unconditional row pair; u stays near c, as in the model. */
static void fill_pair(float *c, float *u, int n, int top_k, enum fill kind)
{
    switch (kind) {
    case FILL_UNIFORM:
        for (int i = 0; i < n; i++) {
            c[i] = rnd(8.0f);
            u[i] = c[i] + rnd(1.0f);
        }
        break;
    case FILL_QUANT: /* a coarse grid: ties everywhere, at every threshold */
        for (int i = 0; i < n; i++) {
            c[i] = (float)rnd_int(13) * 0.25f - 1.5f;
            u[i] = c[i] + (float)(rnd_int(3) - 1) * 0.25f;
        }
        break;
    case FILL_EQUAL: {
        float a = rnd(4.0f), b = rnd(4.0f);
        for (int i = 0; i < n; i++) {
            c[i] = a;
            u[i] = b;
        }
        break;
    }
    case FILL_SPECIAL: {
        fill_pair(c, u, n, top_k, FILL_UNIFORM);
        /* Ties at the conditional threshold, and equal (c, u) pairs: ties in g. */
        float t = kth_value(c, n, top_k);
        int j = rnd_int(n);
        for (int r = 0; r < 4; r++) {
            int i = rnd_int(n), m = rnd_int(n);
            c[i] = t;
            c[m] = c[j];
            u[m] = u[j];
        }
        static const float special[6] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f};
        for (int r = 0; r < 6; r++) {
            float *row = rnd_int(2) ? c : u;
            row[rnd_int(n)] = special[rnd_int(6)];
        }
        if (rnd_int(3) == 0) c[0] = special[rnd_int(4)];
        break;
    }
    case FILL_NAN_HEAVY: /* more NaNs than top_k: the c0 threshold itself is NaN */
        fill_pair(c, u, n, top_k, FILL_UNIFORM);
        for (int r = 0; r < n / 3 + 1; r++) {
            int i = rnd_int(n);
            if (rnd_int(2))
                c[i] = NAN;
            else
                u[i] = rnd_int(2) ? INFINITY : -INFINITY;
        }
        break;
    case FILL_TOP_NAN: { /* half the conditional top k guide to NaN (inf - inf): fewer
                            than k finite values survive the c0 mask */
        fill_pair(c, u, n, top_k, FILL_UNIFORM);
        const float t = kth_value(c, n, top_k);
        for (int i = 0; i < n; i++)
            if (c[i] >= t && rnd_int(2)) u[i] = INFINITY;
        break;
    }
    default:
        fail();
    }
}

static const float scales[] = {1.5f, 1.0f, 0.5f, 3.0f, 1.5f, 1.0000001f};

static struct batch *batch_new(int n, int ld, int n_pairs, int c0_rule, int top_k, int with_mask, int fill)
{
    struct batch *b = calloc(1, sizeof *b);
    assert_non_null(b);
    *b = (struct batch){.n = n, .ld = ld, .n_pairs = n_pairs, .c0_rule = c0_rule, .top_k = top_k};
    b->logits = malloc(sizeof(float) * 2 * (size_t)ld * (size_t)n_pairs);
    b->scale = malloc(sizeof(float) * (size_t)n_pairs);
    b->seed = malloc(sizeof(uint64_t) * (size_t)n_pairs);
    b->pos = malloc(sizeof(uint32_t) * (size_t)n_pairs);
    assert_true(b->logits && b->scale && b->seed && b->pos);
    if (with_mask) {
        b->mask = malloc((size_t)n_pairs);
        assert_non_null(b->mask);
    }
    for (int p = 0; p < n_pairs; p++) {
        float *c = b->logits + (size_t)2 * p * ld, *u = c + ld;
        fill_pair(c, u, n, top_k, fill >= 0 ? (enum fill)fill : (enum fill)rnd_int(FILL_COUNT));
        for (int i = n; i < ld; i++) /* padding the kernel must never read */
            c[i] = u[i] = NAN;
        b->scale[p] = scales[rnd_int((int)(sizeof scales / sizeof scales[0]))];
        /* Derived seeds have 31 bits; raw 64-bit ones exercise the high word. */
        b->seed[p] = rnd_int(2) ? (test_rand_next(&rng) & 0x7FFFFFFFu) : test_rand_next(&rng);
        b->pos[p] = rnd_int(2) ? (uint32_t)rnd_int(9000 * 8) : (uint32_t)test_rand_next(&rng);
        if (b->mask) b->mask[p] = rnd_int(4) == 0;
    }
    return b;
}

static void batch_free(struct batch *b)
{
    free(b->logits);
    free(b->scale);
    free(b->seed);
    free(b->pos);
    free(b->mask);
    free(b);
}

/* The batch on the device. */
struct dev_batch {
    float *logits, *scale, *guided;
    uint64_t *seed;
    uint32_t *pos;
    unsigned char *mask;
    int *cols;
};

static void *dev_upload(const void *host, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(cuda_malloc(&d, bytes ? bytes : 4), 0);
    if (bytes) assert_int_equal(cuda_memcpy_h2d(d, host, bytes), 0);
    return d;
}

static void dev_batch_upload(struct dev_batch *d, const struct batch *b, int with_guided)
{
    size_t np = (size_t)b->n_pairs;
    d->logits = dev_upload(b->logits, sizeof(float) * 2 * (size_t)b->ld * np);
    d->scale = dev_upload(b->scale, sizeof(float) * np);
    d->seed = dev_upload(b->seed, sizeof(uint64_t) * np);
    d->pos = dev_upload(b->pos, sizeof(uint32_t) * np);
    d->mask = b->mask ? dev_upload(b->mask, np) : NULL;
    d->cols = NULL;
    d->guided = NULL;
    assert_int_equal(cuda_malloc((void **)&d->cols, sizeof(int) * np), 0);
    assert_int_equal(cuda_memset(d->cols, 0xff, sizeof(int) * np), 0);
    if (with_guided) {
        size_t bytes = sizeof(float) * (size_t)b->n * np;
        assert_int_equal(cuda_malloc((void **)&d->guided, bytes), 0);
        assert_int_equal(cuda_memset(d->guided, 0x7f, bytes), 0);
    }
}

static void dev_batch_free(struct dev_batch *d)
{
    cuda_free(d->logits);
    cuda_free(d->scale);
    cuda_free(d->seed);
    cuda_free(d->pos);
    cuda_free(d->mask);
    cuda_free(d->cols);
    cuda_free(d->guided);
}

static int dev_draw(const struct dev_batch *d, const struct batch *b, void *stream)
{
    const struct cuda_sampler_pairs draw = {.logits = d->logits,
                                            .ld = b->ld,
                                            .n = b->n,
                                            .n_pairs = b->n_pairs,
                                            .scale = d->scale,
                                            .c0_rule = b->c0_rule,
                                            .top_k = b->top_k,
                                            .seed = d->seed,
                                            .pos = d->pos,
                                            .mask_col0 = d->mask,
                                            .col_out = d->cols,
                                            .guided_out = d->guided};
    return cuda_sampler_draw_pairs(&draw, stream);
}

/* Run on the GPU; cols[n_pairs] and, when guided != NULL, guided[n_pairs * n]. */
static void gpu_run(const struct batch *b, int *cols, float *guided)
{
    struct dev_batch d;
    dev_batch_upload(&d, b, guided != NULL);
    int rc = dev_draw(&d, b, NULL);
    if (rc < 0) fail_msg("cuda_sampler_draw_pairs: %s", mm3_last_error());
    assert_int_equal(cuda_stream_sync(NULL), 0);
    assert_int_equal(cuda_memcpy_d2h(cols, d.cols, sizeof(int) * (size_t)b->n_pairs), 0);
    if (guided)
        assert_int_equal(cuda_memcpy_d2h(guided, d.guided, sizeof(float) * (size_t)b->n * (size_t)b->n_pairs), 0);
    dev_batch_free(&d);
}

/* The CPU rule the kernel implements, from common/sampler.h and stage0/generate.c. */
static int cpu_ref(const struct batch *b, int p, float *g)
{
    const float *c = b->logits + (size_t)2 * p * b->ld, *u = c + b->ld;
    int n = b->n;
    if (b->scale[p] > 1.0f) {
        if (b->c0_rule)
            sampler_c0_guide(g, c, u, n, b->scale[p], b->top_k);
        else
            sampler_cfg_blend(g, c, u, n, b->scale[p]);
    } else {
        memcpy(g, c, sizeof(float) * (size_t)n);
        if (b->c0_rule) sampler_topk_mask(g, n, b->top_k);
    }
    if (b->mask && b->mask[p]) g[0] = -INFINITY;
    return sampler_draw_gumbel(b->seed[p], g, n, b->top_k, b->pos[p]);
}

/* The CPU reference over pairs [p0, p1) of a batch, for a worker thread. */
struct ref_job {
    const struct batch *b;
    int p0, p1;
    int *cols;
    float *guided; /* NULL or [n_pairs * n] */
};

static void *ref_worker(void *arg)
{
    struct ref_job *j = arg;
    float *g = malloc(sizeof(float) * (size_t)j->b->n);
    if (!g) return NULL;
    for (int p = j->p0; p < j->p1; p++) {
        float *out = j->guided ? j->guided + (size_t)p * j->b->n : g;
        j->cols[p] = cpu_ref(j->b, p, out);
    }
    free(g);
    return j;
}

static int n_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 32 ? 32 : (int)n;
}

static void cpu_run(const struct batch *b, int *cols, float *guided)
{
    enum { MAX_THREADS = 32 };
    pthread_t th[MAX_THREADS];
    struct ref_job jobs[MAX_THREADS];
    int nt = n_threads();
    if (nt > b->n_pairs) nt = b->n_pairs;
    for (int t = 0; t < nt; t++) {
        jobs[t] =
            (struct ref_job){b, (int)((long)b->n_pairs * t / nt), (int)((long)b->n_pairs * (t + 1) / nt), cols, guided};
        assert_int_equal(pthread_create(&th[t], NULL, ref_worker, &jobs[t]), 0);
    }
    for (int t = 0; t < nt; t++) {
        void *r = NULL;
        assert_int_equal(pthread_join(th[t], &r), 0);
        assert_non_null(r);
    }
}

/* Bitwise, except that any NaN equals any NaN (payloads differ between x86 and the GPU). */
static int same_float(float a, float b)
{
    if (isnan(a) && isnan(b)) return 1;
    uint32_t x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    return x == y;
}

/* GPU vs CPU on one batch; fails with the case described. The GPU runs twice: with
 * the guided rows asked for (every column guided) and without (the c0 rule guides only
 * the conditional row's top k where it can): both must draw the CPU's columns. */
static void check_batch(const struct batch *b, const char *what)
{
    size_t np = (size_t)b->n_pairs, n = (size_t)b->n;
    int *gc = malloc(sizeof(int) * np), *cc = malloc(sizeof(int) * np), *gc_lean = malloc(sizeof(int) * np);
    float *gg = malloc(sizeof(float) * n * np), *cg = malloc(sizeof(float) * n * np);
    assert_true(gc && cc && gc_lean && gg && cg);
    gpu_run(b, gc, gg);
    gpu_run(b, gc_lean, NULL);
    cpu_run(b, cc, cg);
    for (size_t p = 0; p < np; p++) {
        if (gc_lean[p] != cc[p])
            fail_msg("%s: n %d k %d c0_rule %d pair %zu (scale %g, mask %d, seed %llu, pos %u): drew gpu %d "
                     "(without the guided rows) cpu %d",
                     what, b->n, b->top_k, b->c0_rule, p, (double)b->scale[p], b->mask ? b->mask[p] : -1,
                     (unsigned long long)b->seed[p], b->pos[p], gc_lean[p], cc[p]);
        for (size_t i = 0; i < n; i++)
            if (!same_float(gg[p * n + i], cg[p * n + i]))
                fail_msg("%s: n %d k %d c0_rule %d pair %zu (scale %g, mask %d) column %zu: guided gpu %a cpu %a", what,
                         b->n, b->top_k, b->c0_rule, p, (double)b->scale[p], b->mask ? b->mask[p] : -1, i,
                         (double)gg[p * n + i], (double)cg[p * n + i]);
        if (gc[p] != cc[p])
            fail_msg("%s: n %d k %d c0_rule %d pair %zu (scale %g, mask %d, seed %llu, pos %u): drew gpu %d cpu %d",
                     what, b->n, b->top_k, b->c0_rule, p, (double)b->scale[p], b->mask ? b->mask[p] : -1,
                     (unsigned long long)b->seed[p], b->pos[p], gc[p], cc[p]);
    }
    free(gc);
    free(cc);
    free(gc_lean);
    free(gg);
    free(cg);
}

/* First: a captured call must work before anything else has run in the process. */
static void test_graph_capture(void **state)
{
    (void)state;
    struct batch *b = batch_new(SAMPLER_C0_COLS, SAMPLER_C0_COLS, 4, 1, SAMPLER_TOP_K, 1, FILL_UNIFORM);
    struct dev_batch d;
    dev_batch_upload(&d, b, 1);
    void *stream = NULL, *graph = NULL;
    assert_int_equal(cuda_stream_create(&stream), 0);
    assert_int_equal(cuda_graph_capture_begin(stream), 0);
    int rc = dev_draw(&d, b, stream);
    if (rc < 0) fail_msg("draw during capture: %s", mm3_last_error());
    assert_int_equal(cuda_graph_capture_end(stream, &graph), 0);
    /* Captured, not run: the columns are still the poison. */
    int got[4], want[4];
    assert_int_equal(cuda_memcpy_d2h(got, d.cols, sizeof got), 0);
    for (int p = 0; p < 4; p++)
        assert_int_equal(got[p], -1);
    assert_int_equal(cuda_graph_launch(graph, stream), 0);
    assert_int_equal(cuda_stream_sync(stream), 0);
    assert_int_equal(cuda_memcpy_d2h(got, d.cols, sizeof got), 0);
    cpu_run(b, want, NULL);
    for (int p = 0; p < 4; p++)
        assert_int_equal(got[p], want[p]);
    cuda_graph_destroy(graph);
    cuda_stream_destroy(stream);
    dev_batch_free(&d);
    batch_free(b);
}

static void test_bad_args(void **state)
{
    (void)state;
    float *dl = NULL, *ds = NULL;
    uint64_t *dseed = NULL;
    uint32_t *dpos = NULL;
    int *dcol = NULL;
    assert_int_equal(cuda_malloc((void **)&dl, sizeof(float) * 64), 0);
    assert_int_equal(cuda_malloc((void **)&ds, sizeof(float)), 0);
    assert_int_equal(cuda_malloc((void **)&dseed, sizeof(uint64_t)), 0);
    assert_int_equal(cuda_malloc((void **)&dpos, sizeof(uint32_t)), 0);
    assert_int_equal(cuda_malloc((void **)&dcol, sizeof(int)), 0);
    const struct cuda_sampler_pairs good = {.logits = dl,
                                            .ld = 16,
                                            .n = 16,
                                            .n_pairs = 1,
                                            .scale = ds,
                                            .top_k = 50,
                                            .seed = dseed,
                                            .pos = dpos,
                                            .col_out = dcol};
    struct cuda_sampler_pairs bad = good;
    bad.n = 0;
    assert_int_equal(cuda_sampler_draw_pairs(&bad, NULL), -EINVAL);
    bad = good, bad.ld = 15;
    assert_int_equal(cuda_sampler_draw_pairs(&bad, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "ld >= n"));
    bad = good, bad.n_pairs = -1;
    assert_int_equal(cuda_sampler_draw_pairs(&bad, NULL), -EINVAL);
    bad = good, bad.pos = NULL;
    assert_int_equal(cuda_sampler_draw_pairs(&bad, NULL), -EINVAL);
    int max = cuda_sampler_max_cols();
    printf("  max columns per row: %d\n", max);
    assert_true(max >= SAMPLER_C0_COLS);
    bad = good, bad.ld = bad.n = max + 1;
    assert_int_equal(cuda_sampler_draw_pairs(&bad, NULL), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "at most"));
    /* No pairs: nothing to do, nothing touched (even NULL buffers). */
    const struct cuda_sampler_pairs none = {.ld = 16, .n = 16, .top_k = 50};
    assert_int_equal(cuda_sampler_draw_pairs(&none, NULL), 0);
    assert_int_equal(cuda_sampler_gumbel(NULL, 1, 2, 3, -1, NULL), -EINVAL);
    cuda_free(dl);
    cuda_free(ds);
    cuda_free(dseed);
    cuda_free(dpos);
    cuda_free(dcol);
}

/* Every filler at every shape: widths from 1 to the c0 width, top_k below, at and
 * above n and off, both rules, padded rows, with and without the stop mask. */
static void test_shapes(void **state)
{
    (void)state;
    static const int widths[] = {1, 2, 50, 100, 1024, 3001, SAMPLER_C0_COLS};
    char what[96];
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        int n = widths[w];
        const int ks[] = {SAMPLER_TOP_K, 1, n - 1, n, n + 7, 0};
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            for (int c0_rule = 0; c0_rule < 2; c0_rule++) {
                for (int fill = 0; fill < FILL_COUNT; fill++) {
                    int n_pairs = 1 + rnd_int(8), ld = n + (rnd_int(2) ? 0 : 1 + rnd_int(9));
                    struct batch *b = batch_new(n, ld, n_pairs, c0_rule, ks[ki], rnd_int(2), fill);
                    snprintf(what, sizeof what, "%s rows, ld %d, %d pairs", fill_name[fill], ld, n_pairs);
                    check_batch(b, what);
                    batch_free(b);
                }
            }
        }
    }
}

/* The shapes stage 0 uses, many pairs per launch. */
static void test_release_batches(void **state)
{
    (void)state;
    struct batch *b = batch_new(SAMPLER_C0_COLS, SAMPLER_C0_COLS, 64, 1, SAMPLER_TOP_K, 1, -1);
    check_batch(b, "c0, 64 mixed pairs");
    batch_free(b);
    b = batch_new(1024, 1024, 256, 0, SAMPLER_TOP_K, 0, -1);
    check_batch(b, "depth, 256 mixed pairs");
    batch_free(b);
}

/* Random realistic rows: how often does the GPU draw another column than the CPU? */
static void test_many_draws(void **state)
{
    (void)state;
    const char *env = getenv("MM3_SAMPLER_DRAWS");
    long total = env ? strtol(env, NULL, 10) : 12288;
    if (total < 16) total = 16;
    /* Every 8th row at the c0 width with the c0 rule, the others depth rows. */
    long rows[2] = {total / 8, total - total / 8};
    const int widths[2] = {SAMPLER_C0_COLS, 1024}, rules[2] = {1, 0};
    long mismatches = 0;
    for (int kind = 0; kind < 2; kind++) {
        for (long done = 0; done < rows[kind];) {
            int chunk = (int)(rows[kind] - done < 1024 ? rows[kind] - done : 1024);
            struct batch *b = batch_new(widths[kind], widths[kind], chunk, rules[kind], SAMPLER_TOP_K, 0, FILL_UNIFORM);
            for (int p = 0; p < chunk; p++)
                b->scale[p] = SAMPLER_CFG_SCALE;
            int *gc = malloc(sizeof(int) * (size_t)chunk), *cc = malloc(sizeof(int) * (size_t)chunk);
            assert_true(gc && cc);
            gpu_run(b, gc, NULL);
            cpu_run(b, cc, NULL);
            for (int p = 0; p < chunk; p++) {
                if (gc[p] == cc[p]) continue;
                if (++mismatches <= 5)
                    printf("  mismatch: n %d seed %llu pos %u: gpu %d cpu %d\n", b->n, (unsigned long long)b->seed[p],
                           b->pos[p], gc[p], cc[p]);
            }
            free(gc);
            free(cc);
            batch_free(b);
            done += chunk;
        }
    }
    printf("  %ld of %ld draws differ (%ld rows of %d columns, %ld of %d)\n", mismatches, total, rows[0], widths[0],
           rows[1], widths[1]);
    assert_int_equal(mismatches, 0);
}

/* The noise itself: CUDA's double log against glibc's. Differences are rounding
 * only: within a few ulp of the noise (absolute near 0, where -log(-lu) cancels). */
static void test_gumbel_noise(void **state)
{
    (void)state;
    enum { COLS = 1 << 16, ROUNDS = 128 };
    double *d = NULL, *h = malloc(sizeof(double) * COLS);
    assert_non_null(h);
    assert_int_equal(cuda_malloc((void **)&d, sizeof(double) * COLS), 0);
    long differ = 0;
    double worst = 0.0;
    for (int r = 0; r < ROUNDS; r++) {
        uint64_t seed = r == 0 ? 1153769322u : test_rand_next(&rng);
        uint32_t pos = r == 0 ? 0 : (uint32_t)test_rand_next(&rng), col0 = r == 0 ? 0 : (uint32_t)test_rand_next(&rng);
        assert_int_equal(cuda_sampler_gumbel(d, seed, pos, col0, COLS, NULL), 0);
        assert_int_equal(cuda_stream_sync(NULL), 0);
        assert_int_equal(cuda_memcpy_d2h(h, d, sizeof(double) * COLS), 0);
        if (r == 0) /* the published vector of docs/model.md §5 */
            assert_true(fabs(h[0] - 0.13685856399176435) <= 1e-15 && fabs(h[3] - 3.0455076122592826) <= 1e-15);
        for (int i = 0; i < COLS; i++) {
            double want = sampler_gumbel(seed, pos, col0 + (uint32_t)i);
            if (h[i] == want) continue;
            differ++;
            double err = fabs(h[i] - want) / fmax(1.0, fabs(want));
            if (err > worst) worst = err;
            if (!(err <= 8 * DBL_EPSILON))
                fail_msg("gumbel(seed %llu, pos %u, col %u): gpu %.17g cpu %.17g", (unsigned long long)seed, pos,
                         col0 + (uint32_t)i, h[i], want);
        }
    }
    printf("  gumbel noise: %ld of %d values differ from glibc %s (worst %.2g relative)\n", differ, COLS * ROUNDS,
           gnu_get_libc_version(), worst);
    cuda_free(d);
    free(h);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median time of one call (CUDA events around it), after a warm-up; the last
 * draws are checked against the CPU so the timed work is the real one. */
static void time_case(int n, int n_pairs, int c0_rule)
{
    enum { WARM = 10, RUNS = 100 };
    struct batch *b = batch_new(n, n, n_pairs, c0_rule, SAMPLER_TOP_K, 0, FILL_UNIFORM);
    for (int p = 0; p < n_pairs; p++)
        b->scale[p] = SAMPLER_CFG_SCALE;
    struct dev_batch d;
    dev_batch_upload(&d, b, 0);
    void *stream = NULL, *e0 = NULL, *e1 = NULL;
    assert_int_equal(cuda_stream_create(&stream), 0);
    assert_int_equal(cuda_event_create(&e0), 0);
    assert_int_equal(cuda_event_create(&e1), 0);
    float ms[RUNS];
    for (int r = 0; r < WARM + RUNS; r++) {
        assert_int_equal(cuda_event_record(e0, stream), 0);
        assert_int_equal(dev_draw(&d, b, stream), 0);
        assert_int_equal(cuda_event_record(e1, stream), 0);
        float t = 0.0f;
        assert_int_equal(cuda_event_elapsed_ms(&t, e0, e1), 0);
        if (r >= WARM) ms[r - WARM] = t;
    }
    qsort(ms, RUNS, sizeof(float), cmp_float);
    /* In a graph (as the frame step runs it): no launch overhead, kernel after kernel. */
    enum { PER_GRAPH = 20, REPLAYS = 10 };
    void *graph = NULL;
    assert_int_equal(cuda_graph_capture_begin(stream), 0);
    for (int r = 0; r < PER_GRAPH; r++)
        assert_int_equal(dev_draw(&d, b, stream), 0);
    assert_int_equal(cuda_graph_capture_end(stream, &graph), 0);
    assert_int_equal(cuda_graph_launch(graph, stream), 0);
    float graph_ms = 0.0f;
    assert_int_equal(cuda_event_record(e0, stream), 0);
    for (int r = 0; r < REPLAYS; r++)
        assert_int_equal(cuda_graph_launch(graph, stream), 0);
    assert_int_equal(cuda_event_record(e1, stream), 0);
    assert_int_equal(cuda_event_elapsed_ms(&graph_ms, e0, e1), 0);
    cuda_graph_destroy(graph);
    int *gc = malloc(sizeof(int) * (size_t)n_pairs), *cc = malloc(sizeof(int) * (size_t)n_pairs);
    assert_true(gc && cc);
    assert_int_equal(cuda_stream_sync(stream), 0);
    assert_int_equal(cuda_memcpy_d2h(gc, d.cols, sizeof(int) * (size_t)n_pairs), 0);
    cpu_run(b, cc, NULL);
    for (int p = 0; p < n_pairs; p++)
        assert_int_equal(gc[p], cc[p]);
    printf("  n %5d, %d pair%s, %s rule: one launch median %.1f us (min %.1f, p90 %.1f); in a graph %.1f us"
           " per call\n",
           n, n_pairs, n_pairs == 1 ? " " : "s", c0_rule ? "c0   " : "depth", 1e3 * ms[RUNS / 2], 1e3 * ms[0],
           1e3 * ms[RUNS * 9 / 10], 1e3 * graph_ms / (PER_GRAPH * REPLAYS));
    free(gc);
    free(cc);
    cuda_event_destroy(e0);
    cuda_event_destroy(e1);
    cuda_stream_destroy(stream);
    dev_batch_free(&d);
    batch_free(b);
}

static void test_timing(void **state)
{
    (void)state;
    time_case(SAMPLER_C0_COLS, 1, 1);
    time_case(SAMPLER_C0_COLS, 8, 1);
    time_case(1024, 1, 0);
    time_case(1024, 8, 0);
}

int main(void)
{
    if (cuda_device_count_safe() < 1) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *seed_env = getenv("MM3_TEST_SEED");
    rng = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("seed %llu (MM3_TEST_SEED to replay)\n", (unsigned long long)rng);
    char desc[160];
    if (cuda_device_describe(desc, sizeof desc) == 0) printf("device: %s\n", desc);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_capture),   cmocka_unit_test(test_bad_args),   cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_release_batches), cmocka_unit_test(test_many_draws), cmocka_unit_test(test_gumbel_noise),
        cmocka_unit_test(test_timing),
    };
    /* One test alone (e.g. under compute-sanitizer): MM3_TEST_FILTER=test_graph_capture */
    const char *filter = getenv("MM3_TEST_FILTER");
    if (filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
    printf("built without CUDA (MM3_HAVE_CUDA undefined): skipped\n");
    return 77;
}

#endif
