/* The c0 candidate-set comparison of the stage-0 golden replay: equal sets pass; in
 * guided space (float32) a swap of two ids tied at the top-k edge is tolerated, any other
 * swap is not; off float32 a swap of ids at the CONDITIONAL row's top-k edge (the c0
 * rule's) is counted as an edge swap whatever their guided logits, one away from that
 * edge fails; a set of another size never passes. Forced draws outside our set (flips,
 * c0 or depth) are counted: within the float error of the top-k edge they pass up to
 * max(1, 1% of the draws of their kind), more of them or one off the edge fail the case. */
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

#include <cmocka.h>

#include "common/sampler.h"
#include "stage0/generate.h"
#include "stage0/golden.h"
#include "support/test_support.h"

enum { N = 8 };

static int64_t id_of(int col)
{
    return col == 0 ? SAMPLER_STOP_ID : SAMPLER_CODE_OFFSET + col - 1;
}

/* ours: columns `cols` finite with `vals`, the rest -inf. */
static void fill(float *g, const int *cols, const float *vals, int k)
{
    for (int c = 0; c < N; c++) g[c] = -INFINITY;
    for (int i = 0; i < k; i++) g[cols[i]] = vals[i];
}

static void test_same_set(void **state)
{
    (void)state;
    float g[N];
    int cols[3] = {0, 2, 5};
    float v[3] = {4.0f, 3.0f, 1.0f};
    fill(g, cols, v, 3);
    int64_t ids[3] = {id_of(0), id_of(2), id_of(5)};
    int swaps = -1;
    assert_int_equal(golden_support_compare(g, N, ids, v, 3, 1e-4, &swaps), 0);
    assert_int_equal(swaps, 0);
}

static void test_edge_tie_swapped(void **state)
{
    (void)state;
    /* reference {2: 4.0, 5: 3.0, 6: 1.000}, ours {2: 4.0, 5: 3.0, 7: 1.001}: 6 and 7 tie at the edge */
    float ref[3] = {4.0f, 3.0f, 1.000f};
    int64_t ids[3] = {id_of(2), id_of(5), id_of(6)};
    float g[N];
    int cols[3] = {2, 5, 7};
    float v[3] = {4.0f, 3.0f, 1.001f};
    fill(g, cols, v, 3);
    int swaps = 0;
    assert_int_equal(golden_support_compare(g, N, ids, ref, 3, 2e-2, &swaps), 0);
    assert_int_equal(swaps, 1);
    /* the same swap under a float32 tolerance is a difference */
    assert_true(golden_support_compare(g, N, ids, ref, 3, 1e-5, &swaps) > 0);
}

static void test_swap_off_the_edge(void **state)
{
    (void)state;
    /* reference has 5 (logit 3.0, far above its edge 1.0); ours has 7 instead */
    float ref[3] = {4.0f, 3.0f, 1.0f};
    int64_t ids[3] = {id_of(2), id_of(5), id_of(6)};
    float g[N];
    int cols[3] = {2, 7, 6};
    float v[3] = {4.0f, 3.0f, 1.0f};
    fill(g, cols, v, 3);
    int swaps = 0;
    assert_true(golden_support_compare(g, N, ids, ref, 3, 2e-2, &swaps) >= 2);
    assert_int_equal(swaps, 0);
    int cols2[3] = {2, 7, 4};
    fill(g, cols2, v, 3);
    assert_true(golden_support_compare(g, N, ids, ref, 3, 2e-2, &swaps) >= 4);
}

static void test_size_differs(void **state)
{
    (void)state;
    float ref[3] = {4.0f, 3.0f, 1.0f};
    int64_t ids[3] = {id_of(2), id_of(5), id_of(6)};
    float g[N];
    int cols[2] = {2, 5};
    float v[2] = {4.0f, 3.0f};
    fill(g, cols, v, 2);
    int swaps = 0;
    assert_true(golden_support_compare(g, N, ids, ref, 3, 2e-2, &swaps) > 0);
    /* by the conditional edge too: our set of 2 against the reference's 3 */
    float cond[N] = {9.0f, 1.0f, 8.0f, 0.0f, 0.5f, 7.0f, 6.99f, 2.0f};
    assert_true(golden_support_compare_cond(g, cond, N, ids, 3, 2e-2, &swaps) > 0);
    assert_int_equal(swaps, 0);
}

