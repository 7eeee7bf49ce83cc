/* Hopper's copy engine (the tensor memory accelerator) and the shared-memory barriers
 * that count its bytes, as the decode GEMV (gemv_tma.cu) and the read-rate kernels
 * (read_bench.cu) use them. C++/CUDA only.
 *
 * A ring stage is "full" when its mbarrier has seen the producer's arrival and every
 * byte the producer announced (expect_tx) has landed; "empty" when every consumer
 * that reads it has arrived. Consumers of other blocks of a cluster arrive remotely
 * (mapa), because a multicast copy writes the same stage in all of them. */
#ifndef MM3_CUDA_TMA_CUH
#define MM3_CUDA_TMA_CUH

#include <cuda.h>
#include <stdint.h>

/* A tensor map of rank 2 or 3: dims[0] elements contiguous, dimension i > 0 strides[i - 1]
 * bytes apart, read in boxes of box[] elements (landing dimension 0 fastest); elements
 * outside the dims read as zero. Host side (tensor_map.cu); error code with a message. */
int cuda_tensor_map(CUtensorMap *map, CUtensorMapDataType type, int rank, const void *base, const uint64_t *dims,
                    const uint64_t *strides, const unsigned *box, CUtensorMapSwizzle swizzle);

__device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}

/* After every mbar_init of a block, before other blocks of its cluster (or its copy
 * engine) may touch the barriers. */
__device__ __forceinline__ void mbar_init_fence(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* Until the phase of parity `parity` has completed; cluster scope when arrivals come
 * from other blocks. */
template <bool CLUSTER = false> __device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
    unsigned done = 0;
    while (!done) {
        if (CLUSTER)
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                         " selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done)
                         : "r"(smem_u32(b)), "r"(parity)
                         : "memory");
        else
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                         " selp.u32 %0, 1, 0, p;\n}"
                         : "=r"(done)
                         : "r"(smem_u32(b)), "r"(parity)
                         : "memory");
    }
}

/* The producer's arrival, announcing the bytes the copies of this phase bring. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}

/* An arrival on the barrier at the same place in block `rank` of the cluster. */
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *b, unsigned rank)
{
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(b)), "r"(rank));
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

/* The box at (c0 inner, c1 outer) into this block's shared memory. */
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
                 : "memory");
}

/* The same box into the same place of every block of the cluster in `mask`, each
 * block's barrier at `bar`'s place counting the bytes. */
__device__ __forceinline__ void tma_load_2d_multicast(void *dst, const CUtensorMap *map, int c0, int c1, uint64_t *bar,
                                                      uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                 "[%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(mask)
                 : "memory");
}

/* The 3-D box at (c0, c1, c2): into this block's shared memory, or (mask != 0) into the
 * same place of every block of the cluster in `mask`. */
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, int c0, int c1, int c2, uint64_t *bar,
                                            uint16_t mask)
{
    if (mask)
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
                     "[%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(smem_u32(dst)),
                     "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar)), "h"(mask)
                     : "memory");
    else
        asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
                     "[%0], [%1, {%2, %3, %4}], [%5];" ::"r"(smem_u32(dst)),
                     "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
                     : "memory");
}

/* One contiguous run of `bytes` (a multiple of 16) into this block's shared memory. */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

#endif
