#include "stage0/model/cuda/depth_cuda.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda/ops_cuda.h"
#include "common/dtype.h"
#include "common/error.h"
#include "stage0/model/cuda/cuda_upload.h"
#include "stage0/model/cuda/depth_kernels.h"
#include "stage0/model/cuda/gemv_rows.h"
#include "stage0/model/cuda/talker_kernels.h"

/* wqkv: the rows of Wq, Wk, Wv one after the other ([3 hidden, hidden]); wgu: the rows
 * of Wg and Wu interleaved ([2 ffn, hidden]): one product each instead of three and
 * two, the same dot products (each output is one weight row), packed at upload (as
 * the talker's); the gate/up product applies silu * up as it stores. */
struct depth_cuda_layer {
    const uint16_t *wqkv, *wo, *wgu, *wd;
    const float *attn_norm, *ffn_norm;
};

struct depth_cuda {
    struct depth_config cfg;
    int max_rows, scratch_rows;
    struct cuda_alloc_list mem;
    struct depth_cuda_layer *layers;
    const uint16_t *proj, *heads;
    const float *pos_emb, *norm;
    float *input_table; /* depth_cuda_input_table; NULL where not built */
    float *qkv_table;   /* depth_cuda_qkv_table; NULL where not built */
    float *kc, *vc;
    /* Scratch for scratch_rows rows: max_rows, plus one more position block of up to
     * step01_max_rows rows for the two-position pass (depth_cuda_step01_dev). qkv: fused rows [q | k | v],
     * free again once attention has run, so the FFN's silu(gate) * up rows (ffn wide) reuse it: qkv holds max(3 hidden,
     * ffn) per row (the memory of the former q, k, v and u buffers when ffn <= 3 hidden, as talker_backend_plan_compute
     * counts). gu: fused gate|up rows (only where the product cannot apply silu * up as it stores: unaligned widths).
     */
    float *x, *h, *a, *o, *qkv, *gu, *logits;
};

/* Rows per position of the two-position pass: its 2n rows in one GEMV slice of every
 * product (inputs hidden or ffn wide), within the state's rows. */
static int step01_max_rows(const struct depth_cuda *dc)
{
    int slice = cuda_ops_gemv_max_rows(dc->cfg.hidden), f = cuda_ops_gemv_max_rows(dc->cfg.ffn);
    if (f < slice) slice = f;
    return dc->max_rows < slice / 2 ? dc->max_rows : slice / 2;
}

/* Which tables build_input_tables makes for d: the inputs of positions 2..
 * n_codebooks-1 where there are such positions, audio embeddings on the host and
 * position rows for them; layer 0's Q|K|V beside them where hidden % 4 == 0 (rows of
 * whole float4s: the draw's copy), unless depth_cuda_set_input_tables says otherwise. */
struct input_tables_plan {
    int n_tab, input, qkv;
};

static int tables_setting = DEPTH_CUDA_TABLES_BOTH;

int depth_cuda_set_input_tables(int mode)
{
    if (mode != DEPTH_CUDA_TABLES_NONE && mode != DEPTH_CUDA_TABLES_BOTH && mode != DEPTH_CUDA_TABLES_INPUT)
        return mm3_errorf(-EINVAL, "depth_cuda_set_input_tables: %d: expected 0 (none), 1 (both) or 2 (input only)",
                          mode);
    __atomic_store_n(&tables_setting, mode, __ATOMIC_RELAXED);
    return 0;
}

static struct input_tables_plan input_tables_plan(const struct depth *d)
{
    const struct depth_config *cfg = &d->cfg;
    const int mode = __atomic_load_n(&tables_setting, __ATOMIC_RELAXED);
    struct input_tables_plan p = {.n_tab = cfg->n_codebooks - 2};
    p.input = mode && p.n_tab >= 1 && d->audio_emb && cfg->n_codebooks <= cfg->max_pos;
    p.qkv = p.input && mode != 2 && cfg->n_layers > 0 && cfg->hidden % 4 == 0;
    return p;
}

