/* mm3-stage1: the acoustic stage.
 *
 *   mm3-stage1 --golden DIR [--model CKPT] [--backend cpu|cuda] [--precision fp32|tf32|bf16]
 *       replay a golden directory (stage1/golden.h); exit 0 iff every case passes.
 *   mm3-stage1 --model CKPT --frames FILE.safetensors [--seed N] [--steps N]
 *              [--guidance G] [--float] [--backend cpu|cuda] [--precision P] -o OUT.wav
 *       render a song from stage-0 frames (tensor `frame_hiddens` [T, 8H], as written by
 *       mm3-stage0 --frames-out) to a 16-bit (or float) stereo WAV, written as the
 *       windows finish.
 *   --backend cuda runs the DiT and the flow loop on the GPU (stage1/cuda/flow_cuda.h)
 *   with GEMM operands in --precision (default tf32, as the deploy file's default); the
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
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "common/wav.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/flow.h"
#include "stage1/golden.h"
#include "stage1/render.h"
#include "stage1/server.h"
#include "stage1/vocoder.h"

#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/flow_cuda.h"
#endif

struct options {
    const char *config;
    const char *golden;
    const char *model;
    const char *frames;
    const char *out;
    uint64_t seed;
    int steps;
    float guidance;
    int as_float;
    enum mm3_backend backend;
    enum mm3_matmul_precision precision;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mm3-stage1 --config DEPLOY.yaml [--model CKPT]\n"
               "       mm3-stage1 --golden DIR [--model CKPT] [--backend cpu|cuda] [--precision fp32|tf32|bf16]\n"
               "       mm3-stage1 --model CKPT --frames FILE.safetensors [--seed N] [--steps N]\n"
               "                  [--guidance G] [--float] [--backend cpu|cuda] [--precision P] -o OUT.wav\n");
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

struct wav_stream {
    FILE *f;
    const char *path;
    enum wav_format format;
    int rate;
    int64_t frames;
    uint8_t *buf;
    size_t buf_cap;
    double t0;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int wav_stream_emit(void *ctx, const float *pcm, int n)
{
    struct wav_stream *w = ctx;
    size_t bytes = (size_t)n * 2 * wav_format_bytes(w->format);
    if (bytes > w->buf_cap) {
        uint8_t *b = realloc(w->buf, bytes);
        if (!b) return -1;
        w->buf = b;
        w->buf_cap = bytes;
    }
    wav_samples_encode(w->buf, pcm, n, 2, n, w->format);
    if (fwrite(w->buf, 1, bytes, w->f) != bytes) return -1;
    w->frames += n;
    LOG_INFO("%.2f s of audio written after %.1f s", (double)w->frames / w->rate, now_s() - w->t0);
    return 0;
}

static int vocoder_decode_cb(void *ctx, const float *latents, int L, float *pcm)
{
    return vocoder_decode(ctx, latents, L, pcm);
}

static int render_song(const struct options *o, struct wav_stream *ws, const struct condition_model *cm,
                       const struct dit_model *dm, const struct vocoder *voc, struct render_flow flow)
{
    struct st_file f;
    float *frames = NULL;
    struct render *r = NULL;
    int nd, rc;
    int64_t sh[ST_MAX_DIMS];
    if ((rc = st_file_open(&f, o->frames)) < 0) return rc;
    rc = st_file_load_f32(&f, "frame_hiddens", &frames, &nd, sh);
    st_file_close(&f);
    if (rc < 0) return rc;
    if (nd != 2) {
        free(frames);
        return mm3_errorf(-EINVAL, "%s: frame_hiddens: expected [T, width], got %d dims", o->frames, nd);
    }
    int T = (int)sh[0], W = (int)sh[1];
    LOG_INFO("%s: %d frames of %d values, %d windows, %d steps, seed %" PRIu64, o->frames, T, W, render_window_count(T),
             o->steps, o->seed);
    struct render_params p = {
        .n_steps = o->steps,
        .guidance = o->guidance,
        .noise = {RENDER_NOISE_SEEDED, o->seed, 0, NULL, NULL},
        .decoder = {(void *)voc, vocoder_hop(voc), vocoder_decode_cb},
        .sink = {ws, wav_stream_emit},
        .flow = flow,
    };
    if ((rc = render_create(&r, cm, dm, &p)) == 0) {
        /* feed the frames as stage 0 would: a window's worth of new frames at a time */
        for (int i = 0; i < T && rc == 0; i += RENDER_HOP_FRAMES) {
            int n = T - i < RENDER_HOP_FRAMES ? T - i : RENDER_HOP_FRAMES;
            rc = render_push_frames(r, frames + (size_t)i * W, n, W);
        }
        if (rc == 0) rc = render_finish(r);
    }
    render_free(r);
    free(frames);
    return rc;
}

