/* Golden replay of stage 1 (stage1/golden.h). */
#include "stage1/golden.h"
#include "stage1/backend.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "common/lora_merge.h"
#include "common/safetensors.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/flow.h"
#include "stage1/golden_bounds.h"
#include "stage1/render.h"
#include "stage1/vocoder.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/dit_cuda.h"
#include "stage1/cuda/flow_cuda.h"
#endif

#define GOLDEN_MAX_WINDOWS 512

struct models {
    struct condition_model *cm;
    struct dit_model *dm;
    struct vocoder *voc;
    struct s1_backend be;   /* backend cuda: the GPU DiT, flow loop and vocoder */
    struct flow_cuda *fc;   /* be.flow, for the single DiT-call checks */
    struct golden_bounds b; /* dit_call: one DiT forward; latents: what the flow loop
                             * produced; audio: what the vocoder made of them (waveform too) */
    float shift;            /* the checkpoint's scheduler shift, as the reference pipeline used it */
};

/* Per case: the file, what has been compared so far and the collected audio. */
struct golden_case {
    struct st_file *f;
    const char *name;
    int ok;
    double tol_flow, tol_audio;
    double cond_max;
    double lat[GOLDEN_MAX_WINDOWS];
    int n_windows;
    double wav0;  /* < 0: not recorded */
    float *audio; /* [2][cap] while collecting: channel 0 then channel 1 halves */
    int64_t n_audio, cap_audio;
};

static double rel_error(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0) return sqrt(num);
    double r = sqrt(num / den);
    return isnan(r) ? INFINITY : r;
}

/* " name rel (SNR dB; bound B)": SNR = -20 log10 rel, the signal over the error's energy. */
static void put_rel(FILE *out, const char *name, double rel, double bound)
{
    fprintf(out, "  %s %.2e (%.1f dB; bound %.1e)", name, rel, -20 * log10(rel), bound);
}

/* A comparison fails the case unless rel <= tol (NaN fails). */
static void note(struct golden_case *gc, double rel, double tol)
{
    if (!(rel <= tol)) gc->ok = 0;
}

/* Load key as float32 and require exactly `want` values. */
static int load_exact(const struct st_file *f, const char *key, size_t want, float **out)
{
    int nd;
    int64_t sh[ST_MAX_DIMS];
    int rc = st_file_load_f32(f, key, out, &nd, sh);
    if (rc < 0) return rc;
    size_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= (size_t)sh[i];
    if (n != want) {
        free(*out);
        *out = NULL;
        return mm3_errorf(-EINVAL, "%s: tensor '%s': %zu values, expected %zu", f->path, key, n, want);
    }
    return 0;
}

static int decode_cb(void *ctx, const float *latents, int L, float *pcm)
{
    return vocoder_decode(ctx, latents, L, pcm);
}

static int sink_cb(void *ctx, const float *pcm, int n)
{
    struct golden_case *gc = ctx;
    if (gc->n_audio + n > gc->cap_audio) {
        int64_t cap = gc->cap_audio ? gc->cap_audio : 1 << 16;
        while (cap < gc->n_audio + n)
            cap *= 2;
        float *a = malloc(sizeof(float) * 2 * (size_t)cap);
        if (!a) return -1;
        if (gc->audio) {
            memcpy(a, gc->audio, sizeof(float) * (size_t)gc->n_audio);
            memcpy(a + cap, gc->audio + gc->cap_audio, sizeof(float) * (size_t)gc->n_audio);
        }
        free(gc->audio);
        gc->audio = a;
        gc->cap_audio = cap;
    }
    memcpy(gc->audio + gc->n_audio, pcm, sizeof(float) * n);
    memcpy(gc->audio + gc->cap_audio + gc->n_audio, pcm + n, sizeof(float) * n);
    gc->n_audio += n;
    return 0;
}

