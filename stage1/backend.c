#include "stage1/backend.h"

#include <string.h>

#include "common/error.h"
#include "common/log.h"
#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage1/cuda/condition_cuda.h"
#include "stage1/cuda/dit_kernels.h"
#include "stage1/cuda/flow_cuda.h"
#include "stage1/cuda/vocoder_cuda.h"
#endif

int s1_backend_open(struct s1_backend *b, enum mm3_backend kind, int device, const struct condition_model *cm,
                    const struct dit_model *dm, const struct vocoder *voc, enum mm3_matmul_precision precision)
{
    memset(b, 0, sizeof *b);
    b->kind = kind;
    if (kind != MM3_BACKEND_CUDA) return 0;
#ifdef MM3_HAVE_CUDA
    if (cuda_device_count_safe() <= device)
        return mm3_errorf(-ENODEV, "backend cuda: no CUDA device %d is present", device);
    int max_L = condition_latent_len(&cm->cfg, RENDER_WINDOW_FRAMES);
    struct flow_cuda *fc = NULL;
    struct vocoder_cuda *vc = NULL;
    struct condition_cuda *cc = NULL;
    int rc;
    if ((rc = cuda_device_set(device)) < 0 || (rc = flow_cuda_create(&fc, dm, precision, max_L)) < 0 ||
        (rc = vocoder_cuda_create(&vc, voc, precision, max_L)) < 0 ||
        (rc = condition_cuda_create(&cc, cm, RENDER_WINDOW_FRAMES)) < 0) {
        flow_cuda_free(fc);
        vocoder_cuda_free(vc);
        return rc;
    }
    b->flow = fc;
    b->vocoder = vc;
    b->condition = cc;
    LOG_INFO("stage 1 on GPU %d: condition projection, DiT + flow loop and vocoder (matmul %s)", device,
             mm3_matmul_precision_name(precision));
    return 0;
#else
    (void)device, (void)cm, (void)dm, (void)voc, (void)precision;
    return mm3_errorf(-ENOTSUP, "backend cuda: this build has no CUDA (configure with -DMM3_CUDA=ON)");
#endif
}

void s1_backend_close(struct s1_backend *b)
{
#ifdef MM3_HAVE_CUDA
    flow_cuda_free(b->flow);
    vocoder_cuda_free(b->vocoder);
    condition_cuda_free(b->condition);
#endif
    memset(b, 0, sizeof *b);
}

int s1_backend_flow_batch(struct s1_backend *b, const struct dit_model *dm, int max_L, int max_windows,
                          struct flow_batch *out)
{
#ifdef MM3_HAVE_CUDA
    if (b->flow) return flow_cuda_batch_open(b->flow, max_windows, out);
#else
    (void)b;
#endif
    return flow_batch_cpu_create(out, dm, max_L, max_windows);
}

void s1_backend_apply(const struct s1_backend *b, struct render_params *p)
{
#ifdef MM3_HAVE_CUDA
    if (b->flow) p->flow = (struct render_flow){b->flow, flow_cuda_window_run_cb};
    if (b->vocoder) vocoder_cuda_render_decoder(b->vocoder, &p->decoder);
    if (b->condition) p->condition = (struct render_condition){b->condition, condition_cuda_project_cb};
#else
    (void)b, (void)p;
#endif
}

unsigned long long s1_backend_fp16_rescues(void)
{
#ifdef MM3_HAVE_CUDA
    return dit_cuda_f16_rescues();
#else
    return 0;
#endif
}
