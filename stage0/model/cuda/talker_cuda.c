#include "stage0/model/cuda/talker_cuda.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda/ops_cuda.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/sampler.h"
#include "stage0/model/cuda/cuda_upload.h"
#include "stage0/model/cuda/gemv_rows.h"
#include "stage0/model/cuda/host_pinned.h"
#include "stage0/model/cuda/talker_kernels.h"
#include "stage0/model/talker_lora.h"

/* wqkv: the rows of Wq, Wk, Wv one after the other ([q width + 2 kv width, hidden]),
 * wgu: the rows of Wg and Wu interleaved ([2 ffn, hidden], gate j at row 2j): one
 * product each instead of three and two, the same dot products (each output row is
 * one weight row), packed at upload; the gate/up product also applies silu * up as
 * it stores (cuda_ops_matmul_bf16_swiglu). */
struct talker_cuda_layer {
    const uint16_t *wqkv, *wo, *wgu, *wd;
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
};

/* Activations of up to `cap` tokens, grown on demand. qkv: fused rows [q | k | v];
 * a and o also hold hidden-wide rows (norm outputs, the FFN input and output), hence
 * max(q width, hidden); gu: fused gate|up rows, g: silu(gate) * up. */
struct talker_cuda_scratch {
    int cap;
    float *h, *a, *o, *qkv, *gu, *g, *logits;
    int *row, *pos, *kv_len;
    /* Split-K attention partials for up to cap rows over max_ctx positions (graph
     * scratch only; NULL: stream-ordered memory per call). */
    void *att_ws;
    size_t att_ws_bytes;
    /* With adapters (talker_cuda_set_lora): each token's adapter slot and the LoRA
     * middle [cap][CUDA_LORA_TARGETS][rank_max]. */
    int *adapter;
    float *lora_t;
};

/* One captured decode forward of `size` tokens, in two variants: [0] without adapter
 * rows (the fused products), [1] with some (talker_cuda_set_lora). */
struct talker_cuda_graph {
    int size;
    struct {
        int runs;   /* eager warm-up runs so far */
        void *exec; /* NULL until captured */
    } v[2];
};

/* The linear groups of a layer that share an input, each one LoRA call pair. */
enum { LORA_QKV, LORA_O, LORA_GATE_UP, LORA_DOWN, LORA_GROUPS };

struct talker_cuda {
    struct talker_config cfg;
    int max_rows, max_ctx;
    /* Positions allocated per row: max_ctx + 1. Position max_ctx is never a real
     * token's; the padding tokens of a graph batch store their K/V there. */
    int ctx_alloc;
    struct cuda_alloc_list mem;
    struct talker_cuda_layer *layers;
    const float *norm, *inv_freq;
    const uint16_t *head;
    /* KV cache elements: float or bf16 bits (kv_dtype), kv_elem bytes each. */
    enum cuda_kv_dtype kv_dtype;
    size_t kv_elem;
    void *kc, *vc;
    struct talker_cuda_scratch s;
    /* CUDA graphs of decode batches (talker_cuda_graphs_enable): their own stream and
     * fixed buffers (s above may be regrown by a long prefill; these never are). */
    void *stream;
    struct talker_cuda_scratch gs;
    float *g_emb; /* host staging [max size][hidden], pinned */
    int *g_ints;  /* host staging [4][max size]: row, pos, kv_len, adapter slot, pinned */
    struct talker_cuda_graph *graphs;
    int n_graphs, warmups, n_captured;
    long n_replays;
    struct cuda_graph_timer timer; /* the replays' GPU time (MM3_GRAPH_TIMING=1) */
    /* Adapters served per request: each slot's factors in one allocation, the calls'
     * descriptions [n_layers][LORA_GROUPS] (n_targets 0: no adapter adapts that group),
     * every row's slot (-1: none). */
    void *lora_mem[CUDA_LORA_ADAPTERS];
    struct cuda_lora *lora;
    int lora_n, lora_rank_max;
    int *row_lora;
};

/* Prefill batches of more than 32 tokens (16 at widths not a multiple of 32) take
 * cuBLASLt's bf16 GEMM, which reads the weights once for the whole batch instead of
 * once every slice (x rounded to bf16 there, within the rel 2e-2 on
 * frame_hiddens); decode stays exact (GEMV slices, gemv_rows.h). */
static int matmul(float *y, const float *x, const uint16_t *w, int n, int in, int out, int prefill, void *stream)
{
    if (prefill) return cuda_ops_matmul_bf16(y, x, w, n, in, out, stream);
    return gemv_rows(y, x, w, n, in, out, stream);
}

/* y = silu(x . Wg^T) * (x . Wu^T) over interleaved wgu, choosing kernels as matmul
 * does; gu is the [n, 2 ffn] scratch of the unfused (cuBLASLt) path. */
static int matmul_swiglu(float *y, float *gu, const float *x, const uint16_t *wgu, int n, int in, int ffn, int prefill,
                         void *stream)
{
    if (prefill) return cuda_ops_matmul_bf16_swiglu(y, gu, x, wgu, n, in, ffn, stream);
    return gemv_rows_swiglu(y, gu, x, wgu, n, in, ffn, stream);
}

static void scratch_free(struct talker_cuda_scratch *s)
{
    float *f[] = {s->h, s->a, s->o, s->qkv, s->gu, s->g, s->logits};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        cuda_free(f[i]);
    cuda_free(s->row), cuda_free(s->pos), cuda_free(s->kv_len);
    cuda_free(s->att_ws);
    cuda_free(s->adapter), cuda_free(s->lora_t);
    memset(s, 0, sizeof *s);
}

/* The adapter buffers of s for its capacity and the adapters' largest rank (none
 * without adapters). */
static int scratch_lora_reserve(const struct talker_cuda *tc, struct talker_cuda_scratch *s)
{
    cuda_free(s->adapter), cuda_free(s->lora_t);
    s->adapter = NULL, s->lora_t = NULL;
    if (!tc->lora_rank_max || !s->cap) return 0;
    int rc = cuda_malloc((void **)&s->adapter, sizeof(int) * s->cap);
    if (rc == 0) rc = cuda_malloc((void **)&s->lora_t, sizeof(float) * s->cap * CUDA_LORA_TARGETS * tc->lora_rank_max);
    return rc;
}

