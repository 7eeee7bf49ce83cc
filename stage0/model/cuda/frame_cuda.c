#include "stage0/model/cuda/frame_cuda.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda/ops_cuda.h"
#include "common/cuda/sampler_cuda.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/sampler.h"
#include "stage0/model/cuda/cuda_upload.h"
#include "stage0/model/cuda/frame_kernels.h"
#include "stage0/model/cuda/host_pinned.h"

/* Where each array of a step's upload / download sits in one block (offsets in
 * bytes, 256-aligned so every array suits the 16-byte vector loads). */
struct frame_in_layout {
    size_t hidden, seed, scale, pos, mask, bytes;
};

/* codes and feedback first: a decode step downloads them on their own (what the next
 * step needs), then the depth hiddens; a decode step's LM hidden pairs follow at
 * `hidden` in the host block only. */
struct frame_out_layout {
    size_t codes, feedback, depth_hidden, bytes, hidden, host_bytes;
};

/* A decode step queued before it was asked for (frame_cuda_decode_pairs): the pairs of
 * the step before that go on, one token further. Its inputs, to compare with the call
 * that comes. */
struct frame_ahead {
    int queued, slot, n, top_k;
    int *row, *pos, *step; /* [2P], [2P], [P] */
    uint64_t *seed;        /* [P] */
    float *scale, *emb;    /* [P], [2P][hidden] */
    unsigned char *ignore; /* [P], 0 or 1 */
};

/* One captured sampling step: the chain's launches depend on n (sizes, layouts)
 * and top_k (a kernel argument), nothing else of a call. */
struct frame_graph {
    int n, top_k, runs; /* runs: eager warm-up runs so far */
    void *exec;         /* NULL until captured */
};

struct frame_cuda {
    int max_pairs, hidden, ncb, vocab;
    struct cuda_alloc_list mem;
    const uint16_t *e0;    /* [SAMPLER_N_CODES][hidden]: embed_tokens rows of the c0 codes */
    const uint16_t *audio; /* [n_codebooks-1][vocab][hidden] */
    float feedback_scale;
    void *in_dev, *out_dev;            /* one block each, laid out per call for n pairs */
    unsigned char *in_host;            /* page-locked, for the asynchronous copies */
    unsigned char *out_host[2];        /* the same, the outputs of a step and of the one after */
    float *logits, *dlogits, *x, *y;   /* [2P][C0], [2P][vocab], [2P][hidden] x 2 */
    /* CUDA graphs (frame_cuda_graphs_enable): stream NULL = eager on the default stream. */
    void *stream;
    struct frame_graph *graphs;
    int n_graphs, cap_graphs, warmups, n_captured;
    long n_replays;
    struct cuda_graph_timer timer; /* the replays' GPU time (MM3_GRAPH_TIMING=1) */
    int replayed;                  /* the last call's step was a replay */
    void *fwd_done; /* frame_cuda_decode_pairs: the forward's hiddens are ready */
    /* Per download block: its codes and feedback have landed; all of its step has. */
    void *codes_done[2], *frames_done[2];
    struct frame_ahead ahead;
    int next_slot;               /* the download block of the next step not queued ahead */
    long n_ahead, n_ahead_taken; /* steps queued ahead; those a call then asked for */
};

static size_t align256(size_t b)
{
    return (b + 255) & ~(size_t)255;
}

static struct frame_in_layout in_layout(int n, int H, int ncb)
{
    struct frame_in_layout l;
    l.hidden = 0;
    l.seed = align256(sizeof(float) * 2 * (size_t)n * H);
    l.scale = l.seed + align256(sizeof(uint64_t) * n);
    l.pos = l.scale + align256(sizeof(float) * n);
    l.mask = l.pos + align256(sizeof(uint32_t) * (size_t)ncb * n);
    l.bytes = l.mask + align256((size_t)n);
    return l;
}

