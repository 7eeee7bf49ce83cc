/* mm3-bench-ops: times the stage-0 decode kernels on the GPU at the release shapes
 * against the weight-streaming floor.
 *
 *   mm3-bench-ops [--reps N] [--rows A,B] [--attention-only | --no-attention | --read-patterns]
 *
 * 1. Device-to-device copy bandwidth: (bytes read + bytes written) / time of a
 *    1 GiB cudaMemcpyAsync, median of N after warm-up. This is the ceiling every
 *    bf16 weight stream is compared with.
 * 2. cuda_ops_matmul_bf16 at each weight shape of one frame (LM layer, sliced LM
 *    head, depth-decoder pass), for 2 and 16 rows. Each shape rotates over enough
 *    weight copies (>= 512 MiB) that no pass is served from L2; one timed sample
 *    is one pass over all copies between two events, divided by the copies.
 * 3. Decode attention at 10240 cached positions (bf16 KV), per LM layer.
 * 4. The frame: sum over the frame's matmuls of count x time, against the floor
 *    22.3 GB / copy bandwidth.
 * --read-patterns instead: the read rate of a 1 GiB bf16 matrix by access pattern and
 * copy mechanism (tools/cuda/read_bench.h), one and two blocks per SM, against the copy
 * bandwidth.
 * Built without CUDA it prints "no CUDA" and exits 77. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/ops.h"
#include "tools/bench_median.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage0/model/cuda/talker_kernels.h"
#include "tools/cuda/read_bench.h"

#define TRY(call)                                                              \
    do {                                                                       \
        if ((call) < 0) {                                                      \
            fprintf(stderr, "error: %s: %s\n", #call, mm3_last_error());       \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static int reps = 15;
enum { BENCH_MAX_ROWS = 64 };       /* the per-shape table's x and y hold this many rows */
static int row_counts[2] = {2, 16}; /* --rows A,B */
static void *stream; /* one non-default stream, so that graphs can be captured */
static uint64_t rng = 0x6d6d33; /* fixed: timings must not depend on the draw */

static float rnd(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((z >> 40) + 1) / (float)(1 << 23) - 1.0f; /* (-1, 1], never 0 except rarely */
}

/* Median seconds per call over `reps` samples; each sample runs fn(arg, i) for
 * i < per_sample, as back-to-back launches or (graph) as one captured graph replay. */
typedef void (*bench_fn)(void *arg, int i);
static double time_median_mode(bench_fn fn, void *arg, int per_sample, int graph)
{
    void *e0, *e1, *exec = NULL;
    TRY(cuda_event_create(&e0));
    TRY(cuda_event_create(&e1));
    for (int i = 0; i < per_sample; i++) fn(arg, i); /* warm-up: module load, handles, pools */
    TRY(cuda_stream_sync(stream));
    if (graph) {
        TRY(cuda_graph_capture_begin(stream));
        for (int i = 0; i < per_sample; i++) fn(arg, i);
        TRY(cuda_graph_capture_end(stream, &exec));
        TRY(cuda_graph_launch(exec, stream));
        TRY(cuda_stream_sync(stream));
    }
    float *ms = malloc(sizeof(float) * reps);
    for (int r = 0; r < reps; r++) {
        TRY(cuda_event_record(e0, stream));
        if (graph)
            TRY(cuda_graph_launch(exec, stream));
        else
            for (int i = 0; i < per_sample; i++) fn(arg, i);
        TRY(cuda_event_record(e1, stream));
        TRY(cuda_event_elapsed_ms(&ms[r], e0, e1));
    }
    TRY(cuda_stream_sync(stream));
    double t = bench_median_f(ms, reps) * 1e-3 / per_sample;
    free(ms);
    cuda_graph_destroy(exec);
    cuda_event_destroy(e0);
    cuda_event_destroy(e1);
    return t;
}

static double time_median(bench_fn fn, void *arg, int per_sample)
{
    return time_median_mode(fn, arg, per_sample, 0);
}