size_t depth_cuda_table_spared_bytes(const struct depth *d)
{
    const struct input_tables_plan p = input_tables_plan(d);
    const size_t H = (size_t)d->cfg.hidden;
    /* per pass the projection (H x H) and, with the QKV table, Wq|Wk|Wv (3H x H), bf16 */
    return p.input ? (size_t)p.n_tab * H * H * 2 * (p.qkv ? 4 : 1) : 0;
}

/* input_table rows (j-1) V + c, j = 1 .. n_codebooks-2: the projection of audio
 * embedding row (j-1) V + c plus pos_embedding[j+1], by the kernels a pass runs (the
 * GEMV of the projection, then the row add), one codebook at a time through a scratch
 * of V float32 rows. The embeddings are bf16 values, so whatever rounding the GEMV
 * applies to x is exact, and a row equals what the pass would compute up to the float32
 * summation order of the product.
 * qkv_table, the same rows: layer 0's fused Q|K|V of the RMS-normed input row, the
 * first product of a pass, again a function of (codebook, code) only. Products of at
 * most CUDA_OPS_GEMV_SPLIT_MAX_ROWS rows, where x keeps float32 accuracy (split into
 * bf16 hi + lo) whatever the serving batch rounds. */
static int build_input_tables(struct depth_cuda *dc, const struct depth *d)
{
    const struct depth_config *cfg = &dc->cfg;
    const int H = cfg->hidden, V = cfg->audio_vocab, S = CUDA_OPS_GEMV_SPLIT_MAX_ROWS;
    const struct input_tables_plan plan = input_tables_plan(d);
    if (!plan.input) return 0;
    size_t cb = (size_t)V * H, cb3 = 3 * cb;
    int rc = cuda_alloc_list_add(&dc->mem, (void **)&dc->input_table, sizeof(float) * cb * plan.n_tab);
    if (rc == 0 && plan.qkv)
        rc = cuda_alloc_list_add(&dc->mem, (void **)&dc->qkv_table, sizeof(float) * cb3 * plan.n_tab);
    float *emb = NULL, *normed = NULL;
    if (rc == 0) rc = cuda_malloc((void **)&emb, sizeof(float) * cb);
    if (rc == 0 && plan.qkv) rc = cuda_malloc((void **)&normed, sizeof(float) * cb);
    for (int j = 1; j <= plan.n_tab && rc == 0; j++) {
        float *t = dc->input_table + (size_t)(j - 1) * cb;
        if ((rc = cuda_memcpy_h2d(emb, d->audio_emb + (size_t)(j - 1) * cb, sizeof(float) * cb)) < 0 ||
            (rc = gemv_rows(t, emb, dc->proj, V, H, H, NULL)) < 0 ||
            (rc = talker_cuda_add_row(t, dc->pos_emb + (size_t)(j + 1) * H, V, H, NULL)) < 0)
            break;
        if (!plan.qkv) continue;
        const struct depth_cuda_layer *L = &dc->layers[0];
        float *q = dc->qkv_table + (size_t)(j - 1) * cb3;
        if ((rc = cuda_ops_rmsnorm(normed, t, L->attn_norm, V, H, cfg->eps, NULL)) < 0) break;
        for (int r = 0; r < V && rc == 0; r += S)
            rc = cuda_ops_matmul_bf16(q + (size_t)r * 3 * H, normed + (size_t)r * H, L->wqkv, V - r < S ? V - r : S, H,
                                      3 * H, NULL);
    }
    if (rc == 0) rc = cuda_stream_sync(NULL);
    cuda_free(emb);
    cuda_free(normed);
    if (rc < 0) return mm3_error_prefix(rc, "depth_cuda_create: input tables: ");
    return 0;
}

