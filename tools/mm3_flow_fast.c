/* mm3-flow-fast: what fewer Euler steps and a shifted schedule cost in audio.
 *
 *   mm3-flow-fast --model CKPT [--frames FILE.safetensors | --seconds S] [--seed N] [--guidance G]
 *                 [--settings 30/1.0,16/2.0,...] [--backend cpu|cuda] [--precision P]
 *
 * Renders one song once per setting (Euler steps / scheduler shift) from the same stage-0
 * frames and the same seeded noise, and prints one table: per setting the SNR in dB and the
 * log-mel L1 distance of its audio against the first setting's (the reference, 30/1.0 by
 * default), and the render's wall time. Frames: `frame_hiddens` [T, width] of a file written
 * by mm3-stage0 --frames-out, or (--seconds, default 30) S x 25 deterministic frames of the
 * checkpoint's width (a random-weight checkpoint gives no better frames than these).
 *
 * SNR = 10 log10(sum ref^2 / sum (x - ref)^2) over both channels ("inf" when equal).
 * Log-mel L1 = mean over frames and bands of |ln(mel_x + 1e-5) - ln(mel_ref + 1e-5)|, on the
 * channels' mean: Hann window 2048, hop 512, power spectrum, 128 triangular mel bands (HTK
 * scale) from 0 Hz to half the sample rate. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cli_render.h"
#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "stage1/backend.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/flow.h"
#include "stage1/render.h"
#include "stage1/vocoder.h"

#define MAX_SETTINGS 16
#define FRAMES_PER_SECOND 25
#define MEL_FFT 2048
#define MEL_HOP 512
#define MEL_BANDS 128
#define MEL_EPS 1e-5

static const char DEFAULT_SETTINGS[] = "30/1.0,16/2.0,20/1.5,16/1.0,20/1.0,12/3.0";

struct setting {
    int steps;
    float shift;
};

struct options {
    const char *model, *frames, *settings;
    double seconds;
    uint64_t seed;
    float guidance;
    enum mm3_backend backend;
    enum mm3_matmul_precision precision;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mm3-flow-fast --model CKPT [--frames FILE.safetensors | --seconds S] [--seed N] [--guidance G]\n"
            "                     [--settings STEPS/SHIFT,...] [--backend cpu|cuda] [--precision fp32|tf32|bf16|fp16|fp8]\n"
            "  --settings  the first is the reference (default %s)\n",
            DEFAULT_SETTINGS);
}

static int settings_parse(const char *text, struct setting *out, int *n)
{
    *n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long steps = strtol(p, &end, 10);
        float shift = 0.0f;
        if (end == p || *end != '/' || steps < 1 || steps > 1000) goto bad;
        p = end + 1;
        shift = strtof(p, &end);
        if (end == p || (*end && *end != ',') || !(shift > 0.0f && shift <= FLOW_MAX_SHIFT)) goto bad;
        if (*n == MAX_SETTINGS) return mm3_errorf(-EINVAL, "--settings: at most %d settings", MAX_SETTINGS);
        out[(*n)++] = (struct setting){(int)steps, shift};
        p = *end ? end + 1 : end;
    }
    if (*n > 0) return 0;
bad:
    return mm3_errorf(-EINVAL,
                      "--settings '%s': expected STEPS/SHIFT[,STEPS/SHIFT...] with steps 1..1000, shift (0, %g]", text,
                      (double)FLOW_MAX_SHIFT);
}

/* ---- the song: frames and renders ---- */

struct pcm {
    float *ch[2];
    int64_t n, cap;
};

static int pcm_emit(void *ctx, const float *pcm, int n)
{
    struct pcm *a = ctx;
    if (a->n + n > a->cap) {
        int64_t cap = a->cap ? a->cap * 2 : 1 << 20;
        while (cap < a->n + n)
            cap *= 2;
        for (int c = 0; c < 2; c++) {
            float *p = realloc(a->ch[c], sizeof(float) * (size_t)cap);
            if (!p) return -ENOMEM;
            a->ch[c] = p;
        }
        a->cap = cap;
    }
    for (int c = 0; c < 2; c++)
        memcpy(a->ch[c] + a->n, pcm + (size_t)c * n, sizeof(float) * (size_t)n);
    a->n += n;
    return 0;
}

static void pcm_free(struct pcm *a)
{
    free(a->ch[0]), free(a->ch[1]);
    memset(a, 0, sizeof *a);
}

static int vocoder_decode_cb(void *ctx, const float *latents, int L, float *pcm)
{
    return vocoder_decode(ctx, latents, L, pcm);
}

