/* The HTTP API end to end on loopback, against a fake engine that produces PCM
 * chunks from its own threads: whole-file and streamed answers carry the same
 * samples, capacity and size limits answer with the right codes, a client that
 * disconnects cancels its job exactly once, /health and /metrics answer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <FLAC/stream_decoder.h>
#include <jansson.h>

#include "common/http_client.h"
#include "common/metrics.h"
#include "stage0/api/http_server.h"

#include "test_api_fake.h"

static uint32_t le32(const void *p)
{
    const uint8_t *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint16_t le16(const void *p)
{
    const uint8_t *b = p;
    return (uint16_t)(b[0] | b[1] << 8);
}

/* PCM16 LE stereo data must equal the fake signal for n_frames frames. */
static void check_pcm(const uint8_t *data, size_t n_frames)
{
    for (size_t f = 0; f < n_frames; f++)
        for (int c = 0; c < 2; c++) {
            int16_t got = (int16_t)le16(data + (f * 2 + (size_t)c) * 2);
            int16_t want = wav_sample_pcm16(fake_sample(f, c));
            if (got != want) fail_msg("frame %zu ch %d: %d != %d", f, c, got, want);
        }
}

#define SONG "{\"input\":\"[verse]\\nla la\",\"instructions\":\"lo-fi\",\"max_new_tokens\":500"

static void test_whole_wav(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(r.complete);
    assert_string_equal(http_client_header(&r, "content-type"), "audio/wav");
    size_t n_frames = 5 * 4410, data = n_frames * 4;
    assert_int_equal(r.body_len, 44 + data);
    const uint8_t *b = (const uint8_t *)r.body;
    assert_memory_equal(b, "RIFF", 4);
    assert_int_equal(le32(b + 4), 36 + data);
    assert_memory_equal(b + 8, "WAVEfmt ", 8);
    assert_int_equal(le16(b + 20), 1); /* PCM */
    assert_int_equal(le16(b + 22), 2); /* stereo */
    assert_int_equal(le32(b + 24), 44100);
    assert_int_equal(le16(b + 34), 16);
    assert_memory_equal(b + 36, "data", 4);
    assert_int_equal(le32(b + 40), data);
    check_pcm(b + 44, n_frames);
    http_client_response_free(&r);
    fixture_stop(fx);
}

static void test_stream_equals_whole(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    fx->fe.delay_ms = 10;
    struct http_client_response whole, st;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &whole), 0);
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"stream\":true}", &st), 0);
    assert_int_equal(st.status, 200);
    assert_true(st.chunked);
    assert_true(st.complete);
    assert_true(st.n_chunks >= 2);
    assert_int_equal(st.body_len, whole.body_len);
    assert_int_equal(le32(st.body + 4), 0xFFFFFFFFu); /* length unknown while streaming */
    assert_int_equal(le32(st.body + 40), 0xFFFFFFFFu);
    assert_memory_equal(st.body + 44, whole.body + 44, whole.body_len - 44);
    http_client_response_free(&whole);
    http_client_response_free(&st);

    /* Raw PCM streamed == raw PCM whole == the WAV's data. */
    assert_int_equal(
        do_request(fx, "POST", "/v1/audio/speech", SONG ",\"response_format\":\"pcm\",\"stream\":true}", &st), 0);
    assert_int_equal(st.status, 200);
    assert_string_equal(http_client_header(&st, "content-type"), "audio/pcm");
    assert_string_equal(http_client_header(&st, "x-sample-rate"), "44100");
    assert_int_equal(st.body_len, 5 * 4410 * 4);
    check_pcm((const uint8_t *)st.body, 5 * 4410);
    http_client_response_free(&st);
    fixture_stop(fx);
}

struct flac_mem {
    const uint8_t *data;
    size_t len, pos;
    size_t frames;
    bool mismatch;
    unsigned rate, channels;
};

static FLAC__StreamDecoderReadStatus flac_read(const FLAC__StreamDecoder *d, FLAC__byte buf[], size_t *n, void *cls)
{
    struct flac_mem *m = cls;
    size_t k = m->len - m->pos < *n ? m->len - m->pos : *n;
    memcpy(buf, m->data + m->pos, k);
    m->pos += k;
    *n = k;
    return k ? FLAC__STREAM_DECODER_READ_STATUS_CONTINUE : FLAC__STREAM_DECODER_READ_STATUS_END_OF_STREAM;
}

static FLAC__StreamDecoderWriteStatus flac_write(const FLAC__StreamDecoder *d, const FLAC__Frame *fr,
                                                 const FLAC__int32 *const buf[], void *cls)
{
    struct flac_mem *m = cls;
    m->rate = fr->header.sample_rate;
    m->channels = fr->header.channels;
    for (unsigned i = 0; i < fr->header.blocksize; i++, m->frames++)
        for (int c = 0; c < 2; c++)
            if (buf[c][i] != wav_sample_pcm16(fake_sample(m->frames, c))) m->mismatch = true;
    return FLAC__STREAM_DECODER_WRITE_STATUS_CONTINUE;
}

static void flac_error(const FLAC__StreamDecoder *d, FLAC__StreamDecoderErrorStatus s, void *cls)
{
    ((struct flac_mem *)cls)->mismatch = true;
}