/* ---- copy bandwidth ------------------------------------------------------------ */

struct copy_arg {
    void *dst, *src;
    size_t bytes;
};

static void copy_once(void *arg, int i)
{
    (void)i;
    struct copy_arg *c = arg;
    TRY(cuda_memcpy_d2d(c->dst, c->src, c->bytes, stream));
}

static double copy_bandwidth(void)
{
    struct copy_arg c = {NULL, NULL, (size_t)1 << 30};
    TRY(cuda_malloc(&c.src, c.bytes));
    TRY(cuda_malloc(&c.dst, c.bytes));
    TRY(cuda_memset(c.src, 0x3c, c.bytes)); /* non-zero */
    TRY(cuda_stream_sync(NULL));
    double t = time_median(copy_once, &c, 1);
    cuda_free(c.src);
    cuda_free(c.dst);
    return 2.0 * (double)c.bytes / t;
}

/* ---- matmul shapes --------------------------------------------------------------- */

struct shape {
    const char *name;
    int out, in;
    int per_frame; /* times the frame reads this matrix (unfused frame) */
    int fused;     /* 1: a fused alternative, not part of the unfused frame sum */
};

/* Release geometry (docs/model.md §2): LM 36 layers of hidden 4096, 32/8 heads x 128,
 * FFN 12288; head sliced to 16385 rows; depth decoder 4 layers of 4096, 16 heads x
 * 256, FFN 6144, run 7 times per frame with a 4096^2 projection and a 1024-row head. */
static const struct shape shapes[] = {
    {"LM q_proj", 4096, 4096, 36, 0},
    {"LM k_proj / v_proj", 1024, 4096, 72, 0},
    {"LM o_proj", 4096, 4096, 36, 0},
    {"LM gate_proj / up_proj", 12288, 4096, 72, 0},
    {"LM down_proj", 4096, 12288, 36, 0},
    {"LM head (sliced)", 16385, 4096, 1, 0},
    {"depth q/k/v/o, projection", 4096, 4096, 7 * (4 * 4 + 1), 0},
    {"depth gate / up", 6144, 4096, 7 * 4 * 2, 0},
    {"depth down", 4096, 6144, 7 * 4, 0},
    {"depth audio head", 1024, 4096, 7, 0},
    {"LM fused qkv", 6144, 4096, 36, 1},
    {"LM fused gate_up", 24576, 4096, 36, 1},
    {"depth fused gate_up", 12288, 4096, 28, 1},
};
enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };

struct mm_arg {
    uint16_t **w;
    int copies;
    float *x, *y;
    int n, in, out;
    int opw; /* 0: cuda_ops_matmul_bf16's choice; 2, 4, 8: float32 kernel; -2, -4: tensor-core kernel
              * with that many weight tiles per block */
};

static void mm_once(void *arg, int i)
{
    struct mm_arg *a = arg;
    if (a->opw < 0)
        TRY(cuda_ops_gemv_bf16_mma(a->y, a->x, a->w[i % a->copies], a->n, a->in, a->out, -a->opw, stream));
    else if (a->opw)
        TRY(cuda_ops_gemv_bf16_opw(a->y, a->x, a->w[i % a->copies], a->n, a->in, a->out, a->opw, stream));
    else
        TRY(cuda_ops_matmul_bf16(a->y, a->x, a->w[i % a->copies], a->n, a->in, a->out, stream));
}

/* Graph time of one kernel variant (opw as in struct mm_arg). Past the variant's row
 * limit the call would fail: it counts as never faster (INFINITY). */
static double time_variant(struct mm_arg *a, int copies, int opw)
{
    const int limit = opw > 0 ? CUDA_OPS_GEMV_MAX_ROWS : CUDA_OPS_GEMV_MMA_MAX_ROWS;
    if (a->n > limit) return INFINITY;
    a->opw = opw;
    const double t = time_median_mode(mm_once, a, copies, 1);
    a->opw = 0;
    return t;
}

