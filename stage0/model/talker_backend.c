#include "stage0/model/talker_backend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sampler.h"
#include "stage0/model/cuda/depth_cuda.h" /* also in CPU-only builds: DEPTH_CUDA_PAIR_MAX_ROWS for the plan */
#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage0/model/cuda/device_memory.h"
#include "stage0/model/cuda/frame_cuda.h"
#include "stage0/model/cuda/talker_cuda.h"
#endif

int talker_backend_parse(const char *name, enum talker_backend_kind *kind)
{
    if (name && strcmp(name, "cpu") == 0) {
        *kind = TALKER_BACKEND_CPU;
        return 0;
    }
    if (name && strcmp(name, "cuda") == 0) {
        *kind = TALKER_BACKEND_CUDA;
        return 0;
    }
    return mm3_errorf(-EINVAL, "backend '%s': expected 'cpu' or 'cuda'", name ? name : "(null)");
}

/* ---- CPU: today's functions over a private talker_state / depth_state ---- */

struct cpu_impl {
    const struct talker *lm;
    const struct depth *dd;
    struct talker_state ts;
    struct depth_state ds;
};

static int cpu_forward(void *impl, int n, const int *row, const int *pos, const float *emb, float *hidden_out)
{
    struct cpu_impl *c = impl;
    return talker_forward(c->lm, &c->ts, n, row, pos, emb, hidden_out);
}

static int cpu_head_drawable(void *impl, const float *hidden, int n_rows, float *logits)
{
    struct cpu_impl *c = impl;
    talker_head_drawable(c->lm, hidden, n_rows, logits);
    return 0;
}

static int cpu_depth_step(void *impl, int n, const float *x, int pos, float *out)
{
    struct cpu_impl *c = impl;
    return depth_step(c->dd, &c->ds, n, x, pos, out);
}

static int cpu_depth_logits(void *impl, int j, const float *hidden, int n, float *logits)
{
    struct cpu_impl *c = impl;
    if (j < 1 || j >= c->dd->cfg.n_codebooks)
        return mm3_errorf(-EINVAL, "depth_logits: codebook %d, expected 1..%d", j, c->dd->cfg.n_codebooks - 1);
    depth_logits(c->dd, j, hidden, n, logits);
    return 0;
}

static int cpu_set_lora(void *impl, const struct talker_lora_set *set)
{
    struct cpu_impl *c = impl;
    talker_state_set_lora(&c->ts, set);
    return 0;
}

static int cpu_row_lora(void *impl, int row, int adapter)
{
    struct cpu_impl *c = impl;
    c->ts.row_lora[row] = adapter;
    return 0;
}

static void cpu_destroy(void *impl)
{
    struct cpu_impl *c = impl;
    if (!c) return;
    talker_state_free(&c->ts);
    depth_state_free(&c->ds);
    free(c);
}

static int cpu_open(struct talker_backend *b, int max_rows, int max_ctx, int depth_rows)
{
    if (!talker_has_matrices(b->lm) || !depth_has_matrices(b->dd))
        return mm3_errorf(-EINVAL, "backend cpu: the model was loaded for the GPU (its matrices were left in the "
                                   "checkpoint); load it with talker_load / depth_load");
    struct cpu_impl *c = calloc(1, sizeof *c);
    if (!c) return mm3_errorf(-ENOMEM, "talker backend: out of memory");
    c->lm = b->lm;
    c->dd = b->dd;
    int rc = talker_state_init(&c->ts, b->lm, max_rows, max_ctx);
    if (rc == 0) rc = depth_state_init(&c->ds, b->dd, depth_rows);
    if (rc < 0) {
        cpu_destroy(c);
        return rc;
    }
    b->impl = c;
    b->forward = cpu_forward;
    b->head_drawable = cpu_head_drawable;
    b->depth_step = cpu_depth_step;
    b->depth_logits = cpu_depth_logits;
    b->set_lora = cpu_set_lora;
    b->row_lora = cpu_row_lora;
    b->destroy = cpu_destroy;
    return 0;
}

