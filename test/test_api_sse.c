/* Server-sent events for stream_format "sse": base64 against RFC 4648's vectors, the exact
 * bytes of each event, and over HTTP against the fake engine: the deltas' audio is the raw
 * stream's bytes, done carries the usage, a failure mid-song ends with an error event, and
 * stream_format "audio" streams raw bytes without `stream`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>

#include "stage0/api/sse.h"
#include "test_api_fake.h"

static char *text_of(struct audio_buf *b)
{
    audio_buf_append(b, "", 1);
    b->len--;
    return (char *)b->data;
}

static void test_base64_vectors(void **state)
{
    static const char *const in[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const want[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        struct audio_buf b = {0};
        assert_int_equal(sse_base64_append(&b, (const uint8_t *)in[i], strlen(in[i])), 0);
        assert_string_equal(text_of(&b), want[i]);
        audio_buf_free(&b);
    }
    /* every byte value, through the high bits */
    const uint8_t bin[] = {0x00, 0xff, 0xfe, 0x80, 0x7f};
    struct audio_buf b = {0};
    assert_int_equal(sse_base64_append(&b, bin, sizeof bin), 0);
    assert_string_equal(text_of(&b), "AP/+gH8=");
    audio_buf_free(&b);
}

static void test_event_framing(void **state)
{
    struct audio_buf b = {0};
    assert_int_equal(sse_audio_delta(&b, (const uint8_t *)"foo", 3), 0);
    assert_string_equal(text_of(&b),
                        "event: speech.audio.delta\ndata: {\"type\":\"speech.audio.delta\",\"audio\":\"Zm9v\"}\n\n");
    b.len = 0;
    assert_int_equal(sse_audio_delta(&b, NULL, 0), 0); /* no audio, no event */
    assert_int_equal(b.len, 0);
    assert_int_equal(sse_audio_done(&b, 120, 500), 0);
    assert_string_equal(text_of(&b), "event: speech.audio.done\ndata: {\"type\":\"speech.audio.done\",\"usage\":"
                                     "{\"input_tokens\":120,\"output_tokens\":500,\"total_tokens\":620}}\n\n");
    b.len = 0;
    assert_int_equal(sse_audio_error(&b, 500, "stage 1 died\nline two \"quoted\""), 0);
    assert_string_equal(text_of(&b), "event: speech.audio.error\ndata: {\"type\":\"speech.audio.error\",\"error\":"
                                     "{\"message\":\"stage 1 died\\nline two \\\"quoted\\\"\",\"type\":"
                                     "\"server_error\",\"param\":null,\"code\":500}}\n\n");
    b.len = 0;
    assert_int_equal(sse_audio_error(&b, 500, "\xff not UTF-8"), 0); /* still one valid event */
    assert_non_null(strstr(text_of(&b), "\"message\":\"the song failed"));
    audio_buf_free(&b);
}

struct sse_event {
    char name[64];
    json_t *data;
};

/* Split a body into its events: each is "event: NAME\ndata: JSON\n\n", nothing else. */
static int parse_events(const char *body, size_t len, struct sse_event *ev, int max)
{
    int n = 0;
    const char *p = body, *end = body + len;
    while (p < end) {
        if (n == max) fail_msg("more than %d events", max);
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || strncmp(p, "event: ", 7) != 0) fail_msg("event %d: no 'event:' line", n);
        snprintf(ev[n].name, sizeof ev[n].name, "%.*s", (int)(nl - p - 7), p + 7);
        p = nl + 1;
        nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl || strncmp(p, "data: ", 6) != 0 || nl + 1 >= end || nl[1] != '\n')
            fail_msg("event %d (%s): no 'data:' line ended by an empty line", n, ev[n].name);
        json_error_t err;
        ev[n].data = json_loadb(p + 6, (size_t)(nl - p - 6), 0, &err);
        if (!ev[n].data) fail_msg("event %d: data is not JSON: %s", n, err.text);
        assert_string_equal(json_string_value(json_object_get(ev[n].data, "type")), ev[n].name);
        p = nl + 2;
        n++;
    }
    return n;
}

static int b64_value(char c)
{
    const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *f = c ? strchr(a, c) : NULL;
    return f ? (int)(f - a) : -1;
}

/* A decoder written apart from the encoder, appending to out. */
static void b64_decode(const char *s, struct audio_buf *out)
{
    size_t n = strlen(s);
    assert_int_equal(n % 4, 0);
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++)
            v[k] = s[i + k] == '=' ? 0 : b64_value(s[i + k]);
        for (int k = 0; k < 4; k++)
            assert_true(v[k] >= 0);
        uint8_t b[3] = {(uint8_t)(v[0] << 2 | v[1] >> 4), (uint8_t)(v[1] << 4 | v[2] >> 2), (uint8_t)(v[2] << 6 | v[3])};
        size_t take = s[i + 2] == '=' ? 1 : s[i + 3] == '=' ? 2 : 3;
        audio_buf_append(out, b, take);
    }
}

