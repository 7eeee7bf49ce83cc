/* mm3-stage0: the stage-0 program.
 *
 *   mm3-stage0 --golden DIR [--backend cpu|cuda]
 *       replay check of a golden directory; exit 0 only when every case passes.
 *   mm3-stage0 --model CKPT --caption TEXT --lyrics-file F [--duration S] [--seed N | --replay FILE]
 *              --frames-out FILE.safetensors [--backend cpu|cuda]
 *       generate one song's frames: frame_hiddens [T, 8H] F32, codes [T, 8] I64, and
 *       every draw (lm_sampled, depth_sampled, as in the golden cases) so that the
 *       output can be fed back with --replay (forced draws instead of the seed).
 *
 *   mm3-stage0 --config DEPLOY.yaml [--model DIR] [--port N]
 *       the server: scheduler + connectors to stage 1 + HTTP API (docs/operations.md).
 *       Prints "READY stage0 http://HOST:PORT" once serving (and creates
 *       $MM3_READY_FILE); SIGINT/SIGTERM stop it: new requests get 503, songs in
 *       flight may finish within api.drain_timeout_s, then the rest fail with 503;
 *       both channels are closed (no segment left), exit 0. MM3_API_KEY, when
 *       set, is the API key (over the deploy file's api.api_key).
 *
 * Argument parsing is one function, each mode another. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/deploy.h"
#include "common/error.h"
#include "common/log.h"
#include "common/lora_merge.h"
#include "common/safetensors.h"
#include "common/sampler.h"
#include "common/sampler_replay.h"
#include "pipe/pipe_channel.h"
#include "stage0/engine.h"
#include "stage0/generate.h"
#include "stage0/text/generate_prompt.h"
#include "stage0/golden.h"
#include "stage0/model/talker_backend.h"
#include "stage0/api/http_server.h"
#include "stage0/text/tokenizer.h"
#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#endif

enum stage0_mode { MODE_NONE = 0, MODE_GOLDEN, MODE_GENERATE, MODE_SERVE };

struct stage0_args {
    enum stage0_mode mode;
    const char *golden_dir;
    const char *backend;
    const char *model, *caption, *lyrics_file, *frames_out, *replay, *config;
    int port; /* -1 = the deploy file's */
    double duration;
    uint64_t seed;
    int seed_given;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: mm3-stage0 --golden DIR [--backend cpu|cuda]\n"
               "       mm3-stage0 --model CKPT --caption TEXT --lyrics-file F [--duration S] [--seed N | --replay F]\n"
               "                  --frames-out FILE.safetensors [--backend cpu|cuda]\n"
               "       mm3-stage0 --config DEPLOY.yaml [--model DIR] [--port N]\n");
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
    a->port = -1;
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
        else if (!strcmp(k, "--config"))
            a->config = v;
        else if (!strcmp(k, "--port")) {
            char *end;
            long p = strtol(v, &end, 10);
            if (*end || !*v || p < 0 || p > 65535) return mm3_errorf(-EINVAL, "--port %s: expected 0..65535", v);
            a->port = (int)p;
        } else if (!strcmp(k, "--duration")) {
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
    enum talker_backend_kind kind;
    if (talker_backend_parse(a->backend, &kind) < 0)
        return mm3_errorf(-EINVAL, "--backend %s: expected cpu or cuda", a->backend);
    if (kind != TALKER_BACKEND_CPU && a->config)
        return mm3_errorf(-EINVAL, "--backend %s: with --config the deploy file's `backend` decides", a->backend);
    if (a->config) {
        if (a->golden_dir || a->caption || a->lyrics_file || a->frames_out || a->replay || a->seed_given)
            return mm3_errorf(-EINVAL, "--config runs the server: it takes only --model and --port");
        a->mode = MODE_SERVE;
    } else if (a->port >= 0) {
        return mm3_errorf(-EINVAL, "--port needs --config");
    } else if (a->golden_dir) {
        if (a->model) return mm3_errorf(-EINVAL, "--golden and --model are separate modes");
        a->mode = MODE_GOLDEN;
    } else if (a->model) {
        if (!a->caption || !a->lyrics_file || !a->frames_out)
            return mm3_errorf(-EINVAL, "--model needs --caption, --lyrics-file and --frames-out");
        if (a->replay && a->seed_given) return mm3_errorf(-EINVAL, "--seed and --replay are exclusive");
        a->mode = MODE_GENERATE;
    } else {
        return mm3_errorf(-EINVAL, "nothing to do: give --golden DIR, --model CKPT or --config DEPLOY.yaml");
    }
    return 0;
}

