/* Euler + CFG flow sampler (stage1/flow.h). */
#include "stage1/flow.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"

void flow_schedule_fill(float *table, int n_steps, float shift)
{
    /* numpy.linspace(1.0, 1.0 / N, N): y = i * step + start, last element = stop */
    double start = 1.0, stop = 1.0 / n_steps;
    double step = n_steps > 1 ? (stop - start) / (n_steps - 1) : 0.0;
    /* numpy on a float32 array with a Python float: the scalar rounds to float32 and every
     * operation rounds to float32; (shift - 1) is a Python subtraction, then rounded */
    float s = shift, s_minus_1 = (float)((double)shift - 1.0);
    for (int i = 0; i < n_steps; i++) {
        double sigma = (n_steps > 1 && i == n_steps - 1) ? stop : (double)i * step + start;
        float sg = (float)sigma;
        float num = s * sg, den = 1.0f + s_minus_1 * sg;
        table[i] = 1.0f - num / den;
    }
    table[n_steps] = 1.0f;
}

int flow_checkpoint_shift(const char *model_dir, float *shift)
{
    char path[4096];
    struct stat st;
    *shift = FLOW_DEFAULT_SHIFT;
    if (snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", model_dir) >= (int)sizeof path)
        return mm3_errorf(-ENAMETOOLONG, "%s: checkpoint path too long", model_dir);
    if (stat(path, &st) != 0) return 0;
    json_error_t e;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &e);
    if (!o) return mm3_errorf(-EINVAL, "%s:%d:%d: malformed JSON: %s", path, e.line, e.column, e.text);
    int rc = 0;
    json_t *v = json_is_object(o) ? json_object_get(o, "shift") : NULL;
    if (!json_is_object(o)) {
        rc = mm3_errorf(-EINVAL, "%s: expected a JSON object", path);
    } else if (v) {
        double d = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(d > 0.0 && d <= FLOW_MAX_SHIFT))
            rc = mm3_errorf(-EINVAL, "%s: shift: expected a number in (0, %g]", path, (double)FLOW_MAX_SHIFT);
        else
            *shift = (float)d;
    }
    json_decref(o);
    return rc;
}

int flow_window_run(const struct dit_model *m, struct dit_workspace *ws, const struct flow_job *j)
{
    const int n_steps = j->n_steps, L = j->L, ov = j->ov;
    const float guidance = j->guidance, shift = j->shift;
    const float *cond = j->cond, *prev = j->prev;
    float *x = j->x;
    const struct dit_config *g = &m->cfg;
    int C = g->in_ch;
    size_t n = (size_t)C * L;
    float *table = malloc(sizeof(float) * (size_t)(n_steps + 1));
    float *xb = malloc(sizeof(float) * 2 * n); /* the same x for both branches */
    float *vb = malloc(sizeof(float) * 2 * n); /* v_c then v_u */
    float *np = malloc(sizeof(float) * ((size_t)C * ov + 1));
    int rc = 0;
    if (!(shift > 0.0f)) {
        rc = mm3_errorf(-EINVAL, "flow: shift %g: expected > 0", (double)shift);
        goto out;
    }
    if (!table || !xb || !vb || !np) {
        rc = mm3_errorf(-ENOMEM, "flow: out of memory for a window of %d latents", L);
        goto out;
    }
    flow_schedule_fill(table, n_steps, shift);
    for (int c = 0; c < C; c++)
        memcpy(np + (size_t)c * ov, x + (size_t)c * L, sizeof(float) * ov);
    /* fp32(1 - 1e-6) as torch rounds the Python scalar for a float32 tensor */
    const float one_minus_sigma_min = (float)(1.0 - 1e-6);
    const float *conds[2] = {cond, NULL};
    for (int i = 0; i < n_steps; i++) {
        float t = table[i];
        if (ov > 0) {
            float a = 1.0f - one_minus_sigma_min * t;
            for (int c = 0; c < C; c++)
                for (int j = 0; j < ov; j++)
                    x[(size_t)c * L + j] = a * np[(size_t)c * ov + j] + t * prev[(size_t)c * ov + j];
        }
        memcpy(xb, x, sizeof(float) * n);
        memcpy(xb + n, x, sizeof(float) * n);
        float tb[2] = {t, t};
        if ((rc = dit_forward(m, ws, 2, L, xb, tb, conds, vb)) < 0) goto out;
        float dt = table[i + 1] - table[i];
        const float *vc = vb, *vu = vb + n;
        for (size_t e = 0; e < n; e++) {
            float v = vu[e] + guidance * (vc[e] - vu[e]);
            x[e] = x[e] + dt * v;
        }
    }
    if (ov > 0)
        for (int c = 0; c < C; c++)
            memcpy(x + (size_t)c * L, prev + (size_t)c * ov, sizeof(float) * ov);
    for (size_t e = 0; e < n; e++)
        if (!isfinite(x[e])) {
            rc = mm3_errorf(-ERANGE, "flow: latent %zu of channel %zu is not finite after %d steps", e % L, e / L,
                            n_steps);
            break;
        }
out:
    free(table);
    free(xb);
    free(vb);
    free(np);
    return rc;
}