static struct frame_out_layout out_layout(int n, int H, int ncb)
{
    struct frame_out_layout l;
    l.codes = 0;
    l.feedback = align256(sizeof(int32_t) * (size_t)n * ncb);
    l.depth_hidden = l.feedback + align256(sizeof(float) * (size_t)n * H);
    l.bytes = l.depth_hidden + sizeof(float) * (size_t)n * (ncb - 1) * H;
    l.hidden = align256(l.bytes);
    l.host_bytes = l.hidden + sizeof(float) * 2 * (size_t)n * H;
    return l;
}

/* Whether src[n] survives the bf16 round trip bit for bit. */
static int exact_bf16(const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float b = mm3_bf16_to_f32(mm3_f32_to_bf16(src[i]));
        if (memcmp(&b, &src[i], sizeof b) != 0) return 0;
    }
    return 1;
}

int frame_cuda_create(struct frame_cuda **out, const struct talker *lm, const struct depth *dd, int max_pairs)
{
    *out = NULL;
    int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks, V = dd->cfg.audio_vocab;
    if (max_pairs < 1) return mm3_errorf(-EINVAL, "frame_cuda_create: %d pairs, expected >= 1", max_pairs);
    /* Models the AR loop cannot run (generate.c refuses them with a message) and the
     * half-built models of the kernel tests get no batched step, and no error here. */
    if (dd->cfg.hidden != H || ncb < 2 || lm->cfg.vocab < SAMPLER_CODE_OFFSET + SAMPLER_N_CODES || !lm->embed ||
        !dd->audio_emb)
        return 0;
    const float *e0 = lm->embed + (size_t)SAMPLER_CODE_OFFSET * H;
    size_t n_e0 = (size_t)SAMPLER_N_CODES * H, n_audio = (size_t)(ncb - 1) * V * H;
    if (!exact_bf16(e0, n_e0) || !exact_bf16(dd->audio_emb, n_audio)) return 0;
    int max_cols = frame_cuda_draw_take_max_cols();
    if (SAMPLER_C0_COLS > max_cols || V > max_cols) return 0; /* rows too wide for the GPU draw */
    struct frame_cuda *fc = calloc(1, sizeof *fc);
    if (!fc) return mm3_errorf(-ENOMEM, "frame_cuda_create: out of memory");
    fc->max_pairs = max_pairs;
    fc->hidden = H;
    fc->ncb = ncb;
    fc->vocab = V;
    fc->feedback_scale = (float)pow((double)ncb, -0.5); /* as talker_feedback_embedding */
    struct cuda_alloc_list *l = &fc->mem;
    size_t R = 2 * (size_t)max_pairs;
    uint16_t *w;
    int rc;
    struct cuda_upload u;
    cuda_upload_begin(&u, l, NULL);
    if ((rc = cuda_upload_host_rows(&u, &w, e0, SAMPLER_N_CODES, (size_t)H)) == 0) fc->e0 = w;
    if (rc == 0 && (rc = cuda_upload_host_rows(&u, &w, dd->audio_emb, (size_t)(ncb - 1) * V, (size_t)H)) == 0)
        fc->audio = w;
    rc = cuda_upload_end(&u, rc);
    struct frame_in_layout il = in_layout(max_pairs, H, ncb);
    struct frame_out_layout ol = out_layout(max_pairs, H, ncb);
    if (rc == 0) rc = cuda_alloc_list_add(l, &fc->in_dev, il.bytes);
    if (rc == 0) rc = cuda_alloc_list_add(l, &fc->out_dev, ol.bytes);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->logits, sizeof(float) * R * SAMPLER_C0_COLS);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->dlogits, sizeof(float) * R * V);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->x, sizeof(float) * R * H);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->y, sizeof(float) * R * H);
    void *h;
    if (rc == 0 && (rc = host_pinned_alloc(&h, il.bytes)) == 0) fc->in_host = h;
    for (int k = 0; k < 2 && rc == 0; k++)
        if ((rc = host_pinned_alloc(&h, ol.host_bytes)) == 0) fc->out_host[k] = h;
    if (rc < 0) {
        frame_cuda_destroy(fc);
        return rc;
    }
    *out = fc;
    return 0;
}

