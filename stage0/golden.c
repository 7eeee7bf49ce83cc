#include "stage0/golden.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/lora_merge.h"
#include "common/safetensors.h"
#include "common/sampler.h"
#include "stage0/generate.h"
#include "stage0/text/generate_prompt.h"

/* Everything one case needs, read from caseN.safetensors. */
struct golden_case {
    int64_t *ids_pair; /* [2, P] */
    int prompt_len;
    int64_t *lm_sampled, *depth_sampled;
    int n_lm, n_depth;
    float *frames; /* [F, ncb*H] */
    int n_frames, frame_width;
    int n_lm_guided, n_depth_guided;
    int64_t **lm_support; /* [n_lm_guided][support_len[i]] */
    float **lm_logits;
    int *support_len;
    float *depth_logits; /* [n_depth_guided, V] */
    int depth_vocab;
};

/* What the replay produced, collected by the hooks. */
struct golden_run {
    const struct golden_case *gc;
    int ncb, hidden;
    float *frames; /* [max_frames, ncb*H] */
    int n_frames;
    float *depth_logits; /* [n_depth_guided, V] in draw order */
    /* c0 draws: our value at each golden support id, and support agreement */
    float *lm_ours, *lm_ref;
    int lm_n;
    int lm_support_mismatch; /* differences that count, over all compared draws */
    int mismatch_draws;      /* compared draws with such differences */
    int lm_slots;            /* candidate slots of the compared draws (their set sizes) */
    int lm_support_swaps;    /* ids at the edge that rounding moved across it (tolerated, bounded) */
    int swap_draws;          /* compared draws with such swaps */
    int forced_on_swap;      /* forced c0 draws that landed on such a tolerated id (outside our set) */
    double tol;
    char support_detail[16384]; /* one line per differing candidate set */
    int support_described;     /* how many lines it holds */
    float *cond;               /* the conditional c0 row of step cond_step */
    int cond_step;
    int n_flips, flips_edge;           /* forced c0 draws outside our set; those at the top-k edge */
    int depth_flips, depth_flips_edge; /* the same for the depth draws */
    int flips_described;               /* how many of them flip_detail holds */
    char flip_detail[4096];            /* one line per flip, the first few */
};

static int load_i64(const struct st_file *f, const char *name, int64_t **out, int *ndim, int64_t *shape)
{
    const struct st_tensor *t = st_file_find(f, name);
    if (!t) return mm3_errorf(-ENOENT, "%s: missing tensor '%s'", f->path, name);
    if (t->dtype != MM3_DTYPE_I64) return mm3_errorf(-EINVAL, "%s: tensor '%s': expected I64", f->path, name);
    *out = malloc(t->nbytes ? t->nbytes : 8);
    if (!*out) return mm3_errorf(-ENOMEM, "%s: out of memory", f->path);
    *ndim = t->ndim;
    memcpy(shape, t->shape, sizeof(int64_t) * ST_MAX_DIMS);
    return st_file_read(f, t, *out);
}

static void case_free(struct golden_case *gc)
{
    free(gc->ids_pair);
    free(gc->lm_sampled);
    free(gc->depth_sampled);
    free(gc->frames);
    for (int i = 0; i < gc->n_lm_guided; i++) {
        free(gc->lm_support[i]);
        free(gc->lm_logits[i]);
    }
    free(gc->lm_support);
    free(gc->lm_logits);
    free(gc->support_len);
    free(gc->depth_logits);
    memset(gc, 0, sizeof *gc);
}