/* ---- attention ------------------------------------------------------------------- */

struct att_arg {
    float *out, *q;
    void *k, *v;
    int *len;
    int n_seq, max_len;
    int chunk; /* 0: automatic */
};

static void att_once(void *arg, int i)
{
    (void)i;
    struct att_arg *a = arg;
    const size_t row = 8 * 128;
    const struct cuda_attention_decode d = {.out = a->out,
                                            .q = a->q,
                                            .kv = {a->k, a->v, CUDA_KV_BF16, (size_t)a->max_len * row, row},
                                            .kv_len = a->len,
                                            .n_seq = a->n_seq,
                                            .max_kv_len = a->max_len,
                                            .heads = {32, 8, 128, 1.0f / sqrtf(128.0f)},
                                            .chunk_positions = a->chunk};
    TRY(cuda_ops_attention_decode(&d, stream));
}

/* One talker layer's decode attention as the graph runs it: the QKV rows as the
 * product leaves them, a cache planned for `plan` positions, every sequence at `len`.
 * mode 0: norm/RoPE/store kernel, split-K kernel, combine kernel; 1: the split-K
 * kernel with the norm/RoPE/store inside, combine kernel. */
struct step_arg {
    float *out, *qkv, *qn, *kn, *inv_freq, *ws;
    void *k, *v;
    int *len, *pos, *row;
    size_t ws_bytes;
    int n_seq, plan, mode;
};

static void step_once(void *arg, int i)
{
    (void)i;
    struct step_arg *a = arg;
    const size_t row = 8 * 128, seq = (size_t)(a->plan + 1) * row, qkv = 6144;
    const struct cuda_qkv_prep prep = {a->qn, a->kn, 1e-6f, 128, a->inv_freq, a->pos};
    const struct cuda_attention_decode d = {.out = a->out,
                                            .q = a->qkv,
                                            .q_stride = qkv,
                                            .kv = {a->k, a->v, CUDA_KV_BF16, seq, row},
                                            .kv_len = a->len,
                                            .seq_row = a->row,
                                            .n_seq = a->n_seq,
                                            .max_kv_len = a->plan,
                                            .heads = {32, 8, 128, 1.0f / sqrtf(128.0f)},
                                            .workspace = a->ws,
                                            .workspace_bytes = a->ws_bytes};
    if (a->mode == 0) {
        TRY(talker_cuda_qkv_norm_rope_store(a->qkv, a->n_seq, &d.heads, &prep, &d.kv, a->row, stream));
        TRY(cuda_ops_attention_decode(&d, stream));
        return;
    }
    TRY(cuda_ops_attention_decode_qkv(&d, &prep, stream));
}

static void fill_random_bf16(void *dev, size_t n);
static void fill_random_f32(void *dev, size_t n);

/* One layer's inputs for step_once: a cache planned for `plan` positions of n_seq
 * sequences, random q/k/v rows and norm weights, the real RoPE frequencies. */
static void step_arg_alloc(struct step_arg *a, int n_seq, int plan)
{
    memset(a, 0, sizeof *a);
    a->n_seq = n_seq;
    a->plan = plan;
    const size_t kvn = (size_t)n_seq * (plan + 1) * 8 * 128;
    TRY(cuda_malloc(&a->k, 2 * kvn));
    TRY(cuda_malloc(&a->v, 2 * kvn));
    fill_random_bf16(a->k, kvn);
    fill_random_bf16(a->v, kvn);
    TRY(cuda_malloc((void **)&a->qkv, sizeof(float) * n_seq * 6144));
    TRY(cuda_malloc((void **)&a->out, sizeof(float) * n_seq * 4096));
    TRY(cuda_malloc((void **)&a->qn, sizeof(float) * 128));
    TRY(cuda_malloc((void **)&a->kn, sizeof(float) * 128));
    TRY(cuda_malloc((void **)&a->inv_freq, sizeof(float) * 64));
    fill_random_f32(a->qkv, (size_t)n_seq * 6144);
    fill_random_f32(a->qn, 128);
    fill_random_f32(a->kn, 128);
    float freq[64];
    op_rope_inv_freq(freq, 1e6, 128); /* the release's rope_theta and head_dim */
    TRY(cuda_memcpy_h2d(a->inv_freq, freq, sizeof freq));
    a->ws_bytes = cuda_ops_attention_decode_workspace_bytes(n_seq, 32, 8, 128, plan);
    TRY(cuda_malloc((void **)&a->ws, a->ws_bytes));
    TRY(cuda_malloc((void **)&a->len, sizeof(int) * n_seq));
    TRY(cuda_malloc((void **)&a->pos, sizeof(int) * n_seq));
    TRY(cuda_malloc((void **)&a->row, sizeof(int) * n_seq));
}

