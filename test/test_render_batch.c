/* Windows of several songs in one flow batch (stage1/flow_batch.h, render_window_prepare /
 * collect / finish) against each song rendered alone, bit for bit on the CPU with the
 * tiny-a condition encoder and DiT (stand-in vocoder, hop 512):
 *  1. three songs of different lengths, seeds, steps, guidance and shift, all frames at once:
 *     one batch holds full and short (last) windows of different L;
 *  2. frames trickling in between batches, and the server's overlapped order (the next
 *     batch is prepared and begun before the previous one is vocoded and emitted);
 *  3. a batch smaller than the number of songs;
 *  4. a song dropped while its window is out in a batch, and a song whose window fails
 *     (bad replay noise): the others go on unchanged.
 * With CUDA and a GPU: 5. the GPU batch (flow_cuda_batch_open) against flow_cuda_window_run
 * per window (fp32, rel <= 1e-5: only the GEMM algorithm of the larger batch may differ),
 * four windows of two lengths, with and without a carried prefix; 6. with
 * MM3_BENCH_BATCH=1, seconds per window of 1 vs 4 windows per batch at the release
 * geometry (random weights, tf32 and bf16). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "stage1/flow_batch.h"
#include "stage1/render.h"
#include "support/test_rand.h"
#include "support/test_stage1.h"
#include "support/test_support.h"

#ifdef MM3_HAVE_CUDA
#include <time.h>

#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/dit_cuda.h"
#include "stage1/cuda/flow_cuda.h"
#endif

#define HOP TEST_STAGE1_FAKE_HOP
#define MAX_SONGS 4

/* The whole song's PCM, per channel, and the chunk sizes. */
struct song_out {
    float *pcm[2];
    int64_t n, cap;
    int n_chunks;
    int chunk[64];
};

static int out_emit(void *ctx, const float *pcm, int n)
{
    struct song_out *o = ctx;
    if (o->n + n > o->cap) {
        int64_t cap = o->cap ? o->cap * 2 : 1 << 16;
        while (cap < o->n + n)
            cap *= 2;
        for (int c = 0; c < 2; c++) {
            o->pcm[c] = realloc(o->pcm[c], sizeof(float) * (size_t)cap);
            assert_non_null(o->pcm[c]);
        }
        o->cap = cap;
    }
    for (int c = 0; c < 2; c++)
        memcpy(o->pcm[c] + o->n, pcm + (size_t)c * n, sizeof(float) * (size_t)n);
    o->n += n;
    if (o->n_chunks < 64) o->chunk[o->n_chunks] = n;
    o->n_chunks++;
    return 0;
}

static void out_free(struct song_out *o)
{
    free(o->pcm[0]), free(o->pcm[1]);
    memset(o, 0, sizeof *o);
}

static void out_equal(const struct song_out *a, const struct song_out *b)
{
    assert_true(a->n > 0);
    assert_int_equal(a->n, b->n);
    for (int c = 0; c < 2; c++)
        assert_memory_equal(a->pcm[c], b->pcm[c], sizeof(float) * (size_t)a->n);
}

struct song {
    int T, steps;
    float guidance;
    uint64_t seed;
    float shift; /* 0: the default schedule */
};

/* Frames of song `which`: distinct per song. */
static float *make_frames(const struct test_stage1 *m, int T, int which, int *width)
{
    *width = m->cm->cfg.n_layers * m->cm->cfg.hidden;
    float *f = malloc(sizeof(float) * (size_t)T * *width);
    assert_non_null(f);
    for (size_t i = 0; i < (size_t)T * *width; i++)
        f[i] = sinf(0.013f * (float)i + 0.7f * (float)which) * 2.0f;
    return f;
}

