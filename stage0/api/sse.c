#include "stage0/api/sse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/error.h"

int sse_base64_append(struct audio_buf *out, const uint8_t *data, size_t n)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = (n + 2) / 3 * 4;
    int rc = audio_buf_reserve(out, len);
    if (rc < 0) return rc;
    char *o = (char *)out->data + out->len;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)data[i] << 16 | (uint32_t)data[i + 1] << 8 | data[i + 2];
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = alphabet[(v >> 6) & 63];
        *o++ = alphabet[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)data[i] << 16 | (i + 1 < n ? (uint32_t)data[i + 1] << 8 : 0);
        *o++ = alphabet[v >> 18];
        *o++ = alphabet[(v >> 12) & 63];
        *o++ = i + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    out->len += len;
    return 0;
}

static int append_str(struct audio_buf *out, const char *s)
{
    return audio_buf_append(out, s, strlen(s));
}

/* "event: NAME\ndata: " + compact JSON of o + "\n\n"; takes o. */
static int append_event(struct audio_buf *out, const char *name, json_t *o)
{
    char *json = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!json) return mm3_errorf(-ENOMEM, "sse: out of memory for the %s event", name);
    int rc = append_str(out, "event: ");
    if (rc == 0) rc = append_str(out, name);
    if (rc == 0) rc = append_str(out, "\ndata: ");
    if (rc == 0) rc = append_str(out, json);
    if (rc == 0) rc = append_str(out, "\n\n");
    free(json);
    return rc;
}

int sse_audio_delta(struct audio_buf *out, const uint8_t *audio, size_t n)
{
    if (n == 0) return 0;
    /* Built by hand around the base64: a JSON library would copy megabytes twice. */
    int rc = append_str(out, "event: speech.audio.delta\ndata: {\"type\":\"speech.audio.delta\",\"audio\":\"");
    if (rc == 0) rc = sse_base64_append(out, audio, n);
    if (rc == 0) rc = append_str(out, "\"}\n\n");
    return rc;
}

int sse_audio_done(struct audio_buf *out, int64_t input_tokens, int64_t output_tokens)
{
    json_t *o = json_pack("{s:s, s:{s:I, s:I, s:I}}", "type", "speech.audio.done", "usage", "input_tokens",
                          (json_int_t)input_tokens, "output_tokens", (json_int_t)output_tokens, "total_tokens",
                          (json_int_t)(input_tokens + output_tokens));
    return append_event(out, "speech.audio.done", o);
}

int sse_audio_error(struct audio_buf *out, int status, const char *message)
{
    const char *fmt = "{s:s, s:{s:s, s:s, s:n, s:i}}";
    json_t *o = json_pack(fmt, "type", "speech.audio.error", "error", "message", message ? message : "", "type",
                          "server_error", "param", "code", status);
    if (!o) /* a message that is not UTF-8 */
        o = json_pack(fmt, "type", "speech.audio.error", "error", "message", "the song failed (see the server log)",
                      "type", "server_error", "param", "code", status);
    return append_event(out, "speech.audio.error", o);
}
