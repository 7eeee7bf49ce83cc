#include "stage0/generate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/log.h"

int generate_frame_budget(double duration_s, double frame_rate, int *max_frames)
{
    if (!(duration_s > 0) || !(frame_rate > 0))
        return mm3_errorf(-EINVAL, "duration %g s: expected a positive number of seconds", duration_s);
    double f = duration_s * frame_rate;
    /* Python int() truncation, capped before the conversion can overflow. */
    int n = f >= GENERATE_MAX_FRAMES ? GENERATE_MAX_FRAMES : (int)f;
    if (n == 0)
        return mm3_errorf(-EINVAL, "duration %g s is shorter than one audio frame (1/%g s)", duration_s, frame_rate);
    *max_frames = n;
    return 0;
}

int generate_frame_rate(const char *ckpt_root, double *fps)
{
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, ckpt_root, "condition_encoder");
    if (rc < 0) return rc;
    int64_t sr, hop;
    if ((rc = ckpt_config_int(&c, "input_sampling_rate", &sr)) == 0 &&
        (rc = ckpt_config_int(&c, "input_hop_length", &hop)) == 0) {
        if (sr <= 0 || hop <= 0)
            rc =
                mm3_errorf(-EINVAL, "%s/config.json: input_sampling_rate %lld / input_hop_length %lld must be positive",
                           c.dir, (long long)sr, (long long)hop);
        else
            *fps = (double)sr / (double)hop;
    }
    ckpt_component_close(&c);
    return rc;
}

int generate_batch_init(struct generate_batch *b, int hidden, int cap)
{
    memset(b, 0, sizeof *b);
    b->cap = cap;
    b->hidden = hidden;
    b->row = malloc(sizeof(int) * (size_t)cap);
    b->pos = malloc(sizeof(int) * (size_t)cap);
    b->emb = malloc(sizeof(float) * (size_t)cap * hidden);
    b->out = malloc(sizeof(float) * (size_t)cap * hidden);
    if (!b->row || !b->pos || !b->emb || !b->out) {
        generate_batch_free(b);
        return mm3_errorf(-ENOMEM, "generate: out of memory for a batch of %d tokens", cap);
    }
    return 0;
}

void generate_batch_free(struct generate_batch *b)
{
    free(b->row), free(b->pos), free(b->emb), free(b->out);
    memset(b, 0, sizeof *b);
}

int generate_batch_forward(const struct talker *lm, struct talker_state *ts, struct generate_batch *b)
{
    if (b->n == 0) return 0;
    return talker_forward(lm, ts, b->n, b->row, b->pos, b->emb, b->out);
}

int generate_batch_forward_backend(const struct talker_backend *be, struct generate_batch *b)
{
    if (b->n == 0) return 0;
    return be->forward(be->impl, b->n, b->row, b->pos, b->emb, b->out);
}

/* ---- the model, through the backend table or the CPU functions on ts / ds ---- */

static int model_forward(struct generate *g, int n, const int *row, const int *pos, const float *emb, float *out)
{
    if (g->be) return g->be->forward(g->be->impl, n, row, pos, emb, out);
    return talker_forward(g->lm, g->ts, n, row, pos, emb, out);
}

static int model_head(struct generate *g, const float *hidden, float *logits)
{
    if (g->be) return g->be->head_drawable(g->be->impl, hidden, 2, logits);
    talker_head_drawable(g->lm, hidden, 2, logits);
    return 0;
}

static int model_depth_step(struct generate *g, const float *x, int pos, float *out)
{
    if (g->be) return g->be->depth_step(g->be->impl, 2, x, pos, out);
    return depth_step(g->dd, &g->ds, 2, x, pos, out);
}

static int model_depth_logits(struct generate *g, int j, const float *hidden, float *logits)
{
    if (g->be) return g->be->depth_logits(g->be->impl, j, hidden, 2, logits);
    depth_logits(g->dd, j, hidden, 2, logits);
    return 0;
}

