/* Weight upload for the stage-0 GPU models, into device allocations recorded in a
 * list that frees them all at once.
 *
 * A matrix is named by the model field that holds (or would hold) it: when the
 * field is set, its host float32 rows are rounded to bf16 (exact for weights
 * widened from bf16 at load); when it is NULL, the model was loaded with its
 * matrices left in the checkpoint (talker_load_host_parts) and the rows are read
 * as bf16 straight from the checkpoint's bytes. Either way the rows pass through
 * two page-locked staging buffers: while one is copied to the device
 * (cudaMemcpyAsync), the next rows are read or converted into the other. The end
 * logs the bytes, the rate and where the time went (reading, waiting for copies,
 * allocating).
 *
 *     struct cuda_upload u;
 *     cuda_upload_begin(&u, &tc->mem, &m->deferred);
 *     rc = cuda_upload_matrix(&u, &G->wo, &L->wo, H, QD);
 *     ...
 *     rc = cuda_upload_end(&u, rc);   // waits for the copies, frees the staging
 */
#ifndef MM3_STAGE0_CUDA_UPLOAD_H
#define MM3_STAGE0_CUDA_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "common/checkpoint.h"
#include "common/weights.h"

struct cuda_alloc_list {
    void **ptr;
    int n, cap;
};

/* Device memory of `bytes`, recorded in the list. */
int cuda_alloc_list_add(struct cuda_alloc_list *l, void **out, size_t bytes);
void cuda_alloc_list_free(struct cuda_alloc_list *l);

/* src[n] -> device float32 (norms, tables: small, synchronous). */
int cuda_upload_f32(struct cuda_alloc_list *l, float **out, const float *src, size_t n);

struct cuda_upload {
    struct cuda_alloc_list *list;
    const struct weight_deferred *src; /* the model's deferred matrices; NULL: all on the host */
    struct ckpt_component ckpt;        /* src's component, opened at the first read */
    int ckpt_open;
    void *stage[2], *copied[2], *stream; /* staging buffers, their copies' events */
    int recorded[2], next;
    size_t stage_bytes;
    uint64_t ckpt_bytes;
    double t0, t_read, t_wait, t_alloc;
};

/* Bytes per staging buffer of later uploads (0: the default, 128 MiB). Tests shrink it
 * so that small matrices cross many chunks of the ring. */
void cuda_upload_set_stage_bytes(size_t bytes);

/* An upload into list l; src may be NULL (every matrix field set). */
void cuda_upload_begin(struct cuda_upload *u, struct cuda_alloc_list *l, const struct weight_deferred *src);
/* Wait for the copies and free the staging; returns rc, or the first error of the
 * wait when rc is 0. Logs what came from the checkpoint and how fast. */
int cuda_upload_end(struct cuda_upload *u, int rc);

/* The bf16 matrix [rows, in] of one field. */
int cuda_upload_matrix(struct cuda_upload *u, uint16_t **out, float *const *field, size_t rows, size_t in);
/* Fields stacked row-wise into one device matrix (a fused product's weights):
 * fields[i] has rows[i] rows of `in`. */
int cuda_upload_stacked(struct cuda_upload *u, uint16_t **out, float *const *const *fields, const size_t *rows,
                        int n_fields, size_t in);
/* Two fields of rows x in, their rows interleaved into one device matrix [2 rows, in]:
 * row 2j = a's row j, row 2j + 1 = b's (the gate/up layout of
 * cuda_ops_matmul_bf16_swiglu). */
int cuda_upload_interleaved(struct cuda_upload *u, uint16_t **out, float *const *a, float *const *b, size_t rows,
                            size_t in);
/* Host float32 rows that are no model field (a slice of a table) as bf16 [rows, in]. */
int cuda_upload_host_rows(struct cuda_upload *u, uint16_t **out, const float *src, size_t rows, size_t in);

#endif
