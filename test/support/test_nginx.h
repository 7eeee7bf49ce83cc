/* A real nginx in front of served replicas for end-to-end tests: its configuration is
 * made from the shipped deploy/nginx/mm3.conf (the upstream's `server` lines and the
 * `listen` line rewritten to the test's addresses, everything else kept as shipped),
 * wrapped in a main file whose prefix, pid, logs and temp folders are all in the
 * test's folder, so it runs as any user, in the foreground, on an ephemeral port.
 *
 *     const char *bin = test_nginx_binary();          NULL: no nginx, skip
 *     struct test_nginx ng;                            upstreams: {"127.0.0.1:PORT", ...}
 *     test_nginx_start(&ng, bin, tmp, shipped_text, upstreams, 2);   (test_nginx_site_conf inside)
 *     ... requests to ng.url, test_nginx_access_line(&ng, "/v1/audio/speech?song=a") ...
 *     test_nginx_stop(&ng);
 *
 * Header only (static inline), like test_replica.h. */
#ifndef MM3_TEST_NGINX_H
#define MM3_TEST_NGINX_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/test_support.h"

/* The access log's fields, '|' apart: the URI names the request, $upstream_addr lists
 * every replica nginx tried for it ("A, B" when it went on to the next one). */
#define TEST_NGINX_LOG_FORMAT "'$request_uri|$status|$upstream_addr|$upstream_status|$body_bytes_sent'"

struct test_nginx {
    pid_t pid; /* 0: not running */
    char dir[1024];
    int port;
    char url[64]; /* http://127.0.0.1:PORT */
};

/* The nginx program: $MM3_NGINX, else nginx on PATH, else /usr/sbin/nginx (Debian's
 * place, not on an unprivileged user's PATH); NULL when none is executable. */
static inline const char *test_nginx_binary(void)
{
    static char found[1024];
    const char *env = getenv("MM3_NGINX");
    if (env && env[0]) return access(env, X_OK) == 0 ? env : NULL;
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s:/usr/sbin:/usr/local/sbin", path ? path : "/usr/bin:/bin");
    char *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(found, sizeof found, "%s/nginx", d);
        if (access(found, X_OK) == 0) return found;
    }
    return NULL;
}

/* Appends n bytes of s to the growing string *buf (len *len, capacity *cap); -1 on OOM. */
static inline int test_nginx_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 4096;
        while (c < *len + n + 1)
            c *= 2;
        char *b = realloc(*buf, c);
        if (!b) return -1;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

/* The shipped site configuration with its replicas and port replaced: inside
 * `upstream mm3 { }` the first `server ADDR OPTIONS;` line becomes one line per
 * upstream (each with the shipped OPTIONS) and the other `server` lines go; the one
 * `listen ...;` line becomes `listen 127.0.0.1:port;`. Every other line is kept as
 * shipped. 0 and *out (caller frees), or -1 with why naming what the shipped file
 * lacked (no upstream mm3, no server line in it, not exactly one listen line). */
static inline int test_nginx_site_conf(const char *shipped, const char *const *upstreams, int n_upstreams, int port,
                                       char **out, char *why, size_t why_cap)
{
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int in_upstream = 0, saw_upstream = 0, servers = 0, listens = 0, depth = 0, upstream_depth = 0;
    for (const char *line = shipped; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
        const char *p = line;
        while (p < line + n && (*p == ' ' || *p == '\t'))
            p++;
        size_t indent = (size_t)(p - line);
        int comment = *p == '#';
        char text[1024];
        int rc = 0;
        if (!comment && strncmp(p, "upstream mm3 {", 14) == 0) {
            in_upstream = saw_upstream = 1;
            upstream_depth = depth;
        }
        if (!comment && in_upstream && strncmp(p, "server ", 7) == 0) {
            servers++;
            if (servers == 1) {
                const char *addr_end = strpbrk(p + 7, " \t;");
                const char *stmt_end = strchr(p, ';');
                if (!addr_end || !stmt_end || stmt_end > line + n) {
                    snprintf(why, why_cap, "upstream mm3: a server line without ';'");
                    free(buf);
                    return -1;
                }
                for (int i = 0; i < n_upstreams && rc == 0; i++) {
                    int k = snprintf(text, sizeof text, "%.*sserver %s%.*s\n", (int)indent, line, upstreams[i],
                                     (int)(stmt_end + 1 - addr_end), addr_end);
                    rc = test_nginx_append(&buf, &len, &cap, text, (size_t)k);
                }
            }
        } else if (!comment && !in_upstream && strncmp(p, "listen ", 7) == 0) {
            listens++;
            int k = snprintf(text, sizeof text, "%.*slisten 127.0.0.1:%d;\n", (int)indent, line, port);
            rc = test_nginx_append(&buf, &len, &cap, text, (size_t)k);
        } else {
            rc = test_nginx_append(&buf, &len, &cap, line, n);
        }
        if (rc < 0) {
            free(buf);
            snprintf(why, why_cap, "out of memory");
            return -1;
        }
        if (!comment) {
            for (const char *c = p; c < line + n && *c != '#'; c++) {
                if (*c == '{') depth++;
                if (*c == '}' && --depth == upstream_depth) in_upstream = 0;
            }
        }
        line += n;
    }
    const char *missing = !saw_upstream  ? "no `upstream mm3 {` block"
                          : servers == 0 ? "no `server ADDR ...;` line in upstream mm3"
                          : listens != 1 ? "not exactly one `listen` line"
                                         : NULL;
    if (missing) {
        snprintf(why, why_cap, "%s", missing);
        free(buf);
        return -1;
    }
    *out = buf;
    return 0;
}

