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

/* The tensor-core GEMV of gemv_mma.cu (m_tiles 0 = default) with the epilogue and
 * norm of cuda_ops_gemv_bf16_fused (norm_w NULL: none). */
int gemv_mma_launch(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out, int m_tiles,
                    enum cuda_gemv_epi epi, const float *norm_w, float eps, cudaStream_t st);
/* gemv_xs.cu: the tensor-core GEMV with x staged in shared memory, which
 * gemv_mma_launch hands the shapes gemv_xs_serves says (same checks, same
 * arguments, no weight tile count). */
bool gemv_xs_serves(int n_rows, int in, int out);
int gemv_xs_launch(float *y, const float *x, const uint16_t *w, int n_rows, int in, int out, enum cuda_gemv_epi epi,
                   const float *norm_w, float eps, cudaStream_t st);

#endif
