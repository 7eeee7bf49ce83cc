/* The HTTP front of stage 0 (libmicrohttpd, one thread per connection):
 *   POST /v1/audio/speech   generate a song (whole file, or streamed chunk by chunk)
 *   GET  /v1/audio/speech/{id}  progress of an answer in progress (id from X-Request-Id)
 *   GET  /health            readiness and per-stage state (200 ready, 503 not)
 *   GET  /metrics           Prometheus text format 0.0.4
 *   GET  /v1/models         the served model (OpenAI-style list)
 * The fields, limits, status codes and the streaming format are in docs/api.md.
 *
 *     struct http_server_config cfg;
 *     http_server_config_default(&cfg);
 *     cfg.port = 8000;
 *     struct http_server *srv;
 *     if (http_server_start(&srv, &cfg, &engine) < 0) die(mm3_last_error());
 *     ...
 *     http_server_drain(srv);  // on SIGTERM: refuse new requests, let songs finish
 *     http_server_stop(srv);   // before the engine goes away
 *
 * Paths starting with /health or /metrics are "admin" paths: they are open
 * without the API key and may use the admin_connections kept free for them.
 */
#ifndef MM3_STAGE0_HTTP_SERVER_H
#define MM3_STAGE0_HTTP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "stage0/api/api.h"
#include "stage0/api/api_request.h"

struct http_server_config {
    const char *host;              /* numeric address or name to bind; "127.0.0.1" */
    uint16_t port;                 /* 0 = pick a free port (see http_server_port) */
    size_t max_body_bytes;         /* larger bodies get 413; 1 MiB */
    unsigned max_connections;      /* requests other than /health* and /metrics answered
                                    * at once; beyond: 503 + Retry-After. 64 */
    unsigned max_requests;         /* generation requests answered at once (running +
                                    * queued in the engine); beyond: 429 + Retry-After
                                    * without asking the engine. 0 = no cap here: the
                                    * engine's bounded queue (deploy api.max_queue_depth,
                                    * answered -EAGAIN -> 503 + Retry-After) is the limit. 0 */
    double request_timeout_s;      /* admission to last byte; on expiry the job is cancelled
                                    * in both stages (504 before audio, cut stream after).
                                    * 0 = none. 1800 */
    int retry_after_s;             /* Retry-After on 429 / 503; 5 */
    unsigned connection_timeout_s; /* a silent connection is closed (idle clients, clients
                                    * that do not read their answer); 60 */
    int poll_ms;                   /* how often a waiting answer checks for a gone client; 100 */
    size_t job_queue_chunks;       /* PCM chunks buffered per job before the engine blocks; 16 */
    size_t max_buffered_bytes;     /* encoded audio held for whole-file answers, all connections
                                    * together: each request reserves its longest answer at
                                    * admission; past the bound 503 + Retry-After. 0 = no
                                    * bound. 1 GiB */
    int32_t pcm_channels;          /* of the PCM the engine pushes; 2 */
    int32_t pcm_rate;              /* of the PCM the engine pushes; 44100 */
    const char *model_name;        /* reported by /v1/models; "MiniMax-Music3" */
    struct api_limits limits;      /* frames cap/default, frame rate, text length */

    /* Against hostile clients (docs/api.md, "Security"). */
    unsigned admin_connections;          /* connections beyond max_connections only admin paths
                                          * can use; more than max_connections + admin_connections
                                          * are refused at accept. 8 */
    unsigned max_connections_per_client; /* per client address, beyond: refused at
                                          * accept. 0 = no limit. 32 */
    double request_read_timeout_s;       /* from the accept (or the end of the previous answer) to
                                          * the last byte of the request; a client trickling bytes
                                          * is cut off. 0 = none. 30 */
    double drain_timeout_s;              /* http_server_drain waits this long for songs in flight; 10 */
    const char *api_key;                 /* NULL or "": none; else `Authorization: Bearer KEY` is
                                          * required on /v1 and /v1/... (401 otherwise) */
};

void http_server_config_default(struct http_server_config *cfg);

struct mm3_deploy;
/* Copy the deploy file's `api:` keys over a config (host, port, body and
 * connection limits, timeouts, drain, API key, default sample rate) and the stage defaults
 * a request falls back to (seed, AR cfg_scale, DiT steps and guidance). cfg->host
 * then points into `d`, which must outlive the server start. `api.max_queue_depth`
 * is the engine's queue and is not copied. */
void http_server_config_from_deploy(struct http_server_config *cfg, const struct mm3_deploy *d);

struct http_server;

/* Bind and start serving. `engine` must outlive the server. Returns 0 or
 * -EINVAL / -EADDRINUSE / -EIO with a message. */
int http_server_start(struct http_server **out, const struct http_server_config *cfg, struct api_engine *engine);

/* The bound port (useful with port 0). */
uint16_t http_server_port(const struct http_server *s);

/* Start the shutdown: new requests (admin paths aside) get 503 "server shutting
 * down", /health turns 503, and the songs in flight may finish for up to
 * cfg.drain_timeout_s. Returns when none is left or the time is up. NULL is a no-op. */
void http_server_drain(struct http_server *s);

/* Stop accepting, end every open answer (their jobs are cancelled; a whole file
 * still waited for gets 503 "server shutting down", a stream is cut), join all
 * connection threads, free. NULL is a no-op. */
void http_server_stop(struct http_server *s);

#endif
