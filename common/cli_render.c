/* Command-line render knobs shared by mm3-stage1 and mm3-rerender. */
#include "common/cli_render.h"

#include <errno.h>
#include <stdlib.h>

#include "common/error.h"

int cli_u64_parse(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    /* strtoull takes "-1" as 2^64 - 1: a sign is refused up front. */
    if (errno || end == s || *end || s[0] == '-') return -EINVAL;
    *out = x;
    return 0;
}

int cli_render_option(struct cli_render *r, int opt, const char *arg)
{
    uint64_t v;
    char *end;
    switch (opt) {
    case CLI_RENDER_SEED:
        if (cli_u64_parse(arg, &r->seed) < 0)
            return mm3_errorf(-EINVAL, "--seed '%s': expected a non-negative integer", arg);
        r->seed_given = true;
        return 1;
    case CLI_RENDER_STEPS:
        if (cli_u64_parse(arg, &v) < 0 || v < 1 || v > 1000)
            return mm3_errorf(-EINVAL, "--steps '%s': expected an integer in 1..1000", arg);
        r->steps = (int)v;
        r->steps_given = true;
        return 1;
    case CLI_RENDER_GUIDANCE: {
        float g = strtof(arg, &end);
        /* written so that NaN fails too */
        if (end == arg || *end || !(g >= 0.0f && g <= 100.0f))
            return mm3_errorf(-EINVAL, "--guidance '%s': expected a number in 0..100", arg);
        r->guidance = g;
        r->guidance_given = true;
        return 1;
    }
    case CLI_RENDER_SHIFT: {
        float s = strtof(arg, &end);
        /* the bound of the deploy key and the request field flow_shift (stage1/flow.h) */
        if (end == arg || *end || !(s > 0.0f && s <= 20.0f))
            return mm3_errorf(-EINVAL, "--shift '%s': expected a number in (0, 20]", arg);
        r->shift = s;
        r->shift_given = true;
        return 1;
    }
    case CLI_RENDER_FLOAT:
        r->as_float = true;
        return 1;
    }
    return 0;
}
