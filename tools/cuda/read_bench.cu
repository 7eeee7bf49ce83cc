/* Read-rate kernels for mm3-bench-ops --read-patterns: how fast one block per SM can
 * stream a bf16 weight matrix [rows, 4096] into the SM by each way the decode kernels
 * (or candidates for them) read weights. Nothing is computed; each block folds what
 * it read into one word so the reads cannot be dropped.
 *
 * Benchmark-only (never linked into the stages): these kernels separate the access
 * pattern and the copy mechanism from everything else a decode kernel does
 * (docs/performance.md). */
#include <cuda.h>
#include <stdint.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/gemv_mma.cuh" /* mma_weight_load: the decode GEMVs' weight load */
#include "tools/cuda/read_bench.h"

enum {
    RB_THREADS = 256,
    RB_K = 4096,    /* row width in bf16 (8 KiB rows) */
    RB_TILE = 16,   /* rows per tile */
    RB_CHUNK = 512, /* k per chunk of a tile: 16 KiB */
    RB_STAGES = 8,  /* ring stages of the copy-engine patterns */
    RB_STAGE = RB_TILE * RB_CHUNK * 2,
};

__device__ __forceinline__ unsigned rb_fold(uint4 v)
{
    return v.x ^ v.y ^ v.z ^ v.w;
}

/* Block b reads the b-th contiguous part, 8 loads of 16 bytes in flight per thread. */
__global__ void __launch_bounds__(RB_THREADS) rb_contiguous(const uint4 *w, size_t n16, unsigned *sink)
{
    const size_t per = (n16 + gridDim.x - 1) / gridDim.x, b0 = blockIdx.x * per;
    const size_t e = b0 + per < n16 ? b0 + per : n16;
    unsigned f = 0;
    for (size_t i = b0 + threadIdx.x; i < e; i += 8 * RB_THREADS) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++)
            v[u] = i + u * RB_THREADS < e ? mma_weight_load(w + i + u * RB_THREADS) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 8; u++)
            f ^= rb_fold(v[u]);
    }
    if (f == 0x12345678u) sink[blockIdx.x] = f; /* practically never: keeps the loads */
}

/* Tiles of 16 rows round robin over the blocks, each read chunk by chunk ([16 rows][512
 * k], 16 KiB): 4 loads per thread per chunk, two chunks (8 loads) in flight. */
__global__ void __launch_bounds__(RB_THREADS) rb_tiles(const uint16_t *w, int rows, unsigned *sink)
{
    const int tiles = rows / RB_TILE, chunks = RB_K / RB_CHUNK, per_row = RB_CHUNK / 8;
    unsigned f = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x)
        for (int c = 0; c < chunks; c += 2) {
            uint4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int p = threadIdx.x + (u & 3) * RB_THREADS, r = p / per_row,
                          k = (c + (u >> 2)) * RB_CHUNK + 8 * (p % per_row);
                v[u] = mma_weight_load((const uint4 *)(w + (size_t)(t * RB_TILE + r) * RB_K + k));
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                f ^= rb_fold(v[u]);
        }
    if (f == 0x12345678u) sink[blockIdx.x] = f;
}

__device__ __forceinline__ unsigned rb_smem(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void rb_wait(uint64_t *b, unsigned parity)
{
    unsigned done = 0;
    while (!done)
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(rb_smem(b)), "r"(parity)
            : "memory");
}

/* The copy engine into a ring of RB_STAGES 16 KiB stages, lane 0 of warp 0 issuing,
 * warp 1 releasing each stage as soon as it has landed. mode 0: the tiles' chunks as
 * tensor-map boxes of [16 rows][256 k] (two per stage); mode 1: one 16 KiB bulk copy of
 * contiguous memory per stage (what a tile-contiguous weight layout would allow). */
