/* WAV writer: the PCM16 rounding rule, the header bytes, files read back by independent
 * readers (libsndfile for format and samples, sox --i for the header), the streaming
 * header with an unknown length, our own reader, and write errors naming the path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/wav.h"
#include "support/test_support.h"

#define FRAMES 5000

static char *dir;
static float pcm[2 * FRAMES]; /* [2, FRAMES] channel-major */

static int setup(void **state)
{
    (void)state;
    dir = test_make_tmpdir("wav");
    /* left: a ramp over [-1.2, 1.2] (clamps at both ends), right: a sine; distinct channels */
    for (int i = 0; i < FRAMES; i++) {
        pcm[i] = -1.2f + 2.4f * (float)i / (FRAMES - 1);
        pcm[FRAMES + i] = 0.7f * sinf(0.01f * (float)i);
    }
    pcm[17] = NAN;
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    test_remove_tree(dir);
    free(dir);
    return 0;
}

static void test_pcm16_rule(void **state)
{
    (void)state;
    assert_int_equal(wav_sample_pcm16(0.0f), 0);
    assert_int_equal(wav_sample_pcm16(1.0f), 32767);
    assert_int_equal(wav_sample_pcm16(-1.0f), -32767);
    assert_int_equal(wav_sample_pcm16(2.0f), 32767);
    assert_int_equal(wav_sample_pcm16(-INFINITY), -32767);
    assert_int_equal(wav_sample_pcm16(NAN), 0);
    assert_int_equal(wav_sample_pcm16(0.5f), 16384); /* 16383.5 rounds away from zero */
    assert_int_equal(wav_sample_pcm16(-0.5f), -16384);
    assert_int_equal(wav_sample_pcm16(1.5f / 32767.0f), 2);
    assert_int_equal(wav_sample_pcm16(0.49f / 32767.0f), 0);
}

static uint32_t le32(const uint8_t *p)
{
    return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint32_t le16(const uint8_t *p)
{
    return p[0] | p[1] << 8;
}

static void test_header_bytes(void **state)
{
    (void)state;
    uint8_t h[WAV_HEADER_BYTES];
    assert_int_equal(wav_header(h, 2, 44100, WAV_FORMAT_PCM16, 1000), 44);
    assert_memory_equal(h, "RIFF", 4);
    assert_int_equal(le32(h + 4), 1036);
    assert_memory_equal(h + 8, "WAVEfmt ", 8);
    assert_int_equal(le32(h + 16), 16);
    assert_int_equal(le16(h + 20), 1);
    assert_int_equal(le16(h + 22), 2);
    assert_int_equal(le32(h + 24), 44100);
    assert_int_equal(le32(h + 28), 44100 * 4);
    assert_int_equal(le16(h + 32), 4);
    assert_int_equal(le16(h + 34), 16);
    assert_memory_equal(h + 36, "data", 4);
    assert_int_equal(le32(h + 40), 1000);
    wav_header(h, 2, 32000, WAV_FORMAT_F32, WAV_DATA_UNKNOWN);
    assert_int_equal(le16(h + 20), 3);
    assert_int_equal(le32(h + 28), 32000 * 8);
    assert_int_equal(le16(h + 34), 32);
    assert_int_equal(le32(h + 4), 0xFFFFFFFFu);
    assert_int_equal(le32(h + 40), 0xFFFFFFFFu);
}

static float clampf(float x)
{
    return isnan(x) ? 0.0f : x < -1 ? -1 : x > 1 ? 1 : x;
}

/* `sox --i -<opt> path` as a number, or -1 when sox is not installed. */
static long soxi(const char *opt, const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "sox --i -%s '%s' 2>/dev/null", opt, path);
    FILE *p = popen(cmd, "r");
    long v = -1;
    if (p) {
        if (fscanf(p, "%ld", &v) != 1) v = -1;
        pclose(p);
    }
    return v;
}

static void test_pcm16_file(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/a.wav", dir);
    assert_int_equal(wav_write_file(path, pcm, 2, FRAMES, 44100, WAV_FORMAT_PCM16), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 44 + 4 * FRAMES);

    SF_INFO info = {0};
    SNDFILE *sf = sf_open(path, SFM_READ, &info);
    assert_non_null(sf);
    assert_int_equal(info.samplerate, 44100);
    assert_int_equal(info.channels, 2);
    assert_int_equal(info.frames, FRAMES);
    assert_int_equal(info.format, SF_FORMAT_WAV | SF_FORMAT_PCM_16);
    short *got = malloc(sizeof(short) * 2 * FRAMES);
    assert_int_equal(sf_readf_short(sf, got, FRAMES), FRAMES);
    sf_close(sf);
    for (int i = 0; i < FRAMES; i++) {
        assert_int_equal(got[2 * i], wav_sample_pcm16(pcm[i]));
        assert_int_equal(got[2 * i + 1], wav_sample_pcm16(pcm[FRAMES + i]));
    }
    assert_int_equal(got[0], -32767); /* -1.2 clamped */
    assert_int_equal(got[2 * (FRAMES - 1)], 32767);
    assert_int_equal(got[2 * 17], 0); /* NaN */
    free(got);

    long rate = soxi("r", path);
    if (rate < 0) {
        printf("sox not installed: header checked by libsndfile only\n");
    } else {
        assert_int_equal(rate, 44100);
        assert_int_equal(soxi("c", path), 2);
        assert_int_equal(soxi("s", path), FRAMES);
        assert_int_equal(soxi("b", path), 16);
    }

    /* our reader gives back the quantised values */
    struct wav_info wi;
    float *back;
    assert_int_equal(wav_read_file(path, &wi, &back), 0);
    assert_int_equal(wi.channels, 2);
    assert_int_equal(wi.rate, 44100);
    assert_int_equal(wi.frames, FRAMES);
    assert_int_equal(wi.format, WAV_FORMAT_PCM16);
    for (int i = 0; i < 2 * FRAMES; i++)
        assert_true(fabsf(back[i] - clampf(pcm[i])) <= 0.5f / 32767 + 1e-7f);
    free(back);
}

