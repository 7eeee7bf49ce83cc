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

int cuda_tensor_map(CUtensorMap *map, CUtensorMapDataType type, int rank, const void *base, const uint64_t *dims,
                    const uint64_t *strides, const unsigned *box, CUtensorMapSwizzle swizzle)
{
    pthread_once(&encode_once, encode_lookup);
    if (!encode_tiled) return mm3_errorf(-ENODEV, "tensor map: the driver has no cuTensorMapEncodeTiled");
    if (rank < 2 || rank > 3) return mm3_errorf(-EINVAL, "tensor map: rank %d, expected 2 or 3", rank);
    cuuint64_t d[3], s[2];
    cuuint32_t b[3], elem_strides[3] = {1, 1, 1};
    for (int i = 0; i < rank; i++) {
        d[i] = dims[i];
        b[i] = box[i];
        if (i) s[i - 1] = strides[i - 1];
    }
    CUresult r = encode_tiled(map, type, (cuuint32_t)rank, (void *)base, d, s, b, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return mm3_errorf(-EINVAL,
                          "tensor map: dims [%llu, %llu, %llu] (strides %llu, %llu bytes) in boxes of [%u, %u, %u]: "
                          "driver error %d",
                          (unsigned long long)d[0], (unsigned long long)d[1],
                          (unsigned long long)(rank > 2 ? d[2] : 1), (unsigned long long)s[0],
                          (unsigned long long)(rank > 2 ? s[1] : 0), b[0], b[1], rank > 2 ? b[2] : 1, (int)r);
    return 0;
}
