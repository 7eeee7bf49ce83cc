#include "common/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mm3_metrics mm3_metrics;

/* Bucket upper bounds per histogram; the +Inf bucket is implicit. Chosen for
 * songs of seconds to six minutes: TTFA spans one window (sub-second) to a
 * saturated queue, RTF spans far faster than real time to a stalled pipeline. */
static const double ttfa_bounds[] = {0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300};
static const double rtf_bounds[] = {0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 4};
static const double duration_bounds[] = {1, 5, 10, 30, 60, 120, 240, 480, 900, 1800};
/* A stream's stalls: none (the goal), a hiccup, to a song that never played smoothly. */
static const double stall_bounds[] = {0, 0.1, 0.5, 1, 2, 5, 10, 30, 60};
/* How early a streamed window reached stage 0 before its listener needed it; below 0 it
 * came late (a stall). */
static const double slack_bounds[] = {-10, -2, -0.5, 0, 0.5, 1, 2, 4, 8, 16, 32};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const outcome_names[METRICS_OUTCOME_COUNT] = {
    "ok", "bad_request", "rejected", "cancelled", "failed",
};
static const char *const edge_names[METRICS_EDGE_COUNT] = {"stage0_to_stage1", "stage1_to_stage0"};

static const double *histogram_bounds(const struct metrics_histogram *h, int *n)
{
    if (h == &mm3_metrics.ttfa_seconds) {
        *n = N_OF(ttfa_bounds);
        return ttfa_bounds;
    }
    if (h == &mm3_metrics.rtf) {
        *n = N_OF(rtf_bounds);
        return rtf_bounds;
    }
    if (h == &mm3_metrics.stream_stall_seconds) {
        *n = N_OF(stall_bounds);
        return stall_bounds;
    }
    if (h == &mm3_metrics.window_slack_seconds) {
        *n = N_OF(slack_bounds);
        return slack_bounds;
    }
    *n = N_OF(duration_bounds);
    return duration_bounds;
}

_Static_assert(sizeof ttfa_bounds / sizeof(double) <= METRICS_MAX_BUCKETS, "buckets");
_Static_assert(sizeof rtf_bounds / sizeof(double) <= METRICS_MAX_BUCKETS, "buckets");
_Static_assert(sizeof duration_bounds / sizeof(double) <= METRICS_MAX_BUCKETS, "buckets");
_Static_assert(sizeof stall_bounds / sizeof(double) <= METRICS_MAX_BUCKETS, "buckets");
_Static_assert(sizeof slack_bounds / sizeof(double) <= METRICS_MAX_BUCKETS, "buckets");

void metrics_histogram_observe(struct metrics_histogram *h, double v)
{
    if (isnan(v)) return;
    int n;
    const double *b = histogram_bounds(h, &n);
    int i = 0;
    while (i < n && v > b[i])
        i++;
    atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    uint64_t old = atomic_load_explicit(&h->sum_bits, memory_order_relaxed), upd;
    do {
        double s;
        memcpy(&s, &old, sizeof s);
        s += v;
        memcpy(&upd, &s, sizeof upd);
    } while (
        !atomic_compare_exchange_weak_explicit(&h->sum_bits, &old, upd, memory_order_relaxed, memory_order_relaxed));
}

static uint64_t counter_get(const struct metrics_counter *c)
{
    return atomic_load_explicit(&c->v, memory_order_relaxed);
}

static int64_t gauge_get(const struct metrics_gauge *g)
{
    return atomic_load_explicit(&g->v, memory_order_relaxed);
}

