/* RIFF/WAVE files: 16-bit PCM or 32-bit IEEE float, interleaved from channel-major input.
 *
 * The header is the canonical 44 bytes (RIFF, "fmt " of 16 bytes, "data"), for both
 * formats: format tag 1 (PCM) or 3 (IEEE float), little-endian samples.
 *
 * Sample conversion (wav_sample_pcm16):
 *   NaN -> 0; x clamped to [-1, 1]; PCM16 = round-half-away-from-zero(x * 32767),
 *   so -1 -> -32767, 1 -> 32767, 0.5 -> 16384 (-32768 is never produced; the scale is
 *   symmetric). Float32 samples are written as the same clamp of x (NaN -> 0).
 *
 * Streaming: send wav_header(..., WAV_DATA_UNKNOWN) first, then wav_samples_encode()
 * chunks; readers (sox, libsndfile, browsers) take "unknown" as "until end of stream". */
#ifndef MM3_WAV_H
#define MM3_WAV_H

#include <stddef.h>
#include <stdint.h>

enum wav_format { WAV_FORMAT_PCM16 = 1, WAV_FORMAT_F32 = 3 }; /* values are the WAVE format tags */

#define WAV_HEADER_BYTES 44
#define WAV_DATA_UNKNOWN 0xFFFFFFFFu /* data size of a stream whose length is not known */

/* Bytes per sample of one channel: 2 or 4. */
int wav_format_bytes(enum wav_format format);

/* The 44-byte header for `data_bytes` bytes of samples (WAV_DATA_UNKNOWN for a stream;
 * the RIFF size then saturates at 0xFFFFFFFF). Returns WAV_HEADER_BYTES. */
size_t wav_header(uint8_t buf[WAV_HEADER_BYTES], int channels, int rate, enum wav_format format, uint32_t data_bytes);

/* The PCM16 value of one float sample (rule above). */
int16_t wav_sample_pcm16(float x);

/* Interleave `frames` frames of channel-major pcm (channel c at pcm + c*stride) into
 * little-endian samples at dst (frames * channels * wav_format_bytes bytes). */
void wav_samples_encode(uint8_t *dst, const float *pcm, int64_t stride, int channels, int64_t frames,
                        enum wav_format format);

/* Write a whole file: pcm [channels, frames] channel-major. Returns 0, or a negative
 * errno with a message naming the path (unwritable, disk full: the partial file is
 * removed), or -EINVAL for arguments / a data size past 4 GiB. */
int wav_write_file(const char *path, const float *pcm, int channels, int64_t frames, int rate, enum wav_format format);

/* ---- minimal reader (our own files, tests) ---- */

struct wav_info {
    int channels, rate;
    enum wav_format format;
    int64_t frames;
};

/* Read a PCM16 or float32 WAVE file into a new channel-major float array [channels,
 * frames] (caller frees); PCM16 is scaled by 1/32767, the inverse of the writer.
 * Unknown chunks are skipped; a data size of WAV_DATA_UNKNOWN means "to end of file". */
int wav_read_file(const char *path, struct wav_info *info, float **pcm);

#endif
