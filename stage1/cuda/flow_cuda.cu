/* Euler + CFG flow loop on the GPU (stage1/cuda/flow_cuda.h). */
#include <pthread.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/dit_cuda.h"
#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/flow_cuda.h"
#include "stage1/flow.h"

struct flow_cuda {
    struct dit_cuda *dit;
    cudaStream_t stream;
    int in_ch, cond_dim, max_L;
    float *xb;   /* [2, in_ch, max_L]: x, then its copy for the unconditional row */
    float *vb;   /* [2, in_ch, max_L]: v_c, v_u */
    float *np;   /* [in_ch, max_L]: the noise prefix the pinning blends from (stride ov) */
    float *prev; /* [in_ch, max_L]: carried latents (stride ov) */
    float *cond; /* [max_L, cond_dim] */
    float *ts;   /* [2 * cap_steps]: (t_i, t_i) per step, one pair per DiT batch */
    int cap_steps;
    float *table;  /* host [cap_steps + 1] */
    float *t_host; /* host [2 * cap_steps] */
    float *out;    /* host [in_ch, max_L]: a window's latents before they are checked */
};

/* Separately rounded float32 ops in the CPU's order; the intrinsics keep nvcc from
 * contracting them into FMAs, which would change the last bit. */
__global__ void k_pin(float *x, const float *noise, const float *prev, int C, int L, int ov, float t)
{
    const float one_minus_sigma_min = (float)(1.0 - 1e-6);
    float a = __fsub_rn(1.0f, __fmul_rn(one_minus_sigma_min, t));
    size_t n = (size_t)C * ov;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t c = e / ov, j = e % ov;
        x[c * L + j] = __fadd_rn(__fmul_rn(a, noise[e]), __fmul_rn(t, prev[e]));
    }
}

__global__ void k_euler_cfg(float *x, const float *vc, const float *vu, size_t n, float s, float dt)
{
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float v = __fadd_rn(vu[e], __fmul_rn(s, __fsub_rn(vc[e], vu[e])));
        x[e] = __fadd_rn(x[e], __fmul_rn(dt, v));
    }
}

extern "C" int flow_cuda_pin(float *x, const float *noise, const float *prev, int C, int L, int ov, float t,
                             void *stream)
{
    if (C < 1 || ov < 0 || ov > L)
        return mm3_errorf(-EINVAL, "flow_cuda_pin: %d channels, overlap %d of %d latents: expected ov <= L", C, ov, L);
    if (ov == 0) return 0;
    size_t n = (size_t)C * ov;
    k_pin<<<dit_cuda_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>(x, noise, prev, C, L, ov, t);
    return dit_cuda_launched("flow_cuda_pin");
}

extern "C" int flow_cuda_euler_cfg(float *x, const float *vc, const float *vu, size_t n, float guidance, float dt,
                                   void *stream)
{
    if (n == 0) return 0;
    k_euler_cfg<<<dit_cuda_blocks(n, 256), 256, 0, (cudaStream_t)stream>>>(x, vc, vu, n, guidance, dt);
    return dit_cuda_launched("flow_cuda_euler_cfg");
}

extern "C" void flow_cuda_free(struct flow_cuda *f)
{
    if (!f) return;
    if (f->stream) cudaStreamSynchronize(f->stream);
    cudaFree(f->xb), cudaFree(f->vb), cudaFree(f->np), cudaFree(f->prev), cudaFree(f->cond), cudaFree(f->ts);
    if (f->stream) cudaStreamDestroy(f->stream);
    dit_cuda_free(f->dit);
    free(f->table);
    free(f->t_host);
    free(f->out);
    free(f);
}

