/* generate_sample_batch (one sampling step for many requests) and
 * generate_decode_batch (the forward and that step in one backend call) against the
 * per-request generate_sample loop, on tiny-a, songs run in lockstep:
 *
 *   - CPU: a backend whose sample_pairs is a host reference of the contract in
 *     stage0/model/talker_backend.h (built here from the CPU entries and common/sampler.h),
 *     so the batching in generate.c (packing, chunks of depth_rows / 2 pairs, stop,
 *     budget, frame hooks, feedback, requests it must leave to the loop) is checked
 *     in CI: same codes, frames and stops bit for bit.
 *   - CUDA (skipped without a GPU): the real batched GPU step against the CPU loop on
 *     the same hidden pairs (copied from the CPU side before every step, so only the
 *     sampling step is compared): same codes and stops, frames and feedback within
 *     1e-5 rel; with and without chunking. And the scheduler's GPU setup (CUDA graphs
 *     for the decode forwards + batched sampling) against the eager GPU forward with
 *     per-request sampling: the same songs.
 *
 * Five songs start on consecutive steps with prompts of different lengths (every pair
 * at its own draw positions), one with guidance off, one with ignore_stop and a short
 * budget, one with an on_draw hook (never batched), one with a minimum length equal to the
 * frame it stops at (the stop is masked up to that draw and allowed at it, on both paths). The stop column's head row is a
 * scaled copy of a code's row the model draws, so stops happen (mid-song, and before
 * the first frame: an error both paths must report alike). */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/sampler.h"
#include "stage0/generate.h"
#include "support/test_stage0.h"
#include "support/test_support.h"

#define N_SONGS 5
#define MAX_FRAMES 24
#define MAX_PROMPT (6 + N_SONGS)
#define FRAME_TOL 1e-5
#ifndef STOP_BOOST
#define STOP_BOOST 4.0f /* a power of two: the row stays exactly bf16, as the GPU holds it */
#endif
#define STOP_AT 6

struct spec {
    uint64_t seed;
    float cfg;
    int ignore_stop, max_frames, hook, min_frames;
};

static const struct spec k_specs[N_SONGS] = {
    {11, 1.5f, 0, MAX_FRAMES, 0, 8}, {12, 1.5f, 1, 9, 0, 0}, {13, 1.0f, 0, MAX_FRAMES, 0, 0}, {14, 1.5f, 0, MAX_FRAMES, 1, 0},
    {15, 2.5f, 0, MAX_FRAMES - 5, 0, 0},
};

static const int32_t k_prompt[2][6] = {
    {151644, 151671, 64, 65, 151645, 151669},
    {151644, 151654, 151654, 151654, 151645, 151669},
};

/* Song i: the base pair with i extra tokens before the last two. */
static int song_prompt(int i, int32_t *ids)
{
    int P = 6 + i;
    for (int r = 0; r < 2; r++) {
        int32_t *row = ids + (size_t)r * P, k = 0;
        for (int t = 0; t < 4; t++)
            row[k++] = k_prompt[r][t];
        for (int t = 0; t < i; t++)
            row[k++] = r == 0 ? 66 + t : 151654;
        row[k++] = k_prompt[r][4];
        row[k++] = k_prompt[r][5];
    }
    return P;
}

struct song {
    int ncb, width, n, draws;
    float *frames;  /* [MAX_FRAMES][width] */
    int32_t *codes; /* [MAX_FRAMES][ncb] */
};

static void on_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    struct song *s = ctx;
    assert_int_equal(t, s->n);
    assert_true(t < MAX_FRAMES);
    memcpy(s->frames + (size_t)t * s->width, frame, sizeof(float) * s->width);
    memcpy(s->codes + (size_t)t * s->ncb, codes, sizeof(int32_t) * s->ncb);
    s->n++;
}

static void on_draw(void *ctx, int step, int j, const float *guided, int n)
{
    (void)step, (void)j, (void)guided, (void)n;
    ((struct song *)ctx)->draws++;
}

/* ---- the host reference of talker_backend.sample_pairs ---- */

static const struct talker_backend *ref_be; /* the CPU backend whose entries it uses */
static int ref_calls, ref_pairs_max;

