/* The stage-0 AR loop for one request (one CFG pair), as a resumable step object
 * (docs/model.md §4.6), and the window plan of the hand-off to stage 1 (§6.2).
 *
 *     struct generate g;
 *     generate_begin(&g, &lm, &dd, &sampler, ids_pair, P, max_frames, 1.5f, &hooks);
 *     while (!g.done) if ((rc = generate_step(&g)) < 0) break;
 *     generate_end(&g);
 *
 * Each generate_step() is one LM step s: draw c0 (or stop) from the guided logits
 * of the current hidden pair, run the depth decoder for c1.., emit the frame
 * [LM hidden | depth hiddens] of the conditional row when s > 0 (the draw at
 * <|audio_start|> is fed back but not emitted), feed the frame embedding to both
 * rows. Frames go out through hooks.on_frame as they are produced.
 *
 * Batched (continuous batching, stage0/scheduler.c): the same step split in three so
 * that many requests share one talker_forward over a shared talker_state:
 *
 *     generate_attach(&g, &lm, &dd, &sampler, &shared, row_c, row_u, ids_pair, P, ...);
 *     each step:  b.n = 0;
 *                 generate_feed(&g, &b, budget);        // prefill chunk or 2 feedback tokens
 *                 generate_batch_forward(&lm, &shared, &b);  // one forward for everybody
 *                 generate_take(&g, &b);
 *                 if (g.phase == GENERATE_SAMPLE) generate_sample(&g);   // draws + frame
 *
 * or, for all requests whose hidden pair is ready, generate_sample_batch(gs, n):
 * one backend call for all their draws (the scheduler's step 5).
 *
 * generate_begin/step are exactly attach + feed/forward/take + sample on a private
 * 2-row state, so both paths give the same frames bit for bit.
 *
 * Every model call goes through struct talker_backend (stage0/model/talker_backend.h):
 * the *_backend variants bind a request to a backend's rows (CPU or CUDA: one AR
 * loop for both); the plain variants are the same loop over a host talker_state
 * (teacher forcing, tests) and reach the CPU functions through the same helpers. */
#ifndef MM3_STAGE0_GENERATE_H
#define MM3_STAGE0_GENERATE_H

#include <stdint.h>

#include "common/sampler.h"
#include "stage0/model/depth.h"
#include "stage0/model/talker.h"
#include "stage0/model/talker_backend.h"

#define GENERATE_MAX_FRAMES 9000 /* reference cap (6 min at 25 frames/s) */
#define GENERATE_MAX_PROMPT 5000
#define WINDOW_FRAMES 200
#define WINDOW_HOP 100

enum generate_stop { GENERATE_RUNNING = 0, GENERATE_STOP_TOKEN, GENERATE_STOP_BUDGET };

struct generate_hooks {
    void *ctx;
    /* Frame t (0-based): frame[n_codebooks * hidden], codes[n_codebooks] = c0..c{n-1}. */
    void (*on_frame)(void *ctx, int t, const float *frame, const int32_t *codes);
    /* Optional: the guided logits of every draw before the sampler (step s; j = 0:
     * c0 in compact columns, n = SAMPLER_C0_COLS; j >= 1: codebook j, n = audio vocab). */
    void (*on_draw)(void *ctx, int s, int j, const float *guided, int n);
    /* Optional: the conditional and unconditional c0 logits of step s (compact columns,
     * n = SAMPLER_C0_COLS) before guidance, just before on_draw(s, 0): the golden replay
     * measures from them how near a forced code is to the c0 rule's top-k edge. */
    void (*on_c0_logits)(void *ctx, int s, const float *cond, const float *uncond, int n);
};

/* Tokens of several requests for one talker_forward (continuous batching):
 * each request appends its tokens with generate_feed(), the caller runs
 * generate_batch_forward(), and each request takes its hiddens back with
 * generate_take(). */
