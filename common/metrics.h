/* Process-wide metrics registry rendered as Prometheus text format 0.0.4.
 *
 * A fixed set of lock-free counters, gauges and fixed-bucket histograms in one
 * global struct (`mm3_metrics`); any thread updates them with the inline
 * helpers below, and `metrics_render()` prints them for GET /metrics.
 *
 *     metrics_counter_add(&mm3_metrics.frames, 1);
 *     metrics_gauge_set(&mm3_metrics.queue_depth, n);
 *     metrics_histogram_observe(&mm3_metrics.ttfa_seconds, 0.8);
 *
 * Who updates what (see docs/api.md): the HTTP layer counts requests, TTFA,
 * RTF, durations and audio seconds; the engine sets queue depth and active rows
 * and adds connector bytes and waits; frames and windows are added by
 * mm3_job_progress_add() in stage0/api/job.c. Rates (frames/s, windows/s) are
 * PromQL rate() over the counters. */
#ifndef MM3_METRICS_H
#define MM3_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_MAX_BUCKETS 16

struct metrics_counter {
    _Atomic uint64_t v;
};
struct metrics_gauge {
    _Atomic int64_t v;
};
struct metrics_histogram {
    _Atomic uint64_t counts[METRICS_MAX_BUCKETS + 1]; /* per bucket, last = +Inf */
    _Atomic uint64_t count;
    _Atomic uint64_t sum_bits; /* double, updated by CAS */
};

/* Label values of mm3_requests_total{outcome=...}. */
enum metrics_outcome {
    METRICS_OUTCOME_OK = 0,      /* audio delivered completely */
    METRICS_OUTCOME_BAD_REQUEST, /* 4xx from validation, 404/405/413 */
    METRICS_OUTCOME_REJECTED,    /* over capacity: 429 / 503 */
    METRICS_OUTCOME_CANCELLED,   /* client went away */
    METRICS_OUTCOME_FAILED,      /* engine error, 5xx, stream cut */
    METRICS_OUTCOME_COUNT
};

/* Stage-1 workers with their own load series {worker="k"}. */
#define METRICS_WORKERS_MAX 16

/* Label values of the connector metrics {edge=...}. */
enum metrics_edge { METRICS_EDGE_S0_TO_S1 = 0, METRICS_EDGE_S1_TO_S0, METRICS_EDGE_COUNT };

struct mm3_metrics {
    struct metrics_counter requests[METRICS_OUTCOME_COUNT];
    struct metrics_gauge requests_in_flight; /* accepted generation requests not yet answered */
    struct metrics_gauge http_connections;   /* open TCP connections */
    struct metrics_gauge queue_depth;        /* engine: songs waiting for rows */
    struct metrics_gauge active_rows;        /* engine: decode rows in use (2 per song with CFG) */
    struct metrics_gauge stage1_fp16_rescues; /* stage 1's fp16 reruns since it started (its DONE says) */
    struct metrics_counter frames;           /* AR frames generated */
    struct metrics_counter windows;          /* stage-1 windows decoded */
    struct metrics_counter audio_samples;    /* sample frames (per channel) sent to clients */
    struct metrics_counter conn_bytes[METRICS_EDGE_COUNT];
    struct metrics_counter conn_waits[METRICS_EDGE_COUNT];   /* sends that had to block (backpressure) */
    struct metrics_counter conn_wait_us[METRICS_EDGE_COUNT]; /* time those sends blocked, microseconds */
    struct metrics_histogram ttfa_seconds;                   /* request accepted -> first audio ready */
    struct metrics_histogram rtf;                            /* wall time / audio duration, per finished song */
    struct metrics_histogram request_seconds;                /* request accepted -> answer complete */
    /* Streams (stage0/playback.h, stage0/admission.h): a listener playing at 1x from its
     * first audio, as estimated when stage 1's audio reaches stage 0. */
    struct metrics_counter stream_stalls;          /* times a stream ran dry */
    struct metrics_counter stream_stall_us;        /* time streams spent dry, microseconds */
    struct metrics_histogram stream_stall_seconds; /* per finished stream: seconds it spent dry */
    struct metrics_histogram window_slack_seconds; /* per streamed window: deadline - arrival (< 0: late) */
    struct metrics_gauge streams_admitted;         /* streams playing, counted against the real-time capacity */
    struct metrics_gauge streams_prerolling;       /* streams rendering ahead before they may play */
    struct metrics_counter streams_prerolled;      /* streams that prerolled before they played */
    struct metrics_gauge realtime_capacity_milli;  /* streams stage 1 keeps fed x 1000; -1 unknown,
                                                      INT64_MAX unbounded (no work measured) */
    struct metrics_gauge kv_rows;                  /* stage-0 decode rows there are (max_num_seqs) */
    /* Stage-1 workers (stage0/engine_internal.h): how many, and per worker whether it is
     * attached, the songs bound to it and the windows it still has to render. */
    struct metrics_gauge stage1_workers;
    struct metrics_gauge worker_up[METRICS_WORKERS_MAX];
    struct metrics_gauge worker_songs[METRICS_WORKERS_MAX];
    struct metrics_gauge worker_windows_queued[METRICS_WORKERS_MAX];
};

extern struct mm3_metrics mm3_metrics;

static inline void metrics_counter_add(struct metrics_counter *c, uint64_t n)
{
    atomic_fetch_add_explicit(&c->v, n, memory_order_relaxed);
}

static inline void metrics_gauge_set(struct metrics_gauge *g, int64_t v)
{
    atomic_store_explicit(&g->v, v, memory_order_relaxed);
}

static inline void metrics_gauge_add(struct metrics_gauge *g, int64_t d)
{
    atomic_fetch_add_explicit(&g->v, d, memory_order_relaxed);
}

/* Record one observation (NaN is ignored). */
void metrics_histogram_observe(struct metrics_histogram *h, double v);

/* Render every metric into a malloc'd NUL-terminated string (*len excludes the
 * NUL). Returns 0 or -ENOMEM. The caller frees *out. */
int metrics_render(char **out, size_t *len);

/* Zero everything (tests, and a fresh process start). Not atomic as a whole. */
void metrics_reset(void);

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
