/* Python `str` semantics on UTF-8 (see prompt_pystr.h). Character properties come
 * from utf8proc; the few properties it lacks (Python's whitespace set, the line
 * boundaries of splitlines, Cased / Case_Ignorable for the final-sigma rule) are
 * spelled out below from the Unicode Character Database. */
#include "stage0/text/prompt_pystr.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"

/* ---- buffer ---- */

static int buf_reserve(struct pystr_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2) return mm3_errorf(-ENOMEM, "text buffer: size overflow");
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return mm3_errorf(-ENOMEM, "text buffer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return 0;
}

int pystr_buf_append(struct pystr_buf *b, const char *s, size_t n)
{
    int rc = buf_reserve(b, n);
    if (rc < 0) return rc;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int pystr_buf_append_cp(struct pystr_buf *b, uint32_t cp)
{
    utf8proc_uint8_t enc[4];
    utf8proc_ssize_t n = utf8proc_encode_char((utf8proc_int32_t)cp, enc);
    return pystr_buf_append(b, (const char *)enc, (size_t)n);
}

char *pystr_buf_take(struct pystr_buf *b)
{
    if (!b->p && pystr_buf_append(b, "", 0) < 0) return NULL;
    char *p = b->p;
    memset(b, 0, sizeof *b);
    return p;
}

void pystr_buf_free(struct pystr_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- UTF-8 ---- */

int pystr_utf8_check(const char *s, size_t n, const char *field)
{
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        /* utf8proc_iterate rejects overlong forms, surrogates, truncated sequences
         * and anything past U+10FFFF. */
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return mm3_errorf(-EINVAL, "%s: invalid UTF-8 at byte %zu (byte 0x%02x): expected UTF-8 text",
                              field, i, (unsigned)(unsigned char)s[i]);
        i += (size_t)k;
    }
    return 0;
}

uint32_t pystr_next_cp(const char *s, size_t n, size_t *i)
{
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { /* callers validate first; never loop forever on a bug */
        *i += 1;
        return 0xFFFD;
    }
    *i += (size_t)k;
    return (uint32_t)cp;
}

size_t pystr_prev_start(const char *s, size_t i)
{
    do {
        i--;
    } while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

/* ---- character classes ---- */

bool pystr_isspace(uint32_t cp)
{
    /* CPython: bidirectional class WS, B or S, or category Zs. Unlike Unicode's
     * White_Space this includes U+001C..U+001F. */
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool pystr_is_linebreak(uint32_t cp)
{
    return (cp >= 0x0A && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 || cp == 0x2028 ||
           cp == 0x2029;
}

void pystr_rstrip(const char *s, size_t n, size_t *end)
{
    size_t e = n;
    while (e > 0) {
        size_t b = pystr_prev_start(s, e), j = b;
        if (!pystr_isspace(pystr_next_cp(s, n, &j))) break;
        e = b;
    }
    *end = e;
}

void pystr_strip(const char *s, size_t n, size_t *start, size_t *end)
{
    size_t b = 0;
    while (b < n) {
        size_t j = b;
        if (!pystr_isspace(pystr_next_cp(s, n, &j))) break;
        b = j;
    }
    size_t e;
    pystr_rstrip(s + b, n - b, &e);
    *start = b;
    *end = b + e;
}

int pystr_splitlines(const char *s, size_t n, int (*fn)(void *ctx, const char *line, size_t len),
                     void *ctx)
{
    size_t line = 0, i = 0;
    while (i < n) {
        size_t at = i;
        uint32_t cp = pystr_next_cp(s, n, &i);
        if (!pystr_is_linebreak(cp)) continue;
        if (cp == '\r' && i < n && s[i] == '\n') i++;
        int rc = fn(ctx, s + line, at - line);
        if (rc) return rc;
        line = i;
    }
    /* A trailing boundary does not open an empty last line. */
    if (line < n) return fn(ctx, s + line, n - line);
    return 0;
}

void pystr_split1(const char *s, size_t n, int *n_parts, size_t off[2], size_t len[2])
{
    size_t i = 0;
    *n_parts = 0;
    while (i < n) { /* skip leading whitespace */
        size_t j = i;
        if (!pystr_isspace(pystr_next_cp(s, n, &j))) break;
        i = j;
    }
    if (i == n) return;
    size_t w = i;
    while (i < n) { /* first word */
        size_t j = i;
        if (pystr_isspace(pystr_next_cp(s, n, &j))) break;
        i = j;
    }
    off[0] = w;
    len[0] = i - w;
    *n_parts = 1;
    while (i < n) { /* the remainder keeps its trailing whitespace, like CPython */
        size_t j = i;
        if (!pystr_isspace(pystr_next_cp(s, n, &j))) break;
        i = j;
    }
    if (i == n) return;
    off[1] = i;
    len[1] = n - i;
    *n_parts = 2;
}

/* ---- lower case ---- */

struct cp_range {
    uint32_t lo, hi;
};

static bool in_ranges(uint32_t cp, const struct cp_range *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cp >= r[i].lo && cp <= r[i].hi) return true;
    return false;
}

/* Unicode Other_Lowercase / Other_Uppercase (PropList.txt, 15.0): Cased is
 * Lu + Ll + Lt + these. */
static const struct cp_range other_case[] = {
    {0x00AA, 0x00AA}, {0x00BA, 0x00BA}, {0x02B0, 0x02B8}, {0x02C0, 0x02C1}, {0x02E0, 0x02E4},
    {0x0345, 0x0345}, {0x037A, 0x037A}, {0x10FC, 0x10FC}, {0x1D2C, 0x1D6A}, {0x1D78, 0x1D78},
    {0x1D9B, 0x1DBF}, {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C}, {0x2160, 0x217F},
    {0x24B6, 0x24E9}, {0x2C7C, 0x2C7D}, {0xA69C, 0xA69D}, {0xA770, 0xA770}, {0xA7F2, 0xA7F4},
    {0xA7F8, 0xA7F9}, {0xAB5C, 0xAB5F}, {0xAB69, 0xAB69}, {0x10780, 0x10780}, {0x10783, 0x10785},
    {0x10787, 0x107B0}, {0x107B2, 0x107BA}, {0x1E030, 0x1E06D}, {0x1F130, 0x1F149},
    {0x1F150, 0x1F169}, {0x1F170, 0x1F189},
};

/* Word_Break MidLetter, MidNumLet and Single_Quote: the part of Case_Ignorable
 * that is not a general category. */
static const struct cp_range word_break_mid[] = {
    {0x0027, 0x0027}, {0x002E, 0x002E}, {0x003A, 0x003A}, {0x00B7, 0x00B7}, {0x0387, 0x0387},
    {0x055F, 0x055F}, {0x05F4, 0x05F4}, {0x2018, 0x2019}, {0x2024, 0x2024}, {0x2027, 0x2027},
    {0xFE13, 0xFE13}, {0xFE52, 0xFE52}, {0xFE55, 0xFE55}, {0xFF07, 0xFF07}, {0xFF0E, 0xFF0E},
    {0xFF1A, 0xFF1A},
};

static bool is_cased(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           in_ranges(cp, other_case, sizeof other_case / sizeof other_case[0]);
}

static bool is_case_ignorable(uint32_t cp)
{
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK ||
           in_ranges(cp, word_break_mid, sizeof word_break_mid / sizeof word_break_mid[0]);
}

/* CPython's handle_capital_sigma: U+03A3 lowers to final U+03C2 when preceded by
 * a cased letter and not followed by one (case-ignorable characters skipped). */
static uint32_t lower_sigma(const char *s, size_t n, size_t at, size_t after)
{
    bool cased_before = false;
    for (size_t i = at; i > 0;) {
        i = pystr_prev_start(s, i);
        size_t j = i;
        uint32_t cp = pystr_next_cp(s, n, &j);
        if (is_case_ignorable(cp)) continue;
        cased_before = is_cased(cp);
        break;
    }
    if (!cased_before) return 0x3C3;
    for (size_t i = after; i < n;) {
        uint32_t cp = pystr_next_cp(s, n, &i);
        if (is_case_ignorable(cp)) continue;
        return is_cased(cp) ? 0x3C3 : 0x3C2;
    }
    return 0x3C2;
}

int pystr_lower_append(struct pystr_buf *out, const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t at = i;
        uint32_t cp = pystr_next_cp(s, n, &i);
        int rc;
        if (cp == 0x130) /* the only unconditional multi-character lower mapping */
            rc = pystr_buf_append(out, "i\xCC\x87", 3);
        else if (cp == 0x3A3)
            rc = pystr_buf_append_cp(out, lower_sigma(s, n, at, i));
        else
            rc = pystr_buf_append_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
        if (rc < 0) return rc;
    }
    return 0;
}

int pystr_replace(const char *s, size_t n, const char *old, const char *new_, char **out, size_t *out_len)
{
    struct pystr_buf b = {0};
    size_t lo = strlen(old), ln = strlen(new_), i = 0;
    int rc = 0;
    /* old is valid UTF-8, so a byte match always starts on a character boundary. */
    while (i < n && rc == 0) {
        const char *hit = lo ? memmem(s + i, n - i, old, lo) : NULL;
        if (!hit) {
            rc = pystr_buf_append(&b, s + i, n - i);
            break;
        }
        rc = pystr_buf_append(&b, s + i, (size_t)(hit - (s + i)));
        if (rc == 0) rc = pystr_buf_append(&b, new_, ln);
        i = (size_t)(hit - s) + lo;
    }
    if (rc < 0) {
        pystr_buf_free(&b);
        return rc;
    }
    *out_len = b.len;
    *out = pystr_buf_take(&b);
    return *out ? 0 : mm3_errorf(-ENOMEM, "text buffer: out of memory");
}
