#include "stage0/api/audio_encode.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <FLAC/stream_encoder.h>

#include "common/error.h"
#include "common/resample.h"
#include "common/wav.h"
#include "stage0/api/audio_mp3.h"
#include "stage0/api/audio_opus.h"

/* Move src's bytes to the end of dst; src ends empty. Swaps when dst is empty. */
static int audio_buf_move(struct audio_buf *dst, struct audio_buf *src)
{
    if (dst->len == 0) {
        struct audio_buf t = *dst;
        *dst = *src;
        *src = t;
        src->len = 0;
        return 0;
    }
    int rc = audio_buf_append(dst, src->data, src->len);
    src->len = 0;
    return rc;
}

/* ---- PCM16 and WAV ---- */

void audio_pcm16_from_f32(int16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = wav_sample_pcm16(src[i]);
}

const char *audio_format_content_type(enum mm3_audio_format fmt)
{
    switch (fmt) {
    case MM3_AUDIO_WAV:
        return "audio/wav";
    case MM3_AUDIO_PCM:
        return "audio/pcm";
    case MM3_AUDIO_FLAC:
        return "audio/flac";
    case MM3_AUDIO_MP3:
        return "audio/mpeg";
    case MM3_AUDIO_OPUS:
        return "audio/ogg"; /* Ogg Opus (RFC 7845) */
    }
    return "application/octet-stream";
}

const char *audio_format_name(enum mm3_audio_format fmt)
{
    switch (fmt) {
    case MM3_AUDIO_WAV:
        return "wav";
    case MM3_AUDIO_PCM:
        return "pcm";
    case MM3_AUDIO_FLAC:
        return "flac";
    case MM3_AUDIO_MP3:
        return "mp3";
    case MM3_AUDIO_OPUS:
        return "opus";
    }
    return "?";
}

/* ---- encoder ---- */

struct audio_encoder {
    enum mm3_audio_format fmt;
    int channels, rate;
    bool streaming, header_done, failed;
    uint64_t data_bytes;   /* PCM payload so far (WAV whole-file sizes) */
    struct audio_buf file; /* whole-file mode: everything; streaming: pending bytes */
    size_t flac_pos;       /* FLAC write position in `file` (it seeks back at finish) */
    FLAC__StreamEncoder *flac;
    struct audio_mp3 *mp3;
    struct audio_opus *opus;
    int16_t *s16;     /* scratch */
    FLAC__int32 *s32; /* scratch */
    size_t scratch_frames;
    struct resample *rs; /* NULL when in_rate == out_rate */
    float *planar;       /* resampler scratch: [channels][planar_cap] in, then out */
    float *inter;        /* resampled, interleaved again */
    size_t planar_cap, inter_cap;
};

static FLAC__StreamEncoderWriteStatus flac_write_cb(const FLAC__StreamEncoder *enc, const FLAC__byte buffer[],
                                                    size_t bytes, uint32_t samples, uint32_t frame, void *cls)
{
    struct audio_encoder *e = cls;
    size_t end = e->flac_pos + bytes;
    if (end > e->file.len) {
        if (audio_buf_reserve(&e->file, end - e->file.len) < 0) return FLAC__STREAM_ENCODER_WRITE_STATUS_FATAL_ERROR;
        e->file.len = end;
    }
    memcpy(e->file.data + e->flac_pos, buffer, bytes);
    e->flac_pos = end;
    return FLAC__STREAM_ENCODER_WRITE_STATUS_OK;
}

static FLAC__StreamEncoderSeekStatus flac_seek_cb(const FLAC__StreamEncoder *enc, FLAC__uint64 off, void *cls)
{
    struct audio_encoder *e = cls;
    if (off > e->file.len) return FLAC__STREAM_ENCODER_SEEK_STATUS_ERROR;
    e->flac_pos = (size_t)off;
    return FLAC__STREAM_ENCODER_SEEK_STATUS_OK;
}

static FLAC__StreamEncoderTellStatus flac_tell_cb(const FLAC__StreamEncoder *enc, FLAC__uint64 *off, void *cls)
{
    struct audio_encoder *e = cls;
    *off = e->flac_pos;
    return FLAC__STREAM_ENCODER_TELL_STATUS_OK;
}