int depth_cuda_create(struct depth_cuda **out, const struct depth *d, int max_rows)
{
    *out = NULL;
    const struct depth_config *cfg = &d->cfg;
    if (max_rows < 1) return mm3_errorf(-EINVAL, "depth_cuda_create: %d rows, expected >= 1", max_rows);
    if (cfg->head_dim > TALKER_CUDA_MAX_HEAD_DIM)
        return mm3_errorf(-EINVAL, "depth_cuda_create: head_dim %d: at most %d supported", cfg->head_dim,
                          TALKER_CUDA_MAX_HEAD_DIM);
    if (cuda_device_count_safe() < 1) return mm3_errorf(-ENODEV, "depth_cuda_create: no CUDA device");
    struct depth_cuda *dc = calloc(1, sizeof *dc);
    if (!dc) return mm3_errorf(-ENOMEM, "depth_cuda_create: out of memory");
    dc->cfg = *cfg;
    dc->max_rows = max_rows;
    dc->layers = calloc((size_t)cfg->n_layers, sizeof *dc->layers);
    int rc = dc->layers ? 0 : mm3_errorf(-ENOMEM, "depth_cuda_create: out of memory");
    size_t H = (size_t)cfg->hidden, F = (size_t)cfg->ffn, V = (size_t)cfg->audio_vocab;
    size_t nres = (size_t)cfg->n_codebooks - 1, S = (size_t)cfg->n_codebooks;
    struct cuda_alloc_list *l = &dc->mem;
    float *f;
    uint16_t *w;
    struct cuda_upload u;
    cuda_upload_begin(&u, l, &d->deferred);
    for (int i = 0; i < cfg->n_layers && rc == 0; i++) {
        const struct depth_layer *L = &d->layers[i];
        struct depth_cuda_layer *G = &dc->layers[i];
        if ((rc = cuda_upload_f32(l, &f, L->attn_norm, H)) < 0) break;
        G->attn_norm = f;
        if ((rc = cuda_upload_f32(l, &f, L->ffn_norm, H)) < 0) break;
        G->ffn_norm = f;
        float *const *qkv[3] = {&L->wq, &L->wk, &L->wv};
        const size_t qkv_rows[3] = {H, H, H};
        if ((rc = cuda_upload_stacked(&u, &w, qkv, qkv_rows, 3, H)) < 0) break;
        G->wqkv = w;
        if ((rc = cuda_upload_matrix(&u, &w, &L->wo, H, H)) < 0) break;
        G->wo = w;
        if ((rc = cuda_upload_interleaved(&u, &w, &L->wg, &L->wu, F, H)) < 0) break;
        G->wgu = w;
        if ((rc = cuda_upload_matrix(&u, &w, &L->wd, H, F)) < 0) break;
        G->wd = w;
    }
    if (rc == 0 && (rc = cuda_upload_matrix(&u, &w, &d->proj, H, H)) == 0) dc->proj = w;
    if (rc == 0 && (rc = cuda_upload_matrix(&u, &w, &d->heads, nres * V, H)) == 0) dc->heads = w;
    rc = cuda_upload_end(&u, rc);
    if (rc == 0 && (rc = cuda_upload_f32(l, &f, d->pos_emb, (size_t)cfg->max_pos * H)) == 0) dc->pos_emb = f;
    if (rc == 0 && (rc = cuda_upload_f32(l, &f, d->norm, H)) == 0) dc->norm = f;
    size_t cache = (size_t)cfg->n_layers * max_rows * S * H * sizeof(float);
    dc->scratch_rows = max_rows + step01_max_rows(dc);
    size_t R = (size_t)dc->scratch_rows;
    struct {
        void **dst;
        size_t bytes;
    } a[] = {
        {(void **)&dc->kc, cache},
        {(void **)&dc->vc, cache},
        {(void **)&dc->x, sizeof(float) * R * H},
        {(void **)&dc->h, sizeof(float) * R * H},
        {(void **)&dc->a, sizeof(float) * R * H},
        {(void **)&dc->o, sizeof(float) * R * H},
        {(void **)&dc->qkv, sizeof(float) * R * (3 * H > F ? 3 * H : F)},
        {(void **)&dc->gu, sizeof(float) * R * 2 * F},
        {(void **)&dc->logits, sizeof(float) * (size_t)max_rows * V},
    };
    for (size_t i = 0; i < sizeof a / sizeof a[0] && rc == 0; i++)
        rc = cuda_alloc_list_add(l, a[i].dst, a[i].bytes);
    if (rc == 0) rc = cuda_memset(dc->kc, 0, cache);
    if (rc == 0) rc = cuda_memset(dc->vc, 0, cache);
    if (rc == 0) rc = build_input_tables(dc, d);
    if (rc < 0) {
        depth_cuda_destroy(dc);
        return rc;
    }
    *out = dc;
    return 0;
}