/* Our conditional row: the top 3 are columns 0 (9.0), 2 (8.0) and 5 (5.000), the edge;
 * column 6 (4.999) is just below it, column 7 (2.0) far below. The c0 rule keeps {0, 2, 5}. */
static const float COND[N] = {9.0f, 1.0f, 8.0f, 0.0f, 0.5f, 5.000f, 4.999f, 2.0f};

static void test_cond_edge_swap_counted(void **state)
{
    (void)state;
    /* ours {0, 2, 5}; the reference ranked 6 above 5 and kept {0, 2, 6}. Their guided
     * logits are far apart (6 at 9.0 in the reference, 5 at 1.0 in ours): no tie in
     * guided space, yet both sit at the conditional edge (0.001 apart, RMS of the top 3
     * ~7.5, window 2e-2 x RMS ~0.15). */
    float g[N];
    int cols[3] = {0, 2, 5};
    float v[3] = {6.0f, 5.0f, 1.0f};
    fill(g, cols, v, 3);
    int64_t ids[3] = {id_of(0), id_of(2), id_of(6)};
    float ref[3] = {6.0f, 5.0f, 9.0f};
    int swaps = -1;
    assert_true(golden_support_compare(g, N, ids, ref, 3, 2e-2, &swaps) > 0);
    assert_int_equal(golden_support_compare_cond(g, COND, N, ids, 3, 2e-2, &swaps), 0);
    assert_int_equal(swaps, 1);
    /* the reference drew the swapped id: a flip on a tolerated id */
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(6)), 1);
    /* a float32-like window (7.5e-4) does not reach 0.001 */
    assert_true(golden_support_compare_cond(g, COND, N, ids, 3, 1e-4, &swaps) > 0);
    assert_int_equal(swaps, 0);
    /* identical sets: nothing to count */
    int64_t same[3] = {id_of(0), id_of(2), id_of(5)};
    assert_int_equal(golden_support_compare_cond(g, COND, N, same, 3, 2e-2, &swaps), 0);
    assert_int_equal(swaps, 0);
}

static void test_cond_swap_off_the_edge_fails(void **state)
{
    (void)state;
    float g[N];
    int cols[3] = {0, 2, 5};
    float v[3] = {6.0f, 5.0f, 1.0f};
    fill(g, cols, v, 3);
    int swaps = 0;
    /* the reference kept 7, whose conditional logit 2.0 is 3.0 below our edge */
    int64_t far_below[3] = {id_of(0), id_of(2), id_of(7)};
    float ref[3] = {6.0f, 5.0f, 3.0f};
    assert_true(golden_support_compare_cond(g, COND, N, far_below, 3, 2e-2, &swaps) > 0);
    assert_int_equal(swaps, 0);
    /* the reference lacks 2, which our row ranks 3.0 above the edge (6 at the edge
     * replaces it): the extra id is off the edge */
    int64_t far_above[3] = {id_of(0), id_of(5), id_of(6)};
    assert_true(golden_support_compare_cond(g, COND, N, far_above, 3, 2e-2, &swaps) > 0);
    assert_int_equal(swaps, 0);
    /* guided space says the same for the first */
    assert_true(golden_support_compare(g, N, far_below, ref, 3, 2e-2, &swaps) > 0);
    /* an id that is no c0 column */
    int64_t bogus[3] = {id_of(0), id_of(2), 12};
    assert_true(golden_support_compare_cond(g, COND, N, bogus, 3, 2e-2, &swaps) > 0);
}