/* ---- CUDA: stage0/model/cuda/ ---- */

#ifdef MM3_HAVE_CUDA
struct cuda_impl {
    struct talker_cuda *tc;
    struct depth_cuda *dc;
    struct frame_cuda *fc; /* NULL: no batched sampling step (see frame_cuda.h) */
};

/* The entries other than decode_pairs first wait for a decode step it queued ahead
 * and drop it: they use the same states and buffers. */
static int gpu_forward(void *impl, int n, const int *row, const int *pos, const float *emb, float *hidden_out)
{
    struct cuda_impl *c = impl;
    int rc = frame_cuda_ahead_drop(c->fc);
    return rc < 0 ? rc : talker_cuda_forward(c->tc, n, row, pos, emb, hidden_out);
}

static int gpu_head_drawable(void *impl, const float *hidden, int n_rows, float *logits)
{
    struct cuda_impl *c = impl;
    int rc = frame_cuda_ahead_drop(c->fc);
    return rc < 0 ? rc : talker_cuda_head_drawable(c->tc, hidden, n_rows, logits);
}

static int gpu_depth_step(void *impl, int n, const float *x, int pos, float *out)
{
    struct cuda_impl *c = impl;
    int rc = frame_cuda_ahead_drop(c->fc);
    return rc < 0 ? rc : depth_cuda_step(c->dc, n, x, pos, out);
}

static int gpu_depth_logits(void *impl, int j, const float *hidden, int n, float *logits)
{
    struct cuda_impl *c = impl;
    int rc = frame_cuda_ahead_drop(c->fc);
    return rc < 0 ? rc : depth_cuda_logits(c->dc, j, hidden, n, logits);
}

static int gpu_sample_pairs(void *impl, const struct talker_pairs_in *in, const struct talker_pairs_out *out)
{
    struct cuda_impl *c = impl;
    return frame_cuda_sample_pairs(c->fc, c->tc, c->dc, in, out);
}

static int gpu_decode_pairs(void *impl, const struct talker_decode_in *in, const struct talker_pairs_out *out)
{
    struct cuda_impl *c = impl;
    return frame_cuda_decode_pairs(c->fc, c->tc, c->dc, in, out);
}

static int gpu_set_lora(void *impl, const struct talker_lora_set *set)
{
    struct cuda_impl *c = impl;
    int rc = frame_cuda_ahead_drop(c->fc);
    return rc < 0 ? rc : talker_cuda_set_lora(c->tc, set);
}

/* A step queued ahead was staged with the rows' adapters of its time: a change drops it
 * (every song start sets its rows, mostly to none, which changes nothing). */
static int gpu_row_lora(void *impl, int row, int adapter)
{
    struct cuda_impl *c = impl;
    if (talker_cuda_row_lora_of(c->tc, row) == adapter) return 0;
    int rc = frame_cuda_ahead_drop(c->fc);
    return rc < 0 ? rc : talker_cuda_row_lora(c->tc, row, adapter);
}

static void gpu_destroy(void *impl)
{
    struct cuda_impl *c = impl;
    if (!c) return;
    frame_cuda_destroy(c->fc);
    talker_cuda_destroy(c->tc);
    depth_cuda_destroy(c->dc);
    free(c);
}

static int gpu_open(struct talker_backend *b, int max_rows, int max_ctx, int depth_rows)
{
    struct cuda_impl *c = calloc(1, sizeof *c);
    if (!c) return mm3_errorf(-ENOMEM, "talker backend: out of memory");
    int rc = talker_cuda_create(&c->tc, b->lm, max_rows, max_ctx,
                                b->kv_dtype == MM3_KV_CACHE_BF16 ? CUDA_KV_BF16 : CUDA_KV_F32);
    if (rc == 0) rc = depth_cuda_create(&c->dc, b->dd, depth_rows);
    if (rc == 0 && depth_rows >= 2) rc = frame_cuda_create(&c->fc, b->lm, b->dd, depth_rows / 2);
    if (rc < 0) {
        gpu_destroy(c);
        return rc;
    }
    b->impl = c;
    b->forward = gpu_forward;
    b->head_drawable = gpu_head_drawable;
    b->depth_step = gpu_depth_step;
    b->depth_logits = gpu_depth_logits;
    b->sample_pairs = c->fc ? gpu_sample_pairs : NULL;
    b->decode_pairs = c->fc ? gpu_decode_pairs : NULL;
    b->set_lora = gpu_set_lora;
    b->row_lora = gpu_row_lora;
    b->destroy = gpu_destroy;
    return 0;
}
#endif

