/* HTTP front of stage 0 on libmicrohttpd in thread-per-connection mode: each
 * connection has its own thread, so a handler may block (with a timeout) on
 * the job's chunk queue instead of juggling suspend/resume. Every wait wakes at
 * least every `poll_ms` to check whether the client is gone or the server stops. */
#include "stage0/api/http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/deploy.h"
#include "common/error.h"
#include "common/log.h"
#include "common/metrics.h"
#include "stage0/api/api_conns.h"
#include "stage0/api/api_jobs.h"
#include "stage0/api/audio_encode.h"
#include "stage0/api/sse.h"

#define SPEECH_PATH "/v1/audio/speech"
#define STREAM_BLOCK_BYTES (64 * 1024)
/* After stop is asked, how long the answers being ended (503s, cut streams)
 * may take to reach their clients before the sockets are closed. */
#define STOP_FLUSH_S 2.0

struct http_server {
    struct http_server_config cfg;
    struct api_engine *engine;
    struct MHD_Daemon *mhd;
    uint16_t port;
    _Atomic bool draining; /* new requests get 503 (admin paths aside) */
    _Atomic bool stopping;
    _Atomic int in_flight;   /* generation requests held (for max_requests) */
    _Atomic int gen_open;    /* generation requests admitted and not yet completed */
    _Atomic size_t buffered; /* bytes reserved by whole-file answers (max_buffered_bytes) */
    struct api_jobs jobs;    /* answers in progress, for GET /v1/audio/speech/{id} */
    struct api_conns conns;  /* open connections: per-client limit, read deadline, slots */
    int64_t created;         /* Unix time the server started: the model object's `created` */
};

enum route {
    ROUTE_NONE = 0,
    ROUTE_SPEECH,
    ROUTE_PROGRESS,
    ROUTE_HEALTH,
    ROUTE_LIVE,
    ROUTE_METRICS,
    ROUTE_MODELS,
    ROUTE_MODEL, /* GET /v1/models/{id} */
};

#define MODELS_PATH "/v1/models"

/* Per-request state (MHD's con_cls), freed when MHD reports the request done. */
struct api_req {
    enum route route;
    struct api_conn *conn; /* NULL when it could not be tracked */
    bool general;          /* holds a general slot (api_conns_take_general) */
    bool gen;              /* counted in gen_open */
    char job_id[MM3_JOB_PUBLIC_ID_LEN + 1]; /* ROUTE_PROGRESS */
    char *body;
    size_t len, cap;
    bool too_big;
    int64_t t_start_ns;
};

/* A streamed answer: owned by the MHD response, freed in its free callback. */
struct api_stream {
    struct http_server *srv;
    struct mm3_job *job;
    struct audio_encoder *enc;
    struct audio_buf pending;
    size_t pending_off;
    struct audio_buf raw; /* sse: encoded audio before it is wrapped into events */
    int fd;
    int64_t t_start_ns;
    bool ended;    /* encoder finished; send what is pending, then end */
    bool recorded; /* outcome counted and in_flight released */
};

const char *api_stage_state_name(enum api_stage_state s)
{
    switch (s) {
    case API_STAGE_DOWN:
        return "down";
    case API_STAGE_STARTING:
        return "starting";
    case API_STAGE_READY:
        return "ready";
    case API_STAGE_FAILED:
        return "failed";
    }
    return "unknown";
}

void http_server_config_default(struct http_server_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->host = "127.0.0.1";
    cfg->port = 8000;
    cfg->max_body_bytes = 1 << 20;
    cfg->max_connections = 64;
    cfg->admin_connections = 8;
    cfg->max_connections_per_client = 32;
    cfg->max_requests = 0;
    cfg->request_timeout_s = 1800;
    cfg->retry_after_s = 5;
    cfg->connection_timeout_s = 60;
    cfg->request_read_timeout_s = 30;
    cfg->drain_timeout_s = 10;
    cfg->api_key = NULL;
    cfg->poll_ms = 100;
    cfg->job_queue_chunks = 16;
    cfg->max_buffered_bytes = (size_t)1 << 30;
    cfg->pcm_channels = 2;
    cfg->pcm_rate = 44100;
    cfg->model_name = MM3_SERVED_MODEL_NAME;
    api_limits_default(&cfg->limits);
}

void http_server_config_from_deploy(struct http_server_config *cfg, const struct mm3_deploy *d)
{
    const struct mm3_api_config *api = &d->api;
    const struct mm3_stage_config *s0 = mm3_deploy_stage(d, 0), *s1 = mm3_deploy_stage(d, 1);
    cfg->host = api->host;
    cfg->port = (uint16_t)api->port;
    cfg->max_body_bytes = (size_t)api->max_body_bytes;
    cfg->max_connections = (unsigned)api->max_connections;
    cfg->request_timeout_s = api->request_timeout_s;
    cfg->admin_connections = (unsigned)api->admin_connections;
    cfg->max_connections_per_client = (unsigned)api->max_connections_per_client;
    cfg->connection_timeout_s = (unsigned)api->idle_timeout_s;
    cfg->request_read_timeout_s = api->request_read_timeout_s;
    cfg->drain_timeout_s = api->drain_timeout_s;
    cfg->api_key = api->api_key[0] ? api->api_key : NULL;
    cfg->limits.default_sample_rate = api->default_sample_rate;
    /* A request that leaves a knob out gets the operator's default, not the recipe's. */
    cfg->limits.default_seed = s0->seed;
    cfg->limits.default_cfg_scale = (float)s0->cfg_scale;
    cfg->limits.default_steps = s1->num_inference_steps;
    cfg->limits.default_guidance_scale = (float)s1->guidance_scale;
    cfg->limits.replay_dir = api->replay_dir;
    cfg->max_buffered_bytes = (size_t)api->max_buffered_bytes;
    cfg->limits.default_flow_shift = (float)s1->flow_shift;
    cfg->limits.n_lora = s0->n_lora_modules;
    for (int i = 0; i < s0->n_lora_modules; i++)
        snprintf(cfg->limits.lora_names[i], sizeof cfg->limits.lora_names[i], "%s", s0->lora_modules[i].name);
}

/* ---- small response helpers ---- */

static double seconds_since(int64_t t0_ns)
{
    return (double)(mm3_job_now_ns() - t0_ns) * 1e-9;
}

/* Sends `obj` (taken) as the answer; hname/hval: one more header, or NULL. */
static enum MHD_Result queue_json_with(struct MHD_Connection *c, unsigned status, json_t *obj, int retry_after_s,
                                       const char *hname, const char *hval)
{
    char *text = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!text) return MHD_NO;
    size_t n = strlen(text);
    text[n] = '\n'; /* replaces the NUL: MHD takes the length, not a C string */
    struct MHD_Response *r = MHD_create_response_from_buffer(n + 1, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (retry_after_s > 0) {
        char ra[16];
        snprintf(ra, sizeof ra, "%d", retry_after_s);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, ra);
    }
    if (hname) MHD_add_response_header(r, hname, hval);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result queue_json(struct MHD_Connection *c, unsigned status, json_t *obj, int retry_after_s)
{
    return queue_json_with(c, status, obj, retry_after_s, NULL, NULL);
}

