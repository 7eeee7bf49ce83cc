/* One logger for every process: level, stage tag, pid, monotonic ms, file:line,
 * one write(2) per line so lines of the two stages never interleave.
 * Level from MM3_LOG_LEVEL (error|warn|info|debug), default info.
 * A call is always one line: control characters in the formatted message are
 * written as \xNN. Text taken from a request goes through mm3_log_escape first. */
#ifndef MM3_LOG_H
#define MM3_LOG_H

#include <stdlib.h>

enum mm3_log_level { MM3_LOG_ERROR = 0, MM3_LOG_WARN, MM3_LOG_INFO, MM3_LOG_DEBUG };

/* Tag printed on every line, e.g. "stage0". Not copied: pass a literal. */
void mm3_log_set_tag(const char *tag);
void mm3_log_set_level(enum mm3_log_level level);
enum mm3_log_level mm3_log_level(void);
void mm3_log_write(enum mm3_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Copy `src` into `dst` (cap bytes, always NUL-terminated) for a log line:
 * control characters, backslash and bytes >= 0x7f become \xNN, so a client
 * cannot forge lines or smuggle terminal escapes into the log. Text that does
 * not fit is cut and ends with "...". Returns dst. */
const char *mm3_log_escape(char *dst, size_t cap, const char *src);

#define LOG_ERROR(...) mm3_log_write(MM3_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...)  mm3_log_write(MM3_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_INFO(...)  mm3_log_write(MM3_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_DEBUG(...) do { if (mm3_log_level() >= MM3_LOG_DEBUG) \
        mm3_log_write(MM3_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__); } while (0)

/* Always-on invariant check (independent of NDEBUG): a broken invariant is a bug,
 * never bad input; bad input gets an mm3_errorf() return instead. */
#define CHECK(cond) do { if (!(cond)) { \
        mm3_log_write(MM3_LOG_ERROR, __FILE__, __LINE__, "CHECK failed: %s", #cond); \
        abort(); } } while (0)

#endif