/* Checks and buffers shared by both attach flavours; rows are checked against the
 * cache they live in (max_rows x max_ctx). */
static int attach_common(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                         int max_rows, int max_ctx, int row_c, int row_u, const int32_t *ids_pair, int prompt_len,
                         int max_frames, float cfg_scale, const struct generate_hooks *hooks)
{
    int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks, V = dd->cfg.audio_vocab;
    if (dd->cfg.hidden != H)
        return mm3_errorf(-EINVAL, "depth decoder hidden_size %d differs from the language model's %d", dd->cfg.hidden,
                          H);
    if (prompt_len < 1 || prompt_len > GENERATE_MAX_PROMPT)
        return mm3_errorf(-EINVAL, "prompt of %d tokens: expected 1..%d", prompt_len, GENERATE_MAX_PROMPT);
    if (max_frames < 1 || max_frames > GENERATE_MAX_FRAMES)
        return mm3_errorf(-EINVAL, "frame budget %d: expected 1..%d", max_frames, GENERATE_MAX_FRAMES);
    if (row_c < 0 || row_u < 0 || row_c >= max_rows || row_u >= max_rows || row_c == row_u)
        return mm3_errorf(-EINVAL, "generate: rows %d/%d: expected two distinct rows below %d", row_c, row_u, max_rows);
    if (prompt_len + max_frames > max_ctx)
        return mm3_errorf(-EINVAL, "prompt of %d tokens + %d frames exceeds the %d positions of a row", prompt_len,
                          max_frames, max_ctx);
    g->lm = lm;
    g->dd = dd;
    g->sp = sp;
    g->row[0] = row_c;
    g->row[1] = row_u;
    if (hooks) g->hooks = *hooks;
    g->cfg_scale = cfg_scale;
    g->prompt_len = prompt_len;
    g->max_frames = max_frames;
    g->phase = GENERATE_PREFILL;
    size_t work = 2 * (size_t)SAMPLER_C0_COLS + SAMPLER_C0_COLS + 3 * V + 8 * (size_t)H;
    g->hidden = malloc(sizeof(float) * 2 * H);
    g->fb = malloc(sizeof(float) * 2 * H);
    g->frame = malloc(sizeof(float) * (size_t)ncb * H);
    g->work = malloc(sizeof(float) * work);
    g->codes = malloc(sizeof(int32_t) * ncb);
    g->ids = malloc(sizeof(int32_t) * 2 * (size_t)prompt_len);
    int rc;
    if (!g->hidden || !g->fb || !g->frame || !g->work || !g->codes || !g->ids) {
        rc = mm3_errorf(-ENOMEM, "generate: out of memory");
        goto fail;
    }
    memcpy(g->ids, ids_pair, sizeof(int32_t) * 2 * (size_t)prompt_len);
    return 0;
fail:
    generate_end(g);
    return rc;
}

int generate_attach(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                    struct talker_state *ts, int row_c, int row_u, const int32_t *ids_pair, int prompt_len,
                    int max_frames, float cfg_scale, const struct generate_hooks *hooks)
{
    memset(g, 0, sizeof *g);
    if (!talker_has_matrices(lm) || !depth_has_matrices(dd))
        return mm3_errorf(-EINVAL, "generate: the model was loaded for the GPU (its matrices are in the checkpoint); "
                                   "the CPU loop needs talker_load / depth_load");
    int rc = attach_common(g, lm, dd, sp, ts->max_rows, ts->max_ctx, row_c, row_u, ids_pair, prompt_len, max_frames,
                           cfg_scale, hooks);
    if (rc < 0) return rc;
    g->ts = ts;
    if (ts->row_lora) ts->row_lora[row_c] = ts->row_lora[row_u] = -1;
    if ((rc = depth_state_init(&g->ds, dd, 2)) < 0) generate_end(g);
    return rc;
}

