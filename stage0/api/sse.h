/* Server-sent events for `stream_format: "sse"`: OpenAI's speech stream events.
 *
 *     event: speech.audio.delta
 *     data: {"type":"speech.audio.delta","audio":"<base64 of the encoded bytes>"}
 *
 *     event: speech.audio.done
 *     data: {"type":"speech.audio.done","usage":{"input_tokens":P,"output_tokens":F,"total_tokens":P+F}}
 *
 * and, instead of done when the song fails after the first audio (vLLM-Omni's event):
 *
 *     event: speech.audio.error
 *     data: {"type":"speech.audio.error","error":{"message":...,"type":"server_error","param":null,"code":500}}
 *
 * Each event is one `event:` line and one `data:` line of compact JSON (base64 and JSON
 * escaping keep it free of line breaks), ended by an empty line. The audio of the deltas,
 * concatenated, is the container the request's response_format names, byte for byte what
 * the raw stream would carry. */
#ifndef MM3_STAGE0_SSE_H
#define MM3_STAGE0_SSE_H

#include <stddef.h>
#include <stdint.h>

#include "stage0/api/audio_buf.h"

#define SSE_CONTENT_TYPE "text/event-stream"

/* Standard base64 (RFC 4648, with padding) of n bytes, appended to out. 0 or -ENOMEM. */
int sse_base64_append(struct audio_buf *out, const uint8_t *data, size_t n);

/* One speech.audio.delta event carrying n audio bytes (none for n = 0). 0 or -ENOMEM. */
int sse_audio_delta(struct audio_buf *out, const uint8_t *audio, size_t n);
/* The speech.audio.done event; usage counts prompt tokens and generated frames. 0 or -ENOMEM. */
int sse_audio_done(struct audio_buf *out, int64_t input_tokens, int64_t output_tokens);
/* The speech.audio.error event. 0 or -ENOMEM. */
int sse_audio_error(struct audio_buf *out, int status, const char *message);

#endif
