/* The stage-0 scheduler on the tiny-a checkpoint: requests run through one
 * batched step loop (shared KV cache, interleaved prefill and decode, chunked
 * prefill, row pairs reused, a queue) give exactly the frames of separate
 * generate_begin/step runs; the admission rules (queue bound, prompt cap,
 * cancel frees rows); the start-up memory plan. Skips (77) without the golden
 * directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sampler.h"
#ifdef MM3_HAVE_CUDA
#include "stage0/model/cuda/frame_cuda.h"
#endif
#include "stage0/generate.h"
#include "stage0/text/prompt.h"
#include "stage0/scheduler.h"
#include "stage0/text/tokenizer.h"
#include "support/test_stage0.h"
#include "support/test_support.h"

#define MAX_JOBS 8
#define MAX_T 64

/* The shared stage-0 fixture plus the tokenizer the scheduler encodes prompts with. */
struct model {
    struct test_stage0 *s0;
    struct tokenizer *tok;
};

/* Frames per job as the sink saw them. */
struct sink_log {
    int width;
    struct mm3_job *jobs[MAX_JOBS];
    float *frames[MAX_JOBS];
    int n[MAX_JOBS], ended[MAX_JOBS], started[MAX_JOBS], aborted[MAX_JOBS], order_ok[MAX_JOBS];
    int n_jobs;
    int hold;              /* can_start answers !hold */
    struct mm3_job *asked; /* the job can_start was last asked about */
    int32_t *codes[MAX_JOBS]; /* on_codes (keep_codes): every step's codes */
    int n_steps[MAX_JOBS];
};

static int slot_of(struct sink_log *l, struct mm3_job *job)
{
    for (int i = 0; i < l->n_jobs; i++)
        if (l->jobs[i] == job) return i;
    return -1;
}

static int on_start(void *ctx, struct mm3_job *job)
{
    struct sink_log *l = ctx;
    int i = slot_of(l, job);
    if (i < 0) return -1;
    l->started[i]++;
    return 0;
}

static int on_frames(void *ctx, struct mm3_job *job, int first, int n, const float *frames, int width)
{
    struct sink_log *l = ctx;
    int i = slot_of(l, job);
    if (i < 0 || width != l->width || first + n > MAX_T) return -1;
    if (first != l->n[i]) l->order_ok[i] = 0;
    memcpy(l->frames[i] + (size_t)first * width, frames, sizeof(float) * (size_t)n * width);
    l->n[i] = first + n;
    return 0;
}

static int on_end(void *ctx, struct mm3_job *job, int total)
{
    struct sink_log *l = ctx;
    int i = slot_of(l, job);
    if (i < 0 || total != l->n[i]) return -1;
    l->ended[i]++;
    mm3_job_finish(job);
    return 0;
}

static void on_codes(void *ctx, struct mm3_job *job, const int32_t *codes, int n_steps, int n_codebooks)
{
    struct sink_log *l = ctx;
    int i = slot_of(l, job);
    if (i < 0) return;
    free(l->codes[i]);
    l->codes[i] = malloc(sizeof(int32_t) * (size_t)n_steps * n_codebooks);
    memcpy(l->codes[i], codes, sizeof(int32_t) * (size_t)n_steps * n_codebooks);
    l->n_steps[i] = n_steps;
}

static int can_start(void *ctx, struct mm3_job *job)
{
    struct sink_log *l = ctx;
    l->asked = job;
    return !l->hold;
}

static double start_estimate(void *ctx, int position)
{
    (void)ctx;
    return 7.5 * position;
}

static void on_abort(void *ctx, struct mm3_job *job)
{
    struct sink_log *l = ctx;
    int i = slot_of(l, job);
    if (i >= 0) l->aborted[i]++;
}

static int teardown(void **state)
{
    struct model *m = *state;
    if (m) {
        void *s0 = m->s0;
        test_stage0_golden_teardown(&s0);
        tokenizer_free(m->tok);
        free(m);
    }
    return 0;
}

static int setup(void **state)
{
    void *s0 = NULL;
    if (test_stage0_golden_setup(&s0) < 0) return -1;
    if (!s0) return 0;
    struct model *m = calloc(1, sizeof *m);
    if (!m) {
        test_stage0_golden_teardown(&s0);
        return -1;
    }
    m->s0 = s0;
    *state = m;
    char path[1200];
    snprintf(path, sizeof path, "%s/tokenizer/tokenizer.json", m->s0->root);
    if (tokenizer_load(&m->tok, path) < 0) {
        fprintf(stderr, "load %s: %s\n", path, mm3_last_error());
        teardown(state);
        *state = NULL;
        return -1;
    }
    return 0;
}

