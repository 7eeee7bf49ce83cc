/* Stage 1's real-time capacity from a fitted batch cost (stage1/capacity.h). */
#include "stage1/capacity.h"

#include <math.h>

void s1_capacity_init(struct s1_capacity *c, int max_batch)
{
    *c = (struct s1_capacity){.max_batch = max_batch > 0 ? max_batch : 1};
}

void s1_capacity_batch(struct s1_capacity *c, int n, double seconds)
{
    if (n < 1 || !(seconds >= 0) || !isfinite(seconds)) return;
    double k = CAPACITY_DECAY;
    c->w = c->w * k + 1;
    c->wn = c->wn * k + n;
    c->wnn = c->wnn * k + (double)n * n;
    c->wt = c->wt * k + seconds;
    c->wnt = c->wnt * k + n * seconds;
}

void s1_capacity_window(struct s1_capacity *c, double extra_s, double audio_s)
{
    if (!(extra_s >= 0 && audio_s > 0 && isfinite(extra_s) && isfinite(audio_s))) return;
    double k = CAPACITY_DECAY;
    c->windows = c->windows * k + 1;
    c->extra_s = c->extra_s * k + extra_s;
    c->audio_s = c->audio_s * k + audio_s;
}

int s1_capacity_fit(const struct s1_capacity *c, double *a, double *b)
{
    if (c->w <= 0 || c->wn <= 0) return -1;
    double mean_n = c->wn / c->w, mean_t = c->wt / c->w;
    double var_n = c->wnn / c->w - mean_n * mean_n, cov = c->wnt / c->w - mean_n * mean_t;
    /* one batch size (or nearly): no slope to fit, all of the cost per window */
    if (var_n < 1e-3 * mean_n * mean_n) {
        *a = 0;
        *b = c->wt / c->wn;
        return 0;
    }
    *b = cov / var_n;
    *a = mean_t - *b * mean_n;
    if (*b < 0) { /* larger batches measured no dearer: count the mean cost per batch */
        *b = 0;
        *a = mean_t;
    } else if (*a < 0) { /* no fixed cost to speak of: proportional */
        *a = 0;
        *b = c->wt / c->wn;
    }
    return 0;
}

double s1_capacity_streams(const struct s1_capacity *c)
{
    double a, b;
    if (c->windows <= 0 || s1_capacity_fit(c, &a, &b) < 0) return -1;
    double h = c->audio_s / c->windows, per = b + c->extra_s / c->windows;
    int B = c->max_batch;
    if (a <= 0 && per <= 0) return INFINITY;
    /* cost(k) = ceil(k / B) a + k per grows with k: walk up to the last k that fits */
    double cost = 0;
    for (int k = 1; k <= 1 << 20; k++) {
        double next = cost + per + ((k - 1) % B == 0 ? a : 0);
        if (next > h) return (k - 1) + (h - cost) / (next - cost);
        cost = next;
    }
    return 1 << 20;
}