static void render_header(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_counter(FILE *f, const char *name, const char *help, const struct metrics_counter *c)
{
    render_header(f, name, "counter", help);
    fprintf(f, "%s %llu\n", name, (unsigned long long)counter_get(c));
}

static void render_gauge(FILE *f, const char *name, const char *help, const struct metrics_gauge *g)
{
    render_header(f, name, "gauge", help);
    fprintf(f, "%s %lld\n", name, (long long)gauge_get(g));
}

/* One counter per edge; `scale` turns stored integers into the exposed unit. */
static void render_edge_counter(FILE *f, const char *name, const char *help, const struct metrics_counter *c,
                                double scale)
{
    render_header(f, name, "counter", help);
    for (int e = 0; e < METRICS_EDGE_COUNT; e++) {
        if (scale == 1.0)
            fprintf(f, "%s{edge=\"%s\"} %llu\n", name, edge_names[e], (unsigned long long)counter_get(&c[e]));
        else
            fprintf(f, "%s{edge=\"%s\"} %.6f\n", name, edge_names[e], (double)counter_get(&c[e]) * scale);
    }
}

static void render_histogram(FILE *f, const char *name, const char *help, const struct metrics_histogram *h)
{
    render_header(f, name, "histogram", help);
    int n;
    const double *b = histogram_bounds(h, &n);
    uint64_t cum = 0;
    for (int i = 0; i <= n; i++) {
        cum += atomic_load_explicit(&h->counts[i], memory_order_relaxed);
        if (i < n)
            fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, b[i], (unsigned long long)cum);
        else
            fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    uint64_t bits = atomic_load_explicit(&h->sum_bits, memory_order_relaxed);
    double sum;
    memcpy(&sum, &bits, sizeof sum);
    /* _count is the +Inf bucket so the two can never disagree in one scrape. */
    fprintf(f, "%s_sum %.9g\n%s_count %llu\n", name, sum, name, (unsigned long long)cum);
}

/* One series per stage-1 worker {worker="k"}. */
static void render_worker_gauge(FILE *f, const char *name, const char *help, const struct metrics_gauge *g, int n)
{
    render_header(f, name, "gauge", help);
    for (int k = 0; k < n; k++)
        fprintf(f, "%s{worker=\"%d\"} %lld\n", name, k, (long long)gauge_get(&g[k]));
}

static void render_workers(FILE *f, const struct mm3_metrics *m)
{
    int n = (int)gauge_get(&m->stage1_workers);
    if (n > METRICS_WORKERS_MAX) n = METRICS_WORKERS_MAX;
    render_gauge(f, "mm3_stage1_workers", "Stage-1 worker processes this stage 0 feeds.", &m->stage1_workers);
    render_worker_gauge(f, "mm3_stage1_worker_up", "1 while the stage-1 worker is attached.", m->worker_up, n);
    render_worker_gauge(f, "mm3_stage1_worker_songs", "Songs bound to the stage-1 worker.", m->worker_songs, n);
    render_worker_gauge(f, "mm3_stage1_worker_windows_queued",
                        "Windows the stage-1 worker still has to render for its songs (what binding balances).",
                        m->worker_windows_queued, n);
}

/* The same figures under the names operators' tools read: vLLM's scheduler gauges
 * (KEDA rules, the llm-d endpoint picker) and vLLM-Omni's audio families
 * (vllm_omni/metrics/definitions.py: audio_ttfp_s, audio_rtf, audio_frames). */
static void render_vllm_names(FILE *f, const struct mm3_metrics *m)
{
    int64_t waiting = gauge_get(&m->queue_depth), in_flight = gauge_get(&m->requests_in_flight);
    int64_t running = in_flight > waiting ? in_flight - waiting : 0;
    render_header(f, "vllm:num_requests_waiting", "gauge", "Songs waiting for stage-0 rows (mm3_queue_depth).");
    fprintf(f, "vllm:num_requests_waiting %lld\n", (long long)waiting);
    render_header(f, "vllm:num_requests_running", "gauge",
                  "Songs accepted and not waiting for rows: generating or rendering (mm3_requests_in_flight - "
                  "mm3_queue_depth).");
    fprintf(f, "vllm:num_requests_running %lld\n", (long long)running);
    int64_t rows = gauge_get(&m->kv_rows), used = gauge_get(&m->active_rows);
    render_header(f, "vllm:kv_cache_usage_perc", "gauge", "Stage-0 KV rows in use, 0 to 1 (mm3_active_rows / rows).");
    fprintf(f, "vllm:kv_cache_usage_perc %.6f\n", rows > 0 ? (double)used / (double)rows : 0.0);
    render_histogram(f, "vllm_omni:audio_ttfp_s", "Request arrival to first audio packet (mm3_time_to_first_audio_seconds).",
                     &m->ttfa_seconds);
    render_histogram(f, "vllm_omni:audio_rtf", "Generation time over audio duration per song (mm3_real_time_factor).",
                     &m->rtf);
    render_header(f, "vllm_omni:audio_frames_total", "counter",
                  "Audio sample frames sent to clients; audio seconds = frames / sample rate (mm3_audio_samples_total).");
    fprintf(f, "vllm_omni:audio_frames_total %llu\n", (unsigned long long)counter_get(&m->audio_samples));
}

int metrics_render(char **out, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return -ENOMEM;
    const struct mm3_metrics *m = &mm3_metrics;

    render_header(f, "mm3_requests_total", "counter", "Generation requests answered, by outcome.");
    for (int o = 0; o < METRICS_OUTCOME_COUNT; o++)
        fprintf(f, "mm3_requests_total{outcome=\"%s\"} %llu\n", outcome_names[o],
                (unsigned long long)counter_get(&m->requests[o]));
    render_gauge(f, "mm3_requests_in_flight", "Generation requests accepted and not yet answered.",
                 &m->requests_in_flight);
    render_gauge(f, "mm3_http_connections", "Open HTTP connections.", &m->http_connections);
    render_gauge(f, "mm3_queue_depth", "Songs waiting for decode rows.", &m->queue_depth);
    render_gauge(f, "mm3_active_rows", "Stage-0 decode rows in use (two per song with CFG).", &m->active_rows);
    render_gauge(f, "mm3_stage1_fp16_rescues",
                 "Windows and decodes stage 1 reran with scaled operands because fp16 ones overflowed, since it started.",
                 &m->stage1_fp16_rescues);
    render_counter(f, "mm3_frames_total",
                   "AR frames generated (25 per second of audio); "
                   "frames/s = rate().",
                   &m->frames);
    render_counter(f, "mm3_windows_total", "Stage-1 windows decoded; windows/s = rate().", &m->windows);
    render_counter(f, "mm3_audio_samples_total", "Audio sample frames (per channel) sent to clients.",
                   &m->audio_samples);
    render_edge_counter(f, "mm3_connector_bytes_total", "Bytes sent over the stage connector.", m->conn_bytes, 1.0);
    render_edge_counter(f, "mm3_connector_waits_total", "Connector sends that had to wait for room (the receiving stage is behind).", m->conn_waits,
                        1.0);
    render_edge_counter(f, "mm3_connector_wait_seconds_total", "Time connector senders spent waiting for room.",
                        m->conn_wait_us, 1e-6);
    render_histogram(f, "mm3_time_to_first_audio_seconds", "Request accepted to first audio ready to send.",
                     &m->ttfa_seconds);
    render_histogram(f, "mm3_real_time_factor",
                     "Wall time over audio duration per completed song (below 1 = faster than real time).", &m->rtf);
    render_histogram(f, "mm3_request_duration_seconds", "Generation request accepted to answer complete.",
                     &m->request_seconds);
    render_counter(f, "mm3_stream_stalls_total",
                   "Times a streamed song ran dry (its listener, playing at 1x from the first audio, had played "
                   "everything sent).",
                   &m->stream_stalls);
    render_header(f, "mm3_stream_stall_seconds_total", "counter", "Time streamed songs spent dry.");
    fprintf(f, "mm3_stream_stall_seconds_total %.6f\n", (double)counter_get(&m->stream_stall_us) * 1e-6);
    render_histogram(f, "mm3_stream_stall_seconds", "Seconds a finished streamed song spent dry, per song.",
                     &m->stream_stall_seconds);
    render_histogram(f, "mm3_window_slack_seconds",
                     "Per streamed window: when its listener would need it minus when it arrived (below 0: late).",
                     &m->window_slack_seconds);
    render_gauge(f, "mm3_streams_admitted", "Streams playing, counted against the real-time capacity.",
                 &m->streams_admitted);
    render_gauge(f, "mm3_streams_prerolling",
                 "Streams rendering ahead, their audio kept back until the server can keep them fed.",
                 &m->streams_prerolling);
    render_counter(f, "mm3_streams_prerolled_total", "Streams that prerolled before they played.",
                   &m->streams_prerolled);
    render_header(f, "mm3_realtime_capacity_streams", "gauge",
                  "Streams stage 1 keeps fed: 1 / (stage-1 seconds of work per second of audio), measured; -1 "
                  "before the first window.");
    int64_t cap = gauge_get(&m->realtime_capacity_milli);
    if (cap == INT64_MAX)
        fprintf(f, "mm3_realtime_capacity_streams +Inf\n");
    else
        fprintf(f, "mm3_realtime_capacity_streams %.3f\n", cap < 0 ? -1.0 : (double)cap / 1000.0);
    render_workers(f, m);
    render_vllm_names(f, m);

    if (fclose(f) != 0) {
        free(buf);
        return -ENOMEM;
    }
    *out = buf;
    *len = n;
    return 0;
}

void metrics_reset(void)
{
    memset(&mm3_metrics, 0, sizeof mm3_metrics);
}
