/* The stage-0 scheduler: continuous batching of CFG pairs over one shared
 * talker backend's KV cache (docs/model.md §4.6, the pipeline issue's "Scheduler").
 *
 * Every request owns one row pair (cond, uncond) while it runs. Each step:
 *   1. queued requests take free row pairs (in arrival order),
 *   2. requests that left (cancelled, failed elsewhere) free their pair,
 *   3. every decoding request feeds its 2 feedback tokens, then prefilling
 *      requests feed prompt chunks of both rows (the same count each, so a pair
 *      stays step-locked) within max_batched_tokens,
 *   4. ONE talker_forward runs all of it,
 *   5. every request with a fresh hidden pair samples (c0, depth codes, frame),
 *      all in one generate_sample_batch call (one GPU step for the seeded songs).
 * When every running request is decoding and batchable (no prefill, no replay or
 * hooks), 3-5 are one generate_decode_batch call instead: the forward and the
 * draws in one backend call, the hidden pairs handed over on the GPU.
 * A request never waits for another more than one step. Sampling is per request
 * and position-addressed, so a request's song does not depend on what else runs.
 *
 * Frames and life-cycle events go out through struct sched_sink (the engine
 * forwards them to stage 1). The scheduler never finishes a job itself: the sink
 * does (stage 1's DONE); it fails a job only for a stage-0 error.
 *
 * With cfg.journal_dir set, every request is journaled (docs/journal.md): opened
 * when it gets its rows, the codes of every step appended, closed when it leaves
 * (or handed to sink.on_journal when generation ends).
 *
 *     sched_create(&s, &cfg, &lm, &dd, tok, &sink);
 *     sched_start(s);                 // step-loop thread; or call sched_step() yourself
 *     sched_submit(s, job);           // from any thread
 *     sched_destroy(s);               // stops the thread, fails what is left
 */
#ifndef MM3_STAGE0_SCHEDULER_H
#define MM3_STAGE0_SCHEDULER_H

#include "stage0/model/depth.h"
#include "stage0/api/job.h"
#include "stage0/recovery/journal.h"
#include "stage0/model/talker.h"
#include "stage0/model/talker_backend.h"
#include "stage0/text/tokenizer.h"

struct sched_config {
    int max_rows;                     /* stage-0 max_num_seqs: rows of the shared KV cache (even) */
    int max_ctx;                      /* max_model_len: positions per row (prompt + frames) */
    int max_batched_tokens;           /* tokens per step (>= 2) */
    int max_queue;                    /* requests allowed to wait for a row pair */
    enum talker_backend_kind backend; /* where the talker runs (0: CPU) */
    enum mm3_kv_cache_dtype kv_dtype; /* stage-0 kv_cache_dtype (0: auto, talker_backend_kv_dtype) */
    const char *journal_dir;          /* api.journal_dir: journal every request there; NULL / "" = off;
                                         on, the backend gets one spare row (sched_spare_row) */
    const char *replay_dir;           /* api.replay_dir: where x_replay_file names may point; NULL / "" = none */
    int keep_codes;                   /* keep every song's codes and hand them to sink.on_codes (continuation) */
    /* CUDA graphs of pure-decode steps (cudagraph_mode FULL_DECODE_ONLY, enforce_eager
     * off): batch sizes in rows (ascending; copied) and eager runs per size before the
     * capture. n_capture_sizes 0: every step eager. Ignored on the CPU. */
    int n_capture_sizes;
    const int *capture_sizes;
    int graph_warmups;
    /* Per-request talker adapters (deploy lora_modules; NULL or empty: none): a job's
     * params.lora names one, which both rows of its pair apply. Must outlive the scheduler. */
    const struct talker_lora_set *lora;
};