static struct render *make_render(const struct test_stage1 *m, const struct song *s, struct song_out *o)
{
    struct render_params p = {
        .n_steps = s->steps,
        .guidance = s->guidance,
        .shift = s->shift,
        .noise = {RENDER_NOISE_SEEDED, s->seed, 0, NULL, NULL},
        .decoder = {m->dm, HOP, test_stage1_fake_decode},
        .sink = {o, out_emit},
    };
    struct render *r;
    assert_int_equal(render_create(&r, m->cm, m->dm, &p), 0);
    return r;
}

static void render_alone(const struct test_stage1 *m, const struct song *s, int which, struct song_out *o)
{
    int W;
    float *f = make_frames(m, s->T, which, &W);
    struct render *r = make_render(m, s, o);
    assert_int_equal(render_push_frames(r, f, s->T, W), 0);
    assert_int_equal(render_finish(r), 0);
    render_free(r);
    free(f);
}

static const struct song SONGS[3] = {
    {350, 1, 1.7f, 11, 0.0f}, /* 3 windows, the last one 150 frames */
    {250, 2, 2.5f, 12, 2.0f}, /* 2 windows, the last one 150 frames; a shifted schedule */
    {130, 1, 1.0f, 13, 0.0f}, /* 1 short window */
};

/* SONGS rendered alone, made once for all the tests (the CPU DiT is the slow part);
 * freed by teardown. */
static struct song_out g_alone[3];
static int g_alone_made;

static const struct song_out *songs_alone(const struct test_stage1 *m)
{
    if (!g_alone_made) {
        g_alone_made = 1;
        for (int i = 0; i < 3; i++)
            render_alone(m, &SONGS[i], i, &g_alone[i]);
    }
    return g_alone;
}

static int teardown(void **state)
{
    for (int i = 0; i < 3; i++)
        out_free(&g_alone[i]);
    return test_stage1_golden_teardown(state);
}

/* SONGS rendered together: their renders, frames and outputs. */
struct songs {
    struct render *r[3];
    float *f[3];
    int W; /* frame width */
    struct song_out batched[3];
};

static void songs_open(const struct test_stage1 *m, struct songs *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 3; i++) {
        s->f[i] = make_frames(m, SONGS[i].T, i, &s->W);
        s->r[i] = make_render(m, &SONGS[i], &s->batched[i]);
    }
}

/* All done: each song came out as it did alone; everything freed. */
static void songs_close_as_alone(struct songs *s, const struct song_out *alone)
{
    for (int i = 0; i < 3; i++) {
        assert_true(render_complete(s->r[i]));
        out_equal(&alone[i], &s->batched[i]);
        render_free(s->r[i]);
        free(s->f[i]);
        out_free(&s->batched[i]);
    }
}

/* 1: everything at once, batches of up to 3 windows. */
static void test_batched_equals_alone(void **state)
{
    struct test_stage1 *m = *state;
    if (!m) skip();
    const struct song_out *alone = songs_alone(m);
    struct songs s;
    songs_open(m, &s);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(render_push_frames_deferred(s.r[i], s.f[i], SONGS[i].T, s.W), 0);
        assert_int_equal(render_end(s.r[i]), 0);
    }
    struct flow_batch fb;
    assert_int_equal(flow_batch_cpu_create(&fb, m->dm, condition_latent_len(&m->cm->cfg, 200), 3), 0);
    int rc[3], rounds = 0, first = -1, mixed_L = 0;
    for (;;) {
        int n = render_batch_step(s.r, 3, &fb, rc);
        assert_true(n >= 0);
        for (int i = 0; i < 3; i++)
            assert_true(rc[i] >= 0);
        if (n == 0) break;
        if (first < 0) first = n;
        /* round 2 holds song 0's full window 1 and song 1's short last window */
        if (rounds == 1 && n == 2) mixed_L = 1;
        rounds++;
    }
    assert_int_equal(first, 3);
    assert_int_equal(rounds, 3);
    assert_true(mixed_L);
    songs_close_as_alone(&s, alone);
    fb.close(fb.ctx);
}

