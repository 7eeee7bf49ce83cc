/* Which hardware runs the stage-0 networks, behind one small table so that the AR
 * loop need not know: the talker forward over a KV cache of rows, the drawable
 * head, the depth decoder's steps and heads, and (CUDA) a whole sampling step of
 * many CFG pairs: draws, depth decoder and frame feedback without host round trips,
 * alone or after the pairs' forward in the same call (decode_pairs).
 *
 *     struct talker_backend b;
 *     talker_backend_open(&b, TALKER_BACKEND_CUDA, &lm, &dd, rows, ctx, depth_rows);
 *     b.forward(b.impl, n, row, pos, emb, hidden);      // as talker_forward
 *     b.head_drawable(b.impl, hidden, 2, logits);       // as talker_head_drawable
 *     b.depth_step(b.impl, 2, x, j, y);                 // as depth_step
 *     b.depth_logits(b.impl, j, y, 2, logits);          // as depth_logits
 *     if (b.sample_pairs) b.sample_pairs(b.impl, &in, &out);  // n pairs' draws at once
 *     talker_backend_decode_pairs(&b, &din, &out);      // their forward, then the draws
 *     talker_backend_close(&b);
 *
 * The backend owns its caches (talker rows x ctx, depth_rows depth rows); lm and
 * dd must outlive it (the CPU backend computes with them). The depth cache is
 * scratch for one frame (positions restart at 0 every frame), so requests whose
 * frames are drawn one after the other on one thread share depth rows 0..1, and a
 * batched step of n pairs uses rows 0..2n-1.
 *
 * The AR loop (stage0/generate.c) calls the model only through this table, so the
 * CPU and the GPU run the same loop. */
#ifndef MM3_STAGE0_TALKER_BACKEND_H
#define MM3_STAGE0_TALKER_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/deploy.h"
#include "stage0/model/depth.h"
#include "stage0/model/talker.h"
#include "stage0/model/talker_lora.h"
#include "stage0/model/talker_pairs.h"

enum talker_backend_kind { TALKER_BACKEND_CPU = 0, TALKER_BACKEND_CUDA };

struct talker_backend {
    enum talker_backend_kind kind;
    const char *name;                 /* "cpu" or "cuda" */
    enum mm3_kv_cache_dtype kv_dtype; /* what the talker's KV cache stores: BF16 or F32, never AUTO */
    const struct talker *lm;
    const struct depth *dd;
    int max_rows, max_ctx, depth_rows;
    void *impl;
    int (*forward)(void *impl, int n, const int *row, const int *pos, const float *emb, float *hidden_out);
    int (*head_drawable)(void *impl, const float *hidden, int n_rows, float *logits);
    int (*depth_step)(void *impl, int n, const float *x, int pos, float *out);
    int (*depth_logits)(void *impl, int j, const float *hidden, int n, float *logits);
    /* NULL when not offered (CPU backend, float32 embedding tables): generate.c then
     * samples request by request through the four entries above. A pair whose c0 is
     * the stop column gets codes and hiddens that the caller must ignore. */
    int (*sample_pairs)(void *impl, const struct talker_pairs_in *in, const struct talker_pairs_out *out);
    /* NULL, or forward + sample_pairs with the hidden pairs kept where they are made
     * (CUDA: no host round trip between the two graphs). May return 1 for a step it
     * does not serve (talker_backend_decode_pairs then composes the two). */
    int (*decode_pairs)(void *impl, const struct talker_decode_in *in, const struct talker_pairs_out *out);
    int (*set_lora)(void *impl, const struct talker_lora_set *set);
    int (*row_lora)(void *impl, int row, int adapter);
    void (*destroy)(void *impl);
    const struct talker_lora_set *lora; /* talker_backend_set_lora's, or NULL */
};

/* Per-request adapters (stage0/model/talker_lora.h): the set the rows may use (NULL:
 * none), loaded where the backend computes (the CUDA backend uploads the factors);
 * every row goes back to no adapter. set must outlive b. */
int talker_backend_set_lora(struct talker_backend *b, const struct talker_lora_set *set);
/* From its next forward on, row `row` adds the products of adapter `adapter` of the
 * set (-1: none). Both rows of a CFG pair take the song's adapter. -EINVAL naming
 * the row or adapter when out of range. */
int talker_backend_row_lora(const struct talker_backend *b, int row, int adapter);

/* A decode step of in->pairs.n pairs through decode_pairs where the backend serves
 * it, else forward into out->hidden and sample_pairs on that (which must exist). */
int talker_backend_decode_pairs(const struct talker_backend *b, const struct talker_decode_in *in,
                                const struct talker_pairs_out *out);

/* "cpu" / "cuda" -> kind; -EINVAL naming the accepted values otherwise. */
int talker_backend_parse(const char *name, enum talker_backend_kind *kind);

/* Whether the build has the backend and (CUDA) a GPU is present. */
int talker_backend_available(enum talker_backend_kind kind);

/* The KV element type a backend of `kind` stores when `asked` is requested
 * (the deploy key kv_cache_dtype): AUTO is bfloat16 on CUDA (the reference model
 * runs in bf16) and float32 on the CPU; the CPU backend is float32 whatever is asked. */
