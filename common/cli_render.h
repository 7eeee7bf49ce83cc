/* The render knobs that mm3-stage1 (render mode) and mm3-rerender both take on
 * the command line: --seed N, --steps N, --guidance G, --shift S and --float. Values are
 * checked against the ranges the deploy file allows for the same knobs.
 *
 *     static const struct option longopts[] = {CLI_RENDER_LONGOPTS, {"model", ...}, {NULL, 0, NULL, 0}};
 *     struct cli_render r = {.steps = FLOW_DEFAULT_STEPS, .guidance = FLOW_DEFAULT_GUIDANCE};
 *     while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
 *         int taken = cli_render_option(&r, c, optarg);
 *         if (taken < 0) { fprintf(stderr, "prog: %s\n", mm3_last_error()); return 2; }
 *         if (taken) continue;
 *         switch (c) { ... the program's own options ... }
 *     } */
#ifndef MM3_CLI_RENDER_H
#define MM3_CLI_RENDER_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

/* getopt_long codes of the shared options, beyond any single character. */
enum { CLI_RENDER_SEED = 0x100, CLI_RENDER_STEPS, CLI_RENDER_GUIDANCE, CLI_RENDER_FLOAT, CLI_RENDER_SHIFT };

/* clang-format off */
#define CLI_RENDER_LONGOPTS                                    \
    {"seed", required_argument, NULL, CLI_RENDER_SEED},        \
    {"steps", required_argument, NULL, CLI_RENDER_STEPS},      \
    {"guidance", required_argument, NULL, CLI_RENDER_GUIDANCE},\
    {"shift", required_argument, NULL, CLI_RENDER_SHIFT},      \
    {"float", no_argument, NULL, CLI_RENDER_FLOAT}
/* clang-format on */

/* A field keeps the caller's initial value (its default) unless its option is given. */
struct cli_render {
    uint64_t seed;
    int steps;      /* 1..1000 Euler steps per window */
    float guidance; /* 0..100 DiT guidance */
    float shift;    /* (0, 20] flow-matching scheduler shift */
    bool as_float;  /* float WAV samples instead of 16-bit */
    bool seed_given, steps_given, guidance_given, shift_given;
};

/* 1: `opt` is one of the shared options and its value is stored; 0: it is not
 * one of them; -EINVAL: its value is out of range (message "--steps '0':
 * expected an integer in 1..1000"). */
int cli_render_option(struct cli_render *r, int opt, const char *arg);

/* A decimal integer without sign that fits 64 bits: 0, else -EINVAL. */
int cli_u64_parse(const char *s, uint64_t *out);

#endif
