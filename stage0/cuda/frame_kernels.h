/* Small kernels of the batched frame step (stage0/cuda/frame_cuda.h): the drawn
 * codes into the codes array and into the next depth input, the frame feedback
 * embedding. C-callable; device pointers; `stream` is a
 * cudaStream_t as void * (NULL = default stream). Return 0 or a negative errno
 * code with a message (common/error.h). Embedding tables are bf16 [rows][width]. */
#ifndef MM3_STAGE0_CUDA_FRAME_KERNELS_H
#define MM3_STAGE0_CUDA_FRAME_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* For every pair p < n: codes[p * ncb + j] = col[p]; when table is not NULL, rows
 * 2p and 2p+1 of x[2n, width] = table[col[p] + col_offset] widened to float32 (the
 * index clamped into [0, table_rows): a stop column's pair is discarded by the host
 * but must not read outside the table); when dh is not NULL, dh[p * dh_stride + i] =
 * y[2p * width + i] (the pair's conditional depth hidden, copied in the same launch). */
int frame_cuda_take_codes(int32_t *codes, int ncb, int j, const int *col, int n, float *x, const uint16_t *table,
                          int table_rows, int col_offset, int width, float *dh, size_t dh_stride, const float *y,
                          void *stream);

/* fb[p, i] = (e0[codes[p*ncb] - 1, i] + sum_{j=1..ncb-1} audio[(j-1)*V + codes[p*ncb+j], i]) * scale,
 * summed in talker_feedback_embedding's order with every operation rounded separately
 * (no fused multiply-add), so the result equals the CPU's bit for bit. */
int frame_cuda_feedback(float *fb, const int32_t *codes, int ncb, int n, const uint16_t *e0, int e0_rows,
                        const uint16_t *audio, int V, int width, float scale, void *stream);

#ifdef __cplusplus
}
#endif

#endif