int generate_attach_backend(struct generate *g, const struct talker_backend *be, struct sampler *sp, int row_c,
                            int row_u, const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                            const struct generate_hooks *hooks)
{
    memset(g, 0, sizeof *g);
    if (be->depth_rows < 2)
        return mm3_errorf(-EINVAL, "generate: backend %s has %d depth rows, a CFG pair needs 2", be->name,
                          be->depth_rows);
    int rc = attach_common(g, be->lm, be->dd, sp, be->max_rows, be->max_ctx, row_c, row_u, ids_pair, prompt_len,
                           max_frames, cfg_scale, hooks);
    if (rc < 0) return rc;
    g->be = be;
    /* the rows may have served a song with an adapter */
    if ((rc = generate_set_lora(g, -1)) < 0) generate_end(g);
    return rc;
}

int generate_set_lora(struct generate *g, int adapter)
{
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        if (g->be) {
            rc = talker_backend_row_lora(g->be, g->row[i], adapter);
        } else if (g->ts->row_lora) {
            int n = g->ts->lora ? g->ts->lora->n : 0;
            if (adapter < -1 || adapter >= n)
                return mm3_errorf(-EINVAL, "generate: adapter %d outside the %d loaded", adapter, n);
            g->ts->row_lora[g->row[i]] = adapter;
        } else if (adapter != -1) {
            return mm3_errorf(-EINVAL, "generate: the talker state serves no adapters");
        }
    }
    return rc;
}

int generate_feed(struct generate *g, struct generate_batch *b, int budget)
{
    int H = g->lm->cfg.hidden;
    if (g->done) return 0;
    if (budget > b->cap - b->n) budget = b->cap - b->n;
    if (g->phase == GENERATE_PREFILL) {
        int k = g->prompt_len - g->prefilled;
        if (k > budget / 2) k = budget / 2;
        if (k <= 0) return 0;
        g->fed_at = b->n;
        g->fed_k = k;
        for (int r = 0; r < 2; r++) {
            const int32_t *ids = g->ids + (size_t)r * g->prompt_len + g->prefilled;
            int at = b->n;
            int rc = talker_embed_tokens(g->lm, ids, k, b->emb + (size_t)at * H);
            if (rc < 0) {
                b->n = g->fed_at; /* drop the half-fed pair */
                g->fed_k = 0;
                g->done = 1;
                return rc;
            }
            for (int i = 0; i < k; i++) {
                b->row[at + i] = g->row[r];
                b->pos[at + i] = g->prefilled + i;
            }
            b->n += k;
        }
        return 2 * k;
    }
    if (g->phase != GENERATE_FEED || budget < 2) return 0;
    g->fed_at = b->n;
    g->fed_k = 1;
    memcpy(b->emb + (size_t)b->n * H, g->fb, sizeof(float) * 2 * H);
    for (int r = 0; r < 2; r++) {
        b->row[b->n + r] = g->row[r];
        b->pos[b->n + r] = g->prompt_len + g->step;
    }
    b->n += 2;
    return 2;
}

void generate_take(struct generate *g, const struct generate_batch *b)
{
    int H = g->lm->cfg.hidden, k = g->fed_k;
    if (k == 0) return;
    g->fed_k = 0;
    if (g->phase == GENERATE_PREFILL) {
        g->prefilled += k;
        if (g->prefilled < g->prompt_len) return;
        memcpy(g->hidden, b->out + (size_t)(g->fed_at + k - 1) * H, sizeof(float) * H);
        memcpy(g->hidden + H, b->out + (size_t)(g->fed_at + 2 * k - 1) * H, sizeof(float) * H);
    } else {
        memcpy(g->hidden, b->out + (size_t)g->fed_at * H, sizeof(float) * 2 * H);
        g->step++;
    }
    g->phase = GENERATE_SAMPLE;
}