static int cmd_render(const struct options *o)
{
    struct condition_model *cm = NULL;
    struct dit_model *dm = NULL;
    struct vocoder *voc = NULL;
    struct render_flow flow = {0};
#ifdef MM3_HAVE_CUDA
    struct flow_cuda *fc = NULL;
#endif
    struct wav_stream ws = {.path = o->out, .format = o->as_float ? WAV_FORMAT_F32 : WAV_FORMAT_PCM16, .t0 = now_s()};
    uint8_t hdr[WAV_HEADER_BYTES];
    int rc;
    if ((rc = condition_load(&cm, o->model)) < 0 || (rc = dit_load(&dm, o->model)) < 0 ||
        (rc = vocoder_load(&voc, o->model)) < 0)
        goto out;
    if (o->backend == MM3_BACKEND_CUDA) {
#ifdef MM3_HAVE_CUDA
        if (cuda_device_count_safe() < 1) {
            rc = mm3_errorf(-ENODEV, "--backend cuda: no CUDA device is present");
            goto out;
        }
        if ((rc = cuda_device_set(0)) < 0 ||
            (rc = flow_cuda_create(&fc, dm, o->precision, condition_latent_len(&cm->cfg, RENDER_WINDOW_FRAMES))) < 0)
            goto out;
        flow = (struct render_flow){fc, flow_cuda_window_run_cb};
        LOG_INFO("DiT and flow loop on the GPU, matmul precision %s", mm3_matmul_precision_name(o->precision));
#else
        rc = mm3_errorf(-ENOTSUP, "--backend cuda: this build has no CUDA (configure with -DMM3_CUDA=ON)");
        goto out;
#endif
    }
    ws.rate = vocoder_sample_rate(voc);
    if (!(ws.f = fopen(o->out, "wb"))) {
        rc = mm3_errorf(-errno, "%s: cannot create: %s", o->out, strerror(errno));
        goto out;
    }
    wav_header(hdr, 2, ws.rate, ws.format, WAV_DATA_UNKNOWN);
    if (fwrite(hdr, 1, sizeof hdr, ws.f) != sizeof hdr) {
        rc = mm3_errorf(-EIO, "%s: write failed", o->out);
        goto out;
    }
    if ((rc = render_song(o, &ws, cm, dm, voc, flow)) < 0) goto out;
    /* now that the length is known, give the header the real data size */
    uint64_t data = (uint64_t)ws.frames * 2 * wav_format_bytes(ws.format);
    wav_header(hdr, 2, ws.rate, ws.format, data > 0xFFFFFFFEu ? WAV_DATA_UNKNOWN : (uint32_t)data);
    if (fseek(ws.f, 0, SEEK_SET) != 0 || fwrite(hdr, 1, sizeof hdr, ws.f) != sizeof hdr) {
        rc = mm3_errorf(-EIO, "%s: rewriting the header failed", o->out);
        goto out;
    }
    LOG_INFO("%s: %.2f s of %d Hz stereo in %.1f s", o->out, (double)ws.frames / ws.rate, ws.rate, now_s() - ws.t0);
out:
    if (ws.f && fclose(ws.f) != 0 && rc == 0) rc = mm3_errorf(-EIO, "%s: close failed", o->out);
    free(ws.buf);
#ifdef MM3_HAVE_CUDA
    flow_cuda_free(fc);
#endif
    condition_free(cm);
    dit_free(dm);
    vocoder_free(voc);
    if (rc < 0) {
        fprintf(stderr, "mm3-stage1: %s\n", mm3_last_error());
        return 1;
    }
    return 0;
}

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') return -1;
    *v = x;
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
    struct options o = {.steps = FLOW_DEFAULT_STEPS,
                        .guidance = FLOW_DEFAULT_GUIDANCE,
                        .backend = MM3_BACKEND_CPU,
                        .precision = MM3_MATMUL_TF32};
    int backend_set = 0, precision_set = 0;
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"golden", required_argument, NULL, 'g'},
        {"model", required_argument, NULL, 'm'},
        {"frames", required_argument, NULL, 'f'},
        {"seed", required_argument, NULL, 's'},
        {"steps", required_argument, NULL, 'n'},
        {"guidance", required_argument, NULL, 'G'},
        {"float", no_argument, NULL, 'F'},
        {"backend", required_argument, NULL, 'B'},
        {"precision", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, k;
    uint64_t v;
    char *end;
    while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
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
        case 'F':
            o.as_float = 1;
            break;
        case 's':
            if (parse_u64(optarg, &o.seed) < 0) {
                fprintf(stderr, "mm3-stage1: --seed '%s': expected a non-negative integer\n", optarg);
                return 2;
            }
            break;
        case 'n':
            if (parse_u64(optarg, &v) < 0 || v < 1 || v > 1000) {
                fprintf(stderr, "mm3-stage1: --steps '%s': expected an integer in 1..1000\n", optarg);
                return 2;
            }
            o.steps = (int)v;
            break;
        case 'G':
            o.guidance = strtof(optarg, &end);
            if (end == optarg || *end || !(o.guidance >= 0.0f && o.guidance <= 100.0f)) {
                fprintf(stderr, "mm3-stage1: --guidance '%s': expected a number in 0..100\n", optarg);
                return 2;
            }
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
            if ((k = name_index(optarg, precision_name, MM3_MATMUL_BF16 + 1)) < 0) {
                fprintf(stderr, "mm3-stage1: --precision '%s': expected fp32, tf32 or bf16\n", optarg);
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