extern "C" int flow_cuda_create_with(struct flow_cuda **out, struct dit_cuda *dit, int max_L)
{
    *out = NULL;
    if (max_L < 1) {
        dit_cuda_free(dit);
        return mm3_errorf(-EINVAL, "flow_cuda_create: max_L %d: expected >= 1", max_L);
    }
    struct flow_cuda *f = (struct flow_cuda *)calloc(1, sizeof *f);
    if (!f) {
        dit_cuda_free(dit);
        return mm3_errorf(-ENOMEM, "flow_cuda: out of memory");
    }
    const struct dit_config *g = dit_cuda_config(dit);
    f->dit = dit;
    f->in_ch = g->in_ch;
    f->cond_dim = g->cond_dim;
    f->max_L = max_L;
    size_t n = (size_t)f->in_ch * max_L;
    f->out = (float *)malloc(sizeof(float) * n);
    int rc = f->out ? 0 : mm3_errorf(-ENOMEM, "flow_cuda: out of memory");
    if (rc == 0)
        rc = dit_cuda_status(cudaStreamCreateWithPriority(&f->stream, cudaStreamNonBlocking, cuda_stream_priority()),
                             "cudaStreamCreate (flow)");
    if (rc == 0) rc = dit_cuda_reserve(f->dit, 2, max_L);
    struct {
        float **p;
        size_t n;
    } a[] = {{&f->xb, 2 * n}, {&f->vb, 2 * n}, {&f->np, n}, {&f->prev, n}, {&f->cond, (size_t)max_L * f->cond_dim}};
    for (size_t i = 0; i < sizeof a / sizeof a[0] && rc == 0; i++)
        rc = dit_cuda_status(cudaMalloc((void **)a[i].p, a[i].n * sizeof(float)), "cudaMalloc (flow buffers)");
    if (rc < 0) {
        flow_cuda_free(f);
        return mm3_error_prefix(rc, "flow_cuda_create: ");
    }
    *out = f;
    return 0;
}

extern "C" int flow_cuda_create(struct flow_cuda **out, const struct dit_model *m, enum mm3_matmul_precision prec,
                                int max_L)
{
    *out = NULL;
    if (max_L < 1) return mm3_errorf(-EINVAL, "flow_cuda_create: max_L %d: expected >= 1", max_L);
    struct dit_cuda *dit = NULL;
    int rc = dit_cuda_load(&dit, m, prec);
    if (rc < 0) return mm3_error_prefix(rc, "flow_cuda_create: ");
    return flow_cuda_create_with(out, dit, max_L);
}

extern "C" struct dit_cuda *flow_cuda_dit(struct flow_cuda *f)
{
    return f->dit;
}

extern "C" void *flow_cuda_stream(struct flow_cuda *f)
{
    return f->stream;
}

static int ensure_steps(struct flow_cuda *f, int n_steps)
{
    if (n_steps <= f->cap_steps) return 0;
    cudaStreamSynchronize(f->stream); /* ts may still be read by queued work */
    cudaFree(f->ts);
    f->ts = NULL;
    free(f->table);
    free(f->t_host);
    f->cap_steps = 0;
    f->table = (float *)malloc(sizeof(float) * ((size_t)n_steps + 1));
    f->t_host = (float *)malloc(sizeof(float) * 2 * (size_t)n_steps);
    if (!f->table || !f->t_host) return mm3_errorf(-ENOMEM, "flow_cuda: out of memory for %d steps", n_steps);
    int rc =
        dit_cuda_status(cudaMalloc((void **)&f->ts, sizeof(float) * 2 * (size_t)n_steps), "cudaMalloc (flow times)");
    if (rc < 0) return rc;
    f->cap_steps = n_steps;
    return 0;
}

