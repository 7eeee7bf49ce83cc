/* The one codec of the pipeline's messages (pipe/pipe_proto.h), used by both stages:
 * per message kind a typed struct, an encoder that fills a shmconn message's kind, flags
 * and tensors from it, and a decoder that checks every tensor of a received message
 * (present, dtype, shape, byte size) before it fills the struct.
 *
 *     struct pipe_frames f = {.frames = mixed, .n = n, .width = width, .first = at};
 *     struct shmconn_msg m;
 *     if (pipe_encode_frames(&m, &f) == 0) {
 *         m.req_id = id, m.chunk = chunk++;
 *         rc = shmconn_send(tx, &m, timeout_s);     // f must live until here
 *     }
 *
 *     struct pipe_frames got;
 *     if (pipe_decode_frames(&ev.msg, &got) < 0) fail("%s", mm3_last_error());
 *
 * Encoders clear the whole message first (req_id and chunk are the sender's to set) and
 * point its tensors at the struct's fields and buffers, which must stay valid until the
 * send. Decoded pointers point into the received view (valid until shmconn_release).
 * Encoders return 0 or -EOVERFLOW (a size that does not fit the wire); decoders 0 or
 * -EBADMSG. Both set mm3_last_error() to a text that names the message kind, the tensor
 * and what was expected, e.g. "bad FRAMES message: tensor 'first': shape [2], expected [1]". */
#ifndef MM3_PIPE_CODEC_H
#define MM3_PIPE_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "pipe/pipe_proto.h"
#include "shmconn/shmconn.h"

/* "START", "FRAMES", ... for logs; "unknown" for any other kind. */
const char *pipe_kind_name(uint32_t kind);

/* ---- stage 0 -> stage 1 ---- */

struct pipe_start {
    struct pipe_request_params params; /* decoding refuses a version other than PIPE_PARAMS_VERSION */
    const char *replay;                /* golden case file (testing aid), not NUL-terminated; NULL = none */
    size_t replay_len;
};
int pipe_encode_start(struct shmconn_msg *m, const struct pipe_start *s);
int pipe_decode_start(const struct shmconn_msg *m, struct pipe_start *s);

struct pipe_frames {
    const float *frames; /* [n, width] */
    int64_t n, width;    /* each at most INT32_MAX */
    int64_t first;       /* index of the song's frame in row 0 */
};
int pipe_encode_frames(struct shmconn_msg *m, const struct pipe_frames *f);
int pipe_decode_frames(const struct shmconn_msg *m, struct pipe_frames *f);

/* END: the song has `total` frames. */
int pipe_encode_end(struct shmconn_msg *m, const int64_t *total);
int pipe_decode_end(const struct shmconn_msg *m, int64_t *total);

/* CANCEL: no tensors. */
void pipe_encode_cancel(struct shmconn_msg *m);

/* PLAY: the prerolled stream's client started playing at t_play_us (CLOCK_MONOTONIC). */
int pipe_encode_play(struct shmconn_msg *m, const int64_t *t_play_us);
int pipe_decode_play(const struct shmconn_msg *m, int64_t *t_play_us);

/* ---- stage 1 -> stage 0 ---- */

struct pipe_progress {
    int64_t windows_done;
    int64_t windows_planned; /* 0 while the song's length is unknown */
    int64_t work_us;         /* microseconds of stage-1 work on the song so far */
};

struct pipe_pcm {
    const float *pcm; /* [2, n] channel-major: the right channel at pcm + n */
    int64_t n;        /* samples per channel; 0: a rendered window's progress alone */
    struct pipe_progress progress;
};
/* With p->pcm NULL the tensors' data stay NULL, for shmconn_send_begin; then
 * pipe_pcm_write fills the reserved tensors and shmconn_send_commit publishes them. */
int pipe_encode_pcm(struct shmconn_msg *m, const struct pipe_pcm *p);
void pipe_pcm_write(struct shmconn_msg *m, const float *left, const float *right, const struct pipe_progress *pr);
int pipe_decode_pcm(const struct shmconn_msg *m, struct pipe_pcm *p);

struct pipe_done {
    int64_t total;        /* samples per channel sent */
    int64_t fp16_rescues; /* windows and decodes rerun in float32 since stage 1 started; -1 = not sent */
};
/* fp16_rescues < 0 leaves its tensor out. */
int pipe_encode_done(struct shmconn_msg *m, const struct pipe_done *d);
int pipe_decode_done(const struct shmconn_msg *m, struct pipe_done *d);

/* ERROR: UTF-8 text, no NUL on the wire. */
int pipe_encode_error(struct shmconn_msg *m, const char *text, size_t len);
int pipe_decode_error(const struct shmconn_msg *m, const char **text, size_t *len);

#endif