static int scratch_reserve(struct talker_cuda *tc, struct talker_cuda_scratch *s, int n)
{
    if (n <= s->cap) return 0;
    scratch_free(s);
    int cap = n < 32 ? 32 : n;
    size_t H = (size_t)tc->cfg.hidden, F = (size_t)tc->cfg.ffn;
    size_t QD = (size_t)tc->cfg.n_heads * tc->cfg.head_dim, KD = (size_t)tc->cfg.n_kv_heads * tc->cfg.head_dim;
    size_t big = QD > H ? QD : H;
    int rc;
    if ((rc = cuda_malloc((void **)&s->h, sizeof(float) * cap * H)) < 0 ||
        (rc = cuda_malloc((void **)&s->a, sizeof(float) * cap * big)) < 0 ||
        (rc = cuda_malloc((void **)&s->o, sizeof(float) * cap * big)) < 0 ||
        (rc = cuda_malloc((void **)&s->qkv, sizeof(float) * cap * (QD + 2 * KD))) < 0 ||
        (rc = cuda_malloc((void **)&s->gu, sizeof(float) * cap * 2 * F)) < 0 ||
        (rc = cuda_malloc((void **)&s->g, sizeof(float) * cap * F)) < 0 ||
        (rc = cuda_malloc((void **)&s->logits, sizeof(float) * cap * SAMPLER_C0_COLS)) < 0 ||
        (rc = cuda_malloc((void **)&s->row, sizeof(int) * cap)) < 0 ||
        (rc = cuda_malloc((void **)&s->pos, sizeof(int) * cap)) < 0 ||
        (rc = cuda_malloc((void **)&s->kv_len, sizeof(int) * cap)) < 0) {
        scratch_free(s);
        return rc;
    }
    s->cap = cap;
    return scratch_lora_reserve(tc, s);
}

int talker_cuda_create(struct talker_cuda **out, const struct talker *m, int max_rows, int max_ctx,
                       enum cuda_kv_dtype kv_dtype)
{
    *out = NULL;
    const struct talker_config *cfg = &m->cfg;
    if (max_rows < 1 || max_ctx < 1)
        return mm3_errorf(-EINVAL, "talker_cuda_create: %d rows x %d positions: expected both >= 1", max_rows, max_ctx);
    if (cfg->head_dim > TALKER_CUDA_MAX_HEAD_DIM)
        return mm3_errorf(-EINVAL, "talker_cuda_create: head_dim %d: at most %d supported", cfg->head_dim,
                          TALKER_CUDA_MAX_HEAD_DIM);
    if (kv_dtype != CUDA_KV_F32 && kv_dtype != CUDA_KV_BF16)
        return mm3_errorf(-EINVAL, "talker_cuda_create: kv dtype %d: expected CUDA_KV_F32 or CUDA_KV_BF16",
                          (int)kv_dtype);
    if (cuda_device_count_safe() < 1) return mm3_errorf(-ENODEV, "talker_cuda_create: no CUDA device");
    struct talker_cuda *tc = calloc(1, sizeof *tc);
    if (!tc) return mm3_errorf(-ENOMEM, "talker_cuda_create: out of memory");
    tc->cfg = *cfg;
    tc->max_rows = max_rows;
    tc->max_ctx = max_ctx;
    tc->ctx_alloc = max_ctx + 1;
    tc->kv_dtype = kv_dtype;
    tc->kv_elem = kv_dtype == CUDA_KV_BF16 ? sizeof(uint16_t) : sizeof(float);
    tc->layers = calloc((size_t)cfg->n_layers, sizeof *tc->layers);
    tc->row_lora = malloc(sizeof(int) * (size_t)max_rows);
    int rc = tc->layers && tc->row_lora ? 0 : mm3_errorf(-ENOMEM, "talker_cuda_create: out of memory");
    for (int r = 0; tc->row_lora && r < max_rows; r++)
        tc->row_lora[r] = -1;
    size_t H = (size_t)cfg->hidden, F = (size_t)cfg->ffn, D = (size_t)cfg->head_dim;
    size_t QD = (size_t)cfg->n_heads * D, KD = (size_t)cfg->n_kv_heads * D;
    struct cuda_alloc_list *l = &tc->mem;
    struct cuda_upload u;
    cuda_upload_begin(&u, l, &m->deferred);
    for (int i = 0; i < cfg->n_layers && rc == 0; i++) {
        const struct talker_layer *L = &m->layers[i];
        struct talker_cuda_layer *G = &tc->layers[i];
        float *f;
        uint16_t *w;
        if ((rc = cuda_upload_f32(l, &f, L->attn_norm, H)) < 0) break;
        G->attn_norm = f;
        if ((rc = cuda_upload_f32(l, &f, L->q_norm, D)) < 0) break;
        G->q_norm = f;
        if ((rc = cuda_upload_f32(l, &f, L->k_norm, D)) < 0) break;
        G->k_norm = f;
        if ((rc = cuda_upload_f32(l, &f, L->ffn_norm, H)) < 0) break;
        G->ffn_norm = f;
        float *const *qkv[3] = {&L->wq, &L->wk, &L->wv};
        const size_t qkv_rows[3] = {QD, KD, KD};
        if ((rc = cuda_upload_stacked(&u, &w, qkv, qkv_rows, 3, H)) < 0) break;
        G->wqkv = w;
        if ((rc = cuda_upload_matrix(&u, &w, &L->wo, H, QD)) < 0) break;
        G->wo = w;
        if ((rc = cuda_upload_interleaved(&u, &w, &L->wg, &L->wu, F, H)) < 0) break;
        G->wgu = w;
        if ((rc = cuda_upload_matrix(&u, &w, &L->wd, H, F)) < 0) break;
        G->wd = w;
    }
    float *f;
    uint16_t *w;
    if (rc == 0 && (rc = cuda_upload_f32(l, &f, m->norm, H)) == 0) tc->norm = f;
    if (rc == 0 && (rc = cuda_upload_f32(l, &f, m->inv_freq, D / 2)) == 0) tc->inv_freq = f;
    if (rc == 0 && (rc = cuda_upload_matrix(&u, &w, &m->head, SAMPLER_C0_COLS, H)) == 0) tc->head = w;
    rc = cuda_upload_end(&u, rc);
    size_t cache = (size_t)cfg->n_layers * max_rows * tc->ctx_alloc * KD * tc->kv_elem;
    void *p;
    if (rc == 0 && (rc = cuda_alloc_list_add(l, &p, cache)) == 0) tc->kc = p;
    if (rc == 0 && (rc = cuda_alloc_list_add(l, &p, cache)) == 0) tc->vc = p;
    /* Unwritten cache positions are never read; zeroing keeps a stray read finite. */
    if (rc == 0) rc = cuda_memset(tc->kc, 0, cache);
    if (rc == 0) rc = cuda_memset(tc->vc, 0, cache);
    if (rc == 0) rc = scratch_reserve(tc, &tc->s, 32);
    if (rc < 0) {
        talker_cuda_destroy(tc);
        return rc;
    }
    *out = tc;
    return 0;
}