/* Every sequence at len positions (the new token at len - 1), sequence i in row i. */
static void step_arg_set_len(struct step_arg *a, int len)
{
    int *h = malloc(sizeof(int) * 3 * a->n_seq);
    for (int i = 0; i < a->n_seq; i++) h[i] = len, h[a->n_seq + i] = len - 1, h[2 * a->n_seq + i] = i;
    TRY(cuda_memcpy_h2d(a->len, h, sizeof(int) * a->n_seq));
    TRY(cuda_memcpy_h2d(a->pos, h + a->n_seq, sizeof(int) * a->n_seq));
    TRY(cuda_memcpy_h2d(a->row, h + 2 * a->n_seq, sizeof(int) * a->n_seq));
    free(h);
}

static void step_arg_free(struct step_arg *a)
{
    cuda_free(a->k), cuda_free(a->v), cuda_free(a->qkv), cuda_free(a->out), cuda_free(a->qn), cuda_free(a->kn);
    cuda_free(a->inv_freq), cuda_free(a->ws), cuda_free(a->len), cuda_free(a->pos), cuda_free(a->row);
}

static void bench_attention_step(void)
{
    printf("\nDecode attention step, LM layer (32/8 heads x 128, bf16 KV, planned for 5249 positions; graph "
           "replays of 8 layers' calls, us per call): norm/RoPE/store + split + combine | fused norm/RoPE/store\n");
    const int plan = 5249, seqs[2] = {2, 16}, lens[2] = {1000, 5000};
    for (int si = 0; si < 2; si++) {
        struct step_arg a;
        step_arg_alloc(&a, seqs[si], plan);
        for (int li = 0; li < 2; li++) {
            step_arg_set_len(&a, lens[li]);
            double t[2];
            for (a.mode = 0; a.mode < 2; a.mode++) t[a.mode] = time_median_mode(step_once, &a, 8, 1);
            printf("  %2d sequences at %4d positions: %7.1f | %7.1f us\n", a.n_seq, lens[li], t[0] * 1e6, t[1] * 1e6);
        }
        step_arg_free(&a);
    }
}

static void fill_random_bf16(void *dev, size_t n)
{
    uint16_t *h = malloc(2 * n);
    for (size_t i = 0; i < n; i++) h[i] = mm3_f32_to_bf16(rnd() * 0.05f);
    TRY(cuda_memcpy_h2d(dev, h, 2 * n));
    free(h);
}

static void fill_random_f32(void *dev, size_t n)
{
    float *h = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) h[i] = rnd();
    TRY(cuda_memcpy_h2d(dev, h, sizeof(float) * n));
    free(h);
}

/* Both decode attention sections: the bare kernels at 10240 positions with a chunk
 * sweep, then one layer's step as the graph runs it. */