static void check_flac(const char *body, size_t len, size_t want_frames)
{
    struct flac_mem m = {(const uint8_t *)body, len, 0, 0, false, 0, 0};
    FLAC__StreamDecoder *d = FLAC__stream_decoder_new();
    assert_int_equal(
        FLAC__stream_decoder_init_stream(d, flac_read, NULL, NULL, NULL, NULL, flac_write, NULL, flac_error, &m),
        FLAC__STREAM_DECODER_INIT_STATUS_OK);
    assert_true(FLAC__stream_decoder_process_until_end_of_stream(d));
    FLAC__stream_decoder_delete(d);
    assert_false(m.mismatch);
    assert_int_equal(m.frames, want_frames);
    assert_int_equal(m.rate, 44100);
    assert_int_equal(m.channels, 2);
}

static void test_flac(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"response_format\":\"flac\"}", &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(http_client_header(&r, "content-type"), "audio/flac");
    assert_memory_equal(r.body, "fLaC", 4);
    check_flac(r.body, r.body_len, 5 * 4410);
    http_client_response_free(&r);
    assert_int_equal(
        do_request(fx, "POST", "/v1/audio/speech", SONG ",\"response_format\":\"flac\",\"stream\":true}", &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked && r.complete);
    check_flac(r.body, r.body_len, 5 * 4410);
    http_client_response_free(&r);
    fixture_stop(fx);
}

/* mp3 and opus over HTTP: their content types, and the streamed answer is the whole
 * file's bytes (the encoders' own tests decode them back: test_api_audio). */
static void test_mp3_opus(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    fx->fe.delay_ms = 5;
    static const char *const names[] = {"mp3", "opus"}, *const types[] = {"audio/mpeg", "audio/ogg"};
    for (int k = 0; k < 2; k++) {
        char body[256];
        struct http_client_response whole, st;
        snprintf(body, sizeof body, SONG ",\"response_format\":\"%s\"}", names[k]);
        assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", body, &whole), 0);
        assert_int_equal(whole.status, 200);
        assert_string_equal(http_client_header(&whole, "content-type"), types[k]);
        snprintf(body, sizeof body, SONG ",\"response_format\":\"%s\",\"stream\":true}", names[k]);
        assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", body, &st), 0);
        assert_int_equal(st.status, 200);
        assert_true(st.chunked && st.complete && st.n_chunks >= 2);
        assert_string_equal(http_client_header(&st, "content-type"), types[k]);
        assert_true(whole.body_len > 1000);
        assert_int_equal(st.body_len, whole.body_len);
        assert_memory_equal(st.body, whole.body, whole.body_len);
        http_client_response_free(&whole);
        http_client_response_free(&st);
    }
    fixture_stop(fx);
}

static void test_resampled_length(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    struct http_client_response whole, st;
    assert_int_equal(
        do_request(fx, "POST", "/v1/audio/speech", SONG ",\"response_format\":\"pcm\",\"sample_rate\":32000}", &whole),
        0);
    assert_int_equal(whole.status, 200);
    assert_string_equal(http_client_header(&whole, "x-sample-rate"), "32000");
    /* ceil(22050 * 320 / 441) = 16000 frames of 4 bytes */
    assert_int_equal(whole.body_len, 16000 * 4);
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech",
                                SONG ",\"response_format\":\"pcm\",\"sample_rate\":32000,\"stream\":true}", &st),
                     0);
    assert_int_equal(st.body_len, whole.body_len);
    assert_memory_equal(st.body, whole.body, whole.body_len);
    http_client_response_free(&whole);
    http_client_response_free(&st);
    fixture_stop(fx);
}

static void check_error(struct http_client_response *r, int status, const char *needle)
{
    if (r->status != status) fail_msg("status %d, want %d: %s", r->status, status, r->body);
    assert_string_equal(http_client_header(r, "content-type"), "application/json");
    if (!strstr(r->body, needle)) fail_msg("body %s lacks '%s'", r->body, needle);
}

static void test_errors(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", "{\"input\": ", &r), 0);
    check_error(&r, 400, "invalid JSON at line 1");
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"temperature\":0.9}", &r), 0);
    check_error(&r, 400, "\"param\":\"temperature\"");
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", "", &r), 0);
    check_error(&r, 400, "body");
    http_client_response_free(&r);

    char *big = malloc(8192);
    memset(big, ' ', 8191);
    memcpy(big, "{\"input\":\"", 10);
    big[8191] = 0;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", big, &r), 0);
    check_error(&r, 413, "larger than 4096");
    http_client_response_free(&r);
    free(big);

    assert_int_equal(do_request(fx, "GET", "/nope", NULL, &r), 0);
    assert_int_equal(r.status, 404);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/v1/audio/speech", NULL, &r), 0);
    assert_int_equal(r.status, 405);
    http_client_response_free(&r);
    assert_int_equal(atomic_load(&fx->fe.submits), 0); /* none of these reached the engine */
    fixture_stop(fx);
}

static void test_engine_refusals(void **state)
{
    struct fixture *fx = fixture_start(FAKE_EAGAIN, 0);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    check_error(&r, 503, "busy");
    assert_non_null(http_client_header(&r, "retry-after"));
    assert_string_equal(http_client_header(&r, "retry-after"), "5");
    http_client_response_free(&r);

    fx->fe.mode = FAKE_EINVAL;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    check_error(&r, 400, "5000");
    http_client_response_free(&r);

    fx->fe.mode = FAKE_FAIL_EARLY;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"stream\":true}", &r), 0);
    check_error(&r, 500, "stage 1 died");
    http_client_response_free(&r);

    /* A failure after audio went out can only cut the chunked stream. */
    fx->fe.mode = FAKE_FAIL_MID;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"stream\":true}", &r), 0);
    assert_int_equal(r.status, 200);
    assert_true(r.chunked);
    assert_false(r.complete);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    check_error(&r, 500, "stage 1 died");
    http_client_response_free(&r);
    fixture_stop(fx);
}