void depth_cuda_destroy(struct depth_cuda *dc)
{
    if (!dc) return;
    cuda_alloc_list_free(&dc->mem);
    free(dc->layers);
    free(dc);
}

static int check_step(const struct depth_cuda *dc, int n, int pos)
{
    if (n < 1 || n > dc->max_rows || pos < 0 || pos >= dc->cfg.n_codebooks)
        return mm3_errorf(-EINVAL, "depth_cuda_step: %d rows at position %d (state holds %d rows, %d positions)", n,
                          pos, dc->max_rows, dc->cfg.n_codebooks);
    return 0;
}

/* Whether the layers of a pass of n sequences at n_pos positions run as the fused chain
 * (then the last layer's output is complete in h before the final norm). */
static int depth_fused(const struct depth_config *cfg, int n, int n_pos)
{
    const int N = n * n_pos, H = cfg->hidden, F = cfg->ffn;
    return gemv_rows_fused_ok(N, H, 3 * H, CUDA_GEMV_STORE, 1) && gemv_rows_fused_ok(N, H, H, CUDA_GEMV_ADD, 0) &&
           gemv_rows_fused_ok(N, H, 2 * F, CUDA_GEMV_SWIGLU, 1) && gemv_rows_fused_ok(N, F, H, CUDA_GEMV_ADD, 0) &&
           gemv_rows_fused_ok(n, H, H, CUDA_GEMV_ADD, 0) && gemv_rows_fused_ok(n, H, 2 * F, CUDA_GEMV_SWIGLU, 1) &&
           gemv_rows_fused_ok(n, F, H, CUDA_GEMV_ADD, 0);
}

/* Per layer 5 launches (14 before the fusions): QKV product of the normed h, K/V store
 * + attention in one kernel (the context is at most n_codebooks positions: no split),
 * h += o . Wo^T, silu * up of the normed h, h += g . Wd^T; the norms, SwiGLU and
 * residual adds inside the products (cuda_ops_gemv_bf16_fused). Widths that do not
 * fuse take the same chain with separate norm/add kernels (7 launches). No q/k norm
 * and no RoPE here (docs/model.md §4.4: learned positions, added once to the input).
 *
 * Positions pos .. pos + n_pos - 1 of n sequences in one pass: h holds their inputs
 * (projected, positions added) as n_pos blocks of n rows (position-major), the
 * products run on all n_pos * n rows at once (the weights are read once), the
 * attention once per position (causal: each position's K/V is stored before the next
 * position attends), and out gets the last position's rows.
 * The last layer's products after the attention run on the last position's rows only:
 * earlier positions of the pass only feed the caches.
 *
 * out NULL (only where depth_cuda_raw_fits): no final norm, the last position's rows
 * stay as they are in depth_cuda_raw_rows. */
