/* Golden replay through a talker backend (stage0/talker_backend.h): the AR loop of
 * stage0/generate.c (one CFG pair, model-stage0.md §3.8) written against the
 * backend table, so that the GPU path is checked against the reference data the
 * same way the CPU path is. Kept step for step equal to generate_begin/step:
 * prefill both rows, per step the guided c0 draw, the depth frame, the frame hook
 * (s > 0), the feedback embedding fed to both rows. */
#include "stage0/golden.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sampler.h"
#include "stage0/talker_backend.h"

struct backend_ctx {
    enum talker_backend_kind kind;
};

/* Depth decoder for one frame of step s: c1.. into codes, hiddens into frame slots 1... */
static int depth_frame(struct talker_backend *b, struct sampler *sp, const float *hidden, int32_t *codes, float *frame,
                       float cfg_scale, const struct generate_hooks *hooks, int s, float *work)
{
    const struct depth *dd = b->dd;
    int H = dd->cfg.hidden, V = dd->cfg.audio_vocab, ncb = dd->cfg.n_codebooks;
    float *x = work, *y = x + 2 * H, *lg = y + 2 * H, *gd = lg + 2 * V;
    int rc = b->depth_step(b->impl, 2, hidden, 0, y);
    if (rc < 0) return rc;
    const float *e = b->lm->embed + ((size_t)codes[0] + SAMPLER_CODE_OFFSET) * H;
    memcpy(x, e, sizeof(float) * H);
    memcpy(x + H, e, sizeof(float) * H);
    for (int j = 1; j < ncb; j++) {
        if ((rc = b->depth_step(b->impl, 2, x, j, y)) < 0) return rc;
        memcpy(frame + (size_t)j * H, y, sizeof(float) * H);
        if ((rc = b->depth_logits(b->impl, j, y, 2, lg)) < 0) return rc;
        if (cfg_scale > 1.0f)
            sampler_cfg_blend(gd, lg, lg + V, V, cfg_scale);
        else
            memcpy(gd, lg, sizeof(float) * V);
        if (hooks->on_draw) hooks->on_draw(hooks->ctx, s, j, gd, V);
        int col;
        if ((rc = sampler_draw(sp, gd, V, (uint32_t)(ncb * s + j), &col)) < 0) return rc;
        codes[j] = col;
        if (j < ncb - 1) {
            const float *a = depth_code_embedding(dd, j, col);
            memcpy(x, a, sizeof(float) * H);
            memcpy(x + H, a, sizeof(float) * H);
        }
    }
    return 0;
}

/* Prefill of both rows in one forward: row 0 conditional, row 1 unconditional. */
static int prefill(struct talker_backend *b, const int32_t *ids_pair, int P, float *hidden)
{
    int H = b->lm->cfg.hidden;
    int *row = malloc(sizeof(int) * 2 * P), *pos = malloc(sizeof(int) * 2 * P);
    float *emb = malloc(sizeof(float) * 2 * (size_t)P * H), *out = malloc(sizeof(float) * 2 * (size_t)P * H);
    int rc = row && pos && emb && out ? 0 : mm3_errorf(-ENOMEM, "golden backend: out of memory for the prefill");
    if (rc == 0) rc = talker_embed_tokens(b->lm, ids_pair, 2 * P, emb);
    for (int i = 0; rc == 0 && i < 2 * P; i++) {
        row[i] = i / P;
        pos[i] = i % P;
    }
    if (rc == 0) rc = b->forward(b->impl, 2 * P, row, pos, emb, out);
    if (rc == 0) {
        memcpy(hidden, out + (size_t)(P - 1) * H, sizeof(float) * H);
        memcpy(hidden + H, out + (size_t)(2 * P - 1) * H, sizeof(float) * H);
    }
    free(row), free(pos), free(emb), free(out);
    return rc;
}