static void bench_attention(double bw)
{
    const int rows[2] = {2, 16};
    printf("\nDecode attention, LM layer (32/8 heads x 128, bf16 KV, 10240 positions each; graph replays):\n");
    for (int r = 0; r < 2; r++) {
        struct att_arg a = {NULL, NULL, NULL, NULL, NULL, rows[r], 10240, 0};
        const size_t kvn = (size_t)a.n_seq * a.max_len * 8 * 128;
        TRY(cuda_malloc(&a.k, 2 * kvn));
        TRY(cuda_malloc(&a.v, 2 * kvn));
        fill_random_bf16(a.k, kvn);
        fill_random_bf16(a.v, kvn);
        TRY(cuda_malloc((void **)&a.q, sizeof(float) * a.n_seq * 4096));
        TRY(cuda_malloc((void **)&a.out, sizeof(float) * a.n_seq * 4096));
        fill_random_f32(a.q, (size_t)a.n_seq * 4096);
        int lens[16];
        for (int i = 0; i < 16; i++) lens[i] = a.max_len;
        TRY(cuda_malloc((void **)&a.len, sizeof lens));
        TRY(cuda_memcpy_h2d(a.len, lens, sizeof lens));
        double t = time_median_mode(att_once, &a, 4, 1);
        double bytes = 2.0 * 2 * kvn;
        printf("%-28s %13s %4d %10.1f %8.0f %6.0f%%\n", "attention_decode", "10240 pos", a.n_seq, t * 1e6,
               bytes / t * 1e-9, 100.0 * bytes / t / bw);
        printf("    chunk sweep:");
        for (a.chunk = 64; a.chunk <= 2048; a.chunk *= 2) {
            double tc = time_median_mode(att_once, &a, 4, 1);
            printf("  %d: %.1f us %.0f%%", a.chunk, tc * 1e6, 100.0 * bytes / tc / bw);
            if (a.chunk == 256) printf("\n                ");
        }
        printf("\n");
        a.chunk = 0;
        cuda_free(a.k);
        cuda_free(a.v);
        cuda_free(a.q);
        cuda_free(a.out);
        cuda_free(a.len);
    }

    bench_attention_step();
}

/* --profile: a few plain launches of one kernel and nothing else, for a profiler
 * (ncu) to pick up: a matmul shape (index into shapes[]) at `rows` rows, or (shape
 * -1) one talker layer's fused decode attention of `rows` sequences at 1000
 * positions. */
static int profile_once(int shape, int rows)
{
    if (shape < 0) {
        struct step_arg a;
        step_arg_alloc(&a, rows, 5249);
        step_arg_set_len(&a, 1000);
        a.mode = 1;
        for (int i = 0; i < 4; i++) step_once(&a, i);
        TRY(cuda_stream_sync(stream));
        step_arg_free(&a);
    } else {
        const struct shape *sh = &shapes[shape];
        const size_t wn = (size_t)sh->out * sh->in;
        uint16_t *w = NULL;
        TRY(cuda_malloc((void **)&w, 2 * wn));
        fill_random_bf16(w, wn);
        struct mm_arg a = {.w = &w, .copies = 1, .n = rows, .in = sh->in, .out = sh->out};
        TRY(cuda_malloc((void **)&a.x, sizeof(float) * rows * sh->in));
        TRY(cuda_malloc((void **)&a.y, sizeof(float) * rows * sh->out));
        fill_random_f32(a.x, (size_t)rows * sh->in);
        for (int i = 0; i < 4; i++) mm_once(&a, i);
        TRY(cuda_stream_sync(stream));
        cuda_free(w), cuda_free(a.x), cuda_free(a.y);
    }
    return 0;
}

/* ---- read patterns ------------------------------------------------------------------ */

struct read_arg {
    const uint16_t *w;
    int rows, pattern, blocks;
    unsigned *sink;
};

static void read_once(void *arg, int i)
{
    (void)i;
    struct read_arg *r = arg;
    TRY(cuda_read_bench(r->pattern, r->w, r->rows, r->blocks, r->sink, stream));
}

