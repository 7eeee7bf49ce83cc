/* LoRA deltas for a batch whose rows use different adapters (ops_cuda.h): the down
 * product t = A x, one block per row, target and rank index, then the up product
 * y += s B t, one thread per output. Both mirror op_lora_down / op_lora_up of
 * common/ops.h, summing in float32. */
#include "common/cuda/block_sum.cuh"
#include "common/cuda/cuda_internal.h"
#include "common/cuda/ops_cuda.h"
#include "common/cuda/pdl.cuh"

enum { DOWN_THREADS = 128, UP_THREADS = 256 };

/* Row i's adapter slot, or -1 for none. */
static __device__ __forceinline__ int row_slot(const cuda_lora &l, int i)
{
    const int k = l.adapter[i];
    return k >= 0 && k < CUDA_LORA_ADAPTERS ? k : -1;
}

__global__ void __launch_bounds__(DOWN_THREADS) lora_down_kernel(const cuda_lora l)
{
    pdl_launch_dependents();
    pdl_wait();
    const int i = blockIdx.x, j = blockIdx.y / l.rank_max, r = blockIdx.y % l.rank_max;
    float *t = l.t + ((size_t)i * l.n_targets + j) * l.rank_max + r;
    const int k = row_slot(l, i);
    const float *a = k >= 0 && r < l.rank[k] ? l.target[j].a[k] : NULL;
    if (!a) {
        if (threadIdx.x == 0) *t = 0.0f;
        return;
    }
    a += (size_t)r * l.in;
    const float *x = l.x + (size_t)i * l.x_stride;
    float s = 0.0f;
    for (int c = threadIdx.x; c < l.in; c += blockDim.x)
        s = fmaf(x[c], a[c], s);
    s = block_sum(s);
    if (threadIdx.x == 0) *t = s;
}

__global__ void __launch_bounds__(UP_THREADS) lora_up_kernel(const cuda_lora l, int total_out)
{
    pdl_launch_dependents();
    pdl_wait();
    extern __shared__ float ts[];
    const int i = blockIdx.x, k = row_slot(l, i);
    if (k < 0) return;
    const int width = l.n_targets * l.rank_max;
    const float *trow = l.t + (size_t)i * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x)
        ts[c] = trow[c];
    __syncthreads();
    int o = blockIdx.y * blockDim.x + threadIdx.x;
    if (o >= total_out) return;
    int j = 0;
    while (j < l.n_targets - 1 && o >= l.target[j].out) {
        o -= l.target[j].out;
        j++;
    }
    const cuda_lora_target &tg = l.target[j];
    const float *b = tg.b[k];
    if (!b) return;
    const int R = l.rank[k];
    b += (size_t)o * R;
    const float *tj = ts + j * l.rank_max;
    float s = 0.0f;
    for (int r = 0; r < R; r++)
        s = fmaf(tj[r], b[r], s);
    float *y = l.y + (size_t)i * l.y_stride + tg.y_offset + (size_t)o * tg.y_step;
    *y += l.scale[k] * s;
}

static int lora_check(const struct cuda_lora *l, const char *what)
{
    if (!l || l->n_rows < 1 || l->in < 1 || l->n_targets < 1 || l->n_targets > CUDA_LORA_TARGETS ||
        l->rank_max < 1 || l->rank_max > CUDA_LORA_MAX_RANK)
        return mm3_errorf(-EINVAL, "%s: %d rows, in %d, %d targets, rank_max %d: expected rows >= 1, in >= 1, "
                                   "1..%d targets, rank_max 1..%d",
                          what, l ? l->n_rows : 0, l ? l->in : 0, l ? l->n_targets : 0, l ? l->rank_max : 0,
                          CUDA_LORA_TARGETS, CUDA_LORA_MAX_RANK);
    if (!l->adapter || !l->x || !l->t || !l->y) return mm3_errorf(-EINVAL, "%s: NULL pointer", what);
    for (int k = 0; k < CUDA_LORA_ADAPTERS; k++)
        if (l->rank[k] < 0 || l->rank[k] > l->rank_max)
            return mm3_errorf(-EINVAL, "%s: slot %d has rank %d, expected 0..%d", what, k, l->rank[k], l->rank_max);
    for (int j = 0; j < l->n_targets; j++)
        if (l->target[j].out < 1 || l->target[j].y_step < 1 || l->target[j].y_offset < 0)
            return mm3_errorf(-EINVAL, "%s: target %d has %d outputs at offset %d step %d", what, j, l->target[j].out,
                              l->target[j].y_offset, l->target[j].y_step);
    return 0;
}

extern "C" int cuda_ops_lora_down(const struct cuda_lora *l, void *stream)
{
    int rc = lora_check(l, "cuda_ops_lora_down");
    if (rc < 0) return rc;
    dim3 grid((unsigned)l->n_rows, (unsigned)(l->n_targets * l->rank_max));
    return launch_pdl("lora_down_kernel", lora_down_kernel, grid, dim3(DOWN_THREADS), 0, cuda_stream_of(stream), *l);
}

extern "C" int cuda_ops_lora_up(const struct cuda_lora *l, void *stream)
{
    int rc = lora_check(l, "cuda_ops_lora_up");
    if (rc < 0) return rc;
    int total = 0;
    for (int j = 0; j < l->n_targets; j++)
        total += l->target[j].out;
    dim3 grid((unsigned)l->n_rows, (unsigned)((total + UP_THREADS - 1) / UP_THREADS));
    size_t smem = sizeof(float) * (size_t)l->n_targets * l->rank_max;
    return launch_pdl("lora_up_kernel", lora_up_kernel, grid, dim3(UP_THREADS), smem, cuda_stream_of(stream), *l,
                      total);
}
