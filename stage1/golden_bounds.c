/* Bounds of the stage-1 golden replay (stage1/golden_bounds.h). */
#include "stage1/golden_bounds.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>

#include "common/error.h"

static const char *const quantity_names[GOLDEN_Q_COUNT] = {"dit_call", "latents", "audio"};

const char *golden_quantity_name(enum golden_quantity q)
{
    return q >= 0 && q < GOLDEN_Q_COUNT ? quantity_names[q] : "?";
}

void golden_bounds_tiny(struct golden_bounds *b, enum mm3_backend backend, enum mm3_matmul_precision p)
{
    double fwd = GOLDEN_REL_TOL, flow = GOLDEN_REL_TOL, audio = GOLDEN_REL_TOL;
    if (backend == MM3_BACKEND_CUDA) {
        if (p == MM3_MATMUL_TF32) {
            fwd = GOLDEN_REL_TOL_FWD_TF32, flow = GOLDEN_REL_TOL_FLOW_TF32, audio = GOLDEN_REL_TOL_AUDIO_TF32;
        } else if (p == MM3_MATMUL_BF16) {
            fwd = GOLDEN_REL_TOL_FWD_BF16, flow = GOLDEN_REL_TOL_FLOW_BF16, audio = GOLDEN_REL_TOL_AUDIO_BF16;
        } else if (p == MM3_MATMUL_FP16) {
            fwd = GOLDEN_REL_TOL_FWD_FP16, flow = GOLDEN_REL_TOL_FLOW_FP16, audio = GOLDEN_REL_TOL_AUDIO_FP16;
        } else if (p == MM3_MATMUL_FP8) {
            fwd = GOLDEN_REL_TOL_FWD_FP8, flow = GOLDEN_REL_TOL_FLOW_FP8, audio = GOLDEN_REL_TOL_AUDIO_FP8;
        }
    }
    b->tiny[GOLDEN_Q_DIT_CALL] = fwd;
    b->tiny[GOLDEN_Q_LATENTS] = flow;
    b->tiny[GOLDEN_Q_AUDIO] = audio;
    for (int q = 0; q < GOLDEN_Q_COUNT; q++) {
        b->bound[q] = b->tiny[q];
        b->yardstick[q] = -1;
    }
}

double golden_bound_with_yardstick(double tiny, double yardstick)
{
    if (!(yardstick >= 0)) return tiny;
    double y = GOLDEN_YARDSTICK_FACTOR * yardstick;
    return y > tiny ? y : tiny;
}

int golden_bounds_apply_yardsticks(struct golden_bounds *b, const char *path, enum mm3_matmul_precision p)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return mm3_errorf(-EINVAL, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    int rc = 0;
    json_t *precisions = json_object_get(root, "precisions");
    if (!json_is_object(precisions)) {
        rc = mm3_errorf(-EINVAL, "%s: key 'precisions': expected an object", path);
        goto out;
    }
    const char *pname = mm3_matmul_precision_name(p);
    json_t *jp = json_object_get(precisions, pname);
    if (!jp) goto out;
    if (!json_is_object(jp)) {
        rc = mm3_errorf(-EINVAL, "%s: key 'precisions.%s': expected an object", path, pname);
        goto out;
    }
    for (int q = 0; q < GOLDEN_Q_COUNT; q++) {
        json_t *jq = json_object_get(jp, quantity_names[q]);
        if (!jq) continue;
        json_t *jr = json_is_object(jq) ? json_object_get(jq, "rel") : NULL;
        if (json_is_null(jr)) continue; /* PyTorch's own run overflowed: no yardstick */
        double rel = json_is_number(jr) ? json_number_value(jr) : NAN;
        if (!(rel >= 0) || isinf(rel)) {
            rc = mm3_errorf(-EINVAL, "%s: key 'precisions.%s.%s.rel': expected a finite number >= 0", path, pname,
                            quantity_names[q]);
            goto out;
        }
        b->yardstick[q] = rel;
        b->bound[q] = golden_bound_with_yardstick(b->tiny[q], rel);
    }
out:
    json_decref(root);
    return rc;
}