/* Queue the whole window; x ends up in f->xb[0 .. C*L). */
static int queue_window(struct flow_cuda *f, const struct flow_job *j)
{
    const int n_steps = j->n_steps, L = j->L, ov = j->ov;
    const float guidance = j->guidance, shift = j->shift;
    const float *cond = j->cond, *prev = j->prev, *x = j->x;
    int C = f->in_ch, rc;
    size_t n = (size_t)C * L;
    cudaStream_t s = f->stream;
#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        if ((rc = (call)) < 0) return rc;                                                                              \
    } while (0)
    TRY(ensure_steps(f, n_steps));
    flow_schedule_fill(f->table, n_steps, shift);
    for (int i = 0; i < n_steps; i++)
        f->t_host[2 * i] = f->t_host[2 * i + 1] = f->table[i];
    TRY(dit_cuda_status(cudaMemcpyAsync(f->ts, f->t_host, sizeof(float) * 2 * n_steps, cudaMemcpyHostToDevice, s),
                        "upload (flow times)"));
    TRY(dit_cuda_status(cudaMemcpyAsync(f->xb, x, sizeof(float) * n, cudaMemcpyHostToDevice, s), "upload (noise)"));
    TRY(dit_cuda_status(
        cudaMemcpyAsync(f->cond, cond, sizeof(float) * (size_t)L * f->cond_dim, cudaMemcpyHostToDevice, s),
        "upload (condition)"));
    if (ov > 0) {
        /* the noise prefix x[:, :ov] (row stride L) packed to stride ov, as flow.c keeps it */
        TRY(dit_cuda_status(cudaMemcpy2DAsync(f->np, sizeof(float) * ov, x, sizeof(float) * L, sizeof(float) * ov, C,
                                              cudaMemcpyHostToDevice, s),
                            "upload (noise prefix)"));
        TRY(dit_cuda_status(cudaMemcpyAsync(f->prev, prev, sizeof(float) * (size_t)C * ov, cudaMemcpyHostToDevice, s),
                            "upload (carried latents)"));
    }
    const float *conds[2] = {f->cond, NULL};
    for (int i = 0; i < n_steps; i++) {
        if (ov > 0) TRY(flow_cuda_pin(f->xb, f->np, f->prev, C, L, ov, f->table[i], s));
        TRY(dit_cuda_status(cudaMemcpyAsync(f->xb + n, f->xb, sizeof(float) * n, cudaMemcpyDeviceToDevice, s),
                            "copy (unconditional row)"));
        TRY(dit_cuda_forward(f->dit, 2, L, f->xb, f->ts + 2 * i, conds, f->vb, s));
        float dt = f->table[i + 1] - f->table[i];
        TRY(flow_cuda_euler_cfg(f->xb, f->vb, f->vb + n, n, guidance, dt, s));
    }
#undef TRY
    return 0;
}

/* fp16 and fp8 DiTs have fp16 operands (fp8: outside the e4m3 block GEMMs) that may overflow. */
static bool has_f16_operands(const struct dit_cuda *d)
{
    return dit_cuda_precision(d) == MM3_MATMUL_FP16 || dit_cuda_precision(d) == MM3_MATMUL_FP8;
}

static const char *fp16_hint(const struct dit_cuda *d)
{
    return has_f16_operands(d) ? " (also with the fp16 operands scaled down: use tf32)" : "";
}

static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!std::isfinite(x[i])) return false;
    return true;
}

/* Queue, drain, and download the latents into f->out (the caller's x stays the noise). */
static int run_window(struct flow_cuda *f, const struct flow_job *j)
{
    size_t n = (size_t)f->in_ch * j->L;
    int rc = queue_window(f, j);
    /* always drain the stream: queued copies may still read the caller's arrays */
    int rs = dit_cuda_status(cudaStreamSynchronize(f->stream), "flow window");
    if (rc == 0) rc = rs;
    if (rc == 0)
        rc = dit_cuda_status(cudaMemcpy(f->out, f->xb, sizeof(float) * n, cudaMemcpyDeviceToHost),
                             "download (latents)");
    return rc;
}

extern "C" int flow_cuda_window_run(struct flow_cuda *f, const struct flow_job *j)
{
    const int n_steps = j->n_steps, L = j->L, ov = j->ov;
    const float shift = j->shift, *prev = j->prev;
    float *x = j->x;
    int C = f->in_ch;
    if (n_steps < 1 || !(shift > 0.0f) || L < 1 || L > f->max_L || ov < 0 || ov > L || (ov > 0 && !prev))
        return mm3_errorf(-EINVAL,
                          "flow_cuda: %d steps, shift %g, %d latents (max %d), overlap %d: expected steps >= 1, "
                          "shift > 0, 1 <= L <= max and 0 <= overlap <= L",
                          n_steps, (double)shift, L, f->max_L, ov);
    size_t n = (size_t)C * L;
    int rc = run_window(f, j);
    if (rc == 0 && has_f16_operands(f->dit) && !all_finite(f->out, n)) {
        /* fp16 operands overflowed somewhere (inf/NaN spreads to the latents): rerun
         * the window with every operand scaled down */
        dit_cuda_count_f16_rescue();
        rc = dit_cuda_set_rescue(f->dit, 1);
        if (rc == 0) rc = run_window(f, j);
        dit_cuda_set_rescue(f->dit, 0);
    }
    if (rc == 0) memcpy(x, f->out, sizeof(float) * n);
    if (rc < 0) return mm3_error_prefix(rc, "flow_cuda: ");
    if (ov > 0)
        for (int c = 0; c < C; c++)
            memcpy(x + (size_t)c * L, prev + (size_t)c * ov, sizeof(float) * ov);
    for (size_t e = 0; e < n; e++)
        if (!std::isfinite(x[e]))
            return mm3_errorf(-ERANGE, "flow_cuda: latent %zu of channel %zu is not finite after %d steps%s", e % L,
                              e / L, n_steps, fp16_hint(f->dit));
    return 0;
}