static int ref_sample_pairs(void *impl, const struct talker_pairs_in *in, const struct talker_pairs_out *out)
{
    const struct talker_backend *be = ref_be;
    const struct talker *lm = be->lm;
    const struct depth *dd = be->dd;
    int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks, V = dd->cfg.audio_vocab;
    ref_calls++;
    if (in->n > ref_pairs_max) ref_pairs_max = in->n;
    assert_true(in->n >= 1 && 2 * in->n <= be->depth_rows);
    float *lg = malloc(sizeof(float) * 2 * SAMPLER_C0_COLS), *gd = malloc(sizeof(float) * SAMPLER_C0_COLS);
    float *x = malloc(sizeof(float) * 2 * H), *y = malloc(sizeof(float) * 2 * H);
    assert_non_null(lg), assert_non_null(gd), assert_non_null(x), assert_non_null(y);
    for (int p = 0; p < in->n; p++) {
        const float *hid = in->hidden + 2 * (size_t)p * H;
        int32_t *c = out->codes + (size_t)p * ncb;
        uint32_t pos0 = (uint32_t)(ncb * in->step[p]);
        float scale = in->cfg_scale[p];
        assert_int_equal(be->head_drawable(impl, hid, 2, lg), 0);
        if (scale > 1.0f) {
            sampler_c0_guide(gd, lg, lg + SAMPLER_C0_COLS, SAMPLER_C0_COLS, scale, in->top_k);
        } else {
            memcpy(gd, lg, sizeof(float) * SAMPLER_C0_COLS);
            sampler_topk_mask(gd, SAMPLER_C0_COLS, in->top_k);
        }
        if (in->ignore_stop[p]) gd[0] = -INFINITY;
        c[0] = sampler_draw_gumbel(in->seed[p], gd, SAMPLER_C0_COLS, in->top_k, pos0);
        assert_int_equal(be->depth_step(impl, 2, hid, 0, y), 0);
        const float *e = lm->embed + ((size_t)(c[0] > 0 ? c[0] - 1 : 0) + SAMPLER_CODE_OFFSET) * H;
        for (int j = 1; j < ncb; j++) {
            memcpy(x, e, sizeof(float) * H);
            memcpy(x + H, e, sizeof(float) * H);
            assert_int_equal(be->depth_step(impl, 2, x, j, y), 0);
            memcpy(out->depth_hidden + ((size_t)p * (ncb - 1) + j - 1) * H, y, sizeof(float) * H);
            assert_int_equal(be->depth_logits(impl, j, y, 2, lg), 0);
            if (scale > 1.0f)
                sampler_cfg_blend(gd, lg, lg + V, V, scale);
            else
                memcpy(gd, lg, sizeof(float) * V);
            c[j] = sampler_draw_gumbel(in->seed[p], gd, V, in->top_k, pos0 + (uint32_t)j);
            e = depth_code_embedding(dd, j, c[j]);
            assert_non_null(e);
        }
        int32_t codes[64];
        memcpy(codes, c, sizeof(int32_t) * ncb);
        codes[0] = c[0] > 0 ? c[0] - 1 : 0;
        assert_int_equal(talker_feedback_embedding(lm, dd, codes, out->feedback + (size_t)p * H), 0);
    }
    free(lg), free(gd), free(x), free(y);
    return 0;
}

/* ---- two sets of the same songs in lockstep ---- */

struct side {
    const struct talker_backend *be;
    struct generate g[N_SONGS];
    struct sampler sp[N_SONGS];
    struct song song[N_SONGS];
    struct generate_batch b;
    /* 0: generate_sample per request; 1: generate_sample_batch; 2: as 1, and songs
     * that are generate_decode_ready take generate_decode_batch instead (forward and
     * draws in one call, as the scheduler's steady state) */
    int batched;
    struct generate *dec[N_SONGS];
    int n_dec, decode_calls;
};