static int depth_layers(struct depth_cuda *dc, int n, int pos, int n_pos, int qkv0_ready, float *out, void *st)
{
    const struct depth_config *cfg = &dc->cfg;
    const int N = n * n_pos, H = cfg->hidden, F = cfg->ffn;
    const size_t last = (size_t)(n_pos - 1) * n; /* first row of the last position */
    size_t row_stride = (size_t)cfg->n_codebooks * H, layer_stride = (size_t)dc->max_rows * row_stride;
    const struct attention_heads heads = {cfg->n_heads, cfg->n_heads, cfg->head_dim,
                                          1.0f / sqrtf((float)cfg->head_dim)};
    float *g = dc->qkv; /* silu(gate) * up: the QKV rows are free by then */
    const int fused = depth_fused(cfg, n, n_pos);
    int rc = 0;
    for (int li = 0; li < cfg->n_layers; li++) {
        const struct depth_cuda_layer *L = &dc->layers[li];
        const struct cuda_kv_cache kv = {.k = dc->kc + li * layer_stride,
                                         .v = dc->vc + li * layer_stride,
                                         .dtype = CUDA_KV_F32,
                                         .seq_stride = row_stride,
                                         .row_stride = (size_t)cfg->n_heads * cfg->head_dim};
        const size_t r0 = li == cfg->n_layers - 1 ? last : 0; /* rows after the attention: r0 .. N-1 */
        const int M = N - (int)r0;
        float *h = dc->h + r0 * H, *o = dc->o + r0 * H, *a = dc->a + r0 * H;
        const int qkv_ready = li == 0 && qkv0_ready;
        if (fused) {
            const struct cuda_gemv_fused qkv = {.y = dc->qkv,
                                                .x = dc->h,
                                                .w = L->wqkv,
                                                .n_rows = N,
                                                .in = H,
                                                .out = 3 * H,
                                                .norm_w = L->attn_norm,
                                                .eps = cfg->eps};
            const struct cuda_gemv_fused wo = {
                .y = h, .x = o, .w = L->wo, .n_rows = M, .in = H, .out = H, .epi = CUDA_GEMV_ADD};
            const struct cuda_gemv_fused gate_up = {.y = g,
                                                    .x = h,
                                                    .w = L->wgu,
                                                    .n_rows = M,
                                                    .in = H,
                                                    .out = 2 * F,
                                                    .epi = CUDA_GEMV_SWIGLU,
                                                    .norm_w = L->ffn_norm,
                                                    .eps = cfg->eps};
            const struct cuda_gemv_fused down = {
                .y = h, .x = g, .w = L->wd, .n_rows = M, .in = F, .out = H, .epi = CUDA_GEMV_ADD};
            if (!qkv_ready && (rc = gemv_rows_fused(&qkv, st)) < 0) return rc;
            for (int p = 0; p < n_pos && rc == 0; p++)
                rc = depth_cuda_attention_store(dc->o + (size_t)p * n * H, dc->qkv + (size_t)p * n * 3 * H, n, pos + p,
                                                &kv, &heads, st);
            if (rc < 0 || (rc = gemv_rows_fused(&wo, st)) < 0 || (rc = gemv_rows_fused(&gate_up, st)) < 0 ||
                (rc = gemv_rows_fused(&down, st)) < 0)
                return rc;
            continue;
        }
        /* The FFN output of the previous layer (in o) is added to h inside this norm. */
        if (li == 0 && !qkv_ready)
            rc = cuda_ops_rmsnorm(dc->a, dc->h, L->attn_norm, N, H, cfg->eps, st);
        else if (li > 0)
            rc = cuda_ops_add_rmsnorm(dc->h, dc->a, dc->o, L->attn_norm, N, H, cfg->eps, st);
        if (rc == 0 && !qkv_ready) rc = gemv_rows(dc->qkv, dc->a, L->wqkv, N, H, 3 * H, st);
        for (int p = 0; p < n_pos && rc == 0; p++)
            rc = depth_cuda_attention_store(dc->o + (size_t)p * n * H, dc->qkv + (size_t)p * n * 3 * H, n, pos + p, &kv,
                                            &heads, st);
        /* a = o . Wo^T; then h += a and o = rmsnorm(h) (o is free once Wo has read it);
         * the FFN output lands in o for the next norm's add. */
        if (rc < 0 || (rc = gemv_rows(a, o, L->wo, M, H, H, st)) < 0 ||
            (rc = cuda_ops_add_rmsnorm(h, o, a, L->ffn_norm, M, H, cfg->eps, st)) < 0 ||
            (rc = gemv_rows_swiglu(g, dc->gu, o, L->wgu, M, H, F, st)) < 0 ||
            (rc = gemv_rows(o, g, L->wd, M, F, H, st)) < 0)
            return rc;
    }
    if (!out) return 0; /* depth_cuda_raw_fits: the caller norms the last rows itself */
    if (fused || cfg->n_layers == 0) return cuda_ops_rmsnorm(out, dc->h + last * H, dc->norm, n, H, cfg->eps, st);
    return cuda_ops_add_rmsnorm(dc->h + last * H, out, dc->o + last * H, dc->norm, n, H, cfg->eps, st);
}

