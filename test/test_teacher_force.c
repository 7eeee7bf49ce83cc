/* Teacher forcing (stage0/teacher_force.h): frames recomputed from the codes of a
 * seeded generation equal the generated ones; frames from the golden replay draws
 * equal the reference's frame_hiddens (models loaded for the GPU are refused); a resumed
 * generation continues the same song;
 * bad codes are refused; another geometry works too. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cmocka needs the headers above */
#include <cmocka.h>

#include "common/ckpt_gen.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "common/sampler.h"
#include "stage0/generate.h"
#include "stage0/teacher_force.h"
#include "support/test_stage0.h"
#include "support/test_support.h"

#define TF_REL_TOL 1e-5

/* A generated song: frames, and the codes of every LM step (step 0 included). */
struct song {
    int width, ncb, n_frames, n_steps;
    float *frames;
    int32_t *frame_codes; /* codes passed with each frame */
    int32_t *steps;       /* [n_steps, ncb] */
};

static void song_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    struct song *s = ctx;
    assert_int_equal(t, s->n_frames);
    memcpy(s->frames + (size_t)t * s->width, frame, sizeof(float) * s->width);
    memcpy(s->frame_codes + (size_t)t * s->ncb, codes, sizeof(int32_t) * s->ncb);
    s->n_frames++;
}

static void song_alloc(struct song *s, const struct test_stage0 *m, int max_frames)
{
    memset(s, 0, sizeof *s);
    s->ncb = m->dd.cfg.n_codebooks;
    s->width = s->ncb * m->lm.cfg.hidden;
    s->frames = malloc(sizeof(float) * (size_t)max_frames * s->width);
    s->frame_codes = malloc(sizeof(int32_t) * (size_t)max_frames * s->ncb);
    s->steps = malloc(sizeof(int32_t) * ((size_t)max_frames + 1) * s->ncb);
    assert_true(s->frames && s->frame_codes && s->steps);
}

static void song_free(struct song *s)
{
    free(s->frames);
    free(s->frame_codes);
    free(s->steps);
}

/* Step g to the end (or until n_steps reach stop_after), recording every step's draws. */
static void song_run(struct generate *g, struct song *s, int stop_after)
{
    while (!g->done && s->n_steps < stop_after) {
        assert_int_equal(generate_step(g), 0);
        if (g->stop == GENERATE_STOP_TOKEN) break; /* the stop draw has no codes */
        memcpy(s->steps + (size_t)s->n_steps * s->ncb, g->codes, sizeof(int32_t) * s->ncb);
        s->n_steps++;
    }
}

static const int32_t k_prompt[2][6] = {
    {151644, 151671, 64, 65, 151645, 151669},
    {151644, 151654, 151654, 151654, 151645, 151669},
};

static void generate_song(struct test_stage0 *m, uint64_t seed, int max_frames, struct song *s)
{
    song_alloc(s, m, max_frames);
    struct sampler sp;
    sampler_init_seeded(&sp, seed);
    struct generate g;
    struct generate_hooks hooks = {.ctx = s, .on_frame = song_frame};
    assert_int_equal(generate_begin(&g, &m->lm, &m->dd, &sp, &k_prompt[0][0], 6, max_frames, SAMPLER_CFG_SCALE, &hooks),
                     0);
    song_run(&g, s, 1 << 30);
    generate_end(&g);
    assert_int_equal(s->n_frames, s->n_steps - 1);
}

static void test_equals_generation(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    /* 300 frames: the LM and the depth decoder run in several chunks */
    int F = 2 * TEACHER_FORCE_CHUNK + 44;
    struct song s;
    generate_song(m, 11, F, &s);
    assert_int_equal(s.n_frames, F);
    float *tf = malloc(sizeof(float) * (size_t)F * s.width);
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, &k_prompt[0][0], 6, s.steps, s.n_steps, tf), 0);
    double rel = test_rel_error(tf, s.frames, (size_t)F * s.width);
    printf("teacher forcing vs generation: rel %.3g over %d frames\n", rel, F);
    assert_true(rel <= TF_REL_TOL);
    /* frame by frame too: no frame may hide in the norm of the whole */
    for (int t = 0; t < F; t++)
        assert_true(test_rel_error(tf + (size_t)t * s.width, s.frames + (size_t)t * s.width, s.width) <= 1e-4);
    /* a changed code changes its frame (and only later ones): code 3, or with fewer than 5
     * codebooks the second-to-last (the last code of a step feeds only the next frame) */
    s.steps[(size_t)100 * s.ncb + (s.ncb > 4 ? 3 : s.ncb - 2)] ^= 1;
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, &k_prompt[0][0], 6, s.steps, s.n_steps, tf), 0);
    assert_true(test_rel_error(tf, s.frames, (size_t)99 * s.width) <= TF_REL_TOL);
    assert_true(test_rel_error(tf + (size_t)99 * s.width, s.frames + (size_t)99 * s.width, s.width) > 1e-3);
    free(tf);
    song_free(&s);
}