static int case_load(struct golden_case *gc, const char *path)
{
    memset(gc, 0, sizeof *gc);
    struct st_file f;
    int rc = st_file_open(&f, path);
    if (rc < 0) return rc;
    int nd;
    int64_t sh[ST_MAX_DIMS];
    char name[64];
    if ((rc = load_i64(&f, "text_ids_pair", &gc->ids_pair, &nd, sh)) < 0) goto out;
    if (nd != 2 || sh[0] != 2 || sh[1] < 1) {
        rc = mm3_errorf(-EINVAL, "%s: text_ids_pair: expected shape [2, L]", path);
        goto out;
    }
    gc->prompt_len = (int)sh[1];
    if ((rc = load_i64(&f, "lm_sampled", &gc->lm_sampled, &nd, sh)) < 0) goto out;
    gc->n_lm = (int)sh[0];
    if ((rc = load_i64(&f, "depth_sampled", &gc->depth_sampled, &nd, sh)) < 0) goto out;
    gc->n_depth = (int)sh[0];
    if ((rc = st_file_load_f32(&f, "frame_hiddens", &gc->frames, &nd, sh)) < 0) goto out;
    if (nd != 2) {
        rc = mm3_errorf(-EINVAL, "%s: frame_hiddens: expected shape [F, 8H]", path);
        goto out;
    }
    gc->n_frames = (int)sh[0];
    gc->frame_width = (int)sh[1];
    for (;; gc->n_lm_guided++) {
        snprintf(name, sizeof name, "lm_guided_support.%d", gc->n_lm_guided);
        if (!st_file_find(&f, name)) break;
    }
    int n = gc->n_lm_guided;
    gc->lm_support = calloc((size_t)n + 1, sizeof *gc->lm_support);
    gc->lm_logits = calloc((size_t)n + 1, sizeof *gc->lm_logits);
    gc->support_len = calloc((size_t)n + 1, sizeof *gc->support_len);
    if (!gc->lm_support || !gc->lm_logits || !gc->support_len) {
        rc = mm3_errorf(-ENOMEM, "%s: out of memory", path);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        int64_t sh2[ST_MAX_DIMS];
        snprintf(name, sizeof name, "lm_guided_support.%d", i);
        if ((rc = load_i64(&f, name, &gc->lm_support[i], &nd, sh)) < 0) goto out;
        snprintf(name, sizeof name, "lm_guided_logits.%d", i);
        if ((rc = st_file_load_f32(&f, name, &gc->lm_logits[i], &nd, sh2)) < 0) goto out;
        if (sh2[0] != sh[0]) {
            rc = mm3_errorf(-EINVAL, "%s: lm_guided_logits.%d and lm_guided_support.%d differ in length", path, i, i);
            goto out;
        }
        gc->support_len[i] = (int)sh[0];
    }
    for (;; gc->n_depth_guided++) {
        snprintf(name, sizeof name, "depth_guided_logits.%d", gc->n_depth_guided);
        const struct st_tensor *t = st_file_find(&f, name);
        if (!t) break;
        if (gc->n_depth_guided == 0) gc->depth_vocab = (int)t->shape[0];
        if (t->ndim != 1 || t->shape[0] != gc->depth_vocab) {
            rc = mm3_errorf(-EINVAL, "%s: %s: expected shape [%d]", path, name, gc->depth_vocab);
            goto out;
        }
    }
    if (gc->n_depth_guided) {
        gc->depth_logits = malloc(sizeof(float) * (size_t)gc->n_depth_guided * gc->depth_vocab);
        if (!gc->depth_logits) {
            rc = mm3_errorf(-ENOMEM, "%s: out of memory", path);
            goto out;
        }
        for (int i = 0; i < gc->n_depth_guided; i++) {
            snprintf(name, sizeof name, "depth_guided_logits.%d", i);
            int64_t w[1] = {gc->depth_vocab};
            if ((rc = st_file_read_f32(&f, name, gc->depth_logits + (size_t)i * gc->depth_vocab, 1, w)) < 0) goto out;
        }
    }
out:
    st_file_close(&f);
    if (rc < 0) case_free(gc);
    return rc;
}

/* Whether compact column c is in the reference's candidate set ids[k]. */
static int ref_has_col(const int64_t *ids, int k, int c)
{
    for (int i = 0; i < k; i++)
        if (sampler_c0_id_to_col(ids[i]) == c) return 1;
    return 0;
}