struct request {
    const char *caption, *lyrics;
    int frames;
    uint64_t seed;
};

static const struct request k_req[] = {
    {"a bright synth pop song", "[verse]\nhello world\n[chorus]\nsing with me\n", 20, 7},
    {"slow sad piano ballad with a long caption to make the prompt longer than the others", "la la la\n", 9, 8},
    {"rock", "[intro]\n", 14, 7}, /* same seed as the first, other prompt */
    {"jazz trio", "doo be doo\nbe doo\n", 11, 1234567},
};
#define N_REQ ((int)(sizeof k_req / sizeof k_req[0]))

static struct mm3_job *make_job(const struct request *q)
{
    struct mm3_job_params p = {.lyrics = (char *)q->lyrics,
                               .caption = (char *)q->caption,
                               .max_frames = q->frames,
                               .seed = q->seed,
                               .sample_rate = 44100,
                               .num_inference_steps = 2,
                               .guidance_scale = 1.7f,
                               .cfg_scale = SAMPLER_CFG_SCALE};
    struct mm3_job *j;
    assert_int_equal(mm3_job_create(&j, &p, 2, 44100, 4), 0);
    return j;
}

/* One request on its own, through the unbatched path. */
static int run_alone(struct model *m, const struct request *q, float *frames, int *n_out)
{
    int32_t *ids;
    int P;
    if (prompt_encode_pair(m->tok, q->caption, q->lyrics, &ids, &P) < 0) return -1;
    struct sampler sp;
    sampler_init_seeded(&sp, q->seed);
    struct generate g;
    int rc = generate_begin(&g, &m->s0->lm, &m->s0->dd, &sp, ids, P, q->frames, SAMPLER_CFG_SCALE, NULL);
    free(ids);
    if (rc < 0) return rc;
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden;
    while (!g.done && rc == 0) {
        int before = g.n_frames;
        rc = generate_step(&g);
        if (g.n_frames > before) memcpy(frames + (size_t)before * width, g.frame, sizeof(float) * width);
    }
    *n_out = g.n_frames;
    generate_end(&g);
    return rc;
}

static struct sched *make_sched_cfg(struct model *m, struct sink_log *log, const struct sched_config *cfg)
{
    struct sched_sink sink = {.ctx = log,
                              .can_start = can_start,
                              .start_estimate = start_estimate,
                              .on_start = on_start,
                              .on_frames = on_frames,
                              .on_end = on_end,
                              .on_abort = on_abort,
                              .on_codes = on_codes};
    struct sched *s;
    if (sched_create(&s, cfg, &m->s0->lm, &m->s0->dd, m->tok, &sink) < 0) fail_msg("sched: %s", mm3_last_error());
    return s;
}

static struct sched *make_sched(struct model *m, struct sink_log *log, int rows, int tokens, int queue)
{
    struct sched_config cfg = {.max_rows = rows, .max_ctx = 512, .max_batched_tokens = tokens, .max_queue = queue};
    return make_sched_cfg(m, log, &cfg);
}

static void log_init(struct sink_log *l, int width)
{
    memset(l, 0, sizeof *l);
    l->width = width;
}

static void log_free(struct sink_log *l)
{
    for (int i = 0; i < l->n_jobs; i++) {
        free(l->frames[i]);
        free(l->codes[i]);
        mm3_job_unref(l->jobs[i]);
    }
}

static int log_add(struct sink_log *l, struct mm3_job *j)
{
    int i = l->n_jobs++;
    l->jobs[i] = j;
    l->frames[i] = calloc((size_t)MAX_T * l->width, sizeof(float));
    l->order_ok[i] = 1;
    return i;
}

/* 4 requests, 2 row pairs (so 2 wait and reuse freed pairs), 12 tokens per step
 * (prompts of ~30-50 tokens prefill over several steps while others decode). */
