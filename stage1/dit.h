/* The DiT velocity network (MiniMaxMusic3Transformer1DModel), float32 reference.
 *
 * Per sequence of L latents (docs/model.md §7):
 *   h0[j]  = [x[:, j], zeros(in_ch), cond[j]]          (2*in_ch + cond_dim channels)
 *   h1     = h0 + Wpre h0;  h = h1 proj_in^T            [L, hidden]
 *   tok 0  = time_embed(cos/sin Fourier features of t)  (RoPE position 0; latent j at j+1)
 *   blocks: X += Attn(LN1 X) with partial half-split RoPE; X += ff_out(val * silu(gate))
 *   Y = X[1:] proj_out^T;  v = Y^T + Wpost Y^T          [in_ch, L]
 *
 *     struct dit_model *m;  dit_load(&m, ckpt_root);
 *     struct dit_workspace *ws;  dit_workspace_alloc(&ws, m, max_L);
 *     dit_forward(m, ws, B, L, x, t, cond, v);
 */
#ifndef MM3_STAGE1_DIT_H
#define MM3_STAGE1_DIT_H

#include <stddef.h>

struct dit_config {
    int in_ch;       /* in_channels (128): latent channels and the zero slot */
    int cond_dim;    /* condition_dim (2048) */
    int n_layers;    /* num_layers (36) */
    int n_heads;     /* num_attention_heads (32) */
    int head_dim;    /* attention_head_dim (64) */
    int hidden;      /* n_heads * head_dim */
    int ff_inner;    /* ff_inner_dim (8192) */
    int rotary_dim;  /* rotary_dim (32): leading dims of each head that rotate */
    int fourier_dim; /* fourier_embedding_dim (256): cos half then sin half */
    int cat_dim;     /* 2*in_ch + cond_dim */
};

struct dit_layer {
    float *norm1_w, *norm1_b;   /* [hidden] */
    float *wq, *wk, *wv, *wo;   /* [hidden, hidden] */
    float *norm2_w, *norm2_b;   /* [hidden] */
    float *ff_in_w, *ff_in_b;   /* [2*ff_inner, hidden], [2*ff_inner]: value rows then gate rows */
    float *ff_out_w, *ff_out_b; /* [hidden, ff_inner], [hidden] */
};

struct dit_weights {
    float *time_proj;         /* [fourier_dim/2] */
    float *t1_w, *t1_b;       /* [hidden, fourier_dim], [hidden] */
    float *t2_w, *t2_b;       /* [hidden, hidden], [hidden] */
    float *pre_w;             /* [cat_dim, cat_dim] */
    float *proj_in;           /* [hidden, cat_dim] */
    float *proj_out;          /* [in_ch, hidden] */
    float *post_w;            /* [in_ch, in_ch] */
    struct dit_layer *layers; /* [n_layers] */
};

struct dit_model {
    struct dit_config cfg;
    struct dit_weights w;
    float *inv_freq; /* [rotary_dim/2], theta 10000 */
    float *arena;    /* every weight, one allocation */
    size_t arena_floats;
};

struct dit_workspace;

/* Load <ckpt_root>/transformer: sizes from config.json, every tensor shape checked. */
int dit_load(struct dit_model **out, const char *ckpt_root);
void dit_free(struct dit_model *m);

/* Free the float32 weights once a GPU copy serves every forward (the release DiT is
 * ~9.7 GB of host memory); the config stays. dit_forward then returns -ENODATA. */
void dit_drop_weights(struct dit_model *m);

/* Scratch for sequences of up to max_L latents (any batch size). */
int dit_workspace_alloc(struct dit_workspace **out, const struct dit_model *m, int max_L);
void dit_workspace_free(struct dit_workspace *ws);

/* Velocities of B sequences of L latents.
 * x[B, in_ch, L] channels-first; t[B] flow times; cond[b] is that sequence's [L, cond_dim]
 * conditioning or NULL for all zeros (cond itself may be NULL: all zero); v_out[B, in_ch, L]
 * must not alias x. Returns 0 or -EINVAL (L outside the workspace). */
int dit_forward(const struct dit_model *m, struct dit_workspace *ws, int B, int L, const float *x, const float *t,
                const float *const *cond, float *v_out);

/* The time token's Fourier features: out[fourier_dim] = cos(ang) then sin(ang),
 * ang[k] = fp32(fp32(2 pi t) * time_proj[k]). Exposed for tests. */
void dit_time_features(const struct dit_model *m, float t, float *out);

#endif
