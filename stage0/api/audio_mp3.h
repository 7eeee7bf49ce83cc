/* MP3 for the HTTP API (response_format "mp3", OpenAI's default): LAME (libmp3lame),
 * constant bit rate, no Xing/Info header frame, so every byte can be sent as soon as it
 * is made and a streamed answer is the same bytes as a whole file.
 *
 * Input is PCM16 interleaved, mono or stereo, at 44100 or 32000 Hz (both MPEG-1 rates,
 * so LAME does not resample). MP3 frames carry 1152 samples and LAME delays its output,
 * so the bytes for the last samples come from audio_mp3_finish. */
#ifndef MM3_STAGE0_AUDIO_MP3_H
#define MM3_STAGE0_AUDIO_MP3_H

#include <stddef.h>
#include <stdint.h>

#include "stage0/api/audio_buf.h"

/* The bit rate: transparent for most music at 44.1 kHz stereo. */
#define AUDIO_MP3_KBPS 192

struct audio_mp3;

/* Returns 0, -EINVAL (channels not 1 or 2, or a rate MPEG-1 does not have) or -ENOMEM. */
int audio_mp3_open(struct audio_mp3 **out, int channels, int rate);
/* Encode n_frames interleaved frames; the bytes made are appended to `out`. 0 or < 0. */
int audio_mp3_encode(struct audio_mp3 *m, const int16_t *pcm, size_t n_frames, struct audio_buf *out);
/* The last frames (padded to a whole MP3 frame). 0 or < 0. */
int audio_mp3_finish(struct audio_mp3 *m, struct audio_buf *out);
void audio_mp3_free(struct audio_mp3 *m);

#endif