static json_t *error_body(unsigned status, const char *param, const char *msg)
{
    const char *type = status == 401                    ? "authentication_error"
                       : status == 429 || status == 503 ? "overloaded_error"
                       : status >= 500                  ? "server_error"
                                                        : "invalid_request_error";
    json_t *err = json_pack("{s:s, s:s, s:o, s:i}", "message", msg, "type", type, "param",
                            param && param[0] ? json_string(param) : json_null(), "code", (int)status);
    return err ? json_pack("{s:o}", "error", err) : NULL;
}

/* OpenAI-style error body: {"error":{"message","type","param","code"}}. */
static enum MHD_Result queue_error(struct MHD_Connection *c, unsigned status, const char *param, const char *msg,
                                   int retry_after_s)
{
    json_t *body = error_body(status, param, msg);
    return body ? queue_json(c, status, body, retry_after_s) : MHD_NO;
}

/* An error after which the connection must not be reused: the request's framing
 * is in doubt, so what follows it on the socket is not to be read as a request. */
static enum MHD_Result queue_error_close(struct MHD_Connection *c, unsigned status, const char *msg, int retry_after_s)
{
    json_t *body = error_body(status, NULL, msg);
    return body ? queue_json_with(c, status, body, retry_after_s, MHD_HTTP_HEADER_CONNECTION, "close") : MHD_NO;
}

static void record_outcome(struct http_server *s, enum metrics_outcome o, int64_t t_start_ns, bool held)
{
    metrics_counter_add(&mm3_metrics.requests[o], 1);
    metrics_histogram_observe(&mm3_metrics.request_seconds, seconds_since(t_start_ns));
    if (held) {
        atomic_fetch_sub(&s->in_flight, 1);
        metrics_gauge_add(&mm3_metrics.requests_in_flight, -1);
    }
}

static enum MHD_Result reject(struct http_server *s, struct MHD_Connection *c, struct api_req *rq, unsigned status,
                              const char *param, const char *msg)
{
    enum metrics_outcome o = status == 429 || status == 503 ? METRICS_OUTCOME_REJECTED
                             : status >= 500                ? METRICS_OUTCOME_FAILED
                                                            : METRICS_OUTCOME_BAD_REQUEST;
    record_outcome(s, o, rq->t_start_ns, false);
    char esc[512];
    LOG_INFO("%s %u: %s", SPEECH_PATH, status, mm3_log_escape(esc, sizeof esc, msg));
    int ra = status == 429 || status == 503 ? s->cfg.retry_after_s : 0;
    return queue_error(c, status, param, msg, ra);
}

static bool request_expired(const struct http_server *s, int64_t t_start_ns)
{
    return s->cfg.request_timeout_s > 0 && seconds_since(t_start_ns) > s->cfg.request_timeout_s;
}

/* True when the peer has closed or reset the connection. MHD is not reading the
 * socket while this thread is inside our handler, so a peek is safe. */
static bool client_gone(int fd)
{
    if (fd < 0) return false;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    return false;
}

static int connection_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The server is stopping: a whole file still waited for gets a clean 503. */
static enum MHD_Result answer_shutting_down(struct http_server *s, struct MHD_Connection *c, struct api_req *rq)
{
    record_outcome(s, METRICS_OUTCOME_REJECTED, rq->t_start_ns, true);
    return queue_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, "server shutting down", s->cfg.retry_after_s);
}

/* Cancel once: only the first caller for a job that has not ended tells the engine. */
static void job_cancel(struct http_server *s, struct mm3_job *job)
{
    if (mm3_job_cancel(job)) {
        LOG_INFO("job %llu: client gone, cancelling", (unsigned long long)job->id);
        s->engine->cancel(s->engine->ctx, job);
    }
}

static void add_audio_headers(struct MHD_Response *r, const struct mm3_job *job)
{
    char v[32];
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            job->params.sse ? SSE_CONTENT_TYPE : audio_format_content_type(job->params.format));
    MHD_add_response_header(r, "X-Request-Id", job->public_id);
    snprintf(v, sizeof v, "%d", job->params.sample_rate);
    MHD_add_response_header(r, "X-Sample-Rate", v);
    snprintf(v, sizeof v, "%d", job->channels);
    MHD_add_response_header(r, "X-Channels", v);
    MHD_add_response_header(r, "X-Sample-Format", "s16le");
    snprintf(v, sizeof v, "%d", job->params.max_frames);
    MHD_add_response_header(r, "X-Max-Frames", v);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
}

static void observe_first_audio(int64_t t_start_ns)
{
    metrics_histogram_observe(&mm3_metrics.ttfa_seconds, seconds_since(t_start_ns));
}

static void observe_done(const struct mm3_job *job, int64_t t_start_ns)
{
    int64_t frames = atomic_load(&((struct mm3_job *)job)->pcm_frames_pushed);
    if (frames > 0)
        metrics_histogram_observe(&mm3_metrics.rtf, seconds_since(t_start_ns) / ((double)frames / job->pcm_rate));
}

/* ---- streamed answer ---- */

static void stream_record(struct api_stream *st, enum metrics_outcome o)
{
    if (st->recorded) return;
    st->recorded = true;
    record_outcome(st->srv, o, st->t_start_ns, true);
    LOG_INFO("job %llu: stream %s after %.2f s, %lld sample frames", (unsigned long long)st->job->id,
             o == METRICS_OUTCOME_OK          ? "done"
             : o == METRICS_OUTCOME_CANCELLED ? "cancelled"
                                              : "failed",
             seconds_since(st->t_start_ns), (long long)atomic_load(&st->job->pcm_frames_pushed));
}

/* Where the encoder writes: the bytes to send, or for SSE the audio to wrap first. */
static struct audio_buf *stream_sink(struct api_stream *st)
{
    return st->job->params.sse ? &st->raw : &st->pending;
}

/* SSE: wrap what the encoder made into one speech.audio.delta event. */
static int stream_wrap(struct api_stream *st)
{
    if (!st->job->params.sse) return 0;
    int rc = sse_audio_delta(&st->pending, st->raw.data, st->raw.len);
    st->raw.len = 0;
    return rc;
}

