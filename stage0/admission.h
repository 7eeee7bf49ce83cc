/* Honest admission of streamed songs: how many streams stage 1 can keep fed, from what it
 * measures, and when a held stream may expect to start.
 *
 * Stage 1 reports, with every window's PCM, its real-time capacity C: the streams it keeps
 * fed with the batches it would run for them (stage1/capacity.h: a batch cost fitted over
 * the batch sizes it ran, so a lightly loaded stage 1, rendering windows one at a time,
 * does not read as a slow one). A new stream starts only while the streams admitted are
 * fewer than floor(ADMISSION_UTILIZATION x C). Whole-file songs and streams whose client
 * accepts stalls (`allow_stall`) are not counted: stage 1 gives their windows no deadline,
 * so they only take the room the counted streams leave.
 *
 * It also reports the seconds of work it spent on each song so far (condition, its share
 * of the batched DiT, vocoder); their ratio to the audio, w, is what stage 1 spends per
 * second of audio now. Until stage 1 has reported a capacity, 1 / w stands in for it. The
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
    double reported;        /* the latest capacity stage 1 reported; <= 0: none yet */
};

/* One window (or any stretch of a song): stage-1 work and the audio it made, in seconds.
 * Nonsense (negative, NaN, no audio) is ignored. */
void admission_observe(struct admission *a, double work_s, double audio_s);

/* Stage 1's capacity in streams as it reported it; capacity < 0 (unknown) is ignored. */
void admission_report(struct admission *a, double capacity);

/* Seconds of stage-1 work per second of audio; 0 before any observation. */
double admission_work_per_audio(const struct admission *a);

/* Streams stage 1 keeps fed: the reported capacity, else 1 / w, else -1 (unknown). */
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
