/* Incremental window loop of stage 1 (stage1/render.h). */
#include "stage1/render.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/noise.h"
#include "stage1/flow.h"

/* Buffers of one window between prepare and finish; two, so that window k+1 can be
 * prepared (and run) while window k still waits for its vocoder. */
struct render_slot {
    int k, s, F, L, ov;
    float *cond_raw, *cond, *x, *noise;
};

struct render {
    const struct condition_model *cm;
    const struct dit_model *dm;
    struct render_params p;
    struct dit_workspace *ws;
    int in_ch, cond_dim, hidden, hop, max_L;

    /* mixed frames [base, n_have) of the song, [cap, hidden] */
    float *mixed;
    int base, n_have, cap;
    int finished;
    int failed; /* the first error code, sticky */

    int next;         /* next window to prepare */
    int in_flow;      /* window next - 1 is prepared and not collected yet */
    int n_unfinished; /* windows prepared and not finished (at most 2) */
    int done;         /* windows finished (vocoded and emitted) */
    int prev_len;     /* carried latents, 0 before window 0 */
    float *prev_lat;  /* [in_ch, prev_len] */
    float *prev_cond; /* [prev_len, cond_dim] */
    float *prev_pack; /* [in_ch, ov] staging when ov < prev_len */

    struct render_slot slot[2]; /* window k in slot[k % 2] */
    float *wav, *out;           /* per-window buffers for max_L */

    int tail_window; /* window whose tail is held back, -1 if none */
    int tail_n;      /* samples per channel held in tail */
    float *tail;     /* [2, RENDER_CROP_RIGHT * hop] */
    int64_t emitted;
};

int render_window_count(int n_frames)
{
    if (n_frames <= RENDER_WINDOW_FRAMES) return 1;
    return (n_frames - RENDER_HOP_FRAMES + RENDER_HOP_FRAMES - 1) / RENDER_HOP_FRAMES;
}

