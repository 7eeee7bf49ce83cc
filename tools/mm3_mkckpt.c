/* mm3-mkckpt: write a random-weight MiniMax-Music3 checkpoint in the release layout.
 *
 *   mm3-mkckpt [--preset tiny|full] --out DIR [--seed N] [--threads N] [--sparse] [--rope-top-level]
 *              [--set FIELD=VALUE]...
 *
 * tiny (default): the geometry of golden tiny-a, ~12 MB, renders on a CPU in seconds.
 * full: the release geometry (~27 GB written, streamed; --sparse writes only headers
 * and configs, the data sections being holes that read back as zeros).
 *
 *   mm3-mkckpt --lora OUT --model CKPT [--component C] [--rank R] [--alpha A] [--rslora]
 *              [--targets a,b,...] [--seed N]
 *
 * writes a random LoRA adapter (PEFT layout) for component C (language_model by
 * default, rvq_depth_decoder, transformer) of the checkpoint CKPT. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt_gen.h"
#include "common/error.h"
#include "common/log.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mm3-mkckpt [--preset tiny|full] --out DIR [--seed N] [--threads N] [--sparse] [--rope-top-level]\n"
            "  --preset tiny   geometry of golden tiny-a (default)\n"
            "  --preset full   release geometry, ~27 GB streamed to disk\n"
            "  --seed N        weights are a pure function of the seed (default 0)\n"
            "  --threads N     generator threads (default: online CPUs)\n"
            "  --sparse        headers and configs only; weights read back as zeros\n"
            "  --rope-top-level  write rope_theta at the top level of the LM config (older style)\n"
            "  --set F=V       override a geometry field after the preset, e.g. --set lm_layers=4\n"
            "                  --set ratios=8,4,2 (fields: see common/ckpt_gen.h)\n"
            "       mm3-mkckpt --lora OUT --model CKPT [--component C] [--rank R] [--alpha A] [--rslora]\n"
            "                  [--targets a,b,...] [--seed N]\n"
            "  --lora OUT      write a random LoRA adapter (PEFT layout) for CKPT's component C\n"
            "                  (language_model (default), rvq_depth_decoder, transformer)\n"
            "  --rank R        LoRA rank (default 8); --alpha A: lora_alpha (default: the rank)\n"
            "  --rslora        use_rslora: scaling alpha / sqrt(r) instead of alpha / r\n"
            "  --targets LIST  module names (PEFT target_modules; default: every linear layer of the blocks)\n");
}

int main(int argc, char **argv)
{
    mm3_log_set_tag("mkckpt");
    const char *preset = "tiny", *out = NULL;
    struct ckpt_gen_opts o = {0};
    const char *sets[64];
    int n_sets = 0;
    const char *lora_out = NULL, *lora_model = NULL;
    struct ckpt_gen_lora_opts lo = {.component = "language_model", .rank = 8, .alpha = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--sparse")) {
            o.sparse = 1;
        } else if (!strcmp(a, "--rslora")) {
            lo.rslora = 1;
        } else if (v && (!strcmp(a, "--lora") || !strcmp(a, "--model") || !strcmp(a, "--component") ||
                         !strcmp(a, "--targets"))) {
            *(!strcmp(a, "--lora")        ? &lora_out
              : !strcmp(a, "--model")     ? &lora_model
              : !strcmp(a, "--component") ? &lo.component
                                          : &lo.targets) = v;
            i++;
        } else if (v && (!strcmp(a, "--rank") || !strcmp(a, "--alpha"))) {
            char *end;
            double x = strtod(v, &end);
            if (*end || !*v || !(x > 0) || (!strcmp(a, "--rank") && (x != (int)x || x > 4096))) {
                fprintf(stderr, "mm3-mkckpt: %s: expected a positive %s, got '%s'\n", a,
                        !strcmp(a, "--rank") ? "integer up to 4096" : "number", v);
                return 2;
            }
            if (!strcmp(a, "--rank"))
                lo.rank = (int)x;
            else
                lo.alpha = x;
            i++;
        } else if (!strcmp(a, "--rope-top-level")) {
            o.rope_top_level = 1;
        } else if (v && !strcmp(a, "--preset")) {
            preset = v;
            i++;
        } else if (v && !strcmp(a, "--set")) {
            if (n_sets == 64 || !strchr(v, '=')) {
                fprintf(stderr, "mm3-mkckpt: --set: expected FIELD=VALUE (at most 64), got '%s'\n", v);
                return 2;
            }
            sets[n_sets++] = v;
            i++;
        } else if (v && !strcmp(a, "--out")) {
            out = v;
            i++;
        } else if (v && (!strcmp(a, "--seed") || !strcmp(a, "--threads"))) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(v, &end, 0);
            if (errno || *end || !*v) {
                fprintf(stderr, "mm3-mkckpt: %s: expected a non-negative integer, got '%s'\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--seed"))
                o.seed = n;
            else
                o.threads = n > 256 ? 256 : (int)n;
            i++;
        } else {
            fprintf(stderr, "mm3-mkckpt: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (lora_out || lora_model) {
        if (!lora_out || !lora_model) {
            fprintf(stderr, "mm3-mkckpt: --lora OUT needs --model CKPT (and --model only goes with --lora)\n");
            return 2;
        }
        lo.seed = o.seed;
        if (lo.alpha < 0) lo.alpha = lo.rank;
        if (ckpt_gen_lora_write(lora_out, lora_model, &lo) < 0) {
            fprintf(stderr, "mm3-mkckpt: %s\n", mm3_last_error());
            return 1;
        }
        LOG_INFO("wrote a rank-%d LoRA adapter for %s/%s to %s", lo.rank, lora_model, lo.component, lora_out);
        return 0;
    }
    if (!out) {
        fprintf(stderr, "mm3-mkckpt: --out DIR is required\n");
        usage(stderr);
        return 2;
    }
    struct ckpt_gen_geometry g;
    int rc = ckpt_gen_preset(preset, &g);
    for (int i = 0; rc == 0 && i < n_sets; i++) {
        char key[64];
        size_t klen = (size_t)(strchr(sets[i], '=') - sets[i]);
        snprintf(key, sizeof key, "%.*s", (int)(klen < sizeof key ? klen : sizeof key - 1), sets[i]);
        rc = ckpt_gen_geometry_set(&g, key, sets[i] + klen + 1);
    }
    if (rc == 0) rc = ckpt_gen_write(out, &g, &o);
    if (rc < 0) {
        fprintf(stderr, "mm3-mkckpt: %s\n", mm3_last_error());
        return 1;
    }
    LOG_INFO("wrote the %s checkpoint (seed %" PRIu64 ") to %s", preset, o.seed, out);
    return 0;
}