/* A port on 127.0.0.1 that was free a moment ago (the kernel's pick), or -1. */
static inline int test_nginx_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Whether something accepts TCP connections on 127.0.0.1:port. */
static inline int test_nginx_port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Writes dir/nginx.conf: the main settings that keep every file in dir, then the
 * site configuration inside `http { }`. 0 or -1. */
static inline int test_nginx_write_conf(const struct test_nginx *ng, const char *site)
{
    char path[1200], user[300] = "";
    snprintf(path, sizeof path, "%s/nginx.conf", ng->dir);
    /* Started by root, nginx's workers switch to `user` (by default nobody, who cannot
     * enter a private temporary folder): keep them as the test's user. */
    if (geteuid() == 0) {
        struct passwd *pw = getpwuid(geteuid());
        struct group *gr = getgrgid(getegid());
        if (pw && gr) snprintf(user, sizeof user, "user %s %s;\n", pw->pw_name, gr->gr_name);
    }
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    const char *d = ng->dir;
    fprintf(f,
            "# Made by the test from deploy/nginx/mm3.conf: everything in %s.\n"
            "daemon off;\n%sworker_processes 1;\npid %s/nginx.pid;\nerror_log %s/error.log info;\n"
            "events {\n    worker_connections 256;\n}\n"
            "http {\n"
            "    client_body_temp_path %s/client_body;\n    proxy_temp_path %s/proxy;\n"
            "    fastcgi_temp_path %s/fastcgi;\n    uwsgi_temp_path %s/uwsgi;\n    scgi_temp_path %s/scgi;\n"
            "    log_format mm3_test " TEST_NGINX_LOG_FORMAT ";\n"
            "    access_log %s/access.log mm3_test;\n"
            "%s"
            "}\n",
            d, user, d, d, d, d, d, d, d, d, site);
    return fclose(f) == 0 ? 0 : -1;
}

/* Starts nginx (bin) on the shipped site configuration with upstreams (host:port each)
 * in tmp/nginx, listening on a free port; 0 once it accepts connections (within 10 s),
 * else -1 with the reason on stderr (nginx's own output is in tmp/nginx/nginx.out). */
static inline int test_nginx_start(struct test_nginx *ng, const char *bin, const char *tmp, const char *shipped,
                                   const char *const *upstreams, int n_upstreams)
{
    memset(ng, 0, sizeof *ng);
    snprintf(ng->dir, sizeof ng->dir, "%s/nginx", tmp);
    mkdir(ng->dir, 0755);
    char logs[1200], out[1200], conf[1200];
    snprintf(logs, sizeof logs, "%s/logs", ng->dir); /* an upstream build's default log folder */
    mkdir(logs, 0755);
    snprintf(out, sizeof out, "%s/nginx.out", ng->dir);
    snprintf(conf, sizeof conf, "%s/nginx.conf", ng->dir);
    /* The port is free when picked, not when nginx binds it: try again on a clash. */
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = test_nginx_free_port();
        char *site = NULL, why[200];
        if (port < 0) return -1;
        if (test_nginx_site_conf(shipped, upstreams, n_upstreams, port, &site, why, sizeof why) < 0) {
            fprintf(stderr, "deploy/nginx/mm3.conf: %s\n", why);
            return -1;
        }
        int wrc = test_nginx_write_conf(ng, site);
        free(site);
        if (wrc < 0) return -1;
        pid_t p = fork();
        if (p < 0) return -1;
        if (p == 0) {
            int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fo < 0) _exit(126);
            dup2(fo, 1);
            dup2(fo, 2);
            execl(bin, bin, "-p", ng->dir, "-c", conf, (char *)NULL);
            _exit(127);
        }
        int st = 0;
        for (int i = 0; i < 100; i++) {
            if (waitpid(p, &st, WNOHANG) == p) {
                p = 0;
                break;
            }
            if (test_nginx_port_open(port)) {
                ng->pid = p;
                ng->port = port;
                snprintf(ng->url, sizeof ng->url, "http://127.0.0.1:%d", port);
                return 0;
            }
            test_sleep_ms(100);
        }
        char *text = test_file_read(out, NULL);
        int clash = text && strstr(text, "Address already in use");
        if (!clash)
            fprintf(stderr, "%s %s; its output (%s):\n%s\n", bin,
                    p ? "did not accept connections within 10 s" : "exited", out, text ? text : "(none)");
        free(text);
        if (p > 0) {
            kill(p, SIGKILL);
            waitpid(p, NULL, 0);
        }
        if (!clash) return -1;
    }
    return -1;
}

/* Fast shutdown (SIGTERM) of nginx; 0 when it exits 0 within 10 s, else -1 (killed). */
static inline int test_nginx_stop(struct test_nginx *ng)
{
    if (!ng->pid) return 0;
    kill(ng->pid, SIGTERM);
    int st = -1;
    for (int i = 0; i < 100; i++) {
        if (waitpid(ng->pid, &st, WNOHANG) == ng->pid) break;
        st = -1;
        test_sleep_ms(100);
    }
    if (st == -1) {
        kill(ng->pid, SIGKILL);
        waitpid(ng->pid, &st, 0);
        ng->pid = 0;
        return -1;
    }
    ng->pid = 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* The access-log line of the request for uri (without the newline; caller frees), or NULL. */
static inline char *test_nginx_access_line(const struct test_nginx *ng, const char *uri)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/access.log", ng->dir);
    char *log = test_file_read(path, NULL), *found = NULL;
    size_t ul = strlen(uri);
    for (char *line = log; line && *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (n > ul && strncmp(line, uri, ul) == 0 && line[ul] == '|') found = strndup(line, n);
        line = end ? end + 1 : line + n;
    }
    free(log);
    return found;
}

#endif
