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
    snprintf(error_message, sizeof error_message, "%s%s", prefix, old);
    return code;
}

const char *mm3_last_error(void) { return error_message; }

void mm3_error_clear(void) { error_message[0] = 0; }
