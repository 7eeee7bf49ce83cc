/* The stage-0 AR loop: window plan and readiness, frame budget, seeded generation
 * (deterministic, prefix-stable, equal to its own replay), streaming order, bad
 * inputs, and the golden checker failing on tampered data. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* cmocka needs the headers above */
#include <cmocka.h>

#include "common/ckpt_gen.h"
#include "common/error.h"
#include "common/safetensors.h"
#include "common/sampler.h"
#include "stage0/generate.h"
#include "stage0/golden.h"
#include "support/test_stage0.h"
#include "support/test_support.h"

static void test_window_plan(void **state)
{
    (void)state;
    const int Ts[] = {1, 50, 199, 200, 201, 250, 299, 300, 301, 350, 9000};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        int T = Ts[i];
        int starts[128], k;
        window_starts(T, starts, &k);
        /* reference: [0] if T <= 200 else range(0, T - 100, 100) */
        int want = 0;
        if (T <= 200)
            want = 1;
        else
            for (int s = 0; s < T - 100; s += 100)
                want++;
        assert_int_equal(k, want);
        assert_int_equal(window_count(T), want);
        for (int w = 0; w < k; w++)
            assert_int_equal(starts[w], 100 * w);
        /* windows cover the song and the last one ends at T */
        int last_end = starts[k - 1] + 200 < T ? starts[k - 1] + 200 : T;
        assert_int_equal(last_end, T);
    }
}

static void test_windows_ready(void **state)
{
    (void)state;
    const int Ts[] = {1, 150, 200, 201, 299, 300, 301, 455};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        int T = Ts[i];
        int starts[16], k;
        window_starts(T, starts, &k);
        int prev = 0;
        for (int n = 0; n <= T; n++) {
            int r = windows_ready(n, 0);
            assert_true(r >= prev && r <= k); /* monotone, never past the final plan */
            for (int w = 0; w < r; w++) {
                int end = starts[w] + 200 < T ? starts[w] + 200 : T;
                assert_true(end <= n); /* every ready window has all its frames */
                assert_int_equal(end - starts[w], 200);
            }
            /* a complete 200-frame window is announced as soon as its frames exist */
            for (int w = r; w < k; w++)
                assert_true(starts[w] + 200 > n);
            prev = r;
        }
        assert_int_equal(windows_ready(T, 1), k);
        for (int w = 0; w < k; w++)
            assert_int_equal(window_is_last(w, T, 1), w == k - 1);
    }
    assert_int_equal(windows_ready(0, 1), 0);
    assert_int_equal(windows_ready(199, 0), 0);
    assert_int_equal(windows_ready(200, 0), 1);
}

