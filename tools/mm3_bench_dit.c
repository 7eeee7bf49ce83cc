/* mm3-bench-dit: the CUDA DiT forward at the release's geometry with random weights
 * made on the GPU (no files), in each matmul precision.
 *
 *   mm3-bench-dit [--layers N] [--latents L] [--windows 1,2,4,8] [--reps R]
 *                 [--precisions fp32,tf32,bf16,fp16,fp8] [--euler-steps S] [--attention
 * auto,old,flash]
 *
 * Per precision: the dense GEMM peak (cuBLASLt 8192^3, median of 10 after warm-up,
 * CUDA events), one forward of B = 2 x windows sequences (CFG pair per window) of L
 * latents (median of R), seconds per window for 30 Euler steps, achieved TFLOP/s
 * (dit_cuda_forward_flops) and its ratio to that peak. Then the drift of tf32 and
 * bf16 against fp32: the same weights, noise and condition through S Euler steps with
 * CFG (host-side blend), relative L2 error of the first velocity and of the final latents.
 * --attention: forward rows for each listed attention kernel (dit_cuda_attention_default_set):
 * auto (the built-in choice), old (the kernels before dit_attention_flash.cu: WMMA for tf32,
 * MMA for bf16), flash; fp32 always runs SIMT. The per-piece breakdown times
 * every attention kernel of the precision. fp8's peak and breakdown GEMMs are e4m3
 * (dit_gemm_run_fp8), its LayerNorm and gating the fused quantizing kernels, its attention
 * fp16's. Prints a table last. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tools/bench_median.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/dit_cuda.h"
#include "stage1/cuda/dit_fp8.h"
#include "stage1/cuda/dit_gemm.h"
#include "stage1/cuda/dit_kernels.h"
#include "stage1/flow.h"
#include "stage1/render.h"

#define MAX_WINDOWS 8
#define MAX_ATTN 3 /* the attn_choices below */
#define STEPS_PER_WINDOW 30

static uint64_t rng = 0x5eed0d17ull;

static float rnd_unit(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) / 8388608.0f - 1.0f;
}

static int die(const char *what)
{
    fprintf(stderr, "mm3-bench-dit: %s: %s\n", what, mm3_last_error());
    exit(1);
}

static float *dev_random(size_t n, float a)
{
    float *h = malloc(sizeof(float) * n);
    void *d = NULL;
    if (!h) die("out of memory");
    for (size_t i = 0; i < n; i++)
        h[i] = a * rnd_unit();
    if (cuda_malloc(&d, 4 * n) < 0 || cuda_memcpy_h2d(d, h, 4 * n) < 0) die("upload");
    free(h);
    return d;
}

static const char *prec_name(enum mm3_matmul_precision p)
{
    return mm3_matmul_precision_name(p);
}

/* e4m3 rows of a random rows x cols matrix and their scales (dit_fp8.h). */
struct fp8_mat {
    uint8_t *q;
    float *s;
};

static struct fp8_mat dev_fp8(size_t rows, size_t cols, float a, void *stream)
{
    struct fp8_mat m;
    float *f = dev_random(rows * cols, a);
    if (cuda_malloc((void **)&m.q, rows * cols) < 0 || cuda_malloc((void **)&m.s, 4 * rows) < 0 ||
        dit_fp8_quantize_rows(m.q, m.s, f, (int)rows, (int)cols, (int)cols, stream) < 0 || cuda_stream_sync(stream) < 0)
        die("fp8 operand");
    cuda_free(f);
    return m;
}

static void fp8_free(struct fp8_mat m)
{
    cuda_free(m.q), cuda_free(m.s);
}

