/* The batched sampling step (stage0/model/cuda/frame_cuda.h) replayed as a CUDA graph
 * against the same step run eagerly: two CUDA backends over the same model, one with
 * graphs enabled (talker_backend_graphs_enable, the scheduler's switch), fed the same
 * inputs. For n = 1, 2, 3 and 8 pairs and two top_k values, several consecutive calls
 * with changing hidden pairs, seeds, steps, cfg scales and stop masks must give
 * bit-identical codes, depth hiddens and feedback (a value frozen into a graph at
 * capture would differ on the next call), and the codes must change between calls
 * (so the comparison can see a frozen graph). Two geometries: tiny-a (row attention
 * in the depth decoder) and a generated one whose depth heads take the split-K decode
 * kernel (stream-ordered allocations inside the capture), 4 codebooks of 300.
 * The depth decoder's tables of projected inputs and their layer-0 Q|K|V
 * (depth_cuda_input_table, depth_cuda_qkv_table) against the products they replace
 * (x split everywhere, float32 accuracy): the same codes, depth hiddens and feedback
 * within 1e-5 rel, on
 * both geometries (the generated one takes the fused chain whose raw rows the draw
 * overwrites with the next inputs).
 * The CPU backend's graph switch is a no-op (runs everywhere); without a GPU the
 * program then exits 77. The whole AR loop with graphs on: test_generate_batch
 * (test_cuda_batched_graphs). */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage0/model/cuda/depth_cuda.h"
#endif
#include "common/sampler.h"
#include "stage0/model/talker_backend.h"
#include "support/test_rand.h"
#include "support/test_stage0.h"
#include "support/test_support.h"

#define MAX_PAIRS 8
#define CALLS 4 /* per (n, top_k): a warm-up, the capture + replay, then replays */
#define WARMUPS 1

static uint64_t rng = 0xf4a3e5ull;

struct pairs {
    float *hidden, *scale, *depth_hidden[2], *feedback[2];
    uint64_t *seed;
    int *step;
    unsigned char *stop;
    int32_t *codes[2], *prev_codes;
};

static void pairs_alloc(struct pairs *p, int H, int ncb)
{
    size_t n = MAX_PAIRS;
    p->hidden = malloc(sizeof(float) * 2 * n * H);
    p->scale = malloc(sizeof(float) * n);
    p->seed = malloc(sizeof(uint64_t) * n);
    p->step = malloc(sizeof(int) * n);
    p->stop = malloc(n);
    p->prev_codes = malloc(sizeof(int32_t) * n * ncb);
    assert_non_null(p->hidden), assert_non_null(p->scale), assert_non_null(p->seed);
    assert_non_null(p->step), assert_non_null(p->stop), assert_non_null(p->prev_codes);
    for (int s = 0; s < 2; s++) {
        p->depth_hidden[s] = malloc(sizeof(float) * n * (ncb - 1) * H);
        p->feedback[s] = malloc(sizeof(float) * n * H);
        p->codes[s] = malloc(sizeof(int32_t) * n * ncb);
        assert_non_null(p->depth_hidden[s]), assert_non_null(p->feedback[s]), assert_non_null(p->codes[s]);
    }
}

static void pairs_free(struct pairs *p)
{
    free(p->hidden), free(p->scale), free(p->seed), free(p->step), free(p->stop), free(p->prev_codes);
    for (int s = 0; s < 2; s++)
        free(p->depth_hidden[s]), free(p->feedback[s]), free(p->codes[s]);
}

/* New inputs for call c of n pairs: every per-call value moves. */
static void pairs_fill(struct pairs *p, int n, int H, int c)
{
    for (size_t i = 0; i < 2 * (size_t)n * H; i++)
        p->hidden[i] = test_rand_uniform(&rng, 2.0f);
    for (int q = 0; q < n; q++) {
        p->seed[q] = test_rand_next(&rng);
        p->step[q] = 5 * c + q;
        p->scale[q] = (q + c) % 3 == 0 ? 1.0f : 1.25f + 0.5f * (float)c; /* guidance off for some pairs */
        p->stop[q] = (unsigned char)((q + c) % 2);
    }
}

static struct talker_pairs_in pairs_in(const struct pairs *p, int n, int top_k)
{
    return (struct talker_pairs_in){.n = n,
                                    .hidden = p->hidden,
                                    .seed = p->seed,
                                    .step = p->step,
                                    .cfg_scale = p->scale,
                                    .ignore_stop = p->stop,
                                    .top_k = top_k};
}

