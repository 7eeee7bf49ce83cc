/* One flow batch over the ready windows of several renders (stage1/render.h). */
#include <stdlib.h>

#include "common/error.h"
#include "stage1/render.h"

int render_batch_step(struct render *const *r, int n, const struct flow_batch *fb, int *rc)
{
    struct flow_job *jobs = calloc((size_t)fb->max_windows + 1, sizeof *jobs);
    int *who = calloc((size_t)fb->max_windows + 1, sizeof *who);
    int *frc = calloc((size_t)fb->max_windows + 1, sizeof *frc);
    int m = 0, ret = 0;
    if (!jobs || !who || !frc) {
        ret = mm3_errorf(-ENOMEM, "render batch: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        rc[i] = 0;
        if (!r[i] || m >= fb->max_windows) continue;
        int p = render_window_prepare(r[i], &jobs[m]);
        if (p < 0) rc[i] = p;
        if (p == 1) who[m++] = i;
    }
    if (m > 0) {
        int b = fb->begin(fb->ctx, m, jobs);
        int e = fb->end(fb->ctx, m, jobs, frc);
        if (b < 0 || e < 0) ret = b < 0 ? b : e;
        for (int j = 0; j < m; j++) {
            int i = who[j], c = render_window_collect(r[i], ret < 0 ? ret : frc[j]);
            if (c == 0) c = render_window_finish(r[i]);
            rc[i] = c;
        }
    }
    if (ret == 0) ret = m;
out:
    free(jobs), free(who), free(frc);
    return ret;
}