static void side_init(struct side *sd, const struct talker_backend *be, int batched)
{
    memset(sd, 0, sizeof *sd);
    sd->be = be;
    sd->batched = batched;
    int H = be->lm->cfg.hidden, ncb = be->dd->cfg.n_codebooks;
    assert_int_equal(generate_batch_init(&sd->b, H, 2 * N_SONGS * MAX_PROMPT), 0);
    for (int i = 0; i < N_SONGS; i++) {
        struct song *s = &sd->song[i];
        s->ncb = ncb;
        s->width = ncb * H;
        s->frames = calloc((size_t)MAX_FRAMES * s->width, sizeof(float));
        s->codes = calloc((size_t)MAX_FRAMES * ncb, sizeof(int32_t));
        assert_non_null(s->frames), assert_non_null(s->codes);
        sampler_init_seeded(&sd->sp[i], k_specs[i].seed);
        struct generate_hooks hooks = {.ctx = s, .on_frame = on_frame, .on_draw = k_specs[i].hook ? on_draw : NULL};
        int32_t ids[2 * MAX_PROMPT];
        int P = song_prompt(i, ids);
        int rc = generate_attach_backend(&sd->g[i], be, &sd->sp[i], 2 * i, 2 * i + 1, ids, P, k_specs[i].max_frames,
                                         k_specs[i].cfg, &hooks);
        if (rc < 0) fail_msg("attach: %s", mm3_last_error());
        sd->g[i].ignore_stop = k_specs[i].ignore_stop;
        sd->g[i].min_frames = k_specs[i].min_frames;
    }
}

static void side_free(struct side *sd)
{
    for (int i = 0; i < N_SONGS; i++) {
        generate_end(&sd->g[i]);
        free(sd->song[i].frames);
        free(sd->song[i].codes);
    }
    generate_batch_free(&sd->b);
}

/* Feed everybody started by step t, one forward, take. */
static void side_forward(struct side *sd, int t)
{
    struct generate_batch *b = &sd->b;
    b->n = 0;
    sd->n_dec = 0;
    for (int i = 0; i < N_SONGS && i <= t; i++) {
        if (sd->batched == 2 && generate_decode_ready(&sd->g[i])) {
            sd->dec[sd->n_dec++] = &sd->g[i];
            continue;
        }
        assert_true(generate_feed(&sd->g[i], b, b->cap - b->n) >= 0);
    }
    if (b->n == 0) return;
    if (generate_batch_forward_backend(sd->be, b) < 0) fail_msg("forward: %s", mm3_last_error());
    for (int i = 0; i < N_SONGS; i++)
        generate_take(&sd->g[i], b);
}

static void side_sample(struct side *sd)
{
    struct generate *list[N_SONGS];
    int n = 0;
    for (int i = 0; i < N_SONGS; i++)
        if (!sd->g[i].done && sd->g[i].phase == GENERATE_SAMPLE) list[n++] = &sd->g[i];
    if (sd->n_dec > 0) {
        assert_int_equal(generate_decode_batch(sd->dec, sd->n_dec) == -EINVAL, 0);
        sd->decode_calls++;
    }
    if (sd->batched) {
        generate_sample_batch(list, n);
        return;
    }
    for (int k = 0; k < n; k++)
        generate_sample(list[k]);
}

/* Runs ref (per request) and bat (batched) to the end; copy_hidden: bat samples
 * ref's hidden pairs (the CUDA side, whose forward differs in the last bits). */
