/* The small HTTP/1.1 client against canned server answers: Content-Length,
 * chunked (with extensions and trailers), close-delimited, a cut chunked body,
 * and URL errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/http_client.h"

struct canned {
    int listen_fd;
    int port;
    const char *answer;
    char request[4096];
    pthread_t th;
};

/* Accept one connection, read the request head (and its body), send the answer, close. */
static void *serve_once(void *arg)
{
    struct canned *c = arg;
    int fd = accept(c->listen_fd, NULL, NULL);
    size_t n = 0;
    while (n < sizeof c->request - 1) {
        ssize_t k = recv(fd, c->request + n, sizeof c->request - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
        c->request[n] = 0;
        char *end = strstr(c->request, "\r\n\r\n");
        const char *cl = strstr(c->request, "Content-Length: ");
        if (end && (!cl || n >= (size_t)(end + 4 - c->request) + strtoul(cl + 16, NULL, 10))) break;
    }
    send(fd, c->answer, strlen(c->answer), MSG_NOSIGNAL);
    close(fd);
    return NULL;
}

static void canned_start(struct canned *c, const char *answer)
{
    memset(c, 0, sizeof *c);
    c->answer = answer;
    c->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(bind(c->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(c->listen_fd, (struct sockaddr *)&a, &len);
    c->port = ntohs(a.sin_port);
    assert_int_equal(listen(c->listen_fd, 1), 0);
    pthread_create(&c->th, NULL, serve_once, c);
}

static int canned_get(struct canned *c, const char *method, const char *body, struct http_client_response *r)
{
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/x/y?z=1", c->port);
    struct http_client_request rq = {
        .url = url, .method = method, .body = body, .body_len = body ? strlen(body) : 0, .timeout_ms = 5000};
    int rc = http_client_request(&rq, r);
    pthread_join(c->th, NULL);
    close(c->listen_fd);
    return rc;
}

static void test_content_length(void **state)
{
    struct canned c;
    canned_start(&c, "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhelloEXTRA");
    struct http_client_response r;
    assert_int_equal(canned_get(&c, "POST", "{\"a\":1}", &r), 0);
    assert_int_equal(r.status, 201);
    assert_true(r.complete);
    assert_false(r.chunked);
    assert_string_equal(r.body, "hello");
    assert_string_equal(http_client_header(&r, "CONTENT-TYPE"), "text/plain");
    assert_non_null(strstr(c.request, "POST /x/y?z=1 HTTP/1.1\r\n"));
    assert_non_null(strstr(c.request, "Content-Length: 7\r\n"));
    assert_non_null(strstr(c.request, "\r\n\r\n{\"a\":1}"));
    http_client_response_free(&r);
}

static void test_chunked(void **state)
{
    struct canned c;
    canned_start(&c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "5\r\nhello\r\n1;ext=1\r\n,\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n");
    struct http_client_response r;
    assert_int_equal(canned_get(&c, "GET", NULL, &r), 0);
    assert_true(r.chunked);
    assert_true(r.complete);
    assert_int_equal(r.n_chunks, 3);
    assert_string_equal(r.body, "hello,0123456789");
    http_client_response_free(&r);

    canned_start(&c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n8\r\nabc");
    assert_int_equal(canned_get(&c, "GET", NULL, &r), 0);
    assert_true(r.chunked);
    assert_false(r.complete); /* cut inside a chunk: the body is incomplete */
    assert_string_equal(r.body, "helloabc");
    http_client_response_free(&r);

    canned_start(&c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    assert_true(canned_get(&c, "GET", NULL, &r) < 0); /* not a chunk size */
    http_client_response_free(&r);
}

static void test_close_delimited(void **state)
{
    struct canned c;
    canned_start(&c, "HTTP/1.0 404 Not Found\r\n\r\nnothing here");
    struct http_client_response r;
    assert_int_equal(canned_get(&c, "GET", NULL, &r), 0);
    assert_int_equal(r.status, 404);
    assert_true(r.complete);
    assert_string_equal(r.body, "nothing here");
    http_client_response_free(&r);
}

/* A body longer than max_body_bytes fails the request instead of being held; within
 * the limit it is read as usual. */
static void test_body_limit(void **state)
{
    const size_t n = 3 << 20;
    char *answer = malloc(n + 128);
    assert_non_null(answer);
    int h = snprintf(answer, 128, "HTTP/1.1 500 Oops\r\nContent-Length: %zu\r\n\r\n", n);
    memset(answer + h, 'x', n);
    answer[h + n] = 0;
    struct canned c;
    canned_start(&c, answer);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", c.port);
    struct http_client_request rq = {.url = url, .method = "GET", .timeout_ms = 5000, .max_body_bytes = 1 << 20};
    struct http_client_response r;
    int rc = http_client_request(&rq, &r);
    close(c.listen_fd);
    pthread_join(c.th, NULL);
    assert_int_equal(rc, -EFBIG);
    assert_true(r.body_len <= (size_t)1 << 20);
    http_client_response_free(&r);
    free(answer);

    canned_start(&c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", c.port);
    rq.url = url;
    rq.max_body_bytes = 5;
    assert_int_equal(http_client_request(&rq, &r), 0);
    pthread_join(c.th, NULL);
    close(c.listen_fd);
    assert_string_equal(r.body, "hello");
    http_client_response_free(&r);
}

static void test_bad_urls(void **state)
{
    const char *bad[] = {"https://127.0.0.1/", "http://", "http://h:123456/", "http://h:80x/", "http://[::1/"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct http_client_response r;
        struct http_client_request rq = {.url = bad[i], .method = "GET"};
        if (http_client_request(&rq, &r) != -EINVAL) fail_msg("accepted %s", bad[i]);
        http_client_response_free(&r);
    }
    /* Nothing listens on port 1. */
    struct http_client_response r;
    struct http_client_request rq = {.url = "http://127.0.0.1:1/", .method = "GET", .timeout_ms = 2000};
    assert_true(http_client_request(&rq, &r) < 0);
    http_client_response_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_content_length),
        cmocka_unit_test(test_chunked),
        cmocka_unit_test(test_close_delimited),
        cmocka_unit_test(test_bad_urls),
        cmocka_unit_test(test_body_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
