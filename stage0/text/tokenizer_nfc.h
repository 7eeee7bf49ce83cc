/* NFC exactly as HF `tokenizers` computes it.
 *
 * HF normalises with tables of Unicode 9.0; utf8proc has a newer Unicode. The two
 * agree on every character both know (canonical decompositions and combining
 * classes are stable), so the only difference is the few later characters that
 * take part in normalisation (combining marks, decomposable letters): to HF they
 * are unassigned, i.e. starters that never compose. Such a character is a
 * normalisation boundary, so the text is NFC'd by utf8proc piecewise around it. */
#ifndef MM3_TOKENIZER_NFC_H
#define MM3_TOKENIZER_NFC_H

#include <stddef.h>

/* NFC of valid UTF-8 s[0..n) into a new malloc'ed, NUL-terminated string. */
int tok_nfc(const char *s, size_t n, char **out, size_t *out_len);

#endif