/* Open a raw connection and send a request; returns the socket. */
static int raw_post(struct fixture *fx, const char *body)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(http_server_port(fx->srv))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     strlen(body));
    assert_int_equal(send(fd, head, (size_t)n, 0), n);
    assert_int_equal(send(fd, body, strlen(body), 0), (ssize_t)strlen(body));
    return fd;
}

static void wait_cancels(struct fixture *fx, int want)
{
    for (int i = 0; i < 300 && atomic_load(&fx->fe.cancels) < want; i++)
        sleep_ms(10);
    sleep_ms(100); /* a second cancel would show up now */
    assert_int_equal(atomic_load(&fx->fe.cancels), want);
}

static void test_disconnect_cancels_once(void **state)
{
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
    fx->fe.delay_ms = 5;
    int fd = raw_post(fx, SONG ",\"stream\":true}");
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0); /* headers and some audio */
    assert_true(n > 12);
    buf[n] = 0;
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    close(fd);
    wait_cancels(fx, 1);

    /* Gone while waiting for a whole file: same. */
    fd = raw_post(fx, SONG "}");
    sleep_ms(100);
    close(fd);
    wait_cancels(fx, 2);
    fixture_stop(fx);
}

static void test_progress(void **state)
{
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
    fx->fe.delay_ms = 5;
    int fd = raw_post(fx, SONG ",\"stream\":true}");
    char buf[1024];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = 0;
    char *idh = strstr(buf, "X-Request-Id: ");
    assert_non_null(idh);
    char id[64];
    assert_int_equal(sscanf(idh + 14, "%63[0-9a-f]", id), 1);
    assert_int_equal(strlen(id), 32); /* 128 random bits in hex */
    char path[128];
    snprintf(path, sizeof path, "/v1/audio/speech/%s", id);
    sleep_ms(50);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "GET", path, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    long long frames = -1, windows = -1, total = -1;
    const char *p = strstr(r.body, "\"frames_done\":");
    assert_non_null(p);
    frames = strtoll(p + 14, NULL, 10);
    p = strstr(r.body, "\"windows_done\":");
    assert_non_null(p);
    windows = strtoll(p + 15, NULL, 10);
    p = strstr(r.body, "\"frames_total\":");
    assert_non_null(p);
    total = strtoll(p + 15, NULL, 10);
    assert_true(frames >= 100 && windows >= 1);
    assert_int_equal(frames, windows * 100);
    assert_int_equal(total, 500);
    assert_non_null(strstr(r.body, "\"state\":\"running\""));
    char want[80];
    snprintf(want, sizeof want, "\"id\":\"%s\"", id);
    assert_non_null(strstr(r.body, want));
    http_client_response_free(&r);
    close(fd);
    wait_cancels(fx, 1);
    assert_int_equal(do_request(fx, "GET", path, NULL, &r), 0); /* answer over: unlisted */
    assert_int_equal(r.status, 404);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/v1/audio/speech/x1", NULL, &r), 0);
    assert_int_equal(r.status, 404);
    http_client_response_free(&r);
    fixture_stop(fx);
}

static void small_buffer_budget(struct http_server_config *cfg)
{
    cfg->max_buffered_bytes = 5 << 20; /* one SONG (500 frames: 20 s, ~3.6 MB of PCM16) fits, two do not */
}

/* Whole-file answers are held in memory until sent: together they stay under
 * max_buffered_bytes. A second whole song that does not fit is a 503 with Retry-After
 * at once; a streamed one still goes; once the first is gone its budget is back. */
static void test_whole_file_budget(void **state)
{
    fixture_tweak = small_buffer_budget;
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
    fx->fe.delay_ms = 5;
    int whole = raw_post(fx, SONG "}");
    for (int i = 0; i < 500 && atomic_load(&fx->fe.submits) < 1; i++) sleep_ms(10);
    assert_int_equal(atomic_load(&fx->fe.submits), 1);

    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    assert_int_equal(r.status, 503);
    assert_non_null(http_client_header(&r, "Retry-After"));
    assert_non_null(strstr(r.body, "max_buffered_bytes"));
    http_client_response_free(&r);
    assert_int_equal(atomic_load(&fx->fe.submits), 1); /* refused before the engine saw it */

    int streamed = raw_post(fx, SONG ",\"stream\":true}");
    char buf[64];
    ssize_t n = recv(streamed, buf, sizeof buf, 0);
    assert_true(n >= 12);
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    close(streamed);
    close(whole);
    wait_cancels(fx, 2);

    fx->fe.mode = FAKE_OK;
    int status = 0;
    for (int i = 0; i < 100 && status != 200; i++) { /* the first answer's thread gives its budget back */
        assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
        status = r.status;
        http_client_response_free(&r);
        if (status == 503) sleep_ms(20);
    }
    assert_int_equal(status, 200);
    fixture_stop(fx);
}

static int bit_distance(const char *a, const char *b)
{
    int d = 0;
    for (int i = 0; i < 32; i++) {
        unsigned x = (unsigned)strtoul((char[]){a[i], 0}, NULL, 16) ^ (unsigned)strtoul((char[]){b[i], 0}, NULL, 16);
        d += __builtin_popcount(x);
    }
    return d;
}

