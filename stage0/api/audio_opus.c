#include "stage0/api/audio_opus.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include <opus/opusenc.h>

#include "common/error.h"

/* "mm3o" */
#define AUDIO_OPUS_SERIAL 0x6d6d336f

struct audio_opus {
    OggOpusEnc *enc;
    int channels;
    struct audio_buf pages; /* written by the callback, moved to the caller's buffer */
    bool write_failed;
};

static int opus_write_cb(void *user, const unsigned char *ptr, opus_int32 len)
{
    struct audio_opus *o = user;
    if (audio_buf_append(&o->pages, ptr, (size_t)len) < 0) {
        o->write_failed = true;
        return 1; /* libopusenc: non-zero = failure */
    }
    return 0;
}

static int opus_close_cb(void *user)
{
    return 0;
}

static int pages_take(struct audio_opus *o, struct audio_buf *out)
{
    if (o->write_failed) return mm3_errorf(-ENOMEM, "opus: out of memory for the Ogg pages");
    int rc = audio_buf_append(out, o->pages.data, o->pages.len);
    o->pages.len = 0;
    return rc;
}

int audio_opus_open(struct audio_opus **out, int channels, int rate)
{
    *out = NULL;
    if (channels < 1 || channels > 2 || rate < 8000 || rate > 192000)
        return mm3_errorf(-EINVAL, "opus: %d channels at %d Hz: expected 1 or 2 channels at 8000..192000 Hz",
                          channels, rate);
    struct audio_opus *o = calloc(1, sizeof *o);
    OggOpusComments *comments = ope_comments_create();
    if (!o || !comments) {
        free(o);
        if (comments) ope_comments_destroy(comments);
        return mm3_errorf(-ENOMEM, "opus: out of memory");
    }
    o->channels = channels;
    static const OpusEncCallbacks callbacks = {opus_write_cb, opus_close_cb};
    int err = OPE_OK;
    o->enc = ope_encoder_create_callbacks(&callbacks, o, comments, rate, channels, 0, &err);
    ope_comments_destroy(comments); /* the encoder keeps its own copy */
    if (!o->enc) {
        free(o);
        return mm3_errorf(-EINVAL, "opus: cannot create the encoder: %s", ope_strerror(err));
    }
    /* The page delay is in 48 kHz samples. The stream serial is fixed, not random, so the
     * same song is the same bytes (one logical stream per file: no chaining to tell apart). */
    if ((err = ope_encoder_ctl(o->enc, OPE_SET_SERIALNO(AUDIO_OPUS_SERIAL))) != OPE_OK ||
        (err = ope_encoder_ctl(o->enc, OPUS_SET_BITRATE(AUDIO_OPUS_BITRATE))) != OPE_OK ||
        (err = ope_encoder_ctl(o->enc, OPE_SET_MUXING_DELAY(48 * AUDIO_OPUS_PAGE_MS))) != OPE_OK ||
        (err = ope_encoder_flush_header(o->enc)) != OPE_OK) {
        audio_opus_free(o);
        return mm3_errorf(-EINVAL, "opus: cannot configure the encoder: %s", ope_strerror(err));
    }
    *out = o;
    return 0;
}

int audio_opus_encode(struct audio_opus *o, const int16_t *pcm, size_t n_frames, struct audio_buf *out)
{
    /* libopusenc counts in int: feed at most a million frames per call */
    const size_t step = 1 << 20;
    for (size_t done = 0; done < n_frames;) {
        size_t n = n_frames - done < step ? n_frames - done : step;
        int err = ope_encoder_write(o->enc, pcm + done * (size_t)o->channels, (int)n);
        if (err != OPE_OK) return mm3_errorf(-EIO, "opus: encode failed: %s", ope_strerror(err));
        done += n;
    }
    return pages_take(o, out);
}

int audio_opus_finish(struct audio_opus *o, struct audio_buf *out)
{
    int err = ope_encoder_drain(o->enc);
    if (err != OPE_OK) return mm3_errorf(-EIO, "opus: drain failed: %s", ope_strerror(err));
    return pages_take(o, out);
}

void audio_opus_free(struct audio_opus *o)
{
    if (!o) return;
    if (o->enc) ope_encoder_destroy(o->enc);
    audio_buf_free(&o->pages);
    free(o);
}
