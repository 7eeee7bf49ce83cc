#include "common/http_client.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"

struct conn {
    int fd;
    int timeout_ms;
    char buf[16384];
    size_t off, len;
};

struct url_parts {
    char host[256];
    char port[8];
    char path[2048];
};

static int url_parse(const char *url, struct url_parts *u)
{
    const char *p = url;
    if (strncmp(p, "http://", 7) != 0) return mm3_errorf(-EINVAL, "url '%s': expected http://host[:port]/path", url);
    p += 7;
    const char *host = p, *host_end;
    if (*p == '[') { /* [v6]:port */
        host = ++p;
        while (*p && *p != ']')
            p++;
        if (*p != ']') return mm3_errorf(-EINVAL, "url '%s': unterminated [address]", url);
        host_end = p++;
    } else {
        while (*p && *p != ':' && *p != '/')
            p++;
        host_end = p;
    }
    size_t hl = (size_t)(host_end - host);
    if (hl == 0 || hl >= sizeof u->host) return mm3_errorf(-EINVAL, "url '%s': bad host", url);
    memcpy(u->host, host, hl);
    u->host[hl] = 0;
    snprintf(u->port, sizeof u->port, "80");
    if (*p == ':') {
        const char *ps = ++p;
        while (isdigit((unsigned char)*p))
            p++;
        size_t pl = (size_t)(p - ps);
        if (pl == 0 || pl > 5) return mm3_errorf(-EINVAL, "url '%s': bad port", url);
        memcpy(u->port, ps, pl);
        u->port[pl] = 0;
    }
    if (*p && *p != '/') return mm3_errorf(-EINVAL, "url '%s': expected '/' after host", url);
    if (strlen(*p ? p : "/") >= sizeof u->path) return mm3_errorf(-EINVAL, "url '%s': path too long", url);
    snprintf(u->path, sizeof u->path, "%s", *p ? p : "/");
    return 0;
}

static int wait_fd(struct conn *c, short events, const char *what)
{
    struct pollfd pfd = {c->fd, events, 0};
    for (;;) {
        int n = poll(&pfd, 1, c->timeout_ms);
        if (n > 0) return 0;
        if (n == 0) return mm3_errorf(-ETIMEDOUT, "http: timed out after %d ms while %s", c->timeout_ms, what);
        if (errno != EINTR) return mm3_errorf(-errno, "http: poll: %s", strerror(errno));
    }
}

static int conn_open(struct conn *c, const struct url_parts *u)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(u->host, u->port, &hints, &ai);
    if (g != 0) return mm3_errorf(-EHOSTUNREACH, "http: host '%s': %s", u->host, gai_strerror(g));
    int rc = -ECONNREFUSED;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        c->fd = fd;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 ||
            (errno == EINPROGRESS && wait_fd(c, POLLOUT, "connecting") == 0)) {
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err == 0) {
                freeaddrinfo(ai);
                return 0;
            }
            rc = -err;
        }
        close(fd);
        c->fd = -1;
    }
    freeaddrinfo(ai);
    return mm3_errorf(rc, "http: cannot connect to %s:%s: %s", u->host, u->port, strerror(-rc));
}

static int conn_write_all(struct conn *c, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(c, POLLOUT, "sending");
            if (rc < 0) return rc;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        return mm3_errorf(-EPIPE, "http: send: %s", strerror(errno));
    }
    return 0;
}

/* Read more into the buffer. Returns bytes added, 0 on EOF, < 0 on error. */
static int conn_fill(struct conn *c)
{
    if (c->off == c->len) c->off = c->len = 0;
    if (c->off > 0 && c->len == sizeof c->buf) {
        memmove(c->buf, c->buf + c->off, c->len - c->off);
        c->len -= c->off;
        c->off = 0;
    }
    if (c->len == sizeof c->buf) return mm3_errorf(-E2BIG, "http: header line too long");
    for (;;) {
        ssize_t n = recv(c->fd, c->buf + c->len, sizeof c->buf - c->len, 0);
        if (n >= 0) {
            c->len += (size_t)n;
            return (int)n;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(c, POLLIN, "receiving");
            if (rc < 0) return rc;
            continue;
        }
        if (errno == EINTR) continue;
        return mm3_errorf(-ECONNRESET, "http: recv: %s", strerror(errno));
    }
}