static void lora_free(struct talker_cuda *tc)
{
    for (int k = 0; k < CUDA_LORA_ADAPTERS; k++) {
        cuda_free(tc->lora_mem[k]);
        tc->lora_mem[k] = NULL;
    }
    free(tc->lora);
    tc->lora = NULL;
    tc->lora_n = tc->lora_rank_max = 0;
}

void talker_cuda_destroy(struct talker_cuda *tc)
{
    if (!tc) return;
    for (int i = 0; i < tc->n_graphs; i++)
        cuda_graph_destroy(tc->graphs[i].v[0].exec), cuda_graph_destroy(tc->graphs[i].v[1].exec);
    free(tc->graphs);
    lora_free(tc);
    free(tc->row_lora);
    cuda_graph_timer_free(&tc->timer);
    host_pinned_free(tc->g_emb);
    host_pinned_free(tc->g_ints);
    scratch_free(&tc->gs);
    if (tc->stream) cuda_stream_destroy(tc->stream);
    scratch_free(&tc->s);
    cuda_alloc_list_free(&tc->mem);
    free(tc->layers);
    free(tc);
}

/* Whether a batch is one token per row (decode): those take the split-K decode
 * kernel (any rows, through a row map) when the head fits it, and CUDA graphs. */
static int distinct_rows(int n, const int *row)
{
    for (int i = 1; i < n; i++)
        for (int j = 0; j < i; j++)
            if (row[i] == row[j]) return 0;
    return 1;
}

/* The heads cuda_ops_attention_decode takes: head_dim 32, 64, 128 or 256 and at most
 * 8 query heads per kv head. */
static int split_k_fits(const struct talker_config *c)
{
    int d = c->head_dim;
    return (d == 32 || d == 64 || d == 128 || d == 256) && c->n_heads / c->n_kv_heads <= 8;
}

/* Prefill tokens per split-K attention call: bounds its stream-ordered partials
 * (tokens x query heads x (head_dim + 2) floats: 68 MB at 4096 x 32 x 128). */
enum { PREFILL_ATTENTION_TOKENS = 4096 };

/* Layer li's attention on the QKV rows in s->qkv into s->o. Split-K decode: q and k
 * norm + RoPE and the K/V store inside the split kernel over rows s->row with kv
 * lengths up to max_len, then its combine (cuda_ops_attention_decode_qkv: one launch
 * fewer per layer than storing first). Otherwise q and k norm + RoPE in place with the
 * K/V store (one launch: the same results as cuda_ops_qk_norm_rope twice and
 * talker_cuda_kv_store_pair), then the split-K kernel and its combine, or the row
 * attention (heads the decode kernel does not take). A prefill stores every token's K/V
 * before any token attends (its tokens read each other's), so it never takes the fused
 * variant; the split-K kernel then treats each token as a sequence of kv_len = pos + 1,
 * which shares each K/V read among the query heads of a kv head and runs on the tensor
 * cores with the bf16 cache (several times the row attention's prefill rate:
 * docs/performance.md). */
static int attention_queue(struct talker_cuda *tc, struct talker_cuda_scratch *s, int li, int n, int split_k,
                           int prefill, int max_len, void *st)
{
    const struct talker_config *cfg = &tc->cfg;
    int D = cfg->head_dim, QD = cfg->n_heads * D, KD = cfg->n_kv_heads * D, QKV = QD + 2 * KD;
    size_t row_stride = (size_t)tc->ctx_alloc * KD, layer_stride = (size_t)tc->max_rows * row_stride;
    /* cache rows row_stride apart, positions KD apart */
    const struct cuda_kv_cache kv = {(char *)tc->kc + li * layer_stride * tc->kv_elem,
                                     (char *)tc->vc + li * layer_stride * tc->kv_elem, tc->kv_dtype, row_stride,
                                     (size_t)KD};
    const struct attention_heads heads = {cfg->n_heads, cfg->n_kv_heads, D, 1.0f / sqrtf((float)D)};
    const struct talker_cuda_layer *L = &tc->layers[li];
    const struct cuda_qkv_prep prep = {L->q_norm, L->k_norm, cfg->eps, D, tc->inv_freq, s->pos};
    if (split_k && !prefill) {
        const struct cuda_attention_decode a = {.out = s->o,
                                                .q = s->qkv,
                                                .q_stride = (size_t)QKV,
                                                .kv = kv,
                                                .kv_len = s->kv_len,
                                                .seq_row = s->row,
                                                .n_seq = n,
                                                .max_kv_len = max_len,
                                                .heads = heads,
                                                .workspace = s->att_ws,
                                                .workspace_bytes = s->att_ws_bytes};
        return cuda_ops_attention_decode_qkv(&a, &prep, st);
    }
    int rc = talker_cuda_qkv_norm_rope_store(s->qkv, n, &heads, &prep, &kv, s->row, st);
    if (rc < 0) return rc;
    if (split_k && prefill) {
        for (int t = 0; t < n && rc == 0; t += PREFILL_ATTENTION_TOKENS) {
            const struct cuda_attention_decode a = {
                .out = s->o + (size_t)t * QD,
                .q = s->qkv + (size_t)t * QKV,
                .q_stride = (size_t)QKV,
                .kv = kv,
                .kv_len = s->kv_len + t,
                .seq_row = s->row + t,
                .n_seq = n - t < PREFILL_ATTENTION_TOKENS ? n - t : PREFILL_ATTENTION_TOKENS,
                .max_kv_len = max_len,
                .heads = heads};
            rc = cuda_ops_attention_decode(&a, st);
        }
        return rc;
    }
    const struct talker_kv_slots slots = {s->row, s->pos, n};
    return talker_cuda_attention_rows_kv(s->o, s->qkv, (size_t)QKV, &kv, &slots, &heads, st);
}

