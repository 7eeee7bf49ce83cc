/* torchaudio-equivalent polyphase resampler (common/resample.h). */
#include "common/resample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#define RESAMPLE_LOWPASS_WIDTH 6 /* torchaudio default lowpass_filter_width */
#define RESAMPLE_ROLLOFF 0.99    /* torchaudio default rolloff */
#define RESAMPLE_MAX_CHANNELS 64
#define RESAMPLE_MAX_KERNEL (1 << 24) /* floats */

struct resample {
    int orig, nw; /* rates / gcd: a block is orig inputs -> nw outputs */
    int width;    /* input context on each side of a block */
    int taps;     /* 2*width + orig: the input window of one block */
    int channels;
    float *kernel;        /* [nw, taps], torchaudio's kernel[:, 0, :] */
    int *tap_lo, *tap_hi; /* per phase: taps [lo, hi) inside the 6th zero crossing */

    /* stream: buf[c*cap + head + j] holds x[next_block*orig - width + j], j < len */
    float *buf;
    int64_t cap, head, len;
    int64_t next_block, total_in;
    int finished;
};

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The kernel exactly as torchaudio's _get_sinc_resample_kernel computes it for a float32
 * waveform (dtype float32 all the way, python scalars rounded to float32 per op). */
static void resample_kernel_build(struct resample *r)
{
    const int lpw = RESAMPLE_LOWPASS_WIDTH;
    double base_freq = (r->orig < r->nw ? r->orig : r->nw) * RESAMPLE_ROLLOFF;
    const float pi = (float)M_PI;
    const float base_f = (float)base_freq;
    const float scale = (float)(base_freq / r->orig);
    for (int i = 0; i < r->nw; i++) {
        float *k = r->kernel + (size_t)i * r->taps;
        r->tap_lo[i] = r->taps;
        r->tap_hi[i] = 0;
        for (int j = 0; j < r->taps; j++) {
            float idx = (float)(j - r->width) / (float)r->orig;
            float t = (float)(-i) / (float)r->nw + idx;
            t = t * base_f;
            if (t > -lpw && t < lpw) {
                if (j < r->tap_lo[i]) r->tap_lo[i] = j;
                r->tap_hi[i] = j + 1;
            }
            if (t < -lpw) t = (float)-lpw;
            if (t > lpw) t = (float)lpw;
            float window = cosf(t * pi / (float)lpw / 2.0f);
            window = window * window;
            t = t * pi;
            float sinc = t == 0.0f ? 1.0f : sinf(t) / t;
            k[j] = sinc * (window * scale);
        }
        if (r->tap_hi[i] < r->tap_lo[i]) r->tap_lo[i] = r->tap_hi[i] = 0;
    }
}

int resample_create(struct resample **out, int in_rate, int out_rate, int channels)
{
    *out = NULL;
    if (in_rate < 1 || in_rate > 1000000 || out_rate < 1 || out_rate > 1000000)
        return mm3_errorf(-EINVAL, "resample: rates %d -> %d Hz, expected 1..1000000", in_rate, out_rate);
    if (channels < 1 || channels > RESAMPLE_MAX_CHANNELS)
        return mm3_errorf(-EINVAL, "resample: %d channels, expected 1..%d", channels, RESAMPLE_MAX_CHANNELS);
    int64_t g = gcd64(in_rate, out_rate);
    struct resample *r = calloc(1, sizeof *r);
    if (!r) return mm3_errorf(-ENOMEM, "resample: out of memory");
    r->orig = (int)(in_rate / g);
    r->nw = (int)(out_rate / g);
    r->channels = channels;
    double base_freq = (r->orig < r->nw ? r->orig : r->nw) * RESAMPLE_ROLLOFF;
    r->width = (int)ceil(RESAMPLE_LOWPASS_WIDTH * r->orig / base_freq);
    r->taps = 2 * r->width + r->orig;
    if ((int64_t)r->nw * r->taps > RESAMPLE_MAX_KERNEL) {
        int rc = mm3_errorf(-EINVAL, "resample: %d -> %d Hz reduces to %d:%d, a kernel of more than %d taps", in_rate,
                            out_rate, r->orig, r->nw, RESAMPLE_MAX_KERNEL);
        free(r);
        return rc;
    }
    /* Input held by the stream: one block window plus room to take input in large pieces. */
    r->cap = r->taps + 64 * (int64_t)r->orig + 4096;
    r->kernel = malloc((size_t)r->nw * r->taps * sizeof(float));
    r->tap_lo = malloc((size_t)r->nw * sizeof(int));
    r->tap_hi = malloc((size_t)r->nw * sizeof(int));
    r->buf = malloc((size_t)(r->cap * channels) * sizeof(float));
    if (!r->kernel || !r->tap_lo || !r->tap_hi || !r->buf) {
        int rc = mm3_errorf(-ENOMEM, "resample: out of memory for a %d x %d kernel", r->nw, r->taps);
        resample_free(r);
        return rc;
    }
    resample_kernel_build(r);
    resample_stream_reset(r);
    *out = r;
    return 0;
}

