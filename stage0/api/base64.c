#include "stage0/api/base64.h"

#include <errno.h>
#include <stdlib.h>

#include "common/error.h"

static const char k_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int base64_encode(const uint8_t *data, size_t n, char **out)
{
    char *s = malloc((n + 2) / 3 * 4 + 1);
    if (!s) return mm3_errorf(-ENOMEM, "base64: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)data[i] << 16 | (i + 1 < n ? (uint32_t)data[i + 1] << 8 : 0) |
                     (i + 2 < n ? data[i + 2] : 0);
        s[o++] = k_alphabet[v >> 18 & 63];
        s[o++] = k_alphabet[v >> 12 & 63];
        s[o++] = i + 1 < n ? k_alphabet[v >> 6 & 63] : '=';
        s[o++] = i + 2 < n ? k_alphabet[v & 63] : '=';
    }
    s[o] = 0;
    *out = s;
    return 0;
}

/* The 6-bit value of c, or -1. */
static int sextet(char c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int base64_decode(const char *s, size_t len, uint8_t **out, size_t *out_n)
{
    *out = NULL;
    *out_n = 0;
    if (len % 4)
        return mm3_errorf(-EINVAL, "not base64: %zu characters, expected a multiple of 4 (with '=' padding)", len);
    size_t pad = len >= 1 && s[len - 1] == '=' ? (len >= 2 && s[len - 2] == '=' ? 2 : 1) : 0;
    uint8_t *b = malloc(len / 4 * 3 + 1);
    if (!b) return mm3_errorf(-ENOMEM, "base64: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        uint32_t v = 0;
        for (size_t k = 0; k < 4; k++) {
            size_t at = i + k;
            int x = at >= len - pad ? 0 : sextet(s[at]);
            if (x < 0) {
                free(b);
                return mm3_errorf(-EINVAL, "not base64: character %zu is not in the base64 alphabet", at);
            }
            v = v << 6 | (uint32_t)x;
        }
        b[o++] = (uint8_t)(v >> 16);
        b[o++] = (uint8_t)(v >> 8);
        b[o++] = (uint8_t)v;
    }
    *out = b;
    *out_n = o - pad;
    return 0;
}