static void ahead_free(struct frame_ahead *a)
{
    free(a->row), free(a->pos), free(a->step), free(a->seed), free(a->scale), free(a->emb), free(a->ignore);
    memset(a, 0, sizeof *a);
}

void frame_cuda_destroy(struct frame_cuda *fc)
{
    if (!fc) return;
    (void)frame_cuda_ahead_drop(fc); /* its copies write the pinned blocks freed below */
    ahead_free(&fc->ahead);
    for (int k = 0; k < 2; k++) {
        cuda_event_destroy(fc->codes_done[k]);
        cuda_event_destroy(fc->frames_done[k]);
        host_pinned_free(fc->out_host[k]);
    }
    for (int i = 0; i < fc->n_graphs; i++)
        cuda_graph_destroy(fc->graphs[i].exec);
    free(fc->graphs);
    cuda_graph_timer_free(&fc->timer);
    cuda_event_destroy(fc->fwd_done);
    if (fc->stream) cuda_stream_destroy(fc->stream);
    cuda_alloc_list_free(&fc->mem);
    host_pinned_free(fc->in_host);
    free(fc);
}

int frame_cuda_graphs_enable(struct frame_cuda *fc, int warmups)
{
    if (fc->stream) return mm3_errorf(-EINVAL, "frame_cuda_graphs_enable: graphs already enabled");
    if (warmups < 0) return mm3_errorf(-EINVAL, "frame_cuda_graphs_enable: %d warm-ups, expected >= 0", warmups);
    int rc = cuda_stream_create(&fc->stream);
    if (rc == 0) rc = cuda_event_create(&fc->fwd_done);
    for (int k = 0; k < 2 && rc == 0; k++)
        if ((rc = cuda_event_create(&fc->codes_done[k])) == 0) rc = cuda_event_create(&fc->frames_done[k]);
    if (rc == 0) rc = cuda_graph_timer_init(&fc->timer);
    if (rc < 0) return rc; /* the events are freed by frame_cuda_destroy */
    struct frame_ahead *a = &fc->ahead;
    size_t P = (size_t)fc->max_pairs;
    a->row = malloc(sizeof(int) * 2 * P), a->pos = malloc(sizeof(int) * 2 * P), a->step = malloc(sizeof(int) * P);
    a->seed = malloc(sizeof(uint64_t) * P), a->scale = malloc(sizeof(float) * P), a->ignore = malloc(P);
    a->emb = malloc(sizeof(float) * 2 * P * fc->hidden);
    if (!a->row || !a->pos || !a->step || !a->seed || !a->scale || !a->ignore || !a->emb) {
        ahead_free(a);
        return mm3_errorf(-ENOMEM, "frame_cuda_graphs_enable: out of memory");
    }
    fc->warmups = warmups;
    return 0;
}

void frame_cuda_ahead_stats(const struct frame_cuda *fc, long *queued, long *taken)
{
    *queued = fc ? fc->n_ahead : 0;
    *taken = fc ? fc->n_ahead_taken : 0;
}

float frame_cuda_replay_ms(struct frame_cuda *fc)
{
    return fc && fc->replayed ? cuda_graph_timer_ms(&fc->timer) : 0.0f;
}

void frame_cuda_graph_stats(const struct frame_cuda *fc, int *captured, long *replays)
{
    *captured = fc ? fc->n_captured : 0;
    *replays = fc ? fc->n_replays : 0;
}

/* A call's inputs into the pinned host block, at the offsets of in_layout(n). */
static struct frame_in_layout pack_inputs(struct frame_cuda *fc, const struct talker_pairs_in *in)
{
    int n = in->n, H = fc->hidden, ncb = fc->ncb;
    struct frame_in_layout l = in_layout(n, H, ncb);
    unsigned char *b = fc->in_host;
    if (in->hidden) memcpy(b + l.hidden, in->hidden, sizeof(float) * 2 * (size_t)n * H);
    memcpy(b + l.seed, in->seed, sizeof(uint64_t) * n);
    memcpy(b + l.scale, in->cfg_scale, sizeof(float) * n);
    uint32_t *pos = (uint32_t *)(b + l.pos);
    for (int j = 0; j < ncb; j++)
        for (int p = 0; p < n; p++)
            pos[(size_t)j * n + p] = (uint32_t)(ncb * in->step[p] + j);
    for (int p = 0; p < n; p++)
        b[l.mask + p] = in->ignore_stop && in->ignore_stop[p] ? 1 : 0;
    return l;
}