static void run_lockstep(struct side *ref, struct side *bat, int copy_hidden, double tol)
{
    int H = ref->be->lm->cfg.hidden, ncb = ref->be->dd->cfg.n_codebooks, stops = 0;
    for (int t = 0; t < 200; t++) {
        int live = 0;
        for (int i = 0; i < N_SONGS; i++)
            live += !ref->g[i].done || !bat->g[i].done;
        if (!live) break;
        side_forward(ref, t);
        side_forward(bat, t);
        for (int i = 0; i < N_SONGS; i++) {
            struct generate *a = &ref->g[i], *b = &bat->g[i];
            assert_int_equal(a->done, b->done);
            if (a->done || bat->batched == 2) continue; /* decode songs have not run their forward yet */
            assert_int_equal(a->phase, b->phase);
            assert_int_equal(a->step, b->step);
            if (copy_hidden && a->phase == GENERATE_SAMPLE) memcpy(b->hidden, a->hidden, sizeof(float) * 2 * H);
        }
        side_sample(ref);
        side_sample(bat);
        for (int i = 0; i < N_SONGS; i++) {
            struct generate *a = &ref->g[i], *b = &bat->g[i];
            if (a->done != b->done || a->stop != b->stop || a->err != b->err || a->n_frames != b->n_frames)
                fail_msg("song %d, loop step %d (LM step %d): done %d/%d stop %d/%d err %d/%d frames %d/%d "
                         "(per request / batched; batched: %s)",
                         i, t, a->step, a->done, b->done, a->stop, b->stop, a->err, b->err, a->n_frames, b->n_frames,
                         b->err_msg);
            if (a->phase == GENERATE_FEED && !a->done) {
                assert_int_equal(b->phase, GENERATE_FEED);
                assert_memory_equal(a->codes, b->codes, sizeof(int32_t) * ncb);
                double rel = test_rel_error(b->fb, a->fb, 2 * (size_t)H);
                if (!(rel <= tol)) fail_msg("song %d step %d: feedback rel %.3g > %.3g", i, a->step, rel, tol);
            }
        }
    }
    for (int i = 0; i < N_SONGS; i++) {
        struct song *a = &ref->song[i], *b = &bat->song[i];
        assert_true(ref->g[i].done && bat->g[i].done);
        assert_int_equal(a->n, b->n);
        assert_memory_equal(a->codes, b->codes, sizeof(int32_t) * (size_t)a->n * a->ncb);
        double rel = test_rel_error(b->frames, a->frames, (size_t)a->n * a->width);
        print_message("song %d: %d frames, stop %d, err %d, frames rel %.3g\n", i, a->n, ref->g[i].stop, ref->g[i].err,
                      rel);
        assert_true(rel <= tol);
        assert_int_equal(a->draws, b->draws); /* the hooked song drew through the loop on both sides */
        stops += ref->g[i].stop == GENERATE_STOP_TOKEN;
        if (k_specs[i].ignore_stop) assert_int_equal(ref->g[i].stop, GENERATE_STOP_BUDGET);
        if (ref->g[i].err == 0) assert_true(a->n >= k_specs[i].min_frames);
    }
    assert_true(ref->song[3].draws > 0);
    print_message("%d of %d songs ended by the stop code\n", stops, N_SONGS);
    assert_true(stops >= 1); /* the boosted stop row (setup) must have ended a song */
}

struct probe {
    int at, code;
};

static void probe_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    (void)t, (void)frame;
    struct probe *p = ctx;
    if (t == p->at) p->code = codes[0];
}

/* Song 0's c0 at frame STOP_AT: the stop column gets its head row, scaled up, so that
 * song 0 most likely stops there (in mid-song, inside a batch) and others may too. */
static int stop_boost(struct test_stage0 *m)
{
    struct probe pr = {STOP_AT, -1};
    struct generate_hooks hooks = {.ctx = &pr, .on_frame = probe_frame};
    struct generate g;
    struct sampler sp;
    sampler_init_seeded(&sp, k_specs[0].seed);
    int32_t ids[2 * MAX_PROMPT];
    int P = song_prompt(0, ids);
    int rc = generate_begin(&g, &m->lm, &m->dd, &sp, ids, P, MAX_FRAMES, k_specs[0].cfg, &hooks);
    while (rc == 0 && !g.done)
        rc = generate_step(&g);
    generate_end(&g);
    if (rc < 0) return rc;
    if (pr.code < 0) return mm3_errorf(-EINVAL, "probe: song 0 ended before frame %d", STOP_AT);
    int H = m->lm.cfg.hidden;
    for (int i = 0; i < H; i++)
        m->lm.head[i] = STOP_BOOST * m->lm.head[(size_t)(pr.code + 1) * H + i];
    return 0;
}

static int setup(void **state)
{
    if (test_stage0_golden_setup(state) < 0) return -1;
    struct test_stage0 *m = *state;
    if (!m) return 0;
    /* Random weights seldom rank stop in the top 50: give the stop column the head row
     * of the code the songs draw most often, slightly scaled, so stops occur. */
    if (stop_boost(m) < 0) {
        fprintf(stderr, "probe: %s\n", mm3_last_error());
        test_stage0_golden_teardown(state);
        *state = NULL;
        return -1;
    }
    return 0;
}

