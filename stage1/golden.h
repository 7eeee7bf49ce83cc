/* Golden replay of stage 1 (mm3-stage1 --golden DIR).
 *
 * For every case of DIR/manifest.json: the two recorded DiT calls are re-run from their
 * inputs; the song is rendered from `frame_hiddens` (pushed in uneven pieces, as a stream)
 * with the recorded per-window noise `window.w.noise`, and the per-window condition,
 * final latents, window-0 waveform (when recorded) and the stitched `audio` are compared.
 * Each comparison is rel = ||a - b|| / ||b|| and passes at <= 1e-4; `audio` must also have
 * exactly the recorded length. One line per case, then "N passed, M failed". */
#ifndef MM3_STAGE1_GOLDEN_H
#define MM3_STAGE1_GOLDEN_H

#include <stdio.h>

#define GOLDEN_REL_TOL 1e-4

/* ckpt: checkpoint root, or NULL for DIR/<manifest "checkpoint"> (default DIR/checkpoint).
 * Returns < 0 when the directory or the models cannot be loaded; otherwise 0 with the
 * counts set (a failing case is counted, not an error). */
int golden_run(const char *dir, const char *ckpt, FILE *out, int *n_pass, int *n_fail);

#endif