/* Encode one popped chunk into st->pending. Returns 1 more data, 0 end, < 0 error. */
static int stream_take(struct api_stream *st, struct mm3_job_chunk *ch)
{
    int rc;
    switch (ch->kind) {
    case MM3_CHUNK_PCM:
        metrics_counter_add(&mm3_metrics.audio_samples, ch->n_frames);
        rc = audio_encoder_write(st->enc, ch->pcm, ch->n_frames, stream_sink(st));
        mm3_job_chunk_release(ch);
        if (rc == 0) rc = stream_wrap(st);
        return rc < 0 ? rc : 1;
    case MM3_CHUNK_END:
        st->ended = true;
        rc = audio_encoder_finish(st->enc, stream_sink(st));
        if (rc == 0) rc = stream_wrap(st);
        if (rc == 0 && st->job->params.sse)
            rc = sse_audio_done(&st->pending, atomic_load(&st->job->prompt_tokens),
                                atomic_load(&st->job->frames_done));
        if (rc == 0) {
            observe_done(st->job, st->t_start_ns);
            stream_record(st, METRICS_OUTCOME_OK);
        }
        return rc;
    case MM3_CHUNK_ERROR: {
        char msg[512];
        int status = mm3_job_error(st->job, msg, sizeof msg);
        rc = mm3_errorf(-EIO, "job %llu failed mid-stream (%d): %s", (unsigned long long)st->job->id, status, msg);
        if (!st->job->params.sse) return rc;
        /* An event stream can say it: the error event ends it instead of done. */
        char esc[600];
        LOG_ERROR("%s", mm3_log_escape(esc, sizeof esc, mm3_last_error()));
        st->ended = true;
        stream_record(st, METRICS_OUTCOME_FAILED);
        return sse_audio_error(&st->pending, status >= 400 && status <= 599 ? status : 500, msg);
    }
    }
    return -EINVAL;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct api_stream *st = cls;
    while (st->pending_off == st->pending.len) {
        st->pending.len = st->pending_off = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (request_expired(st->srv, st->t_start_ns)) {
            LOG_WARN("job %llu: request_timeout_s (%g) exceeded mid-stream, cancelling",
                     (unsigned long long)st->job->id, st->srv->cfg.request_timeout_s);
            job_cancel(st->srv, st->job);
            stream_record(st, METRICS_OUTCOME_FAILED);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        struct mm3_job_chunk ch;
        int rc = atomic_load(&st->srv->stopping) ? -ETIMEDOUT : mm3_job_pop(st->job, &ch, st->srv->cfg.poll_ms);
        if (rc == -ETIMEDOUT) {
            if (atomic_load(&st->srv->stopping) || client_gone(st->fd)) {
                job_cancel(st->srv, st->job);
                stream_record(st, METRICS_OUTCOME_CANCELLED);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            continue;
        }
        rc = stream_take(st, &ch);
        if (rc < 0) {
            /* Headers are gone: the only way left to say "failed" is to cut the
             * chunked stream without its terminating chunk (docs/api.md). */
            char esc[600];
            LOG_ERROR("%s", mm3_log_escape(esc, sizeof esc, mm3_last_error()));
            stream_record(st, METRICS_OUTCOME_FAILED);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = st->pending.len - st->pending_off;
    if (n > max) n = max;
    memcpy(buf, st->pending.data + st->pending_off, n);
    st->pending_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct api_stream *st = cls;
    /* MHD drops the response when the connection dies too: a song still being
     * made for nobody must stop in both stages. */
    if (!mm3_job_is_terminal(st->job)) job_cancel(st->srv, st->job);
    stream_record(st, mm3_job_state(st->job) == MM3_JOB_DONE && st->ended ? METRICS_OUTCOME_OK
                      : mm3_job_state(st->job) == MM3_JOB_FAILED          ? METRICS_OUTCOME_FAILED
                                                                          : METRICS_OUTCOME_CANCELLED);
    api_jobs_remove(&st->srv->jobs, st->job);
    audio_encoder_free(st->enc);
    audio_buf_free(&st->pending);
    audio_buf_free(&st->raw);
    mm3_job_unref(st->job);
    free(st);
}

/* ---- POST /v1/audio/speech ---- */

/* Wait for the next chunk while watching the client, the server and the
 * request deadline. Returns 0 with a chunk, -ECANCELED when the client is gone,
 * -ESHUTDOWN when the server stops, -ETIMEDOUT past request_timeout_s. */
static int wait_chunk(struct http_server *s, struct mm3_job *job, int fd, int64_t t_start_ns, struct mm3_job_chunk *ch)
{
    /* Check before every pop, not only on timeouts: a steady flow of chunks
     * would otherwise hide a client that left. One peek per chunk is cheap. */
    for (;;) {
        if (atomic_load(&s->stopping)) return -ESHUTDOWN;
        if (client_gone(fd)) return -ECANCELED;
        if (request_expired(s, t_start_ns)) return -ETIMEDOUT;
        if (mm3_job_pop(job, ch, s->cfg.poll_ms) == 0) return 0;
    }
}

/* The wait ended without a chunk: stop the job; answer 504 if there is still
 * someone to answer. */
static enum MHD_Result answer_wait_failed(struct http_server *s, struct MHD_Connection *c, struct api_req *rq,
                                          struct mm3_job *job, int rc)
{
    job_cancel(s, job);
    if (rc == -ESHUTDOWN) return answer_shutting_down(s, c, rq);
    if (rc == -ECANCELED) {
        record_outcome(s, METRICS_OUTCOME_CANCELLED, rq->t_start_ns, true);
        return MHD_NO; /* nobody to answer: close */
    }
    record_outcome(s, METRICS_OUTCOME_FAILED, rq->t_start_ns, true);
    char msg[128];
    snprintf(msg, sizeof msg, "request took longer than request_timeout_s (%g s): cancelled", s->cfg.request_timeout_s);
    LOG_WARN("job %llu: %s", (unsigned long long)job->id, msg);
    return queue_error(c, MHD_HTTP_GATEWAY_TIMEOUT, NULL, msg, 0);
}

/* Answer from the first error marker: the status the engine chose. */
static enum MHD_Result answer_job_error(struct http_server *s, struct MHD_Connection *c, struct api_req *rq,
                                        struct mm3_job *job)
{
    char msg[512];
    int status = mm3_job_error(job, msg, sizeof msg);
    if (status < 400 || status > 599) status = 500;
    enum metrics_outcome o = status >= 500 ? METRICS_OUTCOME_FAILED : METRICS_OUTCOME_BAD_REQUEST;
    if (status == 429 || status == 503) o = METRICS_OUTCOME_REJECTED;
    record_outcome(s, o, rq->t_start_ns, true);
    char esc[600];
    LOG_INFO("job %llu: %d: %s", (unsigned long long)job->id, status, mm3_log_escape(esc, sizeof esc, msg));
    return queue_error(c, (unsigned)status, NULL, msg, status == 429 || status == 503 ? s->cfg.retry_after_s : 0);
}

/* ---- whole-file answer ---- */

/* Take n bytes of the whole-file budget; false when that would pass it. */
static bool buffer_take(struct http_server *s, size_t n)
{
    if (!s->cfg.max_buffered_bytes) return true;
    size_t cur = atomic_load(&s->buffered);
    do {
        if (n > s->cfg.max_buffered_bytes || cur > s->cfg.max_buffered_bytes - n) return false;
    } while (!atomic_compare_exchange_weak(&s->buffered, &cur, cur + n));
    return true;
}

static void buffer_give(struct http_server *s, size_t n)
{
    if (s->cfg.max_buffered_bytes) atomic_fetch_sub(&s->buffered, n);
}

/* The longest encoded answer a request can have: max_frames of audio as 16-bit PCM at
 * its rate, plus headroom for container framing (WAV header, FLAC frame headers). */
static size_t whole_answer_bound(const struct http_server *s, const struct mm3_job_params *p)
{
    /* a continuation answering the whole song holds the earlier part too */
    int32_t frames = (p->continue_from[0] || p->journal) && p->return_whole ? s->cfg.limits.max_frames : p->max_frames;
    double seconds = (double)frames / s->cfg.limits.frame_rate;
    size_t pcm = (size_t)(seconds * p->sample_rate + 1) * (size_t)s->cfg.pcm_channels * 2;
    return pcm + pcm / 64 + 4096;
}

/* The answer's buffer, handed to MHD; its budget is given back when MHD frees it. */
struct whole_body {
    struct http_server *srv;
    void *data;
    size_t reserved;
};

static void whole_body_free(void *cls)
{
    struct whole_body *b = cls;
    buffer_give(b->srv, b->reserved);
    free(b->data);
    free(b);
}

static enum MHD_Result answer_whole(struct http_server *s, struct MHD_Connection *c, struct api_req *rq,
                                    struct mm3_job *job, struct audio_encoder *enc, int fd, size_t reserved)
{
    struct audio_buf out = {0};
    bool first = true;
    for (;;) {
        struct mm3_job_chunk ch;
        int wrc = wait_chunk(s, job, fd, rq->t_start_ns, &ch);
        if (wrc < 0) {
            audio_buf_free(&out);
            buffer_give(s, reserved);
            return answer_wait_failed(s, c, rq, job, wrc);
        }
        if (ch.kind == MM3_CHUNK_ERROR) {
            audio_buf_free(&out);
            buffer_give(s, reserved);
            return answer_job_error(s, c, rq, job);
        }
        if (ch.kind == MM3_CHUNK_END) break;
        if (first) observe_first_audio(rq->t_start_ns);
        first = false;
        metrics_counter_add(&mm3_metrics.audio_samples, ch.n_frames);
        int rc = audio_encoder_write(enc, ch.pcm, ch.n_frames, &out);
        mm3_job_chunk_release(&ch);
        /* longer than its bound (it should not be): more budget, or the song stops here */
        if (rc >= 0 && out.len > reserved) {
            if (buffer_take(s, out.len - reserved)) {
                reserved = out.len;
            } else {
                job_cancel(s, job);
                audio_buf_free(&out);
                buffer_give(s, reserved);
                record_outcome(s, METRICS_OUTCOME_REJECTED, rq->t_start_ns, true);
                return queue_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL,
                                   "server busy: whole-file answers fill api.max_buffered_bytes; retry later or "
                                   "ask for \"stream\": true",
                                   s->cfg.retry_after_s);
            }
        }
        if (rc < 0) {
            /* The engine keeps going unless told: stop the song nobody will get. */
            job_cancel(s, job);
            audio_buf_free(&out);
            buffer_give(s, reserved);
            record_outcome(s, METRICS_OUTCOME_FAILED, rq->t_start_ns, true);
            return queue_error(c, 500, NULL, mm3_last_error(), 0);
        }
    }
    struct whole_body *wb = NULL;
    int rc = audio_encoder_finish(enc, &out);
    if (rc == 0 && out.len > reserved) {
        if (buffer_take(s, out.len - reserved))
            reserved = out.len;
        else
            rc = mm3_errorf(-EBUSY, "server busy: whole-file answers fill api.max_buffered_bytes; retry later");
    }
    if (rc == 0 && !(wb = malloc(sizeof *wb))) rc = mm3_errorf(-ENOMEM, "out of memory for the answer");
    if (rc < 0) {
        audio_buf_free(&out);
        buffer_give(s, reserved);
        record_outcome(s, METRICS_OUTCOME_FAILED, rq->t_start_ns, true);
        return rc == -EBUSY ? queue_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, mm3_last_error(), s->cfg.retry_after_s)
                            : queue_error(c, 500, NULL, mm3_last_error(), 0);
    }
    observe_done(job, rq->t_start_ns);
    *wb = (struct whole_body){s, out.data, reserved};
    const size_t out_len = out.len;
    struct MHD_Response *r =
        MHD_create_response_from_buffer_with_free_callback_cls(out.len, out.data, whole_body_free, wb);
    if (!r) {
        whole_body_free(wb);
        record_outcome(s, METRICS_OUTCOME_FAILED, rq->t_start_ns, true);
        return MHD_NO;
    }
    add_audio_headers(r, job);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    record_outcome(s, METRICS_OUTCOME_OK, rq->t_start_ns, true);
    LOG_INFO("job %llu: 200 %s, %zu bytes in %.2f s", (unsigned long long)job->id,
             audio_format_name(job->params.format), out_len, seconds_since(rq->t_start_ns));
    return ret;
}

/* Streaming: hold the status line until the first chunk, so errors that come
 * before any audio (the common case) still get a proper status code. */
static enum MHD_Result answer_stream(struct http_server *s, struct MHD_Connection *c, struct api_req *rq,
                                     struct mm3_job *job, struct audio_encoder *enc, int fd)
{
    struct mm3_job_chunk ch;
    int wrc = wait_chunk(s, job, fd, rq->t_start_ns, &ch);
    if (wrc < 0) {
        api_jobs_remove(&s->jobs, job);
        audio_encoder_free(enc);
        return answer_wait_failed(s, c, rq, job, wrc);
    }
    if (ch.kind == MM3_CHUNK_ERROR) {
        api_jobs_remove(&s->jobs, job);
        audio_encoder_free(enc);
        return answer_job_error(s, c, rq, job);
    }
    struct api_stream *st = calloc(1, sizeof *st);
    if (!st) {
        api_jobs_remove(&s->jobs, job);
        mm3_job_chunk_release(&ch);
        job_cancel(s, job);
        audio_encoder_free(enc);
        record_outcome(s, METRICS_OUTCOME_FAILED, rq->t_start_ns, true);
        return MHD_NO;
    }
    st->srv = s;
    st->job = job;
    mm3_job_ref(job);
    st->enc = enc;
    st->fd = fd;
    st->t_start_ns = rq->t_start_ns;
    if (ch.kind == MM3_CHUNK_PCM) observe_first_audio(rq->t_start_ns);
    int rc = stream_take(st, &ch);
    struct MHD_Response *r = NULL;
    if (rc >= 0)
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK_BYTES, stream_read, st, stream_free);
    if (!r) {
        /* Not sent yet: still a clean 500. */
        if (rc >= 0) mm3_errorf(-ENOMEM, "out of memory creating the response");
        const char *msg = mm3_last_error();
        enum MHD_Result ret = queue_error(c, 500, NULL, msg, 0);
        stream_free(st); /* cancels the job and records the outcome */
        return ret;
    }
    add_audio_headers(r, job);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle_speech(struct http_server *s, struct MHD_Connection *c, struct api_req *rq)
{
    if (rq->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "body: larger than %zu bytes", s->cfg.max_body_bytes);
        return reject(s, c, rq, MHD_HTTP_CONTENT_TOO_LARGE, "body", msg);
    }
    struct mm3_job_params p;
    char field[64];
    int rc = api_request_parse(rq->body ? rq->body : "", rq->len, &s->cfg.limits, &p, field, sizeof field);
    if (rc < 0)
        return reject(s, c, rq, rc == -ENOENT ? MHD_HTTP_NOT_FOUND : MHD_HTTP_BAD_REQUEST, field, mm3_last_error());
    if (p.continue_from[0]) { /* a song still being made cannot be continued yet */
        struct mm3_job *from = api_jobs_find(&s->jobs, p.continue_from);
        int running = from && !mm3_job_is_terminal(from);
        if (from) mm3_job_unref(from);
        if (running) {
            char msg[160];
            snprintf(msg, sizeof msg, "continue_from: the song %s is still being generated; continue it once it has "
                     "finished", p.continue_from);
            mm3_job_params_free(&p);
            return reject(s, c, rq, MHD_HTTP_CONFLICT, "continue_from", msg);
        }
    }

    struct audio_encoder *enc = NULL;
    rc = audio_encoder_create(&enc, p.format, s->cfg.pcm_channels, s->cfg.pcm_rate, p.sample_rate, p.stream);
    if (rc < 0) {
        mm3_job_params_free(&p);
        return reject(s, c, rq, rc == -ENOSYS ? MHD_HTTP_NOT_IMPLEMENTED : 500, rc == -ENOSYS ? "sample_rate" : NULL,
                      mm3_last_error());
    }

    /* A whole file is held in memory until sent: its longest size is reserved now, so
     * that all such answers together stay under api.max_buffered_bytes. */
    size_t reserved = p.stream ? 0 : whole_answer_bound(s, &p);
    if (reserved && !buffer_take(s, reserved)) {
        audio_encoder_free(enc);
        mm3_job_params_free(&p);
        return reject(s, c, rq, MHD_HTTP_SERVICE_UNAVAILABLE, NULL,
                      "server busy: whole-file answers in progress fill api.max_buffered_bytes; retry later, ask "
                      "for a shorter song, or for \"stream\": true");
    }

    /* Bounded intake at the API; the engine's own queue answers -EAGAIN below. */
    int held = atomic_fetch_add(&s->in_flight, 1);
    if (s->cfg.max_requests && held >= (int)s->cfg.max_requests) {
        atomic_fetch_sub(&s->in_flight, 1);
        buffer_give(s, reserved);
        audio_encoder_free(enc);
        mm3_job_params_free(&p);
        return reject(s, c, rq, MHD_HTTP_TOO_MANY_REQUESTS, NULL, "server busy: too many requests queued, retry later");
    }
    metrics_gauge_add(&mm3_metrics.requests_in_flight, 1);

    struct mm3_job *job;
    rc = mm3_job_create(&job, &p, s->cfg.pcm_channels, s->cfg.pcm_rate, s->cfg.job_queue_chunks);
    mm3_job_params_free(&p);
    if (rc < 0) {
        buffer_give(s, reserved);
        audio_encoder_free(enc);
        record_outcome(s, METRICS_OUTCOME_FAILED, rq->t_start_ns, true);
        return queue_error(c, 500, NULL, mm3_last_error(), 0);
    }
    rc = s->engine->submit(s->engine->ctx, job);
    if (rc < 0) {
        char msg[512], param[32];
        unsigned status = 500;
        int js = mm3_job_error(job, msg, sizeof msg);
        mm3_job_error_param(job, param, sizeof param);
        if (rc == -EAGAIN) {
            status = MHD_HTTP_SERVICE_UNAVAILABLE;
            if (!msg[0]) snprintf(msg, sizeof msg, "server busy: generation queue full, retry later");
        } else if (rc == -EINVAL) {
            status = js >= 400 && js < 500 ? (unsigned)js : MHD_HTTP_BAD_REQUEST;
            if (!msg[0]) snprintf(msg, sizeof msg, "request refused by the engine");
        } else if (!msg[0]) {
            snprintf(msg, sizeof msg, "engine: submit failed (%s)", strerror(-rc));
        }
        mm3_job_unref(job);
        buffer_give(s, reserved);
        audio_encoder_free(enc);
        atomic_fetch_sub(&s->in_flight, 1);
        metrics_gauge_add(&mm3_metrics.requests_in_flight, -1);
        return reject(s, c, rq, status, param, msg);
    }
    LOG_INFO("job %llu: accepted as %s: %d frames, seed %llu, %s%s", (unsigned long long)job->id, job->public_id,
             job->params.max_frames, (unsigned long long)job->params.seed, audio_format_name(job->params.format),
             job->params.sse ? ", streamed as events" : job->params.stream ? ", streamed" : "");
    int fd = connection_fd(c);
    /* Not listed = no progress reports; the answer itself is unaffected. */
    (void)api_jobs_add(&s->jobs, job);
    enum MHD_Result ret;
    if (job->params.stream) {
        ret = answer_stream(s, c, rq, job, enc, fd); /* takes the encoder and the listing */
    } else {
        ret = answer_whole(s, c, rq, job, enc, fd, reserved); /* gives the reservation back */
        api_jobs_remove(&s->jobs, job);
        audio_encoder_free(enc);
    }
    mm3_job_unref(job);
    return ret;
}

/* ---- GET endpoints ---- */

static const char *job_state_name(enum mm3_job_state st)
{
    switch (st) {
    case MM3_JOB_QUEUED:
        return "queued";
    case MM3_JOB_RUNNING:
        return "running";
    case MM3_JOB_DONE:
        return "done";
    case MM3_JOB_FAILED:
        return "failed";
    case MM3_JOB_CANCELLED:
        return "cancelled";
    }
    return "unknown";
}

static enum MHD_Result handle_progress(struct http_server *s, struct MHD_Connection *c, const char *id)
{
    struct mm3_job *job = api_jobs_find(&s->jobs, id);
    if (!job) return queue_error(c, MHD_HTTP_NOT_FOUND, "id", "no request in progress with this id", 0);
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:f}", "id", job->public_id, "state",
                          job_state_name(mm3_job_state(job)), "frames_done", (json_int_t)atomic_load(&job->frames_done),
                          "frames_total", (json_int_t)atomic_load(&job->frames_total), "windows_done",
                          (json_int_t)atomic_load(&job->windows_done), "audio_seconds",
                          (double)atomic_load(&job->pcm_frames_pushed) / job->pcm_rate);
    /* waiting to start: its place in the queue and when it may start; a stream prerolling
     * (rendering ahead until the server can keep it fed): when it may play (null: unknown) */
    int32_t pos = atomic_load(&job->queue_position);
    int64_t at = atomic_load(&job->start_estimate_ns), now = mm3_job_now_ns();
    int queued = mm3_job_state(job) == MM3_JOB_QUEUED && pos > 0;
    int prerolling = mm3_job_state(job) == MM3_JOB_RUNNING && atomic_load(&job->preroll);
    if (o && queued) json_object_set_new(o, "queue_position", json_integer(pos));
    if (o && prerolling) json_object_set_new(o, "prerolling", json_true());
    if (o && (queued || prerolling))
        json_object_set_new(o, "estimated_start_s",
                            at > 0 ? json_real(at > now ? (double)(at - now) * 1e-9 : 0.0) : json_null());
    mm3_job_unref(job);
    return queue_json(c, MHD_HTTP_OK, o, 0);
}

