/* cudaMemGetInfo behind a C prototype (stage0/model/cuda/device_memory.h). */
#include "common/cuda/cuda_internal.h"
#include "stage0/model/cuda/device_memory.h"

extern "C" int stage0_cuda_device_memory(size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    int rc = cuda_status(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    if (rc < 0) return rc;
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}
