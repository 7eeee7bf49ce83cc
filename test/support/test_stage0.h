/* Stage-0 models (talker + depth decoder) for tests, and a cmocka group fixture
 * that loads them from the golden checkpoint:
 *
 *     return cmocka_run_group_tests(tests, test_stage0_golden_setup, test_stage0_golden_teardown);
 *     ...
 *     struct test_stage0 *m = *state;   (NULL without the golden directory: skip)
 *
 * Header only (static inline): test/CMakeLists.txt links just test_support.c into
 * each test, and only the tests that include this need the stage-0 models. */
#ifndef MM3_TEST_STAGE0_H
#define MM3_TEST_STAGE0_H

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
#include "common/safetensors.h"
#include "common/sampler.h"
#include "stage0/model/depth.h"
#include "stage0/model/talker.h"
#include "support/test_support.h"

struct test_stage0 {
    char root[1024]; /* the checkpoint directory */
    struct talker lm;
    struct depth dd;
};

/* Both models of the checkpoint in dir: 0, or the loader's error with nothing left loaded. */
static inline int test_stage0_load(struct test_stage0 *m, const char *dir)
{
    snprintf(m->root, sizeof m->root, "%s", dir);
    int rc = talker_load(&m->lm, dir);
    if (rc < 0) return rc;
    rc = depth_load(&m->dd, dir);
    if (rc < 0) talker_free(&m->lm);
    return rc;
}

static inline void test_stage0_free(struct test_stage0 *m)
{
    talker_free(&m->lm);
    depth_free(&m->dd);
}

static inline int test_stage0_golden_setup(void **state)
{
    const char *g = test_golden_dir();
    if (!g) return 0;
    struct test_stage0 *m = calloc(1, sizeof *m);
    char root[1024];
    snprintf(root, sizeof root, "%s/checkpoint", g);
    if (!m || test_stage0_load(m, root) < 0) {
        fprintf(stderr, "load %s: %s\n", root, mm3_last_error());
        free(m);
        return -1;
    }
    *state = m;
    return 0;
}

static inline int test_stage0_golden_teardown(void **state)
{
    struct test_stage0 *m = *state;
    if (m) {
        test_stage0_free(m);
        free(m);
    }
    return 0;
}

/* A golden case's draws as teacher forcing takes them: the prompt pair ids[2, P],
 * codes[n_steps, n_codebooks] (c0 as a code index, then the depth codes; the stop
 * step left out) and the reference frame_hiddens want[n_frames, width]. */
struct test_golden_codes {
    int32_t *ids, *codes;
    int P, n_steps;
    float *want;
    int64_t n_frames;
    size_t width;
};

static inline void test_stage0_golden_codes(const char *case_file, int ncb, struct test_golden_codes *g)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", test_golden_dir(), case_file);
    struct st_file f;
    assert_int_equal(st_file_open(&f, path), 0);
    const struct st_tensor *tp = st_file_find(&f, "text_ids_pair"), *tl = st_file_find(&f, "lm_sampled"),
                           *td = st_file_find(&f, "depth_sampled");
    assert_true(tp && tl && td);
    int64_t *ids64 = malloc(tp->nbytes), *lm = malloc(tl->nbytes), *dep = malloc(td->nbytes);
    assert_int_equal(st_file_read(&f, tp, ids64), 0);
    assert_int_equal(st_file_read(&f, tl, lm), 0);
    assert_int_equal(st_file_read(&f, td, dep), 0);
    int nd;
    int64_t sh[ST_MAX_DIMS];
    assert_int_equal(st_file_load_f32(&f, "frame_hiddens", &g->want, &nd, sh), 0);
    g->P = (int)tp->shape[1];
    int n_lm = (int)tl->shape[0];
    st_file_close(&f);
    g->ids = malloc(sizeof(int32_t) * 2 * (size_t)g->P);
    for (int i = 0; i < 2 * g->P; i++)
        g->ids[i] = (int32_t)ids64[i];
    g->n_steps = lm[n_lm - 1] == SAMPLER_STOP_ID ? n_lm - 1 : n_lm;
    g->codes = malloc(sizeof(int32_t) * (size_t)g->n_steps * ncb);
    for (int s = 0; s < g->n_steps; s++) {
        g->codes[(size_t)s * ncb] = (int32_t)(lm[s] - SAMPLER_CODE_OFFSET);
        for (int j = 1; j < ncb; j++)
            g->codes[(size_t)s * ncb + j] = (int32_t)dep[(size_t)s * (ncb - 1) + j - 1];
    }
    assert_int_equal(sh[0], g->n_steps - 1);
    g->n_frames = sh[0];
    g->width = (size_t)sh[1];
    free(ids64), free(lm), free(dep);
}

static inline void test_golden_codes_free(struct test_golden_codes *g)
{
    free(g->ids), free(g->codes), free(g->want);
}

/* A teacher_force_sink's context collecting the frames into f[n, width], asserting
 * they come in order, each once (emit: test_frames_emit). */
struct test_frames {
    float *f;
    size_t width;
    int n;
};

static inline int test_frames_emit(void *ctx, int t0, const float *frames, int n)
{
    struct test_frames *a = ctx;
    assert_int_equal(t0, a->n);
    memcpy(a->f + (size_t)t0 * a->width, frames, sizeof(float) * (size_t)n * a->width);
    a->n += n;
    return 0;
}

/* Nothing of the geometry is fixed: a checkpoint of another shape than tiny-a's
 * (GQA group 3, head_dim * heads != hidden, 4 codebooks of 300, top-level
 * rope_theta), written into a fresh directory named after tag and loaded into m.
 * Returns the directory (test_remove_tree + free it). */
static inline char *test_stage0_other_geometry(struct test_stage0 *m, const char *tag)
{
    struct ckpt_gen_geometry geo;
    assert_int_equal(ckpt_gen_preset("tiny", &geo), 0);
    geo.lm_hidden = 24, geo.lm_layers = 2, geo.lm_heads = 3, geo.lm_kv_heads = 1, geo.lm_head_dim = 10;
    geo.lm_intermediate = 40, geo.lm_vocab = SAMPLER_CODE_OFFSET + SAMPLER_N_CODES + 7, geo.lm_rope_theta = 10000.0;
    geo.dd_layers = 1, geo.dd_heads = 4, geo.dd_intermediate = 20, geo.dd_audio_vocab = 300, geo.dd_codebooks = 4;
    geo.dd_max_positions = 4;
    char *dir = test_make_tmpdir(tag);
    struct ckpt_gen_opts o = {.seed = 5, .threads = 1, .rope_top_level = 1};
    if (ckpt_gen_write(dir, &geo, &o) < 0) fail_msg("ckpt_gen_write: %s", mm3_last_error());
    assert_int_equal(test_stage0_load(m, dir), 0);
    return dir;
}

#endif
