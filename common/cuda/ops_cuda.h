/* CUDA kernels of the stage-0 decode path, callable from C11.
 *
 * Only built with -DMM3_CUDA=ON|AUTO (MM3_HAVE_CUDA defined); this header itself
 * needs no CUDA header. Device pointers are plain pointers (or void *), streams
 * are `void *` (a cudaStream_t; NULL = the legacy default stream).
 *
 * Every function returns 0 or a negative errno code with a message through
 * common/error.h (-ENODEV: no usable GPU / CUDA error, -ENOMEM: allocation,
 * -EINVAL: bad arguments). Kernel launches are asynchronous: a fault inside a
 * kernel shows up at the next synchronising call (cuda_stream_sync).
 *
 * Numerics: activations are float32 in and out, weights bf16 [out, in] as on
 * disk; sums accumulate in float32. The reference each op is tested against is
 * the float32 op of the same name in common/ops.h (weights widened from bf16). */
#ifndef MM3_OPS_CUDA_H
#define MM3_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "common/attention_heads.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device and memory ---------------------------------------------------- */

/* The measuring switches of the GPU paths (MM3_PDL, MM3_GRAPH_TIMING; listed in
 * docs/operations.md): the digit when the variable is one digit ("0", "1", "2"...),
 * else `unset`; read once into *slot (a static of the caller, -1 until then) and taken
 * from there afterwards. cuda_env_switches_reset: every switch read from the environment
 * so far reads it again at its next use; for a benchmark that
 * changes the environment between runs, with no kernel queued and no graph captured
 * under the old values. */
int cuda_env_switch(int *slot, const char *name, int unset);
void cuda_env_switches_reset(void);

/* Number of CUDA devices, 0 on any error (no driver, no device, error 35 ...). */
int cuda_device_count_safe(void);
int cuda_device_set(int device);
/* SMs of the current device, 0 on any error. */
int cuda_sm_count(void);
/* Whether stage 0's kernels launch with programmatic dependent launch (pdl.cuh;
 * MM3_PDL=0 turns it off). */
int cuda_pdl_enabled(void);
/* "NVIDIA H200, 132 SMs, 60 MiB L2, 139 GiB" into buf. */
int cuda_device_describe(char *buf, size_t size);

int cuda_malloc(void **ptr, size_t bytes);
void cuda_free(void *ptr); /* NULL is fine */
int cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
int cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
/* Device-to-device, asynchronous on `stream`. */
int cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream);
int cuda_memset(void *ptr, int byte, size_t bytes);

/* Priority of every stream this process creates from now on (cuda_stream_create and stage
 * 1's own streams): level > 0 the device's greatest priority, < 0 its least, 0 CUDA's
 * default (which is the least: only a positive level lifts a stage above the other).
 * Set once at start-up, before any stream exists (deploy key stream_priority). */
void cuda_stream_priority_set(int level);
/* The cudaStreamCreateWithPriority value of that level on the current device. */
int cuda_stream_priority(void);
int cuda_stream_create(void **stream);
void cuda_stream_destroy(void *stream);
/* Waits for the stream; reports any kernel fault that happened on it. */
int cuda_stream_sync(void *stream);

int cuda_event_create(void **event);
void cuda_event_destroy(void *event);
int cuda_event_record(void *event, void *stream);
/* Waits until the work before the event's last record is done. */
int cuda_event_sync(void *event);
/* Work queued on `stream` after this call starts once the event's last record is done
 * (the host does not wait). */
int cuda_stream_wait_event(void *stream, void *event);
/* 1 when the work before the event's last record is done, 0 while it runs, <0 on an
 * error (the host does not wait). */
int cuda_event_done(void *event);
/* Milliseconds between two recorded events (waits for `stop`). */
int cuda_event_elapsed_ms(float *ms, void *start, void *stop);

/* Starts (on != 0) or stops the range a profiler started with --profile-from-start off
 * records (ncu), so that one decode step can be picked out of a long run. */