static int window_cb(void *ctx, const struct render_window_info *i)
{
    struct golden_case *gc = ctx;
    char key[64];
    float *ref;
    int rc;
    if (i->index >= GOLDEN_MAX_WINDOWS)
        return mm3_errorf(-EINVAL, "%s: more than %d windows", gc->name, GOLDEN_MAX_WINDOWS);
    /* sizes from the ref tensors: condition [L, C], latents [C_in, L] */
    size_t n_lat = 0, n_cond = 0;
    snprintf(key, sizeof key, "window.%d.latents", i->index);
    const struct st_tensor *t = st_file_find(gc->f, key);
    if (!t) return mm3_errorf(-EINVAL, "%s: no tensor '%s'", gc->name, key);
    n_lat = st_tensor_numel(t);
    snprintf(key, sizeof key, "window.%d.condition", i->index);
    t = st_file_find(gc->f, key);
    if (!t) return mm3_errorf(-EINVAL, "%s: no tensor '%s'", gc->name, key);
    n_cond = st_tensor_numel(t);
    if (n_lat % (size_t)i->L || n_cond % (size_t)i->L)
        return mm3_errorf(-EINVAL, "%s: window %d: recorded sizes do not fit L = %d", gc->name, i->index, i->L);

    if ((rc = load_exact(gc->f, key, n_cond, &ref)) < 0) return rc;
    double r = rel_error(i->condition, ref, n_cond);
    free(ref);
    if (r > gc->cond_max || isnan(r)) gc->cond_max = r;
    note(gc, r, GOLDEN_REL_TOL); /* float32 on every backend (the GPU projection too) */

    snprintf(key, sizeof key, "window.%d.latents", i->index);
    if ((rc = load_exact(gc->f, key, n_lat, &ref)) < 0) return rc;
    gc->lat[i->index] = rel_error(i->latents, ref, n_lat);
    free(ref);
    note(gc, gc->lat[i->index], gc->tol_flow);
    if (i->index + 1 > gc->n_windows) gc->n_windows = i->index + 1;

    if (i->index == 0 && st_file_find(gc->f, "window.0.waveform")) {
        size_t n = st_tensor_numel(st_file_find(gc->f, "window.0.waveform"));
        if (n % 2) return mm3_errorf(-EINVAL, "%s: window.0.waveform: odd size", gc->name);
        if ((rc = load_exact(gc->f, "window.0.waveform", n, &ref)) < 0) return rc;
        gc->wav0 = rel_error(i->waveform, ref, n);
        free(ref);
        note(gc, gc->wav0, gc->tol_audio);
    }
    return 0;
}

#ifdef MM3_HAVE_CUDA
/* v[in_ch, L] = the GPU DiT on one sequence (host arrays in and out). */
static int dit_forward_cuda(struct flow_cuda *fc, int L, const float *x, const float *t, const float *cond, float *v)
{
    const struct dit_config *g = dit_cuda_config(flow_cuda_dit(fc));
    size_t n = (size_t)g->in_ch * L, nc = (size_t)L * g->cond_dim;
    void *dx = NULL, *dt = NULL, *dc = NULL, *dv = NULL, *s = flow_cuda_stream(fc);
    int rc;
    if ((rc = cuda_malloc(&dx, 4 * n)) == 0 && (rc = cuda_malloc(&dt, 4)) == 0 &&
        (rc = cuda_malloc(&dc, 4 * nc)) == 0 && (rc = cuda_malloc(&dv, 4 * n)) == 0 &&
        (rc = cuda_memcpy_h2d(dx, x, 4 * n)) == 0 && (rc = cuda_memcpy_h2d(dt, t, 4)) == 0 &&
        (rc = cuda_memcpy_h2d(dc, cond, 4 * nc)) == 0) {
        const float *conds[1] = {dc};
        if ((rc = dit_cuda_forward(flow_cuda_dit(fc), 1, L, dx, dt, conds, dv, s)) == 0 &&
            (rc = cuda_stream_sync(s)) == 0)
            rc = cuda_memcpy_d2h(v, dv, 4 * n);
    }
    cuda_free(dx), cuda_free(dt), cuda_free(dc), cuda_free(dv);
    return rc;
}
#endif