static int run_golden(const struct stage0_args *a)
{
    int n_pass, n_fail;
    /* The GPU path keeps float32 compute from bf16 weights, but the bound for a
     * bf16 backend is the looser GOLDEN_REL_TOL_BF16. */
    double tol = strcmp(a->backend, "cpu") ? GOLDEN_REL_TOL_BF16 : GOLDEN_REL_TOL;
    int rc = golden_check_dir_backend(a->golden_dir, a->backend, tol, stdout, &n_pass, &n_fail);
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
    enum talker_backend_kind kind = TALKER_BACKEND_CPU;
    talker_backend_parse(a->backend, &kind); /* checked by parse_args */
    if ((rc = talker_backend_load_models(kind, a->model, &lm, &dd)) < 0) goto fail_early;
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
    struct talker_backend be;
    int be_open = 0;
    if (!sink.frames || !sink.codes || !sink.lm_ids || !sink.depth_codes)
        rc = mm3_errorf(-ENOMEM, "out of memory for %d frames", max_frames);
    else
        rc = talker_backend_open(&be, kind, &lm, &dd, 2, n_ids / 2 + max_frames, 2);
    if (rc == 0) {
        be_open = 1;
        rc = generate_begin_backend(&g, &be, &sp, ids, n_ids / 2, max_frames, SAMPLER_CFG_SCALE, &hooks);
    }
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
    if (be_open) talker_backend_close(&be);
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

/* ---- server mode ---- */

struct serve_state {
    struct mm3_deploy d;
    struct talker lm;
    struct depth dd;
    struct tokenizer *tok;
    struct engine *eng;
    struct http_server *srv;
    int have_lm, have_dd;
};

static int serve_load(struct serve_state *st, const struct stage0_args *a)
{
    int rc;
    if ((rc = mm3_deploy_load(&st->d, a->config)) < 0) return rc;
    if (a->model && (rc = mm3_deploy_set_model(&st->d, a->model)) < 0) return rc;
    bool gpu = talker_backend_available(TALKER_BACKEND_CUDA);
    if (st->d.backend == MM3_BACKEND_CUDA && !gpu)
        return mm3_errorf(-ENODEV,
                          "%s: backend cuda: not available in this build or on this machine (configure with "
                          "-DMM3_CUDA=ON and run where a GPU is visible; or use backend: cpu / auto)",
                          st->d.source);
    if ((rc = mm3_deploy_resolve_backend(&st->d, gpu)) < 0) return rc;
#ifdef MM3_HAVE_CUDA
    /* before the first stream: the weight upload's */
    cuda_stream_priority_set(mm3_deploy_stream_priority_level(mm3_deploy_stage(&st->d, 0)->stream_priority));
#endif
    if (!st->d.model[0])
        return mm3_errorf(-EINVAL, "%s: model: no checkpoint directory; set `model:` or pass --model", st->d.source);
    const char *root = st->d.model;
    char path[MM3_DEPLOY_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", root);
    if ((rc = tokenizer_load(&st->tok, path)) < 0) return rc;
    /* The CUDA backend uploads the matrices straight from the checkpoint; the
     * teacher-forcing fallback of a re-send loads the whole model when it needs it. */
    enum talker_backend_kind kind = st->d.backend == MM3_BACKEND_CUDA ? TALKER_BACKEND_CUDA : TALKER_BACKEND_CPU;
    /* Adapters stay registered: the teacher-forcing fallback reloads the model merged the same way. */
    if ((rc = lora_merge_add_stage(mm3_deploy_stage(&st->d, 0))) < 0) return rc;
    if ((rc = talker_backend_load_models(kind, root, &st->lm, &st->dd)) < 0) return rc;
    st->have_lm = st->have_dd = 1;
    LOG_INFO("loaded %s: talker %d layers x %d hidden, %d codebooks", root, st->lm.cfg.n_layers, st->lm.cfg.hidden,
             st->dd.cfg.n_codebooks);
    return 0;
}

static void serve_free(struct serve_state *st)
{
    http_server_stop(st->srv);
    engine_destroy(st->eng);
    if (st->have_lm) talker_free(&st->lm);
    if (st->have_dd) depth_free(&st->dd);
    tokenizer_free(st->tok);
    lora_merge_clear();
    mm3_deploy_free(&st->d);
}

static int ready_file(const char *url)
{
    const char *f = getenv("MM3_READY_FILE");
    if (!f || !*f) return 0;
    int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return mm3_errorf(-errno, "MM3_READY_FILE %s: cannot create: %s", f, strerror(errno));
    char line[256];
    int n = snprintf(line, sizeof line, "%s\n", url);
    ssize_t w = write(fd, line, (size_t)n);
    close(fd);
    if (w != n) return mm3_errorf(-EIO, "MM3_READY_FILE %s: write failed", f);
    return 0;
}

static double env_seconds(const char *name, double dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    double x = strtod(v, &end);
    if (*end || !(x >= 0)) {
        LOG_WARN("%s=%s: expected seconds >= 0, using %g", name, v, dflt);
        return dflt;
    }
    return x;
}

/* MM3_API_KEY over the deploy file's key; the same rules as api.api_key. */
static int api_key_from_env(struct http_server_config *hc)
{
    const char *key = getenv("MM3_API_KEY");
    if (!key || !*key) return 0;
    for (const char *q = key; *q; q++)
        if (*q <= ' ' || *q > '~')
            return mm3_errorf(-EINVAL, "MM3_API_KEY: expected printable ASCII without spaces or control characters");
    if (strlen(key) < 16) return mm3_errorf(-EINVAL, "MM3_API_KEY: too short: expected at least 16 characters");
    hc->api_key = key;
    return 0;
}

static int run_serve(const struct stage0_args *a)
{
    /* Signals are taken by sigwait here; every thread started below inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct serve_state *st = calloc(1, sizeof *st);
    if (!st) {
        fprintf(stderr, "mm3-stage0: out of memory\n");
        return 1;
    }
    mm3_deploy_init_defaults(&st->d);
    int rc = serve_load(st, a);
    struct pipe_run run;
    if (rc == 0) rc = pipe_run_from_env(&run);
    double fps = 0;
    if (rc == 0) rc = generate_frame_rate(st->d.model, &fps);
    if (rc == 0) rc = engine_create(&st->eng, &st->d, &st->lm, &st->dd, st->tok, st->d.model, &run);
    if (rc == 0) rc = engine_start(st->eng, env_seconds("MM3_STAGE1_WAIT_S", 30.0));
    struct http_server_config hc;
    http_server_config_default(&hc);
    http_server_config_from_deploy(&hc, &st->d);
    if (a->port >= 0) hc.port = (uint16_t)a->port;
    const struct mm3_stage_config *s0 = mm3_deploy_stage(&st->d, 0);
    int cap = (int)(s0->max_tokens - MM3_DEPLOY_EXTRA_AR_STEPS);
    if (cap > GENERATE_MAX_FRAMES) cap = GENERATE_MAX_FRAMES;
    hc.limits.frame_rate = fps;
    hc.limits.max_frames = cap;
    if (hc.limits.default_frames > cap) hc.limits.default_frames = cap;
    if (rc == 0) rc = api_key_from_env(&hc);
    if (rc == 0) rc = http_server_start(&st->srv, &hc, engine_api(st->eng));
    char url[160] = "";
    if (rc == 0) {
        snprintf(url, sizeof url, "http://%s:%u", hc.host, (unsigned)http_server_port(st->srv));
        rc = ready_file(url);
    }
    if (rc < 0) {
        fprintf(stderr, "mm3-stage0: %s\n", mm3_last_error());
        serve_free(st);
        free(st);
        return 1;
    }
    printf("READY stage0 %s\n", url);
    fflush(stdout);
    LOG_INFO("serving on %s (stage 1 %s)", url, engine_stage1_up(st->eng) ? "attached" : "not attached yet");
    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    LOG_INFO("signal %d: stopping: new requests get 503, songs in flight have %g s to finish", sig,
             st->d.api.drain_timeout_s);
    http_server_drain(st->srv);
    serve_free(st);
    free(st);
    LOG_INFO("stopped");
    return 0;
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
    case MODE_SERVE:
        return run_serve(&a);
    default:
        return 2;
    }
}
