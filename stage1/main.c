/* mm3-stage1: the acoustic stage.
 *
 *   mm3-stage1 --golden DIR [--model CKPT] [--backend cpu|cuda] [--precision fp32|tf32|bf16|fp16|fp8]
 *       replay a golden directory (stage1/golden.h); exit 0 iff every case passes.
 *   mm3-stage1 --model CKPT --frames FILE.safetensors [--seed N] [--steps N]
 *              [--guidance G] [--shift S] [--float] [--backend cpu|cuda] [--precision P] -o OUT.wav
 *       render a song from stage-0 frames (tensor `frame_hiddens` [T, 8H], as written by
 *       mm3-stage0 --frames-out) to a 16-bit (or float) stereo WAV, written as the
 *       windows finish.
 *   --backend cuda runs the DiT, the flow loop and the vocoder on the GPU (stage1/backend.h)
 *   with GEMM operands in --precision (default fp16, as the deploy file's default); the
 *   condition encoder and the vocoder stay on the CPU.
 *
 *   mm3-stage1 --config DEPLOY.yaml [--model CKPT]
 *       serve: the stage-1 half of the pipeline over the shared-memory channels
 *       (stage1/server.h, docs/operations.md) until SIGINT / SIGTERM.
 *
 * Each mode is one cmd_* function over the parsed options. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cli_render.h"
#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "stage1/backend.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/flow.h"
#include "stage1/golden.h"
#include "stage1/render.h"
#include "stage1/render_wav.h"
#include "stage1/server.h"
#include "stage1/vocoder.h"

struct options {
    const char *config;
    const char *golden;
    const char *model;
    const char *frames;
    const char *out;
    struct cli_render render;
    enum mm3_backend backend;
    enum mm3_matmul_precision precision;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mm3-stage1 --config DEPLOY.yaml [--model CKPT]\n"
            "       mm3-stage1 --golden DIR [--model CKPT] [--backend cpu|cuda] [--precision fp32|tf32|bf16|fp16|fp8]\n"
            "       mm3-stage1 --model CKPT --frames FILE.safetensors [--seed N] [--steps N]\n"
            "                  [--guidance G] [--shift S] [--float] [--backend cpu|cuda] [--precision P] -o OUT.wav\n");
}

static int cmd_golden(const struct options *o)
{
    int pass, fail;
    struct golden_options go = {.ckpt = o->model, .backend = o->backend, .precision = o->precision};
    int rc = golden_run(o->golden, &go, stdout, &pass, &fail);
    if (rc < 0) {
        fprintf(stderr, "mm3-stage1: %s\n", mm3_last_error());
        return 2;
    }
    printf("%d passed, %d failed\n", pass, fail);
    return fail == 0 && pass > 0 ? 0 : 1;
}

static int cmd_serve(const struct options *o)
{
    struct s1_server_options so = {.config = o->config, .model = o->model};
    if (s1_server_run(&so) < 0) {
        fprintf(stderr, "mm3-stage1: %s\n", mm3_last_error());
        return 1;
    }
    return 0;
}

/* ---- render mode ---- */

/* The frames as stage 0 would send them: a window hop's worth of new frames at a time. */
struct frames_feed {
    const float *frames;
    int T, W;
};

static int frames_feed_push(void *ctx, struct render *r)
{
    const struct frames_feed *ff = ctx;
    int rc = 0;
    for (int i = 0; i < ff->T && rc == 0; i += RENDER_HOP_FRAMES) {
        int n = ff->T - i < RENDER_HOP_FRAMES ? ff->T - i : RENDER_HOP_FRAMES;
        rc = render_push_frames(r, ff->frames + (size_t)i * ff->W, n, ff->W);
    }
    return rc;
}

/* frame_hiddens [T, width] of a stage-0 frames file. */
static int frames_load(const char *path, struct frames_feed *ff, float **frames)
{
    struct st_file f;
    int nd, rc;
    int64_t sh[ST_MAX_DIMS];
    if ((rc = st_file_open(&f, path)) < 0) return rc;
    rc = st_file_load_f32(&f, "frame_hiddens", frames, &nd, sh);
    st_file_close(&f);
    if (rc < 0) return rc;
    if (nd != 2) {
        free(*frames);
        *frames = NULL;
        return mm3_errorf(-EINVAL, "%s: frame_hiddens: expected [T, width], got %d dims", path, nd);
    }
    *ff = (struct frames_feed){*frames, (int)sh[0], (int)sh[1]};
    return 0;
}

