/* Output encoders: PCM16 conversion rule (common/wav.h's), WAV header bytes, whole-file vs
 * streamed output identity for any chunking, the 32 kHz path equal to the
 * whole-buffer resampler of common/resample.h, and MP3 and Ogg Opus decoded back by
 * libsndfile (libmpg123 and libopus inside: decoders independent of the encoders). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <sndfile.h>

#include "common/resample.h"
#include "common/wav.h"
#include "stage0/api/audio_encode.h"

static void test_pcm16_rule(void **state)
{
    const float in[] = {0.0f, 1.0f, -1.0f, 1.5f, -7.0f, 0.5f, NAN, 1.5f / 32767.0f, 2.5f / 32767.0f, INFINITY};
    const int16_t want[] = {0, 32767, -32767, 32767, -32767, 16384, 0, 2, 3, 32767};
    int16_t got[10];
    audio_pcm16_from_f32(got, in, 10);
    for (int i = 0; i < 10; i++)
        if (got[i] != want[i]) fail_msg("sample %d: %d, want %d", i, got[i], want[i]);
}

/* The whole-file WAV header is exactly the canonical one for its size, byte for byte. */
static void test_wav_header(void **state)
{
    float x[8] = {0};
    struct audio_encoder *e;
    struct audio_buf b = {0};
    assert_int_equal(audio_encoder_create(&e, MM3_AUDIO_WAV, 2, 44100, 44100, false), 0);
    assert_int_equal(audio_encoder_write(e, x, 4, &b), 0);
    assert_int_equal(audio_encoder_finish(e, &b), 0);
    audio_encoder_free(e);
    const uint8_t want[44] = {'R',  'I', 'F', 'F', 52, 0, 0,   0,   'W', 'A',  'V',  'E', 'f', 'm',  't',
                              ' ',  16,  0,   0,   0,  1, 0,   2,   0,   0x44, 0xac, 0,   0,   0x10, 0xb1,
                              0x02, 0,   4,   0,   16, 0, 'd', 'a', 't', 'a',  16,   0,   0,   0};
    assert_int_equal(b.len, 44 + 16);
    assert_memory_equal(b.data, want, 44);
    audio_buf_free(&b);
    /* Streamed: both sizes "unknown". */
    assert_int_equal(audio_encoder_create(&e, MM3_AUDIO_WAV, 2, 44100, 44100, true), 0);
    assert_int_equal(audio_encoder_write(e, x, 4, &b), 0);
    assert_int_equal(audio_encoder_finish(e, &b), 0);
    audio_encoder_free(e);
    const uint8_t ff[4] = {0xff, 0xff, 0xff, 0xff};
    assert_memory_equal(b.data + 4, ff, 4);
    assert_memory_equal(b.data + 40, ff, 4);
    audio_buf_free(&b);
}

static float *signal(size_t n_frames)
{
    float *x = malloc(n_frames * 2 * sizeof *x);
    for (size_t i = 0; i < n_frames; i++) {
        x[2 * i] = 0.8f * sinf((float)i * 0.05f);
        x[2 * i + 1] = 0.5f * cosf((float)i * 0.013f);
    }
    return x;
}

/* Encode x whole, and streamed in uneven pieces; return both outputs. */
static void encode_both(enum mm3_audio_format fmt, int out_rate, const float *x, size_t n, struct audio_buf *whole,
                        struct audio_buf *streamed)
{
    struct audio_encoder *e;
    assert_int_equal(audio_encoder_create(&e, fmt, 2, 44100, out_rate, false), 0);
    assert_int_equal(audio_encoder_write(e, x, n, whole), 0);
    assert_int_equal(whole->len, 0); /* whole-file mode keeps everything until finish */
    assert_int_equal(audio_encoder_finish(e, whole), 0);
    audio_encoder_free(e);

    assert_int_equal(audio_encoder_create(&e, fmt, 2, 44100, out_rate, true), 0);
    size_t pieces[] = {1, 4409, 0, 17, 12345, 3000};
    size_t off = 0;
    for (size_t i = 0; off < n; i++) {
        size_t k = pieces[i % 6];
        if (k > n - off) k = n - off;
        assert_int_equal(audio_encoder_write(e, x + 2 * off, k, streamed), 0);
        off += k;
    }
    assert_int_equal(audio_encoder_finish(e, streamed), 0);
    audio_encoder_free(e);
}

static void test_stream_equals_whole(void **state)
{
    size_t n = 30000;
    float *x = signal(n);
    struct audio_buf w = {0}, s = {0};
    encode_both(MM3_AUDIO_WAV, 44100, x, n, &w, &s);
    assert_int_equal(w.len, 44 + n * 4);
    assert_int_equal(s.len, w.len);
    assert_memory_equal(w.data + 44, s.data + 44, n * 4);
    assert_memory_equal(w.data, s.data, 4);
    audio_buf_free(&w);
    audio_buf_free(&s);

    encode_both(MM3_AUDIO_PCM, 44100, x, n, &w, &s);
    assert_int_equal(w.len, n * 4);
    assert_int_equal(s.len, w.len);
    assert_memory_equal(w.data, s.data, w.len);
    int16_t first[2];
    audio_pcm16_from_f32(first, x, 2);
    assert_memory_equal(w.data, first, 4);
    audio_buf_free(&w);
    audio_buf_free(&s);
    free(x);
}

