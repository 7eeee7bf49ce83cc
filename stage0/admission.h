/* Honest admission of streamed songs: how many streams stage 1 can keep fed, from what it
 * measures, and when a held stream may expect to start.
 *
 * Stage 1 reports, with every window's PCM, the seconds of work it spent on the song so
 * far (condition, its share of the batched DiT, vocoder). The engine feeds each window's
 * work and audio seconds here; their ratio w (seconds of stage-1 work per second of
 * audio, at the precision and batch sizes the server runs now) says stage 1 renders
 * 1 / w seconds of audio per second in all. A listener plays 1 s of audio per second, so
 * stage 1 keeps at most C = 1 / w streams fed: a new stream starts only while the streams
 * admitted are fewer than floor(ADMISSION_UTILIZATION x C). Whole-file songs and streams
 * whose client accepts stalls (`allow_stall`) are not counted: stage 1 gives their windows
 * no deadline, so they only take the room the counted streams leave.
 *
 * w is measured on the batches the server actually ran: one stream alone runs small,
 * less efficient batches and reads a higher w (a lower C) than a full server; each stream
 * admitted makes the batches larger, w falls and C rises to the server's real figure. The
 * sums decay (ADMISSION_DECAY per window), so a change of load or precision shows within
 * a few dozen windows. Before the first window is measured one stream plays at a time.
 *
 * Start estimate for the k-th held stream: the n counted streams share stage 1, each
 * rendering about 1 / (w n) seconds of audio per second, so the one with r seconds of
 * audio left ends about r w n seconds from now; the k-th stream to end frees the slot the
 * k-th held one takes. Beyond n: unknown. */
#ifndef MM3_STAGE0_ADMISSION_H
#define MM3_STAGE0_ADMISSION_H

#define ADMISSION_DECAY 0.98
/* The share of the capacity admission fills. Stage 1 renders a song's windows one after
 * another in batches it cannot interrupt: a window ready just after a batch began waits
 * for it, and a new stream's first window joins the batches of the others. At full use
 * each such wait is a stall somewhere; the headroom absorbs them. */
#define ADMISSION_UTILIZATION 0.85

struct admission {
    double work_s, audio_s; /* decayed sums over the windows reported */
};

/* One window (or any stretch of a song): stage-1 work and the audio it made, in seconds.
 * Nonsense (negative, NaN, no audio) is ignored. */
void admission_observe(struct admission *a, double work_s, double audio_s);

/* Seconds of stage-1 work per second of audio; 0 before any observation. */
double admission_work_per_audio(const struct admission *a);

/* Streams stage 1 keeps fed (1 / w), or -1 while unknown. */
double admission_capacity(const struct admission *a);

/* 1 when one more counted stream fits beside `streams` admitted ones. The first always
 * does: a server slower than real time still serves streams, one at a time (they stall),
 * rather than none, and keeps measuring; before anything is measured only the first does
 * (a burst on a fresh server waits for the first window's figure). */
int admission_allows(const struct admission *a, int streams);

/* Seconds until the k-th (1-based) held stream can start, given the audio seconds left
 * of the n counted streams (sorted here, in place); -1 when unknown. */
double admission_start_estimate(const struct admission *a, double *left_s, int n, int k);

#endif