int talker_backend_set_lora(struct talker_backend *b, const struct talker_lora_set *set)
{
    if (set && set->n && set->n_layers != b->lm->cfg.n_layers)
        return mm3_errorf(-EINVAL, "talker backend: the adapters were made for %d layers, the talker has %d",
                          set->n_layers, b->lm->cfg.n_layers);
    if (!b->set_lora)
        return set && set->n ? mm3_errorf(-EINVAL, "talker backend %s: per-request adapters are not served", b->name)
                             : 0;
    int rc = b->set_lora(b->impl, set && set->n ? set : NULL);
    if (rc == 0) b->lora = set && set->n ? set : NULL;
    return rc;
}

int talker_backend_row_lora(const struct talker_backend *b, int row, int adapter)
{
    if (row < 0 || row >= b->max_rows)
        return mm3_errorf(-EINVAL, "talker backend: row %d outside [0, %d)", row, b->max_rows);
    int n = b->lora ? b->lora->n : 0;
    if (adapter < -1 || adapter >= n)
        return mm3_errorf(-EINVAL, "talker backend: adapter %d outside the %d loaded", adapter, n);
    if (!b->row_lora) return 0; /* adapter is -1: nothing to do */
    return b->row_lora(b->impl, row, adapter);
}

int talker_backend_available(enum talker_backend_kind kind)
{
    if (kind == TALKER_BACKEND_CPU) return 1;
#ifdef MM3_HAVE_CUDA
    return cuda_device_count_safe() > 0;
#else
    return 0;
#endif
}

enum mm3_kv_cache_dtype talker_backend_kv_dtype(enum talker_backend_kind kind, enum mm3_kv_cache_dtype asked)
{
    if (kind == TALKER_BACKEND_CPU) return MM3_KV_CACHE_F32;
    return asked == MM3_KV_CACHE_F32 ? MM3_KV_CACHE_F32 : MM3_KV_CACHE_BF16;
}

int talker_backend_load_models(enum talker_backend_kind kind, const char *ckpt_root, struct talker *lm,
                               struct depth *dd)
{
    int gpu = kind == TALKER_BACKEND_CUDA;
    int rc = gpu ? talker_load_host_parts(lm, ckpt_root) : talker_load(lm, ckpt_root);
    if (rc < 0) return rc;
    rc = gpu ? depth_load_host_parts(dd, ckpt_root) : depth_load(dd, ckpt_root);
    if (rc < 0) talker_free(lm);
    return rc;
}

int talker_backend_open(struct talker_backend *b, enum talker_backend_kind kind, const struct talker *lm,
                        const struct depth *dd, int max_rows, int max_ctx, int depth_rows)
{
    return talker_backend_open_kv(b, kind, lm, dd, max_rows, max_ctx, depth_rows, MM3_KV_CACHE_AUTO);
}