/* Dense e4m3 GEMM peak in TFLOP/s, as gemm_peak. */
static double gemm_peak_fp8(void *stream, void *e0, void *e1)
{
    const int n = 8192;
    struct fp8_mat a = dev_fp8(n, n, 1.0f, stream), w = dev_fp8(n, n, 1.0f, stream);
    float *d = NULL;
    if (cuda_malloc((void **)&d, 4 * (size_t)n * n) < 0) die("cuda_malloc");
    struct dit_gemm *g;
    if (dit_gemm_create(&g, MM3_MATMUL_FP8) < 0) die("dit_gemm_create");
    float ms[10];
    for (int i = 0; i < 3; i++)
        if (dit_gemm_run_fp8(
                g,
                &(struct dit_gemm_product){
                    .d = d, .a = a.q, .sa = a.s, .w = w.q, .sw = w.s, .M = n, .K = n, .N = n, .lda = n, .ldd = n},
                stream) < 0)
            die("gemm");
    for (int i = 0; i < 10; i++) {
        cuda_event_record(e0, stream);
        if (dit_gemm_run_fp8(
                g,
                &(struct dit_gemm_product){
                    .d = d, .a = a.q, .sa = a.s, .w = w.q, .sw = w.s, .M = n, .K = n, .N = n, .lda = n, .ldd = n},
                stream) < 0)
            die("gemm");
        cuda_event_record(e1, stream);
        if (cuda_event_elapsed_ms(&ms[i], e0, e1) < 0) die("events");
    }
    double t = bench_median_f(ms, 10) * 1e-3;
    dit_gemm_destroy(g);
    fp8_free(a), fp8_free(w);
    cuda_free(d);
    return 2.0 * n * (double)n * n / t / 1e12;
}

/* Dense GEMM peak in TFLOP/s: random operands (zeros run faster), median of 10. */
static double gemm_peak(enum mm3_matmul_precision p, void *stream, void *e0, void *e1)
{
    if (p == MM3_MATMUL_FP8) return gemm_peak_fp8(stream, e0, e1);
    const int n = 8192;
    size_t nn = (size_t)n * n;
    float *a32 = dev_random(nn, 1.0f), *w32 = dev_random(nn, 1.0f), *d = NULL;
    void *a = a32, *w = w32;
    if (cuda_malloc((void **)&d, 4 * nn) < 0) die("cuda_malloc");
    int fmt = dit_operand_of(p);
    if (fmt != DIT_OPERAND_F32) {
        /* 2-byte copies in place of the first halves: same bytes, half the size */
        if (cuda_malloc(&a, 2 * nn) < 0 || cuda_malloc(&w, 2 * nn) < 0) die("cuda_malloc");
        if (dit_cuda_to_operand(a, fmt, a32, nn, stream) < 0 || dit_cuda_to_operand(w, fmt, w32, nn, stream) < 0)
            die("to_operand");
    }
    struct dit_gemm *g;
    if (dit_gemm_create(&g, p) < 0) die("dit_gemm_create");
    float ms[10];
    for (int i = 0; i < 3; i++)
        if (dit_gemm_run(g,
                         &(struct dit_gemm_product){.d = d, .a = a, .w = w, .M = n, .K = n, .N = n, .lda = n, .ldd = n},
                         stream) < 0)
            die("gemm");
    for (int i = 0; i < 10; i++) {
        cuda_event_record(e0, stream);
        if (dit_gemm_run(g,
                         &(struct dit_gemm_product){.d = d, .a = a, .w = w, .M = n, .K = n, .N = n, .lda = n, .ldd = n},
                         stream) < 0)
            die("gemm");
        cuda_event_record(e1, stream);
        if (cuda_event_elapsed_ms(&ms[i], e0, e1) < 0) die("events");
    }
    double t = bench_median_f(ms, 10) * 1e-3;
    dit_gemm_destroy(g);
    if (a != a32) cuda_free(a), cuda_free(w);
    cuda_free(a32), cuda_free(w32), cuda_free(d);
    return 2.0 * n * (double)n * n / t / 1e12;
}

/* The --attention choices: name, kernel in tf32, kernel in bf16 (fp32: SIMT always). */
static const struct attn_choice {
    const char *name;
    enum dit_attn_kernel tf32, bf16;
} attn_choices[] = {{"auto", DIT_ATTN_AUTO, DIT_ATTN_AUTO},
                    {"old", DIT_ATTN_WMMA, DIT_ATTN_MMA},
                    {"flash", DIT_ATTN_FLASH, DIT_ATTN_FLASH}};
_Static_assert(sizeof attn_choices / sizeof attn_choices[0] == MAX_ATTN, "MAX_ATTN counts attn_choices");

