/* Weight upload for the stage-0 GPU models: host float32 arrays (bf16 widened at
 * load, so the conversion back is exact) into device allocations recorded in a
 * list that frees them all at once. */
#ifndef MM3_STAGE0_CUDA_UPLOAD_H
#define MM3_STAGE0_CUDA_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

struct cuda_alloc_list {
    void **ptr;
    int n, cap;
};

/* Device memory of `bytes`, recorded in the list. */
int cuda_alloc_list_add(struct cuda_alloc_list *l, void **out, size_t bytes);
/* src[n] -> device bf16 (round to nearest even; exact for widened bf16). */
int cuda_upload_bf16(struct cuda_alloc_list *l, uint16_t **out, const float *src, size_t n);
/* Host float32 matrices stacked row-wise into one device bf16 matrix (a fused
 * product's weights): parts[i] has rows[i] rows of `in`. */
int cuda_upload_stacked_bf16(struct cuda_alloc_list *l, uint16_t **out, const float *const *parts, const size_t *rows,
                             int n_parts, size_t in);
/* Two host float32 matrices of rows x in, their rows interleaved into one device
 * bf16 matrix [2 rows, in]: row 2j = a's row j, row 2j + 1 = b's (the gate/up
 * layout of cuda_ops_matmul_bf16_swiglu). */
int cuda_upload_interleaved_bf16(struct cuda_alloc_list *l, uint16_t **out, const float *a, const float *b, size_t rows,
                                 size_t in);
/* src[n] -> device float32. */
int cuda_upload_f32(struct cuda_alloc_list *l, float **out, const float *src, size_t n);
void cuda_alloc_list_free(struct cuda_alloc_list *l);

#endif