static void test_resampled_matches_resampler(void **state)
{
    size_t n = 44100 / 2 + 77;
    float *x = signal(n);
    struct audio_buf w = {0}, s = {0};
    encode_both(MM3_AUDIO_PCM, 32000, x, n, &w, &s);

    struct resample *r;
    assert_int_equal(resample_create(&r, 44100, 32000, 2), 0);
    int64_t m = resample_out_len(r, (int64_t)n);
    float *planar = malloc(n * 2 * sizeof *planar), *out = malloc((size_t)m * 2 * sizeof *out);
    for (size_t i = 0; i < n; i++) {
        planar[i] = x[2 * i];
        planar[n + i] = x[2 * i + 1];
    }
    assert_int_equal(resample_buffer(r, planar, (int64_t)n, (int64_t)n, out, m), 0);
    resample_free(r);
    float *inter = malloc((size_t)m * 2 * sizeof *inter);
    for (int64_t i = 0; i < m; i++) {
        inter[2 * i] = out[i];
        inter[2 * i + 1] = out[m + i];
    }
    int16_t *want = malloc((size_t)m * 2 * sizeof *want);
    audio_pcm16_from_f32(want, inter, (size_t)m * 2);
    assert_int_equal(w.len, (size_t)m * 4);
    assert_memory_equal(w.data, want, w.len);
    assert_int_equal(s.len, w.len);
    assert_memory_equal(s.data, want, s.len);
    free(planar);
    free(out);
    free(inter);
    free(want);
    audio_buf_free(&w);
    audio_buf_free(&s);
    free(x);
}

/* ---- MP3 and Ogg Opus, decoded back by libsndfile ---- */

struct mem_file {
    const uint8_t *data;
    sf_count_t len, pos;
};

static sf_count_t mem_len(void *u)
{
    return ((struct mem_file *)u)->len;
}

static sf_count_t mem_seek(sf_count_t off, int whence, void *u)
{
    struct mem_file *m = u;
    sf_count_t p = whence == SEEK_SET ? off : whence == SEEK_CUR ? m->pos + off : m->len + off;
    if (p < 0 || p > m->len) return -1;
    return m->pos = p;
}

static sf_count_t mem_read(void *dst, sf_count_t n, void *u)
{
    struct mem_file *m = u;
    if (n > m->len - m->pos) n = m->len - m->pos;
    memcpy(dst, m->data + m->pos, (size_t)n);
    m->pos += n;
    return n;
}

static sf_count_t mem_write(const void *src, sf_count_t n, void *u)
{
    return 0;
}

static sf_count_t mem_tell(void *u)
{
    return ((struct mem_file *)u)->pos;
}

/* Decode an encoded file; returns interleaved float frames (caller frees), or NULL when
 * this libsndfile cannot read the format (the caller skips the check then). */
static float *decode(const struct audio_buf *b, SF_INFO *info)
{
    SF_VIRTUAL_IO io = {mem_len, mem_seek, mem_read, mem_write, mem_tell};
    struct mem_file m = {b->data, (sf_count_t)b->len, 0};
    memset(info, 0, sizeof *info);
    SNDFILE *f = sf_open_virtual(&io, SFM_READ, info, &m);
    if (!f) {
        print_message("libsndfile cannot read it: %s\n", sf_strerror(NULL));
        return NULL;
    }
    /* MP3 without an Info frame has no length in its header: read until the end */
    size_t cap = 1 << 16, n = 0;
    float *x = malloc(cap * (size_t)info->channels * sizeof *x);
    for (;;) {
        if (n + 4096 > cap) {
            cap *= 2;
            x = realloc(x, cap * (size_t)info->channels * sizeof *x);
        }
        sf_count_t got = sf_readf_float(f, x + n * (size_t)info->channels, 4096);
        if (got <= 0) break;
        n += (size_t)got;
    }
    sf_close(f);
    info->frames = (sf_count_t)n;
    return x;
}

/* Frequency of channel c from its zero crossings over the middle half, in Hz. */
static double crossing_hz(const float *x, size_t n, int channels, int c, int rate)
{
    size_t a = n / 4, z = 3 * n / 4, crossings = 0;
    for (size_t i = a + 1; i < z; i++)
        if ((x[(i - 1) * channels + c] < 0) != (x[i * channels + c] < 0)) crossings++;
    return (double)crossings / 2.0 / ((double)(z - a) / rate);
}

