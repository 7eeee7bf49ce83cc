#include "stage0/model/cuda/cuda_upload.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/cuda/ops_cuda.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/log.h"
#include "common/lora_merge.h"
#include "stage0/model/cuda/host_pinned.h"

/* Per staging buffer. Each chunk is one file_reader batch, whose blocks run in
 * parallel: smaller chunks give the reads too little parallelism, larger ones gained
 * nothing (docs/performance.md, the weight upload). */
#define STAGE_BYTES ((size_t)128 << 20)

static size_t stage_bytes_set;

void cuda_upload_set_stage_bytes(size_t bytes)
{
    stage_bytes_set = bytes;
}

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

void cuda_alloc_list_free(struct cuda_alloc_list *l)
{
    for (int i = 0; i < l->n; i++)
        cuda_free(l->ptr[i]);
    free(l->ptr);
    memset(l, 0, sizeof *l);
}

int cuda_upload_f32(struct cuda_alloc_list *l, float **out, const float *src, size_t n)
{
    void *d;
    int rc = cuda_alloc_list_add(l, &d, n * sizeof(float));
    if (rc < 0) return rc;
    *out = d;
    return n ? cuda_memcpy_h2d(d, src, n * sizeof(float)) : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cuda_upload_begin(struct cuda_upload *u, struct cuda_alloc_list *l, const struct weight_deferred *src)
{
    memset(u, 0, sizeof *u);
    u->list = l;
    u->src = src;
    u->t0 = now_s();
}

static void stage_free(struct cuda_upload *u)
{
    for (int b = 0; b < 2; b++) {
        host_pinned_free(u->stage[b]);
        cuda_event_destroy(u->copied[b]);
        u->stage[b] = u->copied[b] = NULL;
    }
}

/* Staging buffers, events and stream at the first matrix (a model without
 * matrices pins nothing). */
static int stage_open(struct cuda_upload *u)
{
    if (u->stream) return 0;
    u->stage_bytes = stage_bytes_set ? stage_bytes_set : STAGE_BYTES;
    void *stream;
    int rc = cuda_stream_create(&stream);
    for (int b = 0; b < 2 && rc == 0; b++) {
        if ((rc = host_pinned_alloc(&u->stage[b], u->stage_bytes)) == 0) rc = cuda_event_create(&u->copied[b]);
    }
    if (rc < 0) { /* all or nothing: a stream means the staging is complete */
        stage_free(u);
        cuda_stream_destroy(stream);
        return rc;
    }
    u->stream = stream;
    return 0;
}

int cuda_upload_end(struct cuda_upload *u, int rc)
{
    if (u->stream) {
        int s = cuda_stream_sync(u->stream);
        if (rc == 0) rc = s;
    }
    stage_free(u);
    cuda_stream_destroy(u->stream);
    if (u->ckpt_open) ckpt_component_close(&u->ckpt);
    if (rc == 0 && u->ckpt_bytes) {
        double s = now_s() - u->t0;
        LOG_INFO("%s: %.1f MB of bf16 matrices from the checkpoint to the GPU in %.2f s (%.2f GB/s; reading %.2f s, "
                 "waiting for copies %.2f s, allocating %.2f s)",
                 u->src->component, (double)u->ckpt_bytes / 1e6, s, s > 0 ? (double)u->ckpt_bytes / s / 1e9 : 0.0,
                 u->t_read, u->t_wait, u->t_alloc);
    }
    memset(u, 0, sizeof *u);
    return rc;
}

/* Where rows come from: host float32, or rows [row0, row0 + rows) of a checkpoint tensor. */
struct rows_src {
    const float *host;
    const char *name;
    int64_t row0;
    size_t rows;
};

/* rows x in from src into dst, row r at dst + r * pitch (elements), through the
 * staging ring: buffer b is refilled only once its previous copy has finished. */
static int put_rows(struct cuda_upload *u, const struct rows_src *src, uint16_t *dst, size_t pitch, size_t in)
{
    int rc = stage_open(u);
    if (rc < 0 || src->rows == 0 || in == 0) return rc;
    size_t row_bytes = in * sizeof(uint16_t);
    if (row_bytes > u->stage_bytes)
        return mm3_errorf(-EINVAL, "cuda upload: a row of %zu values is wider than the %zu-byte staging buffer", in,
                          u->stage_bytes);
    size_t chunk = u->stage_bytes / row_bytes;
    for (size_t r0 = 0; r0 < src->rows && rc == 0; r0 += chunk) {
        size_t k = src->rows - r0 < chunk ? src->rows - r0 : chunk;
        int b = u->next;
        u->next ^= 1;
        double t = now_s();
        if (u->recorded[b] && (rc = cuda_event_sync(u->copied[b])) < 0) break;
        u->t_wait += now_s() - t;
        uint16_t *stage = u->stage[b];
        if (src->host) {
            const float *h = src->host + r0 * in;
            for (size_t e = 0; e < k * in; e++)
                stage[e] = mm3_f32_to_bf16(h[e]);
        } else {
            t = now_s();
            /* Through the LoRA merge: adapters registered for this component are added here. */
            rc = lora_merge_read_rows_bf16(&u->ckpt, src->name, src->row0 + (int64_t)r0, (int64_t)k, stage);
            if (rc < 0) break;
            u->t_read += now_s() - t;
            u->ckpt_bytes += k * row_bytes;
        }
        uint16_t *d = dst + r0 * pitch;
        /* The gate/up interleave spreads rows over a pitch: the copy engine does it
         * (as fast as a contiguous copy here: the reads are the limit). */
        if (pitch == in)
            rc = host_pinned_h2d_async(d, stage, k * row_bytes, u->stream);
        else
            rc = host_pinned_copy_2d_async(d, pitch * sizeof(uint16_t), stage, row_bytes, row_bytes, k, u->stream);
        if (rc == 0 && (rc = cuda_event_record(u->copied[b], u->stream)) == 0) u->recorded[b] = 1;
    }
    return rc;
}

/* Every row of one field, rows x in, into dst with row pitch `pitch`. */
static int put_field(struct cuda_upload *u, float *const *field, size_t rows, size_t in, uint16_t *dst, size_t pitch)
{
    if (*field) return put_rows(u, &(struct rows_src){.host = *field, .rows = rows}, dst, pitch, in);
    int n = 0;
    const struct weight_spec *s = u->src ? weight_deferred_find(u->src, field, &n) : NULL;
    if (!s) return mm3_errorf(-EINVAL, "cuda upload: a matrix of %zu x %zu is neither in host memory nor deferred", rows, in);
    int rc = 0;
    if (!u->ckpt_open) {
        if ((rc = ckpt_component_open(&u->ckpt, u->src->root, u->src->component)) < 0) return rc;
        u->ckpt_open = 1;
    }
    /* A field may span several entries (rows of one tensor, or stacked tensors). */
    size_t at = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        size_t cols = 1, r = s[i].kind == WEIGHT_ROWS ? (size_t)s[i].n_rows : (size_t)s[i].shape[0];
        for (int d = 1; d < s[i].ndim; d++)
            cols *= (size_t)s[i].shape[d];
        if (cols != in || at + r > rows)
            return mm3_errorf(-EINVAL, "cuda upload: '%s' (%zu rows of %zu) does not fit a %zu x %zu matrix at row %zu",
                              s[i].name, r, cols, rows, in, at);
        struct rows_src src = {.name = s[i].name, .row0 = s[i].kind == WEIGHT_ROWS ? s[i].row0 : 0, .rows = r};
        rc = put_rows(u, &src, dst + at * pitch, pitch, in);
        at += r;
    }
    if (rc == 0 && at != rows)
        rc = mm3_errorf(-EINVAL, "cuda upload: '%s' and the rows after it give %zu rows, expected %zu", s->name, at, rows);
    return rc;
}