int golden_support_compare(const float *guided, int n, const int64_t *ref_ids, const float *ref_logits, int k,
                           double tol, int *swaps)
{
    int n_finite = 0;
    float min_ours = INFINITY, min_ref = INFINITY;
    for (int c = 0; c < n; c++)
        if (isfinite(guided[c])) n_finite++, min_ours = fminf(min_ours, guided[c]);
    double sq = 0;
    for (int i = 0; i < k; i++) {
        min_ref = fminf(min_ref, ref_logits[i]);
        sq += (double)ref_logits[i] * ref_logits[i];
    }
    /* Ids of the reference's set missing from ours (their reference logits) and ids of
     * ours missing from the reference's (our logits). */
    int n_missing = 0, n_extra = 0, bad = 0;
    float miss_lo = INFINITY, miss_hi = -INFINITY, extra_lo = INFINITY, extra_hi = -INFINITY;
    for (int i = 0; i < k; i++) {
        int64_t col = sampler_c0_id_to_col(ref_ids[i]);
        if (col < 0 || col >= n) {
            bad++;
            continue;
        }
        if (isfinite(guided[col])) continue;
        n_missing++;
        miss_lo = fminf(miss_lo, ref_logits[i]);
        miss_hi = fmaxf(miss_hi, ref_logits[i]);
    }
    for (int c = 0; c < n; c++) {
        if (!isfinite(guided[c]) || ref_has_col(ref_ids, k, c)) continue;
        n_extra++;
        extra_lo = fminf(extra_lo, guided[c]);
        extra_hi = fmaxf(extra_hi, guided[c]);
    }
    *swaps = 0;
    if (n_finite != k || bad || n_missing != n_extra) return 1 + bad + n_missing + n_extra;
    if (n_missing == 0) return 0;
    /* The sets may differ only by ids that tie at their lower edge within tol x the
     * logits' RMS: rounding orders such a tie either way, and the replay forces the
     * recorded draws anyway. */
    double edge = tol * sqrt(sq / k);
    int tie = miss_hi - min_ref <= edge && extra_hi - min_ours <= edge && fabsf(miss_hi - extra_lo) <= edge &&
              fabsf(extra_hi - miss_lo) <= edge;
    if (!tie) return n_missing + n_extra;
    *swaps = n_missing;
    return 0;
}

int golden_support_compare_cond(const float *guided, const float *cond, int n, const int64_t *ref_ids, int k,
                                double tol, int *swaps)
{
    *swaps = 0;
    if (n < 1 || k < 1 || k > n) return 1;
    double edge, margin, scale;
    golden_topk_edge(cond, n, k, 0, &edge, &margin, &scale);
    double window = tol * scale;
    int n_finite = 0, n_missing = 0, n_extra = 0, bad = 0, off_edge = 0;
    for (int c = 0; c < n; c++)
        n_finite += isfinite(guided[c]) != 0;
    for (int i = 0; i < k; i++) {
        int64_t col = sampler_c0_id_to_col(ref_ids[i]);
        if (col < 0 || col >= n) {
            bad++;
            continue;
        }
        if (isfinite(guided[col])) continue;
        n_missing++;
        off_edge += !(fabs(edge - (double)cond[col]) <= window);
    }
    for (int c = 0; c < n; c++) {
        if (!isfinite(guided[c]) || ref_has_col(ref_ids, k, c)) continue;
        n_extra++;
        off_edge += !(fabs((double)cond[c] - edge) <= window);
    }
    if (n_finite != k || bad || n_missing != n_extra) return 1 + bad + n_missing + n_extra;
    if (off_edge) return off_edge;
    *swaps = n_missing;
    return 0;
}

int golden_forced_on_swap(const float *guided, int n, const int64_t *ref_ids, int k, int64_t forced_id)
{
    int64_t col = sampler_c0_id_to_col(forced_id);
    return col >= 0 && col < n && !isfinite(guided[col]) && ref_has_col(ref_ids, k, (int)col);
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    if (!isfinite(x)) x = -INFINITY;
    if (!isfinite(y)) y = -INFINITY;
    return x < y ? 1 : x > y ? -1 : 0;
}

void golden_topk_edge(const float *row, int n, int k, int col, double *edge, double *margin, double *scale)
{
    *edge = *margin = *scale = NAN;
    if (n < 1 || k < 1 || col < 0 || col >= n) return;
    if (k > n) k = n;
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return;
    memcpy(v, row, sizeof(float) * (size_t)n);
    qsort(v, (size_t)n, sizeof(float), cmp_desc);
    double sq = 0;
    for (int i = 0; i < k; i++)
        sq += isfinite(v[i]) ? (double)v[i] * v[i] : 0;
    *edge = v[k - 1];
    *margin = *edge - (double)row[col];
    *scale = sqrt(sq / k);
    free(v);
}

/* The sampler's nan_to_num (common/sampler.c candidates). */
static float draw_value(float x)
{
    if (isnan(x)) return -1e9f;
    if (isinf(x)) return x > 0 ? 1e9f : -1e9f;
    return x;
}

int golden_topk_outside(const float *g, int n, int k, int col)
{
    if (col < 0 || col >= n || k <= 0 || k >= n) return 0;
    /* Below the k-th largest value exactly when k values are larger. */
    float x = draw_value(g[col]);
    int above = 0;
    for (int i = 0; i < n && above < k; i++)
        above += draw_value(g[i]) > x;
    return above >= k;
}

int golden_flip_is_edge(double margin, double scale, double tol)
{
    return margin >= 0 && margin <= tol * scale;
}

