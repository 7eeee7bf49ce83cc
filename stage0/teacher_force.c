#include "stage0/teacher_force.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sampler.h"

/* One teacher-forced pass over rows[0..n_rows) (row 0 conditional): of ts with the
 * models themselves, or of a backend's KV cache (be set; its depth rows are scratch). */
struct tf_pass {
    const struct talker *lm;
    const struct depth *dd;
    struct talker_state *ts;
    const struct talker_backend *be;
    int rows[2], n_rows;
    const int32_t *ids_pair;
    int P;
    const int32_t *codes;
    int n_steps;
    int n_feed; /* feedback tokens: n_steps - 1 for frames only, n_steps to resume */
    const struct teacher_force_sink *sink;
    float *last; /* [n_rows, H]: hidden of each row's last token */
};

static int codes_check(const struct depth *dd, const int32_t *codes, int n_steps)
{
    int ncb = dd->cfg.n_codebooks, V = dd->cfg.audio_vocab;
    for (int s = 0; s < n_steps; s++)
        for (int j = 0; j < ncb; j++) {
            int32_t c = codes[(size_t)s * ncb + j], lim = j == 0 ? SAMPLER_N_CODES : V;
            if (c < 0 || c >= lim)
                return mm3_errorf(-EINVAL, "teacher forcing: step %d codebook %d: code %d outside [0, %d)", s, j, c,
                                  lim);
        }
    return 0;
}

static int tf_forward(const struct tf_pass *p, int n, const int *row, const int *pos, const float *emb, float *out)
{
    if (p->be) return p->be->forward(p->be->impl, n, row, pos, emb, out);
    return talker_forward(p->lm, p->ts, n, row, pos, emb, out);
}

static int tf_prefill(struct tf_pass *p, float *emb, float *out, int *row, int *pos)
{
    int H = p->lm->cfg.hidden, rc;
    for (int r = 0; r < p->n_rows; r++) {
        const int32_t *ids = p->ids_pair + (size_t)r * p->P;
        for (int a = 0; a < p->P; a += TEACHER_FORCE_CHUNK) {
            int n = p->P - a < TEACHER_FORCE_CHUNK ? p->P - a : TEACHER_FORCE_CHUNK;
            if ((rc = talker_embed_tokens(p->lm, ids + a, n, emb)) < 0) return rc;
            for (int i = 0; i < n; i++) {
                row[i] = p->rows[r];
                pos[i] = a + i;
            }
            if ((rc = tf_forward(p, n, row, pos, emb, out)) < 0) return rc;
            if (a + n == p->P) memcpy(p->last + (size_t)r * H, out + (size_t)(n - 1) * H, sizeof(float) * H);
        }
    }
    return 0;
}

static int tf_depth_step(const struct tf_pass *p, struct depth_state *ds, int n, const float *x, int pos, float *y)
{
    if (p->be) return p->be->depth_step(p->be->impl, n, x, pos, y);
    return depth_step(p->dd, ds, n, x, pos, y);
}

/* Depth hiddens of nf frames whose LM hiddens are slot 0 of frames[nf, ncb*H];
 * step_codes[nf, ncb] are the codes of the frames' own steps. nf <= the depth rows. */
static int tf_depth(const struct tf_pass *p, struct depth_state *ds, const int32_t *step_codes, int nf, float *frames,
                    float *x, float *y)
{
    const struct talker *lm = p->lm;
    const struct depth *dd = p->dd;
    int H = dd->cfg.hidden, ncb = dd->cfg.n_codebooks, rc;
    size_t W = (size_t)ncb * H;
    for (int i = 0; i < nf; i++)
        memcpy(x + (size_t)i * H, frames + i * W, sizeof(float) * H);
    if ((rc = tf_depth_step(p, ds, nf, x, 0, y)) < 0) return rc;
    for (int j = 1; j < ncb; j++) {
        for (int i = 0; i < nf; i++) {
            const int32_t *c = step_codes + (size_t)i * ncb;
            const float *e = j == 1 ? lm->embed + ((size_t)c[0] + SAMPLER_CODE_OFFSET) * H
                                    : depth_code_embedding(dd, j - 1, c[j - 1]);
            memcpy(x + (size_t)i * H, e, sizeof(float) * H);
        }
        if ((rc = tf_depth_step(p, ds, nf, x, j, y)) < 0) return rc;
        for (int i = 0; i < nf; i++)
            memcpy(frames + i * W + (size_t)j * H, y + (size_t)i * H, sizeof(float) * H);
    }
    return 0;
}