/* One round in the server's overlapped order: prepare the ready windows (up to the
 * batch size), begin, THEN vocode and emit what the previous round collected, end,
 * collect. live[i] = 0: skip song i. */
static int overlapped_round(struct render **r, const int *live, int n, const struct flow_batch *fb)
{
    struct flow_job jobs[MAX_SONGS];
    int who[MAX_SONGS], rc[MAX_SONGS], k = 0;
    for (int i = 0; i < n && k < fb->max_windows; i++)
        if (live[i] && render_window_prepare(r[i], &jobs[k]) == 1) who[k++] = i;
    if (k) assert_int_equal(fb->begin(fb->ctx, k, jobs), 0);
    for (int i = 0; i < n; i++)
        if (live[i] && render_window_unfinished(r[i]) > 0) assert_int_equal(render_window_finish(r[i]), 1);
    if (k) assert_int_equal(fb->end(fb->ctx, k, jobs, rc), 0);
    for (int j = 0; j < k; j++)
        assert_int_equal(render_window_collect(r[who[j]], rc[j]), 0);
    return k;
}

/* 2 + 3: frames arrive in pieces of 37 between rounds, the END comes late, two windows
 * per batch for three songs, and emission lags one round behind the DiT. */
static void test_trickle_overlapped(void **state)
{
    struct test_stage1 *m = *state;
    if (!m) skip();
    const struct song_out *alone = songs_alone(m);
    struct songs s;
    songs_open(m, &s);
    int at[3] = {0}, live[3] = {1, 1, 1}, ended[3] = {0};
    struct flow_batch fb;
    assert_int_equal(flow_batch_cpu_create(&fb, m->dm, condition_latent_len(&m->cm->cfg, 200), 2), 0);
    int idle = 0, max_unfinished = 0;
    while (idle < 3) {
        for (int i = 0; i < 3; i++) {
            int n = SONGS[i].T - at[i] < 37 ? SONGS[i].T - at[i] : 37;
            if (n > 0) {
                assert_int_equal(render_push_frames_deferred(s.r[i], s.f[i] + (size_t)at[i] * s.W, n, s.W), 0);
                at[i] += n;
            } else if (!ended[i]) {
                assert_int_equal(render_end(s.r[i]), 0);
                ended[i] = 1;
            }
        }
        int k = overlapped_round(s.r, live, 3, &fb);
        for (int i = 0; i < 3; i++) {
            int u = render_window_unfinished(s.r[i]);
            max_unfinished = u > max_unfinished ? u : max_unfinished;
        }
        int all_ended = ended[0] && ended[1] && ended[2];
        idle = k == 0 && all_ended ? idle + 1 : 0;
    }
    /* the round after a window ran still holds it: emission overlapped the next batch */
    assert_int_equal(max_unfinished, 1);
    songs_close_as_alone(&s, alone);
    fb.close(fb.ctx);
}

/* 4: song 1 is dropped while its window is out in a batch (its latents are discarded at
 * end: x = NULL), song 2 fails at its second window (replay noise of the wrong length);
 * song 0 and song 3 come out as if alone. */