static void test_f32_file(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/b.wav", dir);
    assert_int_equal(wav_write_file(path, pcm, 2, FRAMES, 32000, WAV_FORMAT_F32), 0);
    SF_INFO info = {0};
    SNDFILE *sf = sf_open(path, SFM_READ, &info);
    assert_non_null(sf);
    assert_int_equal(info.samplerate, 32000);
    assert_int_equal(info.channels, 2);
    assert_int_equal(info.frames, FRAMES);
    assert_int_equal(info.format, SF_FORMAT_WAV | SF_FORMAT_FLOAT);
    float *got = malloc(sizeof(float) * 2 * FRAMES);
    assert_int_equal(sf_readf_float(sf, got, FRAMES), FRAMES);
    sf_close(sf);
    for (int i = 0; i < FRAMES; i++) {
        assert_true(got[2 * i] == clampf(pcm[i]));
        assert_true(got[2 * i + 1] == clampf(pcm[FRAMES + i]));
    }
    free(got);
    if (soxi("r", path) >= 0) assert_int_equal(soxi("s", path), FRAMES);

    struct wav_info wi;
    float *back;
    assert_int_equal(wav_read_file(path, &wi, &back), 0);
    assert_int_equal(wi.format, WAV_FORMAT_F32);
    for (int i = 0; i < 2 * FRAMES; i++)
        assert_true(back[i] == clampf(pcm[i]));
    free(back);
}

/* A stream: header with unknown size, then samples encoded in uneven chunks. */
static void test_stream_unknown_length(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/s.wav", dir);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint8_t h[WAV_HEADER_BYTES], buf[2 * 2 * 1000];
    assert_int_equal(fwrite(h, 1, wav_header(h, 2, 44100, WAV_FORMAT_PCM16, WAV_DATA_UNKNOWN), fp), 44);
    for (int f = 0, n; f < FRAMES; f += n) {
        n = f % 3 == 0 ? 999 : 1;
        if (n > FRAMES - f) n = FRAMES - f;
        wav_samples_encode(buf, pcm + f, FRAMES, 2, n, WAV_FORMAT_PCM16);
        assert_int_equal(fwrite(buf, 1, (size_t)n * 4, fp), (size_t)n * 4);
    }
    assert_int_equal(fclose(fp), 0);
    struct wav_info wi;
    float *back;
    assert_int_equal(wav_read_file(path, &wi, &back), 0);
    assert_int_equal(wi.frames, FRAMES);
    for (int i = 0; i < FRAMES; i++)
        assert_true(back[i] == (float)wav_sample_pcm16(pcm[i]) / 32767.0f);
    free(back);
    /* libsndfile takes the unknown size as "to the end of the file" */
    SF_INFO info = {0};
    SNDFILE *sf = sf_open(path, SFM_READ, &info);
    assert_non_null(sf);
    assert_int_equal(info.frames, FRAMES);
    sf_close(sf);
}

static void test_write_errors(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/no/such/dir/x.wav", dir);
    assert_int_equal(wav_write_file(path, pcm, 2, FRAMES, 44100, WAV_FORMAT_PCM16), -ENOENT);
    assert_non_null(strstr(mm3_last_error(), path));
    struct stat st;
    if (stat("/dev/full", &st) == 0) {
        /* disk full: reported, named, and the device is left alone */
        assert_int_equal(wav_write_file("/dev/full", pcm, 2, FRAMES, 44100, WAV_FORMAT_F32), -ENOSPC);
        assert_non_null(strstr(mm3_last_error(), "/dev/full"));
        assert_int_equal(stat("/dev/full", &st), 0);
    }
    snprintf(path, sizeof path, "%s/bad.wav", dir);
    assert_int_equal(wav_write_file(path, pcm, 0, FRAMES, 44100, WAV_FORMAT_PCM16), -EINVAL);
    assert_int_equal(wav_write_file(path, pcm, 2, 600000000, 44100, WAV_FORMAT_F32), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "4 GiB"));
    assert_int_equal(wav_read_file(path, &(struct wav_info){0}, &(float *){NULL}), -ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pcm16_rule),
        cmocka_unit_test(test_header_bytes),
        cmocka_unit_test(test_pcm16_file),
        cmocka_unit_test(test_f32_file),
        cmocka_unit_test(test_stream_unknown_length),
        cmocka_unit_test(test_write_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
