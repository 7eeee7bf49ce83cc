/* Flow-matching Euler sampler with classifier-free guidance, one window at a time.
 *
 * Schedule (diffusers FlowMatchEulerDiscreteScheduler as the reference drives it:
 * sigmas = numpy.linspace(1, 1/N, N) in double, rounded to float32, shifted, inverted):
 *     sigma'_i = fp32(fp32(s sigma_i) / fp32(1 + fp32((s - 1) sigma_i)))   (s: the scheduler's shift)
 *     table[i] = fp32(1 - sigma'_i) for i < N, table[N] = 1
 * With s = 1 (the release's scheduler config) sigma' = sigma bit for bit.
 *     step i: t = table[i], dt = fp32(table[i+1] - table[i])   (telescopes to exactly 1)
 * Per step: v = v_u + s (v_c - v_u) with v_c = DiT(x, t, cond), v_u = DiT(x, t, 0); x += dt v.
 * With an overlap prefix of `ov` latents, before every step
 *     x[:, :ov] = (1 - fp32(1 - 1e-6) t) * noise[:, :ov] + t * prev[:, :ov]
 * and after the last step x[:, :ov] = prev. */
#ifndef MM3_STAGE1_FLOW_H
#define MM3_STAGE1_FLOW_H

#include "stage1/dit.h"

#ifdef __cplusplus
extern "C" { /* flow_cuda.cu shares the schedule and struct flow_job */
#endif

/* Default number of Euler steps of the release (num_inference_steps). */
#define FLOW_DEFAULT_STEPS 30
/* Default CFG scale of the DiT (guidance_scale). */
#define FLOW_DEFAULT_GUIDANCE 1.7f

/* Default scheduler shift (scheduler_config.json's `shift` when the checkpoint has none). */
#define FLOW_DEFAULT_SHIFT 1.0f
/* Largest shift a request or the deploy file may ask for (any s > 0 is a valid schedule). */
#define FLOW_MAX_SHIFT 20.0f

/* table[n_steps + 1] as described above. n_steps >= 1, shift > 0. */
void flow_schedule_fill(float *table, int n_steps, float shift);

/* The scheduler's shift of the checkpoint at model_dir: scheduler/scheduler_config.json's
 * `shift`, FLOW_DEFAULT_SHIFT when the folder, the file or the key is absent. A present
 * but unreadable file, or a shift that is not a number in (0, FLOW_MAX_SHIFT], is an error. */
int flow_checkpoint_shift(const char *model_dir, float *shift);

/* One window of the flow: its loop's settings and arrays. */
struct flow_job {
    int n_steps;
    float guidance;
    float shift; /* scheduler shift (> 0; 1 = the release's schedule) */
    int L, ov;
    const float *cond; /* [L, cond_dim]: the (already spliced) conditioning of the conditional branch */
    const float *prev; /* [in_ch, ov] (row stride ov): the previous window's carried latents, or NULL with ov = 0 */
    float *x;          /* [in_ch, L]: the window's initial noise in, its final latents out */
};

/* Run the window j in place (j->x). ws must hold j->L latents. Returns 0, -EINVAL,
 * -ENOMEM, or -ERANGE if the latents stop being finite. */
int flow_window_run(const struct dit_model *m, struct dit_workspace *ws, const struct flow_job *j);

#ifdef __cplusplus
}
#endif

#endif