/* The whole prompt of both rows in one forward, then ready for step 0. */
static int prefill_whole(struct generate *g)
{
    struct generate_batch b;
    int rc = generate_batch_init(&b, g->lm->cfg.hidden, 2 * g->prompt_len);
    if (rc < 0) return rc;
    if ((rc = generate_feed(g, &b, 2 * g->prompt_len)) > 0 &&
        (rc = model_forward(g, b.n, b.row, b.pos, b.emb, b.out)) == 0)
        generate_take(g, &b);
    generate_batch_free(&b);
    return rc;
}

int generate_begin(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                   const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                   const struct generate_hooks *hooks)
{
    memset(g, 0, sizeof *g);
    if (prompt_len < 1 || prompt_len > GENERATE_MAX_PROMPT)
        return mm3_errorf(-EINVAL, "prompt of %d tokens: expected 1..%d", prompt_len, GENERATE_MAX_PROMPT);
    if (max_frames < 1 || max_frames > GENERATE_MAX_FRAMES)
        return mm3_errorf(-EINVAL, "frame budget %d: expected 1..%d", max_frames, GENERATE_MAX_FRAMES);
    struct talker_state own;
    int rc = talker_state_init(&own, lm, 2, prompt_len + max_frames);
    if (rc < 0) return rc;
    rc = generate_attach(g, lm, dd, sp, &own, 0, 1, ids_pair, prompt_len, max_frames, cfg_scale, hooks);
    if (rc < 0) {
        talker_state_free(&own);
        return rc;
    }
    g->own_ts = own;
    g->ts = &g->own_ts;
    if ((rc = prefill_whole(g)) < 0) generate_end(g);
    return rc < 0 ? rc : 0;
}

int generate_begin_backend(struct generate *g, const struct talker_backend *be, struct sampler *sp,
                           const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                           const struct generate_hooks *hooks)
{
    int rc = generate_attach_backend(g, be, sp, 0, 1, ids_pair, prompt_len, max_frames, cfg_scale, hooks);
    if (rc < 0) return rc;
    if ((rc = prefill_whole(g)) < 0) generate_end(g);
    return rc < 0 ? rc : 0;
}

/* Depth decoder for one frame: c1.. into g->codes, hiddens d1.. into frame slots 1... */
static int depth_frame(struct generate *g, int s)
{
    const struct depth *dd = g->dd;
    int H = dd->cfg.hidden, V = dd->cfg.audio_vocab, ncb = dd->cfg.n_codebooks;
    float *x = g->work + 3 * (size_t)SAMPLER_C0_COLS, *y = x + 2 * H;
    float *lg = y + 2 * H, *gd = lg + 2 * V;
    int rc = model_depth_step(g, g->hidden, 0, y);
    if (rc < 0) return rc;
    const float *e = g->lm->embed + ((size_t)g->codes[0] + SAMPLER_CODE_OFFSET) * H;
    memcpy(x, e, sizeof(float) * H);
    memcpy(x + H, e, sizeof(float) * H);
    for (int j = 1; j < ncb; j++) {
        if ((rc = model_depth_step(g, x, j, y)) < 0) return rc;
        memcpy(g->frame + (size_t)j * H, y, sizeof(float) * H);
        if ((rc = model_depth_logits(g, j, y, lg)) < 0) return rc;
        if (g->cfg_scale > 1.0f)
            sampler_cfg_blend(gd, lg, lg + V, V, g->cfg_scale);
        else /* guidance off: the conditional logits as they are */
            memcpy(gd, lg, sizeof(float) * V);
        if (g->hooks.on_draw) g->hooks.on_draw(g->hooks.ctx, s, j, gd, V);
        int col;
        if ((rc = sampler_draw(g->sp, gd, V, (uint32_t)(ncb * s + j), &col)) < 0) return rc;
        g->codes[j] = col;
        if (j < ncb - 1) {
            const float *a = depth_code_embedding(dd, j, col);
            memcpy(x, a, sizeof(float) * H);
            memcpy(x + H, a, sizeof(float) * H);
        }
    }
    return 0;
}