extern "C" int flow_cuda_window_run_cb(void *f, const struct flow_job *j)
{
    return flow_cuda_window_run((struct flow_cuda *)f, j);
}

/* ---- several windows in one loop (flow_cuda_batch_open) ---- */

struct flow_cuda_batch {
    struct flow_cuda *f;
    int W, C, D, max_L;
    /* device: per window slot w, regions of C * max_L (x and v: two rows each) */
    float *xb, *vb, *np, *prev, *cond, *ts;
    size_t ts_cap;
    /* pinned host, per job i: x (noise in, latents out), prev, cond; flow times */
    float *h_x, *h_prev, *h_cond, *h_t;
    float *h_noise; /* host, per job i: the noise again, for a rescue rerun (fp16 only) */
    size_t h_t_cap;
    float *table; /* host [n_steps + 1] */
    int table_cap;
    const float **conds; /* host [2W] device pointers for dit_cuda_forward */
    int *order;          /* jobs grouped by (L, n_steps, shift) */
    /* A batch is thousands of kernel launches: queued from the caller's thread, the launch
     * queue would fill and hold it for most of the DiT's time. A worker thread queues and
     * waits instead, so begin returns at once and the caller's thread is free. */
    int device;
    struct flow_job *jobs; /* [W] copy of the batch's sizes (the worker reads no caller memory) */
    int n;
    pthread_t th;
    int th_live;
    int th_rc;
    char th_msg[1024];
};

static void batch_close(void *ctx)
{
    struct flow_cuda_batch *b = (struct flow_cuda_batch *)ctx;
    if (!b) return;
    if (b->th_live) pthread_join(b->th, NULL);
    free(b->jobs);
    if (b->f && b->f->stream) cudaStreamSynchronize(b->f->stream);
    cudaFree(b->xb), cudaFree(b->vb), cudaFree(b->np), cudaFree(b->prev), cudaFree(b->cond), cudaFree(b->ts);
    cudaFreeHost(b->h_x), cudaFreeHost(b->h_prev), cudaFreeHost(b->h_cond), cudaFreeHost(b->h_t);
    free(b->table), free(b->conds), free(b->order), free(b->h_noise);
    free(b);
}

/* Room for the flow times of this batch: sum over windows of 2 n_steps. Only called
 * while the stream is idle (begin). */
static int batch_times_reserve(struct flow_cuda_batch *b, size_t n_t, int max_steps)
{
    if (n_t > b->ts_cap) {
        cudaFree(b->ts), cudaFreeHost(b->h_t);
        b->ts = b->h_t = NULL;
        b->ts_cap = b->h_t_cap = 0;
        int rc = dit_cuda_status(cudaMalloc((void **)&b->ts, sizeof(float) * n_t), "cudaMalloc (batch times)");
        if (rc == 0) rc = dit_cuda_status(cudaMallocHost((void **)&b->h_t, sizeof(float) * n_t), "cudaMallocHost");
        if (rc < 0) return rc;
        b->ts_cap = b->h_t_cap = n_t;
    }
    if (max_steps + 1 > b->table_cap) {
        free(b->table);
        b->table = (float *)malloc(sizeof(float) * ((size_t)max_steps + 1));
        b->table_cap = b->table ? max_steps + 1 : 0;
        if (!b->table) return mm3_errorf(-ENOMEM, "flow_cuda batch: out of memory for %d steps", max_steps);
    }
    return 0;
}

/* Windows that share every DiT forward: equal length, step count and schedule. */
static int same_group(const struct flow_job *a, const struct flow_job *b)
{
    return a->L == b->L && a->n_steps == b->n_steps && a->shift == b->shift;
}

