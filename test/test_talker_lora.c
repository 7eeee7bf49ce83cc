/* Per-request talker adapters on the CPU (stage0/model/talker_lora.h) on a tiny random
 * checkpoint: the low-rank ops against a double-precision product; a forward with the
 * adapter chosen per row equals the forward of the model with it merged at load
 * (within the bf16 rounding of the merge); rows of one batch with different adapters
 * (and none) get bit for bit what each gets alone; adapters that cannot be served per
 * request are refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt_gen.h"
#include "common/error.h"
#include "common/lora_merge.h"
#include "common/ops.h"
#include "stage0/model/talker.h"
#include "stage0/model/talker_lora.h"
#include "support/test_rand.h"
#include "support/test_support.h"

static char *g_dir;
static char g_ckpt[4200];
static struct talker g_lm; /* the base model */

static int group_setup(void **state)
{
    (void)state;
    g_dir = test_make_tmpdir("talker_lora");
    snprintf(g_ckpt, sizeof g_ckpt, "%s/ckpt", g_dir);
    struct ckpt_gen_geometry g;
    struct ckpt_gen_opts o = {.seed = 9, .threads = 1};
    if (ckpt_gen_preset("tiny", &g) < 0 || ckpt_gen_write(g_ckpt, &g, &o) < 0 || talker_load(&g_lm, g_ckpt) < 0) {
        fprintf(stderr, "checkpoint: %s\n", mm3_last_error());
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    talker_free(&g_lm);
    test_remove_tree(g_dir);
    free(g_dir);
    return 0;
}

/* A generated adapter for `component` in g_dir/<name>. */
static const char *make_adapter(const char *name, const char *component, int rank, uint64_t seed, const char *targets)
{
    static char path[2][4300];
    static int k;
    char *p = path[k++ % 2];
    snprintf(p, sizeof path[0], "%s/%s", g_dir, name);
    struct ckpt_gen_lora_opts o = {
        .component = component, .targets = targets, .rank = rank, .alpha = 2.0 * rank, .seed = seed};
    if (ckpt_gen_lora_write(p, g_ckpt, &o) < 0) fail_msg("ckpt_gen_lora_write: %s", mm3_last_error());
    return p;
}

/* op_lora_down then op_lora_up: y + s B (A x) as summed in double. */
static void test_ops(void **state)
{
    (void)state;
    uint64_t rng = 42;
    const int n = 3, in = 37, out = 29, rank = 5;
    const float s = 1.75f;
    float x[3 * 37], a[5 * 37], b[29 * 5], y[3 * 29], y0[3 * 29], t[3 * 5];
    for (int i = 0; i < n * in; i++)
        x[i] = test_rand_uniform(&rng, 1.0f);
    for (int i = 0; i < rank * in; i++)
        a[i] = test_rand_uniform(&rng, 1.0f);
    for (int i = 0; i < out * rank; i++)
        b[i] = test_rand_uniform(&rng, 1.0f);
    for (int i = 0; i < n * out; i++)
        y[i] = y0[i] = test_rand_uniform(&rng, 1.0f);
    op_lora_down(t, x, a, n, in, rank);
    op_lora_up(y, t, b, s, n, rank, out);
    for (int r = 0; r < n; r++)
        for (int o = 0; o < out; o++) {
            double acc = 0;
            for (int k = 0; k < rank; k++) {
                double ax = 0;
                for (int i = 0; i < in; i++)
                    ax += (double)a[k * in + i] * x[r * in + i];
                acc += (double)b[o * rank + k] * ax;
            }
            double want = y0[r * out + o] + s * acc;
            assert_true(fabs(y[r * out + o] - want) <= 1e-5 * (1 + fabs(want)));
        }
}

/* P prompt tokens of row `row` then D decode tokens one at a time, teacher-forced with
 * fixed embeddings; hidden[(P + D), H] out. */
static void run_row(const struct talker *m, struct talker_state *s, int row, const float *emb, int P, int D,
                    float *hidden)
{
    int H = m->cfg.hidden;
    int rows[64], pos[64];
    for (int i = 0; i < P; i++)
        rows[i] = row, pos[i] = i;
    assert_int_equal(talker_forward(m, s, P, rows, pos, emb, hidden), 0);
    for (int d = 0; d < D; d++) {
        int p = P + d;
        assert_int_equal(talker_forward(m, s, 1, &row, &p, emb + (size_t)p * H, hidden + (size_t)p * H), 0);
    }
}

enum { P = 9, D = 4, T = P + D };

static float *token_embeddings(uint64_t seed)
{
    int H = g_lm.cfg.hidden;
    float *e = malloc(sizeof(float) * T * H);
    int32_t ids[T];
    uint64_t rng = seed;
    for (int i = 0; i < T; i++)
        ids[i] = (int32_t)(test_rand_next(&rng) % 1000);
    assert_int_equal(talker_embed_tokens(&g_lm, ids, T, e), 0);
    return e;
}

/* The adapter chosen per row against the same adapter merged at load. The merge rounds
 * W + s B A once to bf16 (the base is bf16), the per-row path keeps W and s B (A x)
 * apart in float32: the hiddens differ by that rounding only, far less than the adapter
 * moves them. */
static void test_per_request_equals_merged(void **state)
{
    (void)state;
    const char *ad = make_adapter("all", "language_model", 8, 3, NULL);
    const double scale = 2.0;
    struct talker_lora_set set = {0};
    assert_int_equal(talker_lora_set_add(&set, &g_lm.cfg, "all", ad, scale), 0);
    assert_int_equal(set.a[0].rank, 8);
    assert_true(fabsf(set.a[0].scale - (float)(scale * 2.0)) < 1e-6f);
    for (int l = 0; l < g_lm.cfg.n_layers; l++)
        for (int t = 0; t < TALKER_LORA_N_TARGETS; t++)
            assert_non_null(talker_lora_at(&set.a[0], l, t)->a);

    int H = g_lm.cfg.hidden;
    float *emb = token_embeddings(5);
    float *base = malloc(sizeof(float) * T * H), *per = malloc(sizeof(float) * T * H);
    float *merged = malloc(sizeof(float) * T * H);
    struct talker_state s;
    assert_int_equal(talker_state_init(&s, &g_lm, 2, 32), 0);
    run_row(&g_lm, &s, 1, emb, P, D, base);
    talker_state_set_lora(&s, &set);
    s.row_lora[1] = 0;
    run_row(&g_lm, &s, 1, emb, P, D, per);
    talker_state_free(&s);

    assert_int_equal(lora_merge_add("language_model", ad, scale), 0);
    struct talker mm;
    assert_int_equal(talker_load(&mm, g_ckpt), 0);
    lora_merge_clear();
    assert_int_equal(talker_state_init(&s, &mm, 2, 32), 0);
    run_row(&mm, &s, 1, emb, P, D, merged);
    talker_state_free(&s);
    talker_free(&mm);

    double moved = test_rel_error(base, merged, (size_t)T * H), err = test_rel_error(per, merged, (size_t)T * H);
    fprintf(stderr, "adapter moves the hiddens by %.3g (relative L2); per-request vs merged %.3g\n", moved, err);
    assert_true(moved > 0.05);
    assert_true(err < 0.02 * moved); /* the merge's bf16 rounding, < 2% of the adapter's effect */
    free(emb), free(base), free(per), free(merged);
    talker_lora_set_free(&set);
}

/* Rows 0-5 in one batch (prefill chunks of all three, then decode steps), adapters
 * {a, none, b} on the row pairs: every row's hiddens equal its own run alone bit for
 * bit, and the adapters change them. */
static void test_mixed_batch(void **state)
{
    (void)state;
    struct talker_lora_set set = {0};
    assert_int_equal(talker_lora_set_add(&set, &g_lm.cfg, "a", make_adapter("a", "language_model", 4, 21, NULL), 1.0),
                     0);
    assert_int_equal(talker_lora_set_add(&set, &g_lm.cfg, "b",
                                         make_adapter("b", "language_model", 16, 22, "q_proj,v_proj,down_proj"), 0.5),
                     0);
    assert_int_equal(talker_lora_set_find(&set, "b"), 1);
    assert_null(talker_lora_at(&set.a[1], 0, TALKER_LORA_K)->a);
    const int adapter[6] = {0, 0, -1, -1, 1, 1};
    int H = g_lm.cfg.hidden;
    float *emb[6], *alone[6], *batch[6];
    for (int r = 0; r < 6; r++) {
        emb[r] = token_embeddings(100 + (uint64_t)r / 2); /* a pair's rows share tokens, as a CFG pair's tail */
        alone[r] = malloc(sizeof(float) * T * H);
        batch[r] = malloc(sizeof(float) * T * H);
        struct talker_state s;
        assert_int_equal(talker_state_init(&s, &g_lm, 6, 32), 0);
        talker_state_set_lora(&s, &set);
        s.row_lora[r] = adapter[r];
        run_row(&g_lm, &s, r, emb[r], P, D, alone[r]);
        talker_state_free(&s);
    }
    struct talker_state s;
    assert_int_equal(talker_state_init(&s, &g_lm, 6, 32), 0);
    talker_state_set_lora(&s, &set);
    for (int r = 0; r < 6; r++)
        s.row_lora[r] = adapter[r];
    float *x = malloc(sizeof(float) * 6 * T * H), *y = malloc(sizeof(float) * 6 * T * H);
    int rows[6 * T], pos[6 * T];
    /* prefill in two chunks per row, rows interleaved; then D decode steps of all six */
    for (int c = 0; c < 2; c++) {
        int n = 0, from = c ? 5 : 0, to = c ? P : 5;
        for (int r = 0; r < 6; r++)
            for (int p = from; p < to; p++) {
                rows[n] = r, pos[n] = p;
                memcpy(x + (size_t)n * H, emb[r] + (size_t)p * H, sizeof(float) * H);
                n++;
            }
        assert_int_equal(talker_forward(&g_lm, &s, n, rows, pos, x, y), 0);
        for (int i = 0; i < n; i++)
            memcpy(batch[rows[i]] + (size_t)pos[i] * H, y + (size_t)i * H, sizeof(float) * H);
    }
    for (int d = 0; d < D; d++) {
        for (int r = 0; r < 6; r++) {
            rows[r] = r, pos[r] = P + d;
            memcpy(x + (size_t)r * H, emb[r] + (size_t)(P + d) * H, sizeof(float) * H);
        }
        assert_int_equal(talker_forward(&g_lm, &s, 6, rows, pos, x, y), 0);
        for (int r = 0; r < 6; r++)
            memcpy(batch[r] + (size_t)(P + d) * H, y + (size_t)r * H, sizeof(float) * H);
    }
    for (int r = 0; r < 6; r++)
        assert_memory_equal(batch[r], alone[r], sizeof(float) * T * H);
    /* rows 0, 2, 4 had the same kind of input but other adapters: other hiddens */
    float *ref = token_embeddings(100);
    struct talker_state b;
    assert_int_equal(talker_state_init(&b, &g_lm, 1, 32), 0);
    float *none = malloc(sizeof(float) * T * H);
    run_row(&g_lm, &b, 0, ref, P, D, none);
    assert_true(test_rel_error(alone[0], none, (size_t)T * H) > 1e-3);
    talker_state_free(&b);
    free(ref), free(none), free(x), free(y);
    for (int r = 0; r < 6; r++)
        free(emb[r]), free(alone[r]), free(batch[r]);
    talker_state_free(&s);
    talker_lora_set_free(&set);
}

static void expect_refused(struct talker_lora_set *set, const char *name, const char *dir, const char *needle)
{
    int n = set->n;
    assert_true(talker_lora_set_add(set, &g_lm.cfg, name, dir, 1.0) < 0);
    if (!strstr(mm3_last_error(), needle)) fail_msg("error '%s' lacks '%s'", mm3_last_error(), needle);
    assert_int_equal(set->n, n);
}

/* Depth-decoder and lm_head adapters are refused by module name, so are bad names,
 * a name used twice and more than TALKER_LORA_MAX adapters. */
static void test_refused(void **state)
{
    (void)state;
    struct talker_lora_set set = {0};
    const char *depth = make_adapter("depth", "rvq_depth_decoder", 4, 1, NULL);
    expect_refused(&set, "d", depth, "is not served per request: only the talker's decoder layers");
    const char *head = make_adapter("head", "language_model", 4, 1, "lm_head,q_proj");
    expect_refused(&set, "h", head, "module 'lm_head' is not served per request");
    const char *ok = make_adapter("ok", "language_model", 2, 1, "o_proj");
    expect_refused(&set, "a b", ok, "adapter name 'a b': expected only letters");
    expect_refused(&set, "", ok, "expected 1 to 63 characters");
    expect_refused(&set, "x", "/nonexistent/adapter", "adapter 'x'");
    for (int i = 0; i < TALKER_LORA_MAX; i++) {
        char name[8];
        snprintf(name, sizeof name, "n%d", i);
        assert_int_equal(talker_lora_set_add(&set, &g_lm.cfg, name, ok, 1.0), 0);
    }
    expect_refused(&set, "n0", ok, "at most 8 adapters");
    talker_lora_set_free(&set);
    assert_int_equal(talker_lora_set_add(&set, &g_lm.cfg, "n0", ok, 1.0), 0);
    expect_refused(&set, "n0", ok, "the name is already used");
    talker_lora_set_free(&set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_per_request_equals_merged),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