/* Request ids cannot be guessed: no counting from one's own id reaches another song's
 * progress. Consecutive ids are 32 hex digits that differ in about half their bits, and
 * the small integers of the old scheme answer 404 while a song is in progress. */
static void test_request_ids_unguessable(void **state)
{
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
    fx->fe.delay_ms = 5;
    char ids[4][64];
    int fds[4];
    for (int k = 0; k < 4; k++) {
        fds[k] = raw_post(fx, SONG ",\"stream\":true}");
        char buf[1024];
        ssize_t n = recv(fds[k], buf, sizeof buf - 1, 0);
        assert_true(n > 0);
        buf[n] = 0;
        char *idh = strstr(buf, "X-Request-Id: ");
        assert_non_null(idh);
        assert_int_equal(sscanf(idh + 14, "%63[0-9a-f]", ids[k]), 1);
        assert_int_equal(strlen(ids[k]), 32);
    }
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++) {
            int d = bit_distance(ids[a], ids[b]);
            if (d < 24) fail_msg("ids %s and %s differ in only %d of 128 bits", ids[a], ids[b], d);
        }
    struct http_client_response r;
    for (int k = 0; k < 8; k++) {
        char path[64];
        snprintf(path, sizeof path, "/v1/audio/speech/%d", k);
        assert_int_equal(do_request(fx, "GET", path, NULL, &r), 0);
        assert_int_equal(r.status, 404);
        http_client_response_free(&r);
    }
    char upper[128];
    snprintf(upper, sizeof upper, "/v1/audio/speech/%.32s0", ids[0]); /* one digit too many */
    assert_int_equal(do_request(fx, "GET", upper, NULL, &r), 0);
    assert_int_equal(r.status, 404);
    http_client_response_free(&r);
    for (int k = 0; k < 4; k++) close(fds[k]);
    wait_cancels(fx, 4);
    fixture_stop(fx);
}

static void test_stop_while_streaming(void **state)
{
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
    fx->fe.delay_ms = 5;
    int fd = raw_post(fx, SONG ",\"stream\":true}");
    char buf[256];
    assert_true(recv(fd, buf, sizeof buf, 0) > 0);
    http_server_stop(fx->srv); /* must end the answer, not wait for the song */
    fx->srv = NULL;
    assert_int_equal(atomic_load(&fx->fe.cancels), 1);
    close(fd);
    fixture_stop(fx);
}

static void short_timeout(struct http_server_config *cfg)
{
    cfg->request_timeout_s = 0.2;
}

static void test_request_timeout(void **state)
{
    fixture_tweak = short_timeout;
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
    fx->fe.delay_ms = 5;
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    check_error(&r, 504, "request_timeout_s");
    http_client_response_free(&r);
    assert_int_equal(atomic_load(&fx->fe.cancels), 1);
    /* Streaming: the stream is cut once the deadline passes. */
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"stream\":true}", &r), 0);
    assert_int_equal(r.status, 200);
    assert_false(r.complete);
    assert_true(r.body_len > 44);
    http_client_response_free(&r);
    assert_int_equal(atomic_load(&fx->fe.cancels), 2);
    fixture_stop(fx);
}

static void two_connections(struct http_server_config *cfg)
{
    cfg->max_connections = 2;
    cfg->admin_connections = 0; /* no headroom: the third connection is refused at accept */
}

static void test_connection_limit(void **state)
{
    fixture_tweak = two_connections;
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    int fds[2];
    for (int i = 0; i < 2; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(http_server_port(fx->srv))};
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&a, sizeof a), 0);
    }
    sleep_ms(50); /* let the server accept both */
    struct http_client_response r;
    assert_true(do_request(fx, "GET", "/health", NULL, &r) < 0); /* refused: no answer at all */
    http_client_response_free(&r);
    close(fds[0]);
    int rc = -1;
    for (int i = 0; i < 40 && rc < 0; i++) { /* a slot is free again once the server saw the close */
        sleep_ms(50);
        rc = do_request(fx, "GET", "/health", NULL, &r);
        if (rc < 0) http_client_response_free(&r);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    close(fds[1]);
    fixture_stop(fx);
}

static void test_queue_depth_429(void **state)
{
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 1);
    fx->fe.delay_ms = 5;
    int fd = raw_post(fx, SONG ",\"stream\":true}");
    char buf[256];
    assert_true(recv(fd, buf, sizeof buf, 0) > 0); /* the first request is being served */
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    check_error(&r, 429, "busy");
    assert_non_null(http_client_header(&r, "retry-after"));
    http_client_response_free(&r);
    assert_int_equal(atomic_load(&fx->fe.submits), 1);
    close(fd);
    wait_cancels(fx, 1);
    fixture_stop(fx);
}