/* Queue one group: jobs order[0..G) of equal (L, n_steps, shift), in slots base..base+G. */
static int batch_queue_group(struct flow_cuda_batch *b, const struct flow_job *jobs, const int *order, int G, int base,
                             float *h_t, float *d_t)
{
    struct flow_cuda *f = b->f;
    cudaStream_t s = f->stream;
    int C = b->C, D = b->D, L = jobs[order[0]].L, steps = jobs[order[0]].n_steps, rc;
    size_t n = (size_t)C * L, slot = (size_t)C * b->max_L;
    float *xg = b->xb + 2 * (size_t)base * slot, *vg = b->vb + 2 * (size_t)base * slot;
#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        if ((rc = (call)) < 0) return rc;                                                                              \
    } while (0)
    flow_schedule_fill(b->table, steps, jobs[order[0]].shift);
    for (int i = 0; i < steps; i++)
        for (int r = 0; r < 2 * G; r++)
            h_t[(size_t)i * 2 * G + r] = b->table[i];
    TRY(dit_cuda_status(cudaMemcpyAsync(d_t, h_t, sizeof(float) * 2 * G * steps, cudaMemcpyHostToDevice, s),
                        "upload (batch times)"));
    for (int j = 0; j < G; j++) {
        const struct flow_job *jb = &jobs[order[j]];
        size_t w = (size_t)base + j, hi = (size_t)order[j];
        float *x = xg + 2 * (size_t)j * n;
        TRY(dit_cuda_status(cudaMemcpyAsync(x, b->h_x + hi * slot, sizeof(float) * n, cudaMemcpyHostToDevice, s),
                            "upload (batch noise)"));
        TRY(dit_cuda_status(cudaMemcpyAsync(b->cond + w * (size_t)b->max_L * D, b->h_cond + hi * (size_t)b->max_L * D,
                                            sizeof(float) * (size_t)L * D, cudaMemcpyHostToDevice, s),
                            "upload (batch condition)"));
        if (jb->ov > 0) {
            TRY(dit_cuda_status(cudaMemcpy2DAsync(b->np + w * slot, sizeof(float) * jb->ov, x, sizeof(float) * L,
                                                  sizeof(float) * jb->ov, C, cudaMemcpyDeviceToDevice, s),
                                "copy (batch noise prefix)"));
            TRY(dit_cuda_status(cudaMemcpyAsync(b->prev + w * slot, b->h_prev + hi * slot,
                                                sizeof(float) * (size_t)C * jb->ov, cudaMemcpyHostToDevice, s),
                                "upload (batch carried latents)"));
        }
        b->conds[2 * j] = b->cond + w * (size_t)b->max_L * D;
        b->conds[2 * j + 1] = NULL;
    }
    for (int i = 0; i < steps; i++) {
        for (int j = 0; j < G; j++) {
            const struct flow_job *jb = &jobs[order[j]];
            float *x = xg + 2 * (size_t)j * n;
            size_t w = (size_t)base + j;
            if (jb->ov > 0) TRY(flow_cuda_pin(x, b->np + w * slot, b->prev + w * slot, C, L, jb->ov, b->table[i], s));
            TRY(dit_cuda_status(cudaMemcpyAsync(x + n, x, sizeof(float) * n, cudaMemcpyDeviceToDevice, s),
                                "copy (unconditional row)"));
        }
        TRY(dit_cuda_forward(f->dit, 2 * G, L, xg, d_t + (size_t)i * 2 * G, b->conds, vg, s));
        float dt = b->table[i + 1] - b->table[i];
        for (int j = 0; j < G; j++) {
            size_t o = 2 * (size_t)j * n;
            TRY(flow_cuda_euler_cfg(xg + o, vg + o, vg + o + n, n, jobs[order[j]].guidance, dt, s));
        }
    }
    for (int j = 0; j < G; j++)
        TRY(dit_cuda_status(cudaMemcpyAsync(b->h_x + (size_t)order[j] * slot, xg + 2 * (size_t)j * n, sizeof(float) * n,
                                            cudaMemcpyDeviceToHost, s),
                            "download (batch latents)"));
#undef TRY
    return 0;
}

/* Queue every group of the batch and wait for the stream. */
static int batch_run(struct flow_cuda_batch *b)
{
    const struct flow_job *jobs = b->jobs;
    int n = b->n, rc = 0;
    size_t t_at = 0;
    for (int g = 0; g < n && rc == 0;) {
        int G = 1;
        const struct flow_job *j0 = &jobs[b->order[g]];
        while (g + G < n && same_group(&jobs[b->order[g + G]], j0))
            G++;
        rc = batch_queue_group(b, jobs, b->order + g, G, g, b->h_t + t_at, b->ts + t_at);
        t_at += 2 * (size_t)G * j0->n_steps;
        g += G;
    }
    /* always drain: nothing half-queued may outlive the batch */
    int rs = dit_cuda_status(cudaStreamSynchronize(b->f->stream), "flow batch");
    return rc ? rc : rs;
}

