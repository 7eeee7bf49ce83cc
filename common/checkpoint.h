/* The released checkpoint layout (diffusers modular): a root folder with
 * modular_model_index.json and one sub-folder per component, each holding
 * config.json and either one *.safetensors file or shards listed in a
 * *.safetensors.index.json. A stage opens only the components it needs.
 *
 * Typical model loading (config / weights / state, weights in one allocation):
 *
 *     struct ckpt_component c;
 *     if ((rc = ckpt_component_open(&c, root, "transformer")) < 0) return rc;
 *     ckpt_config_int(&c, "num_layers", &n_layers);          // sizes from config.json
 *     float *arena = malloc(total_floats * 4);                // one allocation, carved
 *     ckpt_read_f32(&c, "proj_in.weight", w->proj_in, 2, (int64_t[]){d, in});  // shape checked
 *     ckpt_component_close(&c);
 *
 * Raw bytes at disk speed (e.g. bf16 weights for a GPU upload): ckpt_component_load()
 * reads every tensor through io_uring into c.arena, after which ckpt_find(&c, n)->data
 * points at tensor n (64-byte aligned) and ckpt_read_f32 converts from memory.
 * Layout, validation rules and measurements: docs/checkpoint.md. */
#ifndef MM3_CHECKPOINT_H
#define MM3_CHECKPOINT_H

#include <jansson.h>
#include <stdint.h>

#include "common/file_reader.h"
#include "common/safetensors.h"

struct ckpt_tensor {
    const struct st_tensor *st; /* name, dtype, shape, byte range */
    int file;                   /* index into ckpt_component.files */
    void *data;                 /* raw bytes in the arena after ckpt_component_load, else NULL */
};

struct ckpt_component {
    char *name;          /* "language_model" */
    char *dir;           /* root/name */
    json_t *config;      /* config.json (scheduler: scheduler_config.json) */
    int n_files;
    struct st_file *files;
    int n_tensors;
    struct ckpt_tensor *tensors; /* sorted by name */
    void *arena;                 /* ckpt_component_load: every tensor's raw bytes, one allocation */
    uint64_t arena_bytes;        /* bytes used (ckpt_component_arena_size) */
    uint64_t arena_mapped;       /* bytes mmap'ed by the loader; 0 when the caller owns the arena */
};

/* Open root/name: parse config.json (scheduler: scheduler_config.json, tokenizer:
 * tokenizer_config.json; neither has weights) and every safetensors header (validated). */
int ckpt_component_open(struct ckpt_component *c, const char *root, const char *name);
void ckpt_component_close(struct ckpt_component *c);

/* Bytes one arena for every tensor of c needs: each tensor's raw bytes starting on a
 * 64-byte boundary, in file order (shard by shard, by offset). */
uint64_t ckpt_component_arena_size(const struct ckpt_component *c);

/* Read every tensor's raw bytes (dtype as on disk) into one arena; afterwards each
 * ckpt_tensor.data points into c->arena, 64-byte aligned. Reads go through
 * file_reader (io_uring, pread fallback); bytes, seconds and GB/s are logged at
 * INFO. Loading twice is a no-op. */
int ckpt_component_load(struct ckpt_component *c);

/* Same, with reader options (NULL: defaults) and an optional caller-owned arena
 * (e.g. pinned host memory): buf of buf_bytes >= ckpt_component_arena_size(c),
 * 64-byte aligned, or NULL to let the loader map one. stats may be NULL. */
int ckpt_component_load_with(struct ckpt_component *c, const struct file_reader_opts *opts, void *buf,
                             uint64_t buf_bytes, struct file_reader_stats *stats);

/* Drop the arena (e.g. once the weights are on the GPU); headers and config stay. */
void ckpt_component_unload(struct ckpt_component *c);

/* Check root/modular_model_index.json: it exists, is a JSON object and has an
 * entry for each of components[0..n) whose folder exists. The error names the
 * first missing component. */
int ckpt_root_check(const char *root, const char *const *components, int n);

/* Tensor by name or NULL. */
const struct ckpt_tensor *ckpt_find(const struct ckpt_component *c, const char *name);

/* Tensor `name` into *out (may be NULL), its shape exactly shape[0..ndim) when ndim >= 0;
 * errors name the component, the tensor and both shapes. */
int ckpt_find_shaped(const struct ckpt_component *c, const char *name, int ndim, const int64_t *shape,
                     const struct ckpt_tensor **out);

/* Read a tensor widened to float32 into dst; if ndim >= 0 the shape must be exactly shape[0..ndim).
 * Errors name the component, the tensor and the shapes. Uses the arena if loaded. */
int ckpt_read_f32(const struct ckpt_component *c, const char *name, float *dst, int ndim, const int64_t *shape);

/* Bytes [offset, offset + nbytes) of tensor t as stored (from the arena if loaded,
 * else read through file_reader). -EINVAL naming the tensor when outside it. */
int ckpt_read_raw(const struct ckpt_component *c, const struct ckpt_tensor *t, uint64_t offset, uint64_t nbytes,
                  void *dst);

/* Rows [row0, row0 + n) of tensor `name` widened to float32 into dst (a row: the
 * product of every dimension after the first), read in slices as ckpt_read_f32. */
int ckpt_read_rows_f32(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n, float *dst);

/* Rows [row0, row0 + n) of tensor `name` as bf16 into dst (a row: the product of
 * every dimension after the first): BF16 bytes are read as stored, F32 and F16
 * rounded to nearest even (as mm3_f32_to_bf16). For GPU uploads of bf16 weights
 * without a float32 detour. Errors name the component, the tensor and the rows. */
int ckpt_read_rows_bf16(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n, uint16_t *dst);

/* config.json accessors; errors name "<dir>/config.json: key 'x': expected ..." */
int ckpt_config_int(const struct ckpt_component *c, const char *key, int64_t *out);
int ckpt_config_double(const struct ckpt_component *c, const char *key, double *out);
/* Integer array (e.g. upsampling_ratios); *n in: capacity, out: count. */
int ckpt_config_int_array(const struct ckpt_component *c, const char *key, int64_t *out, int *n);
/* RoPE base: top-level "rope_theta" or "rope_parameters": {"rope_theta": ...}. */
int ckpt_config_rope_theta(const struct ckpt_component *c, double *theta);

#endif
