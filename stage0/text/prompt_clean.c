/* Caption cleaning and lyrics normalisation (docs/model.md §3.1, §3.2), rule for
 * rule as the reference's _clean_caption / _normalize_lyrics do them with Python
 * `re` on `str`. Python's `\s` is spelled out as PYSTR_WS_CLASS; MULTILINE `^`
 * also matches after a final newline in Python, hence PCRE2_ALT_CIRCUMFLEX. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "stage0/text/prompt_clean.h"
#include "stage0/text/prompt_pystr.h"
#include "stage0/text/tokenizer_regex.h"

#define WS "[" PYSTR_WS_CLASS "]"

enum {
    RE_SPECIAL_TAG, /* <|bpm 96|> */
    RE_HEADING,
    RE_BULLET,
    RE_STAR_BULLET,
    RE_BOLD,
    RE_ITALIC,
    RE_RULE,
    RE_NEWLINES,
    RE_LEADING_TAGS,
    RE_BRACKET,
    RE_COUNT
};

static const struct {
    const char *pattern;
    uint32_t options;
} re_source[RE_COUNT] = {
    [RE_SPECIAL_TAG] = {"<\\|([^|]*)\\|>", 0},
    [RE_HEADING] = {"^" WS "{0,3}#{1,6}" WS "+", 0},
    [RE_BULLET] = {"^" WS "*[*+-]" WS "+", 0},
    [RE_STAR_BULLET] = {"^" WS "*\\*" WS "+", 0},
    [RE_BOLD] = {"\\*\\*([^*]+)\\*\\*", 0},
    [RE_ITALIC] = {"(?<!\\*)\\*([^*\\n]+)\\*(?!\\*)", 0},
    [RE_RULE] = {"^" WS "*[-*_]{3,}" WS "*$", PCRE2_MULTILINE | PCRE2_ALT_CIRCUMFLEX},
    [RE_NEWLINES] = {"\\n{2,}", 0},
    [RE_LEADING_TAGS] = {"^[ \\t]*((?:\\[[^\\]]+\\][ \\t]*)+)", 0},
    [RE_BRACKET] = {"\\[([^\\]]+)\\]", 0},
};

static pcre2_code *re_code[RE_COUNT];
static pthread_once_t re_once = PTHREAD_ONCE_INIT;

static void re_compile_all(void)
{
    for (int i = 0; i < RE_COUNT; i++) /* constant patterns: a failure is a bug */
        CHECK(tok_regex_compile(&re_code[i], re_source[i].pattern, re_source[i].options, "prompt regex") == 0);
}

/* Appends the replacement of one match (ov: PCRE2 ovector) to out. */
typedef int (*repl_fn)(const char *s, const PCRE2_SIZE *ov, struct pystr_buf *out);

static int repl_nothing(const char *s, const PCRE2_SIZE *ov, struct pystr_buf *out)
{
    return 0;
}

static int repl_newline(const char *s, const PCRE2_SIZE *ov, struct pystr_buf *out)
{
    return pystr_buf_append(out, "\n", 1);
}

static int repl_group1(const char *s, const PCRE2_SIZE *ov, struct pystr_buf *out)
{
    return pystr_buf_append(out, s + ov[2], ov[3] - ov[2]);
}

/* <|a b c|> -> "a is b c"; <|x|> -> "x" (inner text stripped first). */
static int repl_special_tag(const char *s, const PCRE2_SIZE *ov, struct pystr_buf *out)
{
    size_t b, e;
    pystr_strip(s + ov[2], ov[3] - ov[2], &b, &e);
    const char *inner = s + ov[2] + b;
    int n_parts;
    size_t off[2], len[2];
    pystr_split1(inner, e - b, &n_parts, off, len);
    if (n_parts != 2) return pystr_buf_append(out, inner, e - b);
    int rc = pystr_buf_append(out, inner + off[0], len[0]);
    if (rc == 0) rc = pystr_buf_append(out, " is ", 4);
    if (rc == 0) rc = pystr_buf_append(out, inner + off[1], len[1]);
    return rc;
}

