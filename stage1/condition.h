/* Condition encoder: stage-0 frame vectors -> DiT conditioning on the latent timeline.
 *
 *   mix[f, c]  = layer_scale * sum_l softmax(logits)[l] * frames[f, l*hidden + c]   (condition_mix)
 *   cond_f     = Conv1d(mix^T; proj, kernel 3, padding 1, zero padded at the window edges)
 *   cond[j, :] = cond_f[:, src(j)]^T, j < L = condition_latent_len(F)             (condition_project)
 *
 * Mixing is per frame, so it can run as frames arrive (and stage 0 may send frames already
 * mixed: `hidden` values instead of `n_layers * hidden`); the conv runs per window. */
#ifndef MM3_STAGE1_CONDITION_H
#define MM3_STAGE1_CONDITION_H

#include "common/frame_mix.h"

struct condition_config {
    int hidden;            /* condition_hidden_dim (4096 in the release) */
    int n_layers;          /* num_condition_layers (8) */
    int out_dim;           /* out_dim (2048) = the DiT's condition_dim */
    int in_rate, in_hop;   /* input_sampling_rate, input_hop_length (24000, 960) */
    int out_rate, out_hop; /* output_sampling_rate, output_hop_length (44100, 512) */
};

struct condition_model {
    struct condition_config cfg;
    struct frame_mix mix; /* the slot mix (common/frame_mix.h), shared with stage 0 */
    float *proj_w;        /* [3][out_dim][hidden]: proj.weight [out, hidden, 3] re-laid per tap */
    float *proj_b;        /* [out_dim] */
    float *arena;         /* the one allocation proj_w / proj_b point into */
};

/* Load <ckpt_root>/condition_encoder (config.json + weights, shapes checked). *out is
 * malloc'ed; free with condition_free. */
int condition_load(struct condition_model **out, const char *ckpt_root);
void condition_free(struct condition_model *m);

/* Latent length for a window of F frames: max(1, int(F * out_rate / in_rate * in_hop / out_hop))
 * evaluated left to right in double, as the reference's Python does. F=200 -> 689. */
int condition_latent_len(const struct condition_config *cfg, int F);

/* Source frame of latent j for F frames -> L latents, PyTorch's float32 nearest rule:
 * min(floor((float)j * ((float)F / (float)L)), F - 1). */
int condition_nearest_index(int F, int L, int j);

/* Mix n frames of width n_layers*hidden into out[n, hidden] (frame_mix_apply). Non-finite
 * input is an error (-EINVAL naming the frame); frames of width `hidden` (already mixed)
 * are copied. */
int condition_mix(const struct condition_model *m, const float *frames, int n, int width, float *out);

/* Project F mixed frames [F, hidden] to cond[L, out_dim], L = condition_latent_len(F).
 * Returns 0, -EINVAL (F < 1) or -ENOMEM. */
int condition_project(const struct condition_model *m, const float *mixed, int F, float *cond);

#endif