/* Every launch of a step of n pairs after the upload, on `stream`. Its arguments are
 * fixed for (n, top_k): device addresses of fc, tc and dc, the layouts of n, the
 * depth position j of each step; every per-call value (hidden pair, seeds, scales,
 * positions, masks) is read from in_dev. So the chain can be captured once per
 * (n, top_k) and replayed. No sync, no allocation outside the stream-ordered ones. */
static int queue_step(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc, int n, int top_k,
                      void *stream)
{
    int H = fc->hidden, ncb = fc->ncb, V = fc->vocab, R = 2 * n, rc;
    struct frame_in_layout il = in_layout(n, H, ncb);
    struct frame_out_layout ol = out_layout(n, H, ncb);
    unsigned char *ib = fc->in_dev, *ob = fc->out_dev;
    const float *hidden = (const float *)(ib + il.hidden), *scale = (const float *)(ib + il.scale);
    const uint64_t *seed = (const uint64_t *)(ib + il.seed);
    const uint32_t *pos = (const uint32_t *)(ib + il.pos);
    const unsigned char *mask = ib + il.mask;
    int32_t *codes = (int32_t *)(ob + ol.codes);
    float *dh = (float *)(ob + ol.depth_hidden), *fb = (float *)(ob + ol.feedback);
    size_t dh_stride = (size_t)(ncb - 1) * H;
    /* c0: head on all 2n rows, guide + draw; then positions 0 (the LM hidden pair) and
     * 1 (c0's embedding) of the depth decoder, in one pass where it fits (the weights
     * read once, as the reference's first depth call), else one pass each. The draw's
     * kernel also writes what the next pass reads: the drawn code's embedding, and for
     * the two-position pass the LM hidden pair, into the depth decoder's input rows. */
    const int step01 = depth_cuda_step01_fits(dc, R);
    /* raw: the depth decoder's final norm inside the head's product and the draw's kernel */
    const int raw = depth_cuda_raw_fits(dc, R, 1) && (!step01 || depth_cuda_raw_fits(dc, R, 2));
    float *in01 = step01 ? depth_cuda_step01_inputs(dc, R) : NULL;
    /* Positions 2.. from the depth decoder's tables where it has them: the draw writes the
     * rows the next pass starts from (its input, and layer 0's Q|K|V where tabulated), so
     * the pass skips the projection and that product. */
    const float *in_tab = depth_cuda_input_table(dc), *qkv_tab = depth_cuda_qkv_table(dc);
    float norm_eps = 0.0f;
    const float *norm_w = raw ? depth_cuda_norm_weight(dc, &norm_eps) : NULL;
    struct frame_draw_take d = {.logits = fc->logits,
                                .n_cols = SAMPLER_C0_COLS,
                                .c0_rule = 1,
                                .top_k = top_k,
                                .scale = scale,
                                .seed = seed,
                                .pos = pos,
                                .mask_col0 = mask,
                                .codes = codes,
                                .ncb = ncb,
                                .j = 0,
                                .width = H,
                                .table = fc->e0,
                                .table_rows = SAMPLER_N_CODES,
                                .col_offset = -1,
                                .x = step01 ? in01 + (size_t)R * H : fc->x,
                                .copy_dst = in01,
                                .copy_src = step01 ? hidden : NULL};
    if ((rc = talker_cuda_head_dev(tc, hidden, R, fc->logits, stream)) < 0 ||
        (rc = frame_cuda_draw_take(&d, n, stream)) < 0 ||
        (!step01 && (rc = depth_cuda_step_dev(dc, R, hidden, 0, fc->y, stream)) < 0))
        return rc;
    for (int j = 1; j < ncb; j++) {
        const int two = j == 1 && step01;
        float *out = raw ? NULL : fc->y;
        const float *h = raw ? depth_cuda_raw_rows(dc, R, two ? 2 : 1) : fc->y;
        d = (struct frame_draw_take){.logits = fc->dlogits,
                                     .n_cols = V,
                                     .c0_rule = 0,
                                     .top_k = top_k,
                                     .scale = scale,
                                     .seed = seed,
                                     .pos = pos + (size_t)j * n,
                                     .codes = codes,
                                     .ncb = ncb,
                                     .j = j,
                                     .width = H,
                                     .table = j < ncb - 1 && !in_tab ? fc->audio + (size_t)(j - 1) * V * H : NULL,
                                     .table_f32 = j < ncb - 1 && in_tab ? in_tab + (size_t)(j - 1) * V * H : NULL,
                                     .table_rows = V,
                                     .x = in_tab ? depth_cuda_projected_inputs(dc) : fc->x,
                                     .table2 = j < ncb - 1 && qkv_tab ? qkv_tab + (size_t)(j - 1) * V * 3 * H : NULL,
                                     .x2 = depth_cuda_projected_qkv(dc),
                                     .width2 = 3 * H,
                                     .dh = dh + (size_t)(j - 1) * H,
                                     .dh_stride = dh_stride,
                                     .h = h,
                                     .norm_w = norm_w,
                                     .eps = norm_eps};
        if ((rc = two                ? depth_cuda_step01_dev(dc, R, in01, in01 + (size_t)R * H, out, stream)
                  : in_tab && j >= 2 ? depth_cuda_step_projected_dev(dc, R, j, out, stream)
                                     : depth_cuda_step_dev(dc, R, fc->x, j, out, stream)) < 0 ||
            (rc = raw ? depth_cuda_logits_raw_dev(dc, j, h, R, fc->dlogits, stream)
                      : depth_cuda_logits_dev(dc, j, fc->y, R, fc->dlogits, stream)) < 0 ||
            (rc = frame_cuda_draw_take(&d, n, stream)) < 0)
            return rc;
    }
    const struct frame_feedback_tables t = {
        .e0 = fc->e0, .e0_rows = SAMPLER_N_CODES, .audio = fc->audio, .V = V, .width = H, .scale = fc->feedback_scale};
    return frame_cuda_feedback(fb, codes, ncb, n, &t, stream);
}