static void test_health_metrics(void **state)
{
    metrics_reset();
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "GET", "/health", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(http_client_header(&r, "content-type"), "application/json");
    assert_non_null(strstr(r.body, "\"ready\":true"));
    assert_non_null(strstr(r.body, "\"stage1\":{\"state\":\"ready\""));
    http_client_response_free(&r);
    fx->fe.ready = false;
    assert_int_equal(do_request(fx, "GET", "/health", NULL, &r), 0);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "\"stage1\":{\"state\":\"starting\""));
    http_client_response_free(&r);
    /* readiness is /health; liveness says the process answers, whatever the stages do */
    assert_int_equal(do_request(fx, "GET", "/health/ready", NULL, &r), 0);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.body, "\"ready\":false"));
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/health/live", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"live\":true"));
    http_client_response_free(&r);
    fx->fe.ready = true;
    assert_int_equal(do_request(fx, "GET", "/health/ready", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);

    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", "{}", &r), 0);
    assert_int_equal(r.status, 400);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/metrics", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    assert_string_equal(http_client_header(&r, "content-type"), METRICS_CONTENT_TYPE);
    assert_non_null(strstr(r.body, "mm3_requests_total{outcome=\"ok\"} 1\n"));
    assert_non_null(strstr(r.body, "mm3_requests_total{outcome=\"bad_request\"} 1\n"));
    assert_non_null(strstr(r.body, "mm3_frames_total 500\n"));
    assert_non_null(strstr(r.body, "mm3_windows_total 5\n"));
    assert_non_null(strstr(r.body, "mm3_queue_depth 3\n"));
    assert_non_null(strstr(r.body, "mm3_active_rows 4\n"));
    assert_non_null(strstr(r.body, "mm3_time_to_first_audio_seconds_count 1\n"));
    assert_non_null(strstr(r.body, "mm3_real_time_factor_count 1\n"));
    assert_non_null(strstr(r.body, "mm3_audio_samples_total 22050\n"));
    http_client_response_free(&r);
    fixture_stop(fx);
}

static void with_owner_model_name(struct http_server_config *cfg)
{
    cfg->model_name = "MiniMaxAI/MiniMax-Music3";
}

/* /v1/models lists the one model as OpenAI does (with `created`); /v1/models/{id} answers
 * it, also when the id holds a '/', and any other id is a 404 naming param "model". */
static void test_models(void **state)
{
    fixture_tweak = with_owner_model_name;
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    time_t before = time(NULL);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "GET", "/v1/models", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *o = json_loads(r.body, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "object")), "list");
    json_t *m = json_array_get(json_object_get(o, "data"), 0);
    assert_int_equal(json_array_size(json_object_get(o, "data")), 1);
    assert_string_equal(json_string_value(json_object_get(m, "id")), "MiniMaxAI/MiniMax-Music3");
    assert_string_equal(json_string_value(json_object_get(m, "object")), "model");
    assert_string_equal(json_string_value(json_object_get(m, "owned_by")), "mm3");
    json_int_t created = json_integer_value(json_object_get(m, "created"));
    assert_true(json_is_integer(json_object_get(m, "created")));
    assert_true(created > 1700000000 && created <= (json_int_t)before);
    json_decref(o);
    http_client_response_free(&r);

    assert_int_equal(do_request(fx, "GET", "/v1/models/MiniMaxAI/MiniMax-Music3", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    o = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(o, "id")), "MiniMaxAI/MiniMax-Music3");
    assert_string_equal(json_string_value(json_object_get(o, "object")), "model");
    assert_int_equal(json_integer_value(json_object_get(o, "created")), created);
    json_decref(o);
    http_client_response_free(&r);

    assert_int_equal(do_request(fx, "GET", "/v1/models/tts-1", NULL, &r), 0);
    assert_int_equal(r.status, 404);
    o = json_loads(r.body, 0, NULL);
    json_t *e = json_object_get(o, "error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "model");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "'tts-1'"));
    json_decref(o);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "POST", "/v1/models/MiniMaxAI/MiniMax-Music3", "{}", &r), 0);
    assert_int_equal(r.status, 405);
    http_client_response_free(&r);
    fixture_stop(fx);
}

static void with_adapters(struct http_server_config *cfg)
{
    cfg->limits.n_lora = 2;
    snprintf(cfg->limits.lora_names[0], sizeof cfg->limits.lora_names[0], "rock");
    snprintf(cfg->limits.lora_names[1], sizeof cfg->limits.lora_names[1], "jazz");
}

/* With lora_modules, /v1/models lists the base model and each adapter as vLLM does
 * (parent = the base model, root = its own id), /v1/models/{adapter} answers it, and
 * a song asking for an adapter that is not loaded gets 404 naming param "lora". */
static void test_models_adapters(void **state)
{
    fixture_tweak = with_adapters;
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "GET", "/v1/models", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    json_t *o = json_loads(r.body, 0, NULL);
    json_t *data = json_object_get(o, "data");
    assert_int_equal(json_array_size(data), 3);
    static const char *const ids[] = {"MiniMax-Music3", "rock", "jazz"};
    for (size_t i = 0; i < 3; i++) {
        json_t *m = json_array_get(data, i);
        assert_string_equal(json_string_value(json_object_get(m, "id")), ids[i]);
        assert_string_equal(json_string_value(json_object_get(m, "object")), "model");
        assert_string_equal(json_string_value(json_object_get(m, "owned_by")), "mm3");
        assert_string_equal(json_string_value(json_object_get(m, "root")), ids[i]);
        if (i == 0)
            assert_true(json_is_null(json_object_get(m, "parent")));
        else
            assert_string_equal(json_string_value(json_object_get(m, "parent")), "MiniMax-Music3");
    }
    json_decref(o);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/v1/models/jazz", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    o = json_loads(r.body, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(o, "parent")), "MiniMax-Music3");
    json_decref(o);
    http_client_response_free(&r);

    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"lora\":\"pop\"}", &r), 0);
    assert_int_equal(r.status, 404);
    o = json_loads(r.body, 0, NULL);
    json_t *e = json_object_get(o, "error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), "lora");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "'rock', 'jazz'"));
    json_decref(o);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG ",\"model\":\"rock\"}", &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    fixture_stop(fx);
}

