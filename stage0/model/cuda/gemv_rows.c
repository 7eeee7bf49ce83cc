#include "stage0/model/cuda/gemv_rows.h"

#include <stddef.h>

static int slice_rows(int n, int r, int slice)
{
    return n - r < slice ? n - r : slice;
}

int gemv_rows(float *y, const float *x, const uint16_t *w, int n, int in, int out, void *stream)
{
    const int slice = cuda_ops_gemv_max_rows(in);
    for (int r = 0; r < n; r += slice) {
        int rc =
            cuda_ops_matmul_bf16(y + (size_t)r * out, x + (size_t)r * in, w, slice_rows(n, r, slice), in, out, stream);
        if (rc < 0) return rc;
    }
    return 0;
}

int gemv_rows_swiglu(float *y, float *gu, const float *x, const uint16_t *wgu, int n, int in, int ffn, void *stream)
{
    const int slice = cuda_ops_gemv_max_rows(in);
    for (int r = 0; r < n; r += slice) {
        int rc = cuda_ops_matmul_bf16_swiglu(y + (size_t)r * ffn, gu + (size_t)r * 2 * ffn, x + (size_t)r * in, wgu,
                                             slice_rows(n, r, slice), in, ffn, stream);
        if (rc < 0) return rc;
    }
    return 0;
}

int gemv_rows_fused(const struct cuda_gemv_fused *g, void *stream)
{
    const int slice = cuda_ops_gemv_max_rows(g->in);
    int y_width = g->epi == CUDA_GEMV_SWIGLU ? g->out / 2 : g->out;
    for (int r = 0; r < g->n_rows; r += slice) {
        struct cuda_gemv_fused part = *g;
        part.y = g->y + (size_t)r * y_width;
        part.x = g->x + (size_t)r * g->in;
        part.n_rows = slice_rows(g->n_rows, r, slice);
        int rc = cuda_ops_gemv_bf16_fused(&part, stream);
        if (rc < 0) return rc;
    }
    return 0;
}

int gemv_rows_fused_ok(int n, int in, int out, enum cuda_gemv_epi epi, int norm)
{
    const int slice = cuda_ops_gemv_max_rows(in);
    int full = n >= slice, rest = n % slice;
    return (!full || cuda_ops_gemv_fused_ok(slice, in, out, epi, norm)) &&
           (!rest || (cuda_ops_gemv_fused_ok(rest, in, out, epi, norm) && cuda_ops_gemv_fused_pays(rest)));
}