static void test_cancel_and_failure_mid_batch(void **state)
{
    struct test_stage1 *m = *state;
    if (!m) skip();
    const struct song songs[4] = {
        SONGS[0], {350, 1, 1.7f, 21, 0.0f}, {350, 1, 1.7f, 22, 0.0f}, {250, 2, 2.5f, 23, 0.0f}};
    struct song_out alone[4] = {0}, batched[4] = {0};
    alone[0] = songs_alone(m)[0]; /* borrowed: not freed here */
    struct render *r[4];
    float *f[4];
    int W, Lw = condition_latent_len(&m->cm->cfg, 200), C = m->dm->cfg.in_ch;
    /* replay noise for song 2: window 0 right, window 1 one value short */
    float *rp0 = calloc((size_t)C * Lw, sizeof(float)), *rp1 = calloc((size_t)C * Lw, sizeof(float));
    const float *replay[2] = {rp0, rp1};
    int64_t replay_len[2] = {(int64_t)C * Lw, (int64_t)C * Lw - 1};
    for (int i = 0; i < 4; i++) {
        if (i == 3) render_alone(m, &songs[i], i, &alone[i]);
        f[i] = make_frames(m, songs[i].T, i, &W);
        r[i] = make_render(m, &songs[i], &batched[i]);
        assert_int_equal(render_push_frames_deferred(r[i], f[i], songs[i].T, W), 0);
        assert_int_equal(render_end(r[i]), 0);
    }
    render_free(r[2]);
    struct render_params p = {
        .n_steps = 1,
        .guidance = 1.7f,
        .noise = {RENDER_NOISE_REPLAY, 0, 2, replay, replay_len},
        .decoder = {m->dm, HOP, test_stage1_fake_decode},
        .sink = {&batched[2], out_emit},
    };
    assert_int_equal(render_create(&r[2], m->cm, m->dm, &p), 0);
    assert_int_equal(render_push_frames_deferred(r[2], f[2], songs[2].T, W), 0);
    assert_int_equal(render_end(r[2]), 0);

    struct flow_batch fb;
    assert_int_equal(flow_batch_cpu_create(&fb, m->dm, Lw, 4), 0);
    int live[4] = {1, 1, 1, 1}, round = 0, failed2 = 0;
    for (;; round++) {
        struct flow_job jobs[4];
        int who[4], rc[4], k = 0;
        for (int i = 0; i < 4; i++) {
            if (!live[i]) continue;
            int p_rc = render_window_prepare(r[i], &jobs[k]);
            if (p_rc < 0) {
                assert_int_equal(i, 2);
                assert_int_equal(round, 1);
                assert_non_null(strstr(mm3_last_error(), "replay noise"));
                failed2 = 1;
                live[i] = 0;
                continue;
            }
            if (p_rc == 1) who[k++] = i;
        }
        if (k == 0) break;
        assert_int_equal(fb.begin(fb.ctx, k, jobs), 0);
        if (round == 1) { /* song 1 goes away while its window is out */
            for (int j = 0; j < k; j++)
                if (who[j] == 1) jobs[j].x = NULL;
            render_free(r[1]);
            r[1] = NULL;
            live[1] = 0;
        }
        assert_int_equal(fb.end(fb.ctx, k, jobs, rc), 0);
        for (int j = 0; j < k; j++) {
            if (!live[who[j]]) continue;
            assert_int_equal(render_window_collect(r[who[j]], rc[j]), 0);
            assert_int_equal(render_window_finish(r[who[j]]), 1);
        }
    }
    assert_true(failed2);
    assert_true(render_push_frames_deferred(r[2], f[2], 1, W) < 0); /* failed for good */
    for (int i = 0; i < 4; i++) {
        if (i == 0 || i == 3) {
            assert_true(render_complete(r[i]));
            out_equal(&alone[i], &batched[i]);
        }
        render_free(r[i]);
        free(f[i]);
        if (i != 0) out_free(&alone[i]);
        out_free(&batched[i]);
    }
    fb.close(fb.ctx);
    free(rp0), free(rp1);
}

/* The batch refuses more windows than it was made for, and a window it cannot run fails
 * alone. */
