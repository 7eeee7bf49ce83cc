/* Honest admission of streamed songs: how much stage 1 can keep fed, from what it
 * measures, and when a stream may start playing.
 *
 * Stage 1 reports, with every window's PCM, the seconds of work it spent on the song so
 * far (condition, its share of the batched DiT, vocoder). The engine feeds each window's
 * work and audio seconds here; their ratio w (seconds of stage-1 work per second of
 * audio, at the precision and batch sizes the server runs now) says stage 1 renders
 * C = 1 / w seconds of audio per second in all: its real-time capacity in streams.
 *
 * Every song starts generating as soon as there is room, so both stages work on full
 * batches. What admission decides is when a stream's client starts playing. A stream
 * that fits plays from its first audio; one that does not is prerolled: stage 0 keeps
 * its audio back (stage 1 renders it in the room the playing streams leave) and lets
 * it play once it fits, with all that audio sent at once.
 *
 * Whether a stream fits: a playing stream whose client has d seconds of audio before it
 * runs dry and whose song has l seconds still to render needs, until its end, the share
 * n = l / (d - m + l) of one real-time stream (1 when d <= m), m being the margin a window
 * can wait before it is out (its own audio, the batch running and its own batch). Stage 1
 * serves due windows first (stage1/window_order.h), and the audio a stream needs by any
 * time t from now is at most n t, so streams whose needs sum to at most C are all served
 * in time. But a song advances one window per DiT batch, however few songs need it: a full
 * batch may take longer than the audio a window adds (more so while stage 0 shares the
 * GPU), so a stream also needs n within the rate r at which its own audio has been coming
 * (audio seconds per second, over its recent windows). A stream plays when, with share s
 * (api.stream_capacity_share), the needs of the streams playing on its stage-1 worker plus
 * its own stay within s C and its own stays within s r. A prerolled stream's d grows as
 * its audio is rendered ahead; one wholly rendered needs nothing and always plays. A new
 * stream alone on its worker (no other song in flight or waiting) plays at once, if it is
 * still alone at its first audio (a burst's first song is not); one with company and
 * nothing measured yet prerolls. Whole-file songs and streams whose client
 * accepts stalls (`allow_stall`) are not counted: stage 1 gives their windows no deadline,
 * so they only take the room the counted streams leave.
 *
 * w is measured on the batches the server actually ran, and the sums decay
 * (ADMISSION_DECAY per window), so a change of load or precision shows within a few
 * dozen windows. */
#ifndef MM3_STAGE0_ADMISSION_H
#define MM3_STAGE0_ADMISSION_H

#define ADMISSION_DECAY 0.98

struct admission {
    double work_s, audio_s; /* decayed sums over the windows reported */
    /* of the capacity playing streams may fill (api.stream_capacity_share): stage 1 renders
     * windows in batches it cannot interrupt and the capacity is a running average, so the
     * headroom absorbs what the need arithmetic leaves out */
    double share;
};

/* One window (or any stretch of a song): stage-1 work and the audio it made, in seconds.
 * Nonsense (negative, NaN, no audio) is ignored. */
void admission_observe(struct admission *a, double work_s, double audio_s);

/* Seconds of stage-1 work per second of audio; 0 before any observation. */
double admission_work_per_audio(const struct admission *a);

/* Streams stage 1 keeps fed (1 / w), or -1 while unknown. */
double admission_capacity(const struct admission *a);

/* The margin m: a window of window_s seconds of audio, and the batch running plus its own,
 * of up to batch_windows windows each, at the measured rate. */
double admission_margin(const struct admission *a, double window_s, int batch_windows);

/* The share of one real-time stream that a stream with dry_s seconds before its client
 * runs dry and left_s seconds still to render needs from now on (0..1). */
double admission_stream_need(double dry_s, double left_s, double margin_s);

/* 1 when a stream needing `need` may play beside `streams` playing streams whose needs sum
 * to `load`, its audio coming at `rate` audio seconds per second (INFINITY: it is alone on
 * its worker; < 0: not measured yet). A stream that needs nothing always may. */
int admission_fits(const struct admission *a, int streams, double load, double need, double rate);

/* Seconds until a song with left_s seconds of audio still to render is wholly rendered
 * when `songs` songs share stage 1 evenly; -1 while unknown. An upper bound of when a
 * prerolled stream plays, and of when a song ends and frees its room. */
double admission_render_estimate(const struct admission *a, double left_s, int songs);

#endif