static void test_forced_draw_on_swapped_id(void **state)
{
    (void)state;
    /* reference {2, 5, 6}, ours {2, 7, 6}: 5 crossed the c0 rule's threshold (a tolerated flip) */
    int64_t ids[3] = {id_of(2), id_of(5), id_of(6)};
    float g[N];
    int cols[3] = {2, 7, 6};
    float v[3] = {4.0f, 3.0f, 1.0f};
    fill(g, cols, v, 3);
    /* the reference drew the flipped id: outside ours, inside its set */
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(5)), 1);
    /* a draw inside our set is no flip; one outside both sets is a real difference */
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(6)), 0);
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(4)), 0);
    /* ids that are not drawable columns */
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, 12), 0);
    assert_int_equal(golden_forced_on_swap(g, N, ids, 3, id_of(N)), 0);
}

/* A conditional row 10.0, 9.9, ..., 4.1 (60 columns): the 50th largest is 5.1. */
static void fill_row(float *row, int n)
{
    for (int i = 0; i < n; i++)
        row[i] = 10.0f - 0.1f * (float)i;
}

static void test_topk_edge_margin(void **state)
{
    (void)state;
    float row[60];
    fill_row(row, 60);
    double edge, margin, scale;
    golden_topk_edge(row, 60, 50, 50, &edge, &margin, &scale);
    assert_float_equal(edge, 5.1, 1e-5);
    assert_float_equal(margin, 0.1, 1e-5); /* column 50 holds 5.0 */
    double sq = 0;
    for (int i = 0; i < 50; i++)
        sq += (double)row[i] * row[i];
    assert_float_equal(scale, sqrt(sq / 50), 1e-5);
    /* a column inside the top 50 is above the edge: a negative margin, never an edge flip */
    golden_topk_edge(row, 60, 50, 3, &edge, &margin, &scale);
    assert_true(margin < 0);
    assert_false(golden_flip_is_edge(margin, scale, 2e-2));
    /* unsorted input and a NaN (ranked lowest) give the same edge */
    float shuffled[60];
    for (int i = 0; i < 60; i++)
        shuffled[i] = row[(i * 7) % 60];
    shuffled[59] = NAN; /* replaces row[(59 * 7) % 60] = row[53], below the edge */
    golden_topk_edge(shuffled, 60, 50, 0, &edge, &margin, &scale);
    assert_float_equal(edge, 5.1, 1e-5);
    /* out-of-range column: NaN figures, not an edge flip */
    golden_topk_edge(row, 60, 50, 60, &edge, &margin, &scale);
    assert_true(isnan(margin));
    assert_false(golden_flip_is_edge(margin, scale, 2e-2));
}

static void test_edge_flip_within_float_error(void **state)
{
    (void)state;
    float row[60];
    fill_row(row, 60);
    double edge, margin, scale;
    golden_topk_edge(row, 60, 50, 50, &edge, &margin, &scale);
    /* 0.1 below the edge against the top logits' RMS ~7.7: within a bf16-like 2e-2 x RMS
     * (0.15), not within float32's 1e-4 x RMS, nor 0.5 below it */
    assert_true(golden_flip_is_edge(margin, scale, 2e-2));
    assert_false(golden_flip_is_edge(margin, scale, 1e-4));
    golden_topk_edge(row, 60, 50, 55, &edge, &margin, &scale);
    assert_false(golden_flip_is_edge(margin, scale, 2e-2));
}

static void test_flips_counted_and_bounded(void **state)
{
    (void)state;
    assert_int_equal(golden_flip_budget(0), 1);
    assert_int_equal(golden_flip_budget(250), 2);
    assert_int_equal(golden_flip_budget(1000), 10);
    /* no flip; one or two c0 edge flips among 250 draws: counted, not failed */
    assert_true(golden_flips_pass(0, 0, 250, 0, 1750));
    assert_true(golden_flips_pass(1, 1, 250, 0, 1750));
    assert_true(golden_flips_pass(2, 2, 250, 0, 1750));
    /* more c0 edge flips than the bound fail, whatever the depth budget */
    assert_false(golden_flips_pass(3, 3, 250, 0, 1750));
    assert_false(golden_flips_pass(2, 2, 100, 0, 1750));
    /* a draw outside the set that is not an edge flip fails even alone */
    assert_false(golden_flips_pass(1, 0, 250, 0, 1750));
    assert_false(golden_flips_pass(2, 1, 250, 0, 1750));
}