int cuda_profiler_range(int on);

/* Capture the work queued on `stream` (not NULL) into an instantiated graph; replay
 * it with cuda_graph_launch. Removes the launch gaps between small kernels. */
int cuda_graph_capture_begin(void *stream);
int cuda_graph_capture_end(void *stream, void **graph_exec);
int cuda_graph_launch(void *graph_exec, void *stream);
void cuda_graph_destroy(void *graph_exec);

/* The GPU time of graph replays, for measuring: with MM3_GRAPH_TIMING=1 when the timer
 * is made, cuda_graph_launch_timed records an event on each side of the launch and
 * cuda_graph_timer_ms reads the last such launch; otherwise the timer has no events,
 * launches plainly and reads 0. */
struct cuda_graph_timer {
    void *ev[2];
    int pending; /* a timed launch not read yet */
    float ms;    /* the last timed launch's milliseconds, once read */
};
int cuda_graph_timer_init(struct cuda_graph_timer *t);
void cuda_graph_timer_free(struct cuda_graph_timer *t); /* a zeroed timer is fine */
int cuda_graph_launch_timed(struct cuda_graph_timer *t, void *graph_exec, void *stream);
/* The last timed launch that has finished (a launch still running is read once it
 * has: the reader does not wait, and the next launch reads its predecessor first);
 * 0 before any, without events or on an error. */
float cuda_graph_timer_ms(struct cuda_graph_timer *t);

/* ---- kernels ---------------------------------------------------------------- */

/* Largest row count the weight-streaming GEMV kernels serve for any shape; the
 * tensor-core kernel serves up to CUDA_OPS_GEMV_MMA_MAX_ROWS where `in` is a multiple
 * of 32 and w and x are 16-byte aligned (cuda_ops_gemv_max_rows). Beyond, cuBLASLt
 * (x rounded to bf16). */
#define CUDA_OPS_GEMV_MAX_ROWS 16
#define CUDA_OPS_GEMV_MMA_MAX_ROWS 32

/* Rows one float32-accurate product takes at once for `in` wide rows of 16-byte
 * aligned x and w: CUDA_OPS_GEMV_MMA_MAX_ROWS where the tensor-core kernel serves
 * them, else CUDA_OPS_GEMV_MAX_ROWS (the decode layers slice their rows by it). */
int cuda_ops_gemv_max_rows(int in);

/* Tuning hook (benchmark and tests): the GEMV kernel with a chosen number of
 * output rows per warp (2, 4 or 8; cuda_ops_matmul_bf16 picks 4 up to 4 rows, else 8). */
int cuda_ops_gemv_bf16_opw(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out,
                           int outputs_per_warp, void *stream);

/* Tuning hook: the tensor-core GEMV (mma.sync, x split into bf16 hi + lo so that
 * the result keeps float32 accuracy, or rounded to bf16: cuda_ops_gemv_set_x_round);
 * n_rows 1..32, in a multiple of 32, w and x 16-byte aligned. m_tiles: 16-row weight
 * tiles per block, 2 or 4 (0: chosen per shape, and the x-staged kernel where
 * cuda_ops_gemv_set_xs says). */
int cuda_ops_gemv_bf16_mma(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out, int m_tiles,
                           void *stream);

/* Tuning hook: row counts above `rows` (2..4; 0 = the default, 2) go to the tensor-core
 * GEMV, the rest to the float32 kernel; for cuda_ops_matmul_bf16 and
 * cuda_ops_gemv_bf16_fused alike. Not for use while kernels are being queued on another
 * thread. */
int cuda_ops_gemv_set_mma_rows(int rows);
/* Tuning hook: at 1-2 rows, products of at least wide x 4096 outputs (with in % 32 == 0)
 * take the tensor-core GEMV; 0 = never, -1 = the default (6: the talker's gate|up).
 * Same threading rule. */