struct generate_batch {
    int n, cap, hidden;
    int *row, *pos;
    float *emb, *out; /* [cap, hidden] each */
};

int generate_batch_init(struct generate_batch *b, int hidden, int cap);
void generate_batch_free(struct generate_batch *b);
int generate_batch_forward(const struct talker *lm, struct talker_state *ts, struct generate_batch *b);
/* The same forward on a backend's KV rows. */
int generate_batch_forward_backend(const struct talker_backend *be, struct generate_batch *b);

/* Where a request is between the steps of a batched loop. */
enum generate_phase {
    GENERATE_PREFILL = 0, /* prompt tokens left to feed */
    GENERATE_SAMPLE,      /* hidden pair ready: generate_sample() next */
    GENERATE_FEED,        /* feedback embedding ready: generate_feed() next */
};

struct generate {
    const struct talker *lm;
    const struct depth *dd;
    struct sampler *sp;
    struct generate_hooks hooks;
    const struct talker_backend *be; /* the model; NULL: CPU functions on ts / ds */
    struct talker_state *ts;         /* shared (attach) or &own_ts (begin); NULL with be */
    struct talker_state own_ts;
    struct depth_state ds;
    int row[2]; /* KV rows of (cond, uncond) in ts */
    float cfg_scale;
    int prompt_len, max_frames;
    int32_t *ids;  /* [2, prompt_len] copy of the prompt pair */
    int prefilled; /* prompt tokens of each row already in the cache */
    enum generate_phase phase;
    int fed_at, fed_k; /* this request's slice of the current batch: offset, tokens per row */
    int step;          /* next LM step */
    int n_frames;      /* frames emitted so far */
    int ignore_stop; /* 1: the stop column is masked before every c0 draw (runs to max_frames) */
    int min_frames;  /* the stop column is masked while fewer frames than this are emitted (vLLM's
                        min_tokens); 0 = none, at most max_frames */
    int done;
    enum generate_stop stop;
    float *hidden;  /* [2, hidden]: post-norm LM hidden of (cond, uncond) */
    float *fb;      /* [2, hidden]: feedback embedding for the next forward */
    float *frame;   /* [n_codebooks * hidden] */
    float *work;    /* scratch: logits, depth hiddens, embeddings */
    int32_t *codes; /* c0..c{n-1} drawn by the last step (also step 0's, which is not emitted) */
    int err;           /* < 0: the last sample failed with this code (done is set) */
    char err_msg[256]; /* and its message (a batch samples many requests) */
};

/* Frame budget min(int(duration_s * frame_rate), 9000); -EINVAL when duration_s <= 0
 * or shorter than one frame. */
int generate_frame_budget(double duration_s, double frame_rate, int *max_frames);

/* AR frame rate of the checkpoint: condition_encoder input_sampling_rate / input_hop_length. */
int generate_frame_rate(const char *ckpt_root, double *fps);

/* Batched use: bind a request to rows row_c / row_u of a shared talker_state
 * (whose max_ctx must hold prompt_len + max_frames). Nothing runs yet; the
 * request starts in GENERATE_PREFILL. ids_pair is copied. */
int generate_attach(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                    struct talker_state *ts, int row_c, int row_u, const int32_t *ids_pair, int prompt_len,
                    int max_frames, float cfg_scale, const struct generate_hooks *hooks);

/* The same on rows row_c / row_u of a backend's KV cache (be->max_rows, be->max_ctx);
 * the depth decoder runs on the backend's depth rows 0..1 (be->depth_rows >= 2). */
int generate_attach_backend(struct generate *g, const struct talker_backend *be, struct sampler *sp, int row_c,
                            int row_u, const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                            const struct generate_hooks *hooks);

/* Both rows of g (the conditional and the unconditional: PEFT adapts the whole
 * model) add the products of per-request adapter `adapter` of the backend's or the
 * state's set (-1: none, what attach sets) from the next forward on. Call it before
 * the first feed. */
int generate_set_lora(struct generate *g, int adapter);