static int frames_load(const struct options *o, const struct condition_model *cm, float **frames, int *T, int *W)
{
    if (o->frames) {
        struct st_file f;
        int nd, rc;
        int64_t sh[ST_MAX_DIMS];
        if ((rc = st_file_open(&f, o->frames)) < 0) return rc;
        rc = st_file_load_f32(&f, "frame_hiddens", frames, &nd, sh);
        st_file_close(&f);
        if (rc < 0) return rc;
        if (nd != 2) return mm3_errorf(-EINVAL, "%s: frame_hiddens: expected [T, width], got %d dims", o->frames, nd);
        *T = (int)sh[0], *W = (int)sh[1];
        return 0;
    }
    *T = (int)(o->seconds * FRAMES_PER_SECOND + 0.5);
    *W = cm->cfg.n_layers * cm->cfg.hidden;
    if (*T < 1) return mm3_errorf(-EINVAL, "--seconds %g: expected at least one frame", o->seconds);
    *frames = malloc(sizeof(float) * (size_t)*T * (size_t)*W);
    if (!*frames) return mm3_errorf(-ENOMEM, "out of memory for %d frames of %d values", *T, *W);
    for (size_t i = 0; i < (size_t)*T * (size_t)*W; i++)
        (*frames)[i] = sinf(0.013f * (float)(i % 1000003)) * 2.0f;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int render_one(const struct condition_model *cm, const struct dit_model *dm, const struct vocoder *voc,
                      const struct s1_backend *be, const struct options *o, const struct setting *s,
                      const float *frames, int T, int W, struct pcm *out, double *seconds)
{
    struct render_params p = {
        .n_steps = s->steps,
        .guidance = o->guidance,
        .shift = s->shift,
        .noise = {RENDER_NOISE_SEEDED, o->seed, 0, NULL, NULL},
        .decoder = {(void *)voc, vocoder_hop(voc), vocoder_decode_cb},
        .sink = {out, pcm_emit},
    };
    s1_backend_apply(be, &p);
    struct render *r;
    double t0 = now_s();
    int rc = render_create(&r, cm, dm, &p);
    if (rc < 0) return rc;
    if ((rc = render_push_frames(r, frames, T, W)) == 0) rc = render_finish(r);
    render_free(r);
    *seconds = now_s() - t0;
    return rc;
}

/* ---- the distances ---- */

static double snr_db(const struct pcm *x, const struct pcm *ref)
{
    double s = 0, e = 0;
    for (int c = 0; c < 2; c++)
        for (int64_t i = 0; i < ref->n; i++) {
            double d = (double)x->ch[c][i] - ref->ch[c][i];
            s += (double)ref->ch[c][i] * ref->ch[c][i];
            e += d * d;
        }
    return e == 0 ? INFINITY : 10.0 * log10(s / e);
}

/* In-place radix-2 FFT of n complex values (re, im), n a power of two. */
static void fft(double *re, double *im, int n)
{
    for (int i = 1, j = 0; i < n; i++) {
        int bit = n >> 1;
        for (; j & bit; bit >>= 1)
            j ^= bit;
        j ^= bit;
        if (i < j) {
            double t = re[i];
            re[i] = re[j], re[j] = t;
            t = im[i], im[i] = im[j], im[j] = t;
        }
    }
    for (int len = 2; len <= n; len <<= 1) {
        double a = -2.0 * M_PI / len;
        for (int i = 0; i < n; i += len)
            for (int k = 0; k < len / 2; k++) {
                double wr = cos(a * k), wi = sin(a * k);
                double *ur = &re[i + k], *ui = &im[i + k], *vr = &re[i + k + len / 2], *vi = &im[i + k + len / 2];
                double tr = *vr * wr - *vi * wi, ti = *vr * wi + *vi * wr;
                *vr = *ur - tr, *vi = *ui - ti;
                *ur += tr, *ui += ti;
            }
    }
}

static double hz_to_mel(double f)
{
    return 2595.0 * log10(1.0 + f / 700.0);
}

static double mel_to_hz(double m)
{
    return 700.0 * (pow(10.0, m / 2595.0) - 1.0);
}

/* fb[MEL_BANDS][MEL_FFT / 2 + 1]: triangular bands, HTK mel scale, 0 .. rate / 2. */
static double *mel_filters(int rate)
{
    int nb = MEL_FFT / 2 + 1;
    double *fb = calloc((size_t)MEL_BANDS * nb, sizeof(double));
    if (!fb) return NULL;
    double top = hz_to_mel(rate / 2.0), edge[MEL_BANDS + 2];
    for (int i = 0; i < MEL_BANDS + 2; i++)
        edge[i] = mel_to_hz(top * i / (MEL_BANDS + 1));
    for (int b = 0; b < MEL_BANDS; b++)
        for (int k = 0; k < nb; k++) {
            double f = (double)k * rate / MEL_FFT;
            double up = (f - edge[b]) / (edge[b + 1] - edge[b]), down = (edge[b + 2] - f) / (edge[b + 2] - edge[b + 1]);
            double w = up < down ? up : down;
            fb[(size_t)b * nb + k] = w > 0 ? w : 0;
        }
    return fb;
}

/* log-mel frames of the channels' mean: out[n_frames][MEL_BANDS]. */
static int log_mel(const struct pcm *a, const double *fb, double **out, int *n_frames)
{
    int nb = MEL_FFT / 2 + 1;
    int nf = a->n >= MEL_FFT ? (int)((a->n - MEL_FFT) / MEL_HOP) + 1 : 0;
    double *m = malloc(sizeof(double) * ((size_t)nf * MEL_BANDS + 1));
    double *re = malloc(sizeof(double) * MEL_FFT), *im = malloc(sizeof(double) * MEL_FFT);
    if (!m || !re || !im) {
        free(m), free(re), free(im);
        return mm3_errorf(-ENOMEM, "out of memory for %d mel frames", nf);
    }
    for (int f = 0; f < nf; f++) {
        for (int i = 0; i < MEL_FFT; i++) {
            int64_t j = (int64_t)f * MEL_HOP + i;
            double w = 0.5 - 0.5 * cos(2.0 * M_PI * i / MEL_FFT);
            re[i] = w * 0.5 * ((double)a->ch[0][j] + a->ch[1][j]);
            im[i] = 0;
        }
        fft(re, im, MEL_FFT);
        for (int b = 0; b < MEL_BANDS; b++) {
            double e = 0;
            for (int k = 0; k < nb; k++)
                e += fb[(size_t)b * nb + k] * (re[k] * re[k] + im[k] * im[k]);
            m[(size_t)f * MEL_BANDS + b] = log(e + MEL_EPS);
        }
    }
    free(re), free(im);
    *out = m;
    *n_frames = nf;
    return 0;
}

static double mel_l1(const double *a, const double *b, int n_frames)
{
    double s = 0;
    for (size_t i = 0; i < (size_t)n_frames * MEL_BANDS; i++)
        s += fabs(a[i] - b[i]);
    return n_frames > 0 ? s / ((double)n_frames * MEL_BANDS) : NAN;
}

/* ---- main ---- */

static int run(const struct options *o, const struct setting *set, int n_set)
{
    struct condition_model *cm = NULL;
    struct dit_model *dm = NULL;
    struct vocoder *voc = NULL;
    struct s1_backend be = {0};
    float *frames = NULL;
    double *fb = NULL, *mel_ref = NULL;
    struct pcm ref = {0};
    int T = 0, W = 0, n_mel = 0, rc;
    if ((rc = condition_load(&cm, o->model)) < 0 || (rc = dit_load(&dm, o->model)) < 0 ||
        (rc = vocoder_load(&voc, o->model)) < 0)
        goto out;
    if ((rc = s1_backend_open(&be, o->backend, 0, cm, dm, voc, o->precision)) < 0) goto out;
    if ((rc = frames_load(o, cm, &frames, &T, &W)) < 0) goto out;
    if (!(fb = mel_filters(vocoder_sample_rate(voc)))) {
        rc = mm3_errorf(-ENOMEM, "out of memory for the mel filters");
        goto out;
    }
    printf("## Fast flow settings: %s, %s backend%s%s, %d frames (%.1f s), %d windows, seed %" PRIu64
           ", guidance %.3g\n\n",
           o->model, mm3_backend_name(o->backend), o->backend == MM3_BACKEND_CUDA ? ", precision " : "",
           o->backend == MM3_BACKEND_CUDA ? mm3_matmul_precision_name(o->precision) : "", T,
           (double)T / FRAMES_PER_SECOND, render_window_count(T), o->seed, (double)o->guidance);
    printf("| steps | shift | SNR dB vs %d/%.2f | log-mel L1 vs %d/%.2f | render s |\n", set[0].steps,
           (double)set[0].shift, set[0].steps, (double)set[0].shift);
    printf("|---|---|---|---|---|\n");
    fflush(stdout);
    for (int i = 0; i < n_set && rc == 0; i++) {
        struct pcm x = {0};
        double secs = 0, *mel = NULL;
        int nf = 0;
        if ((rc = render_one(cm, dm, voc, &be, o, &set[i], frames, T, W, i == 0 ? &ref : &x, &secs)) < 0) {
            pcm_free(&x);
            break;
        }
        if (i == 0) {
            if ((rc = log_mel(&ref, fb, &mel_ref, &n_mel)) < 0) break;
            printf("| %d | %.2f | (reference) | (reference) | %.2f |\n", set[i].steps, (double)set[i].shift, secs);
        } else {
            if (x.n != ref.n) {
                rc = mm3_errorf(-EIO, "setting %d/%g: %" PRId64 " samples, the reference %" PRId64, set[i].steps,
                                (double)set[i].shift, x.n, ref.n);
                pcm_free(&x);
                break;
            }
            if ((rc = log_mel(&x, fb, &mel, &nf)) == 0) {
                double snr = snr_db(&x, &ref);
                char snr_text[32];
                if (isinf(snr))
                    snprintf(snr_text, sizeof snr_text, "inf");
                else
                    snprintf(snr_text, sizeof snr_text, "%.1f", snr);
                printf("| %d | %.2f | %s | %.4f | %.2f |\n", set[i].steps, (double)set[i].shift, snr_text,
                       mel_l1(mel, mel_ref, n_mel), secs);
            }
            free(mel);
            pcm_free(&x);
        }
        fflush(stdout);
    }
out:
    free(frames), free(fb), free(mel_ref);
    pcm_free(&ref);
    s1_backend_close(&be);
    condition_free(cm);
    dit_free(dm);
    vocoder_free(voc);
    return rc;
}

int main(int argc, char **argv)
{
    mm3_log_set_tag("flow-fast");
    struct options o = {.settings = DEFAULT_SETTINGS,
                        .seconds = 30,
                        .guidance = FLOW_DEFAULT_GUIDANCE,
                        .backend = MM3_BACKEND_CPU,
                        .precision = MM3_MATMUL_FP16};
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},    {"frames", required_argument, NULL, 'f'},
        {"seconds", required_argument, NULL, 's'},  {"seed", required_argument, NULL, 'S'},
        {"guidance", required_argument, NULL, 'g'}, {"settings", required_argument, NULL, 'x'},
        {"backend", required_argument, NULL, 'B'},  {"precision", required_argument, NULL, 'P'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    int c, k;
    char *end;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm':
            o.model = optarg;
            break;
        case 'f':
            o.frames = optarg;
            break;
        case 's':
            o.seconds = strtod(optarg, &end);
            if (end == optarg || *end || !(o.seconds > 0 && o.seconds <= 360)) {
                fprintf(stderr, "mm3-flow-fast: --seconds '%s': expected a number in (0, 360]\n", optarg);
                return 2;
            }
            break;
        case 'S':
            if (cli_u64_parse(optarg, &o.seed) < 0) {
                fprintf(stderr, "mm3-flow-fast: --seed '%s': expected a non-negative integer\n", optarg);
                return 2;
            }
            break;
        case 'g':
            o.guidance = strtof(optarg, &end);
            if (end == optarg || *end || !(o.guidance >= 0.0f && o.guidance <= 100.0f)) {
                fprintf(stderr, "mm3-flow-fast: --guidance '%s': expected a number in 0..100\n", optarg);
                return 2;
            }
            break;
        case 'x':
            o.settings = optarg;
            break;
        case 'B':
            if (!strcmp(optarg, "cpu"))
                o.backend = MM3_BACKEND_CPU;
            else if (!strcmp(optarg, "cuda"))
                o.backend = MM3_BACKEND_CUDA;
            else {
                fprintf(stderr, "mm3-flow-fast: --backend '%s': expected cpu or cuda\n", optarg);
                return 2;
            }
            break;
        case 'P':
            for (k = 0; k < MM3_MATMUL_COUNT && strcmp(optarg, mm3_matmul_precision_name(k)); k++)
                ;
            if (k == MM3_MATMUL_COUNT) {
                fprintf(stderr, "mm3-flow-fast: --precision '%s': expected fp32, tf32, bf16, fp16 or fp8\n", optarg);
                return 2;
            }
            o.precision = (enum mm3_matmul_precision)k;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    struct setting set[MAX_SETTINGS];
    int n_set;
    if (optind != argc || !o.model) {
        usage(stderr);
        return 2;
    }
    if (settings_parse(o.settings, set, &n_set) < 0) {
        fprintf(stderr, "mm3-flow-fast: %s\n", mm3_last_error());
        return 2;
    }
    if (run(&o, set, n_set) < 0) {
        fprintf(stderr, "mm3-flow-fast: %s\n", mm3_last_error());
        return 1;
    }
    return 0;
}