void resample_free(struct resample *r)
{
    if (!r) return;
    free(r->kernel);
    free(r->tap_lo);
    free(r->tap_hi);
    free(r->buf);
    free(r);
}

int64_t resample_out_len(const struct resample *r, int64_t n_in)
{
    if (n_in <= 0) return 0;
    return (r->nw * n_in + r->orig - 1) / r->orig;
}

/* Outputs [0, n_keep) of one block from its input window win[0, taps). Both the whole
 * buffer and the stream go through here, which makes them bit-identical. */
static void resample_block(const struct resample *r, const float *win, float *out, int n_keep)
{
    for (int i = 0; i < n_keep; i++) {
        const float *k = r->kernel + (size_t)i * r->taps;
        float acc = 0.0f;
        for (int j = r->tap_lo[i]; j < r->tap_hi[i]; j++)
            acc += k[j] * win[j];
        out[i] = acc;
    }
}

int resample_buffer(const struct resample *r, const float *in, int64_t in_stride, int64_t n_in, float *out,
                    int64_t out_stride)
{
    if (n_in < 0 || in_stride < n_in)
        return mm3_errorf(-EINVAL, "resample_buffer: %lld samples with row stride %lld", (long long)n_in,
                          (long long)in_stride);
    int64_t n_out = resample_out_len(r, n_in);
    if (out_stride < n_out)
        return mm3_errorf(-EINVAL, "resample_buffer: output row stride %lld < %lld output samples",
                          (long long)out_stride, (long long)n_out);
    float *win = malloc((size_t)r->taps * sizeof(float));
    if (!win) return mm3_errorf(-ENOMEM, "resample_buffer: out of memory");
    for (int c = 0; c < r->channels; c++) {
        const float *x = in + c * in_stride;
        float *y = out + c * out_stride;
        for (int64_t b = 0; b * r->nw < n_out; b++) {
            int64_t start = b * r->orig - r->width;
            int n_keep = (int)(n_out - b * r->nw < r->nw ? n_out - b * r->nw : r->nw);
            const float *w = x + start;
            if (start < 0 || start + r->taps > n_in) {
                /* the signal's zero padding, as F.pad in torchaudio */
                for (int j = 0; j < r->taps; j++) {
                    int64_t s = start + j;
                    win[j] = s >= 0 && s < n_in ? x[s] : 0.0f;
                }
                w = win;
            }
            resample_block(r, w, y + b * r->nw, n_keep);
        }
    }
    free(win);
    return 0;
}

void resample_stream_reset(struct resample *r)
{
    /* the window of block 0 starts `width` samples before the signal: zeros */
    r->head = 0;
    r->len = r->width;
    for (int c = 0; c < r->channels; c++)
        memset(r->buf + c * r->cap, 0, (size_t)r->width * sizeof(float));
    r->next_block = 0;
    r->total_in = 0;
    r->finished = 0;
}

