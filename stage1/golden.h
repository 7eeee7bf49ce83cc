/* Golden replay of stage 1 (mm3-stage1 --golden DIR).
 *
 * For every case of DIR/manifest.json: the two recorded DiT calls are re-run from their
 * inputs; the song is rendered from `frame_hiddens` (pushed in uneven pieces, as a stream)
 * with the recorded per-window noise `window.w.noise`, and the per-window condition,
 * final latents, window-0 waveform (when recorded) and the stitched `audio` are compared.
 * Each comparison is rel = ||a - b|| / ||b|| and passes at <= 1e-4; `audio` must also have
 * exactly the recorded length. One line per case, then "N passed, M failed".
 *
 * Backend cuda: the DiT calls and the flow loop run on the GPU (stage1/cuda/flow_cuda.h)
 * in the chosen matmul precision, the condition projection in float32 whatever the
 * precision (stage1/cuda/condition_cuda.h), so the condition is held to 1e-4 everywhere.
 * fp32 must pass at the same 1e-4. tf32 and bf16 round the GEMM operands (10 and 7
 * mantissa bits), and 30 Euler steps over a random-weight DiT amplify that, so they are
 * held to the looser, measured bounds below (docs/performance.md, "Stage 1 on the GPU").
 * When DIR holds yardsticks.json (PyTorch's own deviation in each precision at DIR's
 * geometry), the CUDA bounds widen to 1.25x PyTorch's figure where that is larger
 * (stage1/golden_bounds.h). Each quantity is printed as rel, SNR in dB (-20 log10 rel)
 * and the bound it was held to. */
#ifndef MM3_STAGE1_GOLDEN_H
#define MM3_STAGE1_GOLDEN_H

#include <stdio.h>

#include "common/deploy.h"
#include "stage1/golden_bounds.h"

struct golden_options {
    const char *ckpt;                    /* checkpoint root, or NULL (see golden_run) */
    enum mm3_backend backend;            /* CPU (default; AUTO = CPU) or CUDA */
    enum mm3_matmul_precision precision; /* CUDA only: operand precision of the DiT GEMMs */
};

/* o->ckpt: checkpoint root, or NULL for DIR/<manifest "checkpoint"> (default DIR/checkpoint).
 * Returns < 0 when the directory or the models cannot be loaded (or backend cuda without
 * CUDA built in / a device: -ENOTSUP / -ENODEV); otherwise 0 with the counts set (a
 * failing case is counted, not an error). */
int golden_run(const char *dir, const struct golden_options *o, FILE *out, int *n_pass, int *n_fail);

#endif