/* A depth row of 60 codes 10.0, 9.9, ..., 4.1: the candidate set is its top 50 (>= 5.1). */
static void test_depth_edge_flip_counted(void **state)
{
    (void)state;
    float row[60];
    fill_row(row, 60);
    /* code 50 (5.0) is outside, 0.1 below the edge: a flip at the edge under 2e-2 */
    assert_true(golden_topk_outside(row, 60, 50, 50));
    assert_false(golden_topk_outside(row, 60, 50, 49));
    double edge, margin, scale;
    golden_topk_edge(row, 60, 50, 50, &edge, &margin, &scale);
    assert_true(golden_flip_is_edge(margin, scale, 2e-2));
    /* one c0 and one depth edge flip: the two draws outside are both explained */
    assert_true(golden_flips_pass(2, 1, 250, 1, 1750));
    /* a depth flip alone, within its own budget (17 of 1750 draws) */
    assert_int_equal(golden_flip_budget(1750), 17);
    assert_true(golden_flips_pass(17, 0, 250, 17, 1750));
    /* code 59 (4.1) is 1.0 below the edge: NOT at the edge, the draw outside fails */
    golden_topk_edge(row, 60, 50, 59, &edge, &margin, &scale);
    assert_false(golden_flip_is_edge(margin, scale, 2e-2));
    assert_false(golden_flips_pass(1, 0, 250, 0, 1750));
}

static void test_too_many_flips_fail(void **state)
{
    (void)state;
    /* depth flips past their budget fail although every one is at the edge */
    assert_false(golden_flips_pass(18, 0, 250, 18, 1750));
    assert_false(golden_flips_pass(3, 1, 250, 2, 100));
    /* c0 flips do not borrow the depth budget */
    assert_false(golden_flips_pass(3, 3, 250, 0, 1750));
    /* edge swaps: 5% of the compared candidate slots, at least one */
    assert_int_equal(golden_swap_budget(0), 1);
    assert_int_equal(golden_swap_budget(6 * 50), 15);
    assert_int_equal(golden_swap_budget(3 * 50), 7);
}

/* golden_topk_outside is the sampler's own candidate rule: on rows with ties, NaN and
 * infinities it says "outside" exactly when a forced replay draw counts in n_outside. */
static void test_outside_matches_sampler(void **state)
{
    (void)state;
    enum { V = 64, K = 8 };
    unsigned x = 12345;
    for (int trial = 0; trial < 200; trial++) {
        float row[V];
        for (int i = 0; i < V; i++) {
            x = x * 1103515245u + 12345u;
            row[i] = (float)((x >> 16) % 16) * 0.5f; /* many ties */
        }
        if (trial % 3 == 0) row[trial % V] = NAN;
        if (trial % 5 == 0) row[(trial * 7) % V] = -INFINITY;
        if (trial % 7 == 0) row[(trial * 11) % V] = INFINITY;
        for (int col = 0; col < V; col++) {
            int64_t code = col;
            struct sampler sp;
            sampler_init_replay(&sp, NULL, 0, &code, 1, 2);
            sp.top_k = K;
            int got;
            assert_int_equal(sampler_draw(&sp, row, V, 1, &got), 0);
            assert_int_equal(got, col);
            assert_int_equal(golden_topk_outside(row, V, K, col), sp.n_outside);
        }
    }
}

/* End to end through golden_check_dir_with on tiny-a's first case, replayed on the CPU
 * by a loop that moves chosen codes below the top-k edge of their row before the draw
 * (the rows are the loop's own buffers: the c0 rule and the sampler see the change),
 * as a backend's rounding would. The report must count and describe each. */