/* The projection of x (n_pos blocks of n rows) with each position's embedding added
 * into h, then the layers. */
static int depth_forward(struct depth_cuda *dc, int n, const float *x, int pos, int n_pos, float *out, void *st)
{
    int rc = 0;
    /* x NULL: the inputs are already projected, with their positions, in h's rows, and
     * where there is a QKV table layer 0's Q|K|V in qkv's (depth_cuda_step_projected_dev) */
    if (x) {
        rc = gemv_rows(dc->h, x, dc->proj, n * n_pos, dc->cfg.hidden, dc->cfg.hidden, st);
        for (int p = 0; p < n_pos && rc == 0; p++)
            rc = talker_cuda_add_row(dc->h + (size_t)p * n * dc->cfg.hidden,
                                     dc->pos_emb + (size_t)(pos + p) * dc->cfg.hidden, n, dc->cfg.hidden, st);
    }
    if (rc < 0) return rc;
    return depth_layers(dc, n, pos, n_pos, !x && dc->qkv_table, out, st);
}

/* One position of n rows, checked: x NULL = the inputs already in place (projected). */
static int step_one(struct depth_cuda *dc, int n, const float *x, int pos, float *out, void *st)
{
    int rc = check_step(dc, n, pos);
    if (rc == 0 && !out && !depth_cuda_raw_fits(dc, n, 1))
        rc = mm3_errorf(-EINVAL, "%s: no output for %d rows, where the final norm is not left to the caller",
                        x ? "depth_cuda_step" : "depth_cuda_step_projected", n);
    return rc < 0 ? rc : depth_forward(dc, n, x, pos, 1, out, st);
}

int depth_cuda_step_dev(struct depth_cuda *dc, int n, const float *x, int pos, float *out, void *st)
{
    if (!x) return mm3_errorf(-EINVAL, "depth_cuda_step: no inputs");
    return step_one(dc, n, x, pos, out, st);
}

const float *depth_cuda_input_table(const struct depth_cuda *dc)
{
    return dc->input_table;
}

float *depth_cuda_projected_inputs(struct depth_cuda *dc)
{
    return dc->h;
}

const float *depth_cuda_qkv_table(const struct depth_cuda *dc)
{
    return dc->qkv_table;
}

float *depth_cuda_projected_qkv(struct depth_cuda *dc)
{
    return dc->qkv;
}

int depth_cuda_step_projected_dev(struct depth_cuda *dc, int n, int pos, float *out, void *st)
{
    return step_one(dc, n, NULL, pos, out, st);
}

int depth_cuda_raw_fits(const struct depth_cuda *dc, int n, int n_pos)
{
    const struct depth_config *cfg = &dc->cfg;
    return n >= 1 && n <= dc->max_rows && cfg->n_layers > 0 && depth_fused(cfg, n, n_pos) &&
           gemv_rows_fused_ok(n, cfg->hidden, cfg->audio_vocab, CUDA_GEMV_STORE, 1);
}

const float *depth_cuda_raw_rows(const struct depth_cuda *dc, int n, int n_pos)
{
    return dc->h + (size_t)(n_pos - 1) * n * dc->cfg.hidden;
}

const float *depth_cuda_norm_weight(const struct depth_cuda *dc, float *eps)
{
    *eps = dc->cfg.eps;
    return dc->norm;
}

float *depth_cuda_step01_inputs(struct depth_cuda *dc, int n)
{
    return depth_cuda_step01_fits(dc, n) ? dc->x : NULL;
}

int depth_cuda_logits_raw_dev(struct depth_cuda *dc, int j, const float *raw, int n, float *logits, void *stream)
{
    const struct depth_config *cfg = &dc->cfg;
    if (j < 1 || j >= cfg->n_codebooks || !depth_cuda_raw_fits(dc, n, 1))
        return mm3_errorf(-EINVAL,
                          "depth_cuda_logits_raw: codebook %d, %d rows: expected 1..%d and rows whose norm "
                          "fuses into the head",
                          j, n, cfg->n_codebooks - 1);
    int H = cfg->hidden, V = cfg->audio_vocab;
    const struct cuda_gemv_fused head = {.y = logits,
                                         .x = raw,
                                         .w = dc->heads + (size_t)(j - 1) * V * H,
                                         .n_rows = n,
                                         .in = H,
                                         .out = V,
                                         .norm_w = dc->norm,
                                         .eps = cfg->eps};
    return gemv_rows_fused(&head, stream);
}

