/* Parse and validate the JSON body of POST /v1/audio/speech into job params.
 *
 * Accepts the SGLang-Omni / vLLM-Omni fields for this model (`input` = lyrics,
 * `instructions` = caption, `max_new_tokens` = frames) and our clearer ones
 * (`lyrics`, `caption`, `duration_s`, ...); see docs/api.md for the table.
 * Every error is -EINVAL with a message (mm3_last_error) naming the field and
 * what was expected, and the field name in `field` for the JSON error body. */
#ifndef MM3_STAGE0_API_REQUEST_H
#define MM3_STAGE0_API_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/deploy.h"
#include "stage0/api/job.h"

struct api_limits {
    int32_t max_frames;          /* hard cap on frames (9000 = 6 min at 25 fps) */
    int32_t default_frames;      /* when neither max_new_tokens nor duration_s is given */
    double frame_rate;           /* AR frames per second of audio (25) */
    size_t max_text_chars;       /* per text field, in Unicode code points */
    int32_t default_sample_rate; /* 44100 or 32000, when sample_rate is not given */
    /* Used when the request leaves the field out (the deploy file's stage defaults). */
    uint64_t default_seed;          /* stage 0 default_sampling_params.seed (0) */
    int32_t default_steps;          /* stage 1 num_inference_steps (30) */
    float default_guidance_scale;   /* stage 1 guidance_scale (1.7) */
    float default_flow_shift;       /* stage 1 flow_shift; 0 = stage 1's own default (the checkpoint's) */
    float default_cfg_scale;        /* stage 0 extra_args.cfg_scale (1.5) */
    const char *replay_dir;         /* api.replay_dir: x_replay_file must name a file inside it; NULL = refused */
    /* The per-request adapters (deploy lora_modules) a request may pick by `model` or `lora`. */
    int n_lora;
    char lora_names[MM3_DEPLOY_MAX_LORA_MODULES][MM3_JOB_LORA_MAX];
};

/* Defaults: 9000 frames cap and default, 25 fps, 20000 characters, 44100 Hz, and the
 * reference recipe: seed 0, 30 steps, DiT guidance 1.7, AR guidance 1.5. */
void api_limits_default(struct api_limits *lim);

/* Parse `len` bytes of JSON. On success fills *out (caller frees with
 * mm3_job_params_free) and returns 0; on a bad request returns -EINVAL, sets the
 * error message and copies the offending field name (or "body") to `field`; a `lora`
 * that names no loaded adapter is -ENOENT (404, as vLLM answers an unknown model). */
int api_request_parse(const char *body, size_t len, const struct api_limits *lim, struct mm3_job_params *out,
                      char *field, size_t field_cap);

#endif