/* A missing `input` and a too-large seed are named in the 400's param. */
static void test_error_params(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    static const char *const cases[][2] = {
        {"{\"instructions\":\"pop\"}", "input"},
        {SONG ",\"seed\":18446744073709551616}", "seed"},
        {SONG ",\"language\":\"French\"}", "language"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct http_client_response r;
        assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", cases[i][0], &r), 0);
        assert_int_equal(r.status, 400);
        json_t *o = json_loads(r.body, 0, NULL);
        const char *param = json_string_value(json_object_get(json_object_get(o, "error"), "param"));
        if (!param || strcmp(param, cases[i][1]) != 0) fail_msg("%s: param %s, want %s", cases[i][0], param, cases[i][1]);
        json_decref(o);
        http_client_response_free(&r);
    }
    assert_int_equal(atomic_load(&fx->fe.submits), 0);
    fixture_stop(fx);
}

/* ---- hardening: slow clients, limits, framing, logs, drain, API key ---- */

static int raw_connect(struct fixture *fx)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(http_server_port(fx->srv))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {3, 0}; /* every wait below is bounded */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Send `req`, read until the server closes (or 3 s pass); returns the bytes, NUL-terminated. */
static char *raw_exchange(struct fixture *fx, const char *req)
{
    int fd = raw_connect(fx);
    assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while (n < cap - 1 && (k = recv(fd, buf + n, cap - 1 - n, 0)) > 0)
        n += (size_t)k;
    buf[n] = 0;
    close(fd);
    return buf;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* True when the server closed `fd` within `limit_s` (reads EOF or a reset);
 * `drip`: send one byte of a never-ending header every 100 ms meanwhile. */
static bool closed_within(int fd, double limit_s, bool drip)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (drip && send(fd, "a", 1, MSG_NOSIGNAL) < 0) return true;
        char b[512];
        ssize_t k = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > limit_s) return false;
        sleep_ms(100);
    }
}

static void read_deadline(struct http_server_config *cfg)
{
    cfg->request_read_timeout_s = 0.5;
    cfg->connection_timeout_s = 30; /* the idle timeout alone would not act within the test */
}

