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

#include "common/deploy.h"
#include "common/lora.h"
#include "stage0/model/talker.h"

#define TALKER_LORA_MAX MM3_DEPLOY_MAX_LORA_MODULES   /* adapters loaded at once */
#define TALKER_LORA_NAME_MAX MM3_DEPLOY_LORA_NAME_MAX /* mm3_lora_name_valid's names */

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

/* Load the PEFT adapter in dir as entry `name` (mm3_lora_name_valid) with factor
 * `scale`, checked against the talker of cfg: every module must be one of the layers
 * above with the base weight's shape. Errors name the folder and the module. */
int talker_lora_set_add(struct talker_lora_set *s, const struct talker_config *cfg, const char *name, const char *dir,
                        double scale);
void talker_lora_set_free(struct talker_lora_set *s);
/* Index of the adapter called name, or -1. */
int talker_lora_set_find(const struct talker_lora_set *s, const char *name);

/* Floats of adapter l's factors over n_layers layers (r x (in + out) per adapted layer). */
size_t talker_lora_floats(const struct talker_lora *l, int n_layers);
/* Bytes of the set's factors (float32): what serving them per request adds to the
 * talker's memory. */
size_t talker_lora_set_bytes(const struct talker_lora_set *s);

/* The layer `target` of decoder layer `layer` of adapter l (its a is NULL when not adapted). */
const struct talker_lora_mat *talker_lora_at(const struct talker_lora *l, int layer, enum talker_lora_target target);

#endif