int cuda_ops_gemv_set_mma_wide(int wide);
/* Tuning hook: 16-row weight tiles per block of the tensor-core GEMV where its caller
 * leaves the choice (m_tiles 0): 2 or 4 for every shape, or 0 = the default (2).
 * 17-32 rows always take 2. Same threading rule. */
int cuda_ops_gemv_set_mma_tiles(int m_tiles);
/* Tuning hook: where the tensor-core GEMV keeps a warp's weights between load and
 * use: 1 = a shared-memory ring (cp.async, three k steps), 2 = registers (two steps),
 * 0 = the default (registers at 3-16 rows, the ring at 9-16 only where x is split
 * rather than rounded (cuda_ops_gemv_set_x_round)). 4 weight tiles per block always use
 * registers; 17-32 rows the ring, or registers with 2 where x is rounded (with x split
 * they spill). Same threading rule. */
int cuda_ops_gemv_set_mma_ring(int mode);
/* Tuning hook: which tensor-core GEMV serves a row count where the caller leaves the
 * weight tile count open: 1 = the x-staged kernel (gemv_xs.cu: x copied into shared
 * memory once per block, warps split the outputs) for every tensor-core row count,
 * 2 = never (gemv_mma.cu only), 0 = the default (x-staged where the outputs alone
 * nearly fill the GPU at 17-32 rows, and at 9-16 where x is split rather than rounded).
 * Same threading rule. */
int cuda_ops_gemv_set_xs(int mode);
/* Tuning hook: where the tensor-core GEMVs round float32 x to bf16 (two MMAs per
 * weight tile, the precision of the reference's bf16 activations) instead of splitting
 * it into bf16 hi + lo (four MMAs, float32 accuracy): 1 = every row count, 2 = never,
 * 0 = the default (above CUDA_OPS_GEMV_SPLIT_MAX_ROWS rows). Same threading rule. */
int cuda_ops_gemv_set_x_round(int mode);
/* Most rows of a product whose x the default keeps split (float32 accuracy): a caller
 * that wants float32 accuracy whatever the hook says about larger batches slices its
 * rows to this. */
#define CUDA_OPS_GEMV_SPLIT_MAX_ROWS 8

/* y[n, out] = x[n, in] . w[out, in]^T, w bf16 (uint16 bit patterns), x and y float32.
 * n <= 2:  float32 GEMV kernel: one pass over w with 16-byte loads serves all
 *          rows; x stays float32 (matches op_matmul on widened w up to summation order);
 *          products of >= 24576 outputs take the tensor-core kernel below instead
 *          (cuda_ops_gemv_set_mma_wide, as cuda_ops_gemv_bf16_fused).
 * n 3..32: tensor-core GEMV (cuda_ops_gemv_bf16_mma, or above 8 rows the x-staged one:
 *          cuda_ops_gemv_set_xs) when in % 32 == 0 and w, x are
 *          16-byte aligned (else the float32 kernel up to 16 rows): x split into bf16
 *          hi + lo, float32 accumulation, rel. error vs op_matmul ~3e-6; above 8 rows
 *          x rounded to bf16 instead (cuda_ops_gemv_set_x_round); deterministic.
 *          (The 2 is cuda_ops_gemv_set_mma_rows's.)
 * more:    cuBLASLt bf16 GEMM with float32 accumulate and float32 output; x is
 *          rounded to bf16 first (as the model's bf16 activations are).
 * y must not alias x. */
int cuda_ops_matmul_bf16(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out, void *stream);

/* y = x * rsqrt(mean(x^2) + eps) * w over rows of `dim` (as op_rmsnorm). y may alias x. */
int cuda_ops_rmsnorm(float *y, const float *x, const float *w, int n_rows, int dim, float eps, void *stream);

/* Fused residual add + RMSNorm: h += x_add, then y = rmsnorm(h) (as op_add then
 * op_rmsnorm). y must not alias h or x_add. */
