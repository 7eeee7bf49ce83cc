/* Band-limited resampling equal to torchaudio.functional.resample(w, in_rate, out_rate)
 * with its defaults (sinc_interp_hann, lowpass_filter_width 6, rolloff 0.99) on a
 * float32 waveform: the SGLang server's 44.1 -> 32 kHz step (ratio 441:320).
 *
 * The rates are reduced by their gcd to orig:new. Output block b (new samples) is the
 * polyphase filter applied to input x[b*orig - width, b*orig + width + orig), zero
 * outside the signal; a signal of n samples gives ceil(new*n/orig) samples. The
 * kernel is built once, in float32 with the same operation order as torchaudio's
 * functional.resample, which computes it in the waveform's dtype (transforms.Resample
 * builds it in float64 then rounds; the two outputs differ by ~5e-6 relative). Its taps beyond the 6th zero crossing
 * (where torchaudio clamps t, leaving values below 4e-24) are skipped:
 * 16 or 17 taps per output instead of 459 for 441:320.
 *
 * Streaming emits whole blocks as soon as their input (with its right context) has
 * arrived, and finish() flushes the tail; the concatenated stream output equals
 * resample_buffer() on the concatenated input bit for bit.
 *
 * Buffers are channel-major: channel c of an input chunk starts at in + c*in_stride,
 * of an output at out + c*out_stride. */
#ifndef MM3_RESAMPLE_H
#define MM3_RESAMPLE_H

#include <stdint.h>

struct resample;

/* Rates in Hz (1..1e6; orig*new after gcd reduction at most 2^22), 1..64 channels.
 * Returns 0 or -EINVAL / -ENOMEM. */
int resample_create(struct resample **r, int in_rate, int out_rate, int channels);
void resample_free(struct resample *r);

/* ceil(new * n_in / orig): the output length for n_in input samples. */
int64_t resample_out_len(const struct resample *r, int64_t n_in);

/* Whole buffer: in [channels, n_in] -> out [channels, resample_out_len(n_in)].
 * Stateless (does not touch the stream). Returns 0 or -EINVAL / -ENOMEM. */
int resample_buffer(const struct resample *r, const float *in, int64_t in_stride, int64_t n_in, float *out,
                    int64_t out_stride);

/* Exact number of samples per channel the next push of n_in samples will emit. */
int64_t resample_stream_push_len(const struct resample *r, int64_t n_in);
/* Exact number of samples per channel resample_stream_finish will emit now. */
int64_t resample_stream_finish_len(const struct resample *r);

/* Append n_in samples per channel; write every completed block to out, *n_out samples
 * per channel (out_stride must be >= resample_stream_push_len(r, n_in): -ENOSPC).
 * -EINVAL after finish until reset. */
int resample_stream_push(struct resample *r, const float *in, int64_t in_stride, int64_t n_in, float *out,
                         int64_t out_stride, int64_t *n_out);

/* End of signal: emit the remaining samples (up to resample_out_len(total pushed)). */
int resample_stream_finish(struct resample *r, float *out, int64_t out_stride, int64_t *n_out);

/* Forget the stream (start a new signal). */
void resample_stream_reset(struct resample *r);

#endif