/* The decode layers with the norms, SwiGLU and residual adds inside the products
 * (6 launches per layer with split-K: 7 before the fused attention, 10 before the
 * fused products): QKV product of the normed h, attention_queue, h += o . Wo^T,
 * silu * up of the normed h, h += g . Wd^T; the final norm into s->a. */
static int forward_fused_queue(struct talker_cuda *tc, struct talker_cuda_scratch *s, int n, int split_k, int max_len,
                               void *stream)
{
    const struct talker_config *cfg = &tc->cfg;
    int H = cfg->hidden, F = cfg->ffn, QD = cfg->n_heads * cfg->head_dim;
    int QKV = QD + 2 * cfg->n_kv_heads * cfg->head_dim;
    void *st = stream;
    int rc = 0;
    for (int li = 0; li < cfg->n_layers && rc == 0; li++) {
        const struct talker_cuda_layer *L = &tc->layers[li];
        const struct cuda_gemv_fused qkv = {.y = s->qkv,
                                            .x = s->h,
                                            .w = L->wqkv,
                                            .n_rows = n,
                                            .in = H,
                                            .out = QKV,
                                            .norm_w = L->attn_norm,
                                            .eps = cfg->eps};
        const struct cuda_gemv_fused wo = {
            .y = s->h, .x = s->o, .w = L->wo, .n_rows = n, .in = QD, .out = H, .epi = CUDA_GEMV_ADD};
        const struct cuda_gemv_fused gate_up = {.y = s->g,
                                                .x = s->h,
                                                .w = L->wgu,
                                                .n_rows = n,
                                                .in = H,
                                                .out = 2 * F,
                                                .epi = CUDA_GEMV_SWIGLU,
                                                .norm_w = L->ffn_norm,
                                                .eps = cfg->eps};
        const struct cuda_gemv_fused down = {
            .y = s->h, .x = s->g, .w = L->wd, .n_rows = n, .in = F, .out = H, .epi = CUDA_GEMV_ADD};
        if ((rc = gemv_rows_fused(&qkv, st)) < 0 || (rc = attention_queue(tc, s, li, n, split_k, 0, max_len, st)) < 0 ||
            (rc = gemv_rows_fused(&wo, st)) < 0 || (rc = gemv_rows_fused(&gate_up, st)) < 0)
            break;
        rc = gemv_rows_fused(&down, st);
    }
    if (rc == 0) rc = cuda_ops_rmsnorm(s->a, s->h, tc->norm, n, H, cfg->eps, st);
    return rc;
}

/* y += each token's adapter delta of group g of layer li (x the group's input rows),
 * the tokens' slots in s->adapter. */
static int lora_queue(const struct talker_cuda *tc, const struct talker_cuda_scratch *s, int li, int g, int n,
                      const float *x, float *y, void *st)
{
    struct cuda_lora l = tc->lora[li * LORA_GROUPS + g];
    if (!l.n_targets) return 0;
    l.n_rows = n;
    l.adapter = s->adapter;
    l.x = x;
    l.t = s->lora_t;
    l.y = y;
    int rc = cuda_ops_lora_down(&l, st);
    return rc < 0 ? rc : cuda_ops_lora_up(&l, st);
}

/* Every kernel of a forward of n tokens whose inputs are in s (h, row, pos, kv_len on
 * the device; with `lora`, the tokens' adapter slots in s->adapter), queued on
 * `stream`; the post-norm hiddens end in s->a. Decode batches whose products all fuse
 * and that carry no adapter take forward_fused_queue; the rest (prefill, odd widths,
 * adapters) this chain, prefill's products through the bf16 GEMM (see matmul). Per
 * layer (9 launches, 10 with split-K's combine; 16 before the fusions): norm (fused
 * with the previous residual add), QKV product, attention_queue's two, Wo, residual
 * add + norm, gate|up product with silu * up, Wd. With adapters each product's delta
 * follows it (a pair of launches per group the layer adapts), q/k/v's before the q/k
 * norms, gate/up's before silu * up (the product then stores gate|up and the silu
 * kernel follows). */
