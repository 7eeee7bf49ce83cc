/* Programmatic dependent launch (Hopper): a decode step is hundreds of short
 * kernels, and between two of them the GPU idles for the launch and the ramp of
 * the next one. A kernel launched with launch_pdl may start while the one before
 * it is still running; it must call pdl_wait() before it reads anything an
 * earlier kernel wrote and before it writes anything. Weight streams depend on no
 * earlier kernel, so the GEMVs issue their first weight loads before the wait and
 * the stream continues across kernel boundaries.
 *
 * Every kernel calls pdl_launch_dependents() at its start: the next kernel's
 * blocks may then be placed as soon as all of this one's are (its wait still
 * holds it until this one has finished and its writes are visible). Both
 * instructions are no-ops for a kernel launched without the attribute.
 * MM3_PDL=0 in the environment launches everything plainly (for comparison). */
#ifndef MM3_PDL_CUH
#define MM3_PDL_CUH

#include <utility>

#include "common/cuda/cuda_internal.h"

extern "C" int cuda_pdl_enabled(void);

__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Fills attr with the PDL attribute when enabled; returns how many were filled. */
static inline unsigned pdl_attr(cudaLaunchAttribute *attr)
{
    if (!cuda_pdl_enabled()) return 0;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    return 1;
}

/* kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when `pdl` (and
 * MM3_PDL allows it) and, for cluster_y > 0, thread-block clusters of (1, cluster_y, 1);
 * `name` names the launch in the error message. */
template <typename... KArgs, typename... Args>
static inline int launch_ex(const char *name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                            cudaStream_t stream, int cluster_y, bool pdl, Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (cluster_y > 0) cuda_cluster_y_attr(&attr[n++], cluster_y);
    if (pdl) n += pdl_attr(&attr[n]);
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cuda_status(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name);
}

/* kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute. */
template <typename... KArgs, typename... Args>
static inline int launch_pdl(const char *name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, Args &&...args)
{
    return launch_ex(name, kernel, grid, block, smem, stream, 0, true, std::forward<Args>(args)...);
}

#endif