int render_create(struct render **out, const struct condition_model *cm, const struct dit_model *dm,
                  const struct render_params *p)
{
    *out = NULL;
    if (cm->cfg.out_dim != dm->cfg.cond_dim)
        return mm3_errorf(-EINVAL, "render: condition encoder out_dim %d != transformer condition_dim %d",
                          cm->cfg.out_dim, dm->cfg.cond_dim);
    if (p->n_steps < 1 || p->decoder.hop < 1 || !p->decoder.decode || !p->sink.emit)
        return mm3_errorf(-EINVAL, "render: n_steps %d, hop %d: expected >= 1 and decode/emit callbacks", p->n_steps,
                          p->decoder.hop);
    if (!(p->shift >= 0.0f && p->shift <= FLOW_MAX_SHIFT))
        return mm3_errorf(-EINVAL, "render: flow shift %g: expected (0, %g] (0: %g)", (double)p->shift,
                          (double)FLOW_MAX_SHIFT, (double)FLOW_DEFAULT_SHIFT);
    struct render *r = calloc(1, sizeof *r);
    if (!r) return mm3_errorf(-ENOMEM, "render: out of memory");
    r->cm = cm;
    r->dm = dm;
    r->p = *p;
    if (r->p.shift == 0.0f) r->p.shift = FLOW_DEFAULT_SHIFT;
    r->in_ch = dm->cfg.in_ch;
    r->cond_dim = dm->cfg.cond_dim;
    r->hidden = cm->cfg.hidden;
    r->hop = p->decoder.hop;
    r->max_L = condition_latent_len(&cm->cfg, RENDER_WINDOW_FRAMES);
    r->tail_window = -1;
    size_t L = (size_t)r->max_L, C = (size_t)r->in_ch, D = (size_t)r->cond_dim, S = L * r->hop;
    r->prev_lat = malloc(sizeof(float) * C * RENDER_OVERLAP_LATENTS);
    r->prev_pack = malloc(sizeof(float) * C * RENDER_OVERLAP_LATENTS);
    r->prev_cond = malloc(sizeof(float) * D * RENDER_OVERLAP_LATENTS);
    int slots_ok = 1;
    for (int i = 0; i < 2; i++) {
        struct render_slot *w = &r->slot[i];
        w->cond_raw = malloc(sizeof(float) * L * D);
        w->cond = malloc(sizeof(float) * L * D);
        w->x = malloc(sizeof(float) * C * L);
        w->noise = malloc(sizeof(float) * C * L);
        slots_ok = slots_ok && w->cond_raw && w->cond && w->x && w->noise;
    }
    r->wav = malloc(sizeof(float) * 2 * S);
    r->out = malloc(sizeof(float) * 2 * S);
    r->tail = malloc(sizeof(float) * 2 * RENDER_CROP_RIGHT * (size_t)r->hop);
    int rc = 0;
    if (!r->prev_lat || !r->prev_pack || !r->prev_cond || !slots_ok || !r->wav || !r->out || !r->tail)
        rc = mm3_errorf(-ENOMEM, "render: out of memory for windows of %d latents", r->max_L);
    if (rc == 0 && !p->flow.run) rc = dit_workspace_alloc(&r->ws, dm, r->max_L);
    if (rc < 0) {
        render_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void render_free(struct render *r)
{
    if (!r) return;
    dit_workspace_free(r->ws);
    free(r->mixed), free(r->prev_lat), free(r->prev_pack), free(r->prev_cond);
    for (int i = 0; i < 2; i++)
        free(r->slot[i].cond_raw), free(r->slot[i].cond), free(r->slot[i].x), free(r->slot[i].noise);
    free(r->wav), free(r->out), free(r->tail);
    free(r);
}

int64_t render_samples_emitted(const struct render *r)
{
    return r->emitted;
}

static int fail(struct render *r, int rc)
{
    if (!r->failed) r->failed = rc;
    return rc;
}

/* Clamp samples [a, b) of both channels of wav[2, total] and hand them to the sink. */
static int emit_span(struct render *r, const float *wav, int total, int a, int b)
{
    int n = b - a;
    if (n <= 0) return 0;
    for (int ch = 0; ch < 2; ch++) {
        const float *src = wav + (size_t)ch * total + a;
        float *dst = r->out + (size_t)ch * n;
        for (int i = 0; i < n; i++)
            dst[i] = src[i] < -1.0f ? -1.0f : (src[i] > 1.0f ? 1.0f : src[i]);
    }
    if (r->p.sink.emit(r->p.sink.ctx, r->out, n) != 0)
        return mm3_errorf(-ECANCELED, "render: the PCM sink refused %d samples", n);
    r->emitted += n;
    return 0;
}

static void trim_frames(struct render *r);

static int fill_noise(struct render *r, int k, int L, float *noise)
{
    size_t n = (size_t)r->in_ch * L;
    const struct render_noise *s = &r->p.noise;
    if (s->mode == RENDER_NOISE_SEEDED) {
        noise_gaussian_fill(noise, n, noise_seed_window(s->seed, k), 0);
        return 0;
    }
    if (k >= s->n_replay || !s->replay[k])
        return mm3_errorf(-EINVAL, "render: replay noise: no array for window %d (%d given)", k, s->n_replay);
    if (s->replay_len[k] != (int64_t)n)
        return mm3_errorf(-EINVAL, "render: replay noise of window %d: %lld values, expected %zu (%d x %d)", k,
                          (long long)s->replay_len[k], n, r->in_ch, L);
    memcpy(noise, s->replay[k], sizeof(float) * n);
    return 0;
}

/* Condition, splice and noise of window k over frames [100k, 100k + F) into its slot,
 * and the flow job that turns the slot's noise into latents. */
static int prepare_window(struct render *r, int k, int F, struct flow_job *job)
{
    int s = k * RENDER_HOP_FRAMES, C = r->in_ch, D = r->cond_dim;
    int L = condition_latent_len(&r->cm->cfg, F);
    struct render_slot *w = &r->slot[k % 2];
    CHECK(s >= r->base && s + F <= r->n_have && L <= r->max_L);
    const float *mixed = r->mixed + (size_t)(s - r->base) * r->hidden;
    int rc = r->p.condition.project ? r->p.condition.project(r->p.condition.ctx, mixed, F, w->cond_raw)
                                    : condition_project(r->cm, mixed, F, w->cond_raw);
    if (rc < 0) return rc;
    memcpy(w->cond, w->cond_raw, sizeof(float) * (size_t)L * D);
    int ov = r->prev_len < L ? r->prev_len : L;
    const float *prev = r->prev_lat;
    if (ov > 0) {
        memcpy(w->cond, r->prev_cond, sizeof(float) * (size_t)ov * D);
        if (ov < r->prev_len) { /* the flow loop wants row stride ov */
            for (int c = 0; c < C; c++)
                memcpy(r->prev_pack + (size_t)c * ov, r->prev_lat + (size_t)c * r->prev_len, sizeof(float) * ov);
            prev = r->prev_pack;
        }
    }
    if ((rc = fill_noise(r, k, L, w->noise)) < 0) return rc;
    memcpy(w->x, w->noise, sizeof(float) * (size_t)C * L);
    w->k = k, w->s = s, w->F = F, w->L = L, w->ov = ov;
    *job = (struct flow_job){r->p.n_steps, r->p.guidance, r->p.shift, L, ov, w->cond, ov > 0 ? prev : NULL, w->x};
    return 0;
}

int render_window_prepare(struct render *r, struct flow_job *job)
{
    if (r->failed) return mm3_errorf(r->failed, "render: failed earlier");
    if (!render_window_ready(r)) return 0;
    int F = RENDER_WINDOW_FRAMES, s = r->next * RENDER_HOP_FRAMES;
    if (r->finished && r->n_have - s < F) F = r->n_have - s; /* the short last window */
    int rc = prepare_window(r, r->next, F, job);
    if (rc < 0) return fail(r, mm3_error_prefix(rc, "window %d: ", r->next));
    r->next++;
    r->in_flow = 1;
    r->n_unfinished++;
    trim_frames(r);
    return 1;
}

int render_window_collect(struct render *r, int flow_rc)
{
    CHECK(r->in_flow);
    r->in_flow = 0;
    struct render_slot *w = &r->slot[(r->next - 1) % 2];
    if (r->failed) return mm3_errorf(r->failed, "render: failed earlier");
    if (flow_rc < 0) return fail(r, mm3_error_prefix(flow_rc, "window %d: ", w->k));
    /* carry [L-344, L-172) of the latents and of the spliced conditioning */
    int C = r->in_ch, D = r->cond_dim, L = w->L;
    int a = L - 2 * RENDER_OVERLAP_LATENTS > 0 ? L - 2 * RENDER_OVERLAP_LATENTS : 0;
    int b = L - RENDER_OVERLAP_LATENTS > a ? L - RENDER_OVERLAP_LATENTS : a;
    r->prev_len = b - a;
    for (int c = 0; c < C; c++)
        memcpy(r->prev_lat + (size_t)c * r->prev_len, w->x + (size_t)c * L + a, sizeof(float) * r->prev_len);
    memcpy(r->prev_cond, w->cond + (size_t)a * D, sizeof(float) * (size_t)r->prev_len * D);
    return 0;
}

int render_window_unfinished(const struct render *r)
{
    return r->n_unfinished - r->in_flow;
}

/* Vocoder, observer, crop and emission of the oldest collected window. Whether it is
 * the last one is decided now: what arrived since it was prepared only adds knowledge. */
static int finish_window(struct render *r)
{
    struct render_slot *w = &r->slot[r->done % 2];
    int k = w->k, L = w->L, rc, last;
    if (r->finished)
        last = k == render_window_count(r->n_have) - 1;
    else
        last = r->n_have > w->s + RENDER_WINDOW_FRAMES ? 0 : -1;
    int total = L * r->hop;
    if ((rc = r->p.decoder.decode(r->p.decoder.ctx, w->x, L, r->wav)) < 0)
        return mm3_error_prefix(rc, "window %d: vocoder: ", k);
    for (size_t i = 0; i < 2 * (size_t)total; i++)
        if (!isfinite(r->wav[i]))
            return mm3_errorf(-ERANGE, "window %d: vocoder sample %zu of channel %zu is not finite", k,
                              i % (size_t)total, i / (size_t)total);
    if (r->p.observer.window_done) {
        struct render_window_info info = {k, w->s, w->F, L, w->ov, w->cond_raw, w->noise, w->x, r->wav};
        if ((rc = r->p.observer.window_done(r->p.observer.ctx, &info)) < 0) return rc;
    }

    int left = k == 0 ? 0 : RENDER_CROP_LEFT * r->hop;
    int right = total - RENDER_CROP_RIGHT * r->hop;
    if (right < left) right = left;
    if (last == 1) return emit_span(r, r->wav, total, left, total);
    if ((rc = emit_span(r, r->wav, total, left, right)) < 0) return rc;
    if (last == -1) {
        /* hold the tail until we know whether another window follows */
        int n = total - right;
        for (int ch = 0; ch < 2; ch++)
            memcpy(r->tail + (size_t)ch * n, r->wav + (size_t)ch * total + right, sizeof(float) * n);
        r->tail_window = k;
        r->tail_n = n;
    }
    return 0;
}

int render_window_finish(struct render *r)
{
    if (r->failed) return mm3_errorf(r->failed, "render: failed earlier");
    if (render_window_unfinished(r) < 1) return 0;
    int rc = finish_window(r);
    if (rc < 0) return fail(r, rc);
    r->done++;
    r->n_unfinished--;
    return 1;
}

/* Frames before the next window's start are no longer needed. */
static void trim_frames(struct render *r)
{
    int keep_from = r->next * RENDER_HOP_FRAMES;
    if (keep_from > r->n_have) keep_from = r->n_have;
    if (keep_from <= r->base) return;
    int drop = keep_from - r->base;
    memmove(r->mixed, r->mixed + (size_t)drop * r->hidden, sizeof(float) * (size_t)(r->n_have - keep_from) * r->hidden);
    r->base = keep_from;
}

int render_push_frames_deferred(struct render *r, const float *frames, int n, int width)
{
    if (r->failed) return mm3_errorf(r->failed, "render: failed earlier; no more frames accepted");
    if (r->finished) return fail(r, mm3_errorf(-EINVAL, "render: frames pushed after the end of the song"));
    if (n < 0) return fail(r, mm3_errorf(-EINVAL, "render: negative frame count %d", n));
    if (n == 0) return 0;
    int held = r->n_have - r->base;
    if (held + n > r->cap) {
        int cap = r->cap ? r->cap : RENDER_WINDOW_FRAMES + RENDER_HOP_FRAMES;
        while (cap < held + n)
            cap *= 2;
        float *m = realloc(r->mixed, sizeof(float) * (size_t)cap * r->hidden);
        if (!m) return fail(r, mm3_errorf(-ENOMEM, "render: out of memory for %d frames", cap));
        r->mixed = m;
        r->cap = cap;
    }
    int rc = condition_mix(r->cm, frames, n, width, r->mixed + (size_t)held * r->hidden);
    if (rc < 0) return fail(r, mm3_error_prefix(rc, "render: frames %d..%d: ", r->n_have, r->n_have + n - 1));
    r->n_have += n;

    /* a frame past the held window's end: it was not the last window */
    if (r->tail_window >= 0 && r->n_have > r->tail_window * RENDER_HOP_FRAMES + RENDER_WINDOW_FRAMES)
        r->tail_window = -1;
    return 0;
}

int render_window_ready(const struct render *r)
{
    /* the carry of the window in flow is not known yet; two slots */
    if (r->failed || r->in_flow || r->n_unfinished >= 2) return 0;
    if (r->finished) return r->next < render_window_count(r->n_have);
    return r->n_have >= r->next * RENDER_HOP_FRAMES + RENDER_WINDOW_FRAMES;
}

int render_complete(const struct render *r)
{
    return !r->failed && r->finished && r->next >= render_window_count(r->n_have) && r->n_unfinished == 0;
}

int render_run_one_window(struct render *r)
{
    if (r->failed) return mm3_errorf(r->failed, "render: failed earlier");
    if (r->in_flow) return mm3_errorf(-EBUSY, "render: a window is out in a flow batch");
    int rc;
    while ((rc = render_window_finish(r)) == 1) /* a batched window before it */
        ;
    if (rc < 0) return rc;
    struct flow_job j;
    if ((rc = render_window_prepare(r, &j)) <= 0) return rc;
    if (r->p.flow.run)
        rc = r->p.flow.run(r->p.flow.ctx, &j);
    else
        rc = flow_window_run(r->dm, r->ws, &j);
    if ((rc = render_window_collect(r, rc)) < 0) return rc;
    if ((rc = render_window_finish(r)) < 0) return rc;
    return 1;
}

int render_push_frames(struct render *r, const float *frames, int n, int width)
{
    int rc = render_push_frames_deferred(r, frames, n, width);
    if (rc < 0) return rc;
    while ((rc = render_run_one_window(r)) == 1)
        ;
    return rc < 0 ? rc : 0;
}

int render_end(struct render *r)
{
    if (r->failed) return mm3_errorf(r->failed, "render: failed earlier");
    if (r->finished) return fail(r, mm3_errorf(-EINVAL, "render: the end of the song was marked twice"));
    r->finished = 1;
    int N = r->n_have, rc;
    if (N < 1) return fail(r, mm3_errorf(-EINVAL, "render: the song has no frames"));
    if (r->tail_window >= 0) {
        /* the held window ended exactly at the last frame: it was the last one */
        CHECK(r->tail_window * RENDER_HOP_FRAMES + RENDER_WINDOW_FRAMES == N);
        r->tail_window = -1;
        if ((rc = emit_span(r, r->tail, r->tail_n, 0, r->tail_n)) < 0) return fail(r, rc);
    }
    return 0;
}

int render_finish(struct render *r)
{
    int rc = render_end(r);
    if (rc < 0) return rc;
    while ((rc = render_run_one_window(r)) == 1)
        ;
    return rc < 0 ? rc : 0;
}

int render_windows_done(const struct render *r)
{
    return r->done;
}

int render_frames_pushed(const struct render *r)
{
    return r->n_have;
}
