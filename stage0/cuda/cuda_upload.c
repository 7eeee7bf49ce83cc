#include "stage0/cuda/cuda_upload.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda/ops_cuda.h"
#include "common/dtype.h"
#include "common/error.h"

int cuda_alloc_list_add(struct cuda_alloc_list *l, void **out, size_t bytes)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        void **p = realloc(l->ptr, sizeof(void *) * (size_t)cap);
        if (!p) return mm3_errorf(-ENOMEM, "cuda upload: out of host memory for the allocation list");
        l->ptr = p;
        l->cap = cap;
    }
    int rc = cuda_malloc(out, bytes ? bytes : 16);
    if (rc < 0) return rc;
    l->ptr[l->n++] = *out;
    return 0;
}

int cuda_upload_stacked_bf16(struct cuda_alloc_list *l, uint16_t **out, const float *const *parts, const size_t *rows,
                             int n_parts, size_t in)
{
    size_t total = 0;
    for (int i = 0; i < n_parts; i++)
        total += rows[i] * in;
    void *d;
    int rc = cuda_alloc_list_add(l, &d, total * sizeof(uint16_t));
    if (rc < 0) return rc;
    /* Converted in slices so that a release-sized tensor needs no second full copy on the host. */
    enum { SLICE = 1 << 22 };
    uint16_t *buf = malloc(sizeof(uint16_t) * (total < SLICE ? (total ? total : 1) : SLICE));
    if (!buf) return mm3_errorf(-ENOMEM, "cuda upload: out of host memory");
    size_t at = 0;
    for (int i = 0; i < n_parts && rc == 0; i++) {
        size_t n = rows[i] * in;
        for (size_t j = 0; j < n && rc == 0; j += SLICE) {
            size_t k = n - j < SLICE ? n - j : SLICE;
            for (size_t e = 0; e < k; e++)
                buf[e] = mm3_f32_to_bf16(parts[i][j + e]);
            rc = cuda_memcpy_h2d((uint16_t *)d + at + j, buf, k * sizeof(uint16_t));
        }
        at += n;
    }
    free(buf);
    *out = d;
    return rc;
}

int cuda_upload_interleaved_bf16(struct cuda_alloc_list *l, uint16_t **out, const float *a, const float *b, size_t rows,
                                 size_t in)
{
    void *d;
    int rc = cuda_alloc_list_add(l, &d, 2 * rows * in * sizeof(uint16_t));
    if (rc < 0) return rc;
    /* A few rows at a time: no second full copy of a release-sized pair on the host. */
    size_t batch = ((size_t)1 << 22) / (2 * in) + 1;
    uint16_t *buf = malloc(sizeof(uint16_t) * 2 * in * batch);
    if (!buf) return mm3_errorf(-ENOMEM, "cuda upload: out of host memory");
    for (size_t r0 = 0; r0 < rows && rc == 0; r0 += batch) {
        size_t k = rows - r0 < batch ? rows - r0 : batch;
        for (size_t r = 0; r < k; r++)
            for (size_t e = 0; e < in; e++) {
                buf[(2 * r) * in + e] = mm3_f32_to_bf16(a[(r0 + r) * in + e]);
                buf[(2 * r + 1) * in + e] = mm3_f32_to_bf16(b[(r0 + r) * in + e]);
            }
        rc = cuda_memcpy_h2d((uint16_t *)d + 2 * r0 * in, buf, 2 * k * in * sizeof(uint16_t));
    }
    free(buf);
    *out = d;
    return rc;
}

int cuda_upload_bf16(struct cuda_alloc_list *l, uint16_t **out, const float *src, size_t n)
{
    size_t rows = 1;
    return cuda_upload_stacked_bf16(l, out, &src, &rows, 1, n);
}

int cuda_upload_f32(struct cuda_alloc_list *l, float **out, const float *src, size_t n)
{
    void *d;
    int rc = cuda_alloc_list_add(l, &d, n * sizeof(float));
    if (rc < 0) return rc;
    *out = d;
    return n ? cuda_memcpy_h2d(d, src, n * sizeof(float)) : 0;
}

void cuda_alloc_list_free(struct cuda_alloc_list *l)
{
    for (int i = 0; i < l->n; i++)
        cuda_free(l->ptr[i]);
    free(l->ptr);
    memset(l, 0, sizeof *l);
}
