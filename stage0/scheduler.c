#include "stage0/scheduler.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/sampler.h"
#include "common/replay_file.h"
#include "common/sampler_replay.h"
#include "stage0/generate.h"
#include "stage0/teacher_force.h"
#include "stage0/text/prompt.h"

struct sched_req {
    struct mm3_job *job;
    int32_t *ids; /* [2, P] */
    int prompt_len, max_frames;
    int lora; /* adapter of cfg.lora both rows apply, -1: none */
    struct sampler sp;
    struct sampler_replay_data forced; /* draws of a replayed request (testing aid), else empty */
    struct generate g;
    int attached;
    struct journal *jr; /* NULL: not journaled */
    int pair;           /* row pair index, -1 while queued */
    /* The codes of every step so far ([n_steps, ncb]; appended with cfg.keep_codes). A
     * continuation starts with its song's cont_steps steps, teacher-forced when it gets rows. */
    int32_t *steps;
    int n_steps, cap_steps, cont_steps;
    /* Frames emitted during the current step (at most one per sample). */
    float *out;
    int out_first, out_n;
    struct sched_req *next; /* queue link */
};

struct sched {
    struct sched_config cfg;
    const struct talker *lm;
    const struct depth *dd;
    const struct tokenizer *tok;
    struct sched_sink sink;
    struct talker_backend be; /* the KV rows of every pair and the depth rows */
    struct generate_batch batch;
    int n_pairs;
    struct sched_req **active; /* [n_pairs], step thread only */
    struct sched_req **sample; /* [n_pairs]: the requests sampled this step */
    struct generate **sample_g;

    pthread_mutex_t mu; /* guards the queue, counters and flags below */
    pthread_cond_t cond;
    struct sched_req *q_head, *q_tail;
    int n_queued, n_running; /* n_running: pairs in use */
    int stopping;
    int did_work; /* the last step admitted, forwarded or sampled something (step thread) */
    int64_t forward_ns, sample_ns; /* wall time of the last step's forward and sampling call */
    pthread_t thread;
    int thread_started;
};

enum journal_status sched_journal_status(struct mm3_job *job)
{
    if (atomic_load(&job->cancel_requested)) return JOURNAL_CANCELLED;
    switch (mm3_job_state(job)) {
    case MM3_JOB_DONE:
        return JOURNAL_DONE;
    case MM3_JOB_FAILED: {
        char msg[8];
        int code = mm3_job_error(job, msg, sizeof msg);
        return code == 502 || code == 503 ? JOURNAL_INTERRUPTED : JOURNAL_FAILED;
    }
    default:
        return JOURNAL_INTERRUPTED;
    }
}

static enum journal_stop journal_stop_of(const struct generate *g)
{
    if (!g->done) return JOURNAL_STOP_NONE;
    return g->stop == GENERATE_STOP_TOKEN    ? JOURNAL_STOP_TOKEN
           : g->stop == GENERATE_STOP_BUDGET ? JOURNAL_STOP_BUDGET
                                             : JOURNAL_STOP_NONE;
}

static void req_free(struct sched_req *r)
{
    if (!r) return;
    if (r->jr) journal_close(r->jr, sched_journal_status(r->job), journal_stop_of(&r->g), r->g.n_frames);
    if (r->attached) generate_end(&r->g);
    if (r->job) mm3_job_unref(r->job);
    sampler_replay_free(&r->forced);
    free(r->steps);
    free(r->ids);
    free(r->out);
    free(r);
}

