/* The condition encoder's projection (condition_project: Conv1d k=3 over the mixed
 * frames, then the nearest-frame gather onto the latent timeline) on the GPU.
 *
 * On the CPU this is the one heavy host step of a window: 3 x F x hidden x out_dim
 * multiply-adds (200 x 3 x 4096 x 2048 = 5 GFLOP at the release geometry), in the
 * strict-order scalar reference more than the whole DiT loop on the GPU. Here the three taps are three GEMMs over a zero-padded copy of the frames,
 * accumulated in place (y = X[f-1] W0^T + X[f] W1^T + X[f+1] W2^T + b), always in
 * float32 whatever the DiT's matmul precision: it is 0.1% of a window's FLOPs, so TF32
 * here would move the condition away from the reference for no visible gain.
 *
 *     struct condition_cuda *cc;
 *     condition_cuda_create(&cc, cm, 200);
 *     condition_cuda_project(cc, mixed, F, cond);   // condition_project's contract
 *     condition_cuda_free(cc);
 *
 * Not thread safe: one caller at a time. Only built with CUDA. */
#ifndef MM3_STAGE1_CUDA_CONDITION_CUDA_H
#define MM3_STAGE1_CUDA_CONDITION_CUDA_H

#include "stage1/condition.h"

struct condition_cuda;

/* Upload cm's projection (cm may be freed afterwards); buffers for up to max_frames
 * frames per call. Needs a current CUDA device. */
int condition_cuda_create(struct condition_cuda **out, const struct condition_model *cm, int max_frames);
void condition_cuda_free(struct condition_cuda *cc); /* NULL is fine */

/* As condition_project: mixed[F, hidden] host in, cond[L, out_dim] host out,
 * L = condition_latent_len(F); 1 <= F <= max_frames. */
int condition_cuda_project(struct condition_cuda *cc, const float *mixed, int F, float *cond);

/* render_condition-shaped callback (ctx = struct condition_cuda *). */
int condition_cuda_project_cb(void *ctx, const float *mixed, int F, float *cond);

#endif
