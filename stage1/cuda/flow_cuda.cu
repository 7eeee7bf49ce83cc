/* Euler + CFG flow loop on the GPU (stage1/cuda/flow_cuda.h). */
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "stage1/cuda/dit_cuda.h"
#include "stage1/cuda/dit_cuda_internal.h"
#include "stage1/cuda/flow_cuda.h"

extern "C" {
#include "stage1/flow.h"
}

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
    free(f);
}

extern "C" int flow_cuda_create(struct flow_cuda **out, const struct dit_model *m, enum mm3_matmul_precision prec,
                                int max_L)
{
    *out = NULL;
    if (max_L < 1) return mm3_errorf(-EINVAL, "flow_cuda_create: max_L %d: expected >= 1", max_L);
    struct flow_cuda *f = (struct flow_cuda *)calloc(1, sizeof *f);
    if (!f) return mm3_errorf(-ENOMEM, "flow_cuda: out of memory");
    f->in_ch = m->cfg.in_ch;
    f->cond_dim = m->cfg.cond_dim;
    f->max_L = max_L;
    size_t n = (size_t)f->in_ch * max_L;
    int rc = dit_cuda_status(cudaStreamCreateWithFlags(&f->stream, cudaStreamNonBlocking), "cudaStreamCreate (flow)");
    if (rc == 0) rc = dit_cuda_load(&f->dit, m, prec);
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
static int queue_window(struct flow_cuda *f, int n_steps, float guidance, int L, const float *cond, int ov,
                        const float *prev, const float *x)
{
    int C = f->in_ch, rc;
    size_t n = (size_t)C * L;
    cudaStream_t s = f->stream;
#define TRY(call)                                                                                                      \
    do {                                                                                                               \
        if ((rc = (call)) < 0) return rc;                                                                              \
    } while (0)
    TRY(ensure_steps(f, n_steps));
    flow_schedule_fill(f->table, n_steps);
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

extern "C" int flow_cuda_window_run(struct flow_cuda *f, int n_steps, float guidance, int L, const float *cond, int ov,
                                    const float *prev, float *x)
{
    int C = f->in_ch;
    if (n_steps < 1 || L < 1 || L > f->max_L || ov < 0 || ov > L || (ov > 0 && !prev))
        return mm3_errorf(-EINVAL,
                          "flow_cuda: %d steps, %d latents (max %d), overlap %d: expected steps >= 1, "
                          "1 <= L <= max and 0 <= overlap <= L",
                          n_steps, L, f->max_L, ov);
    size_t n = (size_t)C * L;
    int rc = queue_window(f, n_steps, guidance, L, cond, ov, prev, x);
    /* always drain the stream: queued copies may still read the caller's arrays */
    int rs = dit_cuda_status(cudaStreamSynchronize(f->stream), "flow window");
    if (rc == 0) rc = rs;
    if (rc == 0)
        rc = dit_cuda_status(cudaMemcpy(x, f->xb, sizeof(float) * n, cudaMemcpyDeviceToHost), "download (latents)");
    if (rc < 0) return mm3_error_prefix(rc, "flow_cuda: ");
    if (ov > 0)
        for (int c = 0; c < C; c++)
            memcpy(x + (size_t)c * L, prev + (size_t)c * ov, sizeof(float) * ov);
    for (size_t e = 0; e < n; e++)
        if (!std::isfinite(x[e]))
            return mm3_errorf(-ERANGE, "flow_cuda: latent %zu of channel %zu is not finite after %d steps", e % L,
                              e / L, n_steps);
    return 0;
}

extern "C" int flow_cuda_window_run_cb(void *f, int n_steps, float guidance, int L, const float *cond, int ov,
                                       const float *prev, float *x)
{
    return flow_cuda_window_run((struct flow_cuda *)f, n_steps, guidance, L, cond, ov, prev, x);
}
