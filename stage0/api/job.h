/* One generation request as shared by the HTTP thread and the engine threads.
 *
 * Life cycle: the HTTP layer parses a request into `struct mm3_job_params`,
 * creates the job (one reference, the HTTP layer's) and hands it to
 * `engine->submit`. On success the engine takes its own reference
 * (mm3_job_ref) and drops it (mm3_job_unref) when it will touch the job no
 * more; whoever drops the last reference frees it, so a disconnecting client
 * and a finishing engine never free it twice.
 *
 * Audio flows engine -> HTTP through a bounded queue of chunks: the engine
 * pushes float32 interleaved PCM (`channels` x `sample_rate` as set at creation,
 * stereo 44.1 kHz from stage 1) with mm3_job_push_pcm(), then ends the stream
 * with exactly one mm3_job_finish() or mm3_job_fail(). The HTTP side pops with a
 * timeout so a waiting response never spins.
 *
 * Cancellation: when the client goes away the HTTP layer calls
 * mm3_job_cancel(); it returns true exactly once, and only then does the HTTP
 * layer call engine->cancel. After that, pushes return -ECANCELED so the
 * engine stops producing; it must still drop its reference. */
#ifndef MM3_STAGE0_JOB_H
#define MM3_STAGE0_JOB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/deploy.h"

enum mm3_job_state {
    MM3_JOB_QUEUED = 0, /* accepted, waiting for rows */
    MM3_JOB_RUNNING,    /* rows assigned, frames being generated */
    MM3_JOB_DONE,       /* end of stream pushed */
    MM3_JOB_FAILED,     /* error pushed; message and status in the job */
    MM3_JOB_CANCELLED,  /* client went away */
};

enum mm3_audio_format { MM3_AUDIO_WAV = 0, MM3_AUDIO_PCM, MM3_AUDIO_FLAC, MM3_AUDIO_MP3, MM3_AUDIO_OPUS };

/* The id clients see (X-Request-Id, GET /v1/audio/speech/{id}): 128 random bits in
 * lowercase hex, so that no client can reach another's song by counting. */
#define MM3_JOB_PUBLIC_ID_LEN 32

/* Fields a request set itself (struct mm3_job_params.given): a continuation inherits the
 * others from the song it continues, and refuses these when they differ from it. */
enum mm3_given {
    MM3_GIVEN_LYRICS = 1u << 0,
    MM3_GIVEN_CAPTION = 1u << 1,
    MM3_GIVEN_LENGTH = 1u << 2, /* max_new_tokens or duration_s */
    MM3_GIVEN_SEED = 1u << 3,
    MM3_GIVEN_SAMPLE_RATE = 1u << 4,
    MM3_GIVEN_STEPS = 1u << 5,
    MM3_GIVEN_GUIDANCE = 1u << 6,
    MM3_GIVEN_FLOW_SHIFT = 1u << 7,
    MM3_GIVEN_CFG_SCALE = 1u << 8,
    MM3_GIVEN_LORA = 1u << 9, /* model naming an adapter, or lora */
};

/* A per-request adapter's name (deploy lora_modules) with its NUL. */
#define MM3_JOB_LORA_MAX MM3_DEPLOY_LORA_NAME_MAX