static void test_frame_budget(void **state)
{
    (void)state;
    int n = -1;
    assert_int_equal(generate_frame_budget(2.0, 25.0, &n), 0);
    assert_int_equal(n, 50);
    assert_int_equal(generate_frame_budget(0.04, 25.0, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(generate_frame_budget(9.99, 25.0, &n), 0);
    assert_int_equal(n, 249); /* int() truncates */
    assert_int_equal(generate_frame_budget(1e12, 25.0, &n), 0);
    assert_int_equal(n, 9000);
    assert_true(generate_frame_budget(0.039, 25.0, &n) < 0);
    assert_true(generate_frame_budget(0.0, 25.0, &n) < 0);
    assert_true(generate_frame_budget(-1.0, 25.0, &n) < 0);
    assert_true(generate_frame_budget(NAN, 25.0, &n) < 0);
}

struct collect {
    int width, ncb, n, order_ok;
    float *frames;
    int64_t *codes;
};

static void collect_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    struct collect *c = ctx;
    if (t != c->n) c->order_ok = 0;
    memcpy(c->frames + (size_t)t * c->width, frame, sizeof(float) * c->width);
    for (int j = 0; j < c->ncb; j++)
        c->codes[(size_t)t * c->ncb + j] = codes[j];
    c->n = t + 1;
}

/* A short prompt pair in the uncond-twin shape; the ids are valid tiny-a ids. */
static const int32_t k_prompt[2][6] = {
    {151644, 151671, 64, 65, 151645, 151669},
    {151644, 151654, 151654, 151654, 151645, 151669},
};

static int run(struct test_stage0 *m, struct sampler *sp, int max_frames, struct collect *c, enum generate_stop *stop)
{
    int H = m->lm.cfg.hidden, ncb = m->dd.cfg.n_codebooks;
    memset(c, 0, sizeof *c);
    c->width = ncb * H;
    c->ncb = ncb;
    c->order_ok = 1;
    c->frames = malloc(sizeof(float) * (size_t)max_frames * ncb * H);
    c->codes = malloc(sizeof(int64_t) * (size_t)max_frames * ncb);
    struct generate g;
    struct generate_hooks hooks = {.ctx = c, .on_frame = collect_frame};
    int rc = generate_begin(&g, &m->lm, &m->dd, sp, &k_prompt[0][0], 6, max_frames, SAMPLER_CFG_SCALE, &hooks);
    if (rc < 0) return rc;
    int steps = 0;
    while (!g.done && rc == 0) {
        int before = c->n;
        rc = generate_step(&g);
        if (c->n - before > 1) rc = -1; /* at most one frame per step */
        steps++;
    }
    *stop = g.stop;
    generate_end(&g);
    return rc;
}

static void free_collect(struct collect *c)
{
    free(c->frames);
    free(c->codes);
}

static void test_seeded_generation(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    struct sampler s1, s2, s3;
    struct collect a, b, c;
    enum generate_stop st;
    sampler_init_seeded(&s1, 42);
    assert_int_equal(run(m, &s1, 30, &a, &st), 0);
    assert_int_equal(a.n, 30);
    assert_true(a.order_ok);
    assert_int_equal(st, GENERATE_STOP_BUDGET);
    /* same seed: same song; shorter budget: a prefix of it */
    sampler_init_seeded(&s2, 42);
    assert_int_equal(run(m, &s2, 12, &b, &st), 0);
    assert_int_equal(b.n, 12);
    assert_memory_equal(b.codes, a.codes, sizeof(int64_t) * 12 * a.ncb);
    assert_memory_equal(b.frames, a.frames, sizeof(float) * 12 * a.width);
    /* another seed gives another song */
    sampler_init_seeded(&s3, 43);
    assert_int_equal(run(m, &s3, 30, &c, &st), 0);
    assert_true(memcmp(c.codes, a.codes, sizeof(int64_t) * 30 * a.ncb) != 0);
    for (int i = 0; i < 30 * a.ncb; i++) {
        int j = i % a.ncb;
        assert_true(a.codes[i] >= 0 && a.codes[i] < (j == 0 ? SAMPLER_N_CODES : m->dd.cfg.audio_vocab));
    }
    free_collect(&b);
    free_collect(&c);
    free_collect(&a);
}

static void test_replay_of_own_codes(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    struct sampler s1;
    struct collect a, b;
    enum generate_stop st;
    sampler_init_seeded(&s1, 7);
    assert_int_equal(run(m, &s1, 20, &a, &st), 0);
    int ncb = a.ncb;
    int64_t lm[21], depth[21 * 16];
    assert_true(ncb <= 16);
    /* The replay needs step 0's draws too, which are fed back but never emitted:
     * run step 0 alone and read them from the step object. */
    struct generate g;
    struct sampler s2;
    sampler_init_seeded(&s2, 7);
    struct collect dummy = {0};
    dummy.width = ncb * m->lm.cfg.hidden;
    dummy.ncb = ncb;
    dummy.frames = malloc(sizeof(float) * dummy.width);
    dummy.codes = malloc(sizeof(int64_t) * ncb);
    struct generate_hooks hooks = {.ctx = &dummy, .on_frame = collect_frame};
    assert_int_equal(generate_begin(&g, &m->lm, &m->dd, &s2, &k_prompt[0][0], 6, 1, SAMPLER_CFG_SCALE, &hooks), 0);
    assert_int_equal(generate_step(&g), 0); /* step 0: no frame, codes in g.codes */
    assert_int_equal(dummy.n, 0);
    lm[0] = SAMPLER_CODE_OFFSET + g.codes[0];
    for (int j = 1; j < ncb; j++)
        depth[j - 1] = g.codes[j];
    generate_end(&g);
    free_collect(&dummy);
    for (int t = 0; t < 20; t++) {
        lm[t + 1] = SAMPLER_CODE_OFFSET + a.codes[(size_t)t * ncb];
        for (int j = 1; j < ncb; j++)
            depth[(size_t)(t + 1) * (ncb - 1) + j - 1] = a.codes[(size_t)t * ncb + j];
    }
    struct sampler rp;
    sampler_init_replay(&rp, lm, 21, depth, 21 * (ncb - 1), ncb);
    assert_int_equal(run(m, &rp, 20, &b, &st), 0);
    assert_int_equal(b.n, 20);
    assert_memory_equal(b.codes, a.codes, sizeof(int64_t) * 20 * ncb);
    assert_memory_equal(b.frames, a.frames, sizeof(float) * 20 * a.width);
    assert_int_equal(rp.n_outside, 0);
    free_collect(&a);
    free_collect(&b);
}

static void test_stop_token(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    int ncb = m->dd.cfg.n_codebooks;
    int64_t lm[4] = {SAMPLER_CODE_OFFSET + 1, SAMPLER_CODE_OFFSET + 2, SAMPLER_CODE_OFFSET + 3, SAMPLER_STOP_ID};
    int64_t depth[3 * 16] = {0};
    struct sampler rp;
    struct collect c;
    enum generate_stop st;
    sampler_init_replay(&rp, lm, 4, depth, 3 * (ncb - 1), ncb);
    assert_int_equal(run(m, &rp, 100, &c, &st), 0);
    assert_int_equal(c.n, 2); /* step 0 not emitted, step 3 is the stop */
    assert_int_equal(st, GENERATE_STOP_TOKEN);
    assert_int_equal(c.codes[0], 2);
    free_collect(&c);
    /* a stop before the first emitted frame is an error, as in the reference */
    int64_t early[2] = {SAMPLER_CODE_OFFSET, SAMPLER_STOP_ID};
    sampler_init_replay(&rp, early, 2, depth, ncb - 1, ncb);
    assert_true(run(m, &rp, 100, &c, &st) < 0);
    assert_int_equal(c.n, 0);
    free_collect(&c);
}

static void test_bad_begin(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    struct sampler sp;
    sampler_init_seeded(&sp, 0);
    struct generate g;
    assert_true(generate_begin(&g, &m->lm, &m->dd, &sp, &k_prompt[0][0], 6, 0, 1.5f, NULL) < 0);
    assert_true(generate_begin(&g, &m->lm, &m->dd, &sp, &k_prompt[0][0], 6, 9001, 1.5f, NULL) < 0);
    assert_true(generate_begin(&g, &m->lm, &m->dd, &sp, &k_prompt[0][0], 0, 10, 1.5f, NULL) < 0);
    int32_t bad[2] = {m->lm.cfg.vocab, 0};
    assert_true(generate_begin(&g, &m->lm, &m->dd, &sp, bad, 1, 10, 1.5f, NULL) < 0);
}

/* Copy case0 into a fresh golden dir, optionally tampered; run the checker. */
static int golden_with(const char *tag, int tamper, int *n_pass, int *n_fail)
{
    const char *g = test_golden_dir();
    char *dir = test_make_tmpdir(tag);
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/checkpoint", g);
    snprintf(dst, sizeof dst, "%s/checkpoint", dir);
    assert_int_equal(symlink(src, dst), 0);
    snprintf(src, sizeof src, "%s/manifest.json", g);
    json_error_t e;
    json_t *man = json_load_file(src, 0, &e);
    assert_non_null(man);
    json_t *cases = json_object_get(man, "cases");
    json_t *one = json_array();
    json_array_append(one, json_array_get(cases, 0));
    json_object_set_new(man, "cases", one);
    snprintf(dst, sizeof dst, "%s/manifest.json", dir);
    assert_int_equal(json_dump_file(man, dst, 0), 0);
    json_decref(man);

    snprintf(src, sizeof src, "%s/case0.safetensors", g);
    struct st_file f;
    assert_int_equal(st_file_open(&f, src), 0);
    const char *keep[] = {"text_ids_pair", "lm_sampled", "depth_sampled", "frame_hiddens"};
    struct st_writer_tensor w[4];
    void *bufs[4];
    for (int i = 0; i < 4; i++) {
        const struct st_tensor *t = st_file_find(&f, keep[i]);
        assert_non_null(t);
        bufs[i] = malloc(t->nbytes);
        assert_int_equal(st_file_read(&f, t, bufs[i]), 0);
        w[i] = (struct st_writer_tensor){keep[i], t->dtype, t->ndim, {0}, bufs[i]};
        memcpy(w[i].shape, t->shape, sizeof w[i].shape);
    }
    st_file_close(&f);
    if (tamper == 1) ((float *)bufs[3])[5] += 0.05f; /* one frame value off */
    if (tamper == 2) ((int64_t *)bufs[2])[10] ^= 1;  /* one forced depth code changed */
    snprintf(dst, sizeof dst, "%s/case0.safetensors", dir);
    assert_int_equal(st_write_file(dst, w, 4, NULL), 0);
    for (int i = 0; i < 4; i++)
        free(bufs[i]);
    FILE *out = tmpfile();
    int rc = golden_check_dir(dir, out, n_pass, n_fail);
    fclose(out);
    test_remove_tree(dir);
    free(dir);
    return rc;
}

static void test_golden_checker_fails_on_tampering(void **state)
{
    if (!*state) skip();
    int p, f;
    assert_int_equal(golden_with("golden_ok", 0, &p, &f), 0);
    assert_int_equal(p, 1);
    assert_int_equal(f, 0);
    assert_int_equal(golden_with("golden_frames", 1, &p, &f), 0);
    assert_int_equal(f, 1);
    assert_int_equal(golden_with("golden_codes", 2, &p, &f), 0);
    assert_int_equal(f, 1);
    assert_true(golden_check_dir("/nonexistent-golden", stdout, &p, &f) < 0);
}

/* Nothing of the geometry is fixed: another shape (GQA group 3, head_dim * heads !=
 * hidden, 4 codebooks of 300, top-level rope_theta) loads and generates. */
static void test_other_geometry(void **state)
{
    (void)state;
    struct test_stage0 m;
    char *dir = test_stage0_other_geometry(&m, "geometry");
    assert_int_equal(m.lm.cfg.head_dim, 10);
    assert_int_equal(m.dd.cfg.n_codebooks, 4);
    assert_true(m.lm.cfg.rope_theta == 10000.0);
    struct sampler s1, s2;
    struct collect a, b;
    enum generate_stop st;
    sampler_init_seeded(&s1, 1);
    assert_int_equal(run(&m, &s1, 15, &a, &st), 0);
    assert_int_equal(a.n, 15);
    assert_int_equal(a.width, 4 * 24);
    for (int i = 0; i < 15 * 4; i++)
        assert_true(a.codes[i] >= 0 && a.codes[i] < (i % 4 ? 300 : SAMPLER_N_CODES));
    sampler_init_seeded(&s2, 1);
    assert_int_equal(run(&m, &s2, 15, &b, &st), 0);
    assert_memory_equal(a.frames, b.frames, sizeof(float) * 15 * a.width);
    free_collect(&a);
    free_collect(&b);
    test_stage0_free(&m);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_plan),         cmocka_unit_test(test_windows_ready),
        cmocka_unit_test(test_frame_budget),        cmocka_unit_test(test_seeded_generation),
        cmocka_unit_test(test_replay_of_own_codes), cmocka_unit_test(test_stop_token),
        cmocka_unit_test(test_bad_begin),           cmocka_unit_test(test_golden_checker_fails_on_tampering),
        cmocka_unit_test(test_other_geometry),
    };
    return cmocka_run_group_tests(tests, test_stage0_golden_setup, test_stage0_golden_teardown);
}
