/* Ogg Opus for the HTTP API (response_format "opus"): libopusenc, which resamples the
 * 44.1 or 32 kHz input to Opus' 48 kHz itself and records the input rate in the header.
 *
 * Bytes come out as whole Ogg pages: the headers when the encoder is opened (so a stream
 * starts at once), then a page at least every AUDIO_OPUS_PAGE_MS of audio, and the last
 * page (end of stream, exact length) at audio_opus_finish. Input is PCM16 interleaved,
 * mono or stereo. */
#ifndef MM3_STAGE0_AUDIO_OPUS_H
#define MM3_STAGE0_AUDIO_OPUS_H

#include <stddef.h>
#include <stdint.h>

#include "stage0/api/audio_buf.h"

/* Bit rate for stereo music (Opus is transparent for most music from about 128 kbit/s). */
#define AUDIO_OPUS_BITRATE 160000
/* Most audio held before a page is written: bounds the delay a streamed answer adds. */
#define AUDIO_OPUS_PAGE_MS 200

struct audio_opus;

/* Returns 0, -EINVAL (bad geometry) or -ENOMEM. The Ogg headers are appended to the
 * encoder's pending bytes, handed out with the first encode or finish. */
int audio_opus_open(struct audio_opus **out, int channels, int rate);
/* Encode n_frames interleaved frames; finished pages are appended to `out`. 0 or < 0. */
int audio_opus_encode(struct audio_opus *o, const int16_t *pcm, size_t n_frames, struct audio_buf *out);
/* The rest of the audio and the end-of-stream page. 0 or < 0. */
int audio_opus_finish(struct audio_opus *o, struct audio_buf *out);
void audio_opus_free(struct audio_opus *o);

#endif