static int alloc_bf16(struct cuda_upload *u, uint16_t **out, size_t n)
{
    void *d;
    double t = now_s();
    int rc = cuda_alloc_list_add(u->list, &d, n * sizeof(uint16_t));
    u->t_alloc += now_s() - t;
    *out = rc < 0 ? NULL : d;
    return rc;
}

int cuda_upload_stacked(struct cuda_upload *u, uint16_t **out, float *const *const *fields, const size_t *rows,
                        int n_fields, size_t in)
{
    size_t total = 0;
    for (int i = 0; i < n_fields; i++)
        total += rows[i];
    int rc = alloc_bf16(u, out, total * in);
    size_t at = 0;
    for (int i = 0; i < n_fields && rc == 0; i++) {
        rc = put_field(u, fields[i], rows[i], in, *out + at * in, in);
        at += rows[i];
    }
    return rc;
}

int cuda_upload_matrix(struct cuda_upload *u, uint16_t **out, float *const *field, size_t rows, size_t in)
{
    return cuda_upload_stacked(u, out, &field, &rows, 1, in);
}

int cuda_upload_interleaved(struct cuda_upload *u, uint16_t **out, float *const *a, float *const *b, size_t rows,
                            size_t in)
{
    int rc = alloc_bf16(u, out, 2 * rows * in);
    if (rc == 0) rc = put_field(u, a, rows, in, *out, 2 * in);
    if (rc == 0) rc = put_field(u, b, rows, in, *out + in, 2 * in);
    return rc;
}

int cuda_upload_host_rows(struct cuda_upload *u, uint16_t **out, const float *src, size_t rows, size_t in)
{
    int rc = alloc_bf16(u, out, rows * in);
    if (rc == 0) rc = put_rows(u, &(struct rows_src){.host = src, .rows = rows}, *out, in, in);
    return rc;
}
