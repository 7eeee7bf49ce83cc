/* The stage-0 language model ("talker"): a Qwen3 decoder (language_model/) with a
 * KV cache, in float32 with bf16 weights widened at load (docs/model.md §4.1-4.3).
 *
 * config / weights / state: struct talker holds the config and the weights (one
 * float allocation carved into pointers, shapes checked against the config);
 * struct talker_state holds the KV cache of up to max_rows independent rows.
 *
 * talker_forward() runs a batch of tokens that may belong to different rows:
 * prefill = many tokens of one row, decode = one token for each of several rows
 * (continuous batching of CFG pairs). Rows never see each other.
 *
 * Only the drawable rows of lm_head are kept: the stop id and the 16384 semantic
 * codes, in the sampler's compact order (column 0 = stop, k = code k-1). */
#ifndef MM3_STAGE0_TALKER_H
#define MM3_STAGE0_TALKER_H

#include <stdint.h>

#include "common/weights.h"
#include "stage0/model/depth.h"

struct talker_config {
    int hidden, n_layers, n_heads, n_kv_heads, head_dim, ffn, vocab;
    float eps;
    double rope_theta;
};

struct talker_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *q_norm, *k_norm, *ffn_norm, *wg, *wu, *wd;
};

struct talker {
    struct talker_config cfg;
    float *arena;
    float *embed; /* [vocab, hidden] */
    struct talker_layer *layers;
    float *norm;
    float *head;     /* [SAMPLER_C0_COLS, hidden]: lm_head rows of the drawable ids, compact order */
    float *inv_freq; /* [head_dim / 2] */
    int host_parts_only;             /* loaded by talker_load_host_parts */
    struct weight_deferred deferred; /* the matrices it left in the checkpoint */
};

struct talker_lora_set;

struct talker_state {
    int max_rows, max_ctx;
    float *k, *v; /* [n_layers][max_rows][max_ctx][n_kv_heads * head_dim] */
    /* Per-request adapters (stage0/model/talker_lora.h): row r's tokens add the
     * low-rank products of adapter lora->a[row_lora[r]]; -1 (the default) = none. */
    const struct talker_lora_set *lora;
    int *row_lora; /* [max_rows] */
};

/* Load root/language_model. Checks vocab_size >= 151675 + 16384. */
int talker_load(struct talker *m, const char *ckpt_root);
/* Load root/language_model for the CUDA backend: only what the host reads (token
 * embeddings, norms, RoPE frequencies). The matrices (every layer's and the drawable
 * head rows) stay in the checkpoint, their pointers NULL, and the GPU upload reads
 * them as bf16 from m->deferred (shapes checked here). m must stay where it was
 * loaded. Host memory: the embedding table instead of the whole model in float32. */
int talker_load_host_parts(struct talker *m, const char *ckpt_root);
/* Whether every weight is in host memory (talker_load), as the CPU computation needs. */
int talker_has_matrices(const struct talker *m);
void talker_free(struct talker *m);

int talker_state_init(struct talker_state *s, const struct talker *m, int max_rows, int max_ctx);
void talker_state_free(struct talker_state *s);
/* The adapters rows may use (NULL: none); every row goes back to no adapter. The set
 * must outlive its use. */
void talker_state_set_lora(struct talker_state *s, const struct talker_lora_set *set);

/* n tokens; token i belongs to row[i] at position pos[i] with input embedding
 * emb[i]. Every token attends to positions 0..pos[i] of its own row (earlier ones
 * from the cache or from this batch). hidden_out[n, hidden] = post-final-norm. */
int talker_forward(const struct talker *m, struct talker_state *s, int n, const int *row, const int *pos,
                   const float *emb, float *hidden_out);

/* out[n, hidden] = embed_tokens[ids]; -EINVAL on an id outside the vocabulary. */
int talker_embed_tokens(const struct talker *m, const int32_t *ids, int n, float *out);

/* logits[n_rows, SAMPLER_C0_COLS] of the drawable ids (column 0 = stop, k = code k-1). */
void talker_head_drawable(const struct talker *m, const float *hidden, int n_rows, float *logits);

/* Frame feedback (§3.7): (E[c0 + 151675] + sum_j A[(j-1)*V + c_j]) * n_codebooks^-0.5,
 * codes[n_codebooks] = c0..c_{n-1}. -EINVAL on a code out of range. */
int talker_feedback_embedding(const struct talker *m, const struct depth *d, const int32_t *codes, float *out);

#endif
