/* Talker LoRA adapters served per request (the deploy key stages[0].lora_modules):
 * several adapters loaded at once, each applied without merging as
 *     y = W x + s * B (A x),   s = scale * lora_alpha / r  (use_rslora: / sqrt(r))
 * on the rows of the songs that chose it, so songs with different adapters (or
 * none) share one batch. Adapters merged at load (stages[].lora, common/lora_merge.h)
 * are part of W here.
 *
 *     struct talker_lora_set set = {0};
 *     talker_lora_set_add(&set, &lm.cfg, "rock", "/adapters/rock", 1.0);
 *     int i = talker_lora_set_find(&set, "rock");          // 0
 *     talker_state_set_lora(&ts, &set);  ts.row_lora[row] = i;   // CPU forward
 *     talker_backend_set_lora(&b, &set); talker_backend_row_lora(&b, row, i);
 *     talker_lora_set_free(&set);
 *
 * Only the talker's decoder linear layers are served per request (q/k/v/o_proj,
 * gate/up/down_proj of model.layers.N, as the adapter's target_modules name them);
 * any other module (lm_head, the depth decoder's layers) is refused by name: merge
 * such an adapter with stages[].lora. The factors are kept in float32 (the CPU
 * reference computes with them; the CUDA backend uploads them). */
#ifndef MM3_STAGE0_TALKER_LORA_H
#define MM3_STAGE0_TALKER_LORA_H

#include "common/lora.h"
#include "stage0/model/talker.h"

#define TALKER_LORA_MAX 8       /* adapters loaded at once (deploy: lora_modules) */
#define TALKER_LORA_NAME_MAX 64 /* a name is 1..63 of [A-Za-z0-9._-] */

/* The adapted linear layers of one decoder layer, in forward order. */
enum talker_lora_target {
    TALKER_LORA_Q = 0,
    TALKER_LORA_K,
    TALKER_LORA_V,
    TALKER_LORA_O,
    TALKER_LORA_GATE,
    TALKER_LORA_UP,
    TALKER_LORA_DOWN,
    TALKER_LORA_N_TARGETS
};

/* One adapted layer: a [rank, in] and b [out, rank] (lora_A, lora_B), or NULL when
 * the adapter leaves the layer alone. */
struct talker_lora_mat {
    const float *a, *b;
    int in, out;
};

struct talker_lora {
    char name[TALKER_LORA_NAME_MAX];
    int rank;
    float scale;                  /* the deploy scale x lora_alpha / r (or / sqrt(r)) */
    struct talker_lora_mat *mats; /* [n_layers][TALKER_LORA_N_TARGETS] */
    struct lora_adapter src;      /* owns the factors */
};

struct talker_lora_set {
    int n, n_layers;
    struct talker_lora a[TALKER_LORA_MAX];
};

/* Load the PEFT adapter in dir as entry `name` (talker_lora_name_check) with factor
 * `scale`, checked against the talker of cfg: every module must be one of the layers
 * above with the base weight's shape. Errors name the folder and the module. */
int talker_lora_set_add(struct talker_lora_set *s, const struct talker_config *cfg, const char *name, const char *dir,
                        double scale);
void talker_lora_set_free(struct talker_lora_set *s);
/* Index of the adapter called name, or -1. */
int talker_lora_set_find(const struct talker_lora_set *s, const char *name);
/* 0 when name is 1..63 characters of [A-Za-z0-9._-]; -EINVAL naming it otherwise. */
int talker_lora_name_check(const char *name);

/* The layer `target` of decoder layer `layer` of adapter l (its a is NULL when not adapted). */
const struct talker_lora_mat *talker_lora_at(const struct talker_lora *l, int layer, enum talker_lora_target target);

/* "q_proj" ... "down_proj": the module name of a target (PEFT's target_modules spelling). */
const char *talker_lora_target_name(enum talker_lora_target t);

#endif
