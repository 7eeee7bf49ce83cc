/* Earliest-deadline ordering of the windows of a stage-1 batch (stage1/window_order.h). */
#include "stage1/window_order.h"

double window_deadline(int playing, int first, double now, double t_clock, double audio_sent_s, double whole_by)
{
    if (!playing) return whole_by;
    if (first) return now;
    return (t_clock > 0 ? t_clock : now) + audio_sent_s;
}

double window_play_clock(double t_first_audio, double t_play)
{
    return t_first_audio > 0 && t_play > t_first_audio ? t_play : t_first_audio;
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
