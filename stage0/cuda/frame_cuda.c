#include "stage0/cuda/frame_cuda.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda/ops_cuda.h"
#include "common/cuda/sampler_cuda.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/sampler.h"
#include "stage0/cuda/cuda_upload.h"
#include "stage0/cuda/frame_kernels.h"

/* Where each array of a step's upload / download sits in one block (offsets in
 * bytes, 256-aligned so every array suits the 16-byte vector loads). */
struct frame_in_layout {
    size_t hidden, seed, scale, pos, mask, bytes;
};

struct frame_out_layout {
    size_t codes, depth_hidden, feedback, bytes;
};

struct frame_cuda {
    int max_pairs, hidden, ncb, vocab;
    struct cuda_alloc_list mem;
    const uint16_t *e0;    /* [SAMPLER_N_CODES][hidden]: embed_tokens rows of the c0 codes */
    const uint16_t *audio; /* [n_codebooks-1][vocab][hidden] */
    float feedback_scale;
    void *in_dev, *out_dev; /* one block each, laid out per call for n pairs */
    unsigned char *in_host, *out_host;
    float *logits, *dlogits, *x, *y; /* [2P][C0], [2P][vocab], [2P][hidden] x 2 */
    int *col;                        /* [P] */
};

static size_t align256(size_t b)
{
    return (b + 255) & ~(size_t)255;
}

static struct frame_in_layout in_layout(int n, int H, int ncb)
{
    struct frame_in_layout l;
    l.hidden = 0;
    l.seed = align256(sizeof(float) * 2 * (size_t)n * H);
    l.scale = l.seed + align256(sizeof(uint64_t) * n);
    l.pos = l.scale + align256(sizeof(float) * n);
    l.mask = l.pos + align256(sizeof(uint32_t) * (size_t)ncb * n);
    l.bytes = l.mask + align256((size_t)n);
    return l;
}

static struct frame_out_layout out_layout(int n, int H, int ncb)
{
    struct frame_out_layout l;
    l.codes = 0;
    l.depth_hidden = align256(sizeof(int32_t) * (size_t)n * ncb);
    l.feedback = l.depth_hidden + align256(sizeof(float) * (size_t)n * (ncb - 1) * H);
    l.bytes = l.feedback + sizeof(float) * (size_t)n * H;
    return l;
}

/* Whether src[n] survives the bf16 round trip bit for bit. */
static int exact_bf16(const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float b = mm3_bf16_to_f32(mm3_f32_to_bf16(src[i]));
        if (memcmp(&b, &src[i], sizeof b) != 0) return 0;
    }
    return 1;
}

int frame_cuda_create(struct frame_cuda **out, const struct talker *lm, const struct depth *dd, int max_pairs)
{
    *out = NULL;
    int H = lm->cfg.hidden, ncb = dd->cfg.n_codebooks, V = dd->cfg.audio_vocab;
    if (max_pairs < 1) return mm3_errorf(-EINVAL, "frame_cuda_create: %d pairs, expected >= 1", max_pairs);
    /* Models the AR loop cannot run (generate.c refuses them with a message) and the
     * half-built models of the kernel tests get no batched step, and no error here. */
    if (dd->cfg.hidden != H || ncb < 2 || lm->cfg.vocab < SAMPLER_CODE_OFFSET + SAMPLER_N_CODES || !lm->embed ||
        !dd->audio_emb)
        return 0;
    const float *e0 = lm->embed + (size_t)SAMPLER_CODE_OFFSET * H;
    size_t n_e0 = (size_t)SAMPLER_N_CODES * H, n_audio = (size_t)(ncb - 1) * V * H;
    if (!exact_bf16(e0, n_e0) || !exact_bf16(dd->audio_emb, n_audio)) return 0;
    int max_cols = cuda_sampler_max_cols();
    if (SAMPLER_C0_COLS > max_cols || V > max_cols) return 0; /* rows too wide for the GPU draw */
    struct frame_cuda *fc = calloc(1, sizeof *fc);
    if (!fc) return mm3_errorf(-ENOMEM, "frame_cuda_create: out of memory");
    fc->max_pairs = max_pairs;
    fc->hidden = H;
    fc->ncb = ncb;
    fc->vocab = V;
    fc->feedback_scale = (float)pow((double)ncb, -0.5); /* as talker_feedback_embedding */
    struct cuda_alloc_list *l = &fc->mem;
    size_t R = 2 * (size_t)max_pairs;
    uint16_t *w;
    int rc;
    if ((rc = cuda_upload_bf16(l, &w, e0, n_e0)) == 0) fc->e0 = w;
    if (rc == 0 && (rc = cuda_upload_bf16(l, &w, dd->audio_emb, n_audio)) == 0) fc->audio = w;
    struct frame_in_layout il = in_layout(max_pairs, H, ncb);
    struct frame_out_layout ol = out_layout(max_pairs, H, ncb);
    if (rc == 0) rc = cuda_alloc_list_add(l, &fc->in_dev, il.bytes);
    if (rc == 0) rc = cuda_alloc_list_add(l, &fc->out_dev, ol.bytes);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->logits, sizeof(float) * R * SAMPLER_C0_COLS);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->dlogits, sizeof(float) * R * V);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->x, sizeof(float) * R * H);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->y, sizeof(float) * R * H);
    if (rc == 0) rc = cuda_alloc_list_add(l, (void **)&fc->col, sizeof(int) * (size_t)max_pairs);
    if (rc == 0 && (!(fc->in_host = malloc(il.bytes)) || !(fc->out_host = malloc(ol.bytes))))
        rc = mm3_errorf(-ENOMEM, "frame_cuda_create: out of memory");
    if (rc < 0) {
        frame_cuda_destroy(fc);
        return rc;
    }
    *out = fc;
    return 0;
}

