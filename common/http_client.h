/* A small blocking HTTP/1.1 client over TCP, enough for the mm3 CLI and the
 * tests: one request per connection ("Connection: close"), a body sent with
 * Content-Length, a response read with Content-Length, chunked transfer coding
 * or until close. Plain http:// only (no TLS, no redirects, no proxies).
 *
 *     struct http_client_response resp;
 *     int rc = http_client_request(&(struct http_client_request){
 *         .url = "http://127.0.0.1:8000/health", .method = "GET", .timeout_ms = 5000}, &resp);
 *     ... resp.status, resp.body, http_client_header(&resp, "Content-Type") ...
 *     http_client_response_free(&resp);
 */
#ifndef MM3_HTTP_CLIENT_H
#define MM3_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#define HTTP_CLIENT_MAX_HEADERS 64

struct http_client_response {
    int status;
    int n_headers;
    char *names[HTTP_CLIENT_MAX_HEADERS]; /* lower-cased */
    char *values[HTTP_CLIENT_MAX_HEADERS];
    bool chunked;    /* Transfer-Encoding: chunked was used */
    bool complete;   /* the body ended properly (length reached / last chunk seen) */
    size_t n_chunks; /* chunks received (chunked responses) */
    char *body;      /* whole body, NUL-terminated, when on_body is NULL */
    size_t body_len;
};

struct http_client_request {
    const char *url;          /* http://host[:port]/path */
    const char *method;       /* "GET", "POST" */
    const char *content_type; /* for a body; default application/json */
    const char *body;
    size_t body_len;
    int timeout_ms;           /* per socket operation (connect, each read); 0 = 30 s */
    const char *bearer_token; /* NULL or "": none; else sent as `Authorization: Bearer` */
    /* Largest body collected in memory (on_body NULL); a longer one fails the request
     * with -EFBIG instead of growing without limit. 0 = no limit (tests that fetch
     * whole songs). */
    size_t max_body_bytes;
    /* Optional streaming: called after the headers with the response so far
     * (status and headers set); a negative return aborts. */
    int (*on_headers)(void *user, const struct http_client_response *resp);
    /* Optional streaming: body bytes as they arrive (de-chunked); when set the
     * body is not collected. A negative return aborts with that code; set the
     * reason with mm3_errorf (the client keeps it, prefixed). */
    int (*on_body)(void *user, const void *data, size_t n);
    void *user;
};

/* Do one request. Returns 0 when a response with a status line was read (any
 * status, body complete or not: check resp->complete), else a negative errno
 * with a message. resp must be freed with http_client_response_free either way. */
int http_client_request(const struct http_client_request *req, struct http_client_response *resp);

/* Value of a header (case-insensitive name) or NULL. */
const char *http_client_header(const struct http_client_response *resp, const char *name);

void http_client_response_free(struct http_client_response *resp);

#endif
