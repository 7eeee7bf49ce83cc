/* Free and total memory of the current CUDA device (cudaMemGetInfo), for the
 * start-up memory plan. Only compiled with CUDA. */
#ifndef MM3_STAGE0_CUDA_DEVICE_MEMORY_H
#define MM3_STAGE0_CUDA_DEVICE_MEMORY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 0, or -EIO with a message naming the CUDA error. */
int stage0_cuda_device_memory(size_t *free_bytes, size_t *total_bytes);

#ifdef __cplusplus
}
#endif

#endif