static bool batch_finite(const struct flow_cuda_batch *b)
{
    size_t slot = (size_t)b->C * b->max_L;
    for (int i = 0; i < b->n; i++)
        if (!all_finite(b->h_x + (size_t)i * slot, (size_t)b->C * b->jobs[i].L)) return false;
    return true;
}

/* On the worker thread: the batch, and once more with scaled operands where fp16 ones
 * overflowed (inf/NaN spreads to the latents). */
static void *batch_worker(void *arg)
{
    struct flow_cuda_batch *b = (struct flow_cuda_batch *)arg;
    int rc = dit_cuda_status(cudaSetDevice(b->device), "cudaSetDevice (flow batch worker)");
    if (rc == 0) rc = batch_run(b);
    if (rc == 0 && b->h_noise && !batch_finite(b)) {
        size_t slot = (size_t)b->C * b->max_L;
        for (int i = 0; i < b->n; i++)
            memcpy(b->h_x + (size_t)i * slot, b->h_noise + (size_t)i * slot, sizeof(float) * b->C * b->jobs[i].L);
        dit_cuda_count_f16_rescue();
        rc = dit_cuda_set_rescue(b->f->dit, 1);
        if (rc == 0) rc = batch_run(b);
        dit_cuda_set_rescue(b->f->dit, 0);
    }
    if (rc < 0) snprintf(b->th_msg, sizeof b->th_msg, "%s", mm3_last_error()); /* the message is thread-local */
    b->th_rc = rc;
    return NULL;
}

static int batch_begin(void *ctx, int n, const struct flow_job *jobs)
{
    struct flow_cuda_batch *b = (struct flow_cuda_batch *)ctx;
    int C = b->C, D = b->D, max_steps = 0;
    size_t slot = (size_t)C * b->max_L, n_t = 0;
    /* until the worker starts, an end of this batch reports the refusal */
    b->th_rc = -ECANCELED;
    snprintf(b->th_msg, sizeof b->th_msg, "the batch was refused at begin");
    if (n < 0 || n > b->W) return mm3_errorf(-EINVAL, "flow_cuda batch: %d windows, expected 0..%d", n, b->W);
    for (int i = 0; i < n; i++) {
        const struct flow_job *j = &jobs[i];
        if (j->n_steps < 1 || !(j->shift > 0.0f) || j->L < 1 || j->L > b->max_L || j->ov < 0 || j->ov > j->L ||
            (j->ov > 0 && !j->prev))
            return mm3_errorf(-EINVAL,
                              "flow_cuda batch: window %d: %d steps, shift %g, %d latents (max %d), overlap %d: "
                              "expected steps >= 1, shift > 0, 1 <= L <= max and 0 <= overlap <= L",
                              i, j->n_steps, (double)j->shift, j->L, b->max_L, j->ov);
        max_steps = j->n_steps > max_steps ? j->n_steps : max_steps;
        n_t += 2 * (size_t)j->n_steps;
    }
    int rc = batch_times_reserve(b, n_t, max_steps);
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++) {
        const struct flow_job *j = &jobs[i];
        memcpy(b->h_x + (size_t)i * slot, j->x, sizeof(float) * (size_t)C * j->L);
        if (b->h_noise) memcpy(b->h_noise + (size_t)i * slot, j->x, sizeof(float) * (size_t)C * j->L);
        memcpy(b->h_cond + (size_t)i * b->max_L * D, j->cond, sizeof(float) * (size_t)j->L * D);
        if (j->ov > 0) memcpy(b->h_prev + (size_t)i * slot, j->prev, sizeof(float) * (size_t)C * j->ov);
    }
    /* groups of equal (L, n_steps, shift), each in first-seen order */
    int m = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < i && !seen; k++)
            seen = same_group(&jobs[k], &jobs[i]);
        if (seen) continue;
        for (int k = i; k < n; k++)
            if (same_group(&jobs[k], &jobs[i])) b->order[m++] = k;
    }
    for (int i = 0; i < n; i++) {
        b->jobs[i] = jobs[i];
        b->jobs[i].cond = b->jobs[i].prev = b->jobs[i].x = NULL;
    }
    b->n = n;
    b->th_rc = 0;
    b->th_msg[0] = 0;
    if (pthread_create(&b->th, NULL, batch_worker, b) == 0)
        b->th_live = 1;
    else
        batch_worker(b); /* no thread: the batch runs here, begin returns when it is done */
    return 0;
}