/* The graph of (n, top_k), added (not yet captured) when new. */
static int graph_get(struct frame_cuda *fc, int n, int top_k, struct frame_graph **out)
{
    for (int i = 0; i < fc->n_graphs; i++)
        if (fc->graphs[i].n == n && fc->graphs[i].top_k == top_k) {
            *out = &fc->graphs[i];
            return 0;
        }
    if (fc->n_graphs == fc->cap_graphs) {
        int cap = fc->cap_graphs ? 2 * fc->cap_graphs : fc->max_pairs;
        struct frame_graph *g = realloc(fc->graphs, sizeof *g * (size_t)cap);
        if (!g) return mm3_errorf(-ENOMEM, "frame_cuda_sample_pairs: out of memory for a graph of %d pairs", n);
        fc->graphs = g;
        fc->cap_graphs = cap;
    }
    struct frame_graph *g = &fc->graphs[fc->n_graphs++];
    memset(g, 0, sizeof *g);
    g->n = n;
    g->top_k = top_k;
    *out = g;
    return 0;
}

/* Eager warm-ups on the graph stream (lazy initialisations happen outside a
 * capture), then one capture, then replays. */
static int run_graph(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc, int n, int top_k)
{
    struct frame_graph *gr = NULL;
    int rc = graph_get(fc, n, top_k, &gr);
    if (rc < 0) return rc;
    if (!gr->exec && gr->runs >= fc->warmups) {
        if ((rc = cuda_graph_capture_begin(fc->stream)) < 0) return rc;
        rc = queue_step(fc, tc, dc, n, top_k, fc->stream);
        void *exec = NULL;
        int rc_end = cuda_graph_capture_end(fc->stream, &exec);
        if (rc < 0 || rc_end < 0) {
            cuda_graph_destroy(exec);
            return rc < 0 ? rc : rc_end;
        }
        gr->exec = exec;
        fc->n_captured++;
    }
    fc->replayed = gr->exec != NULL;
    if (gr->exec) {
        fc->n_replays++;
        return cuda_graph_launch_timed(&fc->timer, gr->exec, fc->stream);
    }
    gr->runs++;
    return queue_step(fc, tc, dc, n, top_k, fc->stream);
}

