/* Stage 1's real-time capacity: how many streams it keeps fed, from what it measures.
 *
 * A stream needs one window of audio (about h seconds) every h seconds. Stage 1 renders
 * the windows of several songs in one DiT batch of up to B windows, and a batch of n
 * windows takes about t(n) = a + b n seconds: a is what a batch costs whatever its size
 * (the Euler steps' fixed launches and the GPU's unused width at small n), b what each
 * window adds. Each window also costs e seconds outside the batch (preparing it, and
 * finishing it where that does not overlap the next batch). k streams then need
 *     cost(k) = ceil(k / B) a + k (b + e)
 * seconds of stage 1 every h seconds, and the capacity is the largest k (fractional
 * within the last window) with cost(k) <= h.
 *
 * The capacity is a property of the batches stage 1 would run, not of the ones it ran:
 * a lightly loaded stage 1 renders each window as soon as it is ready, in batches of one
 * or two, and their cost per window says little about a full batch. So a and b are fitted
 * (least squares) over the batch sizes seen, and the capacity follows from the fit. With
 * one batch size seen so far the fit has no slope: a = 0 and b = t / n, which
 * underestimates the capacity, never overestimates it. Every sum decays by
 * CAPACITY_DECAY per observation, so a change of load, precision or GPU sharing shows
 * within a few dozen batches. */
#ifndef MM3_STAGE1_CAPACITY_H
#define MM3_STAGE1_CAPACITY_H

#define CAPACITY_DECAY 0.98

struct s1_capacity {
    int max_batch;                 /* B: windows per DiT batch at most */
    double w, wn, wnn, wt, wnt;    /* decayed sums over batches: 1, n, n^2, t, n t */
    double windows, extra_s, audio_s; /* decayed sums over finished windows */
};

/* max_batch >= 1. */
void s1_capacity_init(struct s1_capacity *c, int max_batch);

/* A DiT batch of n windows took seconds. Nonsense (n < 1, negative, NaN) is ignored. */
void s1_capacity_batch(struct s1_capacity *c, int n, double seconds);

/* A song's window (not its first: a first window carries more audio than the windows a
 * stream needs in steady state) finished: its work outside the batch and its audio, in
 * seconds. */
void s1_capacity_window(struct s1_capacity *c, double extra_s, double audio_s);

/* The fitted batch cost: t(n) = *a + *b n, both >= 0. Returns -1 before any batch. */
int s1_capacity_fit(const struct s1_capacity *c, double *a, double *b);

/* Streams stage 1 keeps fed; -1 while unknown (no batch or no window measured yet). */
double s1_capacity_streams(const struct s1_capacity *c);

#endif
