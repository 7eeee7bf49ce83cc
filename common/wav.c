/* RIFF/WAVE writer and minimal reader (common/wav.h). */
#include "common/wav.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"

#define WAV_MAX_CHANNELS 65535

int wav_format_bytes(enum wav_format format)
{
    return format == WAV_FORMAT_PCM16 ? 2 : 4;
}

static void put_u16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u16(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
static uint32_t get_u32(const uint8_t *p)
{
    return get_u16(p) | get_u16(p + 2) << 16;
}

size_t wav_header(uint8_t buf[WAV_HEADER_BYTES], int channels, int rate, enum wav_format format, uint32_t data_bytes)
{
    CHECK(channels >= 1 && channels <= WAV_MAX_CHANNELS && rate >= 1);
    CHECK(format == WAV_FORMAT_PCM16 || format == WAV_FORMAT_F32);
    uint32_t bytes = (uint32_t)wav_format_bytes(format);
    uint32_t riff = data_bytes > 0xFFFFFFFFu - 36 ? 0xFFFFFFFFu : data_bytes + 36;
    memcpy(buf, "RIFF", 4);
    put_u32(buf + 4, riff);
    memcpy(buf + 8, "WAVEfmt ", 8);
    put_u32(buf + 16, 16);
    put_u16(buf + 20, (uint32_t)format);
    put_u16(buf + 22, (uint32_t)channels);
    put_u32(buf + 24, (uint32_t)rate);
    put_u32(buf + 28, (uint32_t)rate * (uint32_t)channels * bytes);
    put_u16(buf + 32, (uint32_t)channels * bytes);
    put_u16(buf + 34, bytes * 8);
    memcpy(buf + 36, "data", 4);
    put_u32(buf + 40, data_bytes);
    return WAV_HEADER_BYTES;
}

static float wav_sample_clamp(float x)
{
    if (isnan(x)) return 0.0f;
    return x < -1.0f ? -1.0f : x > 1.0f ? 1.0f : x;
}

int16_t wav_sample_pcm16(float x)
{
    return (int16_t)lroundf(wav_sample_clamp(x) * 32767.0f);
}

void wav_samples_encode(uint8_t *dst, const float *pcm, int64_t stride, int channels, int64_t frames,
                        enum wav_format format)
{
    for (int64_t f = 0; f < frames; f++)
        for (int c = 0; c < channels; c++) {
            float x = pcm[c * stride + f];
            if (format == WAV_FORMAT_PCM16) {
                put_u16(dst, (uint16_t)wav_sample_pcm16(x));
                dst += 2;
            } else {
                float y = wav_sample_clamp(x);
                uint32_t u;
                memcpy(&u, &y, 4);
                put_u32(dst, u);
                dst += 4;
            }
        }
}

int wav_write_file(const char *path, const float *pcm, int channels, int64_t frames, int rate, enum wav_format format)
{
    if (channels < 1 || channels > WAV_MAX_CHANNELS || rate < 1 || frames < 0 ||
        (format != WAV_FORMAT_PCM16 && format != WAV_FORMAT_F32))
        return mm3_errorf(-EINVAL, "%s: cannot write %d channels x %lld frames at %d Hz, format %d", path, channels,
                          (long long)frames, rate, (int)format);
    int bytes = wav_format_bytes(format);
    uint64_t data = (uint64_t)frames * (uint64_t)channels * (uint64_t)bytes;
    if (data > 0xFFFFFFFFull - 36)
        return mm3_errorf(-EINVAL, "%s: %llu bytes of samples do not fit a RIFF/WAVE file (4 GiB)", path,
                          (unsigned long long)data);
    FILE *fp = fopen(path, "wb");
    if (!fp) return mm3_errorf(-errno, "%s: cannot create: %s", path, strerror(errno));
    /* only a regular file we wrote is removed on failure (never /dev/full, a FIFO...) */
    struct stat st;
    int regular = fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode);
    uint8_t header[WAV_HEADER_BYTES];
    wav_header(header, channels, rate, format, (uint32_t)data);
    int ok = fwrite(header, 1, sizeof header, fp) == sizeof header;
    enum { CHUNK_FRAMES = 4096 };
    uint8_t *buf = malloc((size_t)CHUNK_FRAMES * channels * bytes);
    int err = buf ? 0 : ENOMEM;
    for (int64_t f = 0; ok && buf && f < frames; f += CHUNK_FRAMES) {
        int64_t n = frames - f < CHUNK_FRAMES ? frames - f : CHUNK_FRAMES;
        wav_samples_encode(buf, pcm + f, frames, channels, n, format);
        size_t len = (size_t)n * channels * bytes;
        ok = fwrite(buf, 1, len, fp) == len;
    }
    if (!ok) err = errno ? errno : EIO;
    free(buf);
    /* a full disk often shows only when the buffered tail is flushed */
    if (fclose(fp) != 0 && !err) err = errno ? errno : EIO;
    if (err) {
        if (regular) unlink(path);
        return mm3_errorf(-err, "%s: writing %llu bytes of WAVE data failed: %s", path,
                          (unsigned long long)data + WAV_HEADER_BYTES, strerror(err));
    }
    return 0;
}

