/* Output encoders for the HTTP API: WAV (PCM16), raw PCM16 LE, FLAC, MP3
 * (audio_mp3.h) and Ogg Opus (audio_opus.h), each usable whole-file or streaming.
 *
 * Input is float32 interleaved PCM, converted to PCM16 by the project's one rule
 * (common/wav.h wav_sample_pcm16: NaN -> 0, clamp to [-1, 1], x * 32767 rounded
 * half away from zero); WAV headers come from common/wav.h wav_header too.
 *
 * Whole file (streaming = false): the encoder keeps everything; write appends
 * nothing to `out`, and finish completes the headers (WAV sizes, FLAC
 * STREAMINFO with total samples and MD5) and appends the exact file to `out`.
 * Streaming (streaming = true): `out` may be a fresh or drained buffer each
 * call; bytes appended are ready to send. A streamed WAV carries 0xFFFFFFFF in
 * both RIFF size fields (as vLLM-Omni does: "length unknown"); a streamed FLAC
 * has total_samples = 0 and no MD5 in STREAMINFO (allowed by the format). MP3 and
 * Ogg Opus are the same bytes either way (no header is patched at the end).
 *
 * Sample-rate conversion (out_rate != in_rate, e.g. 44100 -> 32000 as the
 * reference servers deliver) runs the streaming resampler of common/resample.h
 * inside write/finish, whose concatenated output equals a whole-buffer
 * resample, so streamed and whole-file answers carry the same samples. */
#ifndef MM3_STAGE0_AUDIO_ENCODE_H
#define MM3_STAGE0_AUDIO_ENCODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stage0/api/audio_buf.h"
#include "stage0/api/job.h"


/* float32 -> int16: wav_sample_pcm16 on each sample. */
void audio_pcm16_from_f32(int16_t *dst, const float *src, size_t n);

/* MIME type sent as Content-Type. */
const char *audio_format_content_type(enum mm3_audio_format fmt);
/* "wav", "pcm", "flac", "mp3", "opus". */
const char *audio_format_name(enum mm3_audio_format fmt);

struct audio_encoder;

/* Returns 0, -EINVAL (bad geometry or rate pair) or -ENOMEM. */
int audio_encoder_create(struct audio_encoder **out, enum mm3_audio_format fmt, int channels, int in_rate, int out_rate,
                         bool streaming);
/* Encode n_frames sample frames; encoded bytes go to `out`. Returns 0 or < 0. */
int audio_encoder_write(struct audio_encoder *e, const float *pcm, size_t n_frames, struct audio_buf *out);
/* Flush the tail (and complete the headers in whole-file mode). Returns 0 or < 0. */
int audio_encoder_finish(struct audio_encoder *e, struct audio_buf *out);
void audio_encoder_free(struct audio_encoder *e);

#endif
