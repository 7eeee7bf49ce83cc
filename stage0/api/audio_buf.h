/* A growable byte buffer: what the encoders (audio_encode.h, audio_mp3.h, audio_opus.h)
 * and the event framing (sse.h) append to. */
#ifndef MM3_STAGE0_AUDIO_BUF_H
#define MM3_STAGE0_AUDIO_BUF_H

#include <stddef.h>
#include <stdint.h>

struct audio_buf {
    uint8_t *data;
    size_t len, cap;
};

/* Room for n more bytes. 0 or -ENOMEM (with a message). */
int audio_buf_reserve(struct audio_buf *b, size_t n);
/* Append n bytes. 0 or -ENOMEM. */
int audio_buf_append(struct audio_buf *b, const void *p, size_t n);
void audio_buf_free(struct audio_buf *b);

#endif
