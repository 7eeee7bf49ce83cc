#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char error_message[2048];

int mm3_errorf(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return code;
}

int mm3_error_prefix(int code, const char *fmt, ...)
{
    char prefix[512], old[sizeof error_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_message, sizeof old);
    /* The prefix (under 512 bytes) always fits; the old message is cut to the rest. */
    size_t n = strlen(prefix);
    size_t rest = strnlen(old, sizeof error_message - 1 - n);
    memcpy(error_message, prefix, n);
    memcpy(error_message + n, old, rest);
    error_message[n + rest] = 0;
    return code;
}

const char *mm3_last_error(void) { return error_message; }

void mm3_error_clear(void) { error_message[0] = 0; }