/* The draws of a step are known (c0 column `col`, depth codes and hiddens in g->codes
 * and g->frame slots 1..): stop, emit the frame (s > 0), check the budget, and get the
 * feedback ready (fb: the embedding, or NULL to compute it on the host). */
static int sample_finish(struct generate *g, int col, const float *fb)
{
    int H = g->lm->cfg.hidden, s = g->step, rc;
    if (col == 0) {
        g->done = 1;
        g->stop = GENERATE_STOP_TOKEN;
        if (g->n_frames == 0)
            return mm3_errorf(-ENODATA, "the model drew <|audio_end|> at step %d, before the first frame", s);
        return 0;
    }
    if (s > 0) {
        memcpy(g->frame, g->hidden, sizeof(float) * H);
        if (g->hooks.on_frame) g->hooks.on_frame(g->hooks.ctx, g->n_frames, g->frame, g->codes);
        g->n_frames++;
        if (g->n_frames >= g->max_frames) {
            g->done = 1;
            g->stop = GENERATE_STOP_BUDGET;
            return 0;
        }
    }
    if (fb)
        memcpy(g->fb, fb, sizeof(float) * H);
    else if ((rc = talker_feedback_embedding(g->lm, g->dd, g->codes, g->fb)) < 0)
        return rc;
    memcpy(g->fb + H, g->fb, sizeof(float) * H);
    g->phase = GENERATE_FEED;
    return 0;
}

/* Whether the next c0 draw may not be the stop code: ignore_eos, or the song is still
 * shorter than its minimum. The mask changes no other draw, so a seeded song is the same
 * song up to where it would have stopped. */
static int stop_masked(const struct generate *g)
{
    return g->ignore_stop || g->n_frames < g->min_frames;
}

/* A failed sample ends the request and keeps its own message (a batch samples many). */
static int sample_failed(struct generate *g, int rc)
{
    g->done = 1;
    g->err = rc;
    snprintf(g->err_msg, sizeof g->err_msg, "%s", mm3_last_error());
    return rc;
}

int generate_sample(struct generate *g)
{
    if (g->done) return 0;
    g->err = 0;
    g->err_msg[0] = '\0';
    if (g->phase != GENERATE_SAMPLE)
        return mm3_errorf(-EINVAL, "generate: sample called at step %d before the hidden pair is ready", g->step);
    int ncb = g->dd->cfg.n_codebooks, s = g->step;
    float *logits = g->work, *guided = g->work + 2 * (size_t)SAMPLER_C0_COLS;
    int col, rc;
    if ((rc = model_head(g, g->hidden, logits)) < 0) return sample_failed(g, rc);
    if (g->hooks.on_c0_logits)
        g->hooks.on_c0_logits(g->hooks.ctx, s, logits, logits + SAMPLER_C0_COLS, SAMPLER_C0_COLS);
    if (g->cfg_scale > 1.0f) {
        sampler_c0_guide(guided, logits, logits + SAMPLER_C0_COLS, SAMPLER_C0_COLS, g->cfg_scale, SAMPLER_TOP_K);
    } else {
        /* Guidance off (cfg_scale <= 1): u + (c - u) * 1 is not c in float, and the
         * reference skips the blend; the unconditional row is computed but unused. */
        memcpy(guided, logits, sizeof(float) * SAMPLER_C0_COLS);
        sampler_topk_mask(guided, SAMPLER_C0_COLS, SAMPLER_TOP_K);
    }
    /* As vLLM's ignore_eos: the stop id gets no probability, everything else is untouched
     * (nan_to_num then maps it to -1e9, below every candidate the Gumbel noise can lift). */
    if (stop_masked(g)) guided[0] = -INFINITY;
    if (g->hooks.on_draw) g->hooks.on_draw(g->hooks.ctx, s, 0, guided, SAMPLER_C0_COLS);
    if ((rc = sampler_draw(g->sp, guided, SAMPLER_C0_COLS, (uint32_t)(ncb * s), &col)) < 0) return sample_failed(g, rc);
    if (col != 0) {
        g->codes[0] = col - 1;
        if ((rc = depth_frame(g, s)) < 0) return sample_failed(g, rc);
    }
    if ((rc = sample_finish(g, col, NULL)) < 0) return sample_failed(g, rc);
    return 0;
}