/* Validated request parameters (see docs/api.md for the HTTP field names). */
struct mm3_job_params {
    char *lyrics;       /* UTF-8, owned by the job, non-empty after trimming */
    char *caption;      /* UTF-8, owned by the job, non-empty after trimming */
    int32_t max_frames; /* AR frames cap, 1..limit (25 per second) */
    int32_t min_frames; /* the stop code cannot be drawn before this many frames, 0..max_frames */
    uint64_t seed;
    int32_t sample_rate; /* output rate: 44100 or 32000 */
    int32_t num_inference_steps;
    float guidance_scale; /* DiT CFG */
    float flow_shift;     /* DiT scheduler shift, (0, 20]; 0 = stage 1's default */
    float cfg_scale;      /* AR CFG */
    enum mm3_audio_format format;
    bool stream;
    bool sse;         /* streamed as OpenAI's server-sent events (stream_format "sse"); implies stream */
    bool allow_stall; /* streamed: start without waiting for real-time capacity; its audio may stall
                         (stage 1 gives its windows no deadline: stage0/admission.h) */
    bool ignore_eos; /* never draw the stop code: the song runs to max_frames (vLLM's ignore_eos; benchmarks) */
    char *replay_file; /* testing aid (MM3_ALLOW_REPLAY=1): golden case file of forced draws and noise inside
                          api.replay_dir (common/replay_file.h), as the client named it, or NULL */
    /* Continue a finished song of this server (its public id; "" = a new song): max_frames and
     * min_frames count the new part until the engine makes them the whole song's. */
    char continue_from[MM3_JOB_PUBLIC_ID_LEN + 1];
    /* Or continue the song of an uploaded journal file (continue_journal, decoded from base64;
     * untrusted: the engine validates it), owned like the strings; NULL = none. */
    uint8_t *journal;
    size_t journal_len;
    bool return_whole; /* a continuation answers the whole song, not only its new part */
    /* The talker adapter the song is made with (a name of lora_modules; "" = the base
     * model): both rows of its CFG pair add its products (stage0/model/talker_lora.h). */
    char lora[MM3_JOB_LORA_MAX];
    uint32_t given;    /* enum mm3_given: the fields the request set */
};

enum mm3_job_chunk_kind { MM3_CHUNK_PCM = 0, MM3_CHUNK_END, MM3_CHUNK_ERROR };

struct mm3_job_chunk {
    enum mm3_job_chunk_kind kind;
    float *pcm;      /* PCM: n_frames * channels floats, owned by the chunk */
    size_t n_frames; /* sample frames (one sample per channel each) */
};

struct mm3_job {
    uint64_t id; /* unique in this process, > 0: the engine's and the logs' handle, never shown to clients */
    char public_id[MM3_JOB_PUBLIC_ID_LEN + 1];
    struct mm3_job_params params;
    int32_t channels; /* of the pushed PCM */
    int32_t pcm_rate; /* of the pushed PCM */

    _Atomic int refs;
    _Atomic int state; /* enum mm3_job_state */
    _Atomic bool cancel_requested;
    _Atomic int64_t frames_done;  /* AR frames generated */
    _Atomic int64_t windows_done; /* stage-1 windows decoded */
    _Atomic int64_t frames_total; /* planned frames (<= max_frames; the engine may lower it at EOS) */
    _Atomic int32_t prompt_tokens; /* prompt length in tokens (per CFG row), set when the engine accepts it */
    _Atomic int64_t pcm_frames_pushed;
    _Atomic int64_t t_first_audio_ns; /* CLOCK_MONOTONIC of the first PCM push, 0 before */
    _Atomic int32_t queue_position;   /* 1-based place among the songs waiting to start, 0 = not waiting */
    _Atomic int64_t start_estimate_ns; /* CLOCK_MONOTONIC when it may start (queued) or play (prerolling), 0 unknown */
    _Atomic int preroll;               /* a stream rendering ahead, its audio kept until the server can keep it fed */
    int64_t t_created_ns;
    /* Sample frames (at pcm_rate) at the start of the song the client does not get: a
     * continuation answering only its new part. Set by the engine before the first PCM. */
    int64_t pcm_skip;

    /* Error reported by submit (-EINVAL) or mm3_job_fail(); guarded by mu. */
    int http_status;
    char error[512];
    char error_param[32]; /* the request field the error is about ("" = none), for the JSON body */

    void *engine_data; /* free for the engine's use */

    pthread_mutex_t mu;
    pthread_cond_t cond;        /* signalled on push, pop, cancel */
    struct mm3_job_chunk *ring; /* capacity + 1 slots: the end marker always fits */
    size_t ring_cap, head, count;
    size_t pcm_capacity; /* max PCM chunks queued before push blocks */
    bool ended;          /* END or ERROR queued */
};

/* Create a job holding one reference. Copies the param strings. `queue_chunks`
 * bounds the queued PCM chunks (>= 1). Returns 0, -EINVAL or -ENOMEM. */
int mm3_job_create(struct mm3_job **out, const struct mm3_job_params *params, int32_t channels, int32_t pcm_rate,
                   size_t queue_chunks);
