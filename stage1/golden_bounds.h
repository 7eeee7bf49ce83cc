/* Bounds of the stage-1 golden replay as a function of backend, precision and geometry.
 *
 * The tiny bounds (stage1/golden.h) were measured on the tiny checkpoints. At another
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