static void test_batched_equals_separate(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden;
    struct sink_log log;
    log_init(&log, width);
    struct sched *s = make_sched(m, &log, 4, 12, 8);
    for (int i = 0; i < N_REQ; i++) {
        struct mm3_job *j = make_job(&k_req[i]);
        log_add(&log, j);
        assert_int_equal(sched_submit(s, j), 0);
    }
    int queued, rows;
    sched_counts(s, &queued, &rows);
    assert_int_equal(queued, N_REQ);
    int steps = 0, left, max_rows = 0;
    while ((left = sched_step(s)) > 0 && steps < 2000) {
        steps++;
        sched_counts(s, &queued, &rows);
        if (rows > max_rows) max_rows = rows;
    }
    assert_int_equal(left, 0);
    assert_int_equal(max_rows, 4);
    float *alone = malloc(sizeof(float) * MAX_T * width);
    for (int i = 0; i < N_REQ; i++) {
        int n;
        assert_int_equal(run_alone(m, &k_req[i], alone, &n), 0);
        assert_int_equal(log.started[i], 1);
        assert_int_equal(log.ended[i], 1);
        assert_int_equal(log.aborted[i], 0);
        assert_true(log.order_ok[i]);
        assert_int_equal(log.n[i], n);
        assert_true(n > 0);
        assert_memory_equal(log.frames[i], alone, sizeof(float) * (size_t)n * width);
        assert_int_equal(mm3_job_state(log.jobs[i]), MM3_JOB_DONE);
        assert_int_equal(log.jobs[i]->frames_done, n);
    }
    /* Same seed, other prompt: another song (the seed alone does not decide it). */
    assert_true(memcmp(log.frames[0], log.frames[2], sizeof(float) * width) != 0);
    free(alone);
    sched_destroy(s, NULL);
    log_free(&log);
}

/* Run the jobs of k_req[idx[i]] with adapter names lora[i] ("" = none) on a CPU
 * scheduler serving set, 3 row pairs, to the end; frames into log. */
static void run_adapters(struct model *m, const struct talker_lora_set *set, const int *idx, const char *const *lora,
                         int n, struct sink_log *log)
{
    struct sched_config cfg = {.max_rows = 6, .max_ctx = 512, .max_batched_tokens = 24, .max_queue = 8, .lora = set};
    struct sched *s = make_sched_cfg(m, log, &cfg);
    for (int i = 0; i < n; i++) {
        struct mm3_job *j = make_job(&k_req[idx[i]]);
        snprintf(j->params.lora, sizeof j->params.lora, "%s", lora[i]);
        log_add(log, j);
        assert_int_equal(sched_submit(s, j), 0);
    }
    int steps = 0, left;
    while ((left = sched_step(s)) > 0 && steps < 2000) steps++;
    assert_int_equal(left, 0);
    sched_destroy(s, NULL);
}

/* Songs with adapter a, none and adapter b share the batch: each is bit for bit the song
 * it is alone, and the adapters make other songs than the base model. An adapter that is
 * not loaded is refused at submit with 400 naming `lora`. */
static void test_adapters_batched_equal_alone(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    char *dir = test_make_tmpdir("sched_lora");
    struct talker_lora_set set = {0};
    for (int k = 0; k < 2; k++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%c", dir, 'a' + k);
        struct ckpt_gen_lora_opts o = {.component = "language_model", .rank = 4 + 12 * k, .alpha = 16, .seed = 5 + k};
        assert_int_equal(ckpt_gen_lora_write(path, m->s0->root, &o), 0);
        assert_int_equal(talker_lora_set_add(&set, &m->s0->lm.cfg, k ? "b" : "a", path, 1.0), 0);
    }
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden;
    static const int idx[3] = {0, 0, 3};
    static const char *const lora[3] = {"a", "", "b"};
    struct sink_log mixed;
    log_init(&mixed, width);
    run_adapters(m, &set, idx, lora, 3, &mixed);
    for (int i = 0; i < 3; i++) {
        struct sink_log alone;
        log_init(&alone, width);
        run_adapters(m, &set, &idx[i], &lora[i], 1, &alone);
        assert_int_equal(mixed.ended[i], 1);
        assert_int_equal(alone.n[0], mixed.n[i]);
        assert_true(mixed.n[i] > 0);
        assert_memory_equal(alone.frames[0], mixed.frames[i], sizeof(float) * (size_t)mixed.n[i] * width);
        log_free(&alone);
    }
    /* songs 0 and 1: the same request, adapter a and none */
    assert_true(memcmp(mixed.frames[0], mixed.frames[1], sizeof(float) * width) != 0);
    log_free(&mixed);

    struct sink_log log;
    log_init(&log, width);
    struct sched_config cfg = {.max_rows = 2, .max_ctx = 512, .max_batched_tokens = 24, .max_queue = 8, .lora = &set};
    struct sched *s = make_sched_cfg(m, &log, &cfg);
    struct mm3_job *j = make_job(&k_req[0]);
    snprintf(j->params.lora, sizeof j->params.lora, "pop");
    assert_int_equal(sched_submit(s, j), -EINVAL);
    assert_int_equal(j->http_status, 400);
    assert_string_equal(j->error_param, "lora");
    mm3_job_unref(j);
    sched_destroy(s, NULL);
    log_free(&log);
    talker_lora_set_free(&set);
    test_remove_tree(dir);
    free(dir);
}

