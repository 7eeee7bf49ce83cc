/* Window loop: streaming chunk sizes and timing for several song lengths, total length,
 * seeded reproducibility, clamping, and bad input (wrong width, zero frames, NaN). Uses
 * the tiny-a condition encoder and DiT with a stand-in vocoder (hop 512) to stay fast. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt_gen.h"
#include "common/error.h"
#include "stage1/render.h"
#include "stage1/vocoder.h"
#include "support/test_stage1.h"
#include "support/test_support.h"

#define HOP TEST_STAGE1_FAKE_HOP

#define MAX_CHUNKS 64
struct record {
    int n_chunks;
    int sizes[MAX_CHUNKS];
    int at_finish[MAX_CHUNKS]; /* emitted during render_finish */
    int finishing;
    int64_t total;
    int bad_values; /* NaN or outside [-1, 1] */
    int clamped;    /* exactly +-1 */
    uint64_t hash;
};

static int record_emit(void *ctx, const float *pcm, int n)
{
    struct record *r = ctx;
    if (r->n_chunks < MAX_CHUNKS) {
        r->sizes[r->n_chunks] = n;
        r->at_finish[r->n_chunks] = r->finishing;
    }
    r->n_chunks++;
    r->total += n;
    for (int i = 0; i < 2 * n; i++) {
        if (!(pcm[i] >= -1.0f && pcm[i] <= 1.0f)) r->bad_values++;
        if (fabsf(pcm[i]) == 1.0f) r->clamped++;
        uint32_t u;
        memcpy(&u, &pcm[i], 4);
        r->hash = (r->hash ^ u) * 1099511628211ull;
    }
    return 0;
}

static float *make_frames(const struct test_stage1 *m, int T, int *width)
{
    *width = m->cm->cfg.n_layers * m->cm->cfg.hidden;
    float *f = malloc(sizeof(float) * (size_t)(T ? T : 1) * *width);
    for (size_t i = 0; i < (size_t)T * *width; i++)
        f[i] = sinf(0.013f * (float)i) * 2.0f;
    return f;
}

static struct render *make_render(const struct test_stage1 *m, struct record *rec, uint64_t seed)
{
    struct render_params p = {
        .n_steps = 1, /* the schedule does not change the window bookkeeping */
        .guidance = 1.7f,
        .noise = {RENDER_NOISE_SEEDED, seed, 0, NULL, NULL},
        .decoder = {m->dm, HOP, test_stage1_fake_decode},
        .sink = {rec, record_emit},
    };
    struct render *r;
    assert_int_equal(render_create(&r, m->cm, m->dm, &p), 0);
    return r;
}

/* Push T frames in pieces of `piece`, then finish. */
static void run_song(const struct test_stage1 *m, int T, int piece, struct record *rec, uint64_t seed)
{
    int W;
    float *f = make_frames(m, T, &W);
    struct render *r = make_render(m, rec, seed);
    for (int i = 0; i < T; i += piece) {
        int n = T - i < piece ? T - i : piece;
        assert_int_equal(render_push_frames(r, f + (size_t)i * W, n, W), 0);
    }
    rec->finishing = 1;
    assert_int_equal(render_finish(r), 0);
    assert_int_equal(render_samples_emitted(r), rec->total);
    render_free(r);
    free(f);
}

