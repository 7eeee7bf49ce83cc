/* Windows of several songs through one Euler + CFG loop (stage-1 batching).
 *
 * A flow_batch runs n windows, each with flow_window_run's contract (stage1/flow.h) and
 * its own steps, guidance, condition, noise, carried prefix and length, as if each ran
 * alone. A backend may group windows of equal (L, n_steps, shift) into one DiT forward of batch
 * 2 x group (conditional and unconditional row of each window); attention is per
 * sequence, so nothing is padded. The CPU backend loops over the windows: it is the
 * reference, bit for bit flow_window_run.
 *
 *     struct flow_batch fb;
 *     flow_batch_cpu_create(&fb, dit_model, max_L, 8);      // or flow_cuda_batch_open
 *     fb.begin(fb.ctx, n, jobs);      // reads every job's cond, prev and x
 *     ... with fb.async the host is free here (vocoder of the previous batch) ...
 *     fb.end(fb.ctx, n, jobs, rcs);   // writes each x (NULL: dropped), rcs[i] per window
 *     fb.close(fb.ctx);
 *
 * One batch at a time per flow_batch; begin and end come in pairs (end also after a
 * failed begin, with the same jobs). */
#ifndef MM3_STAGE1_FLOW_BATCH_H
#define MM3_STAGE1_FLOW_BATCH_H

#include "stage1/dit.h"
#include "stage1/flow.h" /* struct flow_job; a job's x NULL at end: its latents are dropped */

struct flow_batch {
    void *ctx;
    int async;       /* begin returns before the work is done; end waits for it */
    int max_windows; /* n of one batch is at most this */
    /* Start n windows. Inputs are read during the call only. < 0: nothing runs (end
     * still comes, and reports the same code for every window). */
    int (*begin)(void *ctx, int n, const struct flow_job *jobs);
    /* Wait for the batch begun with the same jobs (x may have been set to NULL since),
     * write the latents, rc[i] = 0 or the window's negative error (-ERANGE: not finite).
     * Returns < 0 only for a failure of the whole batch (then every rc[i] is that code). */
    int (*end)(void *ctx, int n, const struct flow_job *jobs, int *rc);
    void (*close)(void *ctx);
};

/* The CPU reference: one flow_window_run per window, synchronous (all work in begin), one
 * DiT workspace for windows of up to max_L latents. */
int flow_batch_cpu_create(struct flow_batch *out, const struct dit_model *m, int max_L, int max_windows);

#endif