/* After a failed graph-path call: wait for what was queued (the next call rewrites
 * the pinned blocks the queued copies read and write), keeping the first message. */
static int drain_failed(struct frame_cuda *fc, int rc)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mm3_last_error());
    (void)cuda_stream_sync(fc->stream);
    return mm3_errorf(rc, "%s", msg);
}

static int check_pairs(const struct frame_cuda *fc, const char *what, const struct talker_pairs_in *in)
{
    if (in->n < 1 || in->n > fc->max_pairs)
        return mm3_errorf(-EINVAL, "%s: %d pairs, expected 1..%d", what, in->n, fc->max_pairs);
    for (int p = 0; p < in->n; p++)
        if (in->step[p] < 0) return mm3_errorf(-EINVAL, "%s: pair %d at step %d", what, p, in->step[p]);
    return 0;
}

/* A downloaded block into the caller's arrays. */
static void copy_outputs(const struct frame_cuda *fc, int n, const unsigned char *block,
                         const struct talker_pairs_out *out)
{
    int H = fc->hidden, ncb = fc->ncb;
    struct frame_out_layout ol = out_layout(n, H, ncb);
    memcpy(out->codes, block + ol.codes, sizeof(int32_t) * (size_t)n * ncb);
    memcpy(out->depth_hidden, block + ol.depth_hidden, sizeof(float) * (size_t)n * (ncb - 1) * H);
    memcpy(out->feedback, block + ol.feedback, sizeof(float) * (size_t)n * H);
}

/* Queue decode step `in` with its outputs into download block `slot`: the forward as a
 * graph replay, the sampling inputs, the hand-over of the hidden pairs on the GPU, the
 * step's graph, then codes and feedback (codes_done[slot]), then the depth hiddens and
 * the hidden pairs (frames_done[slot]). No wait. 1: no forward graph for 2n rows,
 * nothing queued. */
static int queue_decode(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc,
                        const struct talker_decode_in *in, int slot)
{
    const struct talker_pairs_in *pairs = &in->pairs;
    int n = pairs->n, rc;
    const float *hidden_dev = NULL;
    if ((rc = talker_cuda_forward_queued(tc, 2 * n, in->row, in->pos, in->emb, &hidden_dev, fc->fwd_done)) != 0)
        return rc;
    struct frame_in_layout il = pack_inputs(fc, pairs);
    struct frame_out_layout ol = out_layout(n, fc->hidden, fc->ncb);
    size_t hidden_bytes = sizeof(float) * 2 * (size_t)n * fc->hidden;
    unsigned char *in_dev = fc->in_dev, *out_dev = fc->out_dev, *block = fc->out_host[slot];
    if ((rc = host_pinned_h2d_async(in_dev + il.seed, fc->in_host + il.seed, il.bytes - il.seed, fc->stream)) < 0 ||
        (rc = cuda_stream_wait_event(fc->stream, fc->fwd_done)) < 0 ||
        (rc = cuda_memcpy_d2d(in_dev + il.hidden, hidden_dev, hidden_bytes, fc->stream)) < 0 ||
        (rc = run_graph(fc, tc, dc, n, pairs->top_k)) < 0 ||
        (rc = host_pinned_d2h_async(block, out_dev, ol.depth_hidden, fc->stream)) < 0 ||
        (rc = cuda_event_record(fc->codes_done[slot], fc->stream)) < 0 ||
        (rc = host_pinned_d2h_async(block + ol.depth_hidden, out_dev + ol.depth_hidden, ol.bytes - ol.depth_hidden,
                                    fc->stream)) < 0 ||
        (rc = host_pinned_d2h_async(block + ol.hidden, in_dev + il.hidden, hidden_bytes, fc->stream)) < 0 ||
        (rc = cuda_event_record(fc->frames_done[slot], fc->stream)) < 0) {
        (void)cuda_event_sync(fc->fwd_done); /* the forward's staging is rewritten by the next call */
        return drain_failed(fc, rc);
    }
    return 0;
}

