/* The RVQ depth decoder (rvq_depth_decoder/): per frame it predicts the residual
 * codes c1..c{n_codebooks-1} from the LM hidden and c0 (docs/model.md §4.4).
 *
 * Float32 compute; bf16 weights widened at load into one allocation. The decoder
 * is causal, so a small per-row KV cache over the n_codebooks depth positions
 * gives exactly the reference's recompute-the-prefix result.
 *
 *     depth_state_reset(&st);
 *     depth_step(&d, &st, 2, lm_hidden, 0, h);       // position 0: P(LM hidden)
 *     depth_step(&d, &st, 2, embed(c0), 1, h);       // position 1: P(E[c0 + offset])
 *     depth_logits(&d, 1, h, 2, logits);             // head for c1 ...
 */
#ifndef MM3_STAGE0_DEPTH_H
#define MM3_STAGE0_DEPTH_H

#include <stdint.h>

#include "common/weights.h"

struct depth_config {
    int hidden, n_layers, n_heads, head_dim, ffn;
    int audio_vocab, n_codebooks, max_pos;
    float eps; /* fixed 1e-6 (not in config.json) */
};

struct depth_layer {
    float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *wg, *wu, *wd;
};

struct depth {
    struct depth_config cfg;
    float *arena;
    float *audio_emb; /* [(n_codebooks-1)*audio_vocab, hidden]; codebook j uses rows (j-1)*audio_vocab + c */
    float *proj;      /* [hidden, hidden] */
    float *pos_emb;   /* [max_pos, hidden] */
    struct depth_layer *layers;
    float *norm;
    float *heads; /* [(n_codebooks-1), audio_vocab, hidden]; head k predicts codebook k+1 */
    int host_parts_only;             /* loaded by depth_load_host_parts */
    struct weight_deferred deferred; /* the matrices it left in the checkpoint */
};

struct depth_state {
    int max_rows;
    float *k, *v; /* [n_layers][max_rows][n_codebooks][hidden] */
};

/* Load root/rvq_depth_decoder. */
int depth_load(struct depth *d, const char *ckpt_root);
/* Load root/rvq_depth_decoder for the CUDA backend: the code embeddings, position
 * embeddings and norms on the host; the projection, every layer's matrices and the
 * heads left in the checkpoint for the GPU upload (as talker_load_host_parts). */
int depth_load_host_parts(struct depth *d, const char *ckpt_root);
int depth_has_matrices(const struct depth *d);
void depth_free(struct depth *d);

int depth_state_init(struct depth_state *s, const struct depth *d, int max_rows);
void depth_state_free(struct depth_state *s);

/* One depth position for n rows (rows 0..n-1 of the state): x[n, hidden] is the
 * unprojected input (LM hidden at pos 0, code embeddings after). Positions must be
 * fed in order 0, 1, ... for each row (a new frame restarts at 0). out[n, hidden]
 * is the post-final-norm hidden at that position. */
int depth_step(const struct depth *d, struct depth_state *s, int n, const float *x, int pos, float *out);

/* Logits of codebook j (1..n_codebooks-1) for n hidden rows: logits[n, audio_vocab]. */
void depth_logits(const struct depth *d, int j, const float *hidden, int n, float *logits);

/* Row of audio_embeddings for code c of codebook j (1..n_codebooks-1); NULL if out of range. */
const float *depth_code_embedding(const struct depth *d, int j, int c);

#endif