int talker_backend_open_kv(struct talker_backend *b, enum talker_backend_kind kind, const struct talker *lm,
                           const struct depth *dd, int max_rows, int max_ctx, int depth_rows,
                           enum mm3_kv_cache_dtype kv_dtype)
{
    memset(b, 0, sizeof *b);
    if (kv_dtype != MM3_KV_CACHE_AUTO && kv_dtype != MM3_KV_CACHE_BF16 && kv_dtype != MM3_KV_CACHE_F32)
        return mm3_errorf(-EINVAL, "talker backend: kv_cache_dtype %d: expected auto, bfloat16 or float32",
                          (int)kv_dtype);
    if (kind == TALKER_BACKEND_CPU && kv_dtype == MM3_KV_CACHE_BF16)
        LOG_INFO("kv_cache_dtype bfloat16: the cpu backend keeps its KV cache in float32");
    b->kind = kind;
    b->kv_dtype = talker_backend_kv_dtype(kind, kv_dtype);
    b->lm = lm;
    b->dd = dd;
    b->max_rows = max_rows;
    b->max_ctx = max_ctx;
    b->depth_rows = depth_rows;
    if (kind == TALKER_BACKEND_CPU) {
        b->name = "cpu";
        return cpu_open(b, max_rows, max_ctx, depth_rows);
    }
    b->name = "cuda";
#ifdef MM3_HAVE_CUDA
    if (cuda_device_count_safe() < 1)
        return mm3_errorf(-ENODEV,
                          "backend cuda: not available in this build or on this machine (no CUDA device found)");
    return gpu_open(b, max_rows, max_ctx, depth_rows);
#else
    (void)max_rows, (void)max_ctx, (void)depth_rows;
    return mm3_errorf(-ENODEV, "backend cuda: this build has no CUDA support (configure with -DMM3_CUDA=ON)");
#endif
}

int talker_backend_graphs_enable(struct talker_backend *b, const int *sizes, int n_sizes, int warmups)
{
#ifdef MM3_HAVE_CUDA
    if (b->kind == TALKER_BACKEND_CUDA && b->impl) {
        struct cuda_impl *c = b->impl;
        int rc = talker_cuda_graphs_enable(c->tc, sizes, n_sizes, warmups);
        /* The batched sampling step follows the same switch (one graph per pair count). */
        if (rc == 0 && c->fc) rc = frame_cuda_graphs_enable(c->fc, warmups);
        return rc;
    }
#endif
    (void)b, (void)sizes, (void)n_sizes, (void)warmups;
    return 0;
}

void talker_backend_counts(const struct talker_backend *b, struct talker_backend_counts *out)
{
    memset(out, 0, sizeof *out);
#ifdef MM3_HAVE_CUDA
    if (b->kind == TALKER_BACKEND_CUDA && b->impl) {
        const struct cuda_impl *c = b->impl;
        talker_cuda_graph_stats(c->tc, &out->forward_graphs, &out->forward_replays);
        frame_cuda_graph_stats(c->fc, &out->sample_graphs, &out->sample_replays);
        frame_cuda_ahead_stats(c->fc, &out->ahead_queued, &out->ahead_taken);
    }
#else
    (void)b;
#endif
}

int talker_backend_decode_pairs(const struct talker_backend *b, const struct talker_decode_in *in,
                                const struct talker_pairs_out *out)
{
    if (!b->sample_pairs) return mm3_errorf(-EINVAL, "talker backend %s: no batched sampling step", b->name);
    if (b->decode_pairs) {
        int rc = b->decode_pairs(b->impl, in, out);
        if (rc <= 0) return rc;
    }
    int n = in->pairs.n;
    int rc = b->forward(b->impl, 2 * n, in->row, in->pos, in->emb, out->hidden);
    if (rc < 0) return rc;
    struct talker_pairs_in pairs = in->pairs;
    pairs.hidden = out->hidden;
    return b->sample_pairs(b->impl, &pairs, out);
}

void talker_backend_replay_ms(const struct talker_backend *b, double *forward_ms, double *sample_ms)
{
    *forward_ms = 0;
    *sample_ms = 0;
#ifdef MM3_HAVE_CUDA
    if (b->kind == TALKER_BACKEND_CUDA && b->impl) {
        const struct cuda_impl *c = b->impl;
        *forward_ms = talker_cuda_replay_ms(c->tc);
        *sample_ms = frame_cuda_replay_ms(c->fc);
    }
#else
    (void)b;
#endif
}

