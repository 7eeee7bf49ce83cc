/* Earliest-deadline ordering of the windows of a stage-1 batch (stage1/window_order.h). */
#include "stage1/window_order.h"

double window_deadline(int playing, int first, double now, double t_clock, double audio_sent_s, double whole_by)
{
    if (!playing) return whole_by;
    if (first) return now;
    return (t_clock > 0 ? t_clock : now) + audio_sent_s;
}

/* a goes before b */
static int before(const struct window_candidate *a, const struct window_candidate *b)
{
    if (a->deadline != b->deadline) return a->deadline < b->deadline;
    return a->first && !b->first;
}

void window_order_sort(enum mm3_window_order order, struct window_candidate *c, int n)
{
    if (order == MM3_WINDOW_ORDER_FIFO) return;
    /* insertion sort: stable (ties keep the round-robin order) and n is a few dozen */
    for (int i = 1; i < n; i++) {
        struct window_candidate x = c[i];
        int j = i;
        while (j > 0 && before(&x, &c[j - 1])) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
}

#define BATCH_TIME_DECAY 0.9

void batch_time_observe(struct batch_time *b, int windows, double seconds)
{
    if (windows < 1 || windows > PIPE_BATCH_WINDOWS_MAX || !(seconds >= 0) || !isfinite(seconds)) return;
    b->sum[windows] = b->sum[windows] * BATCH_TIME_DECAY + seconds;
    b->weight[windows] = b->weight[windows] * BATCH_TIME_DECAY + 1;
}

double batch_time_predict(const struct batch_time *b, int windows)
{
    if (windows < 1) return 0;
    if (windows > PIPE_BATCH_WINDOWS_MAX) windows = PIPE_BATCH_WINDOWS_MAX;
    for (int k = windows; k >= 1; k--)
        if (b->weight[k] > 0) return b->sum[k] / b->weight[k] * windows / k;
    for (int k = windows + 1; k <= PIPE_BATCH_WINDOWS_MAX; k++)
        if (b->weight[k] > 0) return b->sum[k] / b->weight[k];
    return -1;
}

int window_batch_take(enum mm3_window_order order, const struct window_candidate *c, int n, int max, double now,
                      const struct batch_time *bt, int *take)
{
    int k = 0;
    if (order == MM3_WINDOW_ORDER_FIFO) {
        for (int i = 0; i < n && k < max; i++)
            take[k++] = i;
        return k;
    }
    double slack = INFINITY;
    for (int i = 0; i < n && k < max; i++) {
        if (!c[i].listener && c[i].deadline > now) continue;
        take[k++] = i;
        if (c[i].deadline > now && c[i].deadline - now < slack) slack = c[i].deadline - now;
    }
    int due = k;
    for (int i = 0; i < n && k < max; i++) {
        if (c[i].listener || c[i].deadline <= now) continue;
        double t = batch_time_predict(bt, k + 1);
        if (slack < INFINITY && t > slack) break;
        take[k++] = i;
    }
    /* the batch runs in the sorted order */
    if (k > due) {
        int merged[k], a = 0, b = due, m = 0;
        while (a < due || b < k)
            merged[m++] = b >= k || (a < due && take[a] < take[b]) ? take[a++] : take[b++];
        for (int i = 0; i < k; i++)
            take[i] = merged[i];
    }
    return k;
}
