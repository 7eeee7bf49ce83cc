/* Flow-matching Euler sampler with classifier-free guidance, one window at a time.
 *
 * Schedule (diffusers FlowMatchEulerDiscreteScheduler as the reference drives it:
 * sigmas = numpy.linspace(1, 1/N, N) in double, rounded to float32, inverted):
 *     table[i] = fp32(1 - fp32(sigma_i)) for i < N, table[N] = 1
 *     step i: t = table[i], dt = fp32(table[i+1] - table[i])   (telescopes to exactly 1)
 * Per step: v = v_u + s (v_c - v_u) with v_c = DiT(x, t, cond), v_u = DiT(x, t, 0); x += dt v.
 * With an overlap prefix of `ov` latents, before every step
 *     x[:, :ov] = (1 - fp32(1 - 1e-6) t) * noise[:, :ov] + t * prev[:, :ov]
 * and after the last step x[:, :ov] = prev. */
#ifndef MM3_STAGE1_FLOW_H
#define MM3_STAGE1_FLOW_H

#include "stage1/dit.h"

/* Default number of Euler steps of the release (num_inference_steps). */
#define FLOW_DEFAULT_STEPS 30
/* Default CFG scale of the DiT (guidance_scale). */
#define FLOW_DEFAULT_GUIDANCE 1.7f

/* table[n_steps + 1] as described above. n_steps >= 1. */
void flow_schedule_fill(float *table, int n_steps);

/* Run one window in place.
 * x[in_ch, L]: the window's initial noise on entry, its final latents on return.
 * cond[L, cond_dim]: the (already spliced) conditioning of the conditional branch.
 * prev[in_ch, ov] (row stride ov): the previous window's carried latents, or ov = 0.
 * ws must hold L latents. Returns 0, -ENOMEM, or -ERANGE if the latents stop being finite. */
int flow_window_run(const struct dit_model *m, struct dit_workspace *ws, int n_steps, float guidance, int L,
                    const float *cond, int ov, const float *prev, float *x);

#endif