static int forward_queue(struct talker_cuda *tc, struct talker_cuda_scratch *s, int n, int split_k, int max_len,
                         int prefill, int lora, void *stream)
{
    const struct talker_config *cfg = &tc->cfg;
    int H = cfg->hidden, F = cfg->ffn, QD = cfg->n_heads * cfg->head_dim;
    int QKV = QD + 2 * cfg->n_kv_heads * cfg->head_dim;
    if (!prefill && !lora && gemv_rows_fused_ok(n, H, QKV, CUDA_GEMV_STORE, 1) &&
        gemv_rows_fused_ok(n, QD, H, CUDA_GEMV_ADD, 0) && gemv_rows_fused_ok(n, H, 2 * F, CUDA_GEMV_SWIGLU, 1) &&
        gemv_rows_fused_ok(n, F, H, CUDA_GEMV_ADD, 0))
        return forward_fused_queue(tc, s, n, split_k, max_len, stream);
    void *st = stream;
    int rc = 0;
    for (int li = 0; li < cfg->n_layers && rc == 0; li++) {
        const struct talker_cuda_layer *L = &tc->layers[li];
        /* The residual add of the previous layer is fused into this norm. */
        if (li == 0)
            rc = cuda_ops_rmsnorm(s->a, s->h, L->attn_norm, n, H, cfg->eps, st);
        else
            rc = cuda_ops_add_rmsnorm(s->h, s->a, s->o, L->attn_norm, n, H, cfg->eps, st);
        if (rc < 0 || (rc = matmul(s->qkv, s->a, L->wqkv, n, H, QKV, prefill, st)) < 0 ||
            (lora && (rc = lora_queue(tc, s, li, LORA_QKV, n, s->a, s->qkv, st)) < 0) ||
            (rc = attention_queue(tc, s, li, n, split_k, prefill, max_len, st)) < 0)
            break;
        /* a = o . Wo^T; then h += a and o = rmsnorm(h) in one kernel (o is free once
         * Wo has read it); the FFN output lands in o again for the next layer's add. */
        if ((rc = matmul(s->a, s->o, L->wo, n, QD, H, prefill, st)) < 0 ||
            (lora && (rc = lora_queue(tc, s, li, LORA_O, n, s->o, s->a, st)) < 0) ||
            (rc = cuda_ops_add_rmsnorm(s->h, s->o, s->a, L->ffn_norm, n, H, cfg->eps, st)) < 0)
            break;
        if (lora) {
            if ((rc = matmul(s->gu, s->o, L->wgu, n, H, 2 * F, prefill, st)) < 0 ||
                (rc = lora_queue(tc, s, li, LORA_GATE_UP, n, s->o, s->gu, st)) < 0 ||
                (rc = cuda_ops_silu_mul_interleaved(s->g, s->gu, n, F, st)) < 0)
                break;
        } else if ((rc = matmul_swiglu(s->g, s->gu, s->o, L->wgu, n, H, F, prefill, st)) < 0) {
            break;
        }
        if ((rc = matmul(s->o, s->g, L->wd, n, F, H, prefill, st)) < 0 ||
            (lora && (rc = lora_queue(tc, s, li, LORA_DOWN, n, s->g, s->o, st)) < 0))
            break;
    }
    if (rc == 0) rc = cuda_ops_add_rmsnorm(s->h, s->a, s->o, tc->norm, n, H, cfg->eps, st);
    return rc;
}

/* Each token's adapter slot into ad[n] (-1: none); whether any token has one. */
static int tokens_lora(const struct talker_cuda *tc, int n, const int *row, int *ad)
{
    int any = 0;
    for (int i = 0; i < n; i++) {
        ad[i] = tc->lora ? tc->row_lora[row[i]] : -1;
        any |= ad[i] >= 0;
    }
    return any;
}

/* The smallest captured size that holds n tokens, or NULL. */
static struct talker_cuda_graph *graph_for(struct talker_cuda *tc, int n)
{
    for (int i = 0; i < tc->n_graphs; i++)
        if (tc->graphs[i].size >= n) return &tc->graphs[i];
    return NULL;
}

/* A decode batch padded to the graph's size: the padding tokens (zero embedding) sit
 * in row[0] at the spare position max_ctx with a kv length of 1, so they touch no
 * real token's cache. Warm-up runs are eager on the same buffers, then one capture,
 * then replays. Queued on tc->stream (uploads from pinned staging included), no sync:
 * the hiddens land in tc->gs.a. */
static int forward_graph_queue(struct talker_cuda *tc, struct talker_cuda_graph *gr, int n, const int *row,
                               const int *pos, const float *emb)
{
    struct talker_cuda_scratch *s = &tc->gs;
    int S = gr->size, H = tc->cfg.hidden, cap = tc->graphs[tc->n_graphs - 1].size;
    int split_k = split_k_fits(&tc->cfg);
    memcpy(tc->g_emb, emb, sizeof(float) * (size_t)n * H);
    memset(tc->g_emb + (size_t)n * H, 0, sizeof(float) * (size_t)(S - n) * H);
    int *r = tc->g_ints, *p = r + cap, *len = p + cap, *ad = len + cap;
    int lora = tokens_lora(tc, n, row, ad);
    for (int i = 0; i < S; i++) {
        r[i] = i < n ? row[i] : row[0];
        p[i] = i < n ? pos[i] : tc->max_ctx;
        len[i] = i < n ? pos[i] + 1 : 1;
        if (i >= n) ad[i] = -1;
    }
    int rc;
    if ((rc = talker_cuda_h2d_async(s->h, tc->g_emb, sizeof(float) * (size_t)S * H, tc->stream)) < 0 ||
        (rc = talker_cuda_h2d_async(s->row, r, sizeof(int) * S, tc->stream)) < 0 ||
        (rc = talker_cuda_h2d_async(s->pos, p, sizeof(int) * S, tc->stream)) < 0 ||
        (rc = talker_cuda_h2d_async(s->kv_len, len, sizeof(int) * S, tc->stream)) < 0 ||
        (lora && (rc = talker_cuda_h2d_async(s->adapter, ad, sizeof(int) * S, tc->stream)) < 0))
        return rc;
    if (!gr->v[lora].exec && gr->v[lora].runs >= tc->warmups) {
        if ((rc = cuda_graph_capture_begin(tc->stream)) < 0) return rc;
        rc = forward_queue(tc, s, S, split_k, tc->max_ctx, 0, lora, tc->stream);
        void *exec = NULL;
        int rc_end = cuda_graph_capture_end(tc->stream, &exec);
        if (rc < 0 || rc_end < 0) {
            cuda_graph_destroy(exec);
            return rc < 0 ? rc : rc_end;
        }
        gr->v[lora].exec = exec;
        tc->n_captured++;
    }
    if (gr->v[lora].exec) {
        rc = cuda_graph_launch_timed(&tc->timer, gr->v[lora].exec, tc->stream);
        tc->n_replays++;
    } else {
        rc = forward_queue(tc, s, S, split_k, tc->max_ctx, 0, lora, tc->stream);
        gr->v[lora].runs++;
    }
    return rc;
}