/* One recorded DiT call: rel error of our output against `out`. */
static int check_dit_call(const struct models *m, const struct st_file *f, int call, double *rel)
{
    char k[64];
    float *hs = NULL, *ts = NULL, *ehs = NULL, *out = NULL, *v = NULL;
    struct dit_workspace *ws = NULL;
    int nd, rc;
    int64_t sh[ST_MAX_DIMS];
    snprintf(k, sizeof k, "dit_call.%d.hidden_states", call);
    if ((rc = st_file_load_f32(f, k, &hs, &nd, sh)) < 0) goto out;
    if (nd != 3 || sh[0] != 1 || sh[1] != m->dm->cfg.in_ch) {
        rc = mm3_errorf(-EINVAL, "%s: '%s': expected [1, %d, L]", f->path, k, m->dm->cfg.in_ch);
        goto out;
    }
    int L = (int)sh[2];
    size_t n = (size_t)m->dm->cfg.in_ch * L;
    snprintf(k, sizeof k, "dit_call.%d.timestep", call);
    if ((rc = load_exact(f, k, 1, &ts)) < 0) goto out;
    snprintf(k, sizeof k, "dit_call.%d.encoder_hidden_states", call);
    if ((rc = load_exact(f, k, (size_t)L * m->dm->cfg.cond_dim, &ehs)) < 0) goto out;
    snprintf(k, sizeof k, "dit_call.%d.out", call);
    if ((rc = load_exact(f, k, n, &out)) < 0) goto out;
    if (!(v = malloc(sizeof(float) * n))) {
        rc = mm3_errorf(-ENOMEM, "golden: out of memory");
        goto out;
    }
    if (m->fc) {
#ifdef MM3_HAVE_CUDA
        if ((rc = dit_forward_cuda(m->fc, L, hs, ts, ehs, v)) < 0) goto out;
#endif
    } else {
        if ((rc = dit_workspace_alloc(&ws, m->dm, L)) < 0) goto out;
        const float *conds[1] = {ehs};
        if ((rc = dit_forward(m->dm, ws, 1, L, hs, ts, conds, v)) < 0) goto out;
    }
    *rel = rel_error(v, out, n);
out:
    dit_workspace_free(ws);
    free(hs), free(ts), free(ehs), free(out), free(v);
    return rc;
}

/* Render the case from its frames with the recorded noise; compares via window_cb. */
static int render_case(const struct models *m, struct golden_case *gc, int steps, float guidance)
{
    float *frames = NULL;
    float *noise[GOLDEN_MAX_WINDOWS] = {0};
    int64_t noise_len[GOLDEN_MAX_WINDOWS] = {0};
    struct render *r = NULL;
    int nd, rc, n_noise = 0;
    int64_t sh[ST_MAX_DIMS];
    if ((rc = st_file_load_f32(gc->f, "frame_hiddens", &frames, &nd, sh)) < 0) goto out;
    if (nd != 2) {
        rc = mm3_errorf(-EINVAL, "%s: frame_hiddens: expected [F, width]", gc->name);
        goto out;
    }
    int F = (int)sh[0], W = (int)sh[1];
    for (; n_noise < GOLDEN_MAX_WINDOWS; n_noise++) {
        char k[64];
        snprintf(k, sizeof k, "window.%d.noise", n_noise);
        const struct st_tensor *t = st_file_find(gc->f, k);
        if (!t) break;
        noise_len[n_noise] = (int64_t)st_tensor_numel(t);
        if ((rc = st_file_load_f32(gc->f, k, &noise[n_noise], &nd, sh)) < 0) goto out;
    }
    struct render_params p = {
        .n_steps = steps,
        .guidance = guidance,
        .shift = m->shift,
        .noise = {RENDER_NOISE_REPLAY, 0, n_noise, (const float *const *)noise, noise_len},
        .decoder = {m->voc, vocoder_hop(m->voc), decode_cb},
        .sink = {gc, sink_cb},
        .observer = {gc, window_cb},
    };
#ifdef MM3_HAVE_CUDA
    s1_backend_apply(&m->be, &p);
#endif
    if ((rc = render_create(&r, m->cm, m->dm, &p)) < 0) goto out;
    /* uneven pieces, so windows start mid-push as they would from a live stage 0 */
    for (int f0 = 0; f0 < F && rc == 0;) {
        int n = F - f0 < 37 ? F - f0 : 37;
        rc = render_push_frames(r, frames + (size_t)f0 * W, n, W);
        f0 += n;
    }
    if (rc == 0) rc = render_finish(r);
out:
    render_free(r);
    free(frames);
    for (int i = 0; i < n_noise; i++)
        free(noise[i]);
    return rc;
}