/* Read one CRLF- (or LF-) terminated line without the terminator. */
static int conn_line(struct conn *c, char *line, size_t cap)
{
    for (;;) {
        char *nl = memchr(c->buf + c->off, '\n', c->len - c->off);
        if (nl) {
            size_t n = (size_t)(nl - (c->buf + c->off));
            size_t keep = n;
            if (keep && c->buf[c->off + keep - 1] == '\r') keep--;
            if (keep >= cap) return mm3_errorf(-E2BIG, "http: line too long");
            memcpy(line, c->buf + c->off, keep);
            line[keep] = 0;
            c->off += n + 1;
            return 0;
        }
        int rc = conn_fill(c);
        if (rc < 0) return rc;
        if (rc == 0) return mm3_errorf(-ECONNRESET, "http: connection closed mid-line");
    }
}

struct sink {
    const struct http_client_request *req;
    struct http_client_response *resp;
    size_t cap;
};

static int sink_put(struct sink *s, const char *p, size_t n)
{
    if (n == 0) return 0;
    if (s->req->on_body) {
        int rc = s->req->on_body(s->req->user, p, n);
        /* the callback says why (e.g. the output file is full); keep its message */
        return rc < 0 ? mm3_error_prefix(rc, "http: body callback: ") : 0;
    }
    struct http_client_response *r = s->resp;
    if (s->req->max_body_bytes && r->body_len + n > s->req->max_body_bytes)
        return mm3_errorf(-EFBIG, "http: response body larger than %zu bytes: not read further",
                          s->req->max_body_bytes);
    if (r->body_len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < r->body_len + n + 1)
            cap *= 2;
        char *b = realloc(r->body, cap);
        if (!b) return mm3_errorf(-ENOMEM, "http: out of memory for the body");
        r->body = b;
        s->cap = cap;
    }
    memcpy(r->body + r->body_len, p, n);
    r->body_len += n;
    r->body[r->body_len] = 0;
    return 0;
}

/* Pass exactly n bytes to the sink (n = SIZE_MAX: until EOF). Returns 1 when
 * complete, 0 on early EOF, < 0 on error. */
static int read_body_n(struct conn *c, struct sink *s, size_t n)
{
    while (n) {
        if (c->off == c->len) {
            int rc = conn_fill(c);
            if (rc < 0) return rc;
            if (rc == 0) return n == SIZE_MAX ? 1 : 0;
        }
        size_t k = c->len - c->off;
        if (k > n) k = n;
        int rc = sink_put(s, c->buf + c->off, k);
        if (rc < 0) return rc;
        c->off += k;
        if (n != SIZE_MAX) n -= k;
    }
    return 1;
}

static int read_chunked(struct conn *c, struct sink *s)
{
    char line[1024];
    for (;;) {
        int rc = conn_line(c, line, sizeof line);
        if (rc == -ECONNRESET) return 0; /* cut stream: incomplete, not an error */
        if (rc < 0) return rc;
        char *end;
        errno = 0;
        unsigned long long size = strtoull(line, &end, 16);
        if (end == line || errno) return mm3_errorf(-EPROTO, "http: bad chunk size line '%s'", line);
        if (size == 0) {
            do { /* trailers, up to the empty line */
                rc = conn_line(c, line, sizeof line);
                if (rc < 0) return rc == -ECONNRESET ? 0 : rc;
            } while (line[0]);
            return 1;
        }
        s->resp->n_chunks++;
        rc = read_body_n(c, s, (size_t)size);
        if (rc <= 0) return rc;
        rc = conn_line(c, line, sizeof line);
        if (rc == -ECONNRESET) return 0;
        if (rc < 0) return rc;
        if (line[0]) return mm3_errorf(-EPROTO, "http: chunk not followed by CRLF");
    }
}