static void test_bad_batch(void **state)
{
    struct test_stage1 *m = *state;
    if (!m) skip();
    int Lw = condition_latent_len(&m->cm->cfg, 200), C = m->dm->cfg.in_ch, D = m->dm->cfg.cond_dim;
    struct flow_batch fb;
    assert_true(flow_batch_cpu_create(&fb, m->dm, Lw, 0) == -EINVAL);
    assert_int_equal(flow_batch_cpu_create(&fb, m->dm, Lw, 2), 0);
    float *x = calloc((size_t)C * Lw, sizeof(float)), *x2 = calloc((size_t)C * Lw, sizeof(float));
    float *cond = calloc((size_t)Lw * D, sizeof(float));
    struct flow_job jobs[3] = {{1, 1.0f, 1.0f, Lw, 0, cond, NULL, x}, {1, 1.0f, 1.0f, Lw + 1, 0, cond, NULL, x2}, {0}};
    int rc[3];
    assert_true(fb.begin(fb.ctx, 3, jobs) == -EINVAL);
    assert_int_equal(fb.begin(fb.ctx, 2, jobs), 0);
    assert_int_equal(fb.end(fb.ctx, 2, jobs, rc), 0);
    assert_int_equal(rc[0], 0);
    assert_true(rc[1] == -EINVAL);
    fb.close(fb.ctx);
    free(x), free(x2), free(cond);
}

#ifdef MM3_HAVE_CUDA
static uint64_t rng = 0x5eedba7c40ull;

