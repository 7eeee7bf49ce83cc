/* The condition encoder's per-frame slot mix, shared by both stages so that stage 0 can
 * pre-mix frames (send `hidden` values instead of `n_layers * hidden`) with exactly the
 * arithmetic stage 1 would use:
 *
 *   out[f, c] = layer_scale * sum_l softmax(layer_weight_logits)[l] * frames[f, l*hidden + c]
 *
 * summed over l in order in float32, then scaled (the reference's einsum, then `* scale`).
 * Mixing before or after windowing gives the same numbers because it is per frame.
 *
 *     struct frame_mix mix;
 *     frame_mix_load(&mix, ckpt_root);                      // condition_encoder/
 *     frame_mix_apply(&mix, frames, n, mix.n_layers * mix.hidden, out);   // out [n, hidden]
 */
#ifndef MM3_FRAME_MIX_H
#define MM3_FRAME_MIX_H

#define FRAME_MIX_MAX_LAYERS 64

struct ckpt_component;

struct frame_mix {
    int hidden;                    /* condition_hidden_dim */
    int n_layers;                  /* num_condition_layers */
    float w[FRAME_MIX_MAX_LAYERS]; /* softmax(layer_weight_logits) */
    float layer_scale;
};

/* Read <ckpt_root>/condition_encoder/config.json and the two mix tensors. */
int frame_mix_load(struct frame_mix *mix, const char *ckpt_root);

/* The same from an open condition_encoder component (what condition_load uses). */
int frame_mix_load_component(struct frame_mix *mix, const struct ckpt_component *c);

/* Frames per frame of raw input: n_layers * hidden. */
int frame_mix_raw_width(const struct frame_mix *mix);

/* Mix n frames of `width` floats into out[n, hidden]. width n_layers*hidden: mixed as
 * above; width hidden (already mixed): copied. Any other width, or a non-finite input
 * value, is -EINVAL naming the frame. */
int frame_mix_apply(const struct frame_mix *mix, const float *frames, int n, int width, float *out);

#endif