enum { MAX_MOVES = 8 };

struct move {
    int step, codebook; /* codebook 0: the conditional c0 row, else the guided depth row */
    int forced;         /* 1: the step's forced code, 0: the row's edge code (another one) */
    double below;       /* new value: the edge of the other codes minus below x their top-k RMS */
};

struct perturb {
    struct move moves[MAX_MOVES];
    int n_moves;
    const struct sampler *sp;
    int ncb;
    struct generate_hooks inner;
};

/* Sets row[col] to `below` x RMS under the top-k edge of the row's other values. */
static void push_below_edge(float *row, int n, int col, double below)
{
    double edge, margin, scale;
    row[col] = -INFINITY;
    golden_topk_edge(row, n, SAMPLER_TOP_K, col, &edge, &margin, &scale);
    row[col] = (float)(edge - below * scale);
}

/* The column holding the row's top-k-th value that is not `not_col`. */
static int edge_col(const float *row, int n, int not_col)
{
    double edge, margin, scale;
    golden_topk_edge(row, n, SAMPLER_TOP_K, 0, &edge, &margin, &scale);
    int best = -1;
    for (int c = 0; c < n; c++)
        if (c != not_col && row[c] >= edge && (best < 0 || row[c] < row[best])) best = c;
    return best;
}

static void apply_moves(struct perturb *p, int s, int j, float *row, int n)
{
    for (int i = 0; i < p->n_moves; i++) {
        const struct move *m = &p->moves[i];
        if (m->step != s || m->codebook != j) continue;
        int forced = j == 0 ? (int)sampler_c0_id_to_col(p->sp->lm_ids[s])
                            : (int)p->sp->depth_codes[(int64_t)(p->ncb - 1) * s + (j - 1)];
        push_below_edge(row, n, m->forced ? forced : edge_col(row, n, forced), m->below);
    }
}

static void p_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    struct perturb *p = ctx;
    p->inner.on_frame(p->inner.ctx, t, frame, codes);
}

static void p_c0_logits(void *ctx, int s, const float *cond, const float *uncond, int n)
{
    struct perturb *p = ctx;
    apply_moves(p, s, 0, (float *)cond, n);
    p->inner.on_c0_logits(p->inner.ctx, s, cond, uncond, n);
}

static void p_draw(void *ctx, int s, int j, const float *guided, int n)
{
    struct perturb *p = ctx;
    if (j > 0) apply_moves(p, s, j, (float *)guided, n);
    p->inner.on_draw(p->inner.ctx, s, j, guided, n);
}

static int run_perturbed(void *ctx, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                         const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                         const struct generate_hooks *hooks, enum generate_stop *stop)
{
    struct perturb *p = ctx;
    p->inner = *hooks;
    p->sp = sp;
    p->ncb = dd->cfg.n_codebooks;
    struct generate_hooks h = {.ctx = p, .on_frame = p_frame, .on_draw = p_draw, .on_c0_logits = p_c0_logits};
    struct generate g;
    int rc = generate_begin(&g, lm, dd, sp, ids_pair, prompt_len, max_frames, cfg_scale, &h);
    if (rc < 0) return rc;
    while (!g.done && rc == 0)
        rc = generate_step(&g);
    *stop = g.stop;
    generate_end(&g);
    return rc;
}