static void engine_health(struct http_server *s, struct api_health *h)
{
    memset(h, 0, sizeof *h);
    s->engine->health(s->engine->ctx, h);
    if (h->n_stages < 0) h->n_stages = 0;
    if (h->n_stages > API_HEALTH_MAX_STAGES) h->n_stages = API_HEALTH_MAX_STAGES;
    metrics_gauge_set(&mm3_metrics.queue_depth, h->queue_depth);
    metrics_gauge_set(&mm3_metrics.active_rows, h->active_rows);
}

static enum MHD_Result handle_health(struct http_server *s, struct MHD_Connection *c)
{
    struct api_health h;
    engine_health(s, &h);
    bool ready = h.n_stages > 0 && !atomic_load(&s->draining);
    json_t *stages = json_object();
    for (int i = 0; i < h.n_stages; i++) {
        ready = ready && h.stages[i].state == API_STAGE_READY;
        h.stages[i].name[sizeof h.stages[i].name - 1] = 0;
        h.stages[i].detail[sizeof h.stages[i].detail - 1] = 0;
        json_object_set_new(
            stages, h.stages[i].name,
            json_pack("{s:s, s:s}", "state", api_stage_state_name(h.stages[i].state), "detail", h.stages[i].detail));
    }
    json_t *o = json_pack("{s:s, s:b, s:o, s:i, s:i, s:i}", "status", ready ? "ok" : "unavailable", "ready", ready,
                          "stages", stages, "queue_depth", h.queue_depth, "active_rows", h.active_rows,
                          "requests_in_flight", atomic_load(&s->in_flight));
    return queue_json(c, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, o, 0);
}