static void test_golden_replay(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    struct test_golden_codes gc;
    test_stage0_golden_codes("case1.safetensors", m->dd.cfg.n_codebooks, &gc);
    int32_t *ids = gc.ids, *codes = gc.codes;
    int P = gc.P, n_steps = gc.n_steps;
    int64_t T = gc.n_frames;
    size_t W = gc.width;
    float *got = malloc(sizeof(float) * (size_t)T * W);
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, ids, P, codes, n_steps, got), 0);
    double rel = test_rel_error(got, gc.want, (size_t)T * W);
    printf("teacher forcing vs golden case1 frame_hiddens: rel %.3g over %lld frames\n", rel, (long long)T);
    assert_true(rel <= 1e-4);
    /* Models loaded for the GPU (matrices left in the checkpoint): the CPU paths
     * refuse them with a message (their backend recomputes: teacher_force_stream_backend). */
    struct talker hl;
    struct depth hd;
    assert_int_equal(talker_backend_load_models(TALKER_BACKEND_CUDA, m->root, &hl, &hd), 0);
    assert_int_equal(teacher_force_frames(&hl, &hd, ids, P, codes, n_steps, got), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "loaded for the GPU"));
    struct generate g;
    struct sampler sp;
    sampler_init_seeded(&sp, 1);
    assert_int_equal(teacher_force_resume(&g, &hl, &hd, &sp, ids, P, 8, SAMPLER_CFG_SCALE, NULL, codes, 0), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "loaded for the GPU"));
    talker_free(&hl);
    depth_free(&hd);
    free(got);
    test_golden_codes_free(&gc);
}

/* Generation cut after k steps and resumed from the k journaled steps gives the
 * uninterrupted song: the same codes, and frames equal within the tolerance. */
static void test_resume(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    int F = 160;
    struct song full, part;
    generate_song(m, 5, F, &full);
    const int cuts[] = {0, 1, 2, 60, TEACHER_FORCE_CHUNK + 1, F, F + 1};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        int k = cuts[c];
        song_alloc(&part, m, F);
        struct sampler sp;
        sampler_init_seeded(&sp, 5);
        struct generate g;
        struct generate_hooks hooks = {.ctx = &part, .on_frame = song_frame};
        assert_int_equal(teacher_force_resume(&g, &m->lm, &m->dd, &sp, &k_prompt[0][0], 6, F, SAMPLER_CFG_SCALE, &hooks,
                                              full.steps, k),
                         0);
        assert_int_equal(part.n_frames, k > 0 ? k - 1 : 0); /* the journaled frames came back */
        memcpy(part.steps, full.steps, sizeof(int32_t) * k * full.ncb);
        part.n_steps = k;
        assert_int_equal(g.done, k == F + 1);
        song_run(&g, &part, 1 << 30);
        generate_end(&g);
        assert_int_equal(part.n_frames, F);
        assert_memory_equal(part.steps, full.steps, sizeof(int32_t) * (F + 1) * full.ncb);
        assert_memory_equal(part.frame_codes, full.frame_codes, sizeof(int32_t) * F * full.ncb);
        assert_true(test_rel_error(part.frames, full.frames, (size_t)F * full.width) <= TF_REL_TOL);
        song_free(&part);
    }
    song_free(&full);
}

/* Resumed into rows 3 / 1 of a shared 4-row state whose other rows hold another
 * song: the rows do not see each other, the song is the uninterrupted one. */