#define SONG "{\"input\":\"[verse]\\nla la\",\"instructions\":\"lo-fi\",\"max_new_tokens\":500"

static void test_sse_over_http(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    fx->fe.delay_ms = 5;
    static const char *const formats[] = {"pcm", "wav", "mp3"};
    for (int k = 0; k < 3; k++) {
        char body[256];
        struct http_client_response raw, sse;
        snprintf(body, sizeof body, SONG ",\"response_format\":\"%s\",\"stream\":true}", formats[k]);
        assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", body, &raw), 0);
        snprintf(body, sizeof body, SONG ",\"response_format\":\"%s\",\"stream_format\":\"sse\"}", formats[k]);
        assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", body, &sse), 0);
        assert_int_equal(sse.status, 200);
        assert_true(sse.chunked && sse.complete);
        assert_string_equal(http_client_header(&sse, "content-type"), "text/event-stream");
        assert_non_null(http_client_header(&sse, "x-request-id"));
        struct sse_event ev[64];
        int n = parse_events(sse.body, sse.body_len, ev, 64);
        assert_true(n >= 3); /* five windows of audio: several deltas, then done */
        struct audio_buf audio = {0};
        for (int i = 0; i < n - 1; i++) {
            assert_string_equal(ev[i].name, "speech.audio.delta");
            assert_int_equal(json_object_size(ev[i].data), 2);
            b64_decode(json_string_value(json_object_get(ev[i].data, "audio")), &audio);
        }
        assert_string_equal(ev[n - 1].name, "speech.audio.done");
        json_t *usage = json_object_get(ev[n - 1].data, "usage");
        assert_int_equal(json_integer_value(json_object_get(usage, "output_tokens")), 500); /* frames made */
        assert_int_equal(json_integer_value(json_object_get(usage, "input_tokens")), 0);    /* fake engine */
        assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 500);
        /* the deltas carry the raw stream's bytes exactly */
        assert_int_equal(audio.len, raw.body_len);
        assert_memory_equal(audio.data, raw.body, raw.body_len);
        for (int i = 0; i < n; i++)
            json_decref(ev[i].data);
        audio_buf_free(&audio);
        http_client_response_free(&raw);
        http_client_response_free(&sse);
    }

    /* stream_format "audio" streams raw bytes even without `stream` (vLLM-Omni's switch) */
    struct http_client_response whole, st;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"response_format\":\"pcm\"}", &whole), 0);
    assert_int_equal(
        do_request(fx, "POST", "/v1/audio/speech", SONG ",\"response_format\":\"pcm\",\"stream_format\":\"audio\"}", &st),
        0);
    assert_int_equal(st.status, 200);
    assert_true(st.chunked && st.complete);
    assert_string_equal(http_client_header(&st, "content-type"), "audio/pcm");
    assert_int_equal(st.body_len, whole.body_len);
    assert_memory_equal(st.body, whole.body, whole.body_len);
    http_client_response_free(&whole);
    http_client_response_free(&st);

    /* anything else is a 400 naming the field */
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"stream_format\":\"websocket\"}", &st), 0);
    assert_int_equal(st.status, 400);
    assert_non_null(strstr(st.body, "\"param\":\"stream_format\""));
    http_client_response_free(&st);
    fixture_stop(fx);
}

/* A song that fails after its first audio ends with speech.audio.error, not done, and the
 * stream itself ends properly (the event says it failed); one that fails before any audio
 * still gets its HTTP status. */
static void test_sse_failures(void **state)
{
    struct fixture *fx = fixture_start(FAKE_FAIL_MID, 0);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"stream_format\":\"sse\"}", &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(r.complete);
    struct sse_event ev[16];
    int n = parse_events(r.body, r.body_len, ev, 16);
    assert_true(n >= 2);
    for (int i = 0; i < n - 1; i++)
        assert_string_equal(ev[i].name, "speech.audio.delta");
    assert_string_equal(ev[n - 1].name, "speech.audio.error");
    json_t *e = json_object_get(ev[n - 1].data, "error");
    assert_int_equal(json_integer_value(json_object_get(e, "code")), 500);
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "stage 1 died"));
    for (int i = 0; i < n; i++)
        json_decref(ev[i].data);
    http_client_response_free(&r);

    fx->fe.mode = FAKE_FAIL_EARLY;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"stream_format\":\"sse\"}", &r), 0);
    assert_int_equal(r.status, 500);
    assert_string_equal(http_client_header(&r, "content-type"), "application/json");
    http_client_response_free(&r);
    fixture_stop(fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64_vectors),
        cmocka_unit_test(test_event_framing),
        cmocka_unit_test(test_sse_over_http),
        cmocka_unit_test(test_sse_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