/* Liveness: the process answers HTTP. Never asks the engine, so a stuck stage 1 or
 * a slow engine lock cannot get stage 0 restarted by a liveness probe. */
static enum MHD_Result handle_live(struct MHD_Connection *c)
{
    return queue_json(c, MHD_HTTP_OK, json_pack("{s:s, s:b}", "status", "ok", "live", 1), 0);
}

static enum MHD_Result handle_metrics(struct http_server *s, struct MHD_Connection *c)
{
    struct api_health h;
    engine_health(s, &h);
    char *text;
    size_t n;
    if (metrics_render(&text, &n) < 0) return queue_error(c, 500, NULL, "out of memory", 0);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, METRICS_CONTENT_TYPE);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* OpenAI's model object, with vLLM's root and parent: `created` is when this server
 * started (the checkpoint has no date). Model k < 0 is the base model (root: its
 * checkpoint name, parent null), k >= 0 adapter k of lora_modules (parent: the base). */
static json_t *model_object(const struct http_server *s, int k)
{
    const char *id = k < 0 ? s->cfg.model_name : s->cfg.limits.lora_names[k];
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:o}", "id", id, "object", "model", "created", (json_int_t)s->created,
                     "owned_by", "mm3", "root", k < 0 ? s->cfg.model_name : id, "parent",
                     k < 0 ? json_null() : json_string(s->cfg.model_name));
}