static int repl_lower_bracket(const char *s, const PCRE2_SIZE *ov, struct pystr_buf *out)
{
    int rc = pystr_buf_append(out, "[", 1);
    if (rc == 0) rc = pystr_lower_append(out, s + ov[2], ov[3] - ov[2]);
    if (rc == 0) rc = pystr_buf_append(out, "]", 1);
    return rc;
}

struct cleaner {
    struct tok_regex_matcher m;
    const char *field;
};

/* re.sub(pattern, repl, s) into a new buffer; *n_subs counts the replacements. */
static int re_sub(struct cleaner *c, int which, const char *s, size_t n, repl_fn repl, struct pystr_buf *out,
                  int *n_subs)
{
    size_t copied = 0;
    int subs = 0;
    out->len = 0;
    while (copied <= n) {
        int rc = tok_regex_find(&c->m, re_code[which], s, n, copied, 0, c->field);
        if (rc < 0) return rc;
        if (rc == 0) break;
        const PCRE2_SIZE *ov = tok_regex_ovector(&c->m);
        CHECK(ov[1] > ov[0]); /* none of the contract's patterns can match empty */
        rc = pystr_buf_append(out, s + copied, ov[0] - copied);
        if (rc == 0) rc = repl(s, ov, out);
        if (rc < 0) return rc;
        copied = ov[1];
        subs++;
    }
    if (n_subs) *n_subs = subs;
    return pystr_buf_append(out, s + copied, n - copied);
}

/* Apply re_sub in place: *cur becomes the result, *tmp is scratch. */
static int re_sub_swap(struct cleaner *c, int which, struct pystr_buf *cur, struct pystr_buf *tmp, repl_fn repl,
                       int *n_subs)
{
    int rc = re_sub(c, which, cur->p, cur->len, repl, tmp, n_subs);
    if (rc < 0) return rc;
    struct pystr_buf t = *cur;
    *cur = *tmp;
    *tmp = t;
    return 0;
}

struct caption_lines {
    struct cleaner *c;
    struct pystr_buf joined;
    struct pystr_buf line, tmp;
    int n_lines;
};

/* One line of step 2: heading, bullets, bold loop, italics, rstrip. */
static int caption_line(void *ctx, const char *s, size_t n)
{
    struct caption_lines *cl = ctx;
    struct pystr_buf *line = &cl->line, *tmp = &cl->tmp;
    line->len = 0;
    int rc = pystr_buf_append(line, s, n);
    if (rc == 0) rc = re_sub_swap(cl->c, RE_HEADING, line, tmp, repl_nothing, NULL);
    if (rc == 0) rc = re_sub_swap(cl->c, RE_BULLET, line, tmp, repl_nothing, NULL);
    if (rc == 0) rc = re_sub_swap(cl->c, RE_STAR_BULLET, line, tmp, repl_nothing, NULL);
    /* `while "**" in line`: a pass that replaces nothing leaves the line as it was. */
    while (rc == 0 && memmem(line->p, line->len, "**", 2)) {
        int subs = 0;
        rc = re_sub_swap(cl->c, RE_BOLD, line, tmp, repl_group1, &subs);
        if (subs == 0) break;
    }
    if (rc == 0) rc = re_sub_swap(cl->c, RE_ITALIC, line, tmp, repl_group1, NULL);
    if (rc < 0) return rc;
    size_t end;
    pystr_rstrip(line->p, line->len, &end);
    if (cl->n_lines++ > 0) rc = pystr_buf_append(&cl->joined, "\n", 1);
    if (rc == 0) rc = pystr_buf_append(&cl->joined, line->p, end);
    return rc;
}

static int replace_in(struct pystr_buf *b, const char *old, const char *new_)
{
    char *out;
    size_t len;
    int rc = pystr_replace(b->p, b->len, old, new_, &out, &len);
    if (rc < 0) return rc;
    pystr_buf_free(b);
    b->p = out;
    b->len = b->cap = len; /* the block is larger; understating it costs a realloc at most */
    return 0;
}