/* Append this request's tokens for the next forward: in PREFILL the next
 * k = min(left, budget / 2) prompt tokens of BOTH rows (pairs stay step-locked),
 * in FEED the two feedback tokens (budget >= 2 needed). Returns the number of
 * tokens appended (0: nothing to feed now, or the budget is too small), or
 * -EINVAL for a prompt id outside the vocabulary (the request is then done). */
int generate_feed(struct generate *g, struct generate_batch *b, int budget);

/* After generate_batch_forward: take the hiddens of the slice fed last. */
void generate_take(struct generate *g, const struct generate_batch *b);

/* One LM step's draws (c0, depth codes), the frame (s > 0) and the feedback
 * embedding; phase SAMPLE -> FEED, or done. On failure g->done is set and
 * g->err / g->err_msg keep the code and message. */
int generate_sample(struct generate *g);

/* generate_sample(g[i]) for every i, with the same results (codes, frames, hooks,
 * stop, budget, feedback). Requests on a backend with sample_pairs whose sampler is
 * seeded (top_k SAMPLER_TOP_K) and that have no on_draw hook are sampled together,
 * up to depth_rows / 2 pairs per backend call (one GPU step instead of one per
 * request); the others (replay, hooks, the CPU backend) one by one. Returns 0 or
 * the first failure's code; each failed request has done set and err / err_msg. */
int generate_sample_batch(struct generate *const *g, int n);

/* Whether g can take its next step through generate_decode_batch: phase FEED on a
 * backend with sample_pairs, and what generate_sample_batch batches (seeded, top_k
 * SAMPLER_TOP_K, no on_draw hook). */
int generate_decode_ready(const struct generate *g);

/* For requests that are all generate_decode_ready on one backend: their forward
 * (generate_feed + generate_batch_forward_backend + generate_take) and their
 * generate_sample_batch in talker_backend_decode_pairs calls of up to depth_rows / 2
 * pairs, with the same results (codes, frames, hooks, stop, budget, feedback, KV
 * cache). On CUDA with graphs the hidden pairs pass from the forward to the
 * sampling step on the device. Returns 0 or the first failure's code; each failed
 * request has done set and err / err_msg (a failed forward fails all of its call);
 * -EINVAL, touching nothing, when a request is not ready. */
int generate_decode_batch(struct generate *const *g, int n);

/* Prefill both rows of ids_pair[2, P] (row 0 conditional) and get ready for step 0
 * (own 2-row state; attach + one whole-prompt feed + forward). */
int generate_begin(struct generate *g, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                   const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                   const struct generate_hooks *hooks);

/* generate_begin on a backend opened with >= 2 rows of >= prompt_len + max_frames
 * positions: rows 0 and 1 (golden replay, --frames-out on any backend). */
int generate_begin_backend(struct generate *g, const struct talker_backend *be, struct sampler *sp,
                           const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                           const struct generate_hooks *hooks);

/* One LM step (sample + forward of the feedback); emits 0 or 1 frame; sets g->done
 * and g->stop when generation ends. */
int generate_step(struct generate *g);

/* Free what begin/attach allocated (the shared state stays). */
void generate_end(struct generate *g);

/* Window plan for T frames: [0] if T <= 200 else range(0, T-100, 100). */
int window_count(int n_frames);
/* starts must hold window_count(n_frames) entries; *k = count. */
void window_starts(int n_frames, int *starts, int *k);
/* Windows whose frames all exist: with n_frames so far and the song not ended,
 * window k (start 100k) is complete once frame 100k+199 exists; once ended, all. */
int windows_ready(int n_frames, int ended);
/* Whether window k is the song's last (stage 1 crops the last one differently):
 * 1 yes, 0 no, -1 not known yet. With the song running it is known "no" once frame
 * 100k+200 exists (SGLang-Omni's one frame of look-ahead). */
int window_is_last(int k, int n_frames, int ended);

#endif