static int flac_open(struct audio_encoder *e)
{
    e->flac = FLAC__stream_encoder_new();
    if (!e->flac) return mm3_errorf(-ENOMEM, "flac encoder: out of memory");
    bool ok = FLAC__stream_encoder_set_channels(e->flac, (uint32_t)e->channels) &&
              FLAC__stream_encoder_set_bits_per_sample(e->flac, 16) &&
              FLAC__stream_encoder_set_sample_rate(e->flac, (uint32_t)e->rate) &&
              FLAC__stream_encoder_set_compression_level(e->flac, 5);
    if (!ok) return mm3_errorf(-EINVAL, "flac encoder: cannot configure %d channels at %d Hz", e->channels, e->rate);
    /* Without seek/tell the encoder leaves STREAMINFO's length unknown, which is
     * exactly what a stream needs; whole files get it patched in place. */
    FLAC__StreamEncoderInitStatus st = FLAC__stream_encoder_init_stream(
        e->flac, flac_write_cb, e->streaming ? NULL : flac_seek_cb, e->streaming ? NULL : flac_tell_cb, NULL, e);
    if (st != FLAC__STREAM_ENCODER_INIT_STATUS_OK)
        return mm3_errorf(-EINVAL, "flac encoder: init failed: %s", FLAC__StreamEncoderInitStatusString[st]);
    return 0;
}

