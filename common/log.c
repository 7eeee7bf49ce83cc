#include "common/log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static const char *log_tag = "mm3";
static int log_level = -1;

void mm3_log_set_tag(const char *tag) { log_tag = tag; }
void mm3_log_set_level(enum mm3_log_level level) { log_level = (int)level; }

enum mm3_log_level mm3_log_level(void)
{
    if (log_level < 0) {
        const char *s = getenv("MM3_LOG_LEVEL");
        log_level = MM3_LOG_INFO;
        if (s) {
            if (!strcasecmp(s, "error")) log_level = MM3_LOG_ERROR;
            else if (!strcasecmp(s, "warn")) log_level = MM3_LOG_WARN;
            else if (!strcasecmp(s, "debug")) log_level = MM3_LOG_DEBUG;
        }
    }
    return (enum mm3_log_level)log_level;
}

static bool needs_escape(unsigned char c, bool high)
{
    return c < 0x20 || c == 0x7f || (high && (c == '\\' || c >= 0x80));
}

/* Escape src[0..n) into dst (cap > 4); returns the length written. */
static size_t escape_into(char *dst, size_t cap, const char *src, size_t n, bool high)
{
    static const char hex[] = "0123456789abcdef";
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += needs_escape((unsigned char)src[i], high) ? 4 : 1;
    bool cut = total >= cap;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)src[i];
        size_t need = needs_escape(c, high) ? 4 : 1;
        if (cut && o + need + 3 >= cap) { /* room for "..." and the NUL */
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        if (need == 4) {
            dst[o++] = '\\';
            dst[o++] = 'x';
            dst[o++] = hex[c >> 4];
            dst[o++] = hex[c & 15];
        } else {
            dst[o++] = (char)c;
        }
    }
    dst[o] = 0;
    return o;
}

const char *mm3_log_escape(char *dst, size_t cap, const char *src)
{
    if (cap == 0) return dst;
    if (cap < 8 || !src) {
        dst[0] = 0;
        return dst;
    }
    escape_into(dst, cap, src, strlen(src), true);
    return dst;
}

void mm3_log_write(enum mm3_log_level level, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    if ((int)level > (int)mm3_log_level())
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "%s[%d] %lld.%03ld %-5s %s:%d: ", log_tag, (int)getpid(),
                     (long long)ts.tv_sec, ts.tv_nsec / 1000000, names[level], base, line);
    if (n < 0) n = 0;
    if (n > (int)sizeof buf - 16) n = (int)sizeof buf - 16;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m < 0) m = 0;
    if (m > (int)sizeof msg - 1) m = (int)sizeof msg - 1;
    /* One call, one line, whatever the message holds. */
    n += (int)escape_into(buf + n, sizeof buf - (size_t)n - 1, msg, (size_t)m, false);
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}
