/* Device pieces shared by the two tensor-core GEMV kernels (gemv_mma.cu: x read
 * from global memory per weight tile; gemv_xs.cu: x staged in shared memory once
 * per block). C++/CUDA only. */
#ifndef MM3_CUDA_GEMV_MMA_CUH
#define MM3_CUDA_GEMV_MMA_CUH

#include <cooperative_groups.h>
#include <stdint.h>

#include "common/cuda/gemv_epi.cuh"
#include "common/cuda/mma_bf16.cuh"

enum { MMA_KSTEP = 32 }; /* k per step: a lane's 8 consecutive k (16 bytes) of 4 lanes */

/* A weight load, read once (evict first), with the L2 prefetch-size hint of 256
 * bytes: a lane reads 64 bytes of a row per k step, so L2 fetches the row's next
 * three steps with this one, which made the products and the frame faster at 16 rows
 * (docs/performance.md). */
__device__ __forceinline__ uint4 mma_weight_load(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.cs.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* A 16-byte copy global -> shared that holds no register while in flight (LDGSTS,
 * L1 bypassed, same L2 prefetch-size hint as mma_weight_load). */
__device__ __forceinline__ void mma_async_copy(void *dst, const void *src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}

__device__ __forceinline__ void mma_copy_commit(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> __device__ __forceinline__ void mma_copy_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* How x meets the bf16 tensor cores. X_SPLIT: float32 x as bf16 hi + lo parts, float32
 * accuracy, four MMAs per tile. X_ROUND: float32 x rounded to bf16 (the hi parts only,
 * two MMAs per tile), the precision of the reference, whose activations are bf16. x
 * stored in bf16 (half its bytes) was barely faster than rounding it here, so x stays
 * float32 in memory. */
enum { X_SPLIT = 0, X_ROUND = 1 };

/* gemv_epi_dispatch for the two tensor-core kernels, with how x meets them as a third
 * template argument: launch(epi, norm, x mode), X_ROUND where round, else X_SPLIT. */
template <typename Launch>
static int gemv_mma_dispatch(enum cuda_gemv_epi epi, bool norm, bool round, Launch &&launch)
{
    return gemv_epi_dispatch(epi, norm, [&](auto e, auto n) {
        return round ? launch(e, n, std::integral_constant<int, X_ROUND>{})
                     : launch(e, n, std::integral_constant<int, X_SPLIT>{});
    });
}

/* A lane's 8 x values of one row and k step (p, q) as B fragments: normed by the
 * norm weights (na, nb) when NORM, summing x^2 into ss first, then split into bf16
 * hi + lo (LO) or rounded to bf16 (bl untouched). */
template <bool NORM, bool LO>
__device__ __forceinline__ void mma_x_split(uint32_t (&bh)[4], uint32_t (&bl)[4], float &ss, float4 p, float4 q,
                                            float4 na, float4 nb)
{
    if (NORM) {
        ss = fmaf(p.x, p.x, fmaf(p.y, p.y, fmaf(p.z, p.z, fmaf(p.w, p.w, ss))));
        ss = fmaf(q.x, q.x, fmaf(q.y, q.y, fmaf(q.z, q.z, fmaf(q.w, q.w, ss))));
        p = make_float4(p.x * na.x, p.y * na.y, p.z * na.z, p.w * na.w);
        q = make_float4(q.x * nb.x, q.y * nb.y, q.z * nb.z, q.w * nb.w);
    }
    if constexpr (LO) {
        split_pair(p.x, p.y, &bh[0], &bl[0]);
        split_pair(p.z, p.w, &bh[1], &bl[1]);
        split_pair(q.x, q.y, &bh[2], &bl[2]);
        split_pair(q.z, q.w, &bh[3], &bl[3]);
    } else {
        bh[0] = round_pair(p.x, p.y);
        bh[1] = round_pair(p.z, p.w);
        bh[2] = round_pair(q.x, q.y);
        bh[3] = round_pair(q.z, q.w);
    }
}

/* The four MMAs of one 16-row weight tile and one x tile: k pairs (0,1),(2,3) of
 * the lane's 8 -> MMA 1; (4,5),(6,7) -> MMA 2; hi parts, then lo. a[h] is the
 * lane's 16 bytes of weight row g + 8h. */
__device__ __forceinline__ void mma_tile(float (&acc)[4], const uint4 (&a)[2], const uint32_t (&bh)[4],
                                         const uint32_t (&bl)[4])
{
    mma_bf16(acc, a[0].x, a[1].x, a[0].y, a[1].y, bh[0], bh[1]);
    mma_bf16(acc, a[0].z, a[1].z, a[0].w, a[1].w, bh[2], bh[3]);
    mma_bf16(acc, a[0].x, a[1].x, a[0].y, a[1].y, bl[0], bl[1]);
    mma_bf16(acc, a[0].z, a[1].z, a[0].w, a[1].w, bl[2], bl[3]);
}

/* The two MMAs of one 16-row weight tile and one x tile rounded to bf16 (X_ROUND). */
__device__ __forceinline__ void mma_tile_hi(float (&acc)[4], const uint4 (&a)[2], const uint32_t (&bh)[4])
{
    mma_bf16(acc, a[0].x, a[1].x, a[0].y, a[1].y, bh[0], bh[1]);
    mma_bf16(acc, a[0].z, a[1].z, a[0].w, a[1].w, bh[2], bh[3]);
}

/* The RMSNorm scale 1 / sqrt(mean(x^2) + eps) of row i from the x^2 sums the ks blocks
 * of a k-split cluster keep in block_ss (added in rank order: deterministic). */
__device__ __forceinline__ float mma_cluster_norm_scale(cooperative_groups::cluster_group &cluster, float *block_ss,
                                                        int ks, int i, int in, float eps)
{
    float v = 0.0f;
    for (int r = 0; r < ks; r++)
        v += cluster.map_shared_rank(block_ss, r)[i];
    return 1.0f / sqrtf(v / (float)in + eps);
}

#endif
