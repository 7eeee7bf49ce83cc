#include "stage0/generate.h"

#include <errno.h>
#include <math.h>
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

int generate_begin(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                   const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                   const struct generate_hooks *hooks)
{
    memset(g, 0, sizeof *g);
    int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks, V = dd->cfg.audio_vocab;
    if (dd->cfg.hidden != H)
        return mm3_errorf(-EINVAL, "depth decoder hidden_size %d differs from the language model's %d", dd->cfg.hidden,
                          H);
    if (prompt_len < 1 || prompt_len > GENERATE_MAX_PROMPT)
        return mm3_errorf(-EINVAL, "prompt of %d tokens: expected 1..%d", prompt_len, GENERATE_MAX_PROMPT);
    if (max_frames < 1 || max_frames > GENERATE_MAX_FRAMES)
        return mm3_errorf(-EINVAL, "frame budget %d: expected 1..%d", max_frames, GENERATE_MAX_FRAMES);
    g->lm = lm;
    g->dd = dd;
    g->sp = sp;
    if (hooks) g->hooks = *hooks;
    g->cfg_scale = cfg_scale;
    g->prompt_len = prompt_len;
    g->max_frames = max_frames;
    size_t work = 2 * (size_t)SAMPLER_C0_COLS + SAMPLER_C0_COLS + 3 * V + 8 * (size_t)H;
    g->hidden = malloc(sizeof(float) * 2 * H);
    g->frame = malloc(sizeof(float) * (size_t)ncb * H);
    g->work = malloc(sizeof(float) * work);
    g->codes = malloc(sizeof(int32_t) * ncb);
    int rc;
    if (!g->hidden || !g->frame || !g->work || !g->codes) {
        rc = mm3_errorf(-ENOMEM, "generate: out of memory");
        goto fail;
    }
    if ((rc = talker_state_init(&g->ts, lm, 2, prompt_len + max_frames)) < 0) goto fail;
    if ((rc = depth_state_init(&g->ds, dd, 2)) < 0) goto fail;

    int n = 2 * prompt_len;
    float *emb = malloc(sizeof(float) * n * H), *out = malloc(sizeof(float) * n * H);
    int *row = malloc(sizeof(int) * n), *pos = malloc(sizeof(int) * n);
    if (!emb || !out || !row || !pos)
        rc = mm3_errorf(-ENOMEM, "generate: out of memory for the prefill");
    else
        rc = talker_embed_tokens(lm, ids_pair, n, emb);
    if (rc == 0) {
        for (int i = 0; i < n; i++) {
            row[i] = i / prompt_len;
            pos[i] = i % prompt_len;
        }
        rc = talker_forward(lm, &g->ts, n, row, pos, emb, out);
    }
    if (rc == 0) {
        memcpy(g->hidden, out + (size_t)(prompt_len - 1) * H, sizeof(float) * H);
        memcpy(g->hidden + H, out + (size_t)(2 * prompt_len - 1) * H, sizeof(float) * H);
    }
    free(emb), free(out), free(row), free(pos);
    if (rc < 0) goto fail;
    return 0;
fail:
    generate_end(g);
    return rc;
}

/* Depth decoder for one frame: c1.. into g->codes, hiddens d1.. into frame slots 1... */
static int depth_frame(struct generate *g, int s)
{
    const struct depth *dd = g->dd;
    int H = dd->cfg.hidden, V = dd->cfg.audio_vocab, ncb = dd->cfg.n_codebooks;
    float *x = g->work + 3 * (size_t)SAMPLER_C0_COLS, *y = x + 2 * H;
    float *lg = y + 2 * H, *gd = lg + 2 * V;
    int rc = depth_step(dd, &g->ds, 2, g->hidden, 0, y);
    if (rc < 0) return rc;
    const float *e = g->lm->embed + ((size_t)g->codes[0] + SAMPLER_CODE_OFFSET) * H;
    memcpy(x, e, sizeof(float) * H);
    memcpy(x + H, e, sizeof(float) * H);
    for (int j = 1; j < ncb; j++) {
        if ((rc = depth_step(dd, &g->ds, 2, x, j, y)) < 0) return rc;
        memcpy(g->frame + (size_t)j * H, y, sizeof(float) * H);
        depth_logits(dd, j, y, 2, lg);
        sampler_cfg_blend(gd, lg, lg + V, V, g->cfg_scale);
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

int generate_step(struct generate *g)
{
    if (g->done) return 0;
    const struct talker *lm = g->lm;
    int H = lm->cfg.hidden, ncb = g->dd->cfg.n_codebooks, s = g->step;
    float *logits = g->work, *guided = g->work + 2 * (size_t)SAMPLER_C0_COLS;
    talker_head_drawable(lm, g->hidden, 2, logits);
    sampler_c0_guide(guided, logits, logits + SAMPLER_C0_COLS, SAMPLER_C0_COLS, g->cfg_scale, SAMPLER_TOP_K);
    if (g->hooks.on_draw) g->hooks.on_draw(g->hooks.ctx, s, 0, guided, SAMPLER_C0_COLS);
    int col, rc;
    if ((rc = sampler_draw(g->sp, guided, SAMPLER_C0_COLS, (uint32_t)(ncb * s), &col)) < 0) goto fail;
    if (col == 0) {
        g->done = 1;
        g->stop = GENERATE_STOP_TOKEN;
        if (g->n_frames == 0)
            return mm3_errorf(-ENODATA, "the model drew <|audio_end|> at step %d, before the first frame", s);
        return 0;
    }
    g->codes[0] = col - 1;
    if ((rc = depth_frame(g, s)) < 0) goto fail;
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
    float *fb = g->work + 3 * (size_t)SAMPLER_C0_COLS; /* free again after the depth frame */
    if ((rc = talker_feedback_embedding(lm, g->dd, g->codes, fb)) < 0) goto fail;
    memcpy(fb + H, fb, sizeof(float) * H);
    int row[2] = {0, 1}, pos[2] = {g->prompt_len + s, g->prompt_len + s};
    if ((rc = talker_forward(lm, &g->ts, 2, row, pos, fb, g->hidden)) < 0) goto fail;
    g->step++;
    return 0;
fail:
    g->done = 1;
    return rc;
}

void generate_end(struct generate *g)
{
    talker_state_free(&g->ts);
    depth_state_free(&g->ds);
    free(g->hidden);
    free(g->frame);
    free(g->work);
    free(g->codes);
    g->hidden = g->frame = g->work = NULL;
    g->codes = NULL;
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
