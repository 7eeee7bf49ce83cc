/* Stage-1 models (condition encoder + DiT) for the window-loop tests, a cmocka group
 * fixture that loads them from the golden checkpoint, and a stand-in vocoder:
 *
 *     return cmocka_run_group_tests(tests, test_stage1_golden_setup, test_stage1_golden_teardown);
 *     ...
 *     struct test_stage1 *m = *state;   (NULL without the golden directory: skip)
 *
 * Header only (static inline): test/CMakeLists.txt links just test_support.c into
 * each test, and only the tests that include this need the stage-1 models. */
#ifndef MM3_TEST_STAGE1_H
#define MM3_TEST_STAGE1_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "support/test_support.h"

/* The stand-in vocoder's samples per latent frame. */
#define TEST_STAGE1_FAKE_HOP 512

struct test_stage1 {
    struct condition_model *cm;
    struct dit_model *dm;
};

static inline int test_stage1_golden_setup(void **state)
{
    const char *g = test_golden_dir();
    if (!g) return 0;
    char root[1024];
    snprintf(root, sizeof root, "%s/checkpoint", g);
    struct test_stage1 *m = calloc(1, sizeof *m);
    if (!m || condition_load(&m->cm, root) < 0 || dit_load(&m->dm, root) < 0) {
        fprintf(stderr, "load %s: %s\n", root, mm3_last_error());
        if (m) condition_free(m->cm);
        free(m);
        return -1;
    }
    *state = m;
    return 0;
}

static inline int test_stage1_golden_teardown(void **state)
{
    struct test_stage1 *m = *state;
    if (m) {
        condition_free(m->cm);
        dit_free(m->dm);
        free(m);
    }
    return 0;
}

/* The release DiT's block shapes (the transformer config.json of the release: 2048
 * wide, 32 x 64 heads, rotary 32, FFN 8192, condition 2048, Fourier 256, 128 latent
 * channels) with n_layers blocks, for tests on random weights; hidden and cat_dim are
 * left to the loader. */
static inline struct dit_config test_stage1_release_dit(int n_layers)
{
    return (struct dit_config){.in_ch = 128,
                               .cond_dim = 2048,
                               .n_layers = n_layers,
                               .n_heads = 32,
                               .head_dim = 64,
                               .ff_inner = 8192,
                               .rotary_dim = 32,
                               .fourier_dim = 256};
}

/* A render_decoder's decode without a vocoder (ctx: the struct dit_model): sample n of
 * channel ch is 3 x latent n / TEST_STAGE1_FAKE_HOP of that channel's half of the
 * latent channels, so chunking shows in the PCM and clamping has something to do. */
static inline int test_stage1_fake_decode(void *ctx, const float *lat, int L, float *pcm)
{
    const struct dit_model *dm = ctx;
    int C = dm->cfg.in_ch;
    for (int ch = 0; ch < 2; ch++)
        for (int n = 0; n < L * TEST_STAGE1_FAKE_HOP; n++)
            pcm[(size_t)ch * L * TEST_STAGE1_FAKE_HOP + n] =
                3.0f * lat[(size_t)ch * (C / 2) * L + n / TEST_STAGE1_FAKE_HOP];
    return 0;
}

#endif
