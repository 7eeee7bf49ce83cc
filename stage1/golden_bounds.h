/* Bounds of the stage-1 golden replay as a function of backend, precision and geometry.
 *
 * The tiny bounds (below) were measured on the tiny checkpoints. At another
 * geometry a reduced precision deviates further from float32 because the GEMMs are
 * longer and the signal passes more layers, so a fixed bound would fail a replay that
 * is as good as PyTorch's own computation in that precision. A golden directory made
 * with `scripts/make_golden.py --yardsticks` holds yardsticks.json: PyTorch's rel error
 * against its float32 run in each precision, on the same draws, per quantity. With it
 * the CUDA bound of precision P and quantity Q is
 *     max(tiny bound of P and Q, GOLDEN_YARDSTICK_FACTOR x PyTorch's rel error in P for Q)
 * ("no worse than 1.25x PyTorch's own deviation"); without it, or on the CPU (float32
 * against float32), the tiny bounds hold unchanged. */
#ifndef MM3_STAGE1_GOLDEN_BOUNDS_H
#define MM3_STAGE1_GOLDEN_BOUNDS_H

#include "common/deploy.h"

/* The tiny bounds: a replay on the CPU, or in fp32 on the GPU, holds every quantity to
 * 1e-4. tf32 and fp16 operands keep 10 mantissa bits, bf16 7, and 30 Euler steps over a
 * random-weight DiT amplify the rounding; the tf32/fp16 and bf16 bounds sit 4-7x above
 * what tiny-a measures on the H200 (docs/performance.md, "Stage 1 on the GPU").
 * FWD: one DiT forward (dit_call.*, as test_dit_cuda's whole-forward bounds); FLOW: a
 * window's latents after the flow loop (the Euler steps average the per-forward rounding
 * at tiny-a's 2-4 steps); AUDIO: waveform and audio, the vocoder's GEMMs in the same
 * precision. fp8 reads e4m3 operands (3 mantissa bits, per-row scales keep every value in
 * range): its RMS relative rounding is ~16x bf16's, so bf16's figures times 16 with a
 * margin of ~2x, the audio damped as bf16's is. */
#define GOLDEN_REL_TOL 1e-4
#define GOLDEN_REL_TOL_FWD_TF32 2e-3
#define GOLDEN_REL_TOL_FWD_BF16 1.5e-2
#define GOLDEN_REL_TOL_FLOW_TF32 1e-3
#define GOLDEN_REL_TOL_FLOW_BF16 1e-2
#define GOLDEN_REL_TOL_AUDIO_TF32 2e-3
#define GOLDEN_REL_TOL_AUDIO_BF16 1e-2
#define GOLDEN_REL_TOL_FWD_FP16 GOLDEN_REL_TOL_FWD_TF32
#define GOLDEN_REL_TOL_FLOW_FP16 GOLDEN_REL_TOL_FLOW_TF32
#define GOLDEN_REL_TOL_AUDIO_FP16 GOLDEN_REL_TOL_AUDIO_TF32
#define GOLDEN_REL_TOL_FWD_FP8 1e-1
#define GOLDEN_REL_TOL_FLOW_FP8 5e-2
#define GOLDEN_REL_TOL_AUDIO_FP8 5e-3

#define GOLDEN_YARDSTICK_FACTOR 1.25

/* The quantities a replay bounds; names as in yardsticks.json. */
enum golden_quantity { GOLDEN_Q_DIT_CALL = 0, GOLDEN_Q_LATENTS, GOLDEN_Q_AUDIO, GOLDEN_Q_COUNT };

struct golden_bounds {
    double bound[GOLDEN_Q_COUNT];     /* what the replay holds each quantity to */
    double tiny[GOLDEN_Q_COUNT];      /* the tiny bound of the backend and precision */
    double yardstick[GOLDEN_Q_COUNT]; /* PyTorch's rel error in the precision; < 0: none */
};

const char *golden_quantity_name(enum golden_quantity q);

/* The tiny bounds of (backend, precision) into b, no yardsticks. */
void golden_bounds_tiny(struct golden_bounds *b, enum mm3_backend backend, enum mm3_matmul_precision p);

/* max(tiny, GOLDEN_YARDSTICK_FACTOR x yardstick); a yardstick < 0 (none) gives tiny. */
double golden_bound_with_yardstick(double tiny, double yardstick);

/* Read PyTorch's figures for precision p from the yardsticks file at path (object
 * "precisions" -> "<p>" -> "<quantity>" -> "rel") and widen b's bounds with them.
 * A precision or quantity the file does not list keeps its tiny bound. Returns 0, or
 * < 0 with a message naming the file and key when the file is unreadable or a figure is
 * not a finite number >= 0. */
int golden_bounds_apply_yardsticks(struct golden_bounds *b, const char *path, enum mm3_matmul_precision p);

#endif
