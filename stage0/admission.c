/* Real-time capacity of the replica and when streams play (stage0/admission.h). */
#include "stage0/admission.h"

#include <math.h>

void admission_observe(struct admission *a, double work_s, double audio_s)
{
    if (!(work_s >= 0 && audio_s > 0 && isfinite(work_s) && isfinite(audio_s))) return;
    a->work_s = a->work_s * ADMISSION_DECAY + work_s;
    a->audio_s = a->audio_s * ADMISSION_DECAY + audio_s;
}

double admission_work_per_audio(const struct admission *a)
{
    return a->audio_s > 0 ? a->work_s / a->audio_s : 0.0;
}

double admission_capacity(const struct admission *a)
{
    double w = admission_work_per_audio(a);
    if (a->audio_s <= 0) return -1;
    return w > 0 ? 1.0 / w : INFINITY;
}

double admission_margin(const struct admission *a, double window_s, int batch_windows)
{
    return window_s * (1.0 + 2.0 * batch_windows * admission_work_per_audio(a));
}

double admission_stream_need(double dry_s, double left_s, double margin_s)
{
    if (!(left_s > 0)) return 0;
    double ahead = dry_s - margin_s;
    return ahead > 0 ? left_s / (ahead + left_s) : 1;
}

int admission_fits(const struct admission *a, int streams, double load, double need, double rate)
{
    if (need <= 0 || (isinf(rate) && rate > 0 && streams == 0)) return 1;
    double c = admission_capacity(a);
    return c >= 0 && rate >= 0 && load + need <= c * a->share + 1e-9 && need <= rate * a->share + 1e-9;
}

double admission_render_estimate(const struct admission *a, double left_s, int songs)
{
    if (a->audio_s <= 0 || songs < 1) return -1;
    return (left_s > 0 ? left_s : 0) * admission_work_per_audio(a) * songs;
}
