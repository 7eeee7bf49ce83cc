/* The stage-0 talker on the GPU (first version: correct, not yet fast).
 *
 * Built from a loaded CPU struct talker: the matrices go to the GPU as bf16 (the
 * CPU copy is the checkpoint's bf16 widened, so these are exactly the checkpoint's
 * values), norm weights and the bf16-rounded RoPE inv_freq as float32; Wq|Wk|Wv and
 * Wg|Wu are packed row-wise into one matrix each (one product instead of three and two,
 * the same dot products). The KV cache lives on the GPU as bf16 (rounded to nearest
 * even when stored, as the reference model's bf16 cache; half the bytes) or float32
 * (accuracy tests), [n_layers][max_rows][max_ctx + 1][n_kv_heads*head_dim] (the extra
 * position takes the K/V of a graph batch's padding tokens).
 *
 * talker_cuda_forward has talker_forward's contract (host arrays in and out): the
 * tokens of a batch may belong to different rows; all of a batch's K/V are stored
 * before attention, so prefill tokens see their predecessors in the same batch.
 * Matrix products of decode batches (slices of up to 32 rows, gemv_rows.h) run through the float32-input GEMV
 * kernels (rel. 1e-6 against the CPU); larger batches (prefill) through the bf16
 * cuBLASLt GEMM, which reads each weight once per batch but rounds the activations
 * to bf16 (rel. ~1e-3 against the CPU, inside the 2e-2). The drawable head
 * always takes the float32-accurate GEMV, in the same slices. Attention:
 * common/cuda's split-K decode kernel (through a row map) when the batch is one
 * token per row (decode) and the head fits it, else the simple row attention of
 * talker_kernels.h.
 *
 * Only compiled with CUDA (stage0/model/cuda/ joins mm3_stage0 when MM3_HAVE_CUDA). */
#ifndef MM3_STAGE0_CUDA_TALKER_CUDA_H
#define MM3_STAGE0_CUDA_TALKER_CUDA_H

#include "common/cuda/ops_cuda.h"
#include "stage0/model/talker.h"

struct talker_lora_set;

struct talker_cuda;

/* Upload m's weights and allocate a cache of max_rows x max_ctx with elements of
 * kv_dtype (CUDA_KV_BF16 or CUDA_KV_F32). m may be freed afterwards. -ENODEV without
 * a usable GPU. */
int talker_cuda_create(struct talker_cuda **out, const struct talker *m, int max_rows, int max_ctx,
                       enum cuda_kv_dtype kv_dtype);
void talker_cuda_destroy(struct talker_cuda *tc); /* NULL is fine */

/* As talker_forward (host emb[n, hidden] in, host hidden_out[n, hidden] out). */
int talker_cuda_forward(struct talker_cuda *tc, int n, const int *row, const int *pos, const float *emb,
                        float *hidden_out);

/* As talker_head_drawable: host hidden[n_rows, hidden] -> host logits[n_rows, SAMPLER_C0_COLS]. */
int talker_cuda_head_drawable(struct talker_cuda *tc, const float *hidden, int n_rows, float *logits);

/* The same on device arrays, queued on `stream` (cudaStream_t as void *, NULL = the
 * default stream) without a sync: capturable in a CUDA graph (the frame step). */
int talker_cuda_head_dev(struct talker_cuda *tc, const float *hidden, int n_rows, float *logits, void *stream);

/* CUDA graphs for decode batches (one token per row, at most sizes[n_sizes-1] tokens):
 * such a batch is padded to the smallest size that holds it, runs eagerly `warmups`
 * times per size, is then captured once and replayed from then on. Rows, positions,
 * kv lengths and embeddings go to fixed device buffers before every launch, and the
 * decode attention reads lengths and rows from them, so one graph serves every step.
 * sizes strictly ascending, >= 1. Other batches (prefill, mixed) stay eager. */
int talker_cuda_graphs_enable(struct talker_cuda *tc, const int *sizes, int n_sizes, int warmups);

/* Graphs captured so far and forwards served by a replay. */
void talker_cuda_graph_stats(const struct talker_cuda *tc, int *captured, long *replays);
/* GPU milliseconds of the last finished replay of a forward graph, between events
 * recorded around its launch (one still running is not waited for): only with
 * MM3_GRAPH_TIMING=1 when graphs were enabled, else 0. */
float talker_cuda_replay_ms(struct talker_cuda *tc);

/* talker_cuda_forward for a decode batch that a graph serves, without the wait and
 * the download: the uploads and the replay are queued on the graphs' stream, `done`
 * (a cuda_event_create event) is recorded after them, and *hidden_dev points at the
 * device rows [n][hidden] that hold the hiddens once `done` has completed. They stay
 * there until the next forward; the next call's staging is reused, so finish with
 * this one (wait for `done`, or for work queued after it) before calling again.
 * Returns 1, queuing nothing, where no graph serves the batch (graphs off, rows not
 * distinct, more tokens than the largest size): use talker_cuda_forward then. */
int talker_cuda_forward_queued(struct talker_cuda *tc, int n, const int *row, const int *pos, const float *emb,
                               const float **hidden_dev, void *done);

/* Adapters served per request (talker_lora.h): the set's factors go to the GPU (float32,
 * one allocation per adapter, at most CUDA_LORA_ADAPTERS of rank <= CUDA_LORA_MAX_RANK);
 * NULL or an empty set drops them. Every row goes back to no adapter. Forwards whose
 * tokens include a row with an adapter take the unfused products with the deltas
 * added (talker_cuda.c's forward_queue), decode batches through their own graphs. The
 * set may be freed afterwards. */
int talker_cuda_set_lora(struct talker_cuda *tc, const struct talker_lora_set *set);
/* Row `row` from now on uses adapter `adapter` of the set (-1: none). */
int talker_cuda_row_lora(struct talker_cuda *tc, int row, int adapter);
/* Row `row`'s adapter (-1: none, or a row outside the state). */
int talker_cuda_row_lora_of(const struct talker_cuda *tc, int row);

#endif