/* forward_graph_queue, then the wait and the download of the n hiddens. */
static int forward_graph(struct talker_cuda *tc, struct talker_cuda_graph *gr, int n, const int *row, const int *pos,
                         const float *emb, float *hidden_out)
{
    int rc = forward_graph_queue(tc, gr, n, row, pos, emb);
    if (rc == 0) rc = cuda_stream_sync(tc->stream);
    if (rc == 0) rc = cuda_memcpy_d2h(hidden_out, tc->gs.a, sizeof(float) * (size_t)n * tc->cfg.hidden);
    return rc;
}

/* The tokens' rows and positions inside the state; their longest kv length into
 * max_len where asked (a graph replay covers the whole context and needs none). */
static int check_tokens(const struct talker_cuda *tc, const char *what, int n, const int *row, const int *pos,
                        int *max_len)
{
    if (n < 1) return mm3_errorf(-EINVAL, "%s: %d tokens, expected >= 1", what, n);
    int longest = 0;
    for (int i = 0; i < n; i++) {
        if (row[i] < 0 || row[i] >= tc->max_rows || pos[i] < 0 || pos[i] >= tc->max_ctx)
            return mm3_errorf(-EINVAL, "%s: token %d at row %d position %d outside the state (%d rows, %d positions)",
                              what, i, row[i], pos[i], tc->max_rows, tc->max_ctx);
        if (pos[i] + 1 > longest) longest = pos[i] + 1;
    }
    if (max_len) *max_len = longest;
    return 0;
}

int talker_cuda_forward_queued(struct talker_cuda *tc, int n, const int *row, const int *pos, const float *emb,
                               const float **hidden_dev, void *done)
{
    int rc = check_tokens(tc, "talker_cuda_forward_queued", n, row, pos, NULL);
    if (rc < 0) return rc;
    struct talker_cuda_graph *gr = distinct_rows(n, row) ? graph_for(tc, n) : NULL;
    if (!gr) return 1;
    if ((rc = forward_graph_queue(tc, gr, n, row, pos, emb)) < 0 || (rc = cuda_event_record(done, tc->stream)) < 0) {
        (void)cuda_stream_sync(tc->stream); /* the staging is rewritten by the next call */
        return rc;
    }
    *hidden_dev = tc->gs.a;
    return 0;
}

int talker_cuda_forward(struct talker_cuda *tc, int n, const int *row, const int *pos, const float *emb,
                        float *hidden_out)
{
    const struct talker_config *cfg = &tc->cfg;
    int max_len = 0, rc = check_tokens(tc, "talker_cuda_forward", n, row, pos, &max_len);
    if (rc < 0) return rc;
    int decode = distinct_rows(n, row);
    struct talker_cuda_graph *gr = decode ? graph_for(tc, n) : NULL;
    if (gr) return forward_graph(tc, gr, n, row, pos, emb, hidden_out);
    rc = scratch_reserve(tc, &tc->s, n);
    if (rc < 0) return rc;
    struct talker_cuda_scratch *s = &tc->s;
    int H = cfg->hidden;
    int *kv_len = malloc(sizeof(int) * 2 * n), *ad = kv_len + n;
    if (!kv_len) return mm3_errorf(-ENOMEM, "talker_cuda_forward: out of memory");
    for (int i = 0; i < n; i++)
        kv_len[i] = pos[i] + 1;
    int lora = tokens_lora(tc, n, row, ad);
    if ((rc = cuda_memcpy_h2d(s->h, emb, sizeof(float) * n * H)) == 0 &&
        (rc = cuda_memcpy_h2d(s->row, row, sizeof(int) * n)) == 0 &&
        (rc = cuda_memcpy_h2d(s->pos, pos, sizeof(int) * n)) == 0 &&
        (rc = cuda_memcpy_h2d(s->kv_len, kv_len, sizeof(int) * n)) == 0 &&
        (!lora || (rc = cuda_memcpy_h2d(s->adapter, ad, sizeof(int) * n)) == 0) &&
        (rc = forward_queue(tc, s, n, split_k_fits(cfg), max_len, !decode, lora, NULL)) == 0 &&
        (rc = cuda_stream_sync(NULL)) == 0)
        rc = cuda_memcpy_d2h(hidden_out, s->a, sizeof(float) * n * H);
    free(kv_len);
    return rc;
}

int talker_cuda_graphs_enable(struct talker_cuda *tc, const int *sizes, int n_sizes, int warmups)
{
    if (tc->n_graphs) return mm3_errorf(-EINVAL, "talker_cuda_graphs_enable: graphs already enabled");
    if (n_sizes < 1 || warmups < 0)
        return mm3_errorf(-EINVAL, "talker_cuda_graphs_enable: %d capture sizes, %d warm-ups: expected >= 1 and >= 0",
                          n_sizes, warmups);
    for (int i = 0; i < n_sizes; i++)
        if (sizes[i] < 1 || (i > 0 && sizes[i] <= sizes[i - 1]))
            return mm3_errorf(-EINVAL, "compilation.capture_sizes[%d] = %d: expected ascending sizes >= 1", i,
                              sizes[i]);
    int cap = sizes[n_sizes - 1], H = tc->cfg.hidden;
    int rc = cuda_stream_create(&tc->stream);
    if (rc == 0) rc = scratch_reserve(tc, &tc->gs, cap);
    if (rc == 0 && split_k_fits(&tc->cfg)) {
        const struct talker_config *c = &tc->cfg;
        size_t bytes = 0;
        for (int n = 1; n <= cap; n++) {
            size_t b =
                cuda_ops_attention_decode_workspace_bytes(n, c->n_heads, c->n_kv_heads, c->head_dim, tc->max_ctx);
            if (b > bytes) bytes = b;
        }
        if ((rc = cuda_malloc(&tc->gs.att_ws, bytes)) == 0) tc->gs.att_ws_bytes = bytes;
    }
    void *emb = NULL, *ints = NULL;
    if (rc == 0 && (rc = host_pinned_alloc(&emb, sizeof(float) * (size_t)cap * H)) == 0) tc->g_emb = emb;
    if (rc == 0 && (rc = host_pinned_alloc(&ints, sizeof(int) * 4 * (size_t)cap)) == 0) tc->g_ints = ints;
    tc->graphs = calloc((size_t)n_sizes, sizeof *tc->graphs);
    if (rc == 0 && !tc->graphs) rc = mm3_errorf(-ENOMEM, "talker_cuda_graphs_enable: out of memory");
    if (rc == 0) rc = cuda_graph_timer_init(&tc->timer);
    if (rc < 0) return rc; /* the rest is freed by talker_cuda_destroy */
    for (int i = 0; i < n_sizes; i++)
        tc->graphs[i].size = sizes[i];
    tc->n_graphs = n_sizes;
    tc->warmups = warmups;
    return 0;
}