/* The 4 requests through a CUDA scheduler (eager or with graphs) to the end; the
 * steps that took the steady path (one decode_pairs call: forward time, no separate
 * sampling time) counted in *steady; job 0 cancelled after cancel_at steps (-1:
 * never); ahead: the backend's steps queued ahead and taken (NULL: not asked). */
static void run_cuda_sched(struct model *m, struct sink_log *log, int graphs, int cancel_at, int *steady, long *ahead)
{
    static const int sizes[4] = {2, 4, 8, 16};
    struct sched_config cfg = {.max_rows = 4,
                               .max_ctx = 512,
                               .max_batched_tokens = 12,
                               .max_queue = 8,
                               .backend = TALKER_BACKEND_CUDA,
                               .n_capture_sizes = graphs ? 4 : 0,
                               .capture_sizes = sizes,
                               .graph_warmups = 1};
    struct sched *s = make_sched_cfg(m, log, &cfg);
    for (int i = 0; i < N_REQ; i++) {
        log_add(log, make_job(&k_req[i]));
        assert_int_equal(sched_submit(s, log->jobs[i]), 0);
    }
    int steps = 0, left;
    *steady = 0;
    while ((left = sched_step(s)) > 0 && steps < 2000) {
        int64_t fwd, smp;
        sched_last_step_ns(s, &fwd, &smp);
        *steady += fwd > 0 && smp == 0;
        if (++steps == cancel_at) assert_true(mm3_job_cancel(log->jobs[0]));
    }
    assert_int_equal(left, 0);
    if (ahead) {
        struct talker_backend_counts counts;
        talker_backend_counts(sched_backend(s), &counts);
        ahead[0] = counts.ahead_queued;
        ahead[1] = counts.ahead_taken;
    }
    sched_destroy(s, NULL);
}

/* The scheduler's steady state on the GPU: decode steps of running songs go through
 * generate_decode_batch (with graphs: the forward replayed and the sampling step
 * after it, the hidden pairs handed over on the device; eager: composed from the two
 * calls). Both give the same songs (frames within 1e-5, counts equal), and both took
 * the steady path on most steps. */
static void test_cuda_steady_decode(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) skip();
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden;
    struct sink_log eager, graphs;
    log_init(&eager, width);
    log_init(&graphs, width);
    int steady_eager, steady_graphs;
    run_cuda_sched(m, &eager, 0, -1, &steady_eager, NULL);
    run_cuda_sched(m, &graphs, 1, -1, &steady_graphs, NULL);
    print_message("steady steps: eager %d, graphs %d\n", steady_eager, steady_graphs);
    assert_true(steady_eager > 10 && steady_graphs > 10);
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(eager.ended[i], 1);
        assert_int_equal(graphs.ended[i], 1);
        assert_int_equal(eager.n[i], graphs.n[i]);
        assert_true(eager.n[i] > 0);
        double rel = test_rel_error(graphs.frames[i], eager.frames[i], (size_t)eager.n[i] * width);
        print_message("job %d: %d frames, rel %.3g\n", i, eager.n[i], rel);
        assert_true(rel <= 1e-5);
    }
    log_free(&eager);
    log_free(&graphs);
}

#ifdef MM3_HAVE_CUDA
/* The look-ahead of the steady state (frame_cuda_decode_pairs: the next decode step
 * queued before this one's frames are handed on, taken when the next step is exactly
 * that one, dropped otherwise): the same songs bit for bit as without it
 * (frame_cuda_set_look_ahead(0)), with songs ending on their budgets, queued songs admitted in
 * between (a general step after a step queued ahead) and, in the second run, a song
 * cancelled while its next step was queued. Most steady steps were taken from the
 * look-ahead; some were dropped. */
