/* The one place where a fused GEMV's runtime epilogue and norm become template
 * arguments: the float32 kernel (matmul_bf16.cu), the tensor-core kernel
 * (gemv_mma.cu) and the x-staged one (gemv_xs.cu) are instantiated for the same
 * five combinations the decode layers use. */
#ifndef MM3_GEMV_EPI_CUH
#define MM3_GEMV_EPI_CUH

#include <type_traits>

#include "common/cuda/ops_cuda.h"

template <int EPI> using gemv_epi_c = std::integral_constant<int, EPI>;

/* launch(gemv_epi_c<EPI>{}, std::bool_constant<NORM>{}) for the runtime (epi, norm):
 * with the norm, SwiGLU or store; without, SwiGLU, the residual add or store. A norm
 * with the residual add is refused before this by cuda_ops_gemv_fused_ok (or its
 * caller's argument check), so it is never asked for here. */
template <typename Launch> static int gemv_epi_dispatch(enum cuda_gemv_epi epi, bool norm, Launch &&launch)
{
    if (norm && epi == CUDA_GEMV_SWIGLU) return launch(gemv_epi_c<CUDA_GEMV_SWIGLU>{}, std::true_type{});
    if (norm) return launch(gemv_epi_c<CUDA_GEMV_STORE>{}, std::true_type{});
    if (epi == CUDA_GEMV_SWIGLU) return launch(gemv_epi_c<CUDA_GEMV_SWIGLU>{}, std::false_type{});
    if (epi == CUDA_GEMV_ADD) return launch(gemv_epi_c<CUDA_GEMV_ADD>{}, std::false_type{});
    return launch(gemv_epi_c<CUDA_GEMV_STORE>{}, std::false_type{});
}

#endif
