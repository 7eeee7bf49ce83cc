/* mm3-stage0: the stage-0 program.
 *
 *   mm3-stage0 --golden DIR [--backend cpu]
 *       replay check of a golden directory; exit 0 only when every case passes.
 *   mm3-stage0 --model CKPT --caption TEXT --lyrics-file F [--duration S] [--seed N | --replay FILE]
 *              --frames-out FILE.safetensors [--backend cpu]
 *       generate one song's frames: frame_hiddens [T, 8H] F32, codes [T, 8] I64, and
 *       every draw (lm_sampled, depth_sampled, as in the golden cases) so that the
 *       output can be fed back with --replay (forced draws instead of the seed).
 *
 * Argument parsing is one function, each mode another (server mode slots in beside). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/sampler.h"
#include "common/sampler_replay.h"
#include "stage0/generate.h"
#include "stage0/generate_prompt.h"
#include "stage0/golden.h"

enum stage0_mode { MODE_NONE = 0, MODE_GOLDEN, MODE_GENERATE };

struct stage0_args {
    enum stage0_mode mode;
    const char *golden_dir;
    const char *backend;
    const char *model, *caption, *lyrics_file, *frames_out, *replay;
    double duration;
    uint64_t seed;
    int seed_given;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mm3-stage0 --golden DIR [--backend cpu]\n"
               "       mm3-stage0 --model CKPT --caption TEXT --lyrics-file F [--duration S] [--seed N | --replay F]\n"
               "                  --frames-out FILE.safetensors [--backend cpu]\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || *s == '-' || !*s) return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return -1;
    *out = v;
    return 0;
}

static int parse_args(int argc, char **argv, struct stage0_args *a)
{
    memset(a, 0, sizeof *a);
    a->backend = "cpu";
    a->duration = 60.0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!v) return mm3_errorf(-EINVAL, "option %s needs a value", k);
        i++;
        if (!strcmp(k, "--golden"))
            a->golden_dir = v;
        else if (!strcmp(k, "--backend"))
            a->backend = v;
        else if (!strcmp(k, "--model"))
            a->model = v;
        else if (!strcmp(k, "--caption"))
            a->caption = v;
        else if (!strcmp(k, "--lyrics-file"))
            a->lyrics_file = v;
        else if (!strcmp(k, "--frames-out"))
            a->frames_out = v;
        else if (!strcmp(k, "--replay"))
            a->replay = v;
        else if (!strcmp(k, "--duration")) {
            char *end;
            a->duration = strtod(v, &end);
            if (*end || !(a->duration > 0)) return mm3_errorf(-EINVAL, "--duration %s: expected seconds > 0", v);
        } else if (!strcmp(k, "--seed")) {
            if (parse_u64(v, &a->seed) < 0) return mm3_errorf(-EINVAL, "--seed %s: expected a non-negative integer", v);
            a->seed_given = 1;
        } else {
            return mm3_errorf(-EINVAL, "unknown option %s", k);
        }
    }
    if (strcmp(a->backend, "cpu"))
        return mm3_errorf(-EINVAL, "--backend %s: only 'cpu' is available in this build", a->backend);
    if (a->golden_dir) {
        if (a->model) return mm3_errorf(-EINVAL, "--golden and --model are separate modes");
        a->mode = MODE_GOLDEN;
    } else if (a->model) {
        if (!a->caption || !a->lyrics_file || !a->frames_out)
            return mm3_errorf(-EINVAL, "--model needs --caption, --lyrics-file and --frames-out");
        if (a->replay && a->seed_given) return mm3_errorf(-EINVAL, "--seed and --replay are exclusive");
        a->mode = MODE_GENERATE;
    } else {
        return mm3_errorf(-EINVAL, "nothing to do: give --golden DIR or --model CKPT");
    }
    return 0;
}

static int run_golden(const struct stage0_args *a)
{
    int n_pass, n_fail;
    int rc = golden_check_dir(a->golden_dir, stdout, &n_pass, &n_fail);
    if (rc < 0) {
        fprintf(stderr, "mm3-stage0: %s\n", mm3_last_error());
        return 2;
    }
    return n_fail == 0 && n_pass > 0 ? 0 : 1;
}

static char *read_text_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        mm3_errorf(-errno, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        mm3_errorf(-ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

struct frames_sink {
    float *frames;
    int64_t *codes;
    int width, ncb, n;
    int64_t *lm_ids, *depth_codes; /* every draw, step 0 and a final stop included */
    int n_lm, n_depth;
};

/* Record the draws of the step just run (there is no frame hook for step 0 or the stop). */
static void sink_draws(struct frames_sink *s, const struct generate *g)
{
    if (g->stop == GENERATE_STOP_TOKEN) {
        s->lm_ids[s->n_lm++] = SAMPLER_STOP_ID;
        return;
    }
    s->lm_ids[s->n_lm++] = SAMPLER_CODE_OFFSET + g->codes[0];
    for (int j = 1; j < s->ncb; j++)
        s->depth_codes[s->n_depth++] = g->codes[j];
}