int depth_cuda_step01_fits(const struct depth_cuda *dc, int n)
{
    return n >= 1 && n <= step01_max_rows(dc) && dc->cfg.n_codebooks >= 2;
}

int depth_cuda_step01_dev(struct depth_cuda *dc, int n, const float *x0, const float *x1, float *out, void *st)
{
    if (!depth_cuda_step01_fits(dc, n))
        return mm3_errorf(-EINVAL,
                          "depth_cuda_step01: %d rows: expected 1..%d (state holds %d rows; two positions in one pass "
                          "up to half a GEMV slice, %d at hidden %d and ffn %d; %d codebooks, at least 2)",
                          n, step01_max_rows(dc), dc->max_rows, step01_max_rows(dc), dc->cfg.hidden, dc->cfg.ffn,
                          dc->cfg.n_codebooks);
    if (!out && !depth_cuda_raw_fits(dc, n, 2))
        return mm3_errorf(-EINVAL,
                          "depth_cuda_step01: no output for %d rows, where the final norm is not left to the "
                          "caller",
                          n);
    /* Inputs already in place (depth_cuda_step01_inputs) need no copy: a copy node in a
     * graph also ends the programmatic overlap of the kernels around it. */
    size_t bytes = sizeof(float) * (size_t)n * dc->cfg.hidden;
    float *x1_at = dc->x + (size_t)n * dc->cfg.hidden;
    int rc;
    if ((x0 != dc->x && (rc = cuda_memcpy_d2d(dc->x, x0, bytes, st)) < 0) ||
        (x1 != x1_at && (rc = cuda_memcpy_d2d(x1_at, x1, bytes, st)) < 0))
        return rc;
    return depth_forward(dc, n, dc->x, 0, 2, out, st);
}

int depth_cuda_step(struct depth_cuda *dc, int n, const float *x, int pos, float *out)
{
    int rc = check_step(dc, n, pos);
    if (rc < 0) return rc;
    size_t bytes = sizeof(float) * (size_t)n * dc->cfg.hidden;
    if ((rc = cuda_memcpy_h2d(dc->x, x, bytes)) < 0 || (rc = depth_cuda_step_dev(dc, n, dc->x, pos, dc->a, NULL)) < 0 ||
        (rc = cuda_stream_sync(NULL)) < 0)
        return rc;
    return cuda_memcpy_d2h(out, dc->a, bytes);
}

int depth_cuda_logits_dev(struct depth_cuda *dc, int j, const float *hidden, int n, float *logits, void *stream)
{
    const struct depth_config *cfg = &dc->cfg;
    if (j < 1 || j >= cfg->n_codebooks || n < 1 || n > dc->max_rows)
        return mm3_errorf(-EINVAL, "depth_cuda_logits: codebook %d, %d rows: expected 1..%d and 1..%d rows", j, n,
                          cfg->n_codebooks - 1, dc->max_rows);
    int H = cfg->hidden, V = cfg->audio_vocab;
    return gemv_rows(logits, hidden, dc->heads + (size_t)(j - 1) * V * H, n, H, V, stream);
}

int depth_cuda_logits(struct depth_cuda *dc, int j, const float *hidden, int n, float *logits)
{
    int H = dc->cfg.hidden, V = dc->cfg.audio_vocab, rc;
    if (n >= 1 && n <= dc->max_rows && (rc = cuda_memcpy_h2d(dc->x, hidden, sizeof(float) * n * H)) < 0) return rc;
    if ((rc = depth_cuda_logits_dev(dc, j, dc->x, n, dc->logits, NULL)) < 0 || (rc = cuda_stream_sync(NULL)) < 0)
        return rc;
    return cuda_memcpy_d2h(logits, dc->logits, sizeof(float) * n * V);
}