void talker_backend_close(struct talker_backend *b)
{
    if (b->destroy) b->destroy(b->impl);
    memset(b, 0, sizeof *b);
}

/* ---- memory plan: mirrors what talker_cuda_create / depth_cuda_create allocate ---- */

void talker_backend_plan_compute(enum talker_backend_kind kind, const struct talker *lm, const struct depth *dd,
                                 int rows, int ctx, struct talker_backend_plan *p)
{
    talker_backend_plan_compute_kv(kind, MM3_KV_CACHE_AUTO, lm, dd, rows, ctx, p);
}

void talker_backend_plan_compute_kv(enum talker_backend_kind kind, enum mm3_kv_cache_dtype kv_dtype,
                                    const struct talker *lm, const struct depth *dd, int rows, int ctx,
                                    struct talker_backend_plan *p)
{
    const struct talker_config *c = &lm->cfg;
    const struct depth_config *e = &dd->cfg;
    /* The GPU keeps matrices in bf16 (2 bytes); the CPU computes from float32 copies. */
    size_t w = kind == TALKER_BACKEND_CUDA ? 2 : 4;
    size_t H = (size_t)c->hidden, F = (size_t)c->ffn, D = (size_t)c->head_dim;
    size_t QD = (size_t)c->n_heads * D, KD = (size_t)c->n_kv_heads * D;
    size_t lm_mats = (QD * H + 2 * KD * H + H * QD + 3 * F * H) * (size_t)c->n_layers + (size_t)SAMPLER_C0_COLS * H;
    size_t lm_vecs = (2 * H + 2 * D) * (size_t)c->n_layers + H + D / 2;
    size_t EH = (size_t)e->hidden, EF = (size_t)e->ffn, nres = (size_t)(e->n_codebooks - 1);
    size_t dd_mats = (4 * EH * EH + 3 * EF * EH) * (size_t)e->n_layers + EH * EH + nres * (size_t)e->audio_vocab * EH;
    size_t dd_vecs = 2 * EH * (size_t)e->n_layers + (size_t)e->max_pos * EH + EH;
    memset(p, 0, sizeof *p);
    p->rows = rows;
    p->ctx = ctx;
    p->weights_bytes = (lm_mats + dd_mats) * w + (lm_vecs + dd_vecs) * sizeof(float);
    if (kind == TALKER_BACKEND_CPU) /* the embedding tables stay on the host; the CPU computes from them */
        p->weights_bytes += ((size_t)c->vocab * H + nres * (size_t)e->audio_vocab * EH) * sizeof(float);
    else { /* the batched frame step's copies: c0 rows of embed_tokens and audio_embeddings as bf16 */
        p->weights_bytes += ((size_t)SAMPLER_N_CODES * H + nres * (size_t)e->audio_vocab * EH) * 2;
        /* the depth decoder's projected inputs of positions 2.. and their layer-0 Q|K|V
         * (depth_cuda_input_table, depth_cuda_qkv_table), float32 */
        if (e->n_codebooks > 2) p->weights_bytes += (nres - 1) * (size_t)e->audio_vocab * 4 * EH * sizeof(float);
    }
    p->kv_dtype = talker_backend_kv_dtype(kind, kv_dtype);
    size_t kv_elem = p->kv_dtype == MM3_KV_CACHE_BF16 ? 2 : sizeof(float);
    p->kv_bytes_per_row = 2 * (size_t)c->n_layers * (size_t)ctx * KD * kv_elem;
    /* Talker activations for a 32-token slice (grown with the batch: h, a, o, fused
     * QKV, fused gate|up, silu out, logits), the depth cache of `rows` rows (the
     * scheduler's batched frame step) with its activations and the frame step's
     * logits: small next to the cache. */
    size_t big = QD > H ? QD : H, tok = 32;
    size_t act = tok * (H + 2 * big + QD + 2 * KD + 3 * F + SAMPLER_C0_COLS) * sizeof(float);
    size_t dact = (size_t)rows *
                  ((size_t)e->n_layers * (size_t)e->n_codebooks * EH * 2 + 10 * EH + 2 * EF +
                   2 * (size_t)e->audio_vocab + SAMPLER_C0_COLS) *
                  sizeof(float);
    /* The depth decoder's second position block (two positions per pass). */
    const int pair_rows = DEPTH_CUDA_PAIR_MAX_ROWS;
    dact += (size_t)(rows < pair_rows ? rows : pair_rows) * (7 * EH + 3 * EF) * sizeof(float);
    p->workspace_bytes = act + dact;
    p->total_bytes = p->weights_bytes + (size_t)rows * p->kv_bytes_per_row + p->workspace_bytes;
}

