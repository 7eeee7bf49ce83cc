/* Small kernels of the batched frame step (stage0/model/cuda/frame_cuda.h): the draw with
 * its codes into the codes array and into the next depth input, the frame feedback
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

/* One block per pair p < n: the pair's draw (cuda_sampler_draw_pairs's contract for
 * logits .. mask_col0, rows of n_cols columns, ld = n_cols), then with its column c:
 * codes[p * ncb + j] = c; when table is not NULL, rows 2p and 2p+1 of x[2n, width] =
 * table[c + col_offset] widened to float32 (the index clamped into [0, table_rows): a
 * stop column's pair is discarded by the host but must not read outside the table);
 * (table_f32 instead: its float32 rows as they are; x may then be the rows h, read
 * before x is written; and with table2 also rows 2p and 2p+1 of x2[2n, width2] =
 * table2's row of the same index, float32, width2 a multiple of 4, both 16-byte
 * aligned); when dh is not NULL, dh[p * dh_stride + i] = the pair's conditional row h[2p], RMS-
 * normed with norm_w and eps as cuda_ops_rmsnorm (copied as is when norm_w is NULL);
 * when copy_dst is not NULL, its rows 2p and 2p+1 = copy_src's. One launch for what was
 * the draw, a norm and a copy kernel. */
struct frame_draw_take {
    const float *logits;
    int n_cols, c0_rule, top_k;
    const float *scale;
    const uint64_t *seed;
    const uint32_t *pos;
    const unsigned char *mask_col0;
    int32_t *codes;
    int ncb, j, width;
    const uint16_t *table;
    const float *table_f32;
    int table_rows, col_offset;
    float *x;
    const float *table2;
    float *x2;
    int width2;
    float *dh;
    size_t dh_stride;
    const float *h, *norm_w;
    float eps;
    float *copy_dst;
    const float *copy_src;
};
int frame_cuda_draw_take(const struct frame_draw_take *a, int n, void *stream);
/* Largest n_cols frame_cuda_draw_take accepts on the current device (0 on a CUDA error). */
int frame_cuda_draw_take_max_cols(void);

/* The embedding tables of the frame feedback (bf16 rows of width values) and its scale. */
struct frame_feedback_tables {
    const uint16_t *e0; /* [e0_rows][width]: the first codebook's, row code - 1 */
    int e0_rows;
    const uint16_t *audio; /* [(ncb - 1) * V][width]: codebook j's rows from (j - 1) * V */
    int V, width;
    float scale;
};

/* fb[p, i] = (e0[codes[p*ncb] - 1, i] + sum_{j=1..ncb-1} audio[(j-1)*V + codes[p*ncb+j], i]) * scale
 * for p < n, with the tables t, summed in talker_feedback_embedding's order with every
 * operation rounded separately (no fused multiply-add), so the result equals the CPU's
 * bit for bit. */
int frame_cuda_feedback(float *fb, const int32_t *codes, int ncb, int n, const struct frame_feedback_tables *t,
                        void *stream);

#ifdef __cplusplus
}
#endif

#endif