static enum MHD_Result handle_models(struct http_server *s, struct MHD_Connection *c)
{
    json_t *data = json_array();
    for (int k = -1; data && k < s->cfg.limits.n_lora; k++)
        json_array_append_new(data, model_object(s, k));
    return queue_json(c, MHD_HTTP_OK, json_pack("{s:s, s:o}", "object", "list", "data", data), 0);
}

/* GET /v1/models/{id}: the one model, or 404 naming the one there is. The id may hold
 * a '/' (an "owner/name" checkpoint name), so it is everything after the prefix. */
static enum MHD_Result handle_model(struct http_server *s, struct MHD_Connection *c, const char *url)
{
    const char *id = url + strlen(MODELS_PATH "/");
    if (strcmp(id, s->cfg.model_name) == 0) return queue_json(c, MHD_HTTP_OK, model_object(s, -1), 0);
    for (int k = 0; k < s->cfg.limits.n_lora; k++)
        if (strcmp(id, s->cfg.limits.lora_names[k]) == 0) return queue_json(c, MHD_HTTP_OK, model_object(s, k), 0);
    char msg[512];
    snprintf(msg, sizeof msg, "no model '%.200s' here: this server serves '%.200s'", id, s->cfg.model_name);
    return queue_error(c, MHD_HTTP_NOT_FOUND, "model", msg, 0);
}

/* ---- routing ---- */

static enum route route_of(const char *url, const char *method, bool *method_ok, char id[MM3_JOB_PUBLIC_ID_LEN + 1])
{
    size_t pl = strlen(SPEECH_PATH "/");
    if (strncmp(url, SPEECH_PATH "/", pl) == 0) {
        const char *v = url + pl;
        if (strspn(v, "0123456789abcdef") != MM3_JOB_PUBLIC_ID_LEN || v[MM3_JOB_PUBLIC_ID_LEN]) return ROUTE_NONE;
        memcpy(id, v, MM3_JOB_PUBLIC_ID_LEN + 1);
        *method_ok = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
        return ROUTE_PROGRESS;
    }
    if (strncmp(url, MODELS_PATH "/", strlen(MODELS_PATH "/")) == 0 && url[strlen(MODELS_PATH "/")]) {
        *method_ok = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
        return ROUTE_MODEL;
    }
    struct {
        const char *path, *method;
        enum route r;
    } table[] = {
        {SPEECH_PATH, MHD_HTTP_METHOD_POST, ROUTE_SPEECH},    {"/health", MHD_HTTP_METHOD_GET, ROUTE_HEALTH},
        {"/health/ready", MHD_HTTP_METHOD_GET, ROUTE_HEALTH}, {"/health/live", MHD_HTTP_METHOD_GET, ROUTE_LIVE},
        {"/metrics", MHD_HTTP_METHOD_GET, ROUTE_METRICS},     {MODELS_PATH, MHD_HTTP_METHOD_GET, ROUTE_MODELS},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        if (strcmp(url, table[i].path) != 0) continue;
        *method_ok = strcmp(method, table[i].method) == 0 ||
                     (strcmp(method, MHD_HTTP_METHOD_HEAD) == 0 && strcmp(table[i].method, MHD_HTTP_METHOD_GET) == 0);
        return table[i].r;
    }
    *method_ok = false;
    return ROUTE_NONE;
}

