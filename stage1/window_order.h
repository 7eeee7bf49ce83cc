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
 * yields to one about to run dry. `fifo` keeps the round-robin order. The batch size is
 * the caller's either way. */
#ifndef MM3_STAGE1_WINDOW_ORDER_H
#define MM3_STAGE1_WINDOW_ORDER_H

#include <math.h>
#include <stdint.h>

#include "common/deploy.h"

#define WINDOW_NO_DEADLINE INFINITY

struct window_candidate {
    uint64_t id;     /* the request's */
    double deadline; /* seconds on the server's monotonic clock, or WINDOW_NO_DEADLINE */
    int first;       /* the song's first window */
};

/* The deadline of a song's next window. playing 0 (one file, or a stream stage 0 still
 * prerolls): whole_by (WINDOW_NO_DEADLINE for none). first: now. Otherwise t_clock +
 * audio_sent_s, t_clock being when its client started playing; 0 (an earlier window is
 * rendered but its audio is not out yet) counts as now, the soonest it can go out. */
double window_deadline(int playing, int first, double now, double t_clock, double audio_sent_s, double whole_by);

/* When a stream's client started playing, as stage 1 knows it: its first audio out, or
 * PLAY's time when that came later (a prerolled stream); 0 before its first audio. */
double window_play_clock(double t_first_audio, double t_play);

/* Put c[0..n), given in round-robin order, in the order the batch takes them. */
void window_order_sort(enum mm3_window_order order, struct window_candidate *c, int n);

#endif