/* Called on the step thread. Frames are raw: n_codebooks * hidden floats each. */
struct sched_sink {
    void *ctx;
    /* Optional: 0 holds admission of `job`, the head of the queue (it and the songs behind
     * it stay queued), e.g. while stage 1 holds as many songs as it accepts, or while the
     * streams admitted use stage 1's real-time capacity (stage0/admission.h). */
    int (*can_start)(void *ctx, struct mm3_job *job);
    /* Optional: while admission is held, seconds until the song at 1-based `position`
     * of the queue may start (< 0 unknown); published in the job (start_estimate_ns). */
    double (*start_estimate)(void *ctx, int position);
    /* Rows assigned. < 0 fails the job (the sink calls mm3_job_fail itself). */
    int (*on_start)(void *ctx, struct mm3_job *job);
    /* n frames of `width` floats, indices first..first+n-1 (each exactly once, in order). */
    int (*on_frames)(void *ctx, struct mm3_job *job, int first, int n, const float *frames, int width);
    /* Generation ended normally after `total` frames. */
    int (*on_end)(void *ctx, struct mm3_job *job, int total);
    /* The job left early (cancelled, or failed by anyone): tell stage 1 if needed. */
    void (*on_abort)(void *ctx, struct mm3_job *job);
    /* Optional: generation ended normally (after on_end) and the request's journal
     * writer (every step's codes) passes to the sink, which closes it once the song
     * is delivered or lost (journal_close with sched_journal_status). Without it the
     * scheduler closes the journal JOURNAL_DONE itself. Called only with a journal. */
    void (*on_journal)(void *ctx, struct mm3_job *job, struct journal *jr, enum journal_stop stop, int n_frames);
    /* Optional: after on_start, the request's journal (lent: the scheduler appends to
     * it and frees it, unless on_journal hands it over) and its prompt pair (copy it),
     * so that the sink can re-send the song's frames by teacher forcing. */
    void (*on_journal_open)(void *ctx, struct mm3_job *job, struct journal *jr, const int32_t *ids_pair,
                            int prompt_len);
    /* Optional, with cfg.keep_codes: generation ended normally; the codes of every step
     * (step 0 included, as journaled: [n_steps, n_codebooks], valid during the call), before
     * on_end. */
    void (*on_codes)(void *ctx, struct mm3_job *job, const int32_t *codes, int n_steps, int n_codebooks);
    /* Optional: called on the step thread before every step and at least every 100 ms
     * while idle (the sink's own work that must not race the steps: re-sends). */
    void (*on_tick)(void *ctx);
};

/* The journal end status of a job that left: cancelled -> JOURNAL_CANCELLED, done ->
 * JOURNAL_DONE, failed with 502/503 (stage 1 lost, shutdown) or still running ->
 * JOURNAL_INTERRUPTED (mm3-rerender can still render it), other failures -> JOURNAL_FAILED. */
enum journal_status sched_journal_status(struct mm3_job *job);

struct sched;

int sched_create(struct sched **out, const struct sched_config *cfg, const struct talker *lm, const struct depth *dd,
                 const struct tokenizer *tok, const struct sched_sink *sink);

/* Tokenize and enqueue. -EINVAL with the job's error set (400 naming the field)
 * for a bad prompt or an adapter (params.lora) that is not loaded, -EAGAIN when the queue is full, -ESHUTDOWN when
 * stopping. On success the scheduler holds its own reference. */
int sched_submit(struct sched *s, struct mm3_job *job);

/* sched_submit for a continuation: the song of codes[n_steps, n_codebooks] (its steps as
 * journaled, step 0 included) goes on in job, whose params are the song's with the
 * whole song's max_frames / min_frames. prompt_hash (journal_prompt_hash), when not 0,
 * must be that of the job's tokenized caption and lyrics (an uploaded journal: 400
 * naming continue_journal otherwise). When the job gets rows the steps are
 * teacher-forced onto them (teacher_force_fill), journaled, and their frames go to
 * sink.on_frames as frames 0..n_steps-2; then generation draws frame n_steps-1 on.
 * With the same seed the frames equal those of the whole song generated at once (the
 * draws are position-addressed; on the CPU bit for bit). 400 naming continue_from when
 * not one new frame fits max_model_len. */
int sched_submit_continue(struct sched *s, struct mm3_job *job, const int32_t *codes, int n_steps,
                          uint64_t prompt_hash);

/* Wake the loop so a cancelled job leaves at the next step boundary. */
void sched_wake(struct sched *s);

/* One step, synchronously (tests; not while the thread runs). Returns the number
 * of requests still queued or running, or < 0 on an internal error. */
int sched_step(struct sched *s);

/* The talker row no request uses (one past max_rows, there when journaling is on) and
 * the backend it belongs to, for re-sends by teacher forcing on the step thread (the
 * sink's on_tick): -1 without one. Its depth rows are the steps' scratch, free there. */
int sched_spare_row(struct sched *s, const struct talker_backend **be);

/* Rows a scheduler of cfg opens its backend with: max_rows, plus the spare row when
 * journaling (for the memory plan). */
int sched_backend_rows(const struct sched_config *cfg);

/* Wall time of the last sched_step's one forward and one batched sampling call (0 when
 * it made none): where a step's time goes, for the benchmark. */
void sched_last_step_ns(const struct sched *s, int64_t *forward_ns, int64_t *sample_ns);
/* The GPU time of the last step's forward and sampling graphs (talker_backend_replay_ms). */
void sched_last_step_gpu_ms(const struct sched *s, double *forward_ms, double *sample_ms);

/* The backend the steps run on (its statistics, for tests and the benchmark). */
const struct talker_backend *sched_backend(const struct sched *s);

/* Run sched_step on a thread until sched_destroy. */
int sched_start(struct sched *s);

/* Requests waiting for rows and rows in use (also mirrored to mm3_metrics). */
void sched_counts(struct sched *s, int *queued, int *active_rows);

/* Stop the thread; fail every queued or running job with 503 `reason`; free. */
void sched_destroy(struct sched *s, const char *reason);

#endif