void mm3_job_ref(struct mm3_job *job);
/* Drop a reference; the last one frees the job, its params and any queued chunks. */
void mm3_job_unref(struct mm3_job *job);

/* Free the strings of params made by the request parser (not needed for params
 * inside a job: the job frees its own copy). */
void mm3_job_params_free(struct mm3_job_params *p);

enum mm3_job_state mm3_job_state(const struct mm3_job *job);
bool mm3_job_is_terminal(const struct mm3_job *job);

/* ---- engine side ---- */

/* Mark rows assigned (QUEUED -> RUNNING); no-op in any other state. */
void mm3_job_set_running(struct mm3_job *job);
/* Add progress; also feeds the global mm3_frames_total / mm3_windows_total. */
void mm3_job_progress_add(struct mm3_job *job, int64_t frames, int64_t windows);
void mm3_job_set_frames_total(struct mm3_job *job, int64_t frames);

/* Queue a copy of n_frames sample frames of interleaved PCM. Blocks up to
 * timeout_ms (0 = not at all, < 0 = forever) while the queue is full.
 * Returns 0, -ETIMEDOUT (queue full: the consumer is slow), -ECANCELED (client
 * gone), -EPIPE (stream already ended) or -ENOMEM. */
int mm3_job_push_pcm(struct mm3_job *job, const float *pcm, size_t n_frames, int timeout_ms);
/* End the stream normally (state DONE). Never blocks. Returns 0 or -EPIPE if already ended. */
int mm3_job_finish(struct mm3_job *job);
/* End the stream with an error (state FAILED), message and HTTP status (e.g.
 * 500; 400 for a bad prompt found late). Never blocks. Returns 0 or -EPIPE. */
int mm3_job_fail(struct mm3_job *job, int http_status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Why a job failed, as the core loop (scheduler, engine) says it; the API layer maps
 * each kind to its HTTP status (mm3_fail_kind_status). */
enum mm3_fail_kind {
    MM3_FAIL_BAD_REQUEST = 0, /* 400: the request cannot be served as asked (found late) */
    MM3_FAIL_INTERNAL,        /* 500: stage 0 itself failed (memory, model), or its client stalled */
    MM3_FAIL_STAGE1,          /* 502: stage 1 failed, gave up, timed out or was lost */
    MM3_FAIL_UNAVAILABLE,     /* 503: no stage 1, a full queue, or shutting down: retry elsewhere */
};

/* The HTTP status of a kind (500 for an unknown one). */
int mm3_fail_kind_status(enum mm3_fail_kind kind);
/* mm3_job_fail with the status of kind. */
int mm3_job_fail_kind(struct mm3_job *job, enum mm3_fail_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* mm3_job_set_error with the status of kind. */
void mm3_job_set_error_kind(struct mm3_job *job, enum mm3_fail_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Record why submit refused the job (no stream marker); used with -EINVAL. */
void mm3_job_set_error(struct mm3_job *job, int http_status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- HTTP side ---- */

/* Take the next chunk, waiting up to timeout_ms (< 0 = forever). Returns 0 and
 * fills *out (release it with mm3_job_chunk_release), or -ETIMEDOUT. After an
 * END or ERROR chunk, further pops return that marker again. */
int mm3_job_pop(struct mm3_job *job, struct mm3_job_chunk *out, int timeout_ms);
void mm3_job_chunk_release(struct mm3_job_chunk *c);

/* Request cancellation. Returns true exactly once, and only when the job had
 * not ended: the caller then owes engine->cancel. Wakes a blocked pusher. */
bool mm3_job_cancel(struct mm3_job *job);

/* mm3_job_set_error naming the request field it is about (the error body's "param"). */
void mm3_job_set_error_param(struct mm3_job *job, int http_status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Copy of the error message and status (status 0 if none). */
int mm3_job_error(struct mm3_job *job, char *msg, size_t cap);
/* Copy of the field named by mm3_job_set_error_param ("" if none). */
void mm3_job_error_param(struct mm3_job *job, char *param, size_t cap);

int64_t mm3_job_now_ns(void);

#endif