static int cmd_render(const struct options *o)
{
    struct condition_model *cm = NULL;
    struct dit_model *dm = NULL;
    struct vocoder *voc = NULL;
    float *frames = NULL;
    struct frames_feed ff;
    struct s1_backend be = {0};
    int rc;
    if ((rc = condition_load(&cm, o->model)) < 0 || (rc = dit_load(&dm, o->model)) < 0 ||
        (rc = vocoder_load(&voc, o->model)) < 0)
        goto out;
    if ((rc = s1_backend_open(&be, o->backend, 0, cm, dm, voc, o->precision)) < 0) goto out;
    if (be.vocoder) vocoder_drop_weights(voc); /* the GPU copy decodes every window */
    if (be.flow) dit_drop_weights(dm);         /* the GPU flow loop runs every forward */
    if ((rc = frames_load(o->frames, &ff, &frames)) < 0) goto out;
    float shift = o->render.shift;
    if (!o->render.shift_given && (rc = flow_checkpoint_shift(o->model, &shift)) < 0) goto out;
    LOG_INFO("%s: %d frames of %d values, %d windows, %d steps, shift %g, seed %" PRIu64, o->frames, ff.T, ff.W,
             render_window_count(ff.T), o->render.steps, (double)shift, o->render.seed);
    struct render_params p = {
        .n_steps = o->render.steps,
        .guidance = o->render.guidance,
        .shift = shift,
        .noise = {RENDER_NOISE_SEEDED, o->render.seed, 0, NULL, NULL},
    };
    s1_backend_apply(&be, &p);
    struct render_wav_source src = {&ff, frames_feed_push};
    struct render_wav_format fmt = {o->render.as_float ? WAV_FORMAT_F32 : WAV_FORMAT_PCM16, 0};
    rc = render_to_wav(o->out, cm, dm, voc, &p, &src, &fmt, NULL);
out:
    free(frames);
    s1_backend_close(&be);
    condition_free(cm);
    dit_free(dm);
    vocoder_free(voc);
    if (rc < 0) {
        fprintf(stderr, "mm3-stage1: %s\n", mm3_last_error());
        return 1;
    }
    return 0;
}

/* Index of s in names[n], or -1. */
static int name_index(const char *s, const char *(*name)(int), int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, name(i))) return i;
    return -1;
}

static const char *backend_name(int i)
{
    return mm3_backend_name((enum mm3_backend)i);
}

static const char *precision_name(int i)
{
    return mm3_matmul_precision_name((enum mm3_matmul_precision)i);
}

int main(int argc, char **argv)
{
    mm3_log_set_tag("stage1");
    struct options o = {.render = {.steps = FLOW_DEFAULT_STEPS, .guidance = FLOW_DEFAULT_GUIDANCE},
                        .backend = MM3_BACKEND_CPU,
                        .precision = MM3_MATMUL_FP16};
    int backend_set = 0, precision_set = 0;
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"golden", required_argument, NULL, 'g'},
        {"model", required_argument, NULL, 'm'},
        {"frames", required_argument, NULL, 'f'},
        CLI_RENDER_LONGOPTS,
        {"backend", required_argument, NULL, 'B'},
        {"precision", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, k;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
        int taken = cli_render_option(&o.render, c, optarg);
        if (taken < 0) {
            fprintf(stderr, "mm3-stage1: %s\n", mm3_last_error());
            return 2;
        }
        if (taken) continue;
        switch (c) {
        case 'c':
            o.config = optarg;
            break;
        case 'g':
            o.golden = optarg;
            break;
        case 'm':
            o.model = optarg;
            break;
        case 'f':
            o.frames = optarg;
            break;
        case 'o':
            o.out = optarg;
            break;
        case 'B':
            /* auto is the deploy file's business; the command line names one */
            if ((k = name_index(optarg, backend_name, MM3_BACKEND_CUDA + 1)) < MM3_BACKEND_CPU) {
                fprintf(stderr, "mm3-stage1: --backend '%s': expected cpu or cuda\n", optarg);
                return 2;
            }
            o.backend = (enum mm3_backend)k;
            backend_set = 1;
            break;
        case 'P':
            if ((k = name_index(optarg, precision_name, MM3_MATMUL_COUNT)) < 0) {
                fprintf(stderr, "mm3-stage1: --precision '%s': expected fp32, tf32, bf16, fp16 or fp8\n", optarg);
                return 2;
            }
            o.precision = (enum mm3_matmul_precision)k;
            precision_set = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    if (precision_set && o.backend != MM3_BACKEND_CUDA) {
        fprintf(stderr, "mm3-stage1: --precision applies to --backend cuda only (the CPU is float32)\n");
        return 2;
    }
    if (o.config) {
        if (backend_set) {
            fprintf(stderr, "mm3-stage1: --config: the deploy file's `backend` and `matmul_precision` decide\n");
            return 2;
        }
        if (o.golden || o.frames || o.out) {
            fprintf(stderr, "mm3-stage1: --config serves; it does not combine with --golden, --frames or -o\n");
            return 2;
        }
        return cmd_serve(&o);
    }
    if (o.golden) return cmd_golden(&o);
    if (o.model && o.frames && o.out) return cmd_render(&o);
    usage(stderr);
    return 2;
}
