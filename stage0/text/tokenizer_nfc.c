/* HF-compatible NFC (see tokenizer_nfc.h). */
#include "stage0/text/tokenizer_nfc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <utf8proc.h>

#include "common/error.h"
#include "stage0/text/prompt_pystr.h"

/* Characters added after Unicode 9.0 (up to utf8proc's 15.0) that have a nonzero
 * combining class, a canonical decomposition, or take part in a composition.
 * Found by comparing utf8proc with HF `tokenizers` 0.23 on every code point. */
static const struct {
    uint32_t lo, hi;
} newer_than_hf[] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},     {0xC3C, 0xC3C},
    {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},   {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},
    {0xA82C, 0xA82C},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938}, {0x1193D, 0x1193E}, {0x11943, 0x11943},
    {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42},
    {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F},
    {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
};

static bool is_newer_than_hf(uint32_t cp)
{
    size_t lo = 0, hi = sizeof newer_than_hf / sizeof newer_than_hf[0];
    if (cp < newer_than_hf[0].lo) return false;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < newer_than_hf[mid].lo) hi = mid;
        else if (cp > newer_than_hf[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

/* Stable sort of one run of nonzero combining classes: counting sort, so a run of any
 * length costs linear time (utf8proc's own reordering is quadratic in the run). */
static void sort_marks(utf8proc_int32_t *cp, size_t n, utf8proc_int32_t *tmp)
{
    if (n < 2) return;
    size_t count[257] = {0};
    for (size_t i = 0; i < n; i++)
        count[utf8proc_get_property(cp[i])->combining_class + 1]++;
    for (int c = 1; c < 257; c++)
        count[c] += count[c - 1];
    for (size_t i = 0; i < n; i++)
        tmp[count[utf8proc_get_property(cp[i])->combining_class]++] = cp[i];
    for (size_t i = 0; i < n; i++)
        cp[i] = tmp[i];
}

/* Canonical decomposition of s[0..n) into cp (caller frees), each run of combining
 * marks in canonical order: what utf8proc_decompose gives, without its quadratic sort. */
static int decompose(const char *s, size_t n, utf8proc_int32_t **out, size_t *out_len)
{
    size_t cap = n + 16, len = 0;
    utf8proc_int32_t *cp = malloc(sizeof *cp * cap);
    if (!cp) return mm3_errorf(-ENOMEM, "text: out of memory for NFC");
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t c;
        utf8proc_ssize_t used = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (used < 0) {
            free(cp);
            return mm3_errorf(-EINVAL, "text: NFC normalisation failed: %s", utf8proc_errmsg(used));
        }
        i += (size_t)used;
        if (cap - len < 32) { /* no canonical decomposition is longer than 4 code points */
            utf8proc_int32_t *g = realloc(cp, sizeof *cp * (cap *= 2));
            if (!g) {
                free(cp);
                return mm3_errorf(-ENOMEM, "text: out of memory for NFC");
            }
            cp = g;
        }
        int boundclass = 0;
        utf8proc_ssize_t r = utf8proc_decompose_char(c, cp + len, (utf8proc_ssize_t)(cap - len),
                                                     UTF8PROC_STABLE | UTF8PROC_COMPOSE, &boundclass);
        if (r < 0 || (size_t)r > cap - len) {
            free(cp);
            return mm3_errorf(-EINVAL, "text: NFC normalisation failed: %s",
                              utf8proc_errmsg(r < 0 ? r : UTF8PROC_ERROR_OVERFLOW));
        }
        len += (size_t)r;
    }
    utf8proc_int32_t *tmp = malloc(sizeof *tmp * (len ? len : 1));
    if (!tmp) {
        free(cp);
        return mm3_errorf(-ENOMEM, "text: out of memory for NFC");
    }
    for (size_t a = 0; a < len;) {
        if (!utf8proc_get_property(cp[a])->combining_class) {
            a++;
            continue;
        }
        size_t b = a;
        while (b < len && utf8proc_get_property(cp[b])->combining_class)
            b++;
        sort_marks(cp + a, b - a, tmp);
        a = b;
    }
    free(tmp);
    *out = cp;
    *out_len = len;
    return 0;
}

static int nfc_append(struct pystr_buf *out, const char *s, size_t n)
{
    if (n == 0) return 0;
    utf8proc_int32_t *cp = NULL;
    size_t len = 0;
    int rc = decompose(s, n, &cp, &len);
    if (rc < 0) return rc;
    /* composes in place (linear: one pass with the last starter), then UTF-8 over the same buffer */
    utf8proc_ssize_t r = utf8proc_reencode(cp, (utf8proc_ssize_t)len, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (r < 0) rc = mm3_errorf(-EINVAL, "text: NFC normalisation failed: %s", utf8proc_errmsg(r));
    else rc = pystr_buf_append(out, (const char *)cp, (size_t)r);
    free(cp);
    return rc;
}

int tok_nfc(const char *s, size_t n, char **out, size_t *out_len)
{
    struct pystr_buf b = {0};
    size_t run = 0, i = 0;
    int rc = pystr_buf_append(&b, "", 0);
    while (i < n && rc == 0) {
        size_t at = i;
        if (!is_newer_than_hf(pystr_next_cp(s, n, &i))) continue;
        rc = nfc_append(&b, s + run, at - run);
        if (rc == 0) rc = pystr_buf_append(&b, s + at, i - at); /* kept as it is, as HF does */
        run = i;
    }
    if (rc == 0) rc = nfc_append(&b, s + run, n - run);
    if (rc < 0) {
        pystr_buf_free(&b);
        return rc;
    }
    *out_len = b.len;
    *out = pystr_buf_take(&b);
    return 0;
}
