/* Per-frame slot mix of the condition encoder (common/frame_mix.h). */
#include "common/frame_mix.h"

#include <math.h>
#include <string.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/ops.h"

static int config_size(const struct ckpt_component *c, const char *key, int max, int *out)
{
    int64_t v;
    int rc = ckpt_config_int(c, key, &v);
    if (rc < 0) return rc;
    if (v < 1 || v > max)
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected an integer in [1, %d], got %lld", c->dir, key,
                          max, (long long)v);
    *out = (int)v;
    return 0;
}

int frame_mix_load_component(struct frame_mix *mix, const struct ckpt_component *c)
{
    memset(mix, 0, sizeof *mix);
    int rc;
    if ((rc = config_size(c, "condition_hidden_dim", 1 << 24, &mix->hidden)) < 0 ||
        (rc = config_size(c, "num_condition_layers", FRAME_MIX_MAX_LAYERS, &mix->n_layers)) < 0)
        return rc;
    if ((rc = ckpt_read_f32(c, "layer_weight_logits", mix->w, 1, (int64_t[]){mix->n_layers})) < 0 ||
        (rc = ckpt_read_f32(c, "layer_scale", &mix->layer_scale, 1, (int64_t[]){1})) < 0)
        return rc;
    op_softmax(mix->w, mix->n_layers);
    return 0;
}

int frame_mix_load(struct frame_mix *mix, const char *ckpt_root)
{
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, ckpt_root, "condition_encoder");
    if (rc < 0) return rc;
    rc = frame_mix_load_component(mix, &c);
    ckpt_component_close(&c);
    return rc < 0 ? mm3_error_prefix(rc, "loading the frame mix: ") : 0;
}

int frame_mix_raw_width(const struct frame_mix *mix)
{
    return mix->n_layers * mix->hidden;
}

int frame_mix_apply(const struct frame_mix *mix, const float *frames, int n, int width, float *out)
{
    int H = mix->hidden, raw = frame_mix_raw_width(mix);
    if (width != raw && width != H)
        return mm3_errorf(-EINVAL, "condition frames: width %d: expected %d (%d layers x %d) or %d (already mixed)",
                          width, raw, mix->n_layers, H, H);
    for (int f = 0; f < n; f++) {
        const float *in = frames + (size_t)f * width;
        for (int i = 0; i < width; i++)
            if (!isfinite(in[i]))
                return mm3_errorf(-EINVAL, "condition frames: frame %d, value %d is not finite", f, i);
        float *o = out + (size_t)f * H;
        if (width == H) {
            memcpy(o, in, sizeof(float) * H);
            continue;
        }
        /* einsum over layers, then the scale, as the reference orders it */
        for (int c = 0; c < H; c++) {
            float s = 0.0f;
            for (int l = 0; l < mix->n_layers; l++)
                s += in[(size_t)l * H + c] * mix->w[l];
            o[c] = mix->layer_scale * s;
        }
    }
    return 0;
}
