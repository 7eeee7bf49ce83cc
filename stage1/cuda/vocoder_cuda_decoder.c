/* The CUDA vocoder as a render decoder (stage1/render.h), so the renderer, golden and
 * server paths can swap it in for the CPU vocoder_decode. */
#include <errno.h>

#include "common/error.h"
#include "stage1/cuda/vocoder_cuda.h"
#include "stage1/render.h"

static int vocoder_cuda_decode_cb(void *ctx, const float *latents, int L, float *pcm)
{
    return vocoder_cuda_decode(ctx, latents, L, pcm);
}

int vocoder_cuda_render_decoder(struct vocoder_cuda *h, struct render_decoder *out)
{
    if (!h) return mm3_errorf(-EINVAL, "vocoder_cuda_render_decoder: no vocoder_cuda handle");
    *out = (struct render_decoder){.ctx = h, .hop = vocoder_cuda_hop(h), .decode = vocoder_cuda_decode_cb};
    return 0;
}