static int tf_run(struct tf_pass *p)
{
    const struct talker *lm = p->lm;
    const struct depth *dd = p->dd;
    int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks, C = TEACHER_FORCE_CHUNK;
    size_t W = (size_t)ncb * H;
    int T = p->n_steps > 0 ? p->n_steps - 1 : 0;
    float *emb = malloc(sizeof(float) * 2 * C * H), *out = malloc(sizeof(float) * 2 * C * H);
    float *frames = malloc(sizeof(float) * C * W), *x = malloc(sizeof(float) * C * H);
    float *y = malloc(sizeof(float) * C * H);
    int *row = malloc(sizeof(int) * 2 * C), *pos = malloc(sizeof(int) * 2 * C);
    struct depth_state ds = {0};
    int rc = 0;
    if (!emb || !out || !frames || !x || !y || !row || !pos) {
        rc = mm3_errorf(-ENOMEM, "teacher forcing: out of memory");
        goto out;
    }
    /* A backend's depth rows may be fewer than a chunk of frames. */
    int depth_rows = p->be ? p->be->depth_rows : C;
    if (depth_rows < 1) {
        rc = mm3_errorf(-EINVAL, "teacher forcing: backend %s has no depth rows", p->be->name);
        goto out;
    }
    if (!p->be && (rc = depth_state_init(&ds, dd, C)) < 0) goto out;
    if ((rc = tf_prefill(p, emb, out, row, pos)) < 0) goto out;
    for (int a = 0; a < p->n_feed; a += C) {
        int n = p->n_feed - a < C ? p->n_feed - a : C;
        for (int i = 0; i < n; i++)
            if ((rc = talker_feedback_embedding(lm, dd, p->codes + (size_t)(a + i) * ncb, emb + (size_t)i * H)) < 0)
                goto out;
        for (int r = 1; r < p->n_rows; r++)
            memcpy(emb + (size_t)r * n * H, emb, sizeof(float) * n * H);
        for (int r = 0; r < p->n_rows; r++)
            for (int i = 0; i < n; i++) {
                row[r * n + i] = p->rows[r];
                pos[r * n + i] = p->P + a + i;
            }
        if ((rc = tf_forward(p, p->n_rows * n, row, pos, emb, out)) < 0) goto out;
        for (int r = 0; r < p->n_rows; r++)
            memcpy(p->last + (size_t)r * H, out + ((size_t)r * n + n - 1) * H, sizeof(float) * H);
        /* the conditional hidden after feedback a+i is slot 0 of frame a+i (step a+i+1) */
        int nf = T - a < n ? T - a : n;
        if (nf <= 0) continue;
        for (int i = 0; i < nf; i++)
            memcpy(frames + i * W, out + (size_t)i * H, sizeof(float) * H);
        for (int d = 0; d < nf; d += depth_rows) {
            int k = nf - d < depth_rows ? nf - d : depth_rows;
            if ((rc = tf_depth(p, &ds, p->codes + (size_t)(a + 1 + d) * ncb, k, frames + (size_t)d * W, x, y)) < 0)
                goto out;
        }
        if (p->sink && (rc = p->sink->emit(p->sink->ctx, a, frames, nf)) != 0) goto out;
    }
out:
    depth_state_free(&ds);
    free(emb), free(out), free(frames), free(x), free(y), free(row), free(pos);
    return rc;
}

/* Arguments every teacher-forced stream checks. */
static int stream_check(const struct talker *lm, const struct depth *dd, int prompt_len, const int32_t *codes,
                        int n_steps)
{
    if (dd->cfg.hidden != lm->cfg.hidden)
        return mm3_errorf(-EINVAL, "depth decoder hidden_size %d differs from the language model's %d", dd->cfg.hidden,
                          lm->cfg.hidden);
    if (prompt_len < 1 || prompt_len > GENERATE_MAX_PROMPT || n_steps < 0 || n_steps > GENERATE_MAX_FRAMES + 1)
        return mm3_errorf(-EINVAL, "teacher forcing: prompt of %d tokens, %d steps: expected 1..%d and 0..%d",
                          prompt_len, n_steps, GENERATE_MAX_PROMPT, GENERATE_MAX_FRAMES + 1);
    return codes_check(dd, codes, n_steps);
}

/* The conditional row's pass: p has the models and either ts or be with row. */
static int stream_run(struct tf_pass *p, int row)
{
    float *last = malloc(sizeof(float) * p->lm->cfg.hidden);
    p->rows[0] = row;
    p->n_rows = 1;
    p->last = last;
    int rc = last ? tf_run(p) : mm3_errorf(-ENOMEM, "teacher forcing: out of memory");
    free(last);
    return rc;
}