enum mm3_kv_cache_dtype talker_backend_kv_dtype(enum talker_backend_kind kind, enum mm3_kv_cache_dtype asked);

/* How to load the models for a backend of `kind`: the CPU computes with the
 * whole models in float32 (talker_load / depth_load); the CUDA backend uploads bf16
 * matrices straight from the checkpoint, so only the host parts are loaded
 * (talker_load_host_parts / depth_load_host_parts). On error nothing stays loaded. */
int talker_backend_load_models(enum talker_backend_kind kind, const char *ckpt_root, struct talker *lm,
                               struct depth *dd);

/* -ENODEV for CUDA in a build without CUDA or on a machine without a GPU.
 * talker_backend_open is talker_backend_open_kv with MM3_KV_CACHE_AUTO. The CPU
 * backend logs that it keeps float32 when bfloat16 is asked of it. */
int talker_backend_open(struct talker_backend *b, enum talker_backend_kind kind, const struct talker *lm,
                        const struct depth *dd, int max_rows, int max_ctx, int depth_rows);
int talker_backend_open_kv(struct talker_backend *b, enum talker_backend_kind kind, const struct talker *lm,
                           const struct depth *dd, int max_rows, int max_ctx, int depth_rows,
                           enum mm3_kv_cache_dtype kv_dtype);
void talker_backend_close(struct talker_backend *b);

/* CUDA graphs for the talker's decode batches (stage0/model/cuda/talker_cuda.h:
 * talker_cuda_graphs_enable: capture sizes in rows, eager warm-ups per size) and for
 * the batched sampling step (stage0/model/cuda/frame_cuda.h: frame_cuda_graphs_enable, one
 * graph per pair count and top_k after the same warm-ups). The CPU backend has
 * nothing to capture: 0, no effect. */
int talker_backend_graphs_enable(struct talker_backend *b, const int *sizes, int n_sizes, int warmups);

/* What a backend counted so far; all 0 where it has no graphs and never looks ahead
 * (the CPU backend). */
struct talker_backend_counts {
    int forward_graphs, sample_graphs; /* graphs captured: the forward's, the sampling step's */
    long forward_replays;              /* forwards served by a replay */
    long sample_replays;               /* sample_pairs calls served by a replay */
    long ahead_queued;                 /* decode steps queued ahead (decode_pairs with in->last) */
    long ahead_taken;                  /* ... that the next call then asked for */
};
void talker_backend_counts(const struct talker_backend *b, struct talker_backend_counts *out);

/* GPU milliseconds of the last finished replay of the forward graph and of the
 * sampling graph (CUDA events around each launch, taken only with MM3_GRAPH_TIMING=1
 * when the graphs were enabled; 0 otherwise; a step queued ahead and still running is
 * not waited for): a frame's wall time minus these is what the GPU spent idle per
 * frame (copies, syncs, host work). */
void talker_backend_replay_ms(const struct talker_backend *b, double *forward_ms, double *sample_ms);

/* What a backend of `rows` x `ctx` would allocate on its device (the CPU backend:
 * host memory, weights counted as the float32 copies it computes with). Only the
 * configs of lm and dd are read (a plan needs no weights). */
struct talker_backend_plan {
    size_t weights_bytes;             /* talker + depth decoder parameters as uploaded */
    size_t kv_bytes_per_row;          /* talker K+V for one row of ctx positions, in kv_dtype */
    enum mm3_kv_cache_dtype kv_dtype; /* BF16 or F32 (resolved, as talker_backend_kv_dtype) */
    size_t workspace_bytes;           /* activations, depth cache, staging */
    size_t adapter_bytes;             /* per-request LoRA factors (talker_lora_set_bytes) */
    size_t total_bytes;               /* weights + rows * kv_bytes_per_row + workspace + adapters */
    int rows, ctx;
};

void talker_backend_plan_compute(enum talker_backend_kind kind, const struct talker *lm, const struct depth *dd,
                                 int rows, int ctx, struct talker_backend_plan *p);
/* The same for a KV cache of `kv_dtype` (talker_backend_plan_compute: AUTO). */
void talker_backend_plan_compute_kv(enum talker_backend_kind kind, enum mm3_kv_cache_dtype kv_dtype,
                                    const struct talker *lm, const struct depth *dd, int rows, int ctx,
                                    struct talker_backend_plan *p);

/* Whether plan p fits `utilization` of a device of total_bytes (the budget
 * talker_backend_plan_check enforces, without asking a device): 1 or 0. */
int talker_backend_plan_fits(const struct talker_backend_plan *p, double utilization, size_t total_bytes);

/* Device memory of the CUDA device in use: -ENODEV without CUDA / GPU. */
int talker_backend_device_memory(size_t *free_bytes, size_t *total_bytes);

/* Check the plan against utilization x device memory; -ENOMEM with a message
 * giving every number when it does not fit. One line of the plan goes to the log. */
int talker_backend_plan_check(enum talker_backend_kind kind, const struct talker_backend_plan *p, double utilization);

#endif
