/* A listener's playback, as the server sees it: the client plays a streamed song at 1x
 * from the first audio it gets, so each later piece of audio is due when everything
 * before it has played. A piece that arrives later than that ended a stall (the client
 * ran dry) of the difference; playback resumes with it. Used for the stall metrics
 * (docs/operations.md) and mirrored by scripts/bench/e2e.py's listener. */
#ifndef MM3_STAGE0_PLAYBACK_H
#define MM3_STAGE0_PLAYBACK_H

struct playback {
    int started;    /* some audio arrived */
    double t_start; /* arrival of the first audio */
    double audio_s; /* seconds of audio arrived */
    double stall_s; /* seconds spent stalled */
    int stalls;
};

/* When the audio arrived so far runs out: t_start + audio_s + stall_s (0 before any). */
double playback_runs_dry(const struct playback *p);

/* `seconds` of audio arrive at `now` (seconds, any monotonic clock). Returns the slack it
 * arrived with: > 0 early, < 0 the stall it ended (counted). The first arrival has 0. */
double playback_arrive(struct playback *p, double now, double seconds);

#endif