static void compare_backends(struct talker_backend *eager, struct talker_backend *graph, int H, int ncb)
{
    static const int ns[] = {1, 2, 3, MAX_PAIRS};
    const int top_ks[2] = {SAMPLER_TOP_K, 7};
    struct pairs p;
    pairs_alloc(&p, H, ncb);
    int keys = 0;
    for (int t = 0; t < 2; t++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++, keys++) {
            int n = ns[k], changed = 0;
            for (int c = 0; c < CALLS; c++) {
                pairs_fill(&p, n, H, c);
                struct talker_pairs_in in = pairs_in(&p, n, top_ks[t]);
                struct talker_backend *be[2] = {eager, graph};
                for (int s = 0; s < 2; s++) {
                    struct talker_pairs_out out = {
                        .codes = p.codes[s], .depth_hidden = p.depth_hidden[s], .feedback = p.feedback[s]};
                    int rc = be[s]->sample_pairs(be[s]->impl, &in, &out);
                    if (rc < 0)
                        fail_msg("%s step, %d pairs, call %d: %s", s ? "graph" : "eager", n, c, mm3_last_error());
                }
                size_t nc = (size_t)n * ncb, nd = (size_t)n * (ncb - 1) * H, nf = (size_t)n * H;
                if (memcmp(p.codes[0], p.codes[1], sizeof(int32_t) * nc) ||
                    memcmp(p.depth_hidden[0], p.depth_hidden[1], sizeof(float) * nd) ||
                    memcmp(p.feedback[0], p.feedback[1], sizeof(float) * nf))
                    fail_msg("top_k %d, %d pairs, call %d: graph step differs from the eager step", top_ks[t], n, c);
                for (size_t i = 0; i < nc; i++)
                    assert_true(p.codes[0][i] >= 0);
                if (c > 0 && memcmp(p.prev_codes, p.codes[0], sizeof(int32_t) * nc)) changed = 1;
                memcpy(p.prev_codes, p.codes[0], sizeof(int32_t) * nc);
            }
            if (!changed) fail_msg("top_k %d, %d pairs: the same codes on every call", top_ks[t], n);
        }
    struct talker_backend_counts counts;
    talker_backend_counts(graph, &counts);
    print_message("sampling graphs: %d captured, %ld replays\n", counts.sample_graphs, counts.sample_replays);
    assert_int_equal(counts.sample_graphs, keys);
    assert_int_equal(counts.sample_replays, (long)keys * (CALLS - WARMUPS));
    talker_backend_counts(eager, &counts);
    assert_int_equal(counts.sample_graphs, 0);
    assert_int_equal(counts.sample_replays, 0);
    pairs_free(&p);
}

static void graph_vs_eager(const struct talker *lm, const struct depth *dd)
{
    struct talker_backend eager, graph;
    int rc = talker_backend_open(&eager, TALKER_BACKEND_CUDA, lm, dd, 2, 16, 2 * MAX_PAIRS);
    if (rc == 0) rc = talker_backend_open(&graph, TALKER_BACKEND_CUDA, lm, dd, 2, 16, 2 * MAX_PAIRS);
    if (rc < 0) fail_msg("backend: %s", mm3_last_error());
    assert_non_null(eager.sample_pairs);
    assert_non_null(graph.sample_pairs);
    int sizes[1] = {2};
    assert_int_equal(talker_backend_graphs_enable(&graph, sizes, 1, WARMUPS), 0);
    compare_backends(&eager, &graph, lm->cfg.hidden, dd->cfg.n_codebooks);
    talker_backend_close(&eager);
    talker_backend_close(&graph);
}

/* A backend opened with depth_cuda_set_input_tables(mode) (read when the depth decoder
 * is built), the default set again after. */
static void open_with_table(struct talker_backend *b, const struct talker *lm, const struct depth *dd, int mode)
{
#ifdef MM3_HAVE_CUDA
    assert_int_equal(depth_cuda_set_input_tables(mode), 0);
    int rc = talker_backend_open(b, TALKER_BACKEND_CUDA, lm, dd, 2, 16, 2 * MAX_PAIRS);
    assert_int_equal(depth_cuda_set_input_tables(DEPTH_CUDA_TABLES_BOTH), 0);
    if (rc < 0) fail_msg("backend: %s", mm3_last_error());
    assert_non_null(b->sample_pairs);
#else
    (void)b, (void)lm, (void)dd, (void)mode;
    fail_msg("no CUDA build");
#endif
}

