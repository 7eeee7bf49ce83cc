/* safetensors files: header parsing with every byte validated, tensor reads.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {...}}, then the data section; offsets are relative to it.
 *
 * st_file_open() rejects: a header length past the end of the file or over
 * 100 MB, malformed JSON, an unknown dtype, a shape whose byte size differs from
 * end - begin, ranges outside the data section, overlapping ranges. */
#ifndef MM3_SAFETENSORS_H
#define MM3_SAFETENSORS_H

#include <stdint.h>
#include <stdio.h>

#include "common/dtype.h"

#define ST_MAX_DIMS 8

struct st_tensor {
    char *name;
    enum mm3_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset;   /* absolute byte offset in the file */
    uint64_t nbytes;
};

struct st_file {
    char *path;
    int fd;
    uint64_t file_size;
    uint64_t data_start; /* 8 + header length */
    int n_tensors;
    struct st_tensor *tensors; /* sorted by offset */
};

/* Open and validate; on error returns < 0 with a message naming the file. */
int st_file_open(struct st_file *f, const char *path);
/* The same on an open descriptor, which f then owns (closed by st_file_close, or at
 * once on error); path only names the file in messages. */
int st_file_open_fd(struct st_file *f, int fd, const char *path);
void st_file_close(struct st_file *f);

/* Tensor by name, or NULL. */
const struct st_tensor *st_file_find(const struct st_file *f, const char *name);

/* Element count of a tensor. */
uint64_t st_tensor_numel(const struct st_tensor *t);

/* Read a tensor's raw bytes into dst (t->nbytes bytes) with pread. */
int st_file_read(const struct st_file *f, const struct st_tensor *t, void *dst);

/* Read a tensor as float32 (BF16/F16/F32/I64 widened). If want_ndim >= 0 the shape
 * must equal want_shape[0..want_ndim). dst holds numel floats. */
int st_file_read_f32(const struct st_file *f, const char *name, float *dst, int want_ndim,
                     const int64_t *want_shape);

/* Read a whole tensor as a newly malloc'ed float32 array (caller frees); shape out. */
int st_file_load_f32(const struct st_file *f, const char *name, float **out, int *ndim,
                     int64_t shape[ST_MAX_DIMS]);

/* Format a shape as "[2, 3, 4]" into buf. */
const char *st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

/* ---- writing (checkpoint generator, tests) ---- */

struct st_writer_tensor {
    const char *name;
    enum mm3_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* nbytes = numel * dtype size */
};

/* Write a safetensors file with the tensors in the given order. */
int st_write_file(const char *path, const struct st_writer_tensor *tensors, int n,
                  const char *metadata_json);

#endif