/* Whether request g's draws can go through the backend's batched step: seeded draws
 * (a replay forces ids the GPU does not know), no per-draw hook, the standard k. */
static int pairs_ok(const struct generate *g)
{
    return g->be && g->be->sample_pairs && !g->done && g->sp->mode == SAMPLER_SEEDED && g->sp->top_k == SAMPLER_TOP_K &&
           !g->hooks.on_draw && !g->hooks.on_c0_logits;
}

static int batchable(const struct generate *g)
{
    return pairs_ok(g) && g->phase == GENERATE_SAMPLE;
}

int generate_decode_ready(const struct generate *g)
{
    return pairs_ok(g) && g->phase == GENERATE_FEED;
}

/* Scratch of one batched call, sized for n pairs. */
struct batch_buf {
    float *hidden, *depth_hidden, *feedback, *scale, *emb;
    uint64_t *seed;
    int *step, *row, *pos;
    unsigned char *ignore_stop, *last;
    int32_t *codes;
    int whole; /* the call serves every request of the batch: the backend may look ahead */
};

static void batch_buf_free(struct batch_buf *b)
{
    free(b->hidden), free(b->depth_hidden), free(b->feedback), free(b->scale), free(b->emb);
    free(b->seed), free(b->step), free(b->row), free(b->pos), free(b->ignore_stop), free(b->last), free(b->codes);
}

static int batch_buf_init(struct batch_buf *b, int n, int H, int ncb)
{
    memset(b, 0, sizeof *b);
    b->hidden = malloc(sizeof(float) * 2 * (size_t)n * H);
    b->depth_hidden = malloc(sizeof(float) * (size_t)n * (ncb - 1) * H);
    b->feedback = malloc(sizeof(float) * (size_t)n * H);
    b->scale = malloc(sizeof(float) * n);
    b->emb = malloc(sizeof(float) * 2 * (size_t)n * H);
    b->seed = malloc(sizeof(uint64_t) * n);
    b->step = malloc(sizeof(int) * n);
    b->row = malloc(sizeof(int) * 2 * n);
    b->pos = malloc(sizeof(int) * 2 * n);
    b->ignore_stop = malloc((size_t)n);
    b->last = malloc((size_t)n);
    b->codes = malloc(sizeof(int32_t) * (size_t)n * ncb);
    if (!b->hidden || !b->depth_hidden || !b->feedback || !b->scale || !b->emb || !b->seed || !b->step || !b->row ||
        !b->pos || !b->ignore_stop || !b->last || !b->codes) {
        batch_buf_free(b);
        return mm3_errorf(-ENOMEM, "generate: out of memory for a batch of %d pairs", n);
    }
    return 0;
}

/* The sampling inputs of g[0..n-1], whose draws are those of LM step g->step + ahead
 * (1 when the same call first runs the forward that gets there). */
static struct talker_pairs_in pairs_in(struct generate *const *g, int n, int ahead, struct batch_buf *b)
{
    for (int p = 0; p < n; p++) {
        g[p]->err = 0;
        g[p]->err_msg[0] = '\0';
        b->seed[p] = g[p]->sp->seed;
        b->step[p] = g[p]->step + ahead;
        b->scale[p] = g[p]->cfg_scale;
        b->ignore_stop[p] = stop_masked(g[p]) ? 1 : 0;
    }
    return (struct talker_pairs_in){.n = n,
                                    .seed = b->seed,
                                    .step = b->step,
                                    .cfg_scale = b->scale,
                                    .ignore_stop = b->ignore_stop,
                                    .top_k = SAMPLER_TOP_K};
}

