/* Tensor maps for the copy engine (tma.cuh). The encoder is a driver function; the
 * runtime hands out its entry point, so nothing links against libcuda. */
#include <pthread.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/tma.cuh"

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static encode_tiled_fn encode_tiled;
static pthread_once_t encode_once = PTHREAD_ONCE_INIT;

static void encode_lookup(void)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        encode_tiled = (encode_tiled_fn)fn;
    else
        (void)cudaGetLastError();
}

int cuda_tensor_map_2d(CUtensorMap *map, CUtensorMapDataType type, const void *base, uint64_t inner, uint64_t outer,
                       uint64_t row_bytes, unsigned box_inner, unsigned box_outer, CUtensorMapSwizzle swizzle)
{
    pthread_once(&encode_once, encode_lookup);
    if (!encode_tiled) return mm3_errorf(-ENODEV, "tensor map: the driver has no cuTensorMapEncodeTiled");
    const cuuint64_t dims[2] = {inner, outer}, strides[1] = {row_bytes};
    const cuuint32_t box[2] = {box_inner, box_outer}, elem_strides[2] = {1, 1};
    CUresult r = encode_tiled(map, type, 2, (void *)base, dims, strides, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return mm3_errorf(-EINVAL,
                          "tensor map of [%llu, %llu] (row %llu bytes) in boxes of [%u, %u]: driver error %d",
                          (unsigned long long)outer, (unsigned long long)inner, (unsigned long long)row_bytes,
                          box_outer, box_inner, (int)r);
    return 0;
}