static int read_response(struct conn *c, const struct http_client_request *req, struct http_client_response *resp)
{
    char line[8192];
    int rc = conn_line(c, line, sizeof line);
    if (rc < 0) return rc;
    int major, minor, status;
    if (sscanf(line, "HTTP/%d.%d %d", &major, &minor, &status) != 3)
        return mm3_errorf(-EPROTO, "http: bad status line '%.80s'", line);
    resp->status = status;
    for (;;) {
        if ((rc = conn_line(c, line, sizeof line)) < 0) return rc;
        if (!line[0]) break;
        char *colon = strchr(line, ':');
        if (!colon || resp->n_headers == HTTP_CLIENT_MAX_HEADERS) continue;
        *colon = 0;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        for (char *k = line; *k; k++)
            *k = (char)tolower((unsigned char)*k);
        resp->names[resp->n_headers] = strdup(line);
        resp->values[resp->n_headers] = strdup(v);
        if (!resp->names[resp->n_headers] || !resp->values[resp->n_headers])
            return mm3_errorf(-ENOMEM, "http: out of memory");
        resp->n_headers++;
    }
    const char *te = http_client_header(resp, "transfer-encoding");
    const char *cl = http_client_header(resp, "content-length");
    resp->chunked = te && strcasestr(te, "chunked");
    if (req->on_headers && (rc = req->on_headers(req->user, resp)) < 0)
        return mm3_errorf(rc, "http: aborted by the header callback");
    struct sink s = {req, resp, 0};
    bool no_body =
        strcmp(req->method, "HEAD") == 0 || status == 204 || status == 304 || (status >= 100 && status < 200);
    if (no_body)
        rc = 1;
    else if (resp->chunked)
        rc = read_chunked(c, &s);
    else if (cl)
        rc = read_body_n(c, &s, (size_t)strtoull(cl, NULL, 10));
    else
        rc = read_body_n(c, &s, SIZE_MAX);
    if (rc < 0) return rc;
    resp->complete = rc == 1;
    if (!resp->body && !req->on_body) {
        resp->body = calloc(1, 1);
        if (!resp->body) return mm3_errorf(-ENOMEM, "http: out of memory");
    }
    return 0;
}

int http_client_request(const struct http_client_request *req, struct http_client_response *resp)
{
    memset(resp, 0, sizeof *resp);
    struct url_parts u;
    int rc = url_parse(req->url, &u);
    if (rc < 0) return rc;
    struct conn *c = calloc(1, sizeof *c);
    if (!c) return mm3_errorf(-ENOMEM, "http: out of memory");
    c->fd = -1;
    c->timeout_ms = req->timeout_ms > 0 ? req->timeout_ms : 30000;
    if (req->bearer_token)
        for (const char *q = req->bearer_token; *q; q++)
            if (*q <= ' ' || *q > '~') {
                rc = mm3_errorf(-EINVAL, "http: API key: expected printable ASCII without spaces");
                goto out;
            }
    if ((rc = conn_open(c, &u)) < 0) goto out;

    char head[3072];
    bool ipv6 = strchr(u.host, ':') != NULL;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: %s%s%s:%s\r\nUser-Agent: mm3\r\nAccept: */*\r\n"
                     "Connection: close\r\n",
                     req->method, u.path, ipv6 ? "[" : "", u.host, ipv6 ? "]" : "", u.port);
    if (req->bearer_token && req->bearer_token[0] && n > 0 && (size_t)n < sizeof head)
        n += snprintf(head + n, sizeof head - (size_t)n, "Authorization: Bearer %s\r\n", req->bearer_token);
    if (req->body && n > 0 && (size_t)n < sizeof head)
        n += snprintf(head + n, sizeof head - (size_t)n, "Content-Type: %s\r\nContent-Length: %zu\r\n",
                      req->content_type ? req->content_type : "application/json", req->body_len);
    if (n > 0 && (size_t)n < sizeof head) n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    if (n < 0 || (size_t)n >= sizeof head) {
        rc = mm3_errorf(-E2BIG, "http: request head too long");
        goto out;
    }
    if ((rc = conn_write_all(c, head, (size_t)n)) < 0) goto out;
    if (req->body && (rc = conn_write_all(c, req->body, req->body_len)) < 0) {
        /* The server may answer early (413) and close: still read its answer. */
        rc = read_response(c, req, resp);
        goto out;
    }
    rc = read_response(c, req, resp);
out:
    if (c->fd >= 0) close(c->fd);
    free(c);
    return rc;
}

const char *http_client_header(const struct http_client_response *resp, const char *name)
{
    for (int i = 0; i < resp->n_headers; i++)
        if (strcasecmp(resp->names[i], name) == 0) return resp->values[i];
    return NULL;
}

void http_client_response_free(struct http_client_response *resp)
{
    for (int i = 0; i < resp->n_headers; i++) {
        free(resp->names[i]);
        free(resp->values[i]);
    }
    free(resp->body);
    memset(resp, 0, sizeof *resp);
}