static void sink_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    struct frames_sink *s = ctx;
    memcpy(s->frames + (size_t)t * s->width, frame, sizeof(float) * s->width);
    for (int j = 0; j < s->ncb; j++)
        s->codes[(size_t)t * s->ncb + j] = codes[j];
    s->n = t + 1;
}

static int run_generate(const struct stage0_args *a)
{
    struct talker lm;
    struct depth dd;
    double fps;
    int max_frames, rc;
    int32_t *ids = NULL;
    int n_ids = 0;
    char *lyrics = read_text_file(a->lyrics_file);
    if (!lyrics) goto fail_early;
    if ((rc = generate_frame_rate(a->model, &fps)) < 0) goto fail_early;
    if ((rc = generate_frame_budget(a->duration, fps, &max_frames)) < 0) goto fail_early;
    if ((rc = generate_prompt_ids(a->model, a->caption, lyrics, &ids, &n_ids)) < 0) goto fail_early;
    if ((rc = talker_load(&lm, a->model)) < 0) goto fail_early;
    if ((rc = depth_load(&dd, a->model)) < 0) {
        talker_free(&lm);
        goto fail_early;
    }
    int H = lm.cfg.hidden, ncb = dd.cfg.n_codebooks;
    struct frames_sink sink = {.width = ncb * H, .ncb = ncb};
    sink.frames = malloc(sizeof(float) * (size_t)max_frames * ncb * H);
    sink.codes = malloc(sizeof(int64_t) * (size_t)max_frames * ncb);
    sink.lm_ids = malloc(sizeof(int64_t) * ((size_t)max_frames + 1));
    sink.depth_codes = malloc(sizeof(int64_t) * ((size_t)max_frames + 1) * ncb);
    struct sampler sp;
    struct sampler_replay_data forced = {0};
    sampler_init_seeded(&sp, a->seed);
    if (a->replay) {
        if ((rc = sampler_replay_load(&forced, a->replay)) < 0) goto fail_loaded;
        sampler_init_replay(&sp, forced.lm_ids, forced.n_lm, forced.depth_codes, forced.n_depth, ncb);
    }
    struct generate g;
    struct generate_hooks hooks = {.ctx = &sink, .on_frame = sink_frame};
    if (!sink.frames || !sink.codes || !sink.lm_ids || !sink.depth_codes)
        rc = mm3_errorf(-ENOMEM, "out of memory for %d frames", max_frames);
    else
        rc = generate_begin(&g, &lm, &dd, &sp, ids, n_ids / 2, max_frames, SAMPLER_CFG_SCALE, &hooks);
    if (rc == 0) {
        while (!g.done && rc == 0) {
            rc = generate_step(&g);
            if (rc == 0) sink_draws(&sink, &g);
        }
        LOG_INFO("generated %d frames (%s)", sink.n,
                 g.stop == GENERATE_STOP_TOKEN    ? "stop token"
                 : g.stop == GENERATE_STOP_BUDGET ? "frame budget"
                                                  : "error");
        generate_end(&g);
    }
    if (rc == 0) {
        struct st_writer_tensor t[4] = {
            {"frame_hiddens", MM3_DTYPE_F32, 2, {sink.n, sink.width}, sink.frames},
            {"codes", MM3_DTYPE_I64, 2, {sink.n, ncb}, sink.codes},
            {"lm_sampled", MM3_DTYPE_I64, 1, {sink.n_lm}, sink.lm_ids},
            {"depth_sampled", MM3_DTYPE_I64, 1, {sink.n_depth}, sink.depth_codes},
        };
        rc = st_write_file(a->frames_out, t, 4, NULL);
    }
fail_loaded:
    sampler_replay_free(&forced);
    free(sink.frames);
    free(sink.codes);
    free(sink.lm_ids);
    free(sink.depth_codes);
    talker_free(&lm);
    depth_free(&dd);
    free(ids);
    free(lyrics);
    if (rc < 0) {
        fprintf(stderr, "mm3-stage0: %s\n", mm3_last_error());
        return 1;
    }
    return 0;
fail_early:
    fprintf(stderr, "mm3-stage0: %s\n", mm3_last_error());
    free(ids);
    free(lyrics);
    return 1;
}

int main(int argc, char **argv)
{
    mm3_log_set_tag("stage0");
    struct stage0_args a;
    if (parse_args(argc, argv, &a) < 0) {
        fprintf(stderr, "mm3-stage0: %s\n", mm3_last_error());
        usage(stderr);
        return 2;
    }
    switch (a.mode) {
    case MODE_GOLDEN:
        return run_golden(&a);
    case MODE_GENERATE:
        return run_generate(&a);
    default:
        return 2;
    }
}