int cuda_ops_add_rmsnorm(float *h, float *y, const float *x_add, const float *w, int n_rows, int dim, float eps,
                         void *stream);

/* What cuda_ops_qk_norm_rope does to each head: RMSNorm over head_dim with weight
 * w[head_dim] (skipped when w is NULL), then NeoX RoPE over the first rotary_dim dims
 * (even, <= head_dim; 0 = no RoPE) with position pos[row] (device int array) and
 * inv_freq[rotary_dim/2] (device, from op_rope_inv_freq). */
struct cuda_head_norm_rope {
    const float *w;
    float eps;
    int rotary_dim;
    const int *pos;
    const float *inv_freq;
};

/* In place on x[n_rows, *] (row stride `stride` floats), n_heads heads of head_dim at
 * column h*head_dim: the steps of p. Same as op_rmsnorm per head followed by op_rope.
 * Requires head_dim <= 1024. */
int cuda_ops_qk_norm_rope(float *x, int n_rows, int stride, int n_heads, int head_dim,
                          const struct cuda_head_norm_rope *p, void *stream);

/* y[i] = silu(gate[i]) * up[i] for i < n. y may alias gate or up. */
int cuda_ops_silu_mul(float *y, const float *gate, const float *up, size_t n, void *stream);

/* Fused gate/up rows gu[n_rows, 2*ffn] with gate j at column 2j and up j at 2j + 1
 * (weights packed interleaved, see cuda_ops_matmul_bf16_swiglu); y[n_rows, ffn]. */
int cuda_ops_silu_mul_interleaved(float *y, const float *gu, int n_rows, int ffn, void *stream);

/* What a fused GEMV stores: y = sum; y[n, out / 2] = silu(gate) * up over rows
 * interleaved gate j = 2j, up j = 2j + 1; y += sum (the residual add, in place). */
enum cuda_gemv_epi { CUDA_GEMV_STORE = 0, CUDA_GEMV_SWIGLU = 1, CUDA_GEMV_ADD = 2 };

/* One fused decode product: y = epi(RMSNorm(x; norm_w, eps) . w^T). */
struct cuda_gemv_fused {
    float *y;          /* [n_rows, out], [n_rows, out / 2] with CUDA_GEMV_SWIGLU; must not alias x */
    const float *x;    /* [n_rows, in] */
    const uint16_t *w; /* [out, in], bf16 bit patterns */
    int n_rows, in, out;
    enum cuda_gemv_epi epi;
    const float *norm_w; /* [in] RMSNorm weights; NULL: x as is */
    float eps;
};

/* The product g for 1..cuda_ops_gemv_max_rows(in) rows, float32-accurate like
 * cuda_ops_matmul_bf16 (same kernels): the decode layer's norm, product and SwiGLU or
 * residual add in one launch. The norm is applied as x is read (each block sums x^2 over
 * the part of the row it reads, the k-split blocks of a cluster share theirs), its scale
 * on the sums, so it rounds differently from cuda_ops_rmsnorm then the product (~1e-7
 * relative). -ENOTSUP where cuda_ops_gemv_fused_ok says no (the caller runs the unfused
 * ops); w, x, norm_w 16-byte aligned. */
int cuda_ops_gemv_bf16_fused(const struct cuda_gemv_fused *g, void *stream);
/* Whether that shape fuses: rows 1..cuda_ops_gemv_max_rows(in), in % 8 == 0 (in % 32
 * == 0 on the tensor-core kernel, beyond 2 rows by default), out even for SWIGLU, no
 * norm with ADD. At 1-2 rows products of >= 24576 outputs with in % 32 == 0 run on the
 * tensor-core kernel too (cuda_ops_gemv_set_mma_wide). */