static void test_cuda_look_ahead(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) skip();
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden;
    const int cancel_at[2] = {-1, 6};
    for (int c = 0; c < 2; c++) {
        struct sink_log on, off;
        log_init(&on, width);
        log_init(&off, width);
        int steady_on, steady_off;
        long ahead_on[2], ahead_off[2];
        run_cuda_sched(m, &on, 1, cancel_at[c], &steady_on, ahead_on);
        frame_cuda_set_look_ahead(0);
        run_cuda_sched(m, &off, 1, cancel_at[c], &steady_off, ahead_off);
        frame_cuda_set_look_ahead(1);
        print_message("cancel at %d: steady steps %d / %d; queued ahead %ld, taken %ld\n", cancel_at[c], steady_on,
                      steady_off, ahead_on[0], ahead_on[1]);
        assert_int_equal(ahead_off[0], 0);
        assert_int_equal(steady_on, steady_off);
        assert_true(ahead_on[1] > steady_on / 2);
        assert_true(ahead_on[0] > ahead_on[1]);
        for (int i = 0; i < N_REQ; i++) {
            assert_int_equal(on.ended[i], off.ended[i]);
            assert_int_equal(on.aborted[i], off.aborted[i]);
            assert_int_equal(on.n[i], off.n[i]);
            assert_memory_equal(on.frames[i], off.frames[i], sizeof(float) * (size_t)on.n[i] * width);
        }
        assert_int_equal(on.aborted[0], c == 1);
        log_free(&on);
        log_free(&off);
    }
}
#else
static void test_cuda_look_ahead(void **state)
{
    (void)state;
    skip();
}
#endif

/* A song of N frames continued (sched_submit_continue with its codes, as the engine
 * does for continue_from) to N + M frames is the song of N + M frames generated at
 * once with the same seed and minimum (the engine's N + 1): the same codes at every
 * step, the same frames (the earlier ones teacher-forced and re-sent first). On the CPU
 * bit for bit; on CUDA (when there is a GPU, with graphs) the codes are equal and the
 * frames within the backend's summation-order bound. A continuation that fits no new
 * frame, or whose uploaded journal's prompt hash differs, is refused naming its field. */
static void run_continue(struct model *m, enum talker_backend_kind backend)
{
    enum { N = 12, M = 9 };
    static const int sizes[4] = {2, 4, 8, 16};
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden, ncb = m->s0->dd.cfg.n_codebooks;
    struct sink_log log;
    log_init(&log, width);
    struct sched_config cfg = {.max_rows = 4, .max_ctx = 512, .max_batched_tokens = 12, .max_queue = 8,
                               .backend = backend, .keep_codes = 1};
    if (backend == TALKER_BACKEND_CUDA) {
        cfg.n_capture_sizes = 4;
        cfg.capture_sizes = sizes;
        cfg.graph_warmups = 1;
    }
    struct sched *s = make_sched_cfg(m, &log, &cfg);
    struct request q = k_req[0];
    q.frames = N;
    log_add(&log, make_job(&q));
    assert_int_equal(sched_submit(s, log.jobs[0]), 0);
    while (sched_step(s) > 0) {
    }
    assert_int_equal(log.n[0], N);
    assert_int_equal(log.n_steps[0], N + 1);
    /* the continuation and the longer song, side by side in one batch */
    q.frames = N + M;
    log_add(&log, make_job(&q));
    log_add(&log, make_job(&q));
    for (int i = 1; i <= 2; i++)
        log.jobs[i]->params.min_frames = N + 1;
    assert_int_equal(sched_submit_continue(s, log.jobs[1], log.codes[0], log.n_steps[0], 0), 0);
    assert_int_equal(sched_submit(s, log.jobs[2]), 0);
    while (sched_step(s) > 0) {
    }
    for (int i = 1; i <= 2; i++) {
        assert_int_equal(log.ended[i], 1);
        assert_true(log.order_ok[i]);
        assert_int_equal(log.n[i], N + M);
        assert_int_equal(log.n_steps[i], N + M + 1);
        assert_int_equal(atomic_load(&log.jobs[i]->frames_done), N + M);
    }
    assert_memory_equal(log.codes[1], log.codes[2], sizeof(int32_t) * (N + M + 1) * ncb);
    assert_memory_equal(log.codes[1], log.codes[0], sizeof(int32_t) * (N + 1) * ncb);
    if (backend == TALKER_BACKEND_CPU) {
        assert_memory_equal(log.frames[1], log.frames[2], sizeof(float) * (N + M) * width);
        assert_memory_equal(log.frames[1], log.frames[0], sizeof(float) * N * width);
    } else {
        double num = 0, den = 0;
        for (size_t k = 0; k < (size_t)(N + M) * width; k++) {
            double d = (double)log.frames[1][k] - log.frames[2][k];
            num += d * d;
            den += (double)log.frames[2][k] * log.frames[2][k];
        }
        print_message("continued vs one-shot frames on CUDA: rel %.3g\n", sqrt(num / den));
        assert_true(sqrt(num / den) < 1e-3);
    }
    /* no room for one new frame: 400 naming continue_from */
    q.frames = N;
    log_add(&log, make_job(&q));
    assert_int_equal(sched_submit_continue(s, log.jobs[3], log.codes[0], log.n_steps[0], 0), -EINVAL);
    char msg[256];
    assert_int_equal(mm3_job_error(log.jobs[3], msg, sizeof msg), 400);
    char param[32];
    mm3_job_error_param(log.jobs[3], param, sizeof param);
    assert_string_equal(param, "continue_from");
    /* an uploaded journal written for another prompt: 400 naming continue_journal */
    q.frames = N + M;
    log_add(&log, make_job(&q));
    assert_int_equal(sched_submit_continue(s, log.jobs[4], log.codes[0], log.n_steps[0], 12345), -EINVAL);
    assert_int_equal(mm3_job_error(log.jobs[4], msg, sizeof msg), 400);
    mm3_job_error_param(log.jobs[4], param, sizeof param);
    assert_string_equal(param, "continue_journal");
    assert_non_null(strstr(msg, "another prompt"));
    sched_destroy(s, NULL);
    log_free(&log);
}