/* 5 */
static void test_cuda_batch_matches_single(void **state)
{
    struct test_stage1 *m = *state;
    if (!m || cuda_device_count_safe() < 1) skip();
    int Lw = condition_latent_len(&m->cm->cfg, 200), Ls = condition_latent_len(&m->cm->cfg, 130);
    int C = m->dm->cfg.in_ch, D = m->dm->cfg.cond_dim;
    struct flow_cuda *f;
    assert_int_equal(flow_cuda_create(&f, m->dm, MM3_MATMUL_FP32, Lw), 0);
    struct flow_batch fb;
    assert_int_equal(flow_cuda_batch_open(f, 4, &fb), 0);
    assert_true(fb.async && fb.max_windows == 4);
    /* windows 0 and 2 differ only in the schedule's shift: they must not share a forward */
    const struct {
        int L, ov, steps;
        float g, shift;
    } w[4] = {{Lw, 0, 2, 1.7f, 1.0f}, {Ls, 100, 2, 2.0f, 1.0f}, {Lw, 172, 2, 1.0f, 2.5f}, {Lw, 172, 3, 1.7f, 1.0f}};
    struct flow_job jobs[4];
    float *x_single[4], *cond[4], *prev[4];
    for (int i = 0; i < 4; i++) {
        size_t n = (size_t)C * w[i].L;
        jobs[i].x = test_rand_array(&rng, n, 1.0f);
        x_single[i] = malloc(sizeof(float) * n);
        memcpy(x_single[i], jobs[i].x, sizeof(float) * n);
        cond[i] = test_rand_array(&rng, (size_t)w[i].L * D, 1.0f);
        prev[i] = test_rand_array(&rng, (size_t)C * w[i].ov, 1.0f);
        jobs[i] = (struct flow_job){w[i].steps, w[i].g, w[i].shift, w[i].L, w[i].ov, cond[i], w[i].ov ? prev[i] : NULL,
                                    jobs[i].x};
        struct flow_job single = jobs[i]; /* the same window alone, into its own latents */
        single.x = x_single[i];
        assert_int_equal(flow_cuda_window_run(f, &single), 0);
    }
    int rc[4];
    assert_int_equal(fb.begin(fb.ctx, 4, jobs), 0);
    assert_int_equal(fb.end(fb.ctx, 4, jobs, rc), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(rc[i], 0);
        double e = test_rel_error(jobs[i].x, x_single[i], (size_t)C * w[i].L);
        printf("window %d (L %d, overlap %d, %d steps): rel %.3g batched vs alone\n", i, w[i].L, w[i].ov, w[i].steps,
               e);
        assert_true(e <= 1e-5);
        for (int c = 0; c < C; c++)
            assert_memory_equal(jobs[i].x + (size_t)c * w[i].L, prev[i] + (size_t)c * w[i].ov, sizeof(float) * w[i].ov);
    }
    /* a dropped window (x NULL) is not written; the others are */
    size_t n1 = (size_t)C * w[1].L;
    float *keep = jobs[1].x, *before = malloc(sizeof(float) * n1);
    memcpy(before, keep, sizeof(float) * n1);
    assert_int_equal(fb.begin(fb.ctx, 2, jobs), 0);
    jobs[1].x = NULL;
    assert_int_equal(fb.end(fb.ctx, 2, jobs, rc), 0);
    assert_int_equal(rc[0], 0);
    jobs[1].x = keep;
    assert_memory_equal(keep, before, sizeof(float) * n1);
    free(before);
    for (int i = 0; i < 4; i++)
        free(jobs[i].x), free(x_single[i]), free(cond[i]), free(prev[i]);
    fb.close(fb.ctx);
    flow_cuda_free(f);
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 6 */
static void test_cuda_batch_timing(void **state)
{
    (void)state;
    const char *on = getenv("MM3_BENCH_BATCH");
    if (!on || strcmp(on, "1") || cuda_device_count_safe() < 1) skip();
    /* the release DiT (models/minimax-music3 transformer config.json), random weights */
    struct dit_config cfg = test_stage1_release_dit(36);
    const int L = 689, steps = 4, W = 4;
    enum mm3_matmul_precision precs[2] = {MM3_MATMUL_TF32, MM3_MATMUL_BF16};
    for (int pi = 0; pi < 2; pi++) {
        struct dit_cuda *dit;
        struct flow_cuda *f;
        struct flow_batch fb;
        assert_int_equal(dit_cuda_load_random(&dit, &cfg, precs[pi], 7), 0);
        assert_int_equal(flow_cuda_create_with(&f, dit, L), 0);
        assert_int_equal(flow_cuda_batch_open(f, W, &fb), 0);
        struct flow_job jobs[4];
        for (int i = 0; i < W; i++)
            jobs[i] = (struct flow_job){steps,
                                        1.7f,
                                        1.0f,
                                        L,
                                        172,
                                        test_rand_array(&rng, (size_t)L * cfg.cond_dim, 1.0f),
                                        test_rand_array(&rng, (size_t)cfg.in_ch * 172, 1.0f),
                                        test_rand_array(&rng, (size_t)cfg.in_ch * L, 1.0f)};
        int rc[4];
        double per[2];
        for (int k = 0; k < 2; k++) {
            int n = k ? W : 1;
            assert_int_equal(fb.begin(fb.ctx, n, jobs), 0); /* warm-up */
            assert_int_equal(fb.end(fb.ctx, n, jobs, rc), 0);
            double t0 = wall_s();
            assert_int_equal(fb.begin(fb.ctx, n, jobs), 0);
            double t_queue = wall_s() - t0;
            assert_int_equal(fb.end(fb.ctx, n, jobs, rc), 0);
            double t = wall_s() - t0;
            per[k] = t / n * 30.0 / steps;
            printf("%s: %d window(s) per batch: %.3f s per window (30 steps, CFG); begin returned after %.1f ms\n",
                   mm3_matmul_precision_name(precs[pi]), n, per[k], t_queue * 1e3);
        }
        printf("%s: batching %d windows: %.1f%% less time per window\n", mm3_matmul_precision_name(precs[pi]), W,
               100.0 * (1.0 - per[1] / per[0]));
        for (int i = 0; i < W; i++)
            free((void *)jobs[i].cond), free((void *)jobs[i].prev), free(jobs[i].x);
        fb.close(fb.ctx);
        flow_cuda_free(f);
    }
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone),         cmocka_unit_test(test_trickle_overlapped),
        cmocka_unit_test(test_cancel_and_failure_mid_batch), cmocka_unit_test(test_bad_batch),
#ifdef MM3_HAVE_CUDA
        cmocka_unit_test(test_cuda_batch_matches_single),    cmocka_unit_test(test_cuda_batch_timing),
#endif
    };
    return cmocka_run_group_tests(tests, test_stage1_golden_setup, teardown);
}
