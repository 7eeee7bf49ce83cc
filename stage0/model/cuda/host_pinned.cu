#include "common/cuda/cuda_internal.h"
#include "stage0/model/cuda/host_pinned.h"

extern "C" int host_pinned_alloc(void **out, size_t bytes)
{
    *out = NULL;
    void *p = NULL;
    int rc = cuda_status(cudaHostAlloc(&p, bytes ? bytes : 16, cudaHostAllocDefault), "cudaHostAlloc");
    if (rc == 0) *out = p;
    return rc;
}

extern "C" void host_pinned_free(void *p)
{
    if (p) (void)cudaFreeHost(p);
}

extern "C" int host_pinned_h2d_async(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream_of(stream)),
                       "cudaMemcpyAsync (host to device)");
}

extern "C" int host_pinned_d2h_async(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream_of(stream)),
                       "cudaMemcpyAsync (device to host)");
}

extern "C" int host_pinned_copy_2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                         size_t height, void *stream)
{
    return cuda_status(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault,
                                         cuda_stream_of(stream)),
                       "cudaMemcpy2DAsync");
}
