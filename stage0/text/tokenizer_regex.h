/* PCRE2 (8-bit, UTF + UCP, JIT) for the text pipeline: the tokenizer's split
 * pattern and the prompt contract's Python `re` patterns.
 *
 * A compiled pattern is read-only and shared between threads; each thread that
 * matches needs its own tok_regex_matcher (match data + JIT stack). */
#ifndef MM3_TOKENIZER_REGEX_H
#define MM3_TOKENIZER_REGEX_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>

struct tok_regex_matcher {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
};

/* Compile with PCRE2_UTF | PCRE2_UCP | extra_options, LF newlines, and JIT it
 * (falls back to the interpreter where JIT is unavailable). `what` names the
 * pattern's origin for the error message. */
int tok_regex_compile(pcre2_code **out, const char *pattern, uint32_t extra_options, const char *what);

int tok_regex_matcher_init(struct tok_regex_matcher *m);
void tok_regex_matcher_free(struct tok_regex_matcher *m);

/* Search s[0..n) from byte `start` (lookbehind and ^ see the whole subject, as
 * Python's pattern.search(s, pos) does). Returns 1 with the match in
 * ovector pairs (tok_regex_ovector), 0 for no match, or < 0 with a message naming
 * `field`. The subject must be valid UTF-8 (not checked again). */
int tok_regex_find(struct tok_regex_matcher *m, const pcre2_code *re, const char *s, size_t n,
                   size_t start, uint32_t options, const char *field);

static inline PCRE2_SIZE *tok_regex_ovector(const struct tok_regex_matcher *m)
{
    return pcre2_get_ovector_pointer(m->md);
}

#endif