static double rms(const float *x, size_t n, int channels, int c)
{
    double s = 0;
    for (size_t i = n / 4; i < 3 * n / 4; i++)
        s += (double)x[i * channels + c] * x[i * channels + c];
    return sqrt(s / (double)(n / 2));
}

/* 2 s of signal() (351 Hz at 0.8 left, 91 Hz at 0.5 right) through MP3 and Ogg Opus,
 * whole and streamed in uneven pieces: the same bytes either way, and the decoded audio
 * has the length, pitch and level that went in. */
static void test_lossy_decoded_back(void **state)
{
    size_t n = 88200;
    float *x = signal(n);
    const double left_hz = 0.05 * 44100 / (2 * M_PI), right_hz = 0.013 * 44100 / (2 * M_PI);
    const enum mm3_audio_format fmts[] = {MM3_AUDIO_MP3, MM3_AUDIO_OPUS};
    for (int k = 0; k < 2; k++) {
        struct audio_buf w = {0}, s = {0};
        encode_both(fmts[k], 44100, x, n, &w, &s);
        assert_true(w.len > 1000);
        assert_int_equal(s.len, w.len);
        assert_memory_equal(s.data, w.data, w.len);
        if (fmts[k] == MM3_AUDIO_MP3) /* an MPEG-1 Layer III frame header */
            assert_true(w.data[0] == 0xff && (w.data[1] & 0xfe) == 0xfa);
        else
            assert_memory_equal(w.data, "OggS", 4);
        SF_INFO info;
        float *y = decode(&w, &info);
        if (y) {
            size_t got = (size_t)info.frames;
            assert_int_equal(info.channels, 2);
            /* MP3 adds the encoder's delay and pads to whole 1152-sample frames; Ogg Opus
             * decodes at 48 kHz, trimmed to the exact length by its granule positions */
            double want = fmts[k] == MM3_AUDIO_MP3 ? (double)n : (double)n * info.samplerate / 44100.0;
            if (fmts[k] == MM3_AUDIO_MP3) {
                assert_int_equal(info.samplerate, 44100);
                if (got < n || got > n + 3 * 1152) fail_msg("mp3: %zu frames decoded for %zu", got, n);
            } else if (fabs((double)got - want) > 960) {
                fail_msg("opus: %zu frames decoded at %d Hz for %zu at 44100", got, info.samplerate, n);
            }
            double hl = crossing_hz(y, got, 2, 0, info.samplerate), hr = crossing_hz(y, got, 2, 1, info.samplerate);
            if (fabs(hl - left_hz) > 0.01 * left_hz || fabs(hr - right_hz) > 0.03 * right_hz)
                fail_msg("%s: decoded at %.1f / %.1f Hz, want %.1f / %.1f", audio_format_name(fmts[k]), hl, hr, left_hz,
                         right_hz);
            double rl = rms(y, got, 2, 0), rr = rms(y, got, 2, 1);
            if (fabs(rl - 0.8 / M_SQRT2) > 0.05 || fabs(rr - 0.5 / M_SQRT2) > 0.05)
                fail_msg("%s: decoded level %.3f / %.3f, want %.3f / %.3f", audio_format_name(fmts[k]), rl, rr,
                         0.8 / M_SQRT2, 0.5 / M_SQRT2);
            free(y);
        }
        audio_buf_free(&w);
        audio_buf_free(&s);
    }
    /* 32 kHz: MP3 stays at 32 kHz (an MPEG-1 rate); Opus records it as the input rate */
    struct audio_buf w = {0}, s = {0};
    encode_both(MM3_AUDIO_MP3, 32000, x, n, &w, &s);
    SF_INFO info;
    float *y = decode(&w, &info);
    if (y) assert_int_equal(info.samplerate, 32000);
    free(y);
    audio_buf_free(&w);
    audio_buf_free(&s);
    free(x);
}

static void test_bad_geometry(void **state)
{
    struct audio_encoder *e;
    assert_true(audio_encoder_create(&e, MM3_AUDIO_WAV, 0, 44100, 44100, false) < 0);
    assert_true(audio_encoder_create(&e, MM3_AUDIO_WAV, 2, 44100, 0, false) < 0);
    assert_null(e);
    /* An empty song is still a valid file. */
    struct audio_buf b = {0};
    assert_int_equal(audio_encoder_create(&e, MM3_AUDIO_WAV, 2, 44100, 44100, false), 0);
    assert_int_equal(audio_encoder_finish(e, &b), 0);
    audio_encoder_free(e);
    assert_int_equal(b.len, 44);
    assert_int_equal(b.data[40] | b.data[41] | b.data[42] | b.data[43], 0);
    audio_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pcm16_rule),          cmocka_unit_test(test_wav_header),
        cmocka_unit_test(test_stream_equals_whole), cmocka_unit_test(test_resampled_matches_resampler),
        cmocka_unit_test(test_bad_geometry),        cmocka_unit_test(test_lossy_decoded_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
