/* Page-locked host buffers and the asynchronous copies that need them: a copy
 * from or to pageable memory is staged by the driver and returns only when done,
 * so a step that uploads, replays a CUDA graph and downloads on one stream with a
 * single sync needs pinned host ends. C-callable; `stream` is a cudaStream_t as
 * void * (NULL = default stream). Return 0 or a negative errno code with a message
 * (common/error.h). Only compiled with CUDA. */
#ifndef MM3_STAGE0_CUDA_HOST_PINNED_H
#define MM3_STAGE0_CUDA_HOST_PINNED_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* *out = bytes of page-locked host memory (NULL on failure). */
int host_pinned_alloc(void **out, size_t bytes);
void host_pinned_free(void *p); /* NULL is fine */

/* cudaMemcpyAsync on `stream`; the host end should be host_pinned_alloc memory. */
int host_pinned_h2d_async(void *dst, const void *src, size_t bytes, void *stream);
int host_pinned_d2h_async(void *dst, const void *src, size_t bytes, void *stream);
/* cudaMemcpy2DAsync: `height` rows of `width` bytes, source rows `spitch` bytes
 * apart, destination rows `dpitch` bytes apart; either end pinned host or device
 * memory (the direction from the addresses). */
int host_pinned_copy_2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              void *stream);

#ifdef __cplusplus
}
#endif

#endif