static int run_case(const struct models *m, const char *dir, json_t *jc, FILE *out)
{
    const char *file = json_string_value(json_object_get(jc, "file"));
    json_t *js = json_object_get(jc, "num_inference_steps"), *jg = json_object_get(jc, "guidance_scale_dit");
    if (!file || !json_is_integer(js)) {
        fprintf(out, "(case without 'file'/'num_inference_steps'): FAIL\n");
        return 0;
    }
    int steps = (int)json_integer_value(js);
    float guidance = json_is_number(jg) ? (float)json_number_value(jg) : FLOW_DEFAULT_GUIDANCE;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct st_file f;
    struct golden_case gc = {.f = &f,
                             .name = file,
                             .ok = 1,
                             .tol_flow = m->b.bound[GOLDEN_Q_LATENTS],
                             .tol_audio = m->b.bound[GOLDEN_Q_AUDIO],
                             .wav0 = -1};
    double d0 = NAN, d1 = NAN, audio = NAN;
    int rc = st_file_open(&f, path);
    if (rc < 0) {
        fprintf(out, "%s: FAIL (%s)\n", file, mm3_last_error());
        return 0;
    }
    if ((rc = check_dit_call(m, &f, 0, &d0)) == 0) rc = check_dit_call(m, &f, 1, &d1);
    if (rc == 0) {
        note(&gc, d0, m->b.bound[GOLDEN_Q_DIT_CALL]);
        note(&gc, d1, m->b.bound[GOLDEN_Q_DIT_CALL]);
        rc = render_case(m, &gc, steps, guidance);
    }
    int64_t want = -1;
    if (rc == 0) {
        float *ref = NULL;
        int nd;
        int64_t sh[ST_MAX_DIMS];
        if ((rc = st_file_load_f32(&f, "audio", &ref, &nd, sh)) == 0) {
            want = nd == 2 && sh[0] == 2 ? sh[1] : -1;
            if (want != gc.n_audio) {
                gc.ok = 0;
            } else {
                /* channel 0 and channel 1 of ours live at audio and audio + cap */
                double num = 0, den = 0;
                for (int ch = 0; ch < 2; ch++)
                    for (int64_t i = 0; i < want; i++) {
                        double d = (double)gc.audio[ch * gc.cap_audio + i] - ref[ch * want + i];
                        num += d * d;
                        den += (double)ref[ch * want + i] * ref[ch * want + i];
                    }
                audio = den > 0 ? sqrt(num / den) : sqrt(num);
                note(&gc, audio, gc.tol_audio);
            }
            free(ref);
        }
    }
    /* Each quantity at its worst (a NaN stays a NaN), the parts in brackets. */
    double dit = isnan(d0) || isnan(d1) ? NAN : fmax(d0, d1), lat = gc.n_windows ? 0 : NAN;
    for (int w = 0; w < gc.n_windows; w++)
        lat = isnan(lat) || isnan(gc.lat[w]) ? NAN : fmax(lat, gc.lat[w]);
    fprintf(out, "%s:", file);
    put_rel(out, "dit_call", dit, m->b.bound[GOLDEN_Q_DIT_CALL]);
    fprintf(out, " [calls %.2e %.2e]", d0, d1);
    put_rel(out, "condition", gc.cond_max, GOLDEN_REL_TOL);
    put_rel(out, "latents", lat, gc.tol_flow);
    fprintf(out, " [windows");
    for (int w = 0; w < gc.n_windows; w++)
        fprintf(out, " %.2e", gc.lat[w]);
    fprintf(out, "]");
    if (gc.wav0 >= 0) put_rel(out, "waveform0", gc.wav0, gc.tol_audio);
    put_rel(out, "audio", audio, gc.tol_audio);
    fprintf(out, " (%lld of %lld samples): ", (long long)gc.n_audio, (long long)want);
    if (rc < 0) gc.ok = 0;
    if (rc < 0)
        fprintf(out, "FAIL (%s)\n", mm3_last_error());
    else
        fprintf(out, "%s\n", gc.ok ? "ok" : "FAIL");
    free(gc.audio);
    st_file_close(&f);
    return gc.ok;
}

/* The bounds of o's backend and precision (golden_bounds.h): the tiny ones, widened by
 * DIR/yardsticks.json on the GPU when it is there. */