int golden_flip_budget(int n_draws)
{
    int n = (int)(GOLDEN_FLIP_FRACTION * n_draws);
    return n > 1 ? n : 1;
}

int golden_swap_budget(int n_slots)
{
    int n = (int)(GOLDEN_SWAP_FRACTION * n_slots);
    return n > 1 ? n : 1;
}

int golden_flips_pass(int n_outside, int c0_edge, int c0_draws, int depth_edge, int depth_draws)
{
    return n_outside == c0_edge + depth_edge && c0_edge <= golden_flip_budget(c0_draws) &&
           depth_edge <= golden_flip_budget(depth_draws);
}

/* Appends formatted text to buf[size] (NUL-terminated), cutting it short where it does not fit. */
static void catf(char *buf, size_t size, const char *fmt, ...)
{
    size_t at = strlen(buf);
    if (at + 1 >= size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + at, size - at, fmt, ap);
    va_end(ap);
}

/* Appends a whole line to a report buffer; 0 when it did not fit (the buffer keeps what it had). */
static int append_line(char *buf, size_t size, const char *line)
{
    size_t at = strlen(buf), len = strlen(line);
    if (at + len + 2 > size) return 0;
    memcpy(buf + at, line, len);
    memcpy(buf + at + len, "\n", 2);
    return 1;
}

/* Where an id of a differing candidate set sits against our conditional top-k edge. */
static void describe_id(char *buf, size_t size, const char *what, int64_t id, const char *whose, float guided,
                        const float *cond, int col, double edge, double scale)
{
    if (!cond) {
        catf(buf, size, " %s %lld (%s guided %.6g)", what, (long long)id, whose, guided);
        return;
    }
    double m = (double)cond[col] - edge;
    catf(buf, size, " %s %lld (%s guided %.6g; conditional %.6g, %.3g %s the edge = %.2e x RMS)", what, (long long)id,
         whose, guided, cond[col], fabs(m), m < 0 ? "below" : "above", fabs(m) / scale);
}

/* One line on a draw whose candidate set differs from the reference's: which ids, their
 * logits and, with our conditional row, their distance to the c0 rule's edge. */
static void describe_support(struct golden_run *r, int s, const float *guided, int n, int bad, int cond_rule)
{
    enum { MAX_IDS = 6 };
    const struct golden_case *gc = r->gc;
    const int64_t *ids = gc->lm_support[s];
    int k = gc->support_len[s], n_finite = 0;
    float min_ours = INFINITY, min_ref = INFINITY;
    for (int c = 0; c < n; c++)
        if (isfinite(guided[c])) n_finite++, min_ours = fminf(min_ours, guided[c]);
    for (int i = 0; i < k; i++)
        min_ref = fminf(min_ref, gc->lm_logits[s][i]);
    const float *cond = r->cond_step == s ? r->cond : NULL;
    double edge = NAN, margin, scale = NAN;
    if (cond) golden_topk_edge(cond, n, k, 0, &edge, &margin, &scale);
    const char *verdict = bad ? "DIFFERS" : cond_rule ? "edge swap" : "edge tie";
    char line[1536] = "";
    catf(line, sizeof line, "  c0 draw %d: %s: %d candidates (reference %d), lowest guided %.6g (reference %.6g)", s,
         verdict, n_finite, k, min_ours, min_ref);
    if (cond)
        catf(line, sizeof line, ", conditional top-%d edge %.6g, RMS %.4g, window %.3g (%.1e x RMS)", k, edge, scale,
             r->tol * scale, r->tol);
    catf(line, sizeof line, ";");
    int shown = 0, more = 0;
    for (int i = 0; i < k; i++) {
        int64_t col = sampler_c0_id_to_col(ids[i]);
        int valid = col >= 0 && col < n;
        if (valid && isfinite(guided[col])) continue;
        if (shown == MAX_IDS) {
            more++;
        } else if (!valid) {
            shown++;
            catf(line, sizeof line, " missing %lld (not a c0 column)", (long long)ids[i]);
        } else {
            shown++;
            describe_id(line, sizeof line, "missing", ids[i], "reference", gc->lm_logits[s][i], cond, (int)col, edge,
                        scale);
        }
    }
    shown = 0;
    for (int c = 0; c < n; c++) {
        if (!isfinite(guided[c]) || ref_has_col(ids, k, c)) continue;
        if (shown == MAX_IDS) {
            more++;
            continue;
        }
        shown++;
        describe_id(line, sizeof line, "extra", sampler_c0_col_to_id(c), "our", guided[c], cond, c, edge, scale);
    }
    if (more) catf(line, sizeof line, " ... and %d more ids", more);
    r->support_described += append_line(r->support_detail, sizeof r->support_detail, line);
}

