/* LoRA deltas for a batch whose rows use different adapters (ops_cuda.h): the down
 * product t = A x, one warp per row, target and rank index, then the up product
 * y += s B t, one thread per output over B transposed. Both mirror op_lora_down /
 * op_lora_up of common/ops.h, summing in float32. */
#include "common/cuda/cuda_internal.h"
#include "common/cuda/ops_cuda.h"
#include "common/cuda/pdl.cuh"

enum { DOWN_THREADS = 256, DOWN_WARPS = DOWN_THREADS / 32, UP_THREADS = 256 };

/* Row i's adapter slot, or -1 for none. */
static __device__ __forceinline__ int row_slot(const cuda_lora &l, int i)
{
    const int k = l.adapter[i];
    return k >= 0 && k < CUDA_LORA_ADAPTERS ? k : -1;
}

/* One warp per (row, target, rank index): the dot product of x's row with A's row,
 * float4 loads where `vec` (every row 16-byte aligned). */
__global__ void __launch_bounds__(DOWN_THREADS) lora_down_kernel(const cuda_lora l, int vec)
{
    pdl_launch_dependents();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const long w = (long)blockIdx.x * DOWN_WARPS + (threadIdx.x >> 5);
    const int per_row = l.n_targets * l.rank_max;
    if (w >= (long)l.n_rows * per_row) return;
    const int i = (int)(w / per_row), j = (int)(w % per_row) / l.rank_max, r = (int)(w % per_row) % l.rank_max;
    float *t = l.t + w;
    const int k = row_slot(l, i);
    const float *a = k >= 0 && r < l.rank[k] ? l.target[j].a[k] : NULL;
    if (!a) {
        if (lane == 0) *t = 0.0f;
        return;
    }
    a += (size_t)r * l.in;
    const float *x = l.x + (size_t)i * l.x_stride;
    float s = 0.0f;
    if (vec) {
        const float4 *a4 = (const float4 *)a, *x4 = (const float4 *)x;
        for (int c = lane; c < l.in / 4; c += 32) {
            const float4 av = a4[c], xv = x4[c];
            s = fmaf(xv.x, av.x, s);
            s = fmaf(xv.y, av.y, s);
            s = fmaf(xv.z, av.z, s);
            s = fmaf(xv.w, av.w, s);
        }
    } else {
        for (int c = lane; c < l.in; c += 32)
            s = fmaf(x[c], a[c], s);
    }
    for (int off = 16; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) *t = s;
}

/* One thread per (row, output): y += s sum_r t[r] B^T[r][o], B^T's rows read coalesced. */
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
    const float *bt = tg.bt[k];
    if (!bt) return;
    const int R = l.rank[k], out = tg.out;
    const float *tj = ts + j * l.rank_max;
    float s = 0.0f;
    for (int r = 0; r < R; r++)
        s = fmaf(tj[r], bt[(size_t)r * out + o], s);
    float *y = l.y + (size_t)i * l.y_stride + tg.y_offset + (size_t)o * tg.y_step;
    *y += l.scale[k] * s;
}

static int lora_check(const struct cuda_lora *l, const char *what)
{
    if (!l || l->n_rows < 1 || l->in < 1 || l->n_targets < 1 || l->n_targets > CUDA_LORA_TARGETS || l->rank_max < 1 ||
        l->rank_max > CUDA_LORA_MAX_RANK)
        return mm3_errorf(-EINVAL,
                          "%s: %d rows, in %d, %d targets, rank_max %d: expected rows >= 1, in >= 1, "
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
    long warps = (long)l->n_rows * l->n_targets * l->rank_max;
    int vec = l->in % 4 == 0 && l->x_stride % 4 == 0 && (uintptr_t)l->x % 16 == 0;
    for (int j = 0; j < l->n_targets; j++)
        for (int k = 0; k < CUDA_LORA_ADAPTERS; k++)
            vec = vec && (uintptr_t)l->target[j].a[k] % 16 == 0;
    dim3 grid((unsigned)((warps + DOWN_WARPS - 1) / DOWN_WARPS));
    return launch_pdl("lora_down_kernel", lora_down_kernel, grid, dim3(DOWN_THREADS), 0, cuda_stream_of(stream), *l,
                      vec);
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