static void open_or_fail(struct talker_backend *be, enum talker_backend_kind kind, struct test_stage0 *m,
                         int depth_rows)
{
    int rc = talker_backend_open(be, kind, &m->lm, &m->dd, 2 * N_SONGS, MAX_PROMPT + MAX_FRAMES + 2, depth_rows);
    if (rc < 0) fail_msg("backend: %s", mm3_last_error());
}

/* The CPU loop against itself through generate_sample_batch with no sample_pairs:
 * the fallback is the loop. */
static void test_cpu_fallback_is_the_loop(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    struct talker_backend a, b;
    open_or_fail(&a, TALKER_BACKEND_CPU, m, 2);
    open_or_fail(&b, TALKER_BACKEND_CPU, m, 2);
    assert_null(b.sample_pairs);
    struct side ra, rb;
    side_init(&ra, &a, 0);
    side_init(&rb, &b, 1);
    run_lockstep(&ra, &rb, 0, 0.0);
    side_free(&ra), side_free(&rb);
    talker_backend_close(&a), talker_backend_close(&b);
}

static void reference_batched(struct test_stage0 *m, int depth_rows)
{
    struct talker_backend a, b;
    open_or_fail(&a, TALKER_BACKEND_CPU, m, 2);
    open_or_fail(&b, TALKER_BACKEND_CPU, m, depth_rows);
    b.sample_pairs = ref_sample_pairs;
    ref_be = &b;
    ref_calls = ref_pairs_max = 0;
    struct side ra, rb;
    side_init(&ra, &a, 0);
    side_init(&rb, &b, 1);
    run_lockstep(&ra, &rb, 0, 0.0);
    assert_true(ref_calls > 0);
    /* several pairs per call, never more than the depth rows hold */
    assert_true(ref_pairs_max >= 2 && ref_pairs_max <= depth_rows / 2);
    side_free(&ra), side_free(&rb);
    talker_backend_close(&a), talker_backend_close(&b);
}

/* One call for all batchable songs, and chunks of 2 pairs with 4 depth rows. */
static void test_cpu_reference_batched(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    reference_batched(m, 2 * N_SONGS);
    reference_batched(m, 4);
}

/* generate_decode_batch on a backend without decode_pairs: talker_backend_decode_pairs
 * composes forward and sample_pairs (here the host reference); the songs are the
 * loop's bit for bit, in one call and in chunks of 2 pairs. A request that is not
 * ready (the hooked song, a prefill) is refused without touching anything. */
static void test_cpu_decode_batch(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    int rows[2] = {2 * N_SONGS, 4};
    for (int k = 0; k < 2; k++) {
        struct talker_backend a, b;
        open_or_fail(&a, TALKER_BACKEND_CPU, m, 2);
        open_or_fail(&b, TALKER_BACKEND_CPU, m, rows[k]);
        b.sample_pairs = ref_sample_pairs;
        assert_null(b.decode_pairs);
        ref_be = &b;
        ref_calls = ref_pairs_max = 0;
        struct side ra, rb;
        side_init(&ra, &a, 0);
        side_init(&rb, &b, 2);
        struct generate *not_ready[2] = {&rb.g[0], &rb.g[1]}; /* still to prefill */
        assert_false(generate_decode_ready(&rb.g[0]));
        assert_int_equal(generate_decode_batch(not_ready, 2), -EINVAL);
        assert_int_equal(rb.g[0].phase, GENERATE_PREFILL);
        assert_int_equal(rb.g[0].done, 0);
        run_lockstep(&ra, &rb, 0, 0.0);
        assert_true(rb.decode_calls > 10);
        assert_true(ref_calls > 0 && ref_pairs_max >= 2 && ref_pairs_max <= rows[k] / 2);
        side_free(&ra), side_free(&rb);
        talker_backend_close(&a), talker_backend_close(&b);
    }
}