int cuda_ops_gemv_fused_ok(int n_rows, int in, int out, enum cuda_gemv_epi epi, int norm);
/* Whether fusing the norm and the residual add into the products is faster at this
 * row count (docs/performance.md): at 1-2 rows and on the tensor-core kernel, yes; not
 * with 3-4 rows on the float32 kernel (cuda_ops_gemv_set_mma_rows 3 or 4), where every
 * block re-deriving the normed x for 4 rows makes it ALU-bound. */
int cuda_ops_gemv_fused_pays(int n_rows);

/* y[n_rows, ffn] = silu(x . Wg^T) * (x . Wu^T) with w_gu [2*ffn, in] holding the rows
 * of Wg and Wu interleaved (row 2j = gate j, row 2j + 1 = up j): for up to
 * cuda_ops_gemv_max_rows(in) rows the GEMV kernels of cuda_ops_matmul_bf16 apply
 * silu * up as they store (no gu round trip, one launch); otherwise the product goes to gu [n_rows, 2*ffn] (the
 * caller's scratch) and cuda_ops_silu_mul_interleaved follows. Same values either
 * way as cuda_ops_matmul_bf16 then the silu kernel. */
int cuda_ops_matmul_bf16_swiglu(float *y, float *gu, const float *x, const uint16_t *w_gu, int n_rows, int in, int ffn,
                                void *stream);

/* y[i] += x[i] */
int cuda_ops_add(float *y, const float *x, size_t n, void *stream);

/* ---- LoRA deltas of a batch whose rows use different adapters ------------- */

/* A batch's LoRA products y += s_k B_k (A_k x) for the targets of one linear group
 * (products sharing their input x: q/k/v, or gate/up, or one alone), each row i with
 * the adapter k = adapter[i] of the CUDA_LORA_ADAPTERS slots (-1, or a slot whose a is
 * NULL for a target: no delta there). The two halves are op_lora_down / op_lora_up of
 * common/ops.h for each row's adapter (B given transposed); t is the [n_rows][n_targets][rank_max] middle.
 * Target j's output o lands at column y_offset + o * y_step of y's row (q/k/v in one
 * fused row; gate/up interleaved). Slots, ranks and scales stay fixed while a graph
 * that captured them replays; rows pick slots through the device array. */
enum { CUDA_LORA_ADAPTERS = 8, CUDA_LORA_TARGETS = 3, CUDA_LORA_MAX_RANK = 256 };

struct cuda_lora_target {
    const float *a[CUDA_LORA_ADAPTERS]; /* [rank_k, in] per slot, device; NULL: not adapted */
    const float *bt[CUDA_LORA_ADAPTERS]; /* B transposed, [rank_k, out] (coalesced reads) */
    int out, y_offset, y_step;
};

struct cuda_lora {
    int rank[CUDA_LORA_ADAPTERS]; /* each <= rank_max */
    float scale[CUDA_LORA_ADAPTERS];
    int rank_max, n_targets, in;
    struct cuda_lora_target target[CUDA_LORA_TARGETS];
    /* per call */
    int n_rows;
    const int *adapter; /* device int[n_rows] */
    const float *x;     /* [n_rows][x_stride], the first `in` read */
    int x_stride;
    float *t; /* device [n_rows][n_targets][rank_max] */
    float *y; /* [n_rows][y_stride] */
    int y_stride;
};

/* t = A x for every row, target and rank index (t's unused entries are set to 0). */
int cuda_ops_lora_down(const struct cuda_lora *l, void *stream);
/* y += s B t for every row and target whose adapter adapts it (after cuda_ops_lora_down). */
int cuda_ops_lora_up(const struct cuda_lora *l, void *stream);

/* KV cache element types accepted by cuda_ops_attention_decode. */
enum cuda_kv_dtype { CUDA_KV_F32 = 0, CUDA_KV_BF16 = 1 };

/* A KV cache as the attention kernels read (and the fused variants write) it: element
 * (s, j, g, d) of k and v (cache row s, position j, kv head g, dim d) at
 * s*seq_stride + j*row_stride + g*head_dim + d (elements, not bytes), type dtype. */
