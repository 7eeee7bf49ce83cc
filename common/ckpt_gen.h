/* Random-weight checkpoints in the exact release layout (mm3-mkckpt).
 *
 * Writes root/modular_model_index.json and the component folders
 * language_model/ (BF16, sharded), rvq_depth_decoder/ (BF16), condition_encoder/,
 * transformer/, vocoder/ (F32, weight-normed convs as weight_g/weight_v),
 * scheduler/ and tokenizer/ (a small byte-level BPE trained on built-in text with
 * the real special-token ids). Files are streamed tensor by tensor, so the
 * release geometry (~27 GB) never sits in memory.
 *
 * Weights are a pure function of (seed, component, tensor name, element index),
 * so the output is byte-identical for a seed whatever the thread count. Each
 * tensor is drawn from a distribution that keeps activations O(1): linear and
 * conv weights N(0, 1/fan_in), norm gains 1, biases N(0, 0.02^2), Snake alphas
 * U(0.5, 1.5), weight_g = ||weight_v|| per output slice (so W = v); the vocoder's
 * residual conv2 and conv_out scaled down (0.1, 0.2) so the final tanh does not clip.
 *
 *     struct ckpt_gen_geometry g;
 *     ckpt_gen_preset("tiny", &g);
 *     struct ckpt_gen_opts o = {.seed = 1};
 *     if ((rc = ckpt_gen_write("/tmp/ck", &g, &o)) < 0) ...; */
#ifndef MM3_CKPT_GEN_H
#define MM3_CKPT_GEN_H

#include <stdint.h>

#define CKPT_GEN_MAX_RATIOS 8

struct ckpt_gen_geometry {
    /* language_model (Qwen3) */
    int lm_hidden, lm_layers, lm_heads, lm_kv_heads, lm_head_dim, lm_intermediate, lm_vocab, lm_max_positions;
    double lm_rope_theta;
    uint64_t lm_shard_bytes; /* shard limit; 0: the largest tensor (forces several shards) */
    /* rvq_depth_decoder (hidden = lm_hidden) */
    int dd_layers, dd_heads, dd_intermediate, dd_audio_vocab, dd_codebooks, dd_max_positions;
    /* condition_encoder (input width lm_hidden, dd_codebooks layers) */
    int ce_out;
    /* transformer (DiT); condition width ce_out */
    int dit_in, dit_layers, dit_heads, dit_head_dim, dit_ff_inner, dit_rotary, dit_fourier;
    uint64_t dit_shard_bytes; /* shard limit; UINT64_MAX: one file */
    /* vocoder; latent channels dit_in */
    int voc_input_dim, voc_hidden, n_ratios, ratios[CKPT_GEN_MAX_RATIOS];
};

struct ckpt_gen_opts {
    uint64_t seed;
    int threads;        /* 0: online CPUs, at most 32 */
    int sparse;         /* headers and configs only; the data sections are holes (zeros) */
    int rope_top_level; /* write "rope_theta" at the top level instead of under rope_parameters */
};

/* "tiny" (the geometry of golden tiny-a, renders a song in seconds on a CPU) or
 * "full" (the release: LM 36 x 4096, vocab 200000, DiT 36 x 2048, ...). */
int ckpt_gen_preset(const char *name, struct ckpt_gen_geometry *g);

/* Override one geometry field by its name in the struct ("lm_layers", "dit_heads",
 * "ratios" as "8,8,4,2", ...); the error lists the known names. */
int ckpt_gen_geometry_set(struct ckpt_gen_geometry *g, const char *key, const char *value);

/* Write the checkpoint into dir (created if missing; existing files overwritten). */
int ckpt_gen_write(const char *dir, const struct ckpt_gen_geometry *g, const struct ckpt_gen_opts *o);

/* tokenizer/tokenizer.json: byte-level BPE with n_merges merges learned from a
 * built-in English/lyrics text (fewer if the text runs out of repeated pairs). */
int ckpt_gen_tokenizer_write(const char *path, int n_merges);

/* A random LoRA adapter in the PEFT layout (common/lora.h) for one component of
 * the checkpoint at ckpt_root: every 2-D "<module>.weight" whose module a target
 * names (PEFT's suffix rule) gets lora_A [rank, in] ~ N(0, 1/in) and lora_B
 * [out, rank] ~ N(0, 0.01/rank) in F32, a pure function of (seed, key). Keys carry
 * PEFT's "base_model.model." prefix, "transformer." (diffusers') for the DiT. */
struct ckpt_gen_lora_opts {
    const char *component; /* language_model, rvq_depth_decoder or transformer */
    const char *targets;   /* comma-separated module names; NULL or "": every linear layer of the blocks */
    int rank;
    double alpha; /* lora_alpha */
    int rslora;   /* use_rslora */
    uint64_t seed;
};
int ckpt_gen_lora_write(const char *out, const char *ckpt_root, const struct ckpt_gen_lora_opts *o);

#endif
