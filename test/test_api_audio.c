/* Output encoders: PCM16 conversion rule (common/wav.h's), WAV header bytes, whole-file vs
 * streamed output identity for any chunking, and the 32 kHz path equal to the
 * whole-buffer resampler of common/resample.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
        cmocka_unit_test(test_bad_geometry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