int sched_create(struct sched **out, const struct sched_config *cfg, const struct talker *lm, const struct depth *dd,
                 const struct tokenizer *tok, const struct sched_sink *sink)
{
    *out = NULL;
    if (cfg->max_rows < 2 || cfg->max_rows % 2)
        return mm3_errorf(-EINVAL, "stage 0 max_num_seqs %d: expected an even number >= 2 (one row pair per song)",
                          cfg->max_rows);
    if (cfg->max_batched_tokens < 2)
        return mm3_errorf(-EINVAL, "stage 0 max_num_batched_tokens %d: expected >= 2", cfg->max_batched_tokens);
    if (cfg->max_ctx < 2 || cfg->max_queue < 0)
        return mm3_errorf(-EINVAL, "stage 0 max_model_len %d / max_queue_depth %d out of range", cfg->max_ctx,
                          cfg->max_queue);
    struct sched *s = calloc(1, sizeof *s);
    if (!s) return mm3_errorf(-ENOMEM, "scheduler: out of memory");
    s->cfg = *cfg;
    s->lm = lm;
    s->dd = dd;
    s->tok = tok;
    s->sink = *sink;
    s->n_pairs = cfg->max_rows / 2;
    /* One decode token per row always fits, whatever max_batched_tokens says. */
    int cap = cfg->max_batched_tokens > cfg->max_rows ? cfg->max_batched_tokens : cfg->max_rows;
    int rc;
    s->active = calloc((size_t)s->n_pairs, sizeof *s->active);
    s->sample = calloc((size_t)s->n_pairs, sizeof *s->sample);
    s->sample_g = calloc((size_t)s->n_pairs, sizeof *s->sample_g);
    if (!s->active || !s->sample || !s->sample_g) {
        free(s->active), free(s->sample), free(s->sample_g);
        free(s);
        return mm3_errorf(-ENOMEM, "scheduler: out of memory");
    }
    /* Depth rows for every pair: the batched sampling step runs them all at once. */
    if ((rc = talker_backend_open_kv(&s->be, cfg->backend, lm, dd, sched_backend_rows(cfg), cfg->max_ctx, cfg->max_rows,
                                     cfg->kv_dtype)) < 0)
        goto fail;
    if ((rc = talker_backend_set_lora(&s->be, cfg->lora)) < 0) goto fail;
    if (cfg->n_capture_sizes > 0 &&
        (rc = talker_backend_graphs_enable(&s->be, cfg->capture_sizes, cfg->n_capture_sizes, cfg->graph_warmups)) < 0)
        goto fail;
    if ((rc = generate_batch_init(&s->batch, lm->cfg.hidden, cap)) < 0) goto fail;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    *out = s;
    return 0;
fail:
    talker_backend_close(&s->be);
    free(s->active), free(s->sample), free(s->sample_g);
    free(s);
    return rc;
}

/* -EAGAIN when the queue is full, -ESHUTDOWN when stopping, else 0; s->mu held. */
static int admission_locked(const struct sched *s)
{
    if (s->stopping) return -ESHUTDOWN;
    if (s->n_queued + s->n_running >= s->n_pairs + s->cfg.max_queue) return -EAGAIN;
    return 0;
}

/* Append n steps' codes to r->steps. */
static int steps_append(struct sched_req *r, const int32_t *codes, int n, int ncb)
{
    if (r->n_steps + n > r->cap_steps) {
        int cap = r->cap_steps ? 2 * r->cap_steps : 256;
        while (cap < r->n_steps + n)
            cap *= 2;
        int32_t *v = realloc(r->steps, sizeof(int32_t) * (size_t)cap * ncb);
        if (!v) return mm3_errorf(-ENOMEM, "scheduler: out of memory for the codes of %d steps", cap);
        r->steps = v;
        r->cap_steps = cap;
    }
    memcpy(r->steps + (size_t)r->n_steps * ncb, codes, sizeof(int32_t) * (size_t)n * ncb);
    r->n_steps += n;
    return 0;
}

static int submit(struct sched *s, struct mm3_job *job, const int32_t *cont_codes, int cont_steps,
                  uint64_t prompt_hash);

int sched_submit(struct sched *s, struct mm3_job *job)
{
    return submit(s, job, NULL, 0, 0);
}

int sched_submit_continue(struct sched *s, struct mm3_job *job, const int32_t *codes, int n_steps,
                          uint64_t prompt_hash)
{
    if (n_steps < 1 || !codes) {
        mm3_job_set_error_param(job, 400, "continue_from", "continue_from: the song has no journaled step");
        return mm3_errorf(-EINVAL, "scheduler: a continuation needs the codes of at least one step");
    }
    return submit(s, job, codes, n_steps, prompt_hash);
}

