/* Real-time capacity of the replica and the admission of streams (stage0/admission.h). */
#include "stage0/admission.h"

#include <math.h>
#include <stdlib.h>

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

int admission_allows(const struct admission *a, int streams)
{
    double c = admission_capacity(a);
    return streams == 0 || (c >= 0 && streams + 1 <= floor(c * ADMISSION_UTILIZATION));
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

double admission_start_estimate(const struct admission *a, double *left_s, int n, int k)
{
    double w = admission_work_per_audio(a);
    if (a->audio_s <= 0 || k < 1 || k > n) return -1;
    qsort(left_s, (size_t)n, sizeof *left_s, cmp_double);
    double r = left_s[k - 1] > 0 ? left_s[k - 1] : 0;
    return r * w * n;
}