int audio_encoder_create(struct audio_encoder **out, enum mm3_audio_format fmt, int channels, int in_rate, int out_rate,
                         bool streaming)
{
    *out = NULL;
    if (channels < 1 || channels > 8 || in_rate < 1 || out_rate < 1)
        return mm3_errorf(-EINVAL, "audio encoder: bad geometry: %d channels, %d -> %d Hz", channels, in_rate,
                          out_rate);
    int rc;
    struct audio_encoder *e = calloc(1, sizeof *e);
    if (!e) return mm3_errorf(-ENOMEM, "audio encoder: out of memory");
    e->fmt = fmt;
    e->channels = channels;
    e->rate = out_rate;
    e->streaming = streaming;
    if (in_rate != out_rate && (rc = resample_create(&e->rs, in_rate, out_rate, channels)) < 0) {
        audio_encoder_free(e);
        return mm3_error_prefix(rc, "sample_rate %d: ", out_rate);
    }
    rc = fmt == MM3_AUDIO_FLAC   ? flac_open(e)
         : fmt == MM3_AUDIO_MP3  ? audio_mp3_open(&e->mp3, channels, out_rate)
         : fmt == MM3_AUDIO_OPUS ? audio_opus_open(&e->opus, channels, out_rate)
                                 : 0;
    if (rc < 0) {
        audio_encoder_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

static int scratch_ensure(struct audio_encoder *e, size_t n_frames)
{
    if (n_frames <= e->scratch_frames) return 0;
    size_t n = n_frames * (size_t)e->channels;
    int16_t *s16 = realloc(e->s16, n * sizeof *s16);
    if (s16) e->s16 = s16;
    FLAC__int32 *s32 = realloc(e->s32, n * sizeof *s32);
    if (s32) e->s32 = s32;
    if (!s16 || !s32) return mm3_errorf(-ENOMEM, "audio encoder: out of memory");
    e->scratch_frames = n_frames;
    return 0;
}

static int wav_header_once(struct audio_encoder *e)
{
    if (e->header_done || e->fmt != MM3_AUDIO_WAV) return 0;
    uint8_t h[WAV_HEADER_BYTES];
    /* Whole files get their sizes patched at finish. */
    wav_header(h, e->channels, e->rate, WAV_FORMAT_PCM16, WAV_DATA_UNKNOWN);
    e->header_done = true;
    return audio_buf_append(&e->file, h, sizeof h);
}

/* In streaming mode, hand over what is pending. */
static int flush_stream(struct audio_encoder *e, struct audio_buf *out)
{
    if (!e->streaming) return 0;
    int rc = audio_buf_move(out, &e->file);
    e->flac_pos = 0;
    return rc;
}

/* Encode n_frames interleaved frames already at the output rate. */
static int encode_frames(struct audio_encoder *e, const float *pcm, size_t n_frames, struct audio_buf *out)
{
    int rc = wav_header_once(e);
    if (rc == 0) rc = scratch_ensure(e, n_frames);
    if (rc < 0) goto fail;
    size_t n = n_frames * (size_t)e->channels;
    audio_pcm16_from_f32(e->s16, pcm, n);
    if (e->fmt == MM3_AUDIO_FLAC) {
        for (size_t i = 0; i < n; i++)
            e->s32[i] = e->s16[i];
        if (n_frames && !FLAC__stream_encoder_process_interleaved(e->flac, e->s32, (uint32_t)n_frames)) {
            rc = mm3_errorf(-EIO, "flac encoder: %s", FLAC__stream_encoder_get_resolved_state_string(e->flac));
            goto fail;
        }
    } else if (e->fmt == MM3_AUDIO_MP3) {
        if ((rc = audio_mp3_encode(e->mp3, e->s16, n_frames, &e->file)) < 0) goto fail;
    } else if (e->fmt == MM3_AUDIO_OPUS) {
        if ((rc = audio_opus_encode(e->opus, e->s16, n_frames, &e->file)) < 0) goto fail;
    } else {
        /* Little-endian host assumed (x86-64, aarch64): int16 memory is PCM16 LE. */
        if ((rc = audio_buf_append(&e->file, e->s16, n * sizeof(int16_t))) < 0) goto fail;
        e->data_bytes += n * sizeof(int16_t);
    }
    if ((rc = flush_stream(e, out)) < 0) goto fail;
    return 0;
fail:
    e->failed = true;
    return rc;
}

/* Grow a float scratch to n elements. */
static int floats_ensure(float **p, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    float *q = realloc(*p, n * sizeof *q);
    if (!q) return mm3_errorf(-ENOMEM, "audio encoder: out of memory for %zu samples", n);
    *p = q;
    *cap = n;
    return 0;
}

/* Interleave planar resampler output ([channels][stride]) and encode it. */
static int encode_planar(struct audio_encoder *e, const float *planar, int64_t stride, int64_t n, struct audio_buf *out)
{
    int ch = e->channels;
    int rc = floats_ensure(&e->inter, &e->inter_cap, (size_t)n * (size_t)ch);
    if (rc < 0) return rc;
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < ch; c++)
            e->inter[i * ch + c] = planar[c * stride + i];
    return encode_frames(e, e->inter, (size_t)n, out);
}

/* The resampler takes channel-major blocks; stage 1 gives interleaved frames. */
static int resample_frames(struct audio_encoder *e, const float *pcm, size_t n_frames, struct audio_buf *out)
{
    int ch = e->channels;
    int64_t n = (int64_t)n_frames, n_out_max = resample_stream_push_len(e->rs, n);
    int64_t stride = n > n_out_max ? n : n_out_max;
    int rc = floats_ensure(&e->planar, &e->planar_cap, (size_t)stride * (size_t)ch * 2);
    if (rc < 0) return rc;
    float *in = e->planar, *res = e->planar + (size_t)stride * (size_t)ch;
    for (int64_t i = 0; i < n; i++)
        for (int c = 0; c < ch; c++)
            in[c * stride + i] = pcm[i * ch + c];
    int64_t n_out = 0;
    if ((rc = resample_stream_push(e->rs, in, stride, n, res, stride, &n_out)) < 0) return rc;
    return encode_planar(e, res, stride, n_out, out);
}

static int resample_tail(struct audio_encoder *e, struct audio_buf *out)
{
    int64_t n = resample_stream_finish_len(e->rs);
    if (n <= 0) return 0;
    int rc = floats_ensure(&e->planar, &e->planar_cap, (size_t)n * (size_t)e->channels);
    if (rc < 0) return rc;
    int64_t n_out = 0;
    if ((rc = resample_stream_finish(e->rs, e->planar, n, &n_out)) < 0) return rc;
    return encode_planar(e, e->planar, n, n_out, out);
}

int audio_encoder_write(struct audio_encoder *e, const float *pcm, size_t n_frames, struct audio_buf *out)
{
    if (e->failed) return mm3_errorf(-EIO, "audio encoder: earlier error");
    int rc = e->rs ? resample_frames(e, pcm, n_frames, out) : encode_frames(e, pcm, n_frames, out);
    if (rc < 0) e->failed = true;
    return rc;
}

int audio_encoder_finish(struct audio_encoder *e, struct audio_buf *out)
{
    if (e->failed) return mm3_errorf(-EIO, "audio encoder: earlier error");
    int rc = e->rs ? resample_tail(e, out) : 0;
    if (rc == 0) rc = wav_header_once(e);
    if (rc < 0) {
        e->failed = true;
        return rc;
    }
    if (e->fmt == MM3_AUDIO_FLAC) {
        if (!FLAC__stream_encoder_finish(e->flac))
            return mm3_errorf(-EIO, "flac encoder: finish failed: %s",
                              FLAC__stream_encoder_get_resolved_state_string(e->flac));
    }
    if (e->fmt == MM3_AUDIO_MP3 && (rc = audio_mp3_finish(e->mp3, &e->file)) < 0) return rc;
    if (e->fmt == MM3_AUDIO_OPUS && (rc = audio_opus_finish(e->opus, &e->file)) < 0) return rc;
    if (e->fmt == MM3_AUDIO_WAV && !e->streaming) {
        if (e->data_bytes > 0xFFFFFFFFu - 36u)
            return mm3_errorf(-EFBIG, "wav: %llu data bytes do not fit a RIFF header",
                              (unsigned long long)e->data_bytes);
        wav_header(e->file.data, e->channels, e->rate, WAV_FORMAT_PCM16, (uint32_t)e->data_bytes);
    }
    return audio_buf_move(out, &e->file);
}

void audio_encoder_free(struct audio_encoder *e)
{
    if (!e) return;
    if (e->flac) FLAC__stream_encoder_delete(e->flac);
    audio_mp3_free(e->mp3);
    audio_opus_free(e->opus);
    audio_buf_free(&e->file);
    free(e->s16);
    free(e->s32);
    resample_free(e->rs);
    free(e->planar);
    free(e->inter);
    free(e);
}