static int submit(struct sched *s, struct mm3_job *job, const int32_t *cont_codes, int cont_steps,
                  uint64_t prompt_hash)
{
    /* the cheap refusals first: a full queue does not tokenize anything */
    pthread_mutex_lock(&s->mu);
    int rc = admission_locked(s);
    pthread_mutex_unlock(&s->mu);
    if (rc < 0) return rc == -EAGAIN ? rc : mm3_errorf(rc, "scheduler: shutting down");
    struct sched_req *r = calloc(1, sizeof *r);
    if (!r) return mm3_errorf(-ENOMEM, "scheduler: out of memory");
    r->pair = -1;
    r->lora = job->params.lora[0] ? talker_lora_set_find(s->cfg.lora, job->params.lora) : -1;
    if (job->params.lora[0] && r->lora < 0) {
        /* a continued journal's adapter, or one a replica of other lora_modules took */
        const char *field = job->params.journal ? "continue_journal" : "lora";
        mm3_job_set_error_param(job, 400, field,
                                "%s: the song's adapter '%s' is not loaded here (GET /v1/models lists "
                                "the adapters)",
                                field, job->params.lora);
        free(r);
        return -EINVAL;
    }
    int n = 0;
    rc = prompt_encode_pair(s->tok, job->params.caption, job->params.lyrics, &r->ids, &n);
    if (rc < 0) {
        /* prompt.h names caption/lyrics itself, except for the token cap. */
        if (rc == -E2BIG)
            mm3_job_set_error_kind(job, MM3_FAIL_BAD_REQUEST, "caption + lyrics: %s", mm3_last_error());
        else
            mm3_job_set_error_kind(job, MM3_FAIL_BAD_REQUEST, "%s", mm3_last_error());
        free(r);
        return -EINVAL;
    }
    r->prompt_len = n;
    if (prompt_hash && journal_prompt_hash(r->ids, n) != prompt_hash) {
        mm3_job_set_error_param(job, 400, "continue_journal",
                                "continue_journal: the journal was written for another prompt than this server makes "
                                "of its caption and lyrics (another tokenizer or checkpoint)");
        free(r->ids);
        free(r);
        return -EINVAL;
    }
    atomic_store(&job->prompt_tokens, n); /* usage of the SSE done event */
    r->max_frames = job->params.max_frames;
    /* max_model_len bounds prompt + frames; a long prompt shortens the song. */
    if (r->max_frames > s->cfg.max_ctx - n) r->max_frames = s->cfg.max_ctx - n;
    if (cont_steps > 0 && r->max_frames < cont_steps) { /* not one new frame fits */
        const char *field = job->params.journal ? "continue_journal" : "continue_from";
        mm3_job_set_error_param(job, 400, field,
                                "%s: the song's prompt of %d tokens and %d frames leave no room for a new frame within "
                                "max_model_len %d",
                                field, n, cont_steps - 1, s->cfg.max_ctx);
        free(r->ids);
        free(r);
        return -EINVAL;
    }
    if (cont_steps > 0) {
        if (steps_append(r, cont_codes, cont_steps, s->dd->cfg.n_codebooks) < 0) {
            free(r->ids);
            free(r);
            return -ENOMEM;
        }
        r->cont_steps = cont_steps;
    }
    if (r->max_frames < 1) {
        mm3_job_set_error_kind(job, MM3_FAIL_BAD_REQUEST,
                          "caption + lyrics: the prompt of %d tokens leaves no room for audio within max_model_len %d",
                          n, s->cfg.max_ctx);
        free(r->ids);
        free(r);
        return -EINVAL;
    }
    pthread_mutex_lock(&s->mu);
    rc = admission_locked(s); /* again: others came in while this one was tokenized */
    if (rc < 0) {
        pthread_mutex_unlock(&s->mu);
        free(r->steps);
        free(r->ids);
        free(r);
        return rc == -EAGAIN ? rc : mm3_errorf(rc, "scheduler: shutting down");
    }
    mm3_job_ref(job);
    r->job = job;
    if (s->q_tail)
        s->q_tail->next = r;
    else
        s->q_head = r;
    s->q_tail = r;
    s->n_queued++;
    metrics_gauge_set(&mm3_metrics.queue_depth, s->n_queued);
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void sched_wake(struct sched *s)
{
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

int sched_backend_rows(const struct sched_config *cfg)
{
    return cfg->max_rows + (cfg->journal_dir && cfg->journal_dir[0] ? 1 : 0);
}

int sched_spare_row(struct sched *s, const struct talker_backend **be)
{
    *be = &s->be;
    return s->be.max_rows > s->cfg.max_rows ? s->cfg.max_rows : -1;
}

void sched_last_step_ns(const struct sched *s, int64_t *forward_ns, int64_t *sample_ns)
{
    *forward_ns = s->forward_ns;
    *sample_ns = s->sample_ns;
}

void sched_last_step_gpu_ms(const struct sched *s, double *forward_ms, double *sample_ms)
{
    talker_backend_replay_ms(&s->be, forward_ms, sample_ms);
}

const struct talker_backend *sched_backend(const struct sched *s)
{
    return &s->be;
}

void sched_counts(struct sched *s, int *queued, int *active_rows)
{
    pthread_mutex_lock(&s->mu);
    *queued = s->n_queued;
    *active_rows = 2 * s->n_running;
    pthread_mutex_unlock(&s->mu);
}

static void on_frame(void *ctx, int t, const float *frame, const int32_t *codes)
{
    (void)codes;
    struct sched_req *r = ctx;
    int width = r->g.dd->cfg.n_codebooks * r->g.lm->cfg.hidden;
    if (r->out_n == 0) r->out_first = t;
    memcpy(r->out + (size_t)r->out_n * width, frame, sizeof(float) * width);
    r->out_n++;
}

/* Give a pair back; called on the step thread only. */
static void release(struct sched *s, struct sched_req *r)
{
    s->active[r->pair] = NULL;
    pthread_mutex_lock(&s->mu);
    s->n_running--;
    metrics_gauge_set(&mm3_metrics.active_rows, 2 * s->n_running);
    pthread_mutex_unlock(&s->mu);
    req_free(r);
}

static void leave_early(struct sched *s, struct sched_req *r)
{
    if (s->sink.on_abort) s->sink.on_abort(s->sink.ctx, r->job);
    release(s, r);
}

/* A continuation's earlier frames, recomputed while its rows fill, go out as the song's
 * first frames (stage 1 renders the whole song: its windows chain from the start). */
struct continue_emit {
    struct sched *s;
    struct sched_req *r;
};

static int continue_emit_frames(void *ctx, int t0, const float *frames, int n)
{
    struct continue_emit *c = ctx;
    struct sched *s = c->s;
    struct sched_req *r = c->r;
    mm3_job_progress_add(r->job, n, 0);
    if (!s->sink.on_frames) return 0;
    int width = s->dd->cfg.n_codebooks * s->lm->cfg.hidden;
    return s->sink.on_frames(s->sink.ctx, r->job, t0, n, frames, width) < 0 ? 1 : 0; /* 1: the sink failed it */
}

/* Teacher-force a continuation's earlier steps onto its rows (one prefill-sized pass on
 * the step thread), journal them and send their frames; the seeded sampler then draws
 * the new frames as the uninterrupted song would. < 0: the job failed (the caller
 * releases its rows). */
static int continue_song(struct sched *s, struct sched_req *r)
{
    struct continue_emit c = {s, r};
    struct teacher_force_sink sink = {&c, continue_emit_frames};
    int rc = teacher_force_fill(&r->g, r->steps, r->cont_steps, &sink);
    if (rc > 0) return -1; /* the sink failed the job */
    if (rc < 0) {
        mm3_job_fail_kind(r->job, MM3_FAIL_INTERNAL, "stage 0: continuing the song: %s", mm3_last_error());
        return rc;
    }
    if (r->jr) journal_append_codes(r->jr, r->steps, r->cont_steps);
    LOG_INFO("job %llu: the continued song's %d frames teacher-forced and sent; drawing from frame %d on",
             (unsigned long long)r->job->id, r->cont_steps - 1, r->cont_steps - 1);
    return 0;
}

/* The queue's places (and, while admission is held, start estimates) into its jobs, for
 * the progress endpoint. Only this thread removes from the queue, so the nodes from the
 * head to the tail seen under the lock stay while it walks them without it. */
static void queue_publish(struct sched *s, int held)
{
    pthread_mutex_lock(&s->mu);
    struct sched_req *r = s->q_head, *tail = s->q_tail;
    pthread_mutex_unlock(&s->mu);
    int64_t now = mm3_job_now_ns();
    for (int k = 1; r; k++, r = r == tail ? NULL : r->next) {
        atomic_store(&r->job->queue_position, k);
        double est = held && s->sink.start_estimate ? s->sink.start_estimate(s->sink.ctx, k) : -1;
        atomic_store(&r->job->start_estimate_ns, est >= 0 ? now + (int64_t)(est * 1e9) : 0);
    }
}

/* Move queued requests onto free pairs. */
static void admit(struct sched *s)
{
    int held = 0;
    for (int p = 0; p < s->n_pairs; p++) {
        if (s->active[p]) continue;
        pthread_mutex_lock(&s->mu);
        struct sched_req *head = s->q_head;
        pthread_mutex_unlock(&s->mu);
        if (!head) break;
        if (s->sink.can_start && !s->sink.can_start(s->sink.ctx, head->job)) {
            held = 1;
            break;
        }
        pthread_mutex_lock(&s->mu);
        struct sched_req *r = s->q_head;
        if (r) {
            s->q_head = r->next;
            if (!s->q_head) s->q_tail = NULL;
            s->n_queued--;
            s->n_running++;
            metrics_gauge_set(&mm3_metrics.queue_depth, s->n_queued);
            metrics_gauge_set(&mm3_metrics.active_rows, 2 * s->n_running);
        }
        pthread_mutex_unlock(&s->mu);
        if (!r) break;
        atomic_store(&r->job->queue_position, 0);
        atomic_store(&r->job->start_estimate_ns, 0);
        s->did_work = 1;
        r->next = NULL;
        r->pair = p;
        s->active[p] = r;
        if (atomic_load(&r->job->cancel_requested) || mm3_job_is_terminal(r->job)) {
            release(s, r); /* gone before it started: nothing was sent */
            continue;
        }
        int width = s->dd->cfg.n_codebooks * s->lm->cfg.hidden;
        struct generate_hooks hooks = {.ctx = r, .on_frame = on_frame};
        int rc = 0;
        if (r->job->params.replay_file) {
            struct st_file f;
            rc = replay_file_open_st(&f, s->cfg.replay_dir, r->job->params.replay_file);
            if (rc == 0) {
                rc = sampler_replay_load_file(&r->forced, &f);
                st_file_close(&f);
            }
            if (rc == 0)
                sampler_init_replay(&r->sp, r->forced.lm_ids, r->forced.n_lm, r->forced.depth_codes, r->forced.n_depth,
                                    s->dd->cfg.n_codebooks);
        } else {
            sampler_init_seeded(&r->sp, r->job->params.seed);
        }
        if (rc == 0 && !(r->out = malloc(sizeof(float) * width))) rc = mm3_errorf(-ENOMEM, "scheduler: out of memory");
        if (rc == 0)
            rc = generate_attach_backend(&r->g, &s->be, &r->sp, 2 * p, 2 * p + 1, r->ids, r->prompt_len, r->max_frames,
                                         r->job->params.cfg_scale, &hooks);
        if (rc == 0 && r->lora >= 0 && (rc = generate_set_lora(&r->g, r->lora)) < 0) generate_end(&r->g);
        if (rc < 0) {
            mm3_job_fail_kind(r->job, MM3_FAIL_INTERNAL, "stage 0: %s", mm3_last_error());
            release(s, r);
            continue;
        }
        r->g.ignore_stop = r->job->params.ignore_eos;
        /* a long prompt may have shortened the song below its asked minimum */
        r->g.min_frames = r->job->params.min_frames < r->max_frames ? r->job->params.min_frames : r->max_frames;
        r->attached = 1;
        if (s->cfg.journal_dir && s->cfg.journal_dir[0]) {
            char id[JOURNAL_ID_MAX];
            journal_make_id(id, r->job->id);
            if (journal_open_write(&r->jr, s->cfg.journal_dir, id, &r->job->params, s->dd->cfg.n_codebooks,
                                   s->dd->cfg.audio_vocab, r->ids, r->prompt_len) < 0) {
                LOG_WARN("job %llu: no journal: %s", (unsigned long long)r->job->id, mm3_last_error());
                r->jr = NULL;
            }
        }
        mm3_job_set_running(r->job);
        mm3_job_set_frames_total(r->job, r->max_frames);
        if (s->sink.on_start && s->sink.on_start(s->sink.ctx, r->job) < 0) {
            release(s, r); /* the sink failed the job and told nobody else */
            continue;
        }
        if (r->jr && s->sink.on_journal_open)
            s->sink.on_journal_open(s->sink.ctx, r->job, r->jr, r->ids, r->prompt_len);
        if (r->cont_steps > 0 && continue_song(s, r) < 0) leave_early(s, r);
    }
    queue_publish(s, held);
}

/* Steady state: when every running song is fed and batchable, their forward and
 * their draws in one backend call (CUDA: no host round trip between the two), into
 * s->sample; 0 when some song needs the general path (a prefill, a replay, hooks). */
static int decode_steady(struct sched *s)
{
    int n = 0;
    for (int p = 0; p < s->n_pairs; p++) {
        struct sched_req *r = s->active[p];
        if (!r) continue;
        if (!generate_decode_ready(&r->g)) return 0;
        s->sample[n] = r;
        s->sample_g[n++] = &r->g;
    }
    if (n == 0) return 0;
    s->did_work = 1;
    for (int i = 0; i < n; i++)
        s->sample[i]->out_n = 0;
    int64_t t0 = mm3_job_now_ns();
    generate_decode_batch(s->sample_g, n); /* failures are per request (g.err), handled by the caller */
    s->forward_ns = mm3_job_now_ns() - t0;
    s->sample_ns = 0;
    return n;
}

/* The general step: decode tokens and prefill chunks in one forward, then every
 * request with a fresh hidden pair samples, into s->sample. Negative: the forward
 * failed (everybody fed has failed). */
static int step_general(struct sched *s)
{
    struct generate_batch *b = &s->batch;
    b->n = 0;
    /* Decode tokens first: a running song never waits for a prefill. */
    for (int p = 0; p < s->n_pairs; p++)
        if (s->active[p] && s->active[p]->g.phase == GENERATE_FEED) generate_feed(&s->active[p]->g, b, b->cap - b->n);
    int budget = s->cfg.max_batched_tokens;
    for (int p = 0; p < s->n_pairs; p++) {
        struct sched_req *r = s->active[p];
        if (!r || r->g.phase != GENERATE_PREFILL) continue;
        int left = budget - b->n;
        if (left < 2) break;
        if (generate_feed(&r->g, b, left) < 0) {
            mm3_job_fail_kind(r->job, MM3_FAIL_BAD_REQUEST, "prompt: %s", mm3_last_error());
            leave_early(s, r);
        }
    }
    if (b->n > 0) {
        s->did_work = 1;
        int64_t t0 = mm3_job_now_ns();
        int rc = generate_batch_forward_backend(&s->be, b);
        s->forward_ns = mm3_job_now_ns() - t0;
        if (rc < 0) {
            /* A forward error is not any one request's fault: fail everybody fed. */
            for (int p = 0; p < s->n_pairs; p++) {
                struct sched_req *r = s->active[p];
                if (!r || r->g.fed_k == 0) continue;
                mm3_job_fail_kind(r->job, MM3_FAIL_INTERNAL, "stage 0: %s", mm3_last_error());
                leave_early(s, r);
            }
            return rc;
        }
        for (int p = 0; p < s->n_pairs; p++)
            if (s->active[p]) generate_take(&s->active[p]->g, b);
    }
    /* Every request with a fresh hidden pair samples, in one batched call (one GPU
     * step for all seeded songs); then each one's frames and life cycle. */
    int n_sample = 0;
    for (int p = 0; p < s->n_pairs; p++) {
        struct sched_req *r = s->active[p];
        if (!r || r->g.phase != GENERATE_SAMPLE) continue;
        r->out_n = 0;
        s->sample[n_sample] = r;
        s->sample_g[n_sample++] = &r->g;
    }
    if (n_sample > 0) {
        s->did_work = 1;
        int64_t t0 = mm3_job_now_ns();
        generate_sample_batch(s->sample_g, n_sample);
        s->sample_ns = mm3_job_now_ns() - t0;
    }
    return n_sample;
}

int sched_step(struct sched *s)
{
    s->did_work = 0;
    admit(s);
    for (int p = 0; p < s->n_pairs; p++) {
        struct sched_req *r = s->active[p];
        if (r && (atomic_load(&r->job->cancel_requested) || mm3_job_is_terminal(r->job))) leave_early(s, r);
    }
    s->forward_ns = s->sample_ns = 0;
    int n_sample = decode_steady(s);
    if (n_sample == 0 && (n_sample = step_general(s)) < 0) return n_sample;
    for (int i = 0; i < n_sample; i++) {
        struct sched_req *r = s->sample[i];
        if (r->g.err < 0) {
            mm3_job_fail_kind(r->job, MM3_FAIL_INTERNAL, "stage 0: %s", r->g.err_msg);
            leave_early(s, r);
            continue;
        }
        /* Every step that drew codes, step 0 and the budget-ending one included. */
        int drew = !(r->g.done && r->g.stop == GENERATE_STOP_TOKEN);
        if (r->jr && drew) journal_append_codes(r->jr, r->g.codes, 1);
        if (s->cfg.keep_codes && drew &&
            steps_append(r, r->g.codes, 1, s->dd->cfg.n_codebooks) < 0) {
            mm3_job_fail_kind(r->job, MM3_FAIL_INTERNAL, "stage 0: %s", mm3_last_error());
            leave_early(s, r);
            continue;
        }
        int width = s->dd->cfg.n_codebooks * s->lm->cfg.hidden;
        if (r->out_n > 0) {
            mm3_job_progress_add(r->job, r->out_n, 0);
            if (s->sink.on_frames &&
                s->sink.on_frames(s->sink.ctx, r->job, r->out_first, r->out_n, r->out, width) < 0) {
                leave_early(s, r);
                continue;
            }
        }
        if (r->g.done) {
            mm3_job_set_frames_total(r->job, r->g.n_frames);
            /* before on_end: stage 1's DONE may come back before on_end returns */
            if (s->cfg.keep_codes && s->sink.on_codes)
                s->sink.on_codes(s->sink.ctx, r->job, r->steps, r->n_steps, s->dd->cfg.n_codebooks);
            if (s->sink.on_end && s->sink.on_end(s->sink.ctx, r->job, r->g.n_frames) < 0) {
                leave_early(s, r);
                continue;
            }
            if (r->jr && s->sink.on_journal) {
                s->sink.on_journal(s->sink.ctx, r->job, r->jr, journal_stop_of(&r->g), r->g.n_frames);
                r->jr = NULL;
            } else if (r->jr) {
                journal_close(r->jr, JOURNAL_DONE, journal_stop_of(&r->g), r->g.n_frames);
                r->jr = NULL;
            }
            release(s, r);
        }
    }
    pthread_mutex_lock(&s->mu);
    int n = s->n_queued + s->n_running;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Timed wait on cond (mu held): a cancel of a queued job, or room in stage 1, is
 * noticed even without a wake-up. */
static void wait_ms(struct sched *s, int ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += ms * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->cond, &s->mu, &t);
}

static void *step_thread(void *arg)
{
    struct sched *s = arg;
    int idle = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (idle && !s->stopping) wait_ms(s, 10); /* queued songs held back by can_start */
        if (!s->stopping && s->n_queued == 0 && s->n_running == 0) wait_ms(s, 100);
        int stop = s->stopping, work = s->n_queued > 0 || s->n_running > 0;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        if (s->sink.on_tick) s->sink.on_tick(s->sink.ctx);
        if (!work) {
            idle = 0; /* waited 100 ms above */
            continue;
        }
        if (sched_step(s) < 0) LOG_ERROR("scheduler step: %s", mm3_last_error());
        idle = !s->did_work;
    }
    return NULL;
}

int sched_start(struct sched *s)
{
    int rc = pthread_create(&s->thread, NULL, step_thread, s);
    if (rc) return mm3_errorf(-rc, "scheduler: cannot start the step thread: %s", strerror(rc));
    s->thread_started = 1;
    return 0;
}

void sched_destroy(struct sched *s, const char *reason)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) pthread_join(s->thread, NULL);
    if (!reason) reason = "server shutting down";
    for (int p = 0; p < s->n_pairs; p++) {
        struct sched_req *r = s->active[p];
        if (!r) continue;
        mm3_job_fail_kind(r->job, MM3_FAIL_UNAVAILABLE, "%s", reason);
        leave_early(s, r);
    }
    struct sched_req *r = s->q_head;
    while (r) {
        struct sched_req *next = r->next;
        mm3_job_fail_kind(r->job, MM3_FAIL_UNAVAILABLE, "%s", reason);
        req_free(r);
        r = next;
    }
    s->q_head = s->q_tail = NULL;
    s->n_queued = 0;
    metrics_gauge_set(&mm3_metrics.queue_depth, 0);
    metrics_gauge_set(&mm3_metrics.active_rows, 0);
    generate_batch_free(&s->batch);
    talker_backend_close(&s->be);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cond);
    free(s->active), free(s->sample), free(s->sample_g);
    free(s);
}