static void on_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    struct golden_run *r = ctx;
    size_t w = (size_t)r->ncb * r->hidden;
    memcpy(r->frames + (size_t)t * w, frame, sizeof(float) * w);
    r->n_frames = t + 1;
}

static void on_c0_logits(void *ctx, int s, const float *cond, const float *uncond, int n)
{
    struct golden_run *r = ctx;
    (void)uncond;
    if (n != SAMPLER_C0_COLS) return;
    memcpy(r->cond, cond, sizeof(float) * SAMPLER_C0_COLS);
    r->cond_step = s;
}

/* One flip, described in flip_detail while it has room. */
static void describe_flip(struct golden_run *r, const char *line)
{
    r->flips_described += append_line(r->flip_detail, sizeof r->flip_detail, line);
}

/* Step s's forced c0 draw, when it falls outside our candidate set guided[n]: a flip,
 * at the edge when within the float error of the conditional top-k value or on an id
 * the candidate-set comparison tolerated (on_swap). */
static void note_flip(struct golden_run *r, int s, const float *guided, int n, int on_swap)
{
    const struct golden_case *gc = r->gc;
    if (s >= gc->n_lm) return;
    int64_t col = sampler_c0_id_to_col(gc->lm_sampled[s]);
    if (col < 0 || col >= n || !golden_topk_outside(guided, n, SAMPLER_TOP_K, (int)col)) return;
    double edge = NAN, margin = NAN, scale = NAN;
    if (r->cond_step == s) golden_topk_edge(r->cond, n, SAMPLER_TOP_K, (int)col, &edge, &margin, &scale);
    int at_edge = on_swap || golden_flip_is_edge(margin, scale, r->tol);
    r->n_flips++;
    r->flips_edge += at_edge;
    char line[400];
    snprintf(line, sizeof line,
             "  c0 flip at step %d: column %lld, conditional logit %.6g is %.3g below the top-%d edge %.6g "
             "(%.2e x the top logits' RMS %.4g; bound %.1e): %s",
             s, (long long)col, r->cond_step == s ? r->cond[col] : NAN, margin, SAMPLER_TOP_K, edge, margin / scale,
             scale, r->tol, at_edge ? "at the edge" : "NOT at the edge");
    describe_flip(r, line);
}

/* A c0 draw: its candidate set and guided logits against the reference's (the first
 * recorded draws), and whether the forced code is outside our set. */
static void note_draw_c0(struct golden_run *r, int s, const float *guided, int n)
{
    const struct golden_case *gc = r->gc;
    int on_swap = 0;
    if (s < gc->n_lm_guided) {
        int k = gc->support_len[s], swaps = 0, bad;
        /* Off float32 an id may cross the c0 rule's threshold, the conditional row's
         * top-k edge, with any guided value: judge by that edge. Float32 keeps the
         * strict guided-space rule. */
        int cond_rule = r->tol > GOLDEN_REL_TOL && r->cond_step == s;
        if (cond_rule)
            bad = golden_support_compare_cond(guided, r->cond, n, gc->lm_support[s], k, r->tol, &swaps);
        else
            bad = golden_support_compare(guided, n, gc->lm_support[s], gc->lm_logits[s], k, r->tol, &swaps);
        if (bad || swaps) describe_support(r, s, guided, n, bad, cond_rule);
        r->lm_slots += k;
        r->lm_support_mismatch += bad;
        r->mismatch_draws += bad > 0;
        r->lm_support_swaps += swaps;
        r->swap_draws += swaps > 0;
        if (!bad && swaps && s < gc->n_lm)
            on_swap = golden_forced_on_swap(guided, n, gc->lm_support[s], k, gc->lm_sampled[s]);
        r->forced_on_swap += on_swap;
        for (int i = 0; i < gc->support_len[s]; i++) {
            int64_t col = sampler_c0_id_to_col(gc->lm_support[s][i]);
            if (col < 0 || col >= n || !isfinite(guided[col])) continue;
            r->lm_ours[r->lm_n] = guided[col];
            r->lm_ref[r->lm_n] = gc->lm_logits[s][i];
            r->lm_n++;
        }
    }
    note_flip(r, s, guided, n, on_swap);
}