static void test_chunks(void **state)
{
    struct test_stage1 *m = *state;
    if (!m) skip();
    /* expected chunks in latents (x 512 samples), and whether each comes at render_finish */
    static const struct {
        int T, n, lat[8], fin[8];
    } cases[] = {
        {50, 1, {172}, {1}},                  /* one short window: all of it */
        {200, 2, {431, 258}, {0, 1}},         /* full window, last only known at the end */
        {201, 2, {431, 261}, {0, 1}},         /* frame 201 drops the tail; last L = 347 */
        {225, 2, {431, 344}, {0, 1}},         /* last 125 frames: L = 430 */
        {350, 3, {431, 345, 430}, {0, 0, 1}}, /* case1's layout */
        {750, 7, {431, 345, 345, 345, 345, 345, 430}, {0, 0, 0, 0, 0, 0, 1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct record rec = {0};
        run_song(m, cases[c].T, 25, &rec, 1);
        int K = render_window_count(cases[c].T);
        printf("T=%d: %d windows, %d chunks, %lld samples\n", cases[c].T, K, rec.n_chunks, (long long)rec.total);
        assert_int_equal(rec.n_chunks, cases[c].n);
        for (int i = 0; i < rec.n_chunks; i++) {
            assert_int_equal(rec.sizes[i], cases[c].lat[i] * HOP);
            assert_int_equal(rec.at_finish[i], cases[c].fin[i]);
        }
        /* docs/model.md §9.2: 512 (431 + 345 (K-2) + L_last - 86), or 512 L for one window */
        int last_F = cases[c].T - 100 * (K - 1);
        int L_last = condition_latent_len(&m->cm->cfg, last_F);
        int64_t want = K == 1 ? (int64_t)HOP * L_last : (int64_t)HOP * (431 + 345 * (K - 2) + L_last - 86);
        assert_int_equal(rec.total, want);
        assert_int_equal(rec.bad_values, 0);
        assert_true(rec.clamped > 0);
    }
    /* 750 frames: 7 windows, 1,324,032 samples (docs/model.md §9.2) */
    assert_int_equal(render_window_count(750), 7);
    assert_int_equal(render_window_count(9000), 89);
    assert_int_equal(render_window_count(200), 1);
    assert_int_equal(render_window_count(201), 2);
}

static void test_piece_size_irrelevant(void **state)
{
    struct test_stage1 *m = *state;
    if (!m) skip();
    struct record a = {0}, b = {0}, c = {0};
    run_song(m, 225, 225, &a, 9); /* all at once */
    run_song(m, 225, 7, &b, 9);   /* trickled */
    run_song(m, 225, 7, &c, 10);  /* another seed */
    assert_true(a.total == b.total && a.hash == b.hash);
    assert_true(c.total == a.total && c.hash != a.hash);
}

static void test_bad_input(void **state)
{
    struct test_stage1 *m = *state;
    if (!m) skip();
    int W;
    float *f = make_frames(m, 260, &W);
    struct record rec = {0};

    struct render *r = make_render(m, &rec, 1);
    assert_true(render_push_frames(r, f, 10, W + 1) == -EINVAL); /* wrong width */
    assert_non_null(strstr(mm3_last_error(), "width"));
    assert_true(render_push_frames(r, f, 10, W) < 0); /* failed for good */
    assert_true(render_finish(r) < 0);
    render_free(r);

    r = make_render(m, &rec, 1);
    assert_true(render_finish(r) == -EINVAL); /* zero frames */
    assert_non_null(strstr(mm3_last_error(), "no frames"));
    render_free(r);
    assert_int_equal(rec.n_chunks, 0);

    /* NaN in frame 230: window 0 was already emitted (clean); then nothing more */
    f[(size_t)230 * W + 3] = NAN;
    r = make_render(m, &rec, 1);
    assert_int_equal(render_push_frames(r, f, 200, W), 0);
    assert_int_equal(render_push_frames(r, f + (size_t)200 * W, 20, W), 0);
    int before = rec.n_chunks;
    assert_true(before == 1);
    assert_true(render_push_frames(r, f + (size_t)220 * W, 40, W) == -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "not finite"));
    assert_true(render_finish(r) < 0);
    assert_int_equal(rec.n_chunks, before);
    assert_int_equal(rec.bad_values, 0);
    render_free(r);

    /* already-mixed frames (stage 0 may send hidden values per frame) are accepted */
    r = make_render(m, &rec, 1);
    float *mixed = calloc((size_t)50 * m->cm->cfg.hidden, sizeof(float));
    assert_int_equal(render_push_frames(r, mixed, 50, m->cm->cfg.hidden), 0);
    assert_int_equal(render_finish(r), 0);
    render_free(r);
    free(mixed);
    free(f);
}

static int real_decode(void *ctx, const float *lat, int L, float *pcm)
{
    return vocoder_decode(ctx, lat, L, pcm);
}

/* Nothing of the geometry is fixed: a random checkpoint with other widths, head counts,
 * rotary/Fourier sizes, a sharded transformer and a vocoder of hop 32 renders a song
 * with the right chunking, finite and within [-1, 1]. */
static void test_other_geometry(void **state)
{
    (void)state;
    struct ckpt_gen_geometry g;
    assert_int_equal(ckpt_gen_preset("tiny", &g), 0);
    g.lm_hidden = 24, g.ce_out = 40, g.dit_in = 32, g.dit_layers = 3, g.dit_heads = 3, g.dit_head_dim = 24;
    g.dit_ff_inner = 50, g.dit_rotary = 8, g.dit_fourier = 12, g.dit_shard_bytes = 40000;
    g.voc_input_dim = 20, g.voc_hidden = 24, g.n_ratios = 3, g.ratios[0] = 4, g.ratios[1] = 4, g.ratios[2] = 2;
    char *dir = test_make_tmpdir("render-geom");
    assert_non_null(dir);
    struct ckpt_gen_opts o = {.seed = 3, .threads = 1};
    if (ckpt_gen_write(dir, &g, &o) < 0) fail_msg("ckpt_gen_write: %s", mm3_last_error());
    struct condition_model *cm;
    struct dit_model *dm;
    struct vocoder *voc;
    if (condition_load(&cm, dir) < 0 || dit_load(&dm, dir) < 0 || vocoder_load(&voc, dir) < 0)
        fail_msg("load: %s", mm3_last_error());
    assert_int_equal(dm->cfg.hidden, 72);
    assert_int_equal(dm->cfg.cond_dim, 40);
    assert_int_equal(cm->cfg.hidden * cm->cfg.n_layers, 24 * 8);
    int hop = vocoder_hop(voc);
    assert_int_equal(hop, 32);
    struct record rec = {0};
    struct render_params p = {
        .n_steps = 2,
        .guidance = 1.7f,
        .noise = {RENDER_NOISE_SEEDED, 5, 0, NULL, NULL},
        .decoder = {voc, hop, real_decode},
        .sink = {&rec, record_emit},
    };
    struct render *r;
    assert_int_equal(render_create(&r, cm, dm, &p), 0);
    int W = cm->cfg.hidden * cm->cfg.n_layers, T = 225;
    float *f = malloc(sizeof(float) * T * W);
    for (int i = 0; i < T * W; i++)
        f[i] = cosf(0.01f * i);
    assert_int_equal(render_push_frames(r, f, T, W), 0);
    rec.finishing = 1;
    assert_int_equal(render_finish(r), 0);
    assert_int_equal(rec.n_chunks, 2);
    assert_int_equal(rec.sizes[0], 431 * hop);
    assert_int_equal(rec.sizes[1], (430 - 86) * hop);
    assert_int_equal(rec.bad_values, 0);
    render_free(r);
    free(f);
    condition_free(cm);
    dit_free(dm);
    vocoder_free(voc);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_piece_size_irrelevant),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_other_geometry),
    };
    return cmocka_run_group_tests(tests, test_stage1_golden_setup, test_stage1_golden_teardown);
}