static void test_cuda_batched(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) skip();
    int rows[2] = {2 * N_SONGS, 4};
    for (int k = 0; k < 2; k++) {
        struct talker_backend a, b;
        open_or_fail(&a, TALKER_BACKEND_CPU, m, 2);
        open_or_fail(&b, TALKER_BACKEND_CUDA, m, rows[k]);
        assert_non_null(b.sample_pairs);
        struct side ra, rb;
        side_init(&ra, &a, 0);
        side_init(&rb, &b, 1);
        run_lockstep(&ra, &rb, 1, FRAME_TOL);
        side_free(&ra), side_free(&rb);
        talker_backend_close(&a), talker_backend_close(&b);
    }
}

/* The scheduler's GPU configuration end to end: CUDA graphs for the decode forwards
 * and the batched sampling step, against the eager GPU forward with per-request
 * sampling (both forwards on the GPU, no hidden copied): the same songs. */
static void test_cuda_batched_graphs(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) skip();
    struct talker_backend a, b;
    open_or_fail(&a, TALKER_BACKEND_CUDA, m, 2);
    open_or_fail(&b, TALKER_BACKEND_CUDA, m, 2 * N_SONGS);
    int sizes[4] = {2, 4, 8, 16};
    assert_int_equal(talker_backend_graphs_enable(&b, sizes, 4, 1), 0);
    struct side ra, rb;
    side_init(&ra, &a, 0);
    side_init(&rb, &b, 1);
    run_lockstep(&ra, &rb, 0, FRAME_TOL);
    struct talker_backend_counts counts;
    talker_backend_counts(&b, &counts);
    print_message("graphs: %d captured, %ld replays\n", counts.forward_graphs, counts.forward_replays);
    assert_true(counts.forward_graphs >= 2 && counts.forward_replays > 10);
    side_free(&ra), side_free(&rb);
    talker_backend_close(&a), talker_backend_close(&b);
}

/* The GPU backend's decode_pairs, counted: steps it served, steps it left (1). */
static int (*gpu_decode_pairs)(void *impl, const struct talker_decode_in *in, const struct talker_pairs_out *out);
static int decode_served, decode_declined;

static int counting_decode_pairs(void *impl, const struct talker_decode_in *in, const struct talker_pairs_out *out)
{
    int rc = gpu_decode_pairs(impl, in, out);
    decode_served += rc == 0;
    decode_declined += rc == 1;
    return rc;
}

/* generate_decode_batch on the GPU with graphs (the scheduler's steady state: the
 * forward replayed and the sampling step after it, the hidden pairs handed over on
 * the device) against the same calls on an eager GPU backend, where decode_pairs
 * declines and talker_backend_decode_pairs composes forward and sample_pairs: the
 * same songs. Both sides batch the same tokens together (the products of 2 and of
 * 8 rows round differently, which the bf16 KV cache can carry to 1e-4). With graphs
 * for up to 16 rows every decode step is served; with graphs for up to 4 rows the
 * steps of 3+ pairs are declined and composed. */
static void test_cuda_decode_batch_graphs(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) skip();
    int sizes[4] = {2, 4, 8, 16}, n_sizes[2] = {4, 2};
    for (int k = 0; k < 2; k++) {
        struct talker_backend a, b;
        open_or_fail(&a, TALKER_BACKEND_CUDA, m, 2 * N_SONGS);
        open_or_fail(&b, TALKER_BACKEND_CUDA, m, 2 * N_SONGS);
        assert_int_equal(talker_backend_graphs_enable(&b, sizes, n_sizes[k], 1), 0);
        assert_non_null(b.decode_pairs);
        gpu_decode_pairs = b.decode_pairs;
        b.decode_pairs = counting_decode_pairs;
        decode_served = decode_declined = 0;
        struct side ra, rb;
        side_init(&ra, &a, 2);
        side_init(&rb, &b, 2);
        run_lockstep(&ra, &rb, 0, FRAME_TOL);
        assert_true(ra.decode_calls > 10);
        print_message("graphs up to %d rows: %d decode steps served, %d declined\n", sizes[n_sizes[k] - 1],
                      decode_served, decode_declined);
        assert_true(decode_served > 10);
        struct talker_backend_counts counts;
        talker_backend_counts(&b, &counts);
        print_message("steps queued ahead %ld, taken %ld (the hooked song's forwards drop them)\n", counts.ahead_queued,
                      counts.ahead_taken);
        if (k == 0) assert_int_equal(decode_declined, 0);
        if (k == 1) assert_true(decode_declined > 0);
        side_free(&ra), side_free(&rb);
        talker_backend_close(&a), talker_backend_close(&b);
    }
}