int talker_backend_device_memory(size_t *free_bytes, size_t *total_bytes)
{
#ifdef MM3_HAVE_CUDA
    if (cuda_device_count_safe() < 1)
        return mm3_errorf(-ENODEV,
                          "backend cuda: not available in this build or on this machine (no CUDA device found)");
    return stage0_cuda_device_memory(free_bytes, total_bytes);
#else
    (void)free_bytes, (void)total_bytes;
    return mm3_errorf(-ENODEV, "backend cuda: not available in this build or on this machine");
#endif
}

static double mib(size_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

int talker_backend_plan_fits(const struct talker_backend_plan *p, double utilization, size_t total_bytes)
{
    return (double)p->total_bytes <= (double)total_bytes * utilization;
}

int talker_backend_plan_check(enum talker_backend_kind kind, const struct talker_backend_plan *p, double utilization)
{
    if (kind == TALKER_BACKEND_CPU) {
        LOG_INFO("memory plan (cpu): weights %.1f MiB + KV (%s) %.3f MiB/row x %d rows (ctx %d) + workspace %.1f "
                 "MiB = %.1f MiB of host memory",
                 mib(p->weights_bytes), mm3_kv_cache_dtype_name(p->kv_dtype), mib(p->kv_bytes_per_row), p->rows, p->ctx,
                 mib(p->workspace_bytes), mib(p->total_bytes));
        return 0;
    }
    size_t free_b = 0, total_b = 0;
    int rc = talker_backend_device_memory(&free_b, &total_b);
    if (rc < 0) return rc;
    double budget = (double)total_b * utilization;
    LOG_INFO("memory plan (cuda): weights %.1f MiB + KV (%s) %.3f MiB/row x %d rows (ctx %d) + workspace %.1f MiB "
             "+ adapters %.1f MiB = %.1f MiB; budget %g x %.1f MiB device = %.1f MiB (%.1f MiB free now)",
             mib(p->weights_bytes), mm3_kv_cache_dtype_name(p->kv_dtype), mib(p->kv_bytes_per_row), p->rows, p->ctx,
             mib(p->workspace_bytes), mib(p->adapter_bytes), mib(p->total_bytes), utilization, mib(total_b),
             budget / (1024.0 * 1024.0), mib(free_b));
    if (!talker_backend_plan_fits(p, utilization, total_b) || p->total_bytes > free_b)
        return mm3_errorf(
            -ENOMEM,
            "stage 0 on the GPU does not fit: weights %.1f MiB + KV (%s) %.3f MiB/row x %d rows (max_num_seqs, "
            "ctx %d = max_model_len) + workspace %.1f MiB + adapters %.1f MiB (lora_modules) = %.1f MiB, but "
            "gpu_memory_utilization %g x %.1f MiB device = %.1f MiB (%.1f MiB free now); lower max_num_seqs or "
            "max_model_len",
            mib(p->weights_bytes), mm3_kv_cache_dtype_name(p->kv_dtype), mib(p->kv_bytes_per_row), p->rows, p->ctx,
            mib(p->workspace_bytes), mib(p->adapter_bytes), mib(p->total_bytes), utilization, mib(total_b),
            budget / (1024.0 * 1024.0), mib(free_b));
    return 0;
}