static int bench_read_patterns(double bw)
{
    static const char *names[] = {"16-byte loads, contiguous part per block", "16-byte loads, 16-row tiles by chunk",
                                  "tensor-map boxes [16][256], 16-row tiles", "bulk copies of 16 KiB, contiguous"};
    const int width = cuda_read_bench_width(), sms = cuda_sm_count();
    const size_t bytes = (size_t)1 << 30;
    struct read_arg a = {NULL, (int)(bytes / 2 / (size_t)width), 0, 0, NULL};
    TRY(cuda_malloc((void **)&a.w, bytes));
    TRY(cuda_malloc((void **)&a.sink, sizeof(unsigned) * 4 * (size_t)(sms > 0 ? sms : 1)));
    fill_random_bf16((void *)a.w, bytes / 2);
    printf("%-44s %7s %10s %8s %8s\n", "read pattern (1 GiB of bf16 rows of 8 KiB)", "blocks", "us", "GB/s", "vs copy");
    for (a.pattern = 0; a.pattern < 4; a.pattern++)
        for (int per_sm = 1; per_sm <= (a.pattern < 2 ? 2 : 1); per_sm++) {
            a.blocks = per_sm * sms;
            double t = time_median(read_once, &a, 1);
            printf("%-44s %7d %10.1f %8.0f %6.0f%%\n", names[a.pattern], a.blocks, t * 1e6, bytes / t * 1e-9,
                   100.0 * bytes / t / bw);
        }
    cuda_free((void *)a.w);
    cuda_free(a.sink);
    return 0;
}