struct cuda_kv_cache {
    void *k, *v;
    enum cuda_kv_dtype dtype;
    size_t seq_stride, row_stride;
};

/* One decode attention call: one query row per sequence over its KV cache (no mask
 * needed: the query sits after every cached position, as op_attention causal with
 * q_pos0 = kv_len - 1). */
struct cuda_attention_decode {
    float *out;      /* [n_seq][n_heads * head_dim], float32 */
    const float *q;  /* sequence s's query row at q + s * q_stride (may sit inside a fused QKV row) */
    size_t q_stride; /* floats; 0: packed rows (n_heads * head_dim, or the q|k|v width for _qkv) */
    struct cuda_kv_cache kv;
    const int *kv_len;  /* device int[n_seq], each in [0, max_kv_len]; 0 gives a zero output row */
    const int *seq_row; /* device int[n_seq]: sequence s's cache row; NULL: row s */
    int n_seq, max_kv_len;
    struct attention_heads heads;
    int chunk_positions; /* tuning only: positions per block, a multiple of 64; 0: planned */
    /* Device memory of at least cuda_ops_attention_decode_workspace_bytes() for the
     * call's n_seq and max_kv_len, or NULL for stream-ordered memory (an allocation and
     * a free that a captured graph records as nodes, which also cut the overlap of
     * pdl.cuh there). */
    void *workspace;
    size_t workspace_bytes;
};

/* Split-K: about 4 blocks per SM are planned for max_kv_len (n_split chunks per kv
 * head and sequence); each sequence cuts its own length into those n_split chunks
 * (multiples of 64 positions), so a graph planned for a long context stays parallel
 * at a short one; a combine kernel merges them (float32 log-sum-exp). With every length
 * and row in device memory one CUDA graph serves every decode step. Requires head_dim
 * 32, 64, 128 or 256, n_heads/n_kv_heads <= 8, and 16-byte aligned rows where the row
 * is >= 16 bytes per lane. */
int cuda_ops_attention_decode(const struct cuda_attention_decode *a, void *stream);
size_t cuda_ops_attention_decode_workspace_bytes(int n_seq, int n_heads, int n_kv_heads, int head_dim, int max_kv_len);
/* Tuning hook (tests): which kernel merges the decode attention's split partials: 1 =
 * the per-split one, 2 = the staged one (every split's max and sum into shared memory at
 * once), 0 = the default (staged above 4 splits). Not for use while kernels are being
 * queued on another thread. */
int cuda_ops_attention_set_combine(int mode);

/* The decode step of a layer with the q/k/v rows as the QKV product leaves them. */
struct cuda_qkv_prep {
    const float *q_norm, *k_norm; /* [head_dim] per-head RMSNorm weights; NULL: no norm */
    float eps;
    int rotary_dim;        /* NeoX RoPE over the first rotary_dim dims (even; 0: none) */
    const float *inv_freq; /* [rotary_dim / 2], device (op_rope_inv_freq) */
    const int *pos;        /* device int[n_seq]: the new token's position */
};

/* cuda_ops_attention_decode where a->q's row s (at q + s*q_stride) holds n_heads q
 * heads, then n_kv_heads k heads, then n_kv_heads v heads (the QKV product's output,
 * unmodified by the call). Inside the split-K kernel: q and k norm + RoPE at pos[s]
 * (the same steps as cuda_ops_qk_norm_rope, same bits) and the store of k and v at
 * position pos[s] of the sequence's cache row (rounded to the cache's type); then the
 * attention over [0, kv_len[s]) and the combine kernel. pos[s] must be kv_len[s] - 1
 * (the token attends to itself) or >= kv_len[s] (stored, not attended: graph
 * padding). */
int cuda_ops_attention_decode_qkv(const struct cuda_attention_decode *a, const struct cuda_qkv_prep *prep,
                                  void *stream);

#ifdef __cplusplus
}
#endif

#endif