/* ---- connections: per-client limit, read deadline, admin headroom ---- */

static bool is_admin_path(const char *url)
{
    return strncmp(url, "/health", 7) == 0 || strncmp(url, "/metrics", 8) == 0;
}

/* Called by MHD's accepting thread, the same thread that later reports the
 * connection STARTED: counting and admitting cannot race. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    struct http_server *s = cls;
    unsigned limit = s->cfg.max_connections_per_client;
    if (!limit || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6)) return MHD_YES;
    unsigned n = api_conns_count_client(&s->conns, addr);
    if (n < limit) return MHD_YES;
    char name[INET6_ADDRSTRLEN];
    LOG_WARN("http: %s already has %u connections (max_connections_per_client): refused",
             api_conns_client_name(addr, name, sizeof name), n);
    return MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct http_server *s = cls;
    metrics_gauge_add(&mm3_metrics.http_connections, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
    if (toe != MHD_CONNECTION_NOTIFY_STARTED) {
        api_conns_remove(&s->conns, *socket_ctx);
        *socket_ctx = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *addr = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    *socket_ctx = api_conns_add(&s->conns, fd ? fd->connect_fd : -1, addr ? addr->client_addr : NULL);
}

static struct api_conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* ---- request framing and the API key ---- */

struct framing {
    int n_length;
    const char *length;
    bool lengths_differ;
    bool transfer_encoding;
};

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct framing *f = cls;
    if (!key) return MHD_YES;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (f->n_length++ == 0)
            f->length = value ? value : "";
        else if (strcmp(f->length, value ? value : "") != 0)
            f->lengths_differ = true;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        f->transfer_encoding = true;
    }
    return MHD_YES;
}

/* Framing two parsers could read two ways (a proxy in front may pick the other
 * length) is refused: the body's end, and so the next request's start, is in doubt.
 * MHD reports every header, duplicates included. Returns NULL or the reason. */
static const char *framing_problem(struct MHD_Connection *c)
{
    struct framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_header, &f);
    if (f.lengths_differ) return "request framing: Content-Length given twice with different values";
    if (f.n_length && f.transfer_encoding) return "request framing: both Content-Length and Transfer-Encoding given";
    return NULL;
}

/* The time taken depends on the length of what the client sent, never on
 * where it first differs from the key. */
static bool key_equal(const char *got, const char *want)
{
    size_t gn = strlen(got), wn = strlen(want);
    unsigned diff = gn != wn;
    for (size_t i = 0; i < gn; i++)
        diff |= (unsigned char)got[i] ^ (unsigned char)want[wn ? i % wn : 0];
    return diff == 0 && wn > 0;
}

static bool needs_key(const struct http_server *s, const char *url)
{
    return s->cfg.api_key && s->cfg.api_key[0] && (strcmp(url, "/v1") == 0 || strncmp(url, "/v1/", 4) == 0);
}

static bool authorized(const struct http_server *s, struct MHD_Connection *c)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ')
        h++;
    return key_equal(h, s->cfg.api_key);
}

/* ---- MHD request callbacks ---- */

/* The socket this connection's thread is reading a request from (one thread
 * per connection, and MHD logs from that thread): where on_mhd_log answers a
 * Content-Length MHD could not parse, before our handler ever sees the request. */
static _Thread_local int request_fd = -1;

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    request_fd = ci ? ci->connect_fd : -1;
    return NULL;
}

/* First call for a request: headers are in, the body is not. Returns true
 * when an answer was queued (into *ret) and the request ends here. */
static bool admit(struct http_server *s, struct MHD_Connection *c, struct api_req *rq, const char *url,
                  const char *method, enum MHD_Result *ret)
{
    bool admin = is_admin_path(url);
    const char *why = framing_problem(c);
    if (why) {
        char esc[256];
        LOG_INFO("%s 400: %s", mm3_log_escape(esc, sizeof esc, url), why);
        *ret = queue_error_close(c, MHD_HTTP_BAD_REQUEST, why, 0);
        return true;
    }
    if (needs_key(s, url) && !authorized(s, c)) {
        json_t *body =
            error_body(MHD_HTTP_UNAUTHORIZED, NULL, "missing or wrong API key: send `Authorization: Bearer KEY`");
        *ret = body ? queue_json_with(c, MHD_HTTP_UNAUTHORIZED, body, 0, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer")
                    : MHD_NO;
        return true;
    }
    if (!admin && atomic_load(&s->draining)) {
        *ret = queue_error_close(c, MHD_HTTP_SERVICE_UNAVAILABLE, "server shutting down", s->cfg.retry_after_s);
        return true;
    }
    if (!admin) {
        if (!api_conns_take_general(&s->conns, s->cfg.max_connections)) {
            *ret =
                queue_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL,
                            "server busy: too many connections (max_connections), retry later", s->cfg.retry_after_s);
            return true;
        }
        rq->general = true;
    }
    bool method_ok;
    rq->route = route_of(url, method, &method_ok, rq->job_id);
    if (rq->route == ROUTE_NONE) {
        *ret = queue_error(c, MHD_HTTP_NOT_FOUND, NULL, "no such endpoint", 0);
        return true;
    }
    if (!method_ok) {
        *ret = queue_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, "method not allowed here", 0);
        return true;
    }
    if (rq->route == ROUTE_SPEECH) {
        rq->gen = true;
        atomic_fetch_add(&s->gen_open, 1);
        /* Refuse an oversized body before reading it. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) {
            rq->too_big = true;
            *ret = handle_speech(s, c, rq);
            return true;
        }
    }
    return false;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    struct http_server *s = cls;
    struct api_req *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof *rq);
        if (!rq) return MHD_NO;
        rq->t_start_ns = mm3_job_now_ns();
        rq->conn = conn_of(c);
        *con_cls = rq;
        enum MHD_Result ret;
        if (admit(s, c, rq, url, method, &ret)) {
            api_conns_reading(&s->conns, rq->conn, false);
            return ret;
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (rq->route != ROUTE_SPEECH || rq->too_big) return MHD_YES; /* drop */
        if (rq->len + n > s->cfg.max_body_bytes) {
            rq->too_big = true;
            free(rq->body);
            rq->body = NULL;
            rq->len = rq->cap = 0;
            return MHD_YES;
        }
        if (rq->len + n > rq->cap) {
            size_t cap = rq->cap ? rq->cap : 4096;
            while (cap < rq->len + n)
                cap *= 2;
            char *b = realloc(rq->body, cap);
            if (!b) return MHD_NO;
            rq->body = b;
            rq->cap = cap;
        }
        memcpy(rq->body + rq->len, upload, n);
        rq->len += n;
        return MHD_YES;
    }
    api_conns_reading(&s->conns, rq->conn, false);
    switch (rq->route) {
    case ROUTE_SPEECH:
        return handle_speech(s, c, rq);
    case ROUTE_PROGRESS:
        return handle_progress(s, c, rq->job_id);
    case ROUTE_HEALTH:
        return handle_health(s, c);
    case ROUTE_LIVE:
        return handle_live(c);
    case ROUTE_METRICS:
        return handle_metrics(s, c);
    case ROUTE_MODELS:
        return handle_models(s, c);
    case ROUTE_MODEL:
        return handle_model(s, c, url);
    case ROUTE_NONE:
        break;
    }
    return MHD_NO;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct http_server *s = cls;
    struct api_req *rq = *con_cls;
    if (!rq) return;
    if (rq->general) api_conns_release_general(&s->conns);
    /* A kept-alive connection waits for its next request: the deadline restarts. */
    api_conns_reading(&s->conns, rq->conn, true);
    if (rq->gen) atomic_fetch_sub(&s->gen_open, 1);
    free(rq->body);
    free(rq);
    *con_cls = NULL;
}