static void test_continue_equals_longer(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    run_continue(m, TALKER_BACKEND_CPU);
}

static void test_cuda_continue_equals_longer(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) skip();
    run_continue(m, TALKER_BACKEND_CUDA);
}

/* The queue bound, the prompt cap naming the field, and a cancel that frees the pair. */
static void test_admission_and_cancel(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden;
    struct sink_log log;
    log_init(&log, width);
    struct sched *s = make_sched(m, &log, 2, 64, 1);
    struct request long_q = {"x", NULL, 5, 1};
    size_t big = 6000 * 6;
    char *lyrics = malloc(big + 1);
    for (size_t i = 0; i < big; i += 6)
        memcpy(lyrics + i, "hello ", 6);
    lyrics[big] = 0;
    long_q.lyrics = lyrics;
    struct mm3_job *jl = make_job(&long_q);
    assert_int_equal(sched_submit(s, jl), -EINVAL);
    char msg[512];
    assert_int_equal(mm3_job_error(jl, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "lyrics"));
    mm3_job_unref(jl);
    free(lyrics);

    struct request q = k_req[0];
    q.frames = 40;
    int a = log_add(&log, make_job(&q));
    int b = log_add(&log, make_job(&k_req[1]));
    assert_int_equal(sched_submit(s, log.jobs[a]), 0);
    assert_int_equal(sched_submit(s, log.jobs[b]), 0); /* queued: one pair, queue 1 */
    struct mm3_job *jc = make_job(&k_req[2]);
    assert_int_equal(sched_submit(s, jc), -EAGAIN);
    mm3_job_unref(jc);
    for (int i = 0; i < 8; i++)
        assert_true(sched_step(s) > 0);
    assert_true(log.n[a] > 0);
    int queued, rows;
    sched_counts(s, &queued, &rows);
    assert_int_equal(queued, 1);
    assert_int_equal(rows, 2);
    assert_true(mm3_job_cancel(log.jobs[a]));
    int steps = 0;
    while (sched_step(s) > 0 && steps < 1000)
        steps++;
    assert_int_equal(log.aborted[a], 1);
    assert_int_equal(log.ended[a], 0);
    assert_true(log.n[a] < 40);
    assert_int_equal(log.ended[b], 1); /* got the freed pair */
    assert_int_equal(log.n[b], k_req[1].frames);
    sched_counts(s, &queued, &rows);
    assert_int_equal(queued + rows, 0);
    sched_destroy(s, NULL);
    log_free(&log);
}

