/* LoRA adapters in the PEFT layout: one folder with adapter_config.json and
 * adapter_model.safetensors, as PEFT's save_pretrained (transformers models) and
 * diffusers' save_lora_weights (the DiT) write them.
 *
 *     adapter_config.json   {"peft_type": "LORA", "r": 16, "lora_alpha": 32,
 *                            "target_modules": ["q_proj", "v_proj"], "use_rslora": false, ...}
 *     adapter_model.safetensors
 *         base_model.model.<module>.lora_A.weight   [r, in]     (PEFT)
 *         base_model.model.<module>.lora_B.weight   [out, r]
 *         <component>.<module>.lora_A.weight        (diffusers: "transformer.<module>...")
 *
 * <module> is the module's path in the base component, so its weight is the base
 * checkpoint's tensor "<module>.weight" of shape [out, in]. The merged weight is
 *     W + scale * s * B A,   s = lora_alpha / r  (use_rslora: lora_alpha / sqrt(r))
 * with `scale` the deploy file's per-adapter factor.
 *
 * Only plain LoRA on linear layers is served; every other kind is refused by name:
 * DoRA (use_dora, lora_magnitude_vector), bias training (bias other than "none",
 * lora_bias, *.bias tensors), fully trained modules (modules_to_save), embedding
 * and convolution adapters (lora_embedding_*, A/B of more than two dimensions),
 * per-module ranks (rank_pattern, alpha_pattern), layer_replication, other PEFT
 * types (peft_type other than LORA). target_modules is a list (PEFT's suffix rule) or
 * "all-linear" in any case, which as in PEFT leaves out a transformers model's output
 * layer (the talker's lm_head). fan_in_fan_out is read and ignored, as PEFT
 * ignores it for linear layers. Every file byte is validated (the safetensors
 * reader's rules, then the keys and shapes here); errors name the folder, the file
 * and the key. */
#ifndef MM3_LORA_H
#define MM3_LORA_H

#include <stdint.h>

#define LORA_MAX_RANK 4096

/* One adapted linear layer. */
struct lora_module {
    char *name;      /* module path in the base component: "model.layers.0.self_attn.q_proj" */
    char *weight;    /* its base tensor: name + ".weight" */
    int64_t out, in; /* the base weight's shape */
    float *a;        /* (r, in) lora_A, widened to float32 */
    float *b;        /* (out, r) lora_B */
};

struct lora_adapter {
    char *dir;
    int rank;       /* r */
    double alpha;   /* lora_alpha */
    int rslora;     /* use_rslora */
    double scaling; /* alpha / r, or alpha / sqrt(r) with rslora */
    int n_modules;
    struct lora_module *modules; /* sorted by weight name */
};

/* Load and validate the adapter in folder dir for the base component `component`
 * ("language_model", "rvq_depth_decoder", "transformer": the key prefix diffusers
 * writes besides PEFT's "base_model.model."). On error a is zeroed and the message
 * names the file and key. */
int lora_adapter_load(struct lora_adapter *a, const char *dir, const char *component);
void lora_adapter_free(struct lora_adapter *a);

/* The module adapting base tensor `weight`, or NULL. */
const struct lora_module *lora_adapter_find(const struct lora_adapter *a, const char *weight);

/* rows[i][j] += factor * sum_k B[row0 + i][k] A[k][j] for i in [0, n), j in [0, m->in):
 * rows [row0, row0 + n) of the base weight (row-major, m->in floats each), the
 * product accumulated in float32. factor = scale * a->scaling. 0 or -ENOMEM. */
int lora_module_add_rows(const struct lora_module *m, int rank, float factor, int64_t row0, int64_t n, float *rows);

#endif