void talker_cuda_graph_stats(const struct talker_cuda *tc, int *captured, long *replays)
{
    *captured = tc->n_captured;
    *replays = tc->n_replays;
}

float talker_cuda_replay_ms(struct talker_cuda *tc)
{
    return cuda_graph_timer_ms(&tc->timer);
}

int talker_cuda_head_drawable(struct talker_cuda *tc, const float *hidden, int n_rows, float *logits)
{
    if (n_rows < 1) return mm3_errorf(-EINVAL, "talker_cuda_head_drawable: %d rows, expected >= 1", n_rows);
    int rc = scratch_reserve(tc, &tc->s, n_rows);
    if (rc < 0) return rc;
    int H = tc->cfg.hidden;
    if ((rc = cuda_memcpy_h2d(tc->s.a, hidden, sizeof(float) * n_rows * H)) < 0 ||
        (rc = gemv_rows(tc->s.logits, tc->s.a, tc->head, n_rows, H, SAMPLER_C0_COLS, NULL)) < 0 ||
        (rc = cuda_stream_sync(NULL)) < 0)
        return rc;
    return cuda_memcpy_d2h(logits, tc->s.logits, sizeof(float) * n_rows * SAMPLER_C0_COLS);
}

int talker_cuda_head_dev(struct talker_cuda *tc, const float *hidden, int n_rows, float *logits, void *stream)
{
    if (n_rows < 1) return mm3_errorf(-EINVAL, "talker_cuda_head_dev: %d rows, expected >= 1", n_rows);
    return gemv_rows(logits, hidden, tc->head, n_rows, tc->cfg.hidden, SAMPLER_C0_COLS, stream);
}

/* Where each adapted layer's delta goes: its group and its place among the group's targets. */
static const struct {
    int group, index;
} lora_place[TALKER_LORA_N_TARGETS] = {
    [TALKER_LORA_Q] = {LORA_QKV, 0},     [TALKER_LORA_K] = {LORA_QKV, 1},        [TALKER_LORA_V] = {LORA_QKV, 2},
    [TALKER_LORA_O] = {LORA_O, 0},       [TALKER_LORA_GATE] = {LORA_GATE_UP, 0}, [TALKER_LORA_UP] = {LORA_GATE_UP, 1},
    [TALKER_LORA_DOWN] = {LORA_DOWN, 0},
};

/* Every group of every layer with all its possible targets, no slot filled. */
static void lora_describe(struct talker_cuda *tc)
{
    const struct talker_config *c = &tc->cfg;
    int H = c->hidden, F = c->ffn, QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim;
    for (int li = 0; li < c->n_layers; li++) {
        struct cuda_lora *g = &tc->lora[li * LORA_GROUPS];
        g[LORA_QKV] = (struct cuda_lora){.n_targets = 3, .in = H, .y_stride = QD + 2 * KD};
        g[LORA_QKV].target[0] = (struct cuda_lora_target){.out = QD, .y_offset = 0, .y_step = 1};
        g[LORA_QKV].target[1] = (struct cuda_lora_target){.out = KD, .y_offset = QD, .y_step = 1};
        g[LORA_QKV].target[2] = (struct cuda_lora_target){.out = KD, .y_offset = QD + KD, .y_step = 1};
        g[LORA_O] = (struct cuda_lora){.n_targets = 1, .in = QD, .y_stride = H};
        g[LORA_O].target[0] = (struct cuda_lora_target){.out = H, .y_offset = 0, .y_step = 1};
        g[LORA_GATE_UP] = (struct cuda_lora){.n_targets = 2, .in = H, .y_stride = 2 * F};
        g[LORA_GATE_UP].target[0] = (struct cuda_lora_target){.out = F, .y_offset = 0, .y_step = 2};
        g[LORA_GATE_UP].target[1] = (struct cuda_lora_target){.out = F, .y_offset = 1, .y_step = 2};
        g[LORA_DOWN] = (struct cuda_lora){.n_targets = 1, .in = F, .y_stride = H};
        g[LORA_DOWN].target[0] = (struct cuda_lora_target){.out = H, .y_offset = 0, .y_step = 1};
        for (int j = 0; j < LORA_GROUPS; j++)
            g[j].x_stride = g[j].in;
    }
}

/* Adapter l's factors into slot k: one allocation (A as loaded, B transposed for the up
 * kernel's coalesced reads), its pointers into the descriptions. */