static int replay(struct talker_backend *b, struct sampler *sp, const int32_t *ids_pair, int P, int max_frames,
                  float cfg_scale, const struct generate_hooks *hooks, enum generate_stop *stop)
{
    const struct talker *lm = b->lm;
    int H = lm->cfg.hidden, ncb = b->dd->cfg.n_codebooks, V = b->dd->cfg.audio_vocab;
    float *hidden = malloc(sizeof(float) * 2 * H), *fb = malloc(sizeof(float) * 2 * H);
    float *frame = malloc(sizeof(float) * (size_t)ncb * H);
    float *logits = malloc(sizeof(float) * 3 * SAMPLER_C0_COLS),
          *work = malloc(sizeof(float) * (4 * (size_t)H + 3 * V));
    int32_t *codes = malloc(sizeof(int32_t) * ncb);
    int rc =
        hidden && fb && frame && logits && work && codes ? 0 : mm3_errorf(-ENOMEM, "golden backend: out of memory");
    if (rc == 0) rc = prefill(b, ids_pair, P, hidden);
    int n_frames = 0;
    for (int s = 0; rc == 0; s++) {
        float *guided = logits + 2 * SAMPLER_C0_COLS;
        if ((rc = b->head_drawable(b->impl, hidden, 2, logits)) < 0) break;
        if (cfg_scale > 1.0f) {
            sampler_c0_guide(guided, logits, logits + SAMPLER_C0_COLS, SAMPLER_C0_COLS, cfg_scale, SAMPLER_TOP_K);
        } else {
            memcpy(guided, logits, sizeof(float) * SAMPLER_C0_COLS);
            sampler_topk_mask(guided, SAMPLER_C0_COLS, SAMPLER_TOP_K);
        }
        if (hooks->on_draw) hooks->on_draw(hooks->ctx, s, 0, guided, SAMPLER_C0_COLS);
        int col;
        if ((rc = sampler_draw(sp, guided, SAMPLER_C0_COLS, (uint32_t)(ncb * s), &col)) < 0) break;
        if (col == 0) {
            *stop = GENERATE_STOP_TOKEN;
            if (n_frames == 0)
                rc = mm3_errorf(-ENODATA, "the model drew <|audio_end|> at step %d, before the first frame", s);
            break;
        }
        codes[0] = col - 1;
        if ((rc = depth_frame(b, sp, hidden, codes, frame, cfg_scale, hooks, s, work)) < 0) break;
        if (s > 0) {
            memcpy(frame, hidden, sizeof(float) * H);
            if (hooks->on_frame) hooks->on_frame(hooks->ctx, n_frames, frame, codes);
            if (++n_frames >= max_frames) {
                *stop = GENERATE_STOP_BUDGET;
                break;
            }
        }
        if ((rc = talker_feedback_embedding(lm, b->dd, codes, fb)) < 0) break;
        memcpy(fb + H, fb, sizeof(float) * H);
        int row[2] = {0, 1}, pos[2] = {P + s, P + s};
        rc = b->forward(b->impl, 2, row, pos, fb, hidden);
    }
    free(hidden), free(fb), free(frame), free(logits), free(work), free(codes);
    return rc;
}

static int run_backend(void *ctx, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                       const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                       const struct generate_hooks *hooks, enum generate_stop *stop)
{
    const struct backend_ctx *c = ctx;
    if (dd->cfg.hidden != lm->cfg.hidden)
        return mm3_errorf(-EINVAL, "depth decoder hidden_size %d differs from the language model's %d", dd->cfg.hidden,
                          lm->cfg.hidden);
    struct talker_backend b;
    /* One backend per case sized for it: the golden cases are small, weights upload in milliseconds. */
    int rc = talker_backend_open(&b, c->kind, lm, dd, 2, prompt_len + max_frames, 2);
    if (rc < 0) return rc;
    struct generate_hooks h = *hooks;
    rc = replay(&b, sp, ids_pair, prompt_len, max_frames, cfg_scale, &h, stop);
    talker_backend_close(&b);
    return rc;
}

int golden_check_dir_backend(const char *dir, const char *backend, double tol, FILE *out, int *n_pass, int *n_fail)
{
    *n_pass = *n_fail = 0;
    struct backend_ctx c;
    int rc = talker_backend_parse(backend, &c.kind);
    if (rc < 0) return rc;
    if (!talker_backend_available(c.kind))
        return mm3_errorf(-ENODEV, "backend %s: not available in this build or on this machine", backend);
    return golden_check_dir_with(dir, run_backend, &c, tol, out, n_pass, n_fail);
}
