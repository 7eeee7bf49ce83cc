/* The CPU flow batch (stage1/flow_batch.h): the windows one after the other. */
#include "stage1/flow_batch.h"

#include <stdlib.h>

#include "common/error.h"
#include "stage1/flow.h"

struct flow_batch_cpu {
    const struct dit_model *m;
    struct dit_workspace *ws;
    int max_windows, max_L;
    int *rc; /* [max_windows], kept from begin for end */
};

static int cpu_begin(void *ctx, int n, const struct flow_job *jobs)
{
    struct flow_batch_cpu *c = ctx;
    if (n < 0 || n > c->max_windows)
        return mm3_errorf(-EINVAL, "flow batch (cpu): %d windows, expected 0..%d", n, c->max_windows);
    for (int i = 0; i < n; i++) {
        const struct flow_job *j = &jobs[i];
        if (j->L < 1 || j->L > c->max_L || j->ov < 0 || j->ov > j->L || j->n_steps < 1) {
            c->rc[i] = mm3_errorf(-EINVAL, "flow batch (cpu): window %d: %d latents (max %d), overlap %d, %d steps", i,
                                  j->L, c->max_L, j->ov, j->n_steps);
            continue;
        }
        /* x is both the input and the output: the window is done when begin returns */
        c->rc[i] = flow_window_run(c->m, c->ws, j);
    }
    return 0;
}

static int cpu_end(void *ctx, int n, const struct flow_job *jobs, int *rc)
{
    struct flow_batch_cpu *c = ctx;
    (void)jobs;
    for (int i = 0; i < n && i < c->max_windows; i++)
        rc[i] = c->rc[i];
    return 0;
}

static void cpu_close(void *ctx)
{
    struct flow_batch_cpu *c = ctx;
    if (!c) return;
    dit_workspace_free(c->ws);
    free(c->rc);
    free(c);
}

int flow_batch_cpu_create(struct flow_batch *out, const struct dit_model *m, int max_L, int max_windows)
{
    *out = (struct flow_batch){0};
    if (max_L < 1 || max_windows < 1)
        return mm3_errorf(-EINVAL, "flow batch (cpu): max_L %d, max_windows %d: expected >= 1", max_L, max_windows);
    struct flow_batch_cpu *c = calloc(1, sizeof *c);
    if (!c) return mm3_errorf(-ENOMEM, "flow batch (cpu): out of memory");
    c->m = m;
    c->max_L = max_L;
    c->max_windows = max_windows;
    c->rc = calloc((size_t)max_windows, sizeof *c->rc);
    int rc = c->rc ? dit_workspace_alloc(&c->ws, m, max_L) : mm3_errorf(-ENOMEM, "flow batch (cpu): out of memory");
    if (rc < 0) {
        cpu_close(c);
        return rc;
    }
    *out = (struct flow_batch){c, 0, max_windows, cpu_begin, cpu_end, cpu_close};
    return 0;
}
