/* Streaming render to a WAV file (stage1/render_wav.h). */
#include "stage1/render_wav.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "common/resample.h"

struct wav_out {
    FILE *f;
    const char *path;
    enum wav_format format;
    int rate;
    struct resample *rs; /* NULL when the file has the vocoder's rate */
    float *rs_buf;       /* [2, rs_cap] */
    int64_t rs_cap;
    uint8_t *buf;
    size_t buf_cap;
    int64_t frames;
    double t0;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int wav_out_write(struct wav_out *w, const float *pcm, int64_t stride, int64_t n)
{
    size_t bytes = (size_t)n * 2 * wav_format_bytes(w->format);
    if (bytes > w->buf_cap) {
        uint8_t *b = realloc(w->buf, bytes);
        if (!b) return mm3_errorf(-ENOMEM, "%s: out of memory", w->path);
        w->buf = b;
        w->buf_cap = bytes;
    }
    wav_samples_encode(w->buf, pcm, stride, 2, n, w->format);
    if (fwrite(w->buf, 1, bytes, w->f) != bytes) return mm3_errorf(-EIO, "%s: write failed", w->path);
    w->frames += n;
    LOG_INFO("%.2f s of audio written after %.1f s", (double)w->frames / w->rate, now_s() - w->t0);
    return 0;
}

static int rs_reserve(struct wav_out *w, int64_t n)
{
    if (n <= w->rs_cap) return 0;
    float *b = realloc(w->rs_buf, sizeof(float) * 2 * (size_t)n);
    if (!b) return mm3_errorf(-ENOMEM, "%s: out of memory", w->path);
    w->rs_buf = b;
    w->rs_cap = n;
    return 0;
}

static int wav_out_emit(void *ctx, const float *pcm, int n)
{
    struct wav_out *w = ctx;
    if (!w->rs) return wav_out_write(w, pcm, n, n) < 0 ? -1 : 0;
    int64_t got = 0;
    if (rs_reserve(w, resample_stream_push_len(w->rs, n)) < 0 ||
        resample_stream_push(w->rs, pcm, n, n, w->rs_buf, w->rs_cap, &got) < 0)
        return -1;
    return wav_out_write(w, w->rs_buf, w->rs_cap, got) < 0 ? -1 : 0;
}

/* The resampler's tail, once the render has emitted everything. */
static int wav_out_flush(struct wav_out *w)
{
    if (!w->rs) return 0;
    int64_t got = 0;
    int rc;
    if ((rc = rs_reserve(w, resample_stream_finish_len(w->rs))) < 0 ||
        (rc = resample_stream_finish(w->rs, w->rs_buf, w->rs_cap, &got)) < 0 ||
        (rc = wav_out_write(w, w->rs_buf, w->rs_cap, got)) < 0)
        return rc;
    return 0;
}

static int wav_out_header(struct wav_out *w, uint32_t data_bytes)
{
    uint8_t hdr[WAV_HEADER_BYTES];
    wav_header(hdr, 2, w->rate, w->format, data_bytes);
    if (fwrite(hdr, 1, sizeof hdr, w->f) != sizeof hdr)
        return mm3_errorf(-EIO, "%s: writing the header failed", w->path);
    return 0;
}

static int vocoder_decode_cb(void *ctx, const float *latents, int L, float *pcm)
{
    return vocoder_decode(ctx, latents, L, pcm);
}

int render_to_wav(const char *path, const struct condition_model *cm, const struct dit_model *dm,
                  const struct vocoder *voc, const struct render_params *p, const struct render_wav_source *src,
                  const struct render_wav_format *fmt, int64_t *frames_out)
{
    int native = vocoder_sample_rate(voc);
    struct wav_out w = {
        .path = path, .format = fmt->format, .rate = fmt->sample_rate ? fmt->sample_rate : native, .t0 = now_s()};
    struct render *r = NULL;
    struct render_params rp = *p;
    if (!rp.decoder.decode) rp.decoder = (struct render_decoder){(void *)voc, vocoder_hop(voc), vocoder_decode_cb};
    rp.sink = (struct render_sink){&w, wav_out_emit};
    int rc = 0;
    if (frames_out) *frames_out = 0;
    if (w.rate != native && (rc = resample_create(&w.rs, native, w.rate, 2)) < 0) goto out;
    if (!(w.f = fopen(path, "wb"))) {
        rc = mm3_errorf(-errno, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    if ((rc = wav_out_header(&w, WAV_DATA_UNKNOWN)) < 0) goto out;
    if ((rc = render_create(&r, cm, dm, &rp)) < 0) goto out;
    if ((rc = src->feed(src->ctx, r)) < 0 || (rc = render_finish(r)) < 0 || (rc = wav_out_flush(&w)) < 0) goto out;
    /* now that the length is known, give the header the real data size */
    uint64_t data = (uint64_t)w.frames * 2 * wav_format_bytes(w.format);
    if (fseek(w.f, 0, SEEK_SET) != 0) {
        rc = mm3_errorf(-EIO, "%s: rewriting the header failed", path);
        goto out;
    }
    if ((rc = wav_out_header(&w, data > 0xFFFFFFFEu ? WAV_DATA_UNKNOWN : (uint32_t)data)) < 0) goto out;
    LOG_INFO("%s: %.2f s of %d Hz stereo in %.1f s", path, (double)w.frames / w.rate, w.rate, now_s() - w.t0);
    if (frames_out) *frames_out = w.frames;
out:
    if (w.f && fclose(w.f) != 0 && rc == 0) rc = mm3_errorf(-EIO, "%s: close failed", path);
    render_free(r);
    resample_free(w.rs);
    free(w.rs_buf);
    free(w.buf);
    return rc;
}