__global__ void __launch_bounds__(64)
    rb_copy_engine(const __grid_constant__ CUtensorMap map, const uint16_t *w, int rows, int mode, unsigned *sink)
{
    extern __shared__ __align__(128) unsigned char rb_dyn[];
    __shared__ __align__(8) uint64_t full[RB_STAGES], empty[RB_STAGES];
    unsigned char *ring = (unsigned char *)(((uintptr_t)rb_dyn + 127) & ~(uintptr_t)127);
    const int tiles = rows / RB_TILE, chunks = RB_K / RB_CHUNK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < RB_STAGES; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(rb_smem(&full[s])) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(rb_smem(&empty[s])) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    int u = 0;
    unsigned f = 0;
    if (threadIdx.x == 0) {
        for (int t = blockIdx.x; t < tiles; t += gridDim.x)
            for (int c = 0; c < chunks; c++, u++) {
                const int s = u % RB_STAGES;
                rb_wait(&empty[s], ((u / RB_STAGES) & 1) ^ 1);
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(rb_smem(&full[s])),
                             "r"((unsigned)RB_STAGE)
                             : "memory");
                unsigned char *dst = ring + (size_t)s * RB_STAGE;
                if (mode == 0) {
                    for (int b = 0; b < 2; b++)
                        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                                     "[%0], [%1, {%2, %3}], [%4];" ::"r"(rb_smem(dst + b * RB_STAGE / 2)),
                                     "l"((uint64_t)&map), "r"(c * RB_CHUNK + b * RB_CHUNK / 2), "r"(t * RB_TILE),
                                     "r"(rb_smem(&full[s]))
                                     : "memory");
                } else {
                    const uint16_t *src = w + ((size_t)t * chunks + c) * (RB_STAGE / 2);
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
                                 "[%3];" ::"r"(rb_smem(dst)),
                                 "l"(src), "r"((unsigned)RB_STAGE), "r"(rb_smem(&full[s]))
                                 : "memory");
                }
            }
    } else if (threadIdx.x == 32) {
        for (int t = blockIdx.x; t < tiles; t += gridDim.x)
            for (int c = 0; c < chunks; c++, u++) {
                const int s = u % RB_STAGES;
                rb_wait(&full[s], (u / RB_STAGES) & 1);
                f ^= *(const unsigned *)(ring + (size_t)s * RB_STAGE);
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(rb_smem(&empty[s])) : "memory");
            }
    }
    if (f == 0x12345678u) sink[blockIdx.x] = f;
}

typedef CUresult (*rb_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

extern "C" int cuda_read_bench_width(void)
{
    return RB_K;
}

extern "C" int cuda_read_bench(int pattern, const uint16_t *w, int rows, int blocks, unsigned *sink, void *stream)
{
    if (rows < RB_TILE || rows % RB_TILE || blocks < 1 || pattern < 0 || pattern > 3)
        return mm3_errorf(-EINVAL, "cuda_read_bench: pattern %d, %d rows, %d blocks: expected 0..3, a multiple of %d",
                          pattern, rows, blocks, RB_TILE);
    cudaStream_t st = cuda_stream_of(stream);
    if (pattern == 0) {
        rb_contiguous<<<blocks, RB_THREADS, 0, st>>>((const uint4 *)w, (size_t)rows * RB_K / 8, sink);
        return cuda_launch_status("rb_contiguous");
    }
    if (pattern == 1) {
        rb_tiles<<<blocks, RB_THREADS, 0, st>>>(w, rows, sink);
        return cuda_launch_status("rb_tiles");
    }
    /* The driver lookup, the kernel attribute and the tensor map once per matrix, not
     * per call: the timed calls are launches only (host work between the bench's events
     * would count as GPU time). */
    static rb_encode_fn encode;
    static struct {
        const uint16_t *w;
        int rows;
        CUtensorMap map;
    } cached;
    const int smem = RB_STAGES * RB_STAGE + 128;
    if (!encode) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !fn)
            return mm3_errorf(-ENODEV, "cuda_read_bench: no cuTensorMapEncodeTiled in the driver");
        int rc = cuda_status(cudaFuncSetAttribute(rb_copy_engine, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
                             "rb_copy_engine attributes");
        if (rc < 0) return rc;
        encode = (rb_encode_fn)fn;
    }
    if (cached.w != w || cached.rows != rows) {
        const cuuint64_t dims[2] = {RB_K, (cuuint64_t)rows}, strides[1] = {RB_K * 2};
        const cuuint32_t box[2] = {RB_CHUNK / 2, RB_TILE}, es[2] = {1, 1};
        if (encode(&cached.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)w, dims, strides, box, es,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
            cached.w = NULL;
            return mm3_errorf(-EINVAL, "cuda_read_bench: tensor map of [%d, %d]", rows, RB_K);
        }
        cached.w = w;
        cached.rows = rows;
    }
    rb_copy_engine<<<blocks, 64, smem, st>>>(cached.map, w, rows, pattern - 2, sink);
    return cuda_launch_status("rb_copy_engine");
}
