/* The Euler + CFG flow loop of one window on the GPU (the CUDA twin of stage1/flow.h).
 *
 * Same schedule (flow_schedule_fill), same op order and the same float32 roundings as
 * flow_window_run: the CFG blend v = v_u + s (v_c - v_u), the Euler update x += dt v and
 * the overlap pinning x[:, :ov] = (1 - fp32(1 - 1e-6) t) noise[:, :ov] + t prev[:, :ov]
 * are separately rounded float32 ops (no FMA contraction), so given the same velocities
 * a step is bit for bit the CPU one. The CFG pair runs as ONE batch of 2 through
 * dit_cuda_forward (row 0: the condition, row 1: a zero condition). The velocities come
 * from the CUDA DiT in the chosen matmul precision; only fp32 tracks the CPU closely.
 *
 *     struct flow_cuda *f;
 *     flow_cuda_create(&f, dit_model, MM3_MATMUL_TF32, max_L);   // uploads the DiT
 *     flow_cuda_window_run(f, &job);   // struct flow_job (stage1/flow.h), host arrays
 *     flow_cuda_free(f);
 *
 * A flow_cuda serves one window at a time (not thread safe). Only built with CUDA
 * (MM3_HAVE_CUDA); the header needs no CUDA header. */
#ifndef MM3_STAGE1_CUDA_FLOW_CUDA_H
#define MM3_STAGE1_CUDA_FLOW_CUDA_H

#include <stddef.h>

#include "common/deploy.h" /* enum mm3_matmul_precision */
#include "stage1/dit.h"
#include "stage1/flow_batch.h"

#ifdef __cplusplus
extern "C" {
#endif

struct flow_cuda;
struct dit_cuda;

/* Upload the DiT `m` in `prec` (dit_cuda_load; `m` may be freed afterwards) and reserve
 * device buffers for windows of up to max_L latents. Needs a current CUDA device. */
int flow_cuda_create(struct flow_cuda **out, const struct dit_model *m, enum mm3_matmul_precision prec, int max_L);
void flow_cuda_free(struct flow_cuda *f);

/* The same around a DiT already on the device (e.g. dit_cuda_load_random for timings);
 * the flow takes ownership of `dit` (freed with it, also when this fails). */
int flow_cuda_create_with(struct flow_cuda **out, struct dit_cuda *dit, int max_L);

/* Windows of several songs in one loop (stage1/flow_batch.h), async: begin copies every
 * job's inputs into pinned buffers and queues the whole batch on the flow's stream; end
 * waits, then writes the latents (prefix restored) and checks them. Windows of equal
 * (L, n_steps, shift) share each DiT forward as a batch of 2 x their number (row 2j: window j's
 * condition, row 2j+1: zero); other lengths run as further groups on the same stream.
 * Reserves the DiT activations and buffers for max_windows windows of max_L latents now.
 * The batch borrows f (f must outlive it; do not use flow_cuda_window_run between begin
 * and end). Per window, the result is flow_cuda_window_run's up to the GEMM algorithm
 * cuBLASLt picks for the larger batch. */
int flow_cuda_batch_open(struct flow_cuda *f, int max_windows, struct flow_batch *out);

/* The DiT it owns (e.g. to replay single forwards) and its stream (a cudaStream_t). */
struct dit_cuda *flow_cuda_dit(struct flow_cuda *f);
void *flow_cuda_stream(struct flow_cuda *f);

/* flow_window_run's contract, host arrays in and out: j->x holds the initial noise on
 * entry, the final latents (prefix restored) on return. j->L <= max_L.
 * Returns 0, -EINVAL, -ENOMEM / -ENODEV (CUDA), or -ERANGE if the latents stop being finite. */
int flow_cuda_window_run(struct flow_cuda *f, const struct flow_job *j);

/* The same with `void *` first, to plug into render_params.flow (stage1/render.h). */
int flow_cuda_window_run_cb(void *f, const struct flow_job *j);

/* ---- the per-step kernels (device pointers, queued on `stream`; exposed for tests) ---- */

/* x[c, j] = (1 - fp32(1 - 1e-6) t) * noise[c, j] + t * prev[c, j] for c < C, j < ov;
 * x has row stride L, noise and prev row stride ov. */
int flow_cuda_pin(float *x, const float *noise, const float *prev, int C, int L, int ov, float t, void *stream);

/* x[e] = x[e] + dt * (vu[e] + guidance * (vc[e] - vu[e])) for e < n. */
int flow_cuda_euler_cfg(float *x, const float *vc, const float *vu, size_t n, float guidance, float dt, void *stream);

#ifdef __cplusplus
}
#endif

#endif