static void test_slow_and_idle_clients_cut_off(void **state)
{
    fixture_tweak = read_deadline;
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    /* Headers trickling in, one byte per 100 ms: never idle, never complete. */
    int fd = raw_connect(fx);
    const char *start = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    assert_int_equal(send(fd, start, strlen(start), 0), (ssize_t)strlen(start));
    assert_true(closed_within(fd, 3.0, true));
    close(fd);
    /* A body trickling in after complete headers: same deadline. */
    fd = raw_connect(fx);
    start = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{";
    assert_int_equal(send(fd, start, strlen(start), 0), (ssize_t)strlen(start));
    assert_true(closed_within(fd, 3.0, true));
    close(fd);
    /* A connection that never says anything. */
    fd = raw_connect(fx);
    assert_true(closed_within(fd, 3.0, false));
    close(fd);
    /* A kept-alive connection is not held open after its answer either. */
    fd = raw_connect(fx);
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(send(fd, get, strlen(get), 0), (ssize_t)strlen(get));
    char b[1024];
    assert_true(recv(fd, b, sizeof b, 0) > 12);
    assert_true(closed_within(fd, 3.0, false));
    close(fd);
    /* A client in time is served as before. */
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    fixture_stop(fx);
}

static void two_per_client(struct http_server_config *cfg)
{
    cfg->max_connections_per_client = 2;
}

static void test_per_client_limit(void **state)
{
    fixture_tweak = two_per_client;
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    int a = raw_connect(fx), b = raw_connect(fx);
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"; /* answered: both accepted */
    char buf[1024];
    assert_int_equal(send(a, get, strlen(get), 0), (ssize_t)strlen(get));
    assert_true(recv(a, buf, sizeof buf, 0) > 12);
    assert_int_equal(send(b, get, strlen(get), 0), (ssize_t)strlen(get));
    assert_true(recv(b, buf, sizeof buf, 0) > 12);
    int c = raw_connect(fx); /* the kernel completes the handshake; the server drops it */
    assert_true(closed_within(c, 2.0, false));
    assert_false(closed_within(a, 0.2, false)); /* the first two stay */
    close(c);
    close(a);
    int rc = -1;
    struct http_client_response r;
    for (int i = 0; i < 40 && rc < 0; i++) { /* a slot is free again once the server saw the close */
        sleep_ms(50);
        rc = do_request(fx, "GET", "/health", NULL, &r);
        if (rc < 0) http_client_response_free(&r);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    close(b);
    fixture_stop(fx);
}

static void two_plus_headroom(struct http_server_config *cfg)
{
    cfg->max_connections = 2;
    /* The probes below come one after another, but MHD counts a closed connection
     * until its thread is reaped: leave room for all of them at once. */
    cfg->admin_connections = 8;
    cfg->max_connections_per_client = 0;
}

static void test_health_answered_when_connections_exhausted(void **state)
{
    fixture_tweak = two_plus_headroom;
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
    fx->fe.delay_ms = 5;
    int fds[2];
    char buf[256];
    for (int i = 0; i < 2; i++) {
        fds[i] = raw_post(fx, SONG ",\"stream\":true}");
        assert_true(recv(fds[i], buf, sizeof buf, 0) > 0); /* being served */
    }
    struct http_client_response r;
    assert_int_equal(do_request(fx, "GET", "/health", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/metrics", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/health/ready", NULL, &r), 0); /* every /health* path */
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/health/live", NULL, &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    /* A third song is told to come back, not left hanging. */
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0);
    check_error(&r, 503, "too many connections");
    assert_non_null(http_client_header(&r, "retry-after"));
    http_client_response_free(&r);
    assert_int_equal(atomic_load(&fx->fe.submits), 2);
    close(fds[0]);
    close(fds[1]);
    wait_cancels(fx, 2);
    fixture_stop(fx);
}

static void test_framing_refused(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    char *got = raw_exchange(fx, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                 "Content-Length: 60\r\n\r\n{}");
    assert_int_equal(count_of(got, "HTTP/1.1 "), 1);
    assert_memory_equal(got, "HTTP/1.1 400", 12);
    assert_non_null(strstr(got, "different values"));
    free(got);
    got = raw_exchange(fx, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                           "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(count_of(got, "HTTP/1.1 "), 1); /* what followed is not read as a request */
    assert_memory_equal(got, "HTTP/1.1 400", 12);
    assert_non_null(strstr(got, "Transfer-Encoding"));
    free(got);
    const char *bad[] = {"abc", "5x", "-1", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char req[256];
        snprintf(req, sizeof req, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n", bad[i]);
        got = raw_exchange(fx, req);
        if (count_of(got, "HTTP/1.1 ") != 1)
            fail_msg("Content-Length %s: answered %d times: %s", bad[i], count_of(got, "HTTP/1.1 "), got);
        assert_memory_equal(got, i == 3 ? "HTTP/1.1 413" : "HTTP/1.1 400", 12);
        assert_non_null(strstr(got, "\"type\":\"invalid_request_error\""));
        free(got);
    }
    /* Two equal lengths are one length. */
    char req[512];
    snprintf(req, sizeof req,
             "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n"
             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s}",
             strlen(SONG) + 1, strlen(SONG) + 1, SONG);
    got = raw_exchange(fx, req);
    assert_memory_equal(got, "HTTP/1.1 200", 12);
    free(got);
    assert_int_equal(atomic_load(&fx->fe.submits), 1);
    fixture_stop(fx);
}

/* Everything the server logs during `fn`, read back from a pipe put on stderr. */
static char *capture_stderr(void (*fn)(struct fixture *), struct fixture *fx)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(p[1], 2);
    close(p[1]);
    fn(fx);
    dup2(saved, 2);
    close(saved);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while (n < cap - 1 && (k = read(p[0], buf + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    buf[n] = 0;
    close(p[0]);
    return buf;
}

static void send_forging_requests(struct fixture *fx)
{
    struct http_client_response r;
    const char *body = "{\"input\":\"x\",\"instructions\":\"y\",\"x\\nstage0[1] 0.000 ERROR forged:1: owned\":1}";
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", body, &r), 0);
    assert_int_equal(r.status, 400);
    http_client_response_free(&r);
    body = "{\"input\":\"x\",\"instructions\":\"y\",\"\\u001b[2J\\r\\u00e9\":1}";
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", body, &r), 0);
    assert_int_equal(r.status, 400);
    http_client_response_free(&r);
}

static void test_log_lines_not_forged(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    char *log = capture_stderr(send_forging_requests, fx);
    assert_null(strstr(log, "\nstage0[1] 0.000 ERROR forged")); /* no line starts with the forgery */
    assert_non_null(strstr(log, "x\\x0astage0[1] 0.000 ERROR forged"));
    assert_null(strchr(log, '\x1b'));
    assert_null(strchr(log, '\r'));
    assert_non_null(strstr(log, "\\x1b[2J\\x0d\\xc3\\xa9"));
    /* Every line is a logger line. */
    for (char *line = log; *line; line = strchr(line, '\n') + 1) {
        if (strncmp(line, "mm3[", 4) != 0) fail_msg("a line not from the logger: %.80s", line);
        if (!strchr(line, '\n')) break;
    }
    free(log);
    fixture_stop(fx);
}

struct drain_arg {
    struct fixture *fx;
    _Atomic bool done;
};

static void *drain_thread(void *p)
{
    struct drain_arg *a = p;
    http_server_drain(a->fx->srv);
    atomic_store(&a->done, true);
    return NULL;
}

static void short_drain(struct http_server_config *cfg)
{
    cfg->drain_timeout_s = 0.6;
}

/* Read one whole answer from fd (the server closes it after); *len: its bytes. */
static char *read_all(int fd, size_t *len)
{
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while (n < cap - 1 && (k = recv(fd, buf + n, cap - 1 - n, 0)) > 0)
        n += (size_t)k;
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

static void test_drain(void **state)
{
    /* A song that cannot finish: at the deadline its whole-file client gets 503. */
    fixture_tweak = short_drain;
    struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
    fx->fe.delay_ms = 5;
    int fd = raw_post(fx, SONG "}");
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < 200 && atomic_load(&fx->fe.submits) < 1; i++)
        sleep_ms(10);
    struct drain_arg da = {fx, false};
    pthread_t t;
    pthread_create(&t, NULL, drain_thread, &da);
    sleep_ms(100);
    struct http_client_response r;
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", SONG "}", &r), 0); /* new: refused */
    check_error(&r, 503, "server shutting down");
    assert_non_null(http_client_header(&r, "retry-after"));
    http_client_response_free(&r);
    assert_int_equal(do_request(fx, "GET", "/health", NULL, &r), 0); /* not ready any more */
    assert_int_equal(r.status, 503);
    http_client_response_free(&r);
    assert_false(atomic_load(&da.done));
    pthread_join(t, NULL);
    http_server_stop(fx->srv);
    fx->srv = NULL;
    char *got = read_all(fd, NULL);
    if (strncmp(got, "HTTP/1.1 503", 12) != 0) fail_msg("in-flight whole file got: %.200s", got);
    assert_non_null(strstr(got, "server shutting down"));
    assert_non_null(strstr(got, "Retry-After: 5"));
    free(got);
    close(fd);
    assert_int_equal(atomic_load(&fx->fe.submits), 1);
    fixture_stop(fx);

    /* A song that finishes within the deadline is delivered whole. */
    fixture_tweak = short_drain;
    fx = fixture_start(FAKE_OK, 0);
    fx->fe.delay_ms = 50;
    fd = raw_post(fx, SONG "}");
    int sfd = raw_post(fx, SONG ",\"stream\":true}");
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(sfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (int i = 0; i < 200 && atomic_load(&fx->fe.submits) < 2; i++)
        sleep_ms(10);
    http_server_drain(fx->srv);
    http_server_stop(fx->srv);
    fx->srv = NULL;
    got = read_all(fd, NULL);
    if (strncmp(got, "HTTP/1.1 200", 12) != 0) fail_msg("in-flight whole file got: %.200s", got);
    free(got);
    close(fd);
    size_t n;
    got = read_all(sfd, &n); /* the stream ends with its last chunk: a complete song */
    if (strncmp(got, "HTTP/1.1 200", 12) != 0) fail_msg("in-flight stream got: %.200s", got);
    assert_non_null(strstr(got, "Transfer-Encoding: chunked"));
    assert_true(n > 5 * 4410 * 4);
    assert_memory_equal(got + n - 7, "\r\n0\r\n\r\n", 7);
    free(got);
    close(sfd);
    assert_int_equal(atomic_load(&fx->fe.cancels), 0);
    fixture_stop(fx);
}

#define KEY "0123456789abcdef-test-key"

static void with_key(struct http_server_config *cfg)
{
    cfg->api_key = KEY;
}

static int keyed_request(struct fixture *fx, const char *method, const char *path, const char *body, const char *key,
                         struct http_client_response *resp)
{
    char url[256];
    snprintf(url, sizeof url, "%s%s", fx->base, path);
    struct http_client_request rq = {
        .url = url,
        .method = method,
        .body = body,
        .body_len = body ? strlen(body) : 0,
        .timeout_ms = 10000,
        .bearer_token = key,
    };
    return http_client_request(&rq, resp);
}

static void test_api_key(void **state)
{
    fixture_tweak = with_key;
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    struct http_client_response r;
    const char *wrong[] = {NULL, "", "0123456789abcdef-test-kex", KEY "x", "0123"};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        assert_int_equal(keyed_request(fx, "POST", "/v1/audio/speech", SONG "}", wrong[i], &r), 0);
        check_error(&r, 401, "\"type\":\"authentication_error\"");
        assert_non_null(strstr(r.body, "\"param\":null"));
        assert_non_null(strstr(r.body, "\"code\":401"));
        assert_string_equal(http_client_header(&r, "www-authenticate"), "Bearer");
        http_client_response_free(&r);
    }
    assert_int_equal(keyed_request(fx, "GET", "/v1/models", NULL, NULL, &r), 0);
    assert_int_equal(r.status, 401);
    http_client_response_free(&r);
    assert_int_equal(keyed_request(fx, "GET", "/v1/nothing-here", NULL, NULL, &r), 0);
    assert_int_equal(r.status, 401);
    http_client_response_free(&r);
    assert_int_equal(atomic_load(&fx->fe.submits), 0);
    assert_int_equal(keyed_request(fx, "POST", "/v1/audio/speech", SONG "}", KEY, &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    assert_int_equal(keyed_request(fx, "GET", "/v1/models", NULL, KEY, &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    /* Health and metrics stay open. */
    assert_int_equal(keyed_request(fx, "GET", "/health", NULL, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    assert_int_equal(keyed_request(fx, "GET", "/metrics", NULL, NULL, &r), 0);
    assert_int_equal(r.status, 200);
    http_client_response_free(&r);
    /* The refused body is not read as a next request on the same connection. */
    char *got = raw_exchange(fx, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 33\r\n\r\n"
                                 "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(count_of(got, "HTTP/1.1 "), 1);
    assert_memory_equal(got, "HTTP/1.1 401", 12);
    free(got);
    fixture_stop(fx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_wav),
        cmocka_unit_test(test_stream_equals_whole),
        cmocka_unit_test(test_flac),
        cmocka_unit_test(test_resampled_length),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_engine_refusals),
        cmocka_unit_test(test_disconnect_cancels_once),
        cmocka_unit_test(test_progress),
        cmocka_unit_test(test_request_ids_unguessable),
        cmocka_unit_test(test_whole_file_budget),
        cmocka_unit_test(test_stop_while_streaming),
        cmocka_unit_test(test_request_timeout),
        cmocka_unit_test(test_connection_limit),
        cmocka_unit_test(test_queue_depth_429),
        cmocka_unit_test(test_health_metrics),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_models_adapters),
        cmocka_unit_test(test_mp3_opus),
        cmocka_unit_test(test_error_params),
        cmocka_unit_test(test_slow_and_idle_clients_cut_off),
        cmocka_unit_test(test_per_client_limit),
        cmocka_unit_test(test_health_answered_when_connections_exhausted),
        cmocka_unit_test(test_framing_refused),
        cmocka_unit_test(test_log_lines_not_forged),
        cmocka_unit_test(test_drain),
        cmocka_unit_test(test_api_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