static void test_attach_shared_rows(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    int F = 40, k = 17;
    struct song full, other, part;
    generate_song(m, 8, F, &full);
    generate_song(m, 9, F, &other);
    struct talker_state ts;
    assert_int_equal(talker_state_init(&ts, &m->lm, 4, 6 + F), 0);
    struct sampler s_other, sp;
    sampler_init_seeded(&s_other, 9);
    sampler_init_seeded(&sp, 8);
    struct generate go, g;
    assert_int_equal(teacher_force_attach(&go, &m->lm, &m->dd, &s_other, &ts, 0, 2, &k_prompt[0][0], 6, F,
                                          SAMPLER_CFG_SCALE, NULL, other.steps, 30),
                     0);
    song_alloc(&part, m, F);
    struct generate_hooks hooks = {.ctx = &part, .on_frame = song_frame};
    assert_int_equal(teacher_force_attach(&g, &m->lm, &m->dd, &sp, &ts, 3, 1, &k_prompt[0][0], 6, F, SAMPLER_CFG_SCALE,
                                          &hooks, full.steps, k),
                     0);
    assert_int_equal(g.phase, GENERATE_SAMPLE);
    assert_int_equal(g.step, k);
    part.n_steps = k;
    memcpy(part.steps, full.steps, sizeof(int32_t) * k * full.ncb);
    /* interleave the two requests' steps on the shared state */
    while (!g.done) {
        if (!go.done) assert_int_equal(generate_step(&go), 0);
        assert_int_equal(generate_step(&g), 0);
        if (g.stop == GENERATE_STOP_TOKEN) break;
        memcpy(part.steps + (size_t)part.n_steps * full.ncb, g.codes, sizeof(int32_t) * full.ncb);
        part.n_steps++;
    }
    assert_int_equal(part.n_frames, full.n_frames);
    assert_memory_equal(part.steps, full.steps, sizeof(int32_t) * full.n_steps * full.ncb);
    assert_true(test_rel_error(part.frames, full.frames, (size_t)F * full.width) <= TF_REL_TOL);
    generate_end(&g);
    generate_end(&go);
    talker_state_free(&ts);
    song_free(&part);
    song_free(&other);
    song_free(&full);
}

static void test_bad_input(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    int ncb = m->dd.cfg.n_codebooks, W = ncb * m->lm.cfg.hidden;
    int32_t codes[3 * 64] = {0};
    float *fr = malloc(sizeof(float) * 2 * W);
    codes[ncb + 2] = m->dd.cfg.audio_vocab; /* step 1, codebook 2: one past the end */
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, &k_prompt[0][0], 6, codes, 3, fr), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "step 1 codebook 2"));
    codes[ncb + 2] = 0;
    codes[2 * ncb] = SAMPLER_N_CODES; /* c0 of step 2 */
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, &k_prompt[0][0], 6, codes, 3, fr), -EINVAL);
    codes[2 * ncb] = -1;
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, &k_prompt[0][0], 6, codes, 3, fr), -EINVAL);
    codes[2 * ncb] = 0;
    int32_t bad_ids[2][2] = {{m->lm.cfg.vocab, 0}, {0, 0}};
    assert_true(teacher_force_frames(&m->lm, &m->dd, &bad_ids[0][0], 2, codes, 3, fr) < 0);
    assert_true(teacher_force_frames(&m->lm, &m->dd, &k_prompt[0][0], 0, codes, 3, fr) < 0);
    /* zero or one step: nothing to emit, not an error */
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, &k_prompt[0][0], 6, codes, 1, fr), 0);
    assert_int_equal(teacher_force_frames(&m->lm, &m->dd, &k_prompt[0][0], 6, codes, 0, fr), 0);
    /* resume past the budget */
    struct generate g;
    struct sampler sp;
    sampler_init_seeded(&sp, 1);
    assert_int_equal(teacher_force_resume(&g, &m->lm, &m->dd, &sp, &k_prompt[0][0], 6, 1, 1.5f, NULL, codes, 3),
                     -EINVAL);
    free(fr);
}

/* Another geometry (4 codebooks of 300, GQA 3:1, head_dim * heads != hidden). */
static void test_other_geometry(void **state)
{
    (void)state;
    struct test_stage0 m;
    char *dir = test_stage0_other_geometry(&m, "tf_geometry");
    int F = TEACHER_FORCE_CHUNK + 20;
    struct song s;
    generate_song(&m, 3, F, &s);
    assert_int_equal(s.width, 4 * 24);
    float *tf = malloc(sizeof(float) * (size_t)s.n_frames * s.width);
    assert_int_equal(teacher_force_frames(&m.lm, &m.dd, &k_prompt[0][0], 6, s.steps, s.n_steps, tf), 0);
    assert_true(test_rel_error(tf, s.frames, (size_t)s.n_frames * s.width) <= TF_REL_TOL);
    free(tf);
    song_free(&s);
    test_stage0_free(&m);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_equals_generation),
        cmocka_unit_test(test_golden_replay),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_attach_shared_rows),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_other_geometry),
    };
    return cmocka_run_group_tests(tests, test_stage0_golden_setup, test_stage0_golden_teardown);
}