static int pick_bounds(const char *dir, const struct golden_options *o, struct golden_bounds *b, FILE *out)
{
    golden_bounds_tiny(b, o->backend, o->precision);
    if (o->backend != MM3_BACKEND_CUDA) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/yardsticks.json", dir);
    if (access(path, F_OK) != 0) return 0;
    int rc = golden_bounds_apply_yardsticks(b, path, o->precision);
    if (rc < 0) return rc;
    fprintf(out, "yardsticks %s, PyTorch %s against its float32:", path, mm3_matmul_precision_name(o->precision));
    for (int q = 0; q < GOLDEN_Q_COUNT; q++) {
        if (b->yardstick[q] >= 0)
            fprintf(out, " %s %.2e (%.1f dB)", golden_quantity_name(q), b->yardstick[q], -20 * log10(b->yardstick[q]));
        else
            fprintf(out, " %s -", golden_quantity_name(q));
    }
    fprintf(out, "; bound = max(tiny, %.2fx PyTorch's)\n", GOLDEN_YARDSTICK_FACTOR);
    return 0;
}

/* Backend cuda: the GPU DiT + flow loop for windows of the render's size. */
static int models_load_cuda(struct models *m, const struct golden_options *o, const char *root, FILE *out)
{
#ifdef MM3_HAVE_CUDA
    if (cuda_device_count_safe() < 1) return mm3_errorf(-ENODEV, "golden: backend cuda: no CUDA device is present");
    int rc = s1_backend_open(&m->be, MM3_BACKEND_CUDA, 0, m->cm, m->dm, m->voc, o->precision);
    if (rc < 0) return rc;
    vocoder_drop_weights(m->voc); /* render_case decodes through the GPU copy (s1_backend_apply) */
    m->fc = m->be.flow;
    char dev[256];
    if (cuda_device_describe(dev, sizeof dev) < 0) snprintf(dev, sizeof dev, "?");
    fprintf(out,
            "backend cuda (%s), matmul precision %s: tolerance %.1e per DiT call, %.1e after the flow loop, %.1e "
            "after the vocoder\n",
            dev, mm3_matmul_precision_name(o->precision), m->b.bound[GOLDEN_Q_DIT_CALL], m->b.bound[GOLDEN_Q_LATENTS],
            m->b.bound[GOLDEN_Q_AUDIO]);
    return 0;
#else
    (void)m, (void)o, (void)root, (void)out;
    return mm3_errorf(-ENOTSUP, "golden: backend cuda: this build has no CUDA (configure with -DMM3_CUDA=ON)");
#endif
}

int golden_run(const char *dir, const struct golden_options *o, FILE *out, int *n_pass, int *n_fail)
{
    *n_pass = *n_fail = 0;
    const char *ckpt = o->ckpt;
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t je;
    json_t *man = json_load_file(path, 0, &je);
    if (!man) return mm3_errorf(-EINVAL, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    json_t *cases = json_object_get(man, "cases");
    if (!json_is_array(cases)) {
        json_decref(man);
        return mm3_errorf(-EINVAL, "%s: key 'cases': expected an array", path);
    }
    char root[4096];
    if (ckpt) {
        snprintf(root, sizeof root, "%s", ckpt);
    } else {
        const char *c = json_string_value(json_object_get(man, "checkpoint"));
        snprintf(root, sizeof root, "%s/%s", dir, c ? c : "checkpoint");
    }
    struct models m = {0};
    int rc;
    if ((rc = pick_bounds(dir, o, &m.b, out)) < 0) goto out;
    static const char *const lora_components[] = {"transformer"};
    if ((rc = lora_merge_add_golden(dir, man, lora_components, 1)) < 0) goto out;
    if ((rc = condition_load(&m.cm, root)) < 0 || (rc = dit_load(&m.dm, root)) < 0 ||
        (rc = vocoder_load(&m.voc, root)) < 0 || (rc = flow_checkpoint_shift(root, &m.shift)) < 0)
        goto out;
    if (vocoder_latent_channels(m.voc) != m.dm->cfg.in_ch) {
        rc = mm3_errorf(-EINVAL, "%s: vocoder latent_channels %d != transformer in_channels %d", root,
                        vocoder_latent_channels(m.voc), m.dm->cfg.in_ch);
        goto out;
    }
    if (o->backend == MM3_BACKEND_CUDA && (rc = models_load_cuda(&m, o, root, out)) < 0) goto out;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        if (run_case(&m, dir, json_array_get(cases, i), out))
            ++*n_pass;
        else
            ++*n_fail;
        fflush(out);
    }
out:
    lora_merge_clear();
    s1_backend_close(&m.be);
    condition_free(m.cm);
    dit_free(m.dm);
    vocoder_free(m.voc);
    json_decref(man);
    return rc;
}