/* A depth draw (step s, codebook j): its guided logits for the comparison, and whether
 * the forced code is outside our candidate set, the top-k of the guided row: a depth
 * flip, at the edge when within tol x the RMS of the row's k largest values of it. */
static void note_draw_depth(struct golden_run *r, int s, int j, const float *guided, int n)
{
    const struct golden_case *gc = r->gc;
    int k = s * (r->ncb - 1) + (j - 1);
    if (k < gc->n_depth_guided && n == gc->depth_vocab)
        memcpy(r->depth_logits + (size_t)k * n, guided, sizeof(float) * n);
    if (k >= gc->n_depth) return;
    int64_t code = gc->depth_sampled[k];
    if (code < 0 || code >= n || !golden_topk_outside(guided, n, SAMPLER_TOP_K, (int)code)) return;
    double edge, margin, scale;
    golden_topk_edge(guided, n, SAMPLER_TOP_K, (int)code, &edge, &margin, &scale);
    int at_edge = golden_flip_is_edge(margin, scale, r->tol);
    r->depth_flips++;
    r->depth_flips_edge += at_edge;
    char line[400];
    snprintf(line, sizeof line,
             "  depth flip at step %d codebook %d: code %lld, guided logit %.6g is %.3g below the top-%d edge %.6g "
             "(%.2e x the top logits' RMS %.4g; bound %.1e): %s",
             s, j, (long long)code, guided[code], margin, SAMPLER_TOP_K, edge, margin / scale, scale, r->tol,
             at_edge ? "at the edge" : "NOT at the edge");
    describe_flip(r, line);
}

static void on_draw(void *ctx, int s, int j, const float *guided, int n)
{
    struct golden_run *r = ctx;
    if (j == 0)
        note_draw_c0(r, s, guided, n);
    else
        note_draw_depth(r, s, j, guided, n);
}

