#include "stage0/talker_backend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#ifdef MM3_HAVE_CUDA
#include "common/cuda/ops_cuda.h"
#include "stage0/cuda/depth_cuda.h"
#include "stage0/cuda/talker_cuda.h"
#endif

int talker_backend_parse(const char *name, enum talker_backend_kind *kind)
{
    if (name && strcmp(name, "cpu") == 0) {
        *kind = TALKER_BACKEND_CPU;
        return 0;
    }
    if (name && strcmp(name, "cuda") == 0) {
        *kind = TALKER_BACKEND_CUDA;
        return 0;
    }
    return mm3_errorf(-EINVAL, "backend '%s': expected 'cpu' or 'cuda'", name ? name : "(null)");
}

/* ---- CPU: today's functions over a private talker_state / depth_state ---- */

struct cpu_impl {
    const struct talker *lm;
    const struct depth *dd;
    struct talker_state ts;
    struct depth_state ds;
};

static int cpu_forward(void *impl, int n, const int *row, const int *pos, const float *emb, float *hidden_out)
{
    struct cpu_impl *c = impl;
    return talker_forward(c->lm, &c->ts, n, row, pos, emb, hidden_out);
}

static int cpu_head_drawable(void *impl, const float *hidden, int n_rows, float *logits)
{
    struct cpu_impl *c = impl;
    talker_head_drawable(c->lm, hidden, n_rows, logits);
    return 0;
}

static int cpu_depth_step(void *impl, int n, const float *x, int pos, float *out)
{
    struct cpu_impl *c = impl;
    return depth_step(c->dd, &c->ds, n, x, pos, out);
}

static int cpu_depth_logits(void *impl, int j, const float *hidden, int n, float *logits)
{
    struct cpu_impl *c = impl;
    if (j < 1 || j >= c->dd->cfg.n_codebooks)
        return mm3_errorf(-EINVAL, "depth_logits: codebook %d, expected 1..%d", j, c->dd->cfg.n_codebooks - 1);
    depth_logits(c->dd, j, hidden, n, logits);
    return 0;
}

static void cpu_destroy(void *impl)
{
    struct cpu_impl *c = impl;
    if (!c) return;
    talker_state_free(&c->ts);
    depth_state_free(&c->ds);
    free(c);
}

static int cpu_open(struct talker_backend *b, int max_rows, int max_ctx, int depth_rows)
{
    struct cpu_impl *c = calloc(1, sizeof *c);
    if (!c) return mm3_errorf(-ENOMEM, "talker backend: out of memory");
    c->lm = b->lm;
    c->dd = b->dd;
    int rc = talker_state_init(&c->ts, b->lm, max_rows, max_ctx);
    if (rc == 0) rc = depth_state_init(&c->ds, b->dd, depth_rows);
    if (rc < 0) {
        cpu_destroy(c);
        return rc;
    }
    b->impl = c;
    b->forward = cpu_forward;
    b->head_drawable = cpu_head_drawable;
    b->depth_step = cpu_depth_step;
    b->depth_logits = cpu_depth_logits;
    b->destroy = cpu_destroy;
    return 0;
}

/* ---- CUDA: stage0/cuda/ ---- */

#ifdef MM3_HAVE_CUDA
struct cuda_impl {
    struct talker_cuda *tc;
    struct depth_cuda *dc;
};

static int gpu_forward(void *impl, int n, const int *row, const int *pos, const float *emb, float *hidden_out)
{
    return talker_cuda_forward(((struct cuda_impl *)impl)->tc, n, row, pos, emb, hidden_out);
}

static int gpu_head_drawable(void *impl, const float *hidden, int n_rows, float *logits)
{
    return talker_cuda_head_drawable(((struct cuda_impl *)impl)->tc, hidden, n_rows, logits);
}

static int gpu_depth_step(void *impl, int n, const float *x, int pos, float *out)
{
    return depth_cuda_step(((struct cuda_impl *)impl)->dc, n, x, pos, out);
}

static int gpu_depth_logits(void *impl, int j, const float *hidden, int n, float *logits)
{
    return depth_cuda_logits(((struct cuda_impl *)impl)->dc, j, hidden, n, logits);
}

static void gpu_destroy(void *impl)
{
    struct cuda_impl *c = impl;
    if (!c) return;
    talker_cuda_destroy(c->tc);
    depth_cuda_destroy(c->dc);
    free(c);
}

static int gpu_open(struct talker_backend *b, int max_rows, int max_ctx, int depth_rows)
{
    struct cuda_impl *c = calloc(1, sizeof *c);
    if (!c) return mm3_errorf(-ENOMEM, "talker backend: out of memory");
    int rc = talker_cuda_create(&c->tc, b->lm, max_rows, max_ctx);
    if (rc == 0) rc = depth_cuda_create(&c->dc, b->dd, depth_rows);
    if (rc < 0) {
        gpu_destroy(c);
        return rc;
    }
    b->impl = c;
    b->forward = gpu_forward;
    b->head_drawable = gpu_head_drawable;
    b->depth_step = gpu_depth_step;
    b->depth_logits = gpu_depth_logits;
    b->destroy = gpu_destroy;
    return 0;
}
#endif

int talker_backend_available(enum talker_backend_kind kind)
{
    if (kind == TALKER_BACKEND_CPU) return 1;
#ifdef MM3_HAVE_CUDA
    return cuda_device_count_safe() > 0;
#else
    return 0;
#endif
}

int talker_backend_open(struct talker_backend *b, enum talker_backend_kind kind, const struct talker *lm,
                        const struct depth *dd, int max_rows, int max_ctx, int depth_rows)
{
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->lm = lm;
    b->dd = dd;
    if (kind == TALKER_BACKEND_CPU) {
        b->name = "cpu";
        return cpu_open(b, max_rows, max_ctx, depth_rows);
    }
    b->name = "cuda";
#ifdef MM3_HAVE_CUDA
    if (cuda_device_count_safe() < 1) return mm3_errorf(-ENODEV, "backend cuda: no CUDA device found");
    return gpu_open(b, max_rows, max_ctx, depth_rows);
#else
    (void)max_rows, (void)max_ctx, (void)depth_rows;
    return mm3_errorf(-ENODEV, "backend cuda: this build has no CUDA support (configure with -DMM3_CUDA=ON)");
#endif
}

void talker_backend_close(struct talker_backend *b)
{
    if (b->destroy) b->destroy(b->impl);
    memset(b, 0, sizeof *b);
}
