#include "common/log.h"

#include <stdarg.h>
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
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) m = 0;
    n += m;
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
    (void)w;
}
