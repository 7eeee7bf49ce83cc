/* Which ready windows go into stage 1's next DiT batch (stages[1].window_order).
 *
 * A streamed song's next window has a deadline: the moment its client, playing at 1x from
 * the first sample it got, will have played everything sent so far. A song's first window
 * is due now (its client hears nothing until it is out). A stream stage 0 prerolls (keeps
 * its audio back until the server can keep it fed, stage0/admission.h) has no listener
 * yet, and is due like a stream from the moment stage 0 lets it play (PLAY). Songs
 * delivered as one file have no listener either. Windows without a listener fill the
 * batch's spare room, but only until the time stage 0 would give up waiting for their next
 * audio comes near (the caller's `whole_by`): then they are due like a stream, so a steady
 * load of streams cannot starve them into a timeout.
 * `deadline` orders the candidates by earliest deadline (first windows ahead of later
 * windows due at the same time; ties keep the round-robin order), so a new song's first
 * window overtakes the later windows of songs already playing and a stream far ahead
 * yields to one about to run dry. Under `deadline` the windows without a listener join the
 * batch only while it still ends before the tightest deadline of the listened windows in
 * it (as measured batches of that size took): a song advances one window per batch, so a
 * batch filled to the brim can take longer than the audio a window adds, and its streams
 * would run dry. `fifo` keeps the round-robin order and fills the batch. */
#ifndef MM3_STAGE1_WINDOW_ORDER_H
#define MM3_STAGE1_WINDOW_ORDER_H

#include <math.h>
#include <stdint.h>

#include "common/deploy.h"
#include "pipe/pipe_proto.h"

#define WINDOW_NO_DEADLINE INFINITY

struct window_candidate {
    uint64_t id;     /* the request's */
    double deadline; /* seconds on the server's monotonic clock, or WINDOW_NO_DEADLINE */
    int first;       /* the song's first window */
    int listener;    /* a stream whose client plays it (its deadline is a playback one) */
};

/* Wall seconds of DiT batches by their number of windows, decayed, to predict a batch. */
struct batch_time {
    double sum[PIPE_BATCH_WINDOWS_MAX + 1], weight[PIPE_BATCH_WINDOWS_MAX + 1];
};

void batch_time_observe(struct batch_time *b, int windows, double seconds);
/* Seconds a batch of `windows` takes: as measured at that size; else scaled from the
 * nearest smaller size measured (in proportion, which overstates a fixed cost), or, with
 * only larger ones, the smallest of them; -1 with nothing measured. */
double batch_time_predict(const struct batch_time *b, int windows);

/* The deadline of a song's next window. playing 0 (one file, or a stream stage 0 still
 * prerolls): whole_by (WINDOW_NO_DEADLINE for none). first: now. Otherwise t_clock +
 * audio_sent_s, t_clock being when its client started playing; 0 (an earlier window is
 * rendered but its audio is not out yet) counts as now, the soonest it can go out. */
double window_deadline(int playing, int first, double now, double t_clock, double audio_sent_s, double whole_by);

/* Put c[0..n), given in round-robin order, in the order the batch takes them. */
void window_order_sort(enum mm3_window_order order, struct window_candidate *c, int n);

/* Which of the sorted candidates c[0..n) the batch takes, at most max: their indices into
 * take[], in order; returns how many. fifo: the first max. deadline: every listened window
 * and every window already due, then windows without a listener while the batch,
 * predicted by bt, ends before the tightest deadline still ahead among those taken. */
int window_batch_take(enum mm3_window_order order, const struct window_candidate *c, int n, int max, double now,
                      const struct batch_time *bt, int *take);

#endif