int teacher_force_stream(const struct talker *lm, const struct depth *dd, const int32_t *ids_pair, int prompt_len,
                         const int32_t *codes, int n_steps, const struct teacher_force_sink *sink)
{
    if (!talker_has_matrices(lm) || !depth_has_matrices(dd))
        return mm3_errorf(-EINVAL, "teacher forcing: the model was loaded for the GPU (its matrices are in the "
                                   "checkpoint); recompute on its backend (teacher_force_stream_backend)");
    int rc = stream_check(lm, dd, prompt_len, codes, n_steps);
    if (rc < 0 || n_steps < 2) return rc; /* no frame: step 0 is never emitted */
    struct talker_state ts;
    if ((rc = talker_state_init(&ts, lm, 1, prompt_len + n_steps - 1)) < 0) return rc;
    struct tf_pass p = {.lm = lm, .dd = dd, .ts = &ts, .ids_pair = ids_pair, .P = prompt_len, .codes = codes,
                        .n_steps = n_steps, .n_feed = n_steps - 1, .sink = sink};
    rc = stream_run(&p, 0);
    talker_state_free(&ts);
    return rc;
}

int teacher_force_stream_backend(const struct talker_backend *be, int row, const int32_t *ids_pair, int prompt_len,
                                 const int32_t *codes, int n_steps, const struct teacher_force_sink *sink)
{
    int rc = stream_check(be->lm, be->dd, prompt_len, codes, n_steps);
    if (rc < 0 || n_steps < 2) return rc;
    if (row < 0 || row >= be->max_rows || prompt_len + n_steps - 1 > be->max_ctx)
        return mm3_errorf(-EINVAL,
                          "teacher forcing: row %d, %d positions: backend %s has %d rows of %d positions", row,
                          prompt_len + n_steps - 1, be->name, be->max_rows, be->max_ctx);
    struct tf_pass p = {.lm = be->lm, .dd = be->dd, .be = be, .ids_pair = ids_pair, .P = prompt_len, .codes = codes,
                        .n_steps = n_steps, .n_feed = n_steps - 1, .sink = sink};
    return stream_run(&p, row);
}

struct into_array {
    float *frames;
    size_t width;
};

static int into_array_emit(void *ctx, int t0, const float *frames, int n)
{
    struct into_array *a = ctx;
    memcpy(a->frames + (size_t)t0 * a->width, frames, sizeof(float) * n * a->width);
    return 0;
}

int teacher_force_frames(const struct talker *lm, const struct depth *dd, const int32_t *ids_pair, int prompt_len,
                         const int32_t *codes, int n_steps, float *frames)
{
    struct into_array a = {frames, (size_t)dd->cfg.n_codebooks * lm->cfg.hidden};
    struct teacher_force_sink sink = {&a, into_array_emit};
    return teacher_force_stream(lm, dd, ids_pair, prompt_len, codes, n_steps, &sink);
}

int teacher_force_journal(const struct talker_backend *be, int row, struct journal *j, const int32_t *ids_pair,
                          int prompt_len, const struct teacher_force_sink *sink, int *n_frames)
{
    const struct depth *dd = be->dd;
    *n_frames = 0;
    if (!j || journal_disabled(j))
        return mm3_errorf(-ENODATA, "no usable journal for this request (journaling off or disabled by a write error)");
    int rc = journal_flush(j);
    if (rc < 0 || journal_disabled(j))
        return mm3_errorf(-ENODATA, "journal %s: flush failed, cannot recompute the frames", journal_path(j));
    struct journal_record rec;
    if ((rc = journal_read(journal_path(j), &rec)) < 0) return rc;
    if (rec.h.prompt_len != prompt_len || rec.h.prompt_hash != journal_prompt_hash(ids_pair, prompt_len) ||
        rec.h.n_codebooks != dd->cfg.n_codebooks)
        rc = mm3_errorf(-EINVAL, "journal %s: written for another prompt or model (%d prompt ids, %d codebooks)",
                        journal_path(j), rec.h.prompt_len, rec.h.n_codebooks);
    else if (rec.n_steps != journal_steps(j))
        rc = mm3_errorf(-EIO, "journal %s: %d steps read back, %d written", journal_path(j), rec.n_steps,
                        journal_steps(j));
    else if ((rc = teacher_force_stream_backend(be, row, ids_pair, prompt_len, rec.codes, rec.n_steps, sink)) == 0)
        *n_frames = rec.n_steps > 0 ? rec.n_steps - 1 : 0;
    journal_record_free(&rec);
    return rc;
}