int64_t resample_stream_push_len(const struct resample *r, int64_t n_in)
{
    int64_t have = r->len + (n_in > 0 ? n_in : 0);
    if (r->finished || have < r->taps) return 0;
    return ((have - r->taps) / r->orig + 1) * r->nw;
}

/* Emit every block whose window is complete in the buffer. */
static int64_t stream_emit(struct resample *r, float *out, int64_t out_stride, int64_t at)
{
    while (r->len >= r->taps) {
        for (int c = 0; c < r->channels; c++)
            resample_block(r, r->buf + c * r->cap + r->head, out + c * out_stride + at, r->nw);
        at += r->nw;
        r->head += r->orig;
        r->len -= r->orig;
        r->next_block++;
    }
    return at;
}

/* Append up to n samples per channel (NULL: zeros) without emitting; returns how many fit. */
static int64_t stream_append(struct resample *r, const float *in, int64_t in_stride, int64_t n)
{
    if (r->head + r->len == r->cap || r->head + r->len + n > r->cap) {
        for (int c = 0; c < r->channels; c++)
            memmove(r->buf + c * r->cap, r->buf + c * r->cap + r->head, (size_t)r->len * sizeof(float));
        r->head = 0;
    }
    int64_t m = r->cap - r->len;
    if (m > n) m = n;
    for (int c = 0; c < r->channels; c++) {
        float *dst = r->buf + c * r->cap + r->len + r->head;
        if (in)
            memcpy(dst, in + c * in_stride, (size_t)m * sizeof(float));
        else
            memset(dst, 0, (size_t)m * sizeof(float));
    }
    r->len += m;
    return m;
}

int resample_stream_push(struct resample *r, const float *in, int64_t in_stride, int64_t n_in, float *out,
                         int64_t out_stride, int64_t *n_out)
{
    *n_out = 0;
    if (r->finished) return mm3_errorf(-EINVAL, "resample_stream_push: the stream was finished; reset it first");
    if (n_in < 0 || in_stride < n_in)
        return mm3_errorf(-EINVAL, "resample_stream_push: %lld samples with row stride %lld", (long long)n_in,
                          (long long)in_stride);
    int64_t need = resample_stream_push_len(r, n_in);
    if (out_stride < need)
        return mm3_errorf(-ENOSPC, "resample_stream_push: output row stride %lld < the %lld samples this push emits",
                          (long long)out_stride, (long long)need);
    int64_t done = 0, at = 0;
    while (done < n_in) {
        done += stream_append(r, in + done, in_stride, n_in - done);
        at = stream_emit(r, out, out_stride, at);
    }
    r->total_in += n_in;
    *n_out = at;
    return 0;
}

int64_t resample_stream_finish_len(const struct resample *r)
{
    if (r->finished) return 0;
    int64_t left = resample_out_len(r, r->total_in) - r->next_block * r->nw;
    return left > 0 ? left : 0;
}

int resample_stream_finish(struct resample *r, float *out, int64_t out_stride, int64_t *n_out)
{
    *n_out = 0;
    int64_t left = resample_stream_finish_len(r);
    if (out_stride < left)
        return mm3_errorf(-ENOSPC, "resample_stream_finish: output row stride %lld < the %lld samples left",
                          (long long)out_stride, (long long)left);
    r->finished = 1;
    int64_t at = 0;
    while (at < left) {
        /* zero right padding up to the next block's full window */
        if (r->len < r->taps) stream_append(r, NULL, 0, r->taps - r->len); /* fits: cap >= taps */
        int n_keep = (int)(left - at < r->nw ? left - at : r->nw);
        for (int c = 0; c < r->channels; c++)
            resample_block(r, r->buf + c * r->cap + r->head, out + c * out_stride + at, n_keep);
        at += n_keep;
        r->head += r->orig;
        r->len -= r->orig;
        r->next_block++;
    }
    *n_out = at;
    return 0;
}