void frame_cuda_destroy(struct frame_cuda *fc)
{
    if (!fc) return;
    cuda_alloc_list_free(&fc->mem);
    free(fc->in_host);
    free(fc->out_host);
    free(fc);
}

/* Inputs into one host block, uploaded with one copy. */
static int upload_inputs(struct frame_cuda *fc, const struct talker_pairs_in *in, struct frame_in_layout *l)
{
    int n = in->n, H = fc->hidden, ncb = fc->ncb;
    *l = in_layout(n, H, ncb);
    unsigned char *b = fc->in_host;
    memcpy(b + l->hidden, in->hidden, sizeof(float) * 2 * (size_t)n * H);
    memcpy(b + l->seed, in->seed, sizeof(uint64_t) * n);
    memcpy(b + l->scale, in->cfg_scale, sizeof(float) * n);
    uint32_t *pos = (uint32_t *)(b + l->pos);
    for (int j = 0; j < ncb; j++)
        for (int p = 0; p < n; p++)
            pos[(size_t)j * n + p] = (uint32_t)(ncb * in->step[p] + j);
    for (int p = 0; p < n; p++)
        b[l->mask + p] = in->ignore_stop && in->ignore_stop[p] ? 1 : 0;
    return cuda_memcpy_h2d(fc->in_dev, b, l->bytes);
}

int frame_cuda_sample_pairs(struct frame_cuda *fc, struct talker_cuda *tc, struct depth_cuda *dc,
                            const struct talker_pairs_in *in, const struct talker_pairs_out *out)
{
    int n = in->n, H = fc->hidden, ncb = fc->ncb, V = fc->vocab, R = 2 * n;
    if (n < 1 || n > fc->max_pairs)
        return mm3_errorf(-EINVAL, "frame_cuda_sample_pairs: %d pairs, expected 1..%d", n, fc->max_pairs);
    for (int p = 0; p < n; p++)
        if (in->step[p] < 0) return mm3_errorf(-EINVAL, "frame_cuda_sample_pairs: pair %d at step %d", p, in->step[p]);
    struct frame_in_layout il;
    struct frame_out_layout ol = out_layout(n, H, ncb);
    int rc = upload_inputs(fc, in, &il);
    if (rc < 0) return rc;
    unsigned char *ib = fc->in_dev, *ob = fc->out_dev;
    const float *hidden = (const float *)(ib + il.hidden), *scale = (const float *)(ib + il.scale);
    const uint64_t *seed = (const uint64_t *)(ib + il.seed);
    const uint32_t *pos = (const uint32_t *)(ib + il.pos);
    const unsigned char *mask = ib + il.mask;
    int32_t *codes = (int32_t *)(ob + ol.codes);
    float *dh = (float *)(ob + ol.depth_hidden), *fb = (float *)(ob + ol.feedback);
    size_t dh_stride = (size_t)(ncb - 1) * H;
    /* c0: head on all 2n rows, guide + draw; then position 0 of the depth decoder
     * (the LM hidden pair), whose input does not depend on the draw. */
    if ((rc = talker_cuda_head_dev(tc, hidden, R, fc->logits)) < 0 ||
        (rc = cuda_sampler_draw_pairs(fc->logits, SAMPLER_C0_COLS, SAMPLER_C0_COLS, n, scale, 1, in->top_k, seed, pos,
                                      mask, fc->col, NULL, NULL)) < 0 ||
        (rc = depth_cuda_step_dev(dc, R, hidden, 0, fc->y)) < 0 ||
        (rc = frame_cuda_take_codes(codes, ncb, 0, fc->col, n, fc->x, fc->e0, SAMPLER_N_CODES, -1, H, NULL)) < 0)
        return rc;
    for (int j = 1; j < ncb; j++) {
        const uint16_t *next = j < ncb - 1 ? fc->audio + (size_t)(j - 1) * V * H : NULL;
        if ((rc = depth_cuda_step_dev(dc, R, fc->x, j, fc->y)) < 0 ||
            (rc = frame_cuda_copy_rows(dh + (size_t)(j - 1) * H, dh_stride, fc->y, 2 * (size_t)H, n, H, NULL)) < 0 ||
            (rc = depth_cuda_logits_dev(dc, j, fc->y, R, fc->dlogits)) < 0 ||
            (rc = cuda_sampler_draw_pairs(fc->dlogits, V, V, n, scale, 0, in->top_k, seed, pos + (size_t)j * n, NULL,
                                          fc->col, NULL, NULL)) < 0 ||
            (rc = frame_cuda_take_codes(codes, ncb, j, fc->col, n, fc->x, next, V, 0, H, NULL)) < 0)
            return rc;
    }
    if ((rc = frame_cuda_feedback(fb, codes, ncb, n, fc->e0, SAMPLER_N_CODES, fc->audio, V, H, fc->feedback_scale,
                                  NULL)) < 0 ||
        (rc = cuda_stream_sync(NULL)) < 0 || (rc = cuda_memcpy_d2h(fc->out_host, ob, ol.bytes)) < 0)
        return rc;
    memcpy(out->codes, fc->out_host + ol.codes, sizeof(int32_t) * (size_t)n * ncb);
    memcpy(out->depth_hidden, fc->out_host + ol.depth_hidden, sizeof(float) * (size_t)n * dh_stride);
    memcpy(out->feedback, fc->out_host + ol.feedback, sizeof(float) * (size_t)n * H);
    return 0;
}
