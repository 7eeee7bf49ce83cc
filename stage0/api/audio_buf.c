#include "stage0/api/audio_buf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

int audio_buf_reserve(struct audio_buf *b, size_t n)
{
    if (b->len + n <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n)
        cap *= 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p) return mm3_errorf(-ENOMEM, "audio buffer: out of memory for %zu bytes", cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

int audio_buf_append(struct audio_buf *b, const void *p, size_t n)
{
    int rc = audio_buf_reserve(b, n);
    if (rc < 0) return rc;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void audio_buf_free(struct audio_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