int frame_cuda_ahead_drop(struct frame_cuda *fc)
{
    if (!fc || !fc->ahead.queued) return 0;
    fc->ahead.queued = 0;
    return cuda_event_sync(fc->frames_done[fc->ahead.slot]);
}

/* Whether the queued look-ahead step is exactly `in`. */
static int ahead_is(const struct frame_cuda *fc, const struct talker_decode_in *in)
{
    const struct frame_ahead *a = &fc->ahead;
    const struct talker_pairs_in *p = &in->pairs;
    int n = p->n;
    if (!a->queued || a->n != n || a->top_k != p->top_k) return 0;
    for (int i = 0; i < n; i++)
        if (a->ignore[i] != (p->ignore_stop && p->ignore_stop[i] ? 1 : 0)) return 0;
    return !memcmp(a->row, in->row, sizeof(int) * 2 * (size_t)n) &&
           !memcmp(a->pos, in->pos, sizeof(int) * 2 * (size_t)n) &&
           !memcmp(a->step, p->step, sizeof(int) * (size_t)n) &&
           !memcmp(a->seed, p->seed, sizeof(uint64_t) * (size_t)n) &&
           !memcmp(a->scale, p->cfg_scale, sizeof(float) * (size_t)n) &&
           !memcmp(a->emb, in->emb, sizeof(float) * 2 * (size_t)n * fc->hidden);
}

/* After step `in`'s codes and feedback landed in block `slot`: queue the step its
 * caller asks for next if nothing changes, the pairs that go on (c0 not the stop
 * column, not in->last) one token further with the feedback as both tokens' input
 * (as generate.c's sample_finish), into the other block. */
static int ahead_queue(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc,
                       const struct talker_decode_in *in, int slot)
{
    struct frame_ahead *a = &fc->ahead;
    const struct talker_pairs_in *p = &in->pairs;
    int H = fc->hidden, ncb = fc->ncb, k = 0;
    const unsigned char *block = fc->out_host[slot];
    struct frame_out_layout ol = out_layout(p->n, H, ncb);
    const int32_t *codes = (const int32_t *)(block + ol.codes);
    const float *fb = (const float *)(block + ol.feedback);
    for (int i = 0; i < p->n; i++) {
        if (codes[(size_t)i * ncb] == 0 || in->last[i]) continue;
        for (int r = 0; r < 2; r++) {
            a->row[2 * k + r] = in->row[2 * i + r];
            a->pos[2 * k + r] = in->pos[2 * i + r] + 1;
            memcpy(a->emb + (2 * (size_t)k + r) * H, fb + (size_t)i * H, sizeof(float) * H);
        }
        a->step[k] = p->step[i] + 1;
        a->seed[k] = p->seed[i];
        a->scale[k] = p->cfg_scale[i];
        a->ignore[k] = p->ignore_stop && p->ignore_stop[i] ? 1 : 0;
        k++;
    }
    if (k == 0) return 0;
    a->n = k;
    a->top_k = p->top_k;
    struct talker_decode_in next = {.pairs = {.n = k,
                                              .seed = a->seed,
                                              .step = a->step,
                                              .cfg_scale = a->scale,
                                              .ignore_stop = a->ignore,
                                              .top_k = p->top_k},
                                    .row = a->row,
                                    .pos = a->pos,
                                    .emb = a->emb};
    int rc = queue_decode(fc, tc, dc, &next, slot ^ 1);
    if (rc < 0) return rc;
    a->queued = rc == 0;
    fc->n_ahead += a->queued;
    a->slot = slot ^ 1;
    return 0;
}