/* After a backend call that drew for g[0..n-1] (rc its result): each request's codes,
 * frame, stop, budget and feedback, as generate_sample ends. */
static int finish_pairs(struct generate *const *g, int n, struct batch_buf *b, int rc)
{
    int H = g[0]->lm->cfg.hidden, ncb = g[0]->dd->cfg.n_codebooks, first = 0;
    for (int p = 0; p < n; p++) {
        struct generate *q = g[p];
        if (rc < 0) { /* a device error is nobody's fault in particular: every pair fails */
            sample_failed(q, rc);
            continue;
        }
        const int32_t *c = b->codes + (size_t)p * ncb;
        int col = c[0];
        if (col != 0) {
            q->codes[0] = col - 1;
            memcpy(q->codes + 1, c + 1, sizeof(int32_t) * (ncb - 1));
            memcpy(q->frame + H, b->depth_hidden + (size_t)p * (ncb - 1) * H, sizeof(float) * (ncb - 1) * H);
        }
        int r = sample_finish(q, col, b->feedback + (size_t)p * H);
        if (r < 0) {
            sample_failed(q, r);
            if (first == 0) first = r;
        }
    }
    return rc < 0 ? rc : first;
}

/* One backend call for g[0..n-1] (all batchable on the same backend, n <= depth_rows / 2). */
static int sample_pairs(struct generate *const *g, int n, struct batch_buf *b)
{
    const struct talker_backend *be = g[0]->be;
    int H = g[0]->lm->cfg.hidden;
    struct talker_pairs_in in = pairs_in(g, n, 0, b);
    for (int p = 0; p < n; p++)
        memcpy(b->hidden + 2 * (size_t)p * H, g[p]->hidden, sizeof(float) * 2 * H);
    in.hidden = b->hidden;
    struct talker_pairs_out out = {.codes = b->codes, .depth_hidden = b->depth_hidden, .feedback = b->feedback};
    return finish_pairs(g, n, b, be->sample_pairs(be->impl, &in, &out));
}

/* The same for g[0..n-1] all decode-ready: their forward first, in the same call. */
static int decode_pairs(struct generate *const *g, int n, struct batch_buf *b)
{
    const struct talker_backend *be = g[0]->be;
    int H = g[0]->lm->cfg.hidden;
    struct talker_decode_in in = {.pairs = pairs_in(g, n, 1, b), .row = b->row, .pos = b->pos, .emb = b->emb};
    for (int p = 0; p < n; p++) {
        const struct generate *q = g[p];
        memcpy(b->emb + 2 * (size_t)p * H, q->fb, sizeof(float) * 2 * H); /* as generate_feed */
        for (int r = 0; r < 2; r++) {
            b->row[2 * p + r] = q->row[r];
            b->pos[2 * p + r] = q->prompt_len + q->step;
        }
        b->last[p] = q->n_frames + 1 >= q->max_frames; /* as sample_finish: this step's frame is the budget's last */
    }
    /* The step after this one is what the next call asks for when the same requests
     * come back (the scheduler's steady state); chunks of a larger batch never are. */
    if (b->whole) in.last = b->last;
    struct talker_pairs_out out = {
        .codes = b->codes, .depth_hidden = b->depth_hidden, .feedback = b->feedback, .hidden = b->hidden};
    int rc = talker_backend_decode_pairs(be, &in, &out);
    if (rc == 0)
        for (int p = 0; p < n; p++) { /* as generate_take */
            memcpy(g[p]->hidden, b->hidden + 2 * (size_t)p * H, sizeof(float) * 2 * H);
            g[p]->step++;
            g[p]->phase = GENERATE_SAMPLE;
        }
    return finish_pairs(g, n, b, rc);
}

