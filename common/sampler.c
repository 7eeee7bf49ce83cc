#include "common/sampler.h"

#include <blake2.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/sampler_hash.h"

uint64_t sampler_seed_derive(uint64_t public_seed)
{
    char msg[64];
    int len = snprintf(msg, sizeof msg, "minimax-ttm-ar:%llu", (unsigned long long)public_seed);
    uint8_t d[8];
    CHECK(blake2b(d, msg, NULL, sizeof d, (size_t)len, 0) == 0);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | d[i];
    return v & 0x7FFFFFFFu;
}

uint32_t sampler_murmur(uint64_t seed, uint32_t pos, uint32_t col)
{
    return sampler_hash_murmur(seed, pos, col);
}

double sampler_gumbel(uint64_t seed, uint32_t pos, uint32_t col)
{
    return sampler_hash_gumbel(seed, pos, col);
}

/* Descending order with NaN first, as torch.topk ranks NaN above every number. */
static int cmp_desc_nan_first(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    int xn = isnan(x), yn = isnan(y);
    if (xn || yn) return yn - xn;
    return (x < y) - (x > y);
}

/* The k-th largest value of v[n] (1 <= k <= n); NaN if k NaNs lead. */
static float kth_largest(const float *v, int n, int k)
{
    float *tmp = malloc(sizeof(float) * (size_t)n);
    CHECK(tmp);
    memcpy(tmp, v, sizeof(float) * (size_t)n);
    qsort(tmp, (size_t)n, sizeof(float), cmp_desc_nan_first);
    float t = tmp[k - 1];
    free(tmp);
    return t;
}

void sampler_topk_mask(float *v, int n, int k)
{
    if (k <= 0 || k >= n) return;
    float t = kth_largest(v, n, k);
    for (int i = 0; i < n; i++)
        if (v[i] < t) v[i] = -INFINITY;
}

void sampler_cfg_blend(float *g, const float *c, const float *u, int n, float scale)
{
    for (int i = 0; i < n; i++) {
        float d = c[i] - u[i];
        float m = d * scale;
        g[i] = u[i] + m;
    }
}

void sampler_c0_guide(float *g, const float *c, const float *u, int n, float scale, int top_k)
{
    /* The threshold is taken before g is written: g may alias c. */
    float t = (top_k > 0 && top_k < n) ? kth_largest(c, n, top_k) : -INFINITY;
    float *keep = malloc(sizeof(float) * (size_t)n);
    CHECK(keep);
    for (int i = 0; i < n; i++)
        keep[i] = (c[i] < t) ? 0.0f : 1.0f;
    sampler_cfg_blend(g, c, u, n, scale);
    for (int i = 0; i < n; i++)
        if (keep[i] == 0.0f) g[i] = -INFINITY;
    free(keep);
}

void sampler_init_seeded(struct sampler *s, uint64_t public_seed)
{
    sampler_init_raw(s, sampler_seed_derive(public_seed));
}

void sampler_init_raw(struct sampler *s, uint64_t sampling_seed)
{
    memset(s, 0, sizeof *s);
    s->mode = SAMPLER_SEEDED;
    s->seed = sampling_seed;
    s->top_k = SAMPLER_TOP_K;
}

void sampler_init_replay(struct sampler *s, const int64_t *lm_ids, int n_lm, const int64_t *depth_codes, int n_depth,
                         int n_codebooks)
{
    memset(s, 0, sizeof *s);
    s->mode = SAMPLER_REPLAY;
    s->top_k = SAMPLER_TOP_K;
    s->lm_ids = lm_ids;
    s->n_lm = n_lm;
    s->depth_codes = depth_codes;
    s->n_depth = n_depth;
    s->n_codebooks = n_codebooks;
}

/* v = nan_to_num(g) restricted to its top_k (the candidate set of every draw). */
static float *candidates(const float *g, int n, int top_k)
{
    float *v = malloc(sizeof(float) * (size_t)n);
    CHECK(v);
    for (int i = 0; i < n; i++) {
        float x = g[i];
        if (isnan(x))
            x = -1e9f;
        else if (isinf(x))
            x = x > 0 ? 1e9f : -1e9f;
        v[i] = x;
    }
    sampler_topk_mask(v, n, top_k < n ? top_k : n);
    return v;
}

int sampler_draw_gumbel(uint64_t seed, const float *g, int n, int top_k, uint32_t pos)
{
    float *v = candidates(g, n, top_k);
    int best = 0;
    double best_score = 0.0;
    for (int i = 0; i < n; i++) {
        double score = (double)v[i] + sampler_gumbel(seed, pos, (uint32_t)i);
        /* torch.argmax: the first maximum wins; a NaN counts as maximal. */
        if (i == 0 || score > best_score || (isnan(score) && !isnan(best_score))) {
            best = i;
            best_score = score;
        }
    }
    free(v);
    return best;
}

static int replay_col(struct sampler *s, int n, uint32_t pos, int *col)
{
    int ncb = s->n_codebooks;
    int step = (int)(pos / (uint32_t)ncb), j = (int)(pos % (uint32_t)ncb);
    int64_t id;
    if (j == 0) {
        if (step >= s->n_lm)
            return mm3_errorf(-ERANGE, "replay: no forced c0 draw for step %d (have %d)", step, s->n_lm);
        id = sampler_c0_id_to_col(s->lm_ids[step]);
        if (id < 0)
            return mm3_errorf(-ERANGE, "replay: forced c0 id %lld at step %d is neither stop nor a code",
                              (long long)s->lm_ids[step], step);
    } else {
        int64_t k = (int64_t)(ncb - 1) * step + (j - 1);
        if (k >= s->n_depth)
            return mm3_errorf(-ERANGE, "replay: no forced depth draw for step %d codebook %d (have %d)", step, j,
                              s->n_depth);
        id = s->depth_codes[k];
    }
    if (id < 0 || id >= n)
        return mm3_errorf(-ERANGE, "replay: forced column %lld at step %d codebook %d outside [0, %d)", (long long)id,
                          step, j, n);
    *col = (int)id;
    return 0;
}

int sampler_draw(struct sampler *s, const float *g, int n, uint32_t pos, int *col)
{
    if (s->mode == SAMPLER_SEEDED) {
        *col = sampler_draw_gumbel(s->seed, g, n, s->top_k, pos);
        return 0;
    }
    int rc = replay_col(s, n, pos, col);
    if (rc < 0) return rc;
    float *v = candidates(g, n, s->top_k);
    if (!(v[*col] > -INFINITY)) s->n_outside++;
    free(v);
    return 0;
}