static int batch_end(void *ctx, int n, const struct flow_job *jobs, int *out_rc)
{
    struct flow_cuda_batch *b = (struct flow_cuda_batch *)ctx;
    int C = b->C;
    size_t slot = (size_t)C * b->max_L;
    if (b->th_live) {
        pthread_join(b->th, NULL);
        b->th_live = 0;
    }
    int rc = b->th_rc < 0 ? mm3_errorf(b->th_rc, "flow_cuda batch: %s", b->th_msg) : 0;
    for (int i = 0; i < n; i++) {
        const struct flow_job *j = &jobs[i];
        out_rc[i] = rc;
        if (rc < 0 || !j->x) continue;
        int L = j->L, ov = j->ov;
        memcpy(j->x, b->h_x + (size_t)i * slot, sizeof(float) * (size_t)C * L);
        for (int c = 0; c < C && ov > 0; c++)
            memcpy(j->x + (size_t)c * L, b->h_prev + (size_t)i * slot + (size_t)c * ov, sizeof(float) * ov);
        for (size_t e = 0; e < (size_t)C * L; e++)
            if (!std::isfinite(j->x[e])) {
                out_rc[i] = mm3_errorf(-ERANGE, "flow_cuda: latent %zu of channel %zu is not finite after %d steps%s",
                                       e % L, e / L, j->n_steps, fp16_hint(b->f->dit));
                break;
            }
    }
    return rc;
}

extern "C" int flow_cuda_batch_open(struct flow_cuda *f, int max_windows, struct flow_batch *out)
{
    memset(out, 0, sizeof *out);
    if (max_windows < 1) return mm3_errorf(-EINVAL, "flow_cuda_batch_open: max_windows %d: expected >= 1", max_windows);
    struct flow_cuda_batch *b = (struct flow_cuda_batch *)calloc(1, sizeof *b);
    if (!b) return mm3_errorf(-ENOMEM, "flow_cuda batch: out of memory");
    b->f = f;
    b->W = max_windows;
    b->C = f->in_ch;
    b->D = f->cond_dim;
    b->max_L = f->max_L;
    size_t W = (size_t)max_windows, slot = (size_t)b->C * b->max_L, cslot = (size_t)b->max_L * b->D;
    b->conds = (const float **)calloc(2 * W, sizeof *b->conds);
    b->order = (int *)calloc(W, sizeof *b->order);
    b->jobs = (struct flow_job *)calloc(W, sizeof *b->jobs);
    if (has_f16_operands(f->dit)) b->h_noise = (float *)malloc(sizeof(float) * W * slot);
    int rc = b->conds && b->order && b->jobs && (b->h_noise || !has_f16_operands(f->dit))
                 ? 0
                 : mm3_errorf(-ENOMEM, "flow_cuda batch: out of memory");
    if (rc == 0) rc = dit_cuda_status(cudaGetDevice(&b->device), "cudaGetDevice");
    if (rc == 0) rc = dit_cuda_reserve(f->dit, 2 * max_windows, b->max_L);
    struct {
        float **p;
        size_t n;
        int pinned;
    } a[] = {{&b->xb, 2 * W * slot, 0}, {&b->vb, 2 * W * slot, 0}, {&b->np, W * slot, 0},
             {&b->prev, W * slot, 0},   {&b->cond, W * cslot, 0},  {&b->h_x, W * slot, 1},
             {&b->h_prev, W * slot, 1}, {&b->h_cond, W * cslot, 1}};
    for (size_t i = 0; i < sizeof a / sizeof a[0] && rc == 0; i++)
        rc = dit_cuda_status(a[i].pinned ? cudaMallocHost((void **)a[i].p, a[i].n * sizeof(float))
                                         : cudaMalloc((void **)a[i].p, a[i].n * sizeof(float)),
                             "cudaMalloc (flow batch buffers)");
    if (rc < 0) {
        batch_close(b);
        return mm3_error_prefix(rc, "flow_cuda_batch_open (%d windows of %d latents): ", max_windows, f->max_L);
    }
    *out = (struct flow_batch){b, 1, max_windows, batch_begin, batch_end, batch_close};
    return 0;
}
