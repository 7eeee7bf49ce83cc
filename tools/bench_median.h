/* Medians of timing samples for the benchmark programs (sorts v in place). */
#ifndef MM3_TOOLS_BENCH_MEDIAN_H
#define MM3_TOOLS_BENCH_MEDIAN_H

#include <stdlib.h>

static inline int bench_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline float bench_median_f(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_float);
    return n % 2 ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
}

static inline double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