static void noop_draw(void *ctx, int step, int j, const float *guided, int n)
{
    (void)ctx, (void)step, (void)j, (void)guided, (void)n;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* ms per AR step (forward of the feedback pairs + sampling) of k songs on the GPU,
 * batched or per request (an on_draw hook keeps a request out of the batch). */
static double cuda_step_ms(struct test_stage0 *m, int k, int batched, int graphs)
{
    enum { STEPS = 30 };
    struct talker_backend be;
    int rc = talker_backend_open(&be, TALKER_BACKEND_CUDA, &m->lm, &m->dd, 2 * k, MAX_PROMPT + STEPS + 8, 2 * k);
    if (rc < 0) fail_msg("backend: %s", mm3_last_error());
    int sizes[1] = {2 * k};
    if (graphs) assert_int_equal(talker_backend_graphs_enable(&be, sizes, 1, 1), 0);
    struct generate *g = calloc((size_t)k, sizeof *g);
    struct sampler *sp = calloc((size_t)k, sizeof *sp);
    assert_non_null(g), assert_non_null(sp);
    struct generate_batch b;
    assert_int_equal(generate_batch_init(&b, m->lm.cfg.hidden, 2 * k * MAX_PROMPT), 0);
    struct generate_hooks hooks = {.on_draw = batched ? NULL : noop_draw};
    int32_t ids[2 * MAX_PROMPT];
    int P = song_prompt(0, ids);
    for (int i = 0; i < k; i++) {
        sampler_init_seeded(&sp[i], 100 + (uint64_t)i);
        assert_int_equal(generate_attach_backend(&g[i], &be, &sp[i], 2 * i, 2 * i + 1, ids, P, STEPS + 4, 1.5f, &hooks),
                         0);
        g[i].ignore_stop = 1;
    }
    struct generate **list = calloc((size_t)k, sizeof *list);
    assert_non_null(list);
    double t0 = 0;
    for (int t = 0; t < STEPS; t++) {
        if (t == 2) t0 = now_ms(); /* after the prefill and a warm-up step */
        b.n = 0;
        for (int i = 0; i < k; i++)
            assert_true(generate_feed(&g[i], &b, b.cap - b.n) >= 0);
        assert_int_equal(generate_batch_forward_backend(&be, &b), 0);
        for (int i = 0; i < k; i++) {
            generate_take(&g[i], &b);
            list[i] = &g[i];
        }
        assert_int_equal(generate_sample_batch(list, k), 0);
    }
    double ms = (now_ms() - t0) / (STEPS - 2);
    for (int i = 0; i < k; i++)
        generate_end(&g[i]);
    free(g), free(sp), free(list);
    generate_batch_free(&b);
    talker_backend_close(&be);
    return ms;
}

/* Not a benchmark (tiny-a is launch-bound): one AR step's time on the GPU for 1 and 8
 * songs, batched sampling against the per-request path, for the report. */
static void test_cuda_step_time(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) skip();
    int ks[2] = {1, 8};
    for (int i = 0; i < 2; i++) {
        double per = cuda_step_ms(m, ks[i], 0, 0), bat = cuda_step_ms(m, ks[i], 1, 0);
        double gr = cuda_step_ms(m, ks[i], 1, 1);
        print_message("tiny-a, %d song(s): ms per AR step: %.3f batched sampling + graph forward, %.3f batched "
                      "sampling, %.3f sampling per request\n",
                      ks[i], gr, bat, per);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_fallback_is_the_loop),
        cmocka_unit_test(test_cpu_reference_batched),
        cmocka_unit_test(test_cuda_batched),
        cmocka_unit_test(test_cpu_decode_batch),
        cmocka_unit_test(test_cuda_batched_graphs),
        cmocka_unit_test(test_cuda_decode_batch_graphs),
        cmocka_unit_test(test_cuda_step_time),
    };
    return cmocka_run_group_tests(tests, setup, test_stage0_golden_teardown);
}