int main(int argc, char **argv)
{
    int profile_shape = -2, profile_rows = 0, attention_only = 0, no_attention = 0, read_patterns = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d,%d", &row_counts[0], &row_counts[1]) != 2 || row_counts[0] < 1 ||
                row_counts[1] < 1 || row_counts[0] > BENCH_MAX_ROWS || row_counts[1] > BENCH_MAX_ROWS) {
                fprintf(stderr, "--rows: expected two row counts 1..%d as A,B, got '%s'\n", BENCH_MAX_ROWS, argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--attention-only")) {
            attention_only = 1;
        } else if (!strcmp(argv[i], "--no-attention")) {
            no_attention = 1;
        } else if (!strcmp(argv[i], "--read-patterns")) {
            read_patterns = 1;
        } else if (!strcmp(argv[i], "--profile") && i + 2 < argc) {
            profile_shape = atoi(argv[++i]);
            profile_rows = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--reps N] [--rows A,B] [--attention-only | --no-attention | --read-patterns] [--profile SHAPE|-1 "
                    "ROWS]\n", argv[0]);
            return 2;
        }
    }
    if (profile_shape >= N_SHAPES || profile_shape < -2 || (profile_shape > -2 && (profile_rows < 1 || profile_rows > BENCH_MAX_ROWS))) {
        fprintf(stderr, "--profile: shape 0..%d or -1 (attention), rows 1..%d\n", N_SHAPES - 1, BENCH_MAX_ROWS);
        return 2;
    }
    if (reps < 1) reps = 1;
    if (cuda_device_count_safe() < 1) {
        printf("no CUDA device\n");
        return 77;
    }
    TRY(cuda_stream_create(&stream));
    if (profile_shape > -2) return profile_once(profile_shape, profile_rows);
    char desc[256];
    TRY(cuda_device_describe(desc, sizeof desc));
    printf("device: %s; median of %d samples\n", desc, reps);

    const double bw = copy_bandwidth();
    printf("device-to-device copy: %.1f GB/s (read + write, 1 GiB, median)\n\n", bw * 1e-9);

    if (attention_only) {
        bench_attention(bw);
        return 0;
    }
    if (read_patterns) return bench_read_patterns(bw);
    printf("%-28s %13s %4s %10s %10s %8s %7s %9s\n", "kernel", "out x in", "rows", "launch us", "graph us",
           "GB/s", "vs copy", "per frame");
    double frame_s[2] = {0, 0}, frame_fused_s[2] = {0, 0}, frame_bytes = 0;
    double frame_f32_s[2] = {0, 0}, frame_mma_s[2] = {0, 0}, frame_best_s[2] = {0, 0}, frame_launch_s[2] = {0, 0};
    double t_of[N_SHAPES][2];
    const size_t rotate_bytes = (size_t)512 << 20;
    for (int s = 0; s < N_SHAPES; s++) {
        const struct shape *sh = &shapes[s];
        const size_t wn = (size_t)sh->out * sh->in;
        int copies = (int)((rotate_bytes + 2 * wn - 1) / (2 * wn));
        if (copies < 2) copies = 2;
        uint16_t **w = malloc(sizeof(*w) * copies);
        TRY(cuda_malloc((void **)&w[0], 2 * wn));
        fill_random_bf16(w[0], wn);
        for (int c = 1; c < copies; c++) {
            TRY(cuda_malloc((void **)&w[c], 2 * wn));
            TRY(cuda_memcpy_d2d(w[c], w[0], 2 * wn, stream));
        }
        struct mm_arg a = {.w = w, .copies = copies, .in = sh->in, .out = sh->out};
        TRY(cuda_malloc((void **)&a.x, sizeof(float) * BENCH_MAX_ROWS * sh->in));
        TRY(cuda_malloc((void **)&a.y, sizeof(float) * BENCH_MAX_ROWS * sh->out));
        fill_random_f32(a.x, (size_t)BENCH_MAX_ROWS * sh->in);
        for (int r = 0; r < 2; r++) {
            a.n = row_counts[r];
            double tl = time_median(mm_once, &a, copies);
            double t = time_median_mode(mm_once, &a, copies, 1);
            double bytes = 2.0 * wn + 4.0 * a.n * (sh->in + sh->out);
            t_of[s][r] = t;
            char dims[32];
            snprintf(dims, sizeof dims, "%dx%d", sh->out, sh->in);
            printf("%-28s %13s %4d %10.1f %10.1f %8.0f %6.0f%% %8s%d\n", sh->name, dims, a.n, tl * 1e6, t * 1e6,
                   bytes / t * 1e-9, 100.0 * bytes / t / bw, sh->fused ? "(fused) " : "x", sh->per_frame);
            if (!sh->fused) {
                frame_s[r] += sh->per_frame * t;
                frame_launch_s[r] += sh->per_frame * tl;
            }
            /* Both kernels, whichever the default picked. */
            const double tf = time_variant(&a, copies, a.n <= 4 ? 4 : 8);
            const double tm2 = time_variant(&a, copies, -2);
            double tm = time_variant(&a, copies, -4);
            printf("    %-24s %4d %21.1f %8.0f %6.0f%% | tensor-core MT=2 %6.1f us %4.0f%%, MT=4 %6.1f us %4.0f%%\n",
                   "float32 kernel (graph)", a.n, tf * 1e6, bytes / tf * 1e-9, 100.0 * bytes / tf / bw, tm2 * 1e6,
                   100.0 * bytes / tm2 / bw, tm * 1e6, 100.0 * bytes / tm / bw);
            if (tm2 < tm) tm = tm2;
            if (!sh->fused) {
                frame_f32_s[r] += sh->per_frame * tf;
                frame_mma_s[r] += sh->per_frame * tm;
                frame_best_s[r] += sh->per_frame * (tf < tm ? tf : tm);
            }
        }
        if (s == 0 || s == 1 || s == 3 || s == 4 || s == 7) {
            /* Outputs-per-warp sweep: which default suits which row count. */
            for (int r = 0; r < 2; r++) {
                a.n = row_counts[r];
                if (a.n > CUDA_OPS_GEMV_MAX_ROWS) continue;
                printf("    opw sweep, %2d rows:", a.n);
                for (a.opw = 2; a.opw <= 8; a.opw *= 2) {
                    double t = time_median(mm_once, &a, copies);
                    printf("  opw %d %7.1f us %5.0f GB/s", a.opw, t * 1e6, 2.0 * wn / t * 1e-9);
                }
                printf("\n");
            }
            a.opw = 0;
        }
        if (!sh->fused) frame_bytes += 2.0 * wn * sh->per_frame;
        for (int c = 0; c < copies; c++) cuda_free(w[c]);
        free(w);
        cuda_free(a.x);
        cuda_free(a.y);
    }
    /* The fused frame replaces LM q+k+v by fused qkv, gate+up by fused gate_up. */
    for (int r = 0; r < 2; r++)
        frame_fused_s[r] = frame_s[r] - 36 * (t_of[0][r] + 2 * t_of[1][r]) + 36 * t_of[10][r] -
                           72 * t_of[3][r] + 36 * t_of[11][r] - 56 * t_of[7][r] + 28 * t_of[12][r];

    /* Back-to-back launches, no graph: launch gaps are included. */
    printf("\nMore rows: 32 (the tensor-core GEMV's largest slice) and 64 (cuBLASLt, x rounded to bf16 first):\n");
    {
        const struct shape *sh = &shapes[3];
        const size_t wn = (size_t)sh->out * sh->in;
        int copies = (int)((rotate_bytes + 2 * wn - 1) / (2 * wn));
        uint16_t **w = malloc(sizeof(*w) * copies);
        TRY(cuda_malloc((void **)&w[0], 2 * wn));
        fill_random_bf16(w[0], wn);
        for (int c = 1; c < copies; c++) {
            TRY(cuda_malloc((void **)&w[c], 2 * wn));
            TRY(cuda_memcpy_d2d(w[c], w[0], 2 * wn, stream));
        }
        struct mm_arg a = {.w = w, .copies = copies, .n = 32, .in = sh->in, .out = sh->out};
        TRY(cuda_malloc((void **)&a.x, sizeof(float) * 64 * sh->in));
        TRY(cuda_malloc((void **)&a.y, sizeof(float) * 64 * sh->out));
        fill_random_f32(a.x, (size_t)64 * sh->in);
        for (int n = 32; n <= 64; n *= 2) {
            a.n = n;
            double t = time_median(mm_once, &a, copies);
            double bytes = 2.0 * wn + 4.0 * n * (sh->in + sh->out);
            char dims[32];
            snprintf(dims, sizeof dims, "%dx%d", sh->out, sh->in);
            printf("%-28s %13s %4d %10.1f %8.0f %6.0f%%\n", sh->name, dims, n, t * 1e6, bytes / t * 1e-9,
                   100.0 * bytes / t / bw);
        }
        for (int c = 0; c < copies; c++) cuda_free(w[c]);
        free(w);
        cuda_free(a.x);
        cuda_free(a.y);
    }

    if (!no_attention) bench_attention(bw);

    printf("\nFrame (weights only: %.2f GB of bf16 matmul weights, KV and small ops excluded):\n",
           frame_bytes * 1e-9);
    printf("  floor = bytes / copy bandwidth      %8.2f ms\n", frame_bytes / bw * 1e3);
    printf("  (kernel times from graph replays; back-to-back launches instead: %.2f ms at 2 rows, %.2f ms at 16)\n",
           frame_launch_s[0] * 1e3, frame_launch_s[1] * 1e3);
    for (int r = 0; r < 2; r++)
        printf("  %2d rows: sum of kernels %8.2f ms (%.0f%% of floor speed), fused qkv/gate_up %8.2f ms (%.0f%%)\n",
               row_counts[r], frame_s[r] * 1e3, 100.0 * frame_bytes / bw / frame_s[r], frame_fused_s[r] * 1e3,
               100.0 * frame_bytes / bw / frame_fused_s[r]);
    for (int r = 0; r < 2; r++)
        printf("  %2d rows: float32 kernel only %8.2f ms, tensor-core kernel only (better MT) %8.2f ms, best per shape "
               "%8.2f ms\n",
               row_counts[r], frame_f32_s[r] * 1e3, frame_mma_s[r] * 1e3, frame_best_s[r] * 1e3);
    return 0;
}

#else

int main(void)
{
    printf("no CUDA\n");
    return 77;
}

#endif
