/* Standard base64 (RFC 4648, with padding): the encoding of a file carried in a JSON
 * request field (an uploaded journal, `continue_journal`). The decoder is strict: it
 * accepts only the alphabet, padding at the end and a length that is a multiple of 4. */
#ifndef MM3_STAGE0_API_BASE64_H
#define MM3_STAGE0_API_BASE64_H

#include <stddef.h>
#include <stdint.h>

/* *out: malloc'ed NUL-terminated text of n bytes. 0 or -ENOMEM. */
int base64_encode(const uint8_t *data, size_t n, char **out);

/* *out: malloc'ed bytes of the len characters of s, *out_n of them. 0, -EINVAL (not
 * base64: the message says at which character), -ENOMEM. */
int base64_decode(const char *s, size_t len, uint8_t **out, size_t *out_n);

#endif
