/* Python `str` semantics on UTF-8 text, for the prompt contract.
 *
 * The reference cleans captions and lyrics with Python string methods and `re`
 * on `str` objects, so "whitespace", "line boundary" and "lower case" here mean
 * exactly what CPython means: str.isspace(), str.splitlines(), str.strip(),
 * str.split(None, 1) and the full str.lower() (SpecialCasing, final sigma).
 * Every function expects valid UTF-8 (check it first with pystr_utf8_check). */
#ifndef MM3_PROMPT_PYSTR_H
#define MM3_PROMPT_PYSTR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The code points of str.isspace() (and of `\s` in a Python `str` pattern), as the
 * body of a PCRE2 character class (no brackets), so patterns can say [PYSTR_WS_CLASS]. */
#define PYSTR_WS_CLASS \
    "\\t\\n\\x{0B}\\f\\r\\x{1C}-\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}" \
    "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* A growable byte buffer, always NUL-terminated once something was appended. */
struct pystr_buf {
    char *p;
    size_t len;
    size_t cap;
};

int pystr_buf_append(struct pystr_buf *b, const char *s, size_t n);
int pystr_buf_append_cp(struct pystr_buf *b, uint32_t cp);
/* Hand the bytes to the caller (an empty buffer gives ""); the buffer is reset. */
char *pystr_buf_take(struct pystr_buf *b);
void pystr_buf_free(struct pystr_buf *b);

/* 0 if s[0..n) is valid UTF-8 (no overlong forms, no surrogates, <= U+10FFFF),
 * else -EINVAL with a message naming `field` and the byte offset. */
int pystr_utf8_check(const char *s, size_t n, const char *field);

/* Decode the code point at s[*i] (valid UTF-8, *i < n) and advance *i. */
uint32_t pystr_next_cp(const char *s, size_t n, size_t *i);
/* Start of the code point that ends right before s[i] (i > 0). */
size_t pystr_prev_start(const char *s, size_t i);

bool pystr_isspace(uint32_t cp);
/* A boundary of str.splitlines() (CR LF is one boundary, handled by pystr_splitlines). */
bool pystr_is_linebreak(uint32_t cp);

/* str.strip() / str.rstrip(): the kept range is s[*start..*end). */
void pystr_strip(const char *s, size_t n, size_t *start, size_t *end);
void pystr_rstrip(const char *s, size_t n, size_t *end);

/* str.splitlines() without keepends: calls fn(ctx, line, len) per line; stops at
 * and returns the first nonzero result of fn. */
int pystr_splitlines(const char *s, size_t n, int (*fn)(void *ctx, const char *line, size_t len),
                     void *ctx);

/* str.split(None, 1) on s[0..n): *n_parts is 0, 1 or 2; part i is s[off[i]..off[i]+len[i]). */
void pystr_split1(const char *s, size_t n, int *n_parts, size_t off[2], size_t len[2]);

/* Append str.lower() of s[0..n) to out. */
int pystr_lower_append(struct pystr_buf *out, const char *s, size_t n);

/* str.replace(old, new) (all non-overlapping occurrences, left to right) into a new string. */
int pystr_replace(const char *s, size_t n, const char *old, const char *new_, char **out, size_t *out_len);

#endif
