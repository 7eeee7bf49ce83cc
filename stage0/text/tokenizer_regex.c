/* PCRE2 wrapper for the text pipeline (see tokenizer_regex.h). */
#include "stage0/text/tokenizer_regex.h"

#include <errno.h>

#include "common/error.h"

/* Backtracking through long runs (a line of ten thousand [tags], a whitespace
 * run) needs more than the 32 KiB JIT stack PCRE2 uses by default. */
#define JIT_STACK_MAX (16u << 20)

int tok_regex_compile(pcre2_code **out, const char *pattern, uint32_t extra_options, const char *what)
{
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) return mm3_errorf(-ENOMEM, "%s: out of memory", what);
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF); /* Python's ^ and $ know only \n */
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | extra_options, &err, &at, cc);
    pcre2_compile_context_free(cc);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return mm3_errorf(-EINVAL, "%s: regex does not compile at offset %zu: %s", what, (size_t)at,
                          (const char *)msg);
    }
    /* JIT is an accelerator only: where it is unsupported the interpreter runs. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return 0;
}

int tok_regex_matcher_init(struct tok_regex_matcher *m)
{
    m->md = pcre2_match_data_create(8, NULL);
    m->mc = pcre2_match_context_create(NULL);
    m->js = pcre2_jit_stack_create(32u << 10, JIT_STACK_MAX, NULL);
    if (!m->md || !m->mc || !m->js) {
        tok_regex_matcher_free(m);
        return mm3_errorf(-ENOMEM, "regex matcher: out of memory");
    }
    pcre2_jit_stack_assign(m->mc, NULL, m->js);
    return 0;
}

void tok_regex_matcher_free(struct tok_regex_matcher *m)
{
    pcre2_match_data_free(m->md);
    pcre2_match_context_free(m->mc);
    pcre2_jit_stack_free(m->js);
    m->md = NULL;
    m->mc = NULL;
    m->js = NULL;
}

int tok_regex_find(struct tok_regex_matcher *m, const pcre2_code *re, const char *s, size_t n,
                   size_t start, uint32_t options, const char *field)
{
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, options | PCRE2_NO_UTF_CHECK, m->md, m->mc);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        int code = (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
                    rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT)
                       ? -E2BIG
                       : -EINVAL;
        return mm3_errorf(code, "%s: regex match failed near byte %zu (%zu bytes of text): %s", field,
                          start, n, (const char *)msg);
    }
    return 1;
}