/* can_start holds admission of the queue's head: it and the job behind it stay queued
 * (their places and start estimates published in the jobs), then start when allowed. */
static void test_admission_held(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    struct sink_log log;
    log_init(&log, m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden);
    log.hold = 1;
    struct sched *s = make_sched(m, &log, 4, 64, 2);
    int a = log_add(&log, make_job(&k_req[1])), b = log_add(&log, make_job(&k_req[0]));
    assert_int_equal(sched_submit(s, log.jobs[a]), 0);
    assert_int_equal(sched_submit(s, log.jobs[b]), 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(sched_step(s), 2);
    int queued, rows;
    sched_counts(s, &queued, &rows);
    assert_int_equal(queued, 2);
    assert_int_equal(log.started[a], 0);
    assert_ptr_equal(log.asked, log.jobs[a]); /* asked about the head */
    assert_int_equal(atomic_load(&log.jobs[a]->queue_position), 1);
    assert_int_equal(atomic_load(&log.jobs[b]->queue_position), 2);
    int64_t now = mm3_job_now_ns(), ea = atomic_load(&log.jobs[a]->start_estimate_ns),
            eb = atomic_load(&log.jobs[b]->start_estimate_ns);
    assert_true(ea > now + 7 * 1000000000LL && ea <= now + 7500000000LL);
    assert_true(eb > now + 14 * 1000000000LL && eb <= now + 15000000000LL);
    log.hold = 0;
    int steps = 0;
    while (sched_step(s) > 0 && steps < 1000)
        steps++;
    assert_int_equal(log.started[a], 1);
    assert_int_equal(log.ended[a], 1);
    assert_int_equal(log.ended[b], 1);
    assert_int_equal(atomic_load(&log.jobs[a]->queue_position), 0);
    assert_int_equal(atomic_load(&log.jobs[b]->start_estimate_ns), 0);
    sched_destroy(s, NULL);
    log_free(&log);
}

/* Guidance off (cfg_scale 1): the song comes from the conditional row alone, so
 * another unconditional prompt changes nothing; with guidance on it does. */
static void run_pair(struct model *m, const int32_t *ids, int P, float scale, float *frames, int *n)
{
    struct sampler sp;
    sampler_init_seeded(&sp, 99);
    struct generate g;
    assert_int_equal(generate_begin(&g, &m->s0->lm, &m->s0->dd, &sp, ids, P, 12, scale, NULL), 0);
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden;
    while (!g.done) {
        int before = g.n_frames;
        assert_int_equal(generate_step(&g), 0);
        if (g.n_frames > before) memcpy(frames + (size_t)before * width, g.frame, sizeof(float) * width);
    }
    *n = g.n_frames;
    generate_end(&g);
}

static void test_guidance_off_ignores_uncond(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    int32_t *ids;
    int P;
    assert_int_equal(prompt_encode_pair(m->tok, k_req[0].caption, k_req[0].lyrics, &ids, &P), 0);
    int32_t *other = malloc(sizeof(int32_t) * 2 * P);
    memcpy(other, ids, sizeof(int32_t) * 2 * P);
    for (int i = 1; i < P - 2; i++)
        other[P + i] = ids[i]; /* uncond row := the conditional text */
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden, na, nb;
    float *a = malloc(sizeof(float) * 12 * width), *b = malloc(sizeof(float) * 12 * width);
    run_pair(m, ids, P, 1.0f, a, &na);
    run_pair(m, other, P, 1.0f, b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof(float) * (size_t)na * width);
    run_pair(m, ids, P, 3.0f, a, &na);
    run_pair(m, other, P, 3.0f, b, &nb);
    assert_true(na != nb || memcmp(a, b, sizeof(float) * (size_t)na * width) != 0);
    free(a), free(b), free(ids), free(other);
}

/* The thread drives the same loop; destroy fails what is still running. */
static void test_thread_and_shutdown(void **state)
{
    struct model *m = *state;
    if (!m) skip();
    int width = m->s0->dd.cfg.n_codebooks * m->s0->lm.cfg.hidden;
    struct sink_log log;
    log_init(&log, width);
    struct sched *s = make_sched(m, &log, 2, 64, 4);
    struct request q = k_req[0];
    q.frames = 60;
    int a = log_add(&log, make_job(&q));
    assert_int_equal(sched_submit(s, log.jobs[a]), 0);
    assert_int_equal(sched_start(s), 0);
    for (int i = 0; i < 200 && log.jobs[a]->frames_done < 2; i++) {
        struct timespec t = {0, 10 * 1000000L};
        nanosleep(&t, NULL);
    }
    sched_destroy(s, "test shutdown");
    enum mm3_job_state st = mm3_job_state(log.jobs[a]);
    assert_true(st == MM3_JOB_DONE || st == MM3_JOB_FAILED);
    if (st == MM3_JOB_FAILED) {
        char msg[256];
        assert_int_equal(mm3_job_error(log.jobs[a], msg, sizeof msg), 503);
        assert_non_null(strstr(msg, "test shutdown"));
        assert_int_equal(log.aborted[a], 1);
    }
    log_free(&log);
}

/* The start-up memory plan: the KV term is what the cache holds (K and V, float32 on
 * the CPU and bf16 on the GPU by default, every layer, n_kv_heads x head_dim per
 * position), the total adds up, the GPU's bf16 weights are half the CPU's float32
 * matrices, and a plan the device cannot hold (or a missing GPU) is refused with a
 * message instead of a crash later. */
static void test_memory_plan(void **state)
{
    struct model *m = *state;
    const struct talker_config *c = &m->s0->lm.cfg;
    struct talker_backend_plan a, b, g;
    talker_backend_plan_compute(TALKER_BACKEND_CPU, &m->s0->lm, &m->s0->dd, 8, 100, &a);
    talker_backend_plan_compute(TALKER_BACKEND_CPU, &m->s0->lm, &m->s0->dd, 8, 200, &b);
    talker_backend_plan_compute(TALKER_BACKEND_CUDA, &m->s0->lm, &m->s0->dd, 8, 100, &g);
    size_t kv = 2 * (size_t)c->n_layers * 100 * (size_t)c->n_kv_heads * c->head_dim * sizeof(float);
    assert_int_equal(a.kv_bytes_per_row, kv);
    assert_int_equal(b.kv_bytes_per_row, 2 * kv);
    assert_int_equal(a.total_bytes, a.weights_bytes + 8 * a.kv_bytes_per_row + a.workspace_bytes);
    assert_int_equal(g.kv_bytes_per_row, kv / 2); /* the GPU's cache is bf16 (kv_cache_dtype auto) */
    assert_true(g.weights_bytes < a.weights_bytes);
    assert_true(g.weights_bytes > 0 && g.workspace_bytes > 0);
    assert_int_equal(talker_backend_plan_check(TALKER_BACKEND_CPU, &a, 0.9), 0);
    if (!talker_backend_available(TALKER_BACKEND_CUDA)) {
        assert_int_equal(talker_backend_plan_check(TALKER_BACKEND_CUDA, &g, 0.9), -ENODEV);
        assert_non_null(strstr(mm3_last_error(), "not available"));
        struct sched_config cfg = {
            .max_rows = 2, .max_ctx = 64, .max_batched_tokens = 8, .max_queue = 1, .backend = TALKER_BACKEND_CUDA};
        struct sched_sink sink = {0};
        struct sched *s = NULL;
        assert_int_equal(sched_create(&s, &cfg, &m->s0->lm, &m->s0->dd, m->tok, &sink), -ENODEV);
        assert_null(s);
        return;
    }
    struct talker_backend_plan huge;
    talker_backend_plan_compute(TALKER_BACKEND_CUDA, &m->s0->lm, &m->s0->dd, 1 << 16, 1 << 16, &huge);
    assert_int_equal(talker_backend_plan_check(TALKER_BACKEND_CUDA, &huge, 0.9), -ENOMEM);
    assert_non_null(strstr(mm3_last_error(), "does not fit"));
    assert_int_equal(talker_backend_plan_check(TALKER_BACKEND_CUDA, &g, 0.9), 0);
}

int main(void)
{
    if (!test_golden_dir()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_separate), cmocka_unit_test(test_admission_and_cancel),
        cmocka_unit_test(test_adapters_batched_equal_alone),
        cmocka_unit_test(test_admission_held),          cmocka_unit_test(test_guidance_off_ignores_uncond),
        cmocka_unit_test(test_thread_and_shutdown),     cmocka_unit_test(test_memory_plan),
        cmocka_unit_test(test_cuda_steady_decode),      cmocka_unit_test(test_cuda_look_ahead),
        cmocka_unit_test(test_continue_equals_longer),  cmocka_unit_test(test_cuda_continue_equals_longer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