/* A golden directory holding tiny-a's checkpoint and first case only. */
static int setup_case0(void **state)
{
    const char *golden = test_golden_dir();
    if (!golden) return 0;
    char *dir = test_make_tmpdir("golden_support_case0");
    char src[4096], dst[4096];
    snprintf(src, sizeof src, "%s/manifest.json", golden);
    json_t *man = json_load_file(src, 0, NULL);
    assert_non_null(man);
    json_t *cases = json_object_get(man, "cases");
    while (json_array_size(cases) > 1)
        json_array_remove(cases, json_array_size(cases) - 1);
    const char *file = json_string_value(json_object_get(json_array_get(cases, 0), "file"));
    snprintf(dst, sizeof dst, "%s/manifest.json", dir);
    assert_int_equal(json_dump_file(man, dst, 0), 0);
    const char *links[2] = {json_string_value(json_object_get(man, "checkpoint")), file};
    for (int i = 0; i < 2; i++) {
        snprintf(src, sizeof src, "%s/%s", golden, links[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, links[i]);
        assert_int_equal(symlink(src, dst), 0);
    }
    json_decref(man);
    *state = dir;
    return 0;
}

static int teardown_case0(void **state)
{
    if (*state) test_remove_tree(*state);
    free(*state);
    return 0;
}

/* The replay's report of case0 with these moves at tolerance tol; *pass = cases passed. */
static char *replay(void **state, const struct move *moves, int n_moves, double tol, int *pass)
{
    struct perturb p = {.n_moves = n_moves};
    if (n_moves > 0) memcpy(p.moves, moves, sizeof(struct move) * (size_t)n_moves);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    assert_non_null(out);
    int n_fail = 0;
    assert_int_equal(golden_check_dir_with(*state, run_perturbed, &p, TALKER_BACKEND_CPU, tol, out, pass, &n_fail), 0);
    fclose(out);
    assert_int_equal(*pass + n_fail, 1);
    return text;
}

static void test_replay_unperturbed(void **state)
{
    if (!*state) skip();
    int pass;
    char *t = replay(state, NULL, 0, GOLDEN_REL_TOL_BF16, &pass);
    assert_int_equal(pass, 1);
    assert_non_null(strstr(t, "c0 edge flips 0 (bound 1) depth edge flips 0 (bound 3) c0 edge swaps 0 in 0 draws"));
    assert_null(strstr(t, "c0 draw"));
    free(t);
}

static void test_replay_edge_swap_counted(void **state)
{
    if (!*state) skip();
    /* draw 2: the code at our conditional edge drops just below the 51st: an edge swap */
    struct move m[1] = {{.step = 2, .codebook = 0, .forced = 0, .below = 1e-3}};
    int pass;
    char *t = replay(state, m, 1, GOLDEN_REL_TOL_BF16, &pass);
    assert_int_equal(pass, 1);
    assert_non_null(strstr(t, "c0 edge flips 0 (bound 1) depth edge flips 0 (bound 3) c0 edge swaps 1 in 1 draws"));
    assert_non_null(strstr(t, "  c0 draw 2: edge swap: 50 candidates (reference 50)"));
    assert_non_null(strstr(t, "1.00e-03 x RMS"));
    free(t);
    /* the same swap under the float32 rule is a difference */
    t = replay(state, m, 1, GOLDEN_REL_TOL, &pass);
    assert_int_equal(pass, 0);
    assert_non_null(strstr(t, "SUPPORT DIFFERS in 1 draws"));
    assert_non_null(strstr(t, "  c0 draw 2: DIFFERS"));
    free(t);
}

static void test_replay_swap_off_the_edge_fails(void **state)
{
    if (!*state) skip();
    /* draw 1 at the edge (counted), draw 3 half the RMS below it: both described */
    struct move m[2] = {{.step = 1, .codebook = 0, .forced = 0, .below = 1e-3},
                        {.step = 3, .codebook = 0, .forced = 0, .below = 0.5}};
    int pass;
    char *t = replay(state, m, 2, GOLDEN_REL_TOL_BF16, &pass);
    assert_int_equal(pass, 0);
    assert_non_null(strstr(t, "SUPPORT DIFFERS in 1 draws"));
    assert_non_null(strstr(t, "  c0 draw 1: edge swap:"));
    assert_non_null(strstr(t, "  c0 draw 3: DIFFERS:"));
    assert_non_null(strstr(t, "5.00e-01 x RMS"));
    free(t);
}

static void test_replay_flips_counted(void **state)
{
    if (!*state) skip();
    /* the forced c0 code of step 2 (a compared draw) and the forced depth code of step 4
     * codebook 3 move just below their edges: both counted, the case passes */
    struct move m[2] = {{.step = 2, .codebook = 0, .forced = 1, .below = 1e-3},
                        {.step = 4, .codebook = 3, .forced = 1, .below = 1e-3}};
    int pass;
    char *t = replay(state, m, 2, GOLDEN_REL_TOL_BF16, &pass);
    assert_int_equal(pass, 1);
    assert_non_null(strstr(t, "c0 edge flips 1 (bound 1) depth edge flips 1 (bound 3) c0 edge swaps 1 in 1 draws"));
    assert_non_null(strstr(t, "(a forced draw on an edge-swapped id)"));
    assert_non_null(strstr(t, "  c0 flip at step 2: "));
    assert_non_null(strstr(t, "  depth flip at step 4 codebook 3: code "));
    assert_non_null(strstr(t, "(1.00e-03 x the top logits' RMS"));
    assert_null(strstr(t, "off the edge"));
    free(t);
}

static void test_replay_flips_fail(void **state)
{
    if (!*state) skip();
    int pass;
    /* a depth flip half the RMS below the edge */
    struct move off[1] = {{.step = 5, .codebook = 1, .forced = 1, .below = 0.5}};
    char *t = replay(state, off, 1, GOLDEN_REL_TOL_BF16, &pass);
    assert_int_equal(pass, 0);
    assert_non_null(strstr(t, "depth edge flips 0 (bound 3)"));
    assert_non_null(strstr(t, "(1 forced draws outside the candidate set, off the edge)"));
    assert_non_null(strstr(t, "  depth flip at step 5 codebook 1: ") && strstr(t, "NOT at the edge"));
    free(t);
    /* four depth edge flips against a budget of 3 (1% of 357 draws) */
    struct move depth[4];
    for (int i = 0; i < 4; i++)
        depth[i] = (struct move){.step = 10 + i, .codebook = 1 + i, .forced = 1, .below = 1e-3};
    t = replay(state, depth, 4, GOLDEN_REL_TOL_BF16, &pass);
    assert_int_equal(pass, 0);
    assert_non_null(strstr(t, "depth edge flips 4 (bound 3)"));
    free(t);
    /* two c0 edge flips against a budget of 1 (51 draws) */
    struct move c0[2] = {{.step = 20, .codebook = 0, .forced = 1, .below = 1e-3},
                         {.step = 30, .codebook = 0, .forced = 1, .below = 1e-3}};
    t = replay(state, c0, 2, GOLDEN_REL_TOL_BF16, &pass);
    assert_int_equal(pass, 0);
    assert_non_null(strstr(t, "c0 edge flips 2 (bound 1)"));
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_set),
        cmocka_unit_test(test_edge_tie_swapped),
        cmocka_unit_test(test_swap_off_the_edge),
        cmocka_unit_test(test_size_differs),
        cmocka_unit_test(test_forced_draw_on_swapped_id),
        cmocka_unit_test(test_topk_edge_margin),
        cmocka_unit_test(test_edge_flip_within_float_error),
        cmocka_unit_test(test_flips_counted_and_bounded),
        cmocka_unit_test(test_cond_edge_swap_counted),
        cmocka_unit_test(test_cond_swap_off_the_edge_fails),
        cmocka_unit_test(test_depth_edge_flip_counted),
        cmocka_unit_test(test_too_many_flips_fail),
        cmocka_unit_test(test_outside_matches_sampler),
        cmocka_unit_test_setup_teardown(test_replay_unperturbed, setup_case0, teardown_case0),
        cmocka_unit_test_setup_teardown(test_replay_edge_swap_counted, setup_case0, teardown_case0),
        cmocka_unit_test_setup_teardown(test_replay_swap_off_the_edge_fails, setup_case0, teardown_case0),
        cmocka_unit_test_setup_teardown(test_replay_flips_counted, setup_case0, teardown_case0),
        cmocka_unit_test_setup_teardown(test_replay_flips_fail, setup_case0, teardown_case0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
