#include "stage0/api/audio_mp3.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include <lame/lame.h>

#include "common/error.h"

struct audio_mp3 {
    lame_global_flags *lame;
    int channels;
};

int audio_mp3_open(struct audio_mp3 **out, int channels, int rate)
{
    *out = NULL;
    if (channels < 1 || channels > 2 || (rate != 44100 && rate != 32000 && rate != 48000))
        return mm3_errorf(-EINVAL, "mp3: %d channels at %d Hz: expected 1 or 2 channels at 32000, 44100 or 48000 Hz",
                          channels, rate);
    struct audio_mp3 *m = calloc(1, sizeof *m);
    if (!m || !(m->lame = lame_init())) {
        free(m);
        return mm3_errorf(-ENOMEM, "mp3: out of memory");
    }
    m->channels = channels;
    lame_set_num_channels(m->lame, channels);
    lame_set_in_samplerate(m->lame, rate);
    lame_set_out_samplerate(m->lame, rate);
    lame_set_mode(m->lame, channels == 2 ? JOINT_STEREO : MONO);
    lame_set_VBR(m->lame, vbr_off);
    lame_set_brate(m->lame, AUDIO_MP3_KBPS);
    /* 2 is "near best": LAME's own recommendation for quality at a modest cost */
    lame_set_quality(m->lame, 2);
    /* The Info frame would need a seek back to the start at the end: a stream cannot. */
    lame_set_bWriteVbrTag(m->lame, 0);
    if (lame_init_params(m->lame) < 0) {
        audio_mp3_free(m);
        return mm3_errorf(-EINVAL, "mp3: LAME refused %d channels at %d Hz, %d kbit/s", channels, rate,
                          AUDIO_MP3_KBPS);
    }
    *out = m;
    return 0;
}

/* LAME's documented worst case for the output of n samples per channel. */
static size_t mp3_bound(size_t n_frames)
{
    return n_frames + n_frames / 4 + 7200;
}

int audio_mp3_encode(struct audio_mp3 *m, const int16_t *pcm, size_t n_frames, struct audio_buf *out)
{
    /* LAME counts in int: feed at most a million frames per call */
    const size_t step = 1 << 20;
    for (size_t done = 0; done < n_frames;) {
        size_t n = n_frames - done < step ? n_frames - done : step;
        size_t cap = mp3_bound(n);
        int rc = audio_buf_reserve(out, cap);
        if (rc < 0) return rc;
        const int16_t *p = pcm + done * (size_t)m->channels;
        int got;
        if (m->channels == 2) {
            got = lame_encode_buffer_interleaved(m->lame, (short *)p, (int)n, out->data + out->len, (int)cap);
        } else {
            got = lame_encode_buffer(m->lame, p, p, (int)n, out->data + out->len, (int)cap);
        }
        if (got < 0) return mm3_errorf(-EIO, "mp3: LAME failed to encode (%d)", got);
        out->len += (size_t)got;
        done += n;
    }
    return 0;
}

int audio_mp3_finish(struct audio_mp3 *m, struct audio_buf *out)
{
    size_t cap = 7200;
    int rc = audio_buf_reserve(out, cap);
    if (rc < 0) return rc;
    int got = lame_encode_flush(m->lame, out->data + out->len, (int)cap);
    if (got < 0) return mm3_errorf(-EIO, "mp3: LAME failed to flush (%d)", got);
    out->len += (size_t)got;
    return 0;
}

void audio_mp3_free(struct audio_mp3 *m)
{
    if (!m) return;
    if (m->lame) lame_close(m->lame);
    free(m);
}