/* libmicrohttpd 0.9.75 answers a request whose Content-Length it cannot parse
 * (or that overflows) with its status line and headers written twice. Answer
 * it here, once, and end the socket's sending side so that MHD's own copy goes
 * nowhere. */
static void answer_bad_length_once(unsigned status, const char *reason, const char *msg)
{
    if (request_fd < 0) return;
    char body[256], head[256];
    int nb = snprintf(body, sizeof body,
                      "{\"error\":{\"message\":\"%s\",\"type\":\"invalid_request_error\",\"param\":null,"
                      "\"code\":%u}}\n",
                      msg, status);
    int nh = snprintf(head, sizeof head,
                      "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                      "Connection: close\r\n\r\n",
                      status, reason, nb);
    if (send(request_fd, head, (size_t)nh, MSG_NOSIGNAL) == nh) (void)send(request_fd, body, (size_t)nb, MSG_NOSIGNAL);
    shutdown(request_fd, SHUT_WR);
    request_fd = -1;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    if (n && msg[n - 1] == '\n') msg[n - 1] = 0;
    if (strstr(msg, "Failed to parse `Content-Length' header"))
        answer_bad_length_once(400, "Bad Request", "request framing: invalid Content-Length");
    else if (strstr(msg, "Too large value of 'Content-Length' header"))
        answer_bad_length_once(413, "Content Too Large", "request framing: Content-Length too large");
    char esc[1024];
    LOG_WARN("microhttpd: %s", mm3_log_escape(esc, sizeof esc, msg));
}

static void server_free(struct http_server *s)
{
    api_conns_free(&s->conns);
    api_jobs_free(&s->jobs);
    free(s);
}

int http_server_start(struct http_server **out, const struct http_server_config *cfg, struct api_engine *engine)
{
    *out = NULL;
    if (!engine || !engine->submit || !engine->cancel || !engine->health)
        return mm3_errorf(-EINVAL, "http server: engine must provide submit, cancel and health");
    if (!cfg->host || cfg->max_body_bytes < 2 || cfg->max_connections < 1 || cfg->poll_ms < 1 ||
        cfg->job_queue_chunks < 1 || cfg->pcm_channels < 1 || cfg->pcm_rate < 1 || cfg->limits.max_frames < 1 ||
        cfg->limits.default_frames < 1 || cfg->limits.default_frames > cfg->limits.max_frames ||
        !(cfg->limits.frame_rate > 0) || !(cfg->request_read_timeout_s >= 0) || !(cfg->drain_timeout_s >= 0) ||
        cfg->admin_connections > 65536)
        return mm3_errorf(-EINVAL, "http server: invalid configuration (host, max_body_bytes, "
                                   "max_connections, admin_connections, poll_ms, job_queue_chunks, pcm geometry, "
                                   "frame limits, read and drain timeouts)");

    char port[8];
    snprintf(port, sizeof port, "%u", cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(cfg->host, port, &hints, &ai);
    if (g != 0) return mm3_errorf(-EINVAL, "http server: host '%s': %s", cfg->host, gai_strerror(g));

    struct http_server *s = calloc(1, sizeof *s);
    if (!s) {
        freeaddrinfo(ai);
        return mm3_errorf(-ENOMEM, "http server: out of memory");
    }
    s->cfg = *cfg;
    s->created = (int64_t)time(NULL);
    s->engine = engine;
    if (api_conns_init(&s->conns, cfg->request_read_timeout_s) < 0) {
        freeaddrinfo(ai);
        free(s);
        return -ENOMEM;
    }
    api_jobs_init(&s->jobs);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    unsigned limit = cfg->max_connections + cfg->admin_connections;
    s->mhd = MHD_start_daemon(flags, cfg->port, on_accept, s, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                              MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, limit,
                              MHD_OPTION_CONNECTION_TIMEOUT, cfg->connection_timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
                              on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                              MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->mhd) {
        server_free(s);
        return mm3_errorf(-EADDRINUSE,
                          "http server: cannot listen on %s:%u (in use, or not an "
                          "address of this host)",
                          cfg->host, cfg->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    LOG_INFO("http: listening on %s:%u%s", cfg->host, s->port,
             cfg->api_key && cfg->api_key[0] ? " (API key required on /v1)" : "");
    *out = s;
    return 0;
}

uint16_t http_server_port(const struct http_server *s)
{
    return s->port;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Wait up to `limit_s` for the generation requests admitted to complete. */
static void wait_open_answers(struct http_server *s, double limit_s)
{
    int64_t t0 = mm3_job_now_ns();
    while (atomic_load(&s->gen_open) > 0 && seconds_since(t0) < limit_s)
        sleep_ms(10);
}

void http_server_drain(struct http_server *s)
{
    if (!s) return;
    atomic_store(&s->draining, true);
    int open = atomic_load(&s->gen_open);
    LOG_INFO("http: draining: new requests get 503; %d song request(s) in flight may finish within %g s", open,
             s->cfg.drain_timeout_s);
    wait_open_answers(s, s->cfg.drain_timeout_s);
    open = atomic_load(&s->gen_open);
    if (open)
        LOG_WARN("http: drain_timeout_s (%g s) passed with %d song request(s) left: ending them",
                 s->cfg.drain_timeout_s, open);
}

void http_server_stop(struct http_server *s)
{
    if (!s) return;
    atomic_store(&s->draining, true);
    atomic_store(&s->stopping, true);
    wait_open_answers(s, STOP_FLUSH_S);
    MHD_stop_daemon(s->mhd);
    server_free(s);
}
