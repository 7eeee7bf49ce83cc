/* Recorded per-window initial noise of a golden case file (keys window.w.noise,
 * w = 0, 1, ... until the first missing one), for RENDER_NOISE_REPLAY. A testing
 * aid behind MM3_ALLOW_REPLAY=1: it lets a served request reproduce the
 * reference pipeline's audio exactly. */
#ifndef MM3_STAGE1_REPLAY_NOISE_H
#define MM3_STAGE1_REPLAY_NOISE_H

#include <stdint.h>

#include "common/safetensors.h"
#include "stage1/render.h"

struct replay_noise {
    int n;        /* windows recorded */
    float **w;    /* [n] arrays of len[k] floats = in_ch * L_k */
    int64_t *len; /* [n] */
};

/* 0 or a negative errno code (file unreadable, no window.0.noise). */
int replay_noise_load(struct replay_noise *rn, const char *path);
/* The same from a file already open (x_replay_file: common/replay_file.h). */
int replay_noise_load_file(struct replay_noise *rn, const struct st_file *f);
/* The render noise that reads rn (which must outlive the render). */
struct render_noise replay_noise_render(const struct replay_noise *rn);
void replay_noise_free(struct replay_noise *rn);

#endif