/* g[0..n-1] (same backend) in calls of up to depth_rows / 2 pairs. */
static int pairs_in_calls(struct generate *const *g, int n,
                          int (*call)(struct generate *const *g, int n, struct batch_buf *b))
{
    const struct talker_backend *be = g[0]->be;
    int per_call = be->depth_rows / 2, H = be->lm->cfg.hidden, ncb = be->dd->cfg.n_codebooks;
    int chunk = n < per_call ? n : per_call, first = 0;
    struct batch_buf b;
    int rc = batch_buf_init(&b, chunk, H, ncb);
    b.whole = chunk == n;
    for (int at = 0; at < n; at += chunk) {
        int k = n - at < chunk ? n - at : chunk;
        int r = rc < 0 ? rc : call(g + at, k, &b);
        if (rc < 0)
            for (int p = 0; p < k; p++)
                sample_failed(g[at + p], rc);
        if (r < 0 && first == 0) first = r;
    }
    if (rc == 0) batch_buf_free(&b);
    return first;
}

int generate_decode_batch(struct generate *const *g, int n)
{
    if (n <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (!generate_decode_ready(g[i]) || g[i]->be != g[0]->be)
            return mm3_errorf(-EINVAL, "generate_decode_batch: request %d of %d is not ready for a batched decode step",
                              i, n);
    return pairs_in_calls(g, n, decode_pairs);
}

int generate_sample_batch(struct generate *const *g, int n)
{
    if (n <= 0) return 0;
    struct generate **pick = malloc(sizeof *pick * (size_t)n);
    if (!pick) return mm3_errorf(-ENOMEM, "generate: out of memory for a batch of %d requests", n);
    int first = 0, n_pick = 0;
    /* Requests the backend cannot batch sample on their own, in order. */
    for (int i = 0; i < n; i++) {
        if (batchable(g[i]) && (n_pick == 0 || g[i]->be == pick[0]->be)) {
            pick[n_pick++] = g[i];
            continue;
        }
        int rc = generate_sample(g[i]);
        if (rc < 0 && first == 0) first = rc;
    }
    if (n_pick > 0) {
        int rc = pairs_in_calls(pick, n_pick, sample_pairs);
        if (rc < 0 && first == 0) first = rc;
    }
    free(pick);
    return first;
}

int generate_step(struct generate *g)
{
    int rc = generate_sample(g);
    if (rc < 0 || g->done) return rc;
    int row[2] = {g->row[0], g->row[1]}, pos[2] = {g->prompt_len + g->step, g->prompt_len + g->step};
    if ((rc = model_forward(g, 2, row, pos, g->fb, g->hidden)) < 0) {
        g->done = 1;
        return rc;
    }
    g->step++;
    g->phase = GENERATE_SAMPLE;
    return 0;
}

void generate_end(struct generate *g)
{
    if (g->ts == &g->own_ts) talker_state_free(&g->own_ts);
    g->ts = NULL;
    g->be = NULL;
    depth_state_free(&g->ds);
    free(g->hidden);
    free(g->fb);
    free(g->frame);
    free(g->work);
    free(g->codes);
    free(g->ids);
    g->hidden = g->fb = g->frame = g->work = NULL;
    g->codes = g->ids = NULL;
}

int window_count(int n_frames)
{
    if (n_frames <= WINDOW_FRAMES) return 1;
    return (n_frames - WINDOW_HOP + WINDOW_HOP - 1) / WINDOW_HOP;
}

void window_starts(int n_frames, int *starts, int *k)
{
    int n = window_count(n_frames);
    for (int i = 0; i < n; i++)
        starts[i] = i * WINDOW_HOP;
    *k = n;
}

int windows_ready(int n_frames, int ended)
{
    if (ended) return n_frames > 0 ? window_count(n_frames) : 0;
    if (n_frames < WINDOW_FRAMES) return 0;
    return (n_frames - WINDOW_FRAMES) / WINDOW_HOP + 1;
}

int window_is_last(int k, int n_frames, int ended)
{
    if (ended) return k == window_count(n_frames) - 1;
    return n_frames > k * WINDOW_HOP + WINDOW_FRAMES ? 0 : -1;
}
