/* Where stage 1's heavy work runs: the CPU reference, or the GPU (DiT + flow loop
 * in stage1/cuda/flow_cuda.h, vocoder in stage1/cuda/vocoder_cuda.h). A render is
 * pointed at the GPU by the flow and decoder this fills in; the condition encoder,
 * window bookkeeping and crop stay on the host either way. */
#ifndef MM3_STAGE1_BACKEND_H
#define MM3_STAGE1_BACKEND_H

#include "common/deploy.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/flow_batch.h"
#include "stage1/render.h"
#include "stage1/vocoder.h"

struct s1_backend {
    enum mm3_backend kind; /* MM3_BACKEND_CPU or MM3_BACKEND_CUDA */
    void *flow;            /* struct flow_cuda * (cuda) */
    void *vocoder;         /* struct vocoder_cuda * (cuda) */
    void *condition;       /* struct condition_cuda * (cuda): the window's condition projection */
};

/* Open the GPU path on device `device` for windows of RENDER_WINDOW_FRAMES frames (the
 * latent length follows from cm): uploads the condition projection from cm, the DiT from
 * dm and the vocoder from voc, every GEMM of the DiT and the vocoder in `precision`.
 * voc's host weights are not read after it returns (a CUDA caller may then
 * vocoder_drop_weights it). -ENOTSUP in a build without CUDA, -ENODEV without a device;
 * the message says which. kind CPU: nothing to do. */
int s1_backend_open(struct s1_backend *b, enum mm3_backend kind, int device, const struct condition_model *cm,
                    const struct dit_model *dm, const struct vocoder *voc, enum mm3_matmul_precision precision);
void s1_backend_close(struct s1_backend *b);

/* Windows and vocoder decodes this process reran because fp16 operands overflowed
 * (stage1/cuda/dit_kernels.h); 0 without CUDA. */
unsigned long long s1_backend_fp16_rescues(void);

/* The flow batch of the backend for up to max_windows windows of up to max_L latents:
 * the CPU reference (flow_batch_cpu_create) or the GPU's (flow_cuda_batch_open, on the
 * device s1_backend_open chose). Close it with out->close(out->ctx) before the backend. */
int s1_backend_flow_batch(struct s1_backend *b, const struct dit_model *dm, int max_L, int max_windows,
                          struct flow_batch *out);

/* Point a render's flow loop and vocoder at the backend (CPU: left as they are). */
void s1_backend_apply(const struct s1_backend *b, struct render_params *p);

#endif
