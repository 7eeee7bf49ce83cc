/* Sum of one float per thread over the whole block, for kernels that need a row's
 * sum of squares (RMSNorm) in one block. */
#ifndef MM3_BLOCK_SUM_CUH
#define MM3_BLOCK_SUM_CUH

/* Every thread gets the sum: lanes add within their warp, then the warps' partial sums
 * in warp order. Call from every thread of the block (it has barriers). */
static __device__ __forceinline__ float block_sum(float v)
{
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = (blockDim.x + 31) >> 5;
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads(); /* warp_sums may still be read by an earlier call */
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int k = 0; k < n_warps; k++)
        s += warp_sums[k];
    return s;
}

#endif