static int lora_upload(struct talker_cuda *tc, int k, const struct talker_lora *l)
{
    const struct talker_config *c = &tc->cfg;
    int L = c->n_layers;
    size_t total = talker_lora_floats(l, L);
    /* the widest output of an adapted layer: q (KD <= QD), o and down (hidden), gate and up (ffn) */
    size_t widest = (size_t)c->n_heads * c->head_dim;
    if ((size_t)c->hidden > widest) widest = (size_t)c->hidden;
    if ((size_t)c->ffn > widest) widest = (size_t)c->ffn;
    for (int j = 0; j < L * LORA_GROUPS; j++) {
        tc->lora[j].rank[k] = l->rank;
        tc->lora[j].scale[k] = l->scale;
    }
    if (!total) return 0;
    float *mem, *bt = malloc(sizeof(float) * widest * l->rank);
    if (!bt) return mm3_errorf(-ENOMEM, "talker_cuda_set_lora: out of memory");
    int rc = cuda_malloc((void **)&mem, sizeof(float) * total);
    if (rc == 0) tc->lora_mem[k] = mem;
    for (int li = 0; li < L && rc == 0; li++)
        for (int t = 0; t < TALKER_LORA_N_TARGETS && rc == 0; t++) {
            const struct talker_lora_mat *m = talker_lora_at(l, li, t);
            if (!m->a) continue;
            size_t na = (size_t)l->rank * m->in, nb = (size_t)m->out * l->rank;
            struct cuda_lora_target *tg = &tc->lora[li * LORA_GROUPS + lora_place[t].group].target[lora_place[t].index];
            if (tg->out != m->out) {
                rc = mm3_errorf(-EINVAL,
                                "talker_cuda_set_lora: adapter '%s' layer %d has %d outputs where the model "
                                "has %d",
                                l->name, li, m->out, tg->out);
                break;
            }
            for (int o = 0; o < m->out; o++)
                for (int r = 0; r < l->rank; r++)
                    bt[(size_t)r * m->out + o] = m->b[(size_t)o * l->rank + r];
            tg->a[k] = mem;
            tg->bt[k] = mem + na;
            if ((rc = cuda_memcpy_h2d(mem, m->a, sizeof(float) * na)) == 0)
                rc = cuda_memcpy_h2d(mem + na, bt, sizeof(float) * nb);
            mem += na + nb;
        }
    free(bt);
    return rc;
}

/* Drop the targets no adapter adapts; a group left without any is skipped. */
static void lora_compact(struct talker_cuda *tc)
{
    for (int j = 0; j < tc->cfg.n_layers * LORA_GROUPS; j++) {
        struct cuda_lora *g = &tc->lora[j];
        int kept = 0;
        for (int t = 0; t < g->n_targets; t++) {
            int any = 0;
            for (int k = 0; k < CUDA_LORA_ADAPTERS; k++)
                any |= g->target[t].a[k] != NULL;
            if (any) g->target[kept++] = g->target[t];
        }
        g->n_targets = kept;
        g->rank_max = tc->lora_rank_max;
    }
}

int talker_cuda_set_lora(struct talker_cuda *tc, const struct talker_lora_set *set)
{
    /* Nothing queued may still read the adapters or the buffers being replaced. */
    int rc = cuda_stream_sync(NULL);
    if (rc == 0 && tc->stream) rc = cuda_stream_sync(tc->stream);
    if (rc < 0) return rc;
    for (int i = 0; i < tc->n_graphs; i++) {
        cuda_graph_destroy(tc->graphs[i].v[1].exec);
        tc->graphs[i].v[1].exec = NULL;
        tc->graphs[i].v[1].runs = 0;
    }
    lora_free(tc);
    for (int r = 0; r < tc->max_rows; r++)
        tc->row_lora[r] = -1;
    int n = set ? set->n : 0;
    if (n > CUDA_LORA_ADAPTERS)
        rc = mm3_errorf(-EINVAL, "talker_cuda_set_lora: %d adapters, at most %d", n, CUDA_LORA_ADAPTERS);
    if (rc == 0 && n && set->n_layers != tc->cfg.n_layers)
        rc = mm3_errorf(-EINVAL, "talker_cuda_set_lora: adapters for %d layers, the talker has %d", set->n_layers,
                        tc->cfg.n_layers);
    for (int k = 0; rc == 0 && k < n; k++) {
        if (set->a[k].rank < 1 || set->a[k].rank > CUDA_LORA_MAX_RANK)
            rc = mm3_errorf(-EINVAL, "adapter '%s': rank %d, the GPU serves ranks 1..%d per request", set->a[k].name,
                            set->a[k].rank, CUDA_LORA_MAX_RANK);
        else if (set->a[k].rank > tc->lora_rank_max)
            tc->lora_rank_max = set->a[k].rank;
    }
    if (rc == 0 && n) {
        tc->lora = calloc((size_t)tc->cfg.n_layers * LORA_GROUPS, sizeof *tc->lora);
        if (!tc->lora) rc = mm3_errorf(-ENOMEM, "talker_cuda_set_lora: out of memory");
    }
    if (rc == 0 && n) lora_describe(tc);
    for (int k = 0; rc == 0 && k < n; k++)
        rc = lora_upload(tc, k, &set->a[k]);
    if (rc == 0 && n) {
        lora_compact(tc);
        tc->lora_n = n;
    }
    if (rc < 0) lora_free(tc);
    int rc2 = scratch_lora_reserve(tc, &tc->s);
    if (rc2 == 0) rc2 = scratch_lora_reserve(tc, &tc->gs);
    if (rc == 0 && rc2 < 0) lora_free(tc);
    return rc < 0 ? rc : rc2;
}

int talker_cuda_row_lora_of(const struct talker_cuda *tc, int row)
{
    return row >= 0 && row < tc->max_rows ? tc->row_lora[row] : -1;
}

int talker_cuda_row_lora(struct talker_cuda *tc, int row, int adapter)
{
    if (row < 0 || row >= tc->max_rows)
        return mm3_errorf(-EINVAL, "talker_cuda_row_lora: row %d outside 0..%d", row, tc->max_rows - 1);
    if (adapter < -1 || adapter >= tc->lora_n)
        return mm3_errorf(-EINVAL, "talker_cuda_row_lora: adapter %d, expected -1 or 0..%d loaded", adapter,
                          tc->lora_n - 1);
    tc->row_lora[row] = adapter;
    return 0;
}