/* Re-emit recomputed frames through the generate hooks, one by one with their codes. */
struct resume_emit {
    const struct generate_hooks *hooks;
    const int32_t *codes;
    int ncb;
    size_t width;
};

static int resume_emit_frames(void *ctx, int t0, const float *frames, int n)
{
    struct resume_emit *e = ctx;
    if (!e->hooks || !e->hooks->on_frame) return 0;
    for (int i = 0; i < n; i++)
        e->hooks->on_frame(e->hooks->ctx, t0 + i, frames + (size_t)i * e->width,
                           e->codes + (size_t)(t0 + i + 1) * e->ncb);
    return 0;
}

int teacher_force_fill(struct generate *g, const int32_t *codes, int n_steps, const struct teacher_force_sink *sink)
{
    int ncb = g->dd->cfg.n_codebooks, rc;
    if (n_steps < 0 || n_steps - 1 > g->max_frames)
        return mm3_errorf(-EINVAL, "teacher forcing: %d journaled steps exceed the budget of %d frames", n_steps,
                          g->max_frames);
    if (g->phase != GENERATE_PREFILL || g->prefilled != 0)
        return mm3_errorf(-EINVAL, "teacher forcing: the request's rows were already fed");
    if ((rc = codes_check(g->dd, codes, n_steps)) < 0) return rc;
    int budget_full = n_steps > 0 && n_steps - 1 == g->max_frames; /* generation stopped without feeding its last step */
    struct tf_pass p = {.lm = g->lm,
                        .dd = g->dd,
                        .ts = g->ts,
                        .be = g->be,
                        .rows = {g->row[0], g->row[1]},
                        .n_rows = 2,
                        .ids_pair = g->ids,
                        .P = g->prompt_len,
                        .codes = codes,
                        .n_steps = n_steps,
                        .n_feed = n_steps - budget_full,
                        .sink = sink,
                        .last = g->hidden};
    if ((rc = tf_run(&p)) != 0) return rc;
    g->prefilled = g->prompt_len;
    g->step = n_steps;
    g->n_frames = n_steps > 0 ? n_steps - 1 : 0;
    if (n_steps > 0) memcpy(g->codes, codes + (size_t)(n_steps - 1) * ncb, sizeof(int32_t) * ncb);
    g->phase = GENERATE_SAMPLE;
    if (budget_full) {
        g->done = 1;
        g->stop = GENERATE_STOP_BUDGET;
    }
    return 0;
}

int teacher_force_attach(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                         struct talker_state *ts, int row_c, int row_u, const int32_t *ids_pair, int prompt_len,
                         int max_frames, float cfg_scale, const struct generate_hooks *hooks, const int32_t *codes,
                         int n_steps)
{
    memset(g, 0, sizeof *g);
    int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks, rc;
    if (n_steps < 0 || n_steps - 1 > max_frames)
        return mm3_errorf(-EINVAL, "teacher forcing: %d journaled steps exceed the budget of %d frames", n_steps,
                          max_frames);
    if ((rc = codes_check(dd, codes, n_steps)) < 0) return rc;
    if ((rc = generate_attach(g, lm, dd, sp, ts, row_c, row_u, ids_pair, prompt_len, max_frames, cfg_scale, hooks)) < 0)
        return rc;
    struct resume_emit e = {hooks, codes, ncb, (size_t)ncb * H};
    struct teacher_force_sink sink = {&e, resume_emit_frames};
    if ((rc = teacher_force_fill(g, codes, n_steps, &sink)) != 0) {
        generate_end(g);
        return rc;
    }
    return 0;
}

int teacher_force_resume(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                         const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                         const struct generate_hooks *hooks, const int32_t *codes, int n_steps)
{
    memset(g, 0, sizeof *g);
    if (prompt_len < 1 || prompt_len > GENERATE_MAX_PROMPT || max_frames < 1 || max_frames > GENERATE_MAX_FRAMES)
        return mm3_errorf(-EINVAL, "teacher forcing: prompt of %d tokens, budget %d frames: expected 1..%d, 1..%d",
                          prompt_len, max_frames, GENERATE_MAX_PROMPT, GENERATE_MAX_FRAMES);
    struct talker_state own;
    int rc = talker_state_init(&own, lm, 2, prompt_len + max_frames);
    if (rc < 0) return rc;
    if ((rc = teacher_force_attach(g, lm, dd, sp, &own, 0, 1, ids_pair, prompt_len, max_frames, cfg_scale, hooks, codes,
                                   n_steps)) < 0) {
        talker_state_free(&own);
        return rc;
    }
    /* the state moves into g, as generate_begin's own state does */
    g->own_ts = own;
    g->ts = &g->own_ts;
    return 0;
}