static const char *kernel_name(enum dit_attn_kernel k)
{
    static const char *names[] = {"AUTO", "SIMT", "WMMA", "MMA", "FLASH"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

struct row {
    enum mm3_matmul_precision p;
    const char *attn;
    int windows, B;
    double ms, ms_graph, s_window, tflops, peak;
};

/* Median ms of one forward of B sequences; ms_graph the same replayed as a CUDA graph
 * (0 when capture failed). */
static void time_forward(struct dit_cuda *h, int B, int L, int reps, float *x, float *t, const float *const *cond,
                         float *v, void *stream, void *e0, void *e1, double *ms_eager, double *ms_graph)
{
    float ms[32];
    if (reps > 32) reps = 32;
    if (dit_cuda_forward(h, B, L, x, t, cond, v, stream) < 0) die("forward (warm-up)");
    if (cuda_stream_sync(stream) < 0) die("forward (warm-up)");
    for (int i = 0; i < reps; i++) {
        cuda_event_record(e0, stream);
        if (dit_cuda_forward(h, B, L, x, t, cond, v, stream) < 0) die("forward");
        cuda_event_record(e1, stream);
        if (cuda_event_elapsed_ms(&ms[i], e0, e1) < 0) die("forward (events)");
    }
    *ms_eager = bench_median_f(ms, reps);
    *ms_graph = 0;
    void *graph = NULL;
    if (cuda_graph_capture_begin(stream) < 0) return;
    int rc = dit_cuda_forward(h, B, L, x, t, cond, v, stream);
    if (cuda_graph_capture_end(stream, &graph) < 0 || rc < 0) {
        fprintf(stderr, "graph capture failed: %s\n", mm3_last_error());
        return;
    }
    if (cuda_graph_launch(graph, stream) < 0 || cuda_stream_sync(stream) < 0) die("graph (warm-up)");
    for (int i = 0; i < reps; i++) {
        cuda_event_record(e0, stream);
        cuda_graph_launch(graph, stream);
        cuda_event_record(e1, stream);
        if (cuda_event_elapsed_ms(&ms[i], e0, e1) < 0) die("graph (events)");
    }
    *ms_graph = bench_median_f(ms, reps);
    cuda_graph_destroy(graph);
}

/* S Euler steps with CFG of one window from noise x0 (host), final latents into out
 * and the first guided velocity into v_first (both host, in_ch x L). */
static void euler_window(struct dit_cuda *h, int L, int steps, const float *x0, const float *dcond, float *out,
                         float *v_first, void *stream)
{
    int C = dit_cuda_config(h)->in_ch;
    size_t per = (size_t)C * L;
    float table[STEPS_PER_WINDOW + 1];
    flow_schedule_fill(table, STEPS_PER_WINDOW, FLOW_DEFAULT_SHIFT);
    float *x = malloc(sizeof(float) * 2 * per), *v = malloc(sizeof(float) * 2 * per);
    float *dx, *dv, *dt;
    if (!x || !v || cuda_malloc((void **)&dx, 8 * per) < 0 || cuda_malloc((void **)&dv, 8 * per) < 0 ||
        cuda_malloc((void **)&dt, 8) < 0)
        die("euler buffers");
    memcpy(out, x0, sizeof(float) * per);
    const float *cond[2] = {dcond, NULL};
    for (int i = 0; i < steps && i < STEPS_PER_WINDOW; i++) {
        float t2[2] = {table[i], table[i]}, dt_step = table[i + 1] - table[i];
        memcpy(x, out, sizeof(float) * per);
        memcpy(x + per, out, sizeof(float) * per);
        if (cuda_memcpy_h2d(dx, x, 8 * per) < 0 || cuda_memcpy_h2d(dt, t2, 8) < 0) die("upload");
        if (dit_cuda_forward(h, 2, L, dx, dt, cond, dv, stream) < 0) die("forward");
        if (cuda_stream_sync(stream) < 0 || cuda_memcpy_d2h(v, dv, 8 * per) < 0) die("download");
        for (size_t e = 0; e < per; e++) {
            float g = v[per + e] + FLOW_DEFAULT_GUIDANCE * (v[e] - v[per + e]);
            if (i == 0) v_first[e] = g;
            out[e] += dt_step * g;
        }
    }
    cuda_free(dx), cuda_free(dv), cuda_free(dt);
    free(x), free(v);
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Median ms of `reps` runs of `expr` (after one warm-up), each between two events. */
#define TIME_MS(out, reps, expr)                                                                                       \
    do {                                                                                                               \
        float ms_[16];                                                                                                 \
        if ((expr) < 0) die(#expr);                                                                                    \
        for (int r_ = 0; r_ < (reps); r_++) {                                                                          \
            cuda_event_record(e0, stream);                                                                             \
            if ((expr) < 0) die(#expr);                                                                                \
            cuda_event_record(e1, stream);                                                                             \
            if (cuda_event_elapsed_ms(&ms_[r_], e0, e1) < 0) die("events");                                            \
        }                                                                                                              \
        (out) = bench_median_f(ms_, (reps));                                                                           \
    } while (0)

static void *dev_operand(size_t n, float a, enum mm3_matmul_precision p, void *stream)
{
    float *f = dev_random(n, a);
    int fmt = dit_operand_of(p);
    if (fmt == DIT_OPERAND_F32) return f;
    void *b = NULL;
    if (cuda_malloc(&b, 2 * n) < 0 || dit_cuda_to_operand(b, fmt, f, n, stream) < 0 || cuda_stream_sync(stream) < 0)
        die("2-byte operand");
    cuda_free(f);
    return b;
}

/* Per-layer cost of each piece of one block at B sequences, the GEMMs with cuBLASLt's
 * first heuristic answer and autotuned: where the forward's time goes. */
static void breakdown(const struct dit_config *cfg, enum mm3_matmul_precision p, int B, int L, double fwd_ms,
                      void *stream, void *e0, void *e1)
{
    int T = L + 1, N = B * T, D = cfg->n_heads * cfg->head_dim, F = cfg->ff_inner, reps = 5;
    int bf = dit_operand_of(p);
    size_t big = (size_t)N * (D > F ? D : F);
    void *op = dev_operand(big, 1.0f, p, stream);
    void *wqkv = dev_operand((size_t)3 * D * D, 0.02f, p, stream), *wo = dev_operand((size_t)D * D, 0.02f, p, stream);
    void *wi = dev_operand((size_t)2 * F * D, 0.02f, p, stream), *wf = dev_operand((size_t)D * F, 0.01f, p, stream);
    float *x = dev_random((size_t)N * D, 1.0f), *qkv = dev_random((size_t)N * 3 * D, 1.0f);
    float *g = dev_random((size_t)N * 2 * F, 1.0f), *bi = dev_random((size_t)2 * F, 0.1f);
    float *lw = dev_random((size_t)D, 1.0f),
          *cs = dev_random((size_t)T * (cfg->rotary_dim ? cfg->rotary_dim : 1), 1.0f);
    void *o2 = NULL;
    if (cuda_malloc(&o2, 4 * big) < 0) die("cuda_malloc");
    double flop_qkv = 2.0 * N * D * 3.0 * D, flop_wo = 2.0 * N * D * D, flop_in = 2.0 * N * D * 2.0 * F;
    double flop_out = 2.0 * N * F * D, flop_att = 4.0 * B * (double)T * T * D;
    printf("\nbreakdown %s, B %d (%d token rows), per layer (forward %.3f ms / %d layers = %.3f ms):\n", prec_name(p),
           B, N, fwd_ms, cfg->n_layers, fwd_ms / cfg->n_layers);
    printf("| piece | heuristic #1 ms | autotuned ms | TFLOP/s (autotuned) |\n|---|---|---|---|\n");
    double sum = 0;
    struct dit_gemm *gh[2];
    for (int a = 0; a < 2; a++) {
        if (dit_gemm_create(&gh[a], p) < 0) die("dit_gemm_create");
        dit_gemm_set_autotune(gh[a], a);
    }
    const char *names[4] = {"qkv GEMM", "out-proj GEMM (+x)",
                            p == MM3_MATMUL_FP8 ? "ff_in GEMM (bias in the gating)" : "ff_in GEMM (+bias)",
                            "ff_out GEMM (+bias, +x)"};
    double flops[4] = {flop_qkv, flop_wo, flop_in, flop_out};
    int f8 = p == MM3_MATMUL_FP8;
    struct fp8_mat q8 = {0}, q_qkv = {0}, q_wo = {0}, q_wi = {0}, q_wf = {0};
    if (f8) {
        q8 = dev_fp8((size_t)N, (size_t)(D > F ? D : F), 1.0f, stream);
        q_qkv = dev_fp8((size_t)3 * D, D, 0.02f, stream), q_wo = dev_fp8(D, D, 0.02f, stream);
        q_wi = dev_fp8((size_t)2 * F, D, 0.02f, stream), q_wf = dev_fp8(D, F, 0.01f, stream);
    }
    for (int k = 0; k < 4; k++) {
        float t[2];
        for (int a = 0; a < 2; a++) {
            struct dit_gemm *G = gh[a];
            if (f8) {
                switch (k) {
                case 0:
                    TIME_MS(t[a], reps,
                            dit_gemm_run_fp8(G,
                                             &(struct dit_gemm_product){.d = qkv,
                                                                        .a = q8.q,
                                                                        .sa = q8.s,
                                                                        .w = q_qkv.q,
                                                                        .sw = q_qkv.s,
                                                                        .M = N,
                                                                        .K = D,
                                                                        .N = 3 * D,
                                                                        .lda = D,
                                                                        .ldd = 3 * D},
                                             stream));
                    break;
                case 1:
                    TIME_MS(t[a], reps,
                            dit_gemm_run_fp8(G,
                                             &(struct dit_gemm_product){.d = x,
                                                                        .a = q8.q,
                                                                        .sa = q8.s,
                                                                        .w = q_wo.q,
                                                                        .sw = q_wo.s,
                                                                        .c = x,
                                                                        .M = N,
                                                                        .K = D,
                                                                        .N = D,
                                                                        .lda = D,
                                                                        .ldd = D},
                                             stream));
                    break;
                case 2:
                    TIME_MS(t[a], reps,
                            dit_gemm_run_fp8(G,
                                             &(struct dit_gemm_product){.d = g,
                                                                        .a = q8.q,
                                                                        .sa = q8.s,
                                                                        .w = q_wi.q,
                                                                        .sw = q_wi.s,
                                                                        .M = N,
                                                                        .K = D,
                                                                        .N = 2 * F,
                                                                        .lda = D,
                                                                        .ldd = 2 * F},
                                             stream));
                    break;
                default:
                    TIME_MS(t[a], reps,
                            dit_gemm_run_fp8(G,
                                             &(struct dit_gemm_product){.d = x,
                                                                        .a = q8.q,
                                                                        .sa = q8.s,
                                                                        .w = q_wf.q,
                                                                        .sw = q_wf.s,
                                                                        .bias = bi,
                                                                        .c = x,
                                                                        .M = N,
                                                                        .K = F,
                                                                        .N = D,
                                                                        .lda = F,
                                                                        .ldd = D},
                                             stream));
                    break;
                }
                continue;
            }
            switch (k) {
            case 0:
                TIME_MS(
                    t[a], reps,
                    dit_gemm_run(G,
                                 &(struct dit_gemm_product){
                                     .d = qkv, .a = op, .w = wqkv, .M = N, .K = D, .N = 3 * D, .lda = D, .ldd = 3 * D},
                                 stream));
                break;
            case 1:
                TIME_MS(t[a], reps,
                        dit_gemm_run(G,
                                     &(struct dit_gemm_product){
                                         .d = x, .a = op, .w = wo, .c = x, .M = N, .K = D, .N = D, .lda = D, .ldd = D},
                                     stream));
                break;
            case 2:
                TIME_MS(
                    t[a], reps,
                    dit_gemm_run(
                        G,
                        &(struct dit_gemm_product){
                            .d = g, .a = op, .w = wi, .bias = bi, .M = N, .K = D, .N = 2 * F, .lda = D, .ldd = 2 * F},
                        stream));
                break;
            default:
                TIME_MS(
                    t[a], reps,
                    dit_gemm_run(
                        G,
                        &(struct dit_gemm_product){
                            .d = x, .a = op, .w = wf, .bias = bi, .c = x, .M = N, .K = F, .N = D, .lda = F, .ldd = D},
                        stream));
                break;
            }
        }
        printf("| %s | %.3f | %.3f | %.1f |\n", names[k], t[0], t[1], flops[k] / (t[1] * 1e-3) / 1e12);
        sum += t[1];
    }
    /* every attention kernel of this precision; the sum counts the default (AUTO) one */
    static const enum dit_attn_kernel kernels[] = {DIT_ATTN_AUTO, DIT_ATTN_SIMT, DIT_ATTN_WMMA, DIT_ATTN_MMA,
                                                   DIT_ATTN_FLASH};
    float ta = 0, tl, tg;
    const struct dit_attention att = {.out = o2,
                                      .out_fmt = bf,
                                      .qkv = qkv,
                                      .heads = {.n_seq = B,
                                                .T = T,
                                                .n_heads = cfg->n_heads,
                                                .head_dim = cfg->head_dim,
                                                .rotary_dim = cfg->rotary_dim},
                                      .cs = cfg->rotary_dim ? cs : NULL,
                                      .scale = 0.125f,
                                      .prec = p};
    const struct dit_layernorm ln = {.x = x, .w = lw, .b = lw, .n = N, .dim = D, .eps = 1e-5f};
    for (size_t k = 0; k < sizeof kernels / sizeof kernels[0]; k++) {
        enum dit_attn_kernel kk = kernels[k];
        if (kk == DIT_ATTN_SIMT && p != MM3_MATMUL_FP32) continue; /* minutes at B 16 */
        if (kk != DIT_ATTN_AUTO && kk != DIT_ATTN_SIMT && p == MM3_MATMUL_FP32) continue;
        if (kk == DIT_ATTN_MMA && p != MM3_MATMUL_BF16) continue;
        float t;
        TIME_MS(t, reps, dit_cuda_attention_kernel(&att, kk, stream));
        printf("| attention (%s) | | %.3f | %.1f |\n", kernel_name(kk), t, flop_att / (t * 1e-3) / 1e12);
        if (kk == DIT_ATTN_AUTO) ta = t;
    }
    if (f8) {
        float tq;
        TIME_MS(tl, reps, dit_fp8_layernorm(q8.q, q8.s, &ln, stream));
        TIME_MS(tg, reps, dit_fp8_silu_gate(q8.q, q8.s, g, bi, N, F, stream));
        TIME_MS(tq, reps, dit_fp8_quantize_rows(q8.q, q8.s, x, N, D, D, stream));
        printf("| quantize the attention output | | %.3f | |\n", tq);
        sum += tq;
    } else {
        TIME_MS(tl, reps, dit_cuda_layernorm(o2, bf, &ln, stream));
        TIME_MS(tg, reps, dit_cuda_silu_gate(o2, bf, g, N, F, stream));
    }
    printf("| LayerNorm (x2 per layer) | | %.3f | |\n", tl);
    printf("| SiLU gating | | %.3f | |\n", tg);
    sum += ta + 2 * tl + tg;
    printf("| sum of pieces | | %.3f | |\n", sum);
    for (int a = 0; a < 2; a++)
        dit_gemm_destroy(gh[a]);
    if (f8) fp8_free(q8), fp8_free(q_qkv), fp8_free(q_wo), fp8_free(q_wi), fp8_free(q_wf);
    void *bufs[] = {op, wqkv, wo, wi, wf, x, qkv, g, bi, lw, cs, o2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        cuda_free(bufs[i]);
}

static void usage(void)
{
    fprintf(stderr, "usage: mm3-bench-dit [--layers N] [--latents L] [--windows 1,2,4,8] [--reps R]\n"
                    "                     [--precisions fp32,tf32,bf16,fp16,fp8] [--euler-steps S] [--frame-rate FPS]\n"
                    "                     [--attention auto,old,flash]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    struct dit_config cfg = {.in_ch = 128,
                             .cond_dim = 2048,
                             .n_layers = 36,
                             .n_heads = 32,
                             .head_dim = 64,
                             .ff_inner = 8192,
                             .rotary_dim = 32,
                             .fourier_dim = 256};
    /* frames per second of the AR stream: the release's 44100 / 1764 (condition encoder config) */
    double frame_rate = 25.0;
    int L = 689, reps = 5, euler_steps = 4, n_windows = 4, windows[MAX_WINDOWS] = {1, 2, 4, 8};
    int n_prec = 3, n_attn = 1, attn[MAX_ATTN] = {0};
    enum mm3_matmul_precision precs[MM3_MATMUL_COUNT] = {MM3_MATMUL_FP32, MM3_MATMUL_TF32, MM3_MATMUL_BF16};
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) usage();
        if (!strcmp(a, "--layers"))
            cfg.n_layers = atoi(val);
        else if (!strcmp(a, "--latents"))
            L = atoi(val);
        else if (!strcmp(a, "--reps"))
            reps = atoi(val);
        else if (!strcmp(a, "--euler-steps"))
            euler_steps = atoi(val);
        else if (!strcmp(a, "--frame-rate"))
            frame_rate = atof(val);
        else if (!strcmp(a, "--windows")) {
            n_windows = 0;
            for (char *s = (char *)val; *s && n_windows < MAX_WINDOWS;) {
                windows[n_windows++] = (int)strtol(s, &s, 10);
                if (*s == ',')
                    s++;
                else if (*s)
                    usage();
            }
        } else if (!strcmp(a, "--attention")) {
            n_attn = 0;
            for (int c = 0; c < MAX_ATTN; c++) {
                const char *hit = strstr(val, attn_choices[c].name);
                /* a name must not match inside another: whole comma-separated items */
                size_t len = strlen(attn_choices[c].name);
                for (; hit; hit = strstr(hit + 1, attn_choices[c].name))
                    if ((hit == val || hit[-1] == ',') && (hit[len] == ',' || hit[len] == 0)) break;
                if (hit) attn[n_attn++] = c;
            }
            if (n_attn == 0) usage();
        } else if (!strcmp(a, "--precisions")) {
            n_prec = 0;
            if (strstr(val, "fp32")) precs[n_prec++] = MM3_MATMUL_FP32;
            if (strstr(val, "tf32")) precs[n_prec++] = MM3_MATMUL_TF32;
            if (strstr(val, "bf16")) precs[n_prec++] = MM3_MATMUL_BF16;
            if (strstr(val, "fp16")) precs[n_prec++] = MM3_MATMUL_FP16;
            if (strstr(val, "fp8")) precs[n_prec++] = MM3_MATMUL_FP8;
        } else
            usage();
    }
    if (cfg.n_layers < 1 || L < 1 || reps < 1 || n_windows < 1 || n_prec < 1 || !(frame_rate > 0)) usage();
    for (int w = 0; w < n_windows; w++)
        if (windows[w] < 1 || windows[w] > 64) usage();
    if (cuda_device_count_safe() < 1) {
        fprintf(stderr, "mm3-bench-dit: no CUDA device\n");
        return 77;
    }
    char desc[256];
    cuda_device_describe(desc, sizeof desc);
    printf("device: %s\nDiT: %d layers, hidden %d (%d x %d), ff %d, rotary %d, L %d latents (+ time token)\n", desc,
           cfg.n_layers, cfg.n_heads * cfg.head_dim, cfg.n_heads, cfg.head_dim, cfg.ff_inner, cfg.rotary_dim, L);
    printf("FLOP per sequence forward: %.4g T\n", dit_cuda_forward_flops(&cfg, 1, L) / 1e12);

    void *stream, *e0, *e1;
    if (cuda_stream_create(&stream) < 0 || cuda_event_create(&e0) < 0 || cuda_event_create(&e1) < 0) die("stream");
    int max_w = 0;
    for (int w = 0; w < n_windows; w++)
        max_w = windows[w] > max_w ? windows[w] : max_w;
    int max_B = 2 * max_w;
    size_t per = (size_t)cfg.in_ch * L;
    float *dx = dev_random(max_B * per, 1.0f), *dcond = dev_random((size_t)L * cfg.cond_dim, 1.0f), *dv;
    float *dt = dev_random((size_t)max_B, 0.5f);
    if (cuda_malloc((void **)&dv, 4 * max_B * per) < 0) die("cuda_malloc");
    const float *cond[2 * 64];
    for (int b = 0; b < max_B; b++)
        cond[b] = b % 2 ? NULL : dcond; /* CFG: conditional, unconditional */

    float *x0 = malloc(sizeof(float) * per);
    float *fin[MM3_MATMUL_COUNT], *vfirst[MM3_MATMUL_COUNT];
    for (size_t e = 0; e < per; e++)
        x0[e] = rnd_unit() * 1.7f;
    struct row rows[MM3_MATMUL_COUNT * MAX_ATTN * MAX_WINDOWS];
    int n_rows = 0;
    double peaks[MM3_MATMUL_COUNT];
    for (int pi = 0; pi < n_prec; pi++) {
        enum mm3_matmul_precision p = precs[pi];
        peaks[pi] = gemm_peak(p, stream, e0, e1);
        printf("%s: dense GEMM 8192^3 %.1f TFLOP/s\n", prec_name(p), peaks[pi]);
        fflush(stdout);
        struct dit_cuda *h;
        if (dit_cuda_load_random(&h, &cfg, p, 1234) < 0) die("dit_cuda_load_random");
        if (dit_cuda_reserve(h, max_B, L) < 0) die("dit_cuda_reserve");
        int first = n_rows;
        for (int a = 0; a < (p == MM3_MATMUL_FP32 ? 1 : n_attn); a++) {
            const struct attn_choice *ac = &attn_choices[attn[a]];
            /* fp16 runs the attention in tf32 (only the GEMMs take fp16 inputs) */
            if (dit_cuda_attention_default_set(p, p == MM3_MATMUL_BF16 ? ac->bf16
                                                  : p == MM3_MATMUL_FP32 ? DIT_ATTN_AUTO
                                                                         : ac->tf32) < 0)
                die("dit_cuda_attention_default_set");
            for (int w = 0; w < n_windows; w++) {
                struct row *r = &rows[n_rows++];
                r->p = p, r->attn = p == MM3_MATMUL_FP32 ? "SIMT" : ac->name;
                r->windows = windows[w], r->B = 2 * windows[w], r->peak = peaks[pi];
                int rp = p == MM3_MATMUL_FP32 && r->B > 4 ? (reps < 3 ? reps : 3) : reps;
                time_forward(h, r->B, L, rp, dx, dt, cond, dv, stream, e0, e1, &r->ms, &r->ms_graph);
                double best = r->ms_graph > 0 && r->ms_graph < r->ms ? r->ms_graph : r->ms;
                r->s_window = best * 1e-3 * STEPS_PER_WINDOW / r->windows;
                r->tflops = dit_cuda_forward_flops(&cfg, r->B, L) / (best * 1e-3) / 1e12;
                printf("%s %s B %d: %.2f ms eager, %.2f ms graph\n", prec_name(p), r->attn, r->B, r->ms, r->ms_graph);
                fflush(stdout);
            }
        }
        if (dit_cuda_attention_default_set(p, DIT_ATTN_AUTO) < 0) die("dit_cuda_attention_default_set");
        /* where the time goes, at the smallest and largest batch */
        /* ... next to the forward that ran the default attention (the breakdown's sum does) */
        for (int i = first; i < n_rows; i += n_windows)
            if (!strcmp(rows[i].attn, "auto")) first = i;
        breakdown(&cfg, p, rows[first].B, L, rows[first].ms, stream, e0, e1);
        if (n_windows > 1)
            breakdown(&cfg, p, rows[first + n_windows - 1].B, L, rows[first + n_windows - 1].ms, stream, e0, e1);
        fin[pi] = malloc(sizeof(float) * per);
        vfirst[pi] = malloc(sizeof(float) * per);
        euler_window(h, L, euler_steps, x0, dcond, fin[pi], vfirst[pi], stream);
        dit_cuda_free(h);
    }

    /* Each window adds one hop of new audio in steady state. */
    double audio_s_per_window = RENDER_HOP_FRAMES / frame_rate;
    printf("\n| figure | precision | attention | windows (B) | ms / forward (eager, graph) "
           "| s / window (30 steps, CFG) | GPU s per audio s | TFLOP/s | dense GEMM peak | ratio |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n_rows; i++) {
        struct row *r = &rows[i];
        printf("| DiT forward | %s | %s | %d (%d) | %.1f, %.1f | %.3f | %.3f | %.1f | %.1f | %.2f |\n", prec_name(r->p),
               r->attn, r->windows, r->B, r->ms, r->ms_graph, r->s_window, r->s_window / audio_s_per_window,
               r->tflops, r->peak, r->tflops / r->peak);
    }
    int ref = -1;
    for (int pi = 0; pi < n_prec; pi++)
        if (precs[pi] == MM3_MATMUL_FP32) ref = pi;
    if (ref >= 0)
        for (int pi = 0; pi < n_prec; pi++) {
            if (pi == ref) continue;
            printf("| drift vs fp32 | %s | auto | 1 (2) | first guided velocity rel %.3g | latents after %d Euler "
                   "steps rel %.3g | | | | |\n",
                   prec_name(precs[pi]), rel_l2(vfirst[pi], vfirst[ref], per), euler_steps,
                   rel_l2(fin[pi], fin[ref], per));
        }
    return 0;
}

#else

int main(void)
{
    fprintf(stderr, "mm3-bench-dit: built without CUDA\n");
    return 77;
}

#endif
