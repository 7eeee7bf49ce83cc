/* Error reporting for library code.
 *
 * Library functions return 0 on success or a negative errno-style code, and
 * leave a human-readable message in a thread-local buffer:
 *
 *     if (bad) return mm3_errorf(-EINVAL, "%s: key 'x': expected integer", path);
 *     ...
 *     if (rc < 0) fprintf(stderr, "error: %s\n", mm3_last_error());
 *
 * Messages name the file, key or field and say what was expected. Only main()
 * decides to exit. */
#ifndef MM3_ERROR_H
#define MM3_ERROR_H

#include <errno.h>

/* Format a message into the thread's error buffer and return `code`. */
int mm3_errorf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepend context ("loading transformer: ") to the current message; returns `code`. */
int mm3_error_prefix(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The message of the last error on this thread ("" if none). */
const char *mm3_last_error(void);

void mm3_error_clear(void);

#endif