static void table_vs_projection(const struct talker *lm, const struct depth *dd)
{
    const int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks;
    struct talker_backend be[2];
    open_with_table(&be[0], lm, dd, 0);
    open_with_table(&be[1], lm, dd, 1);
#ifdef MM3_HAVE_CUDA
    /* x split at every row count: the QKV table keeps float32 accuracy, where 8 pairs
     * (16 rows) would round the product it replaces. */
    assert_int_equal(cuda_ops_gemv_set_x_round(2), 0);
#endif
    struct pairs p;
    pairs_alloc(&p, H, ncb);
    double worst = 0;
    for (int c = 0; c < CALLS; c++) {
        const int n = c % 2 ? MAX_PAIRS : 3;
        pairs_fill(&p, n, H, c);
        struct talker_pairs_in in = pairs_in(&p, n, SAMPLER_TOP_K);
        for (int s = 0; s < 2; s++) {
            struct talker_pairs_out out = {
                .codes = p.codes[s], .depth_hidden = p.depth_hidden[s], .feedback = p.feedback[s]};
            if (be[s].sample_pairs(be[s].impl, &in, &out) < 0)
                fail_msg("%s, %d pairs, call %d: %s", s ? "table" : "projection", n, c, mm3_last_error());
        }
        if (memcmp(p.codes[0], p.codes[1], sizeof(int32_t) * (size_t)n * ncb))
            fail_msg("%d pairs, call %d: the table's codes differ from the projection's", n, c);
        double rd = test_rel_error(p.depth_hidden[1], p.depth_hidden[0], (size_t)n * (ncb - 1) * H);
        double rf = test_rel_error(p.feedback[1], p.feedback[0], (size_t)n * H);
        if (rd > 1e-5 || rf > 1e-5)
            fail_msg("%d pairs, call %d: depth hiddens rel %.3g, feedback rel %.3g (expected <= 1e-5)", n, c, rd, rf);
        /* the first codebook's hidden comes before any table row: it must be the same bits */
        for (int q = 0; q < n; q++)
            if (memcmp(p.depth_hidden[0] + (size_t)q * (ncb - 1) * H, p.depth_hidden[1] + (size_t)q * (ncb - 1) * H,
                       sizeof(float) * H))
                fail_msg("%d pairs, call %d, pair %d: codebook 1's hidden differs", n, c, q);
        worst = rd > worst ? rd : worst;
    }
    print_message("depth tables against the products they replace: depth hiddens rel <= %.3g\n", worst);
    pairs_free(&p);
    talker_backend_close(&be[0]);
    talker_backend_close(&be[1]);
#ifdef MM3_HAVE_CUDA
    assert_int_equal(cuda_ops_gemv_set_x_round(0), 0);
#endif
}

static void test_tiny_a(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    graph_vs_eager(&m->lm, &m->dd);
    table_vs_projection(&m->lm, &m->dd);
}

/* Depth heads of 32 (the split-K decode kernel), 4 codebooks of 300, hidden 64 (the
 * tensor-core GEMV from 5 rows on). */
static void test_split_k_geometry(void **state)
{
    (void)state;
    struct ckpt_gen_geometry geo;
    assert_int_equal(ckpt_gen_preset("tiny", &geo), 0);
    geo.lm_hidden = 64, geo.lm_layers = 1, geo.lm_heads = 2, geo.lm_kv_heads = 1, geo.lm_head_dim = 32;
    geo.lm_intermediate = 64, geo.lm_vocab = SAMPLER_CODE_OFFSET + SAMPLER_N_CODES + 7;
    geo.dd_layers = 1, geo.dd_heads = 2, geo.dd_intermediate = 96, geo.dd_audio_vocab = 300, geo.dd_codebooks = 4;
    geo.dd_max_positions = 4;
    char *dir = test_make_tmpdir("frame_cuda_split_k");
    struct ckpt_gen_opts o = {.seed = 7, .threads = 1};
    if (ckpt_gen_write(dir, &geo, &o) < 0) fail_msg("ckpt_gen_write: %s", mm3_last_error());
    struct test_stage0 m;
    assert_int_equal(test_stage0_load(&m, dir), 0);
    graph_vs_eager(&m.lm, &m.dd);
    table_vs_projection(&m.lm, &m.dd);
    test_stage0_free(&m);
    test_remove_tree(dir);
    free(dir);
}

/* The switch on the CPU backend: nothing to capture, nothing counted. */
static void test_cpu_switch_is_a_noop(void **state)
{
    struct test_stage0 *m = *state;
    if (!m) skip();
    struct talker_backend b;
    assert_int_equal(talker_backend_open(&b, TALKER_BACKEND_CPU, &m->lm, &m->dd, 2, 16, 4), 0);
    int sizes[1] = {2};
    assert_int_equal(talker_backend_graphs_enable(&b, sizes, 1, 1), 0);
    assert_null(b.sample_pairs);
    struct talker_backend_counts counts = {.sample_graphs = -1, .sample_replays = -1, .ahead_queued = -1};
    talker_backend_counts(&b, &counts);
    assert_int_equal(counts.sample_graphs, 0);
    assert_int_equal(counts.sample_replays, 0);
    assert_int_equal(counts.ahead_queued, 0);
    talker_backend_close(&b);
}

int main(void)
{
    const struct CMUnitTest host[] = {cmocka_unit_test(test_cpu_switch_is_a_noop)};
    if (cmocka_run_group_tests_name("sampling graphs (host)", host, test_stage0_golden_setup,
                                    test_stage0_golden_teardown))
        return 1;
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) {
        printf("no CUDA device or no CUDA build: GPU tests skipped\n");
        return 77;
    }
    const struct CMUnitTest gpu[] = {cmocka_unit_test(test_tiny_a), cmocka_unit_test(test_split_k_geometry)};
    return cmocka_run_group_tests_name("sampling graphs (cuda)", gpu, test_stage0_golden_setup,
                                       test_stage0_golden_teardown)
               ? 1
               : 0;
}