static int clean_caption(struct cleaner *c, const char *caption, struct pystr_buf *text)
{
    struct caption_lines cl = {.c = c};
    struct pystr_buf tmp = {0};
    int rc = re_sub(c, RE_SPECIAL_TAG, caption, strlen(caption), repl_special_tag, &tmp, NULL);
    if (rc == 0) rc = pystr_buf_append(&cl.joined, "", 0);
    if (rc == 0) rc = pystr_splitlines(tmp.p, tmp.len, caption_line, &cl);
    pystr_buf_free(&cl.line);
    pystr_buf_free(&cl.tmp);
    if (rc == 0) rc = re_sub_swap(c, RE_RULE, &cl.joined, &tmp, repl_nothing, NULL);
    if (rc == 0) rc = replace_in(&cl.joined, "\xE2\x80\xA2 ", ""); /* "• " */
    if (rc == 0) rc = replace_in(&cl.joined, "    ", "");
    if (rc == 0) rc = re_sub(c, RE_NEWLINES, cl.joined.p, cl.joined.len, repl_newline, text, NULL);
    pystr_buf_free(&tmp);
    pystr_buf_free(&cl.joined);
    return rc;
}

/* Step 2 of the lyrics: a line that starts with [tags] keeps only those tags. */
static int lyrics_lines(struct cleaner *c, const char *lyrics, struct pystr_buf *out)
{
    size_t n = strlen(lyrics), start = 0;
    int rc = pystr_buf_append(out, "", 0);
    if (rc < 0) return rc;
    for (;;) { /* str.split("\n"): CR and the other boundaries stay in the line */
        const char *nl = memchr(lyrics + start, '\n', n - start);
        size_t end = nl ? (size_t)(nl - lyrics) : n;
        const char *line = lyrics + start;
        rc = tok_regex_find(&c->m, re_code[RE_LEADING_TAGS], line, end - start, 0, 0, c->field);
        if (rc < 0) return rc;
        if (rc == 1) {
            const PCRE2_SIZE *ov = tok_regex_ovector(&c->m);
            size_t b, e;
            pystr_strip(line + ov[2], ov[3] - ov[2], &b, &e);
            rc = pystr_buf_append(out, line + ov[2] + b, e - b);
        } else {
            rc = pystr_buf_append(out, line, end - start);
        }
        if (rc < 0 || !nl) return rc;
        rc = pystr_buf_append(out, "\n", 1);
        if (rc < 0) return rc;
        start = end + 1;
    }
}

static int normalize_lyrics(struct cleaner *c, const char *lyrics, struct pystr_buf *text)
{
    struct pystr_buf joined = {0};
    int rc = lyrics_lines(c, lyrics, &joined);
    if (rc == 0) rc = replace_in(&joined, "] ", "]\n");
    if (rc == 0) rc = replace_in(&joined, " [", "\n[");
    if (rc == 0) rc = replace_in(&joined, " ^ ", "\n");
    if (rc == 0) rc = pystr_buf_append(text, "[start]\n", 8);
    if (rc == 0) {
        struct pystr_buf lowered = {0};
        rc = re_sub(c, RE_BRACKET, joined.p, joined.len, repl_lower_bracket, &lowered, NULL);
        if (rc == 0) rc = pystr_buf_append(text, lowered.p, lowered.len);
        pystr_buf_free(&lowered);
    }
    pystr_buf_free(&joined);
    return rc;
}

typedef int (*clean_fn)(struct cleaner *c, const char *in, struct pystr_buf *out);

/* Validate, run one cleaning function with a fresh matcher, hand out the text. */
static int run_cleaner(clean_fn fn, const char *in, const char *field, char **out)
{
    *out = NULL;
    int rc = pystr_utf8_check(in, strlen(in), field);
    if (rc < 0) return rc;
    pthread_once(&re_once, re_compile_all);
    struct cleaner c = {.field = field};
    struct pystr_buf text = {0};
    rc = tok_regex_matcher_init(&c.m);
    if (rc == 0) rc = fn(&c, in, &text);
    tok_regex_matcher_free(&c.m);
    if (rc == 0) {
        *out = pystr_buf_take(&text);
        if (!*out) rc = mm3_errorf(-ENOMEM, "%s: out of memory", field);
    }
    pystr_buf_free(&text);
    return rc;
}

int prompt_clean_caption(const char *caption, char **out)
{
    return run_cleaner(clean_caption, caption, "caption", out);
}

int prompt_normalize_lyrics(const char *lyrics, char **out)
{
    return run_cleaner(normalize_lyrics, lyrics, "lyrics", out);
}
