/* Stalls of a listener playing at 1x from its first audio (stage0/playback.h). */
#include "stage0/playback.h"

double playback_runs_dry(const struct playback *p)
{
    return p->started ? p->t_start + p->audio_s + p->stall_s : 0;
}

double playback_arrive(struct playback *p, double now, double seconds)
{
    double slack = 0;
    if (!p->started) {
        p->started = 1;
        p->t_start = now;
    } else {
        slack = playback_runs_dry(p) - now;
        if (slack < 0) {
            p->stall_s += -slack;
            p->stalls++;
        }
    }
    p->audio_s += seconds;
    return slack;
}
