/* The job interface between the HTTP API (stage0/api/http_server.c) and the engine
 * (scheduler + talker + connector to stage 1), as an ops table so the API can
 * be tested with a fake engine.
 *
 * Threads: every callback may be called from any HTTP connection thread,
 * concurrently; the engine serialises internally. None may block for long:
 * submit only enqueues. */
#ifndef MM3_STAGE0_API_H
#define MM3_STAGE0_API_H

#include <stdint.h>

#include "stage0/api/job.h"

enum api_stage_state {
    API_STAGE_DOWN = 0, /* not running / not connected */
    API_STAGE_STARTING, /* loading weights, capturing graphs */
    API_STAGE_READY,
    API_STAGE_FAILED, /* dead; requests fail */
};

#define API_HEALTH_MAX_STAGES 4

struct api_health {
    int n_stages;
    struct {
        char name[32]; /* "stage0", "stage1" */
        enum api_stage_state state;
        char detail[128]; /* free text, e.g. "loading 12/36 layers" */
    } stages[API_HEALTH_MAX_STAGES];
    int32_t queue_depth; /* songs waiting for rows (mirrored to mm3_queue_depth) */
    int32_t active_rows; /* rows in use (mirrored to mm3_active_rows) */
};

struct api_engine {
    void *ctx;
    /* Take the job: 0 (the engine took its own reference with mm3_job_ref),
     * -EAGAIN (queue full: the client gets 503 + Retry-After), -EINVAL (bad
     * request, e.g. prompt over 5000 tokens: message and status set with
     * mm3_job_set_error, the client gets 400), other < 0: 500. */
    int (*submit)(void *ctx, struct mm3_job *job);
    /* The client went away: stop the job in both stages and free its rows.
     * Called at most once per job, only after a successful submit, and only if
     * the job had not ended. The engine still drops its reference when done. */
    void (*cancel)(void *ctx, struct mm3_job *job);
    /* Fill per-stage state for GET /health (and the queue gauges of /metrics). */
    void (*health)(void *ctx, struct api_health *out);
};

const char *api_stage_state_name(enum api_stage_state s);

#endif
