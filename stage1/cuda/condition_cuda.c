#include "stage1/cuda/condition_cuda.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda/ops_cuda.h"
#include "common/error.h"
#include "stage1/cuda/dit_gemm.h"

struct condition_cuda {
    struct condition_config cfg;
    int max_frames;
    struct dit_gemm *gemm;
    float *w;     /* [3][out][hidden] as on the host */
    float *b;     /* [out] */
    float *x_pad; /* [max_frames + 2][hidden]: a zero row before and after the frames */
    float *y;     /* [max_frames][out] */
    float *y_host;
};

void condition_cuda_free(struct condition_cuda *cc)
{
    if (!cc) return;
    dit_gemm_destroy(cc->gemm);
    cuda_free(cc->w);
    cuda_free(cc->b);
    cuda_free(cc->x_pad);
    cuda_free(cc->y);
    free(cc->y_host);
    free(cc);
}

int condition_cuda_create(struct condition_cuda **out, const struct condition_model *cm, int max_frames)
{
    *out = NULL;
    if (max_frames < 1) return mm3_errorf(-EINVAL, "condition_cuda: max_frames %d: expected >= 1", max_frames);
    struct condition_cuda *cc = calloc(1, sizeof *cc);
    if (!cc) return mm3_errorf(-ENOMEM, "condition_cuda: out of memory");
    cc->cfg = cm->cfg;
    cc->max_frames = max_frames;
    size_t H = (size_t)cm->cfg.hidden, O = (size_t)cm->cfg.out_dim;
    int rc;
    if ((rc = dit_gemm_create(&cc->gemm, MM3_MATMUL_FP32)) < 0 || (rc = cuda_malloc((void **)&cc->w, sizeof(float) * 3 * O * H)) < 0 ||
        (rc = cuda_malloc((void **)&cc->b, sizeof(float) * O)) < 0 ||
        (rc = cuda_malloc((void **)&cc->x_pad, sizeof(float) * (size_t)(max_frames + 2) * H)) < 0 ||
        (rc = cuda_malloc((void **)&cc->y, sizeof(float) * (size_t)max_frames * O)) < 0)
        goto fail;
    if (!(cc->y_host = malloc(sizeof(float) * (size_t)max_frames * O))) {
        rc = mm3_errorf(-ENOMEM, "condition_cuda: out of memory");
        goto fail;
    }
    if ((rc = cuda_memcpy_h2d(cc->w, cm->proj_w, sizeof(float) * 3 * O * H)) < 0 ||
        (rc = cuda_memcpy_h2d(cc->b, cm->proj_b, sizeof(float) * O)) < 0 ||
        (rc = cuda_memset(cc->x_pad, 0, sizeof(float) * H)) < 0)
        goto fail;
    *out = cc;
    return 0;
fail:
    condition_cuda_free(cc);
    return mm3_error_prefix(rc, "condition encoder on the GPU");
}

int condition_cuda_project(struct condition_cuda *cc, const float *mixed, int F, float *cond)
{
    if (F < 1 || F > cc->max_frames)
        return mm3_errorf(-EINVAL, "condition_cuda_project: %d frames: expected 1..%d", F, cc->max_frames);
    int H = cc->cfg.hidden, O = cc->cfg.out_dim;
    int rc;
    /* Row 0 stays zero from create; the row after the frames moves with F. */
    if ((rc = cuda_memcpy_h2d(cc->x_pad + H, mixed, sizeof(float) * (size_t)F * H)) < 0 ||
        (rc = cuda_memset(cc->x_pad + (size_t)(F + 1) * H, 0, sizeof(float) * H)) < 0)
        return rc;
    for (int k = 0; k < 3; k++) {
        const float *w = cc->w + (size_t)k * O * H;
        rc = dit_gemm_run(cc->gemm,
                          &(struct dit_gemm_product){.d = cc->y,
                                                     .a = cc->x_pad + (size_t)k * H,
                                                     .w = w,
                                                     .bias = k == 0 ? cc->b : NULL,
                                                     .c = k == 0 ? NULL : cc->y,
                                                     .M = F,
                                                     .K = H,
                                                     .N = O,
                                                     .lda = H,
                                                     .ldd = O},
                          NULL);
        if (rc < 0) return rc;
    }
    if ((rc = cuda_memcpy_d2h(cc->y_host, cc->y, sizeof(float) * (size_t)F * O)) < 0) return rc;
    int L = condition_latent_len(&cc->cfg, F);
    for (int j = 0; j < L; j++)
        memcpy(cond + (size_t)j * O, cc->y_host + (size_t)condition_nearest_index(F, L, j) * O, sizeof(float) * O);
    return 0;
}

int condition_cuda_project_cb(void *ctx, const float *mixed, int F, float *cond)
{
    return condition_cuda_project(ctx, mixed, F, cond);
}