/* frame_cuda_set_look_ahead: on unless a test turns it off. */
static int look_ahead = 1;

void frame_cuda_set_look_ahead(int on)
{
    __atomic_store_n(&look_ahead, on != 0, __ATOMIC_RELAXED);
}

int frame_cuda_decode_pairs(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc,
                            const struct talker_decode_in *in, const struct talker_pairs_out *out)
{
    const struct talker_pairs_in *pairs = &in->pairs;
    int n = pairs->n, rc, slot;
    if (!fc->stream) return 1;
    if ((rc = check_pairs(fc, "frame_cuda_decode_pairs", pairs)) < 0) return rc;
    if (ahead_is(fc, in)) {
        slot = fc->ahead.slot;
        fc->ahead.queued = 0;
        fc->n_ahead_taken++;
    } else {
        if ((rc = frame_cuda_ahead_drop(fc)) < 0) return drain_failed(fc, rc);
        slot = fc->next_slot;
        if ((rc = queue_decode(fc, tc, dc, in, slot)) != 0) return rc; /* 1: no graph, nothing queued */
    }
    fc->next_slot = slot ^ 1;
    if ((rc = cuda_event_sync(fc->codes_done[slot])) < 0) return drain_failed(fc, rc);
    /* The next step goes to the GPU before this one's frames are copied out and handed
     * on, so the host's work on them (here and the caller's) overlaps it. */
    if (in->last && __atomic_load_n(&look_ahead, __ATOMIC_RELAXED) && (rc = ahead_queue(fc, tc, dc, in, slot)) < 0)
        return rc;
    if ((rc = cuda_event_sync(fc->frames_done[slot])) < 0) {
        fc->ahead.queued = 0;
        return drain_failed(fc, rc);
    }
    const unsigned char *block = fc->out_host[slot];
    copy_outputs(fc, n, block, out);
    memcpy(out->hidden, block + out_layout(n, fc->hidden, fc->ncb).hidden, sizeof(float) * 2 * (size_t)n * fc->hidden);
    return 0;
}

int frame_cuda_sample_pairs(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc,
                            const struct talker_pairs_in *in, const struct talker_pairs_out *out)
{
    int n = in->n, H = fc->hidden, ncb = fc->ncb;
    int rc = check_pairs(fc, "frame_cuda_sample_pairs", in);
    if (rc < 0) return rc;
    if ((rc = frame_cuda_ahead_drop(fc)) < 0) return drain_failed(fc, rc); /* its copies use the pinned blocks */
    struct frame_in_layout il = pack_inputs(fc, in);
    struct frame_out_layout ol = out_layout(n, H, ncb);
    if (!fc->stream) { /* eager, the reference: default stream, synchronous copies */
        if ((rc = cuda_memcpy_h2d(fc->in_dev, fc->in_host, il.bytes)) < 0 ||
            (rc = queue_step(fc, tc, dc, n, in->top_k, NULL)) < 0 || (rc = cuda_stream_sync(NULL)) < 0 ||
            (rc = cuda_memcpy_d2h(fc->out_host[0], fc->out_dev, ol.bytes)) < 0)
            return rc;
    } else { /* upload, the step, download on one stream; one sync */
        if ((rc = host_pinned_h2d_async(fc->in_dev, fc->in_host, il.bytes, fc->stream)) < 0 ||
            (rc = run_graph(fc, tc, dc, n, in->top_k)) < 0 ||
            (rc = host_pinned_d2h_async(fc->out_host[0], fc->out_dev, ol.bytes, fc->stream)) < 0 ||
            (rc = cuda_stream_sync(fc->stream)) < 0)
            return drain_failed(fc, rc);
    }
    copy_outputs(fc, n, fc->out_host[0], out);
    return 0;
}