/* ---- reader ---- */

static int read_whole(const char *path, uint8_t **out, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return mm3_errorf(-errno, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    uint8_t *p = malloc(cap);
    while (p) {
        n += fread(p + n, 1, cap - n, fp);
        if (n < cap) break;
        uint8_t *q = realloc(p, cap * 2);
        if (!q) {
            free(p);
            p = NULL;
            break;
        }
        p = q;
        cap *= 2;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (!p) return mm3_errorf(-ENOMEM, "%s: out of memory", path);
    if (bad) {
        free(p);
        return mm3_errorf(-EIO, "%s: read error", path);
    }
    *out = p;
    *len = n;
    return 0;
}

int wav_read_file(const char *path, struct wav_info *info, float **pcm)
{
    *pcm = NULL;
    memset(info, 0, sizeof *info);
    uint8_t *d = NULL;
    size_t len = 0;
    int rc = read_whole(path, &d, &len);
    if (rc < 0) return rc;
    rc = -EINVAL;
    if (len < 12 || memcmp(d, "RIFF", 4) || memcmp(d + 8, "WAVE", 4)) {
        mm3_errorf(rc, "%s: not a RIFF/WAVE file", path);
        goto done;
    }
    int have_fmt = 0, bits = 0;
    size_t pos = 12;
    while (pos + 8 <= len) {
        const uint8_t *ch = d + pos;
        uint32_t size = get_u32(ch + 4);
        size_t body = pos + 8, avail = len - body;
        if (!memcmp(ch, "fmt ", 4)) {
            if (size < 16 || size > avail) {
                mm3_errorf(rc, "%s: 'fmt ' chunk of %u bytes, expected 16..%zu", path, size, avail);
                goto done;
            }
            info->format = (enum wav_format)get_u16(d + body);
            info->channels = (int)get_u16(d + body + 2);
            info->rate = (int)get_u32(d + body + 4);
            bits = (int)get_u16(d + body + 14);
            have_fmt = 1;
        } else if (!memcmp(ch, "data", 4)) {
            if (!have_fmt) {
                mm3_errorf(rc, "%s: 'data' chunk before 'fmt '", path);
                goto done;
            }
            if (!((info->format == WAV_FORMAT_PCM16 && bits == 16) || (info->format == WAV_FORMAT_F32 && bits == 32)) ||
                info->channels < 1 || info->rate < 1) {
                mm3_errorf(rc, "%s: format tag %d, %d bits, %d channels, %d Hz: expected 16-bit PCM or 32-bit float",
                           path, (int)info->format, bits, info->channels, info->rate);
                goto done;
            }
            if (size == WAV_DATA_UNKNOWN) size = (uint32_t)(avail > 0xFFFFFFFEu ? 0xFFFFFFFEu : avail);
            if (size > avail) {
                mm3_errorf(rc, "%s: 'data' chunk of %u bytes but only %zu in the file", path, size, avail);
                goto done;
            }
            size_t frame_bytes = (size_t)info->channels * (size_t)(bits / 8);
            info->frames = (int64_t)(size / frame_bytes);
            *pcm = malloc(sizeof(float) * (size_t)(info->frames * info->channels) + 1);
            if (!*pcm) {
                rc = mm3_errorf(-ENOMEM, "%s: out of memory", path);
                goto done;
            }
            const uint8_t *s = d + body;
            for (int64_t f = 0; f < info->frames; f++)
                for (int c = 0; c < info->channels; c++) {
                    float x;
                    if (bits == 16) {
                        x = (float)(int16_t)get_u16(s) / 32767.0f;
                        s += 2;
                    } else {
                        uint32_t u = get_u32(s);
                        memcpy(&x, &u, 4);
                        s += 4;
                    }
                    (*pcm)[c * info->frames + f] = x;
                }
            rc = 0;
            goto done;
        }
        pos = body + size + (size & 1); /* chunks are padded to even sizes */
        if (pos < body) break;          /* size overflowed */
    }
    mm3_errorf(rc, "%s: no 'data' chunk", path);
done:
    free(d);
    return rc;
}
