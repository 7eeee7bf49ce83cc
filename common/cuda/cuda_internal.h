/* Shared by the .cu files of common/cuda (C++ only, never included from C). */
#ifndef MM3_CUDA_INTERNAL_H
#define MM3_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/cuda/ops_cuda.h"
#include "common/error.h"
}

/* Turn a CUDA error into our error convention; `what` names the call site. */
static inline int cuda_status(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    /* Reset the runtime's last-error slot, or the next launch check would report
     * this (non-sticky) error again. */
    (void)cudaGetLastError();
    int code = e == cudaErrorMemoryAllocation ? -ENOMEM : -ENODEV;
    return mm3_errorf(code, "CUDA %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* After a launch: configuration errors surface here, faults only at the next sync. */
static inline int cuda_launch_status(const char *kernel)
{
    return cuda_status(cudaGetLastError(), kernel);
}

static inline cudaStream_t cuda_stream_of(void *stream)
{
    return (cudaStream_t)stream;
}

/* A cluster of (1, ks, 1) blocks as a launch attribute (the GEMVs' k splits). */
static inline void cuda_cluster_y_attr(cudaLaunchAttribute *a, int ks)
{
    a->id = cudaLaunchAttributeClusterDimension;
    a->val.clusterDim.x = 1;
    a->val.clusterDim.y = (unsigned)ks;
    a->val.clusterDim.z = 1;
}

/* Clusters of (1, ks, 1) blocks of `threads` threads and `dyn_smem` bytes of dynamic
 * shared memory that fit on the GPU at once; 1 where the runtime cannot say. */
template <typename K> static int cuda_resident_clusters_y(K kernel, int threads, int dyn_smem, int ks)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, (unsigned)ks, 1);
    cfg.blockDim = dim3((unsigned)threads, 1, 1);
    cfg.dynamicSmemBytes = (size_t)dyn_smem;
    cudaLaunchAttribute a;
    cuda_cluster_y_attr(&a, ks);
    cfg.attrs = &a;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess || n < 1) {
        (void)cudaGetLastError();
        n = 1;
    }
    return n;
}

/* The tensor-core GEMV of gemv_mma.cu (m_tiles 0 = default) for the product g of
 * cuda_ops_gemv_bf16_fused (g->norm_w NULL: no norm). */
int gemv_mma_launch(const struct cuda_gemv_fused *g, int m_tiles, cudaStream_t st);
/* gemv_xs.cu: the tensor-core GEMV with x staged in shared memory, to which
 * gemv_mma_launch hands the shapes gemv_xs_plan gives a k split (blocks per output
 * group, >= 1) for; 0: gemv_mma.cu serves the shape. gemv_xs_launch takes that split
 * and the arguments gemv_mma_launch has checked (no weight tile count). */
int gemv_xs_plan(int n_rows, int in, int out);
/* Whether the tensor-core GEMVs round x to bf16 at this row count (X_ROUND) rather
 * than split it (cuda_ops_gemv_set_x_round). */
bool gemv_x_round(int n_rows);
int gemv_xs_launch(const struct cuda_gemv_fused *g, int ks, cudaStream_t st);

#endif