static double rel_error(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The prompt must tokenize to the recorded pair exactly; the replay itself runs on
 * the recorded ids so a tokenizer bug does not hide the network's result. */
static int check_text_ids(const char *root, const struct golden_case *gc, const char *caption, const char *lyrics,
                          char *msg, size_t len)
{
    int32_t *ids;
    int n;
    if (generate_prompt_ids(root, caption, lyrics, &ids, &n) < 0) {
        snprintf(msg, len, "text_ids: error (%s)", mm3_last_error());
        return 0;
    }
    int P = gc->prompt_len, ok = n == 2 * P, first = -1;
    for (int i = 0; ok && i < n; i++)
        if (ids[i] != gc->ids_pair[i]) {
            ok = 0;
            first = i;
        }
    if (ok)
        snprintf(msg, len, "text_ids ok");
    else if (first < 0)
        snprintf(msg, len, "text_ids DIFFER (length %d, expected %d)", n / 2, P);
    else
        snprintf(msg, len, "text_ids DIFFER (row %d index %d: %d, expected %lld)", first / P, first % P, ids[first],
                 (long long)gc->ids_pair[first]);
    free(ids);
    return ok;
}

/* The CPU AR loop of stage0/generate.c. */
static int run_generate(void *ctx, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                        const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                        const struct generate_hooks *hooks, enum generate_stop *stop)
{
    (void)ctx;
    struct generate g;
    int rc = generate_begin(&g, lm, dd, sp, ids_pair, prompt_len, max_frames, cfg_scale, hooks);
    if (rc < 0) return rc;
    while (!g.done && rc == 0)
        rc = generate_step(&g);
    *stop = g.stop;
    generate_end(&g);
    return rc;
}

struct golden_runner {
    golden_run_fn run;
    void *ctx;
    double tol;
};

static int run_case(const char *dir, const char *root, json_t *jc, const struct talker *lm, const struct depth *dd,
                    double fps, const struct golden_runner *gr, FILE *out)
{
    const char *file = json_string_value(json_object_get(jc, "file"));
    const char *caption = json_string_value(json_object_get(jc, "prompt"));
    const char *lyrics = json_string_value(json_object_get(jc, "lyrics"));
    json_t *jd = json_object_get(jc, "audio_duration");
    json_t *jcfg = json_object_get(jc, "cfg_scale_ar");
    json_t *jend = json_object_get(jc, "ended_by_audio_end");
    if (!file || !caption || !lyrics || !json_is_number(jd)) {
        fprintf(out, "%s: FAIL manifest entry lacks file/prompt/lyrics/audio_duration\n", file ? file : "?");
        return 0;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    struct golden_case gc;
    int rc = case_load(&gc, path);
    if (rc < 0) {
        fprintf(out, "%s: FAIL %s\n", file, mm3_last_error());
        return 0;
    }
    int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks;
    struct golden_run r = {.gc = &gc, .ncb = ncb, .hidden = H, .tol = gr->tol, .cond_step = -1};
    int pass = 1, max_frames = 0;
    char ids_msg[256];
    pass &= check_text_ids(root, &gc, caption, lyrics, ids_msg, sizeof ids_msg);
    int32_t *ids = malloc(sizeof(int32_t) * 2 * gc.prompt_len);
    int total_support = 0;
    for (int i = 0; i < gc.n_lm_guided; i++)
        total_support += gc.support_len[i];
    r.lm_ours = malloc(sizeof(float) * (total_support + 1));
    r.lm_ref = malloc(sizeof(float) * (total_support + 1));
    r.depth_logits = calloc((size_t)gc.n_depth_guided * gc.depth_vocab + 1, sizeof(float));
    r.cond = malloc(sizeof(float) * SAMPLER_C0_COLS);
    if ((rc = generate_frame_budget(json_number_value(jd), fps, &max_frames)) == 0) {
        r.frames = malloc(sizeof(float) * (size_t)max_frames * ncb * H);
        if (!ids || !r.lm_ours || !r.lm_ref || !r.depth_logits || !r.frames || !r.cond)
            rc = mm3_errorf(-ENOMEM, "%s: out of memory", file);
    }
    if (rc == 0 && gc.frame_width != ncb * H)
        rc = mm3_errorf(-EINVAL, "%s: frame_hiddens width %d, expected n_codebooks * hidden = %d", file, gc.frame_width,
                        ncb * H);
    if (rc == 0 && (gc.n_depth_guided ? gc.depth_vocab != dd->cfg.audio_vocab : 0))
        rc = mm3_errorf(-EINVAL, "%s: depth_guided_logits width %d, expected audio_vocab_size %d", file, gc.depth_vocab,
                        dd->cfg.audio_vocab);
    struct sampler sp = {0};
    enum generate_stop stop = GENERATE_RUNNING;
    if (rc == 0) {
        for (int i = 0; i < 2 * gc.prompt_len; i++)
            ids[i] = (int32_t)gc.ids_pair[i];
        sampler_init_replay(&sp, gc.lm_sampled, gc.n_lm, gc.depth_sampled, gc.n_depth, ncb);
        struct generate_hooks hooks = {
            .ctx = &r, .on_frame = on_frame, .on_draw = on_draw, .on_c0_logits = on_c0_logits};
        float cfg = json_is_number(jcfg) ? (float)json_number_value(jcfg) : SAMPLER_CFG_SCALE;
        rc = gr->run(gr->ctx, lm, dd, &sp, ids, gc.prompt_len, max_frames, cfg, &hooks, &stop);
    }
    if (rc < 0) {
        fprintf(out, "%s: FAIL %s\n", file, mm3_last_error());
        pass = 0;
    } else {
        double rel_lm = rel_error(r.lm_ours, r.lm_ref, (size_t)r.lm_n);
        double rel_depth = rel_error(r.depth_logits, gc.depth_logits ? gc.depth_logits : r.depth_logits,
                                     (size_t)gc.n_depth_guided * gc.depth_vocab);
        int frames_ok = r.n_frames == gc.n_frames;
        double rel_frames = frames_ok ? rel_error(r.frames, gc.frames, (size_t)gc.n_frames * gc.frame_width) : INFINITY;
        int ended = stop == GENERATE_STOP_TOKEN;
        int end_ok = !json_is_boolean(jend) || json_is_true(jend) == ended;
        /* A forced draw outside our set counts unless it is a bounded number of edge
         * flips: the reference drew a code that rounding moved across the top-k edge.
         * Likewise the candidate sets may differ only by a bounded number of edge swaps. */
        int flips_ok = golden_flips_pass(sp.n_outside, r.flips_edge, gc.n_lm, r.depth_flips_edge, gc.n_depth);
        int swap_budget = golden_swap_budget(r.lm_slots);
        int swaps_ok = r.lm_support_swaps <= swap_budget;
        pass &= frames_ok && end_ok && r.lm_support_mismatch == 0 && swaps_ok && flips_ok && rel_lm <= gr->tol &&
                rel_depth <= gr->tol && rel_frames <= gr->tol;
        char differs[64] = "", off_edge[96] = "", uncounted[128] = "";
        if (r.mismatch_draws) snprintf(differs, sizeof differs, ", SUPPORT DIFFERS in %d draws", r.mismatch_draws);
        int n_off = sp.n_outside - r.flips_edge - r.depth_flips_edge;
        if (n_off > 0)
            snprintf(off_edge, sizeof off_edge, " (%d forced draws outside the candidate set, off the edge)", n_off);
        if (sp.n_outside != r.n_flips + r.depth_flips)
            snprintf(uncounted, sizeof uncounted,
                     " (the sampler counted %d forced draws outside the candidate set, the check %d)", sp.n_outside,
                     r.n_flips + r.depth_flips);
        fprintf(out,
                "%s: frames %d/%d%s lm_guided rel %.3g (%.1f dB; bound %.1e; %d draws%s) depth_guided rel %.3g "
                "(%.1f dB; %d draws) frame_hiddens rel %.3g (%.1f dB; bound %.1e) c0 edge flips %d (bound %d) "
                "depth edge flips %d (bound %d) c0 edge swaps %d in %d draws (bound %d)%s%s%s %s %s\n",
                file, r.n_frames, gc.n_frames, end_ok ? "" : " (stop reason differs)", rel_lm, -20 * log10(rel_lm),
                gr->tol, gc.n_lm_guided, differs, rel_depth, -20 * log10(rel_depth), gc.n_depth_guided, rel_frames,
                -20 * log10(rel_frames), gr->tol, r.flips_edge, golden_flip_budget(gc.n_lm), r.depth_flips_edge,
                golden_flip_budget(gc.n_depth), r.lm_support_swaps, r.swap_draws, swap_budget, off_edge, uncounted,
                r.forced_on_swap ? " (a forced draw on an edge-swapped id)" : "", ids_msg, pass ? "PASS" : "FAIL");
    }
    fputs(r.support_detail, out);
    int n_differ = r.mismatch_draws + r.swap_draws, n_flips = r.n_flips + r.depth_flips;
    if (n_differ > r.support_described)
        fprintf(out, "  ... and %d more c0 draws with another candidate set\n", n_differ - r.support_described);
    fputs(r.flip_detail, out);
    if (n_flips > r.flips_described) fprintf(out, "  ... and %d more flips\n", n_flips - r.flips_described);
    free(ids);
    free(r.lm_ours);
    free(r.lm_ref);
    free(r.depth_logits);
    free(r.frames);
    free(r.cond);
    case_free(&gc);
    return pass;
}

int golden_check_dir(const char *dir, FILE *out, int *n_pass, int *n_fail)
{
    return golden_check_dir_with(dir, run_generate, NULL, TALKER_BACKEND_CPU, GOLDEN_REL_TOL, out, n_pass, n_fail);
}

int golden_check_dir_with(const char *dir, golden_run_fn run, void *ctx, enum talker_backend_kind models_for,
                          double tol, FILE *out, int *n_pass, int *n_fail)
{
    const struct golden_runner gr = {.run = run, .ctx = ctx, .tol = tol};
    *n_pass = *n_fail = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t e;
    json_t *man = json_load_file(path, 0, &e);
    if (!man) return mm3_errorf(-ENOENT, "%s: cannot read: %s", path, e.text);
    json_t *cases = json_object_get(man, "cases");
    const char *ck = json_string_value(json_object_get(man, "checkpoint"));
    int rc = 0;
    if (!json_is_array(cases) || !ck) {
        rc = mm3_errorf(-EINVAL, "%s: expected keys 'cases' (array) and 'checkpoint' (string)", path);
        goto out;
    }
    char root[4096];
    snprintf(root, sizeof root, "%s/%s", dir, ck);
    struct talker lm;
    struct depth dd;
    double fps;
    if ((rc = generate_frame_rate(root, &fps)) < 0) goto out;
    static const char *const lora_components[] = {"language_model", "rvq_depth_decoder"};
    if ((rc = lora_merge_add_golden(dir, man, lora_components, 2)) < 0) goto out;
    if ((rc = talker_backend_load_models(models_for, root, &lm, &dd)) < 0) goto out;
    size_t i;
    json_t *jc;
    json_array_foreach(cases, i, jc)
    {
        if (run_case(dir, root, jc, &lm, &dd, fps, &gr, out))
            (*n_pass)++;
        else
            (*n_fail)++;
        fflush(out);
    }
    talker_free(&lm);
    depth_free(&dd);
out:
    lora_merge_clear();
    json_decref(man);
    if (rc == 0) fprintf(out, "%d passed, %d failed\n", *n_pass, *n_fail);
    return rc;
}
