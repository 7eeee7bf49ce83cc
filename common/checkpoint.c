#include "common/checkpoint.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/log.h"

#define CKPT_ALIGN 64u

static char *path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const struct ckpt_tensor *x = a, *y = b;
    return strcmp(x->st->name, y->st->name);
}

static int load_json_flags(const char *path, json_t **out, size_t flags)
{
    json_error_t e;
    *out = json_load_file(path, JSON_REJECT_DUPLICATES | flags, &e);
    if (!*out) {
        if (!file_exists(path)) return mm3_errorf(-ENOENT, "%s: missing", path);
        return mm3_errorf(-EINVAL, "%s:%d:%d: malformed JSON: %s", path, e.line, e.column, e.text);
    }
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return mm3_errorf(-EINVAL, "%s: expected a JSON object", path);
    }
    return 0;
}

static int load_json(const char *path, json_t **out)
{
    return load_json_flags(path, out, 0);
}

/* Shard file names from *.safetensors.index.json, or the single *.safetensors file. */
static int list_files(struct ckpt_component *c, char ***names, int *n, json_t **index)
{
    *names = NULL;
    *n = 0;
    *index = NULL;
    DIR *d = opendir(c->dir);
    if (!d) return mm3_errorf(-ENOENT, "%s: component folder missing", c->dir);
    char *index_name = NULL, *single = NULL;
    int n_single = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len > 23 && !strcmp(e->d_name + len - 23, ".safetensors.index.json")) {
            free(index_name);
            index_name = strdup(e->d_name);
        } else if (len > 12 && !strcmp(e->d_name + len - 12, ".safetensors")) {
            n_single++;
            free(single);
            single = strdup(e->d_name);
        }
    }
    closedir(d);
    int rc = 0;
    if (index_name) {
        char *ip = path_join(c->dir, index_name);
        rc = load_json(ip, index);
        if (rc == 0) {
            json_t *wm = json_object_get(*index, "weight_map");
            if (!json_is_object(wm)) {
                rc = mm3_errorf(-EINVAL, "%s: 'weight_map' must be an object of tensor name -> shard file", ip);
            } else {
                const char *key;
                json_t *v;
                *names = calloc(json_object_size(wm) + 1, sizeof(char *));
                json_object_foreach(wm, key, v) {
                    if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
                        rc = mm3_errorf(-EINVAL, "%s: weight_map['%s'] must be a shard file name", ip, key);
                        break;
                    }
                    int seen = 0;
                    for (int i = 0; i < *n && !seen; i++) seen = !strcmp((*names)[i], json_string_value(v));
                    if (!seen) (*names)[(*n)++] = strdup(json_string_value(v));
                }
            }
        }
        free(ip);
    } else if (n_single == 1) {
        *names = calloc(1, sizeof(char *));
        (*names)[0] = single;
        single = NULL;
        *n = 1;
    } else {
        rc = mm3_errorf(-ENOENT, "%s: expected one .safetensors file or a .safetensors.index.json, found %d files and no index",
                        c->dir, n_single);
    }
    free(index_name);
    free(single);
    return rc;
}

int ckpt_component_open(struct ckpt_component *c, const char *root, const char *name)
{
    memset(c, 0, sizeof *c);
    c->name = strdup(name);
    c->dir = path_join(root, name);
    const char *cfg_name = !strcmp(name, "scheduler")   ? "scheduler_config.json"
                           : !strcmp(name, "tokenizer") ? "tokenizer_config.json"
                                                        : "config.json";
    char *cfg = path_join(c->dir, cfg_name);
    /* tokenizer_config.json holds model_max_length = 1e30 written as an integer,
     * which jansson refuses as an integer; nothing there is read as an integer. */
    int rc = load_json_flags(cfg, &c->config, !strcmp(name, "tokenizer") ? JSON_DECODE_INT_AS_REAL : 0);
    free(cfg);
    if (rc < 0) goto fail;
    if (!strcmp(name, "scheduler") || !strcmp(name, "tokenizer")) return 0;

    char **names;
    int n;
    json_t *index;
    rc = list_files(c, &names, &n, &index);
    if (rc == 0) {
        c->files = calloc((size_t)n, sizeof *c->files);
        for (int i = 0; i < n; i++) {
            char *p = path_join(c->dir, names[i]);
            if (!file_exists(p)) rc = mm3_errorf(-ENOENT, "%s: shard listed in the index is missing", p);
            else rc = st_file_open(&c->files[i], p);
            free(p);
            if (rc < 0) break;
            c->n_files++;
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc < 0) {
        json_decref(index);
        goto fail;
    }
    int total = 0;
    for (int i = 0; i < c->n_files; i++) total += c->files[i].n_tensors;
    c->tensors = calloc((size_t)(total ? total : 1), sizeof *c->tensors);
    for (int i = 0; i < c->n_files; i++)
        for (int j = 0; j < c->files[i].n_tensors; j++) {
            c->tensors[c->n_tensors].st = &c->files[i].tensors[j];
            c->tensors[c->n_tensors].file = i;
            c->n_tensors++;
        }
    qsort(c->tensors, (size_t)c->n_tensors, sizeof *c->tensors, cmp_tensor_name);
    for (int i = 1; i < c->n_tensors; i++)
        if (!strcmp(c->tensors[i].st->name, c->tensors[i - 1].st->name)) {
            rc = mm3_errorf(-EINVAL, "%s: tensor '%s' appears in more than one shard", c->dir, c->tensors[i].st->name);
            json_decref(index);
            goto fail;
        }
    if (index) {
        /* The index and the shards must agree exactly. */
        json_t *wm = json_object_get(index, "weight_map");
        const char *key;
        json_t *v;
        json_object_foreach(wm, key, v) {
            const struct ckpt_tensor *t = ckpt_find(c, key);
            const char *shard = json_string_value(v);
            const char *base = t ? strrchr(c->files[t->file].path, '/') + 1 : NULL;
            if (!t || strcmp(base, shard)) {
                rc = mm3_errorf(-EINVAL, "%s: index maps '%s' to %s but that shard does not hold it", c->dir, key, shard);
                break;
            }
        }
        if (rc == 0 && (int)json_object_size(wm) != c->n_tensors)
            rc = mm3_errorf(-EINVAL, "%s: the shards hold %d tensors but the index lists %zu", c->dir, c->n_tensors,
                            json_object_size(wm));
        json_decref(index);
        if (rc < 0) goto fail;
    }
    return 0;
fail:
    ckpt_component_close(c);
    return rc;
}

void ckpt_component_close(struct ckpt_component *c)
{
    ckpt_component_unload(c);
    for (int i = 0; i < c->n_files; i++) st_file_close(&c->files[i]);
    free(c->files);
    free(c->tensors);
    json_decref(c->config);
    free(c->name);
    free(c->dir);
    memset(c, 0, sizeof *c);
}

const struct ckpt_tensor *ckpt_find(const struct ckpt_component *c, const char *name)
{
    int lo = 0, hi = c->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int r = strcmp(c->tensors[mid].st->name, name);
        if (r == 0) return &c->tensors[mid];
        if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

/* Elements [e0, e0 + count) of t widened to float32: from the arena when loaded, else
 * read through file_reader (parallel blocks) in 64 MiB slices widened one by one, with
 * no temporary of the whole range (the release's token table is 1.6 GB). */
static int read_f32(const struct ckpt_component *c, const struct ckpt_tensor *t, uint64_t e0, uint64_t count,
                    float *dst)
{
    enum mm3_dtype dt = t->st->dtype;
    uint64_t es = mm3_dtype_size(dt);
    if (t->data) {
        mm3_convert_to_f32(dst, (const char *)t->data + e0 * es, dt, count);
        return 0;
    }
    if (dt == MM3_DTYPE_F32) return ckpt_read_raw(c, t, e0 * es, count * es, dst);
    enum { SLICE_BYTES = 64 << 20 };
    uint64_t per = SLICE_BYTES / es;
    void *raw = malloc((count < per ? (count ? count : 1) : per) * es);
    if (!raw) return mm3_errorf(-ENOMEM, "%s: out of memory reading '%s'", c->dir, t->st->name);
    int rc = 0;
    for (uint64_t at = 0; at < count && rc == 0; at += per) {
        uint64_t k = count - at < per ? count - at : per;
        if ((rc = ckpt_read_raw(c, t, (e0 + at) * es, k * es, raw)) == 0) mm3_convert_to_f32(dst + at, raw, dt, k);
    }
    free(raw);
    return rc;
}

int ckpt_find_shaped(const struct ckpt_component *c, const char *name, int ndim, const int64_t *shape,
                     const struct ckpt_tensor **out)
{
    const struct ckpt_tensor *t = ckpt_find(c, name);
    if (!t) return mm3_errorf(-ENOENT, "%s: missing tensor '%s'", c->dir, name);
    if (ndim >= 0) {
        int ok = t->st->ndim == ndim;
        for (int i = 0; ok && i < ndim; i++) ok = t->st->shape[i] == shape[i];
        if (!ok) {
            char a[128], b[128];
            return mm3_errorf(-EINVAL, "%s: tensor '%s' has shape %s, expected %s (from config.json)", c->dir, name,
                              st_shape_str(a, sizeof a, t->st->ndim, t->st->shape), st_shape_str(b, sizeof b, ndim, shape));
        }
    }
    if (out) *out = t;
    return 0;
}

int ckpt_read_f32(const struct ckpt_component *c, const char *name, float *dst, int ndim, const int64_t *shape)
{
    const struct ckpt_tensor *t;
    int rc = ckpt_find_shaped(c, name, ndim, shape, &t);
    return rc < 0 ? rc : read_f32(c, t, 0, st_tensor_numel(t->st), dst);
}

int ckpt_read_raw(const struct ckpt_component *c, const struct ckpt_tensor *t, uint64_t offset, uint64_t nbytes,
                  void *dst)
{
    if (offset > t->st->nbytes || nbytes > t->st->nbytes - offset)
        return mm3_errorf(-EINVAL, "%s: bytes [%llu, %llu) of '%s' outside its %llu bytes", c->dir,
                          (unsigned long long)offset, (unsigned long long)(offset + nbytes), t->st->name,
                          (unsigned long long)t->st->nbytes);
    if (t->data) {
        memcpy(dst, (const char *)t->data + offset, nbytes);
        return 0;
    }
    const struct st_file *f = &c->files[t->file];
    struct file_read r = {f->fd, t->st->offset + offset, nbytes, dst, f->path};
    return file_reader_run(&r, 1, NULL, NULL);
}

/* Rows [row0, row0 + n) of `name` as elements [*e0, *e0 + *count) (a row: the product
 * of every dimension after the first); the error names the rows and the tensor. */
static int row_range(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n,
                     const struct ckpt_tensor **out, uint64_t *e0, uint64_t *count)
{
    const struct ckpt_tensor *t = ckpt_find(c, name);
    if (!t) return mm3_errorf(-ENOENT, "%s: missing tensor '%s'", c->dir, name);
    int64_t rows = t->st->ndim > 0 ? t->st->shape[0] : 1;
    if (row0 < 0 || n < 0 || row0 > rows || n > rows - row0)
        return mm3_errorf(-EINVAL, "%s: rows [%lld, %lld) of '%s' outside its %lld rows", c->dir, (long long)row0,
                          (long long)(row0 + n), name, (long long)rows);
    uint64_t cols = rows ? st_tensor_numel(t->st) / (uint64_t)rows : 0;
    *out = t;
    *e0 = (uint64_t)row0 * cols;
    *count = (uint64_t)n * cols;
    return 0;
}

int ckpt_read_rows_f32(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n, float *dst)
{
    const struct ckpt_tensor *t;
    uint64_t e0, count;
    int rc = row_range(c, name, row0, n, &t, &e0, &count);
    return rc < 0 ? rc : read_f32(c, t, e0, count, dst);
}

int ckpt_read_rows_bf16(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n, uint16_t *dst)
{
    const struct ckpt_tensor *t;
    uint64_t e0, count;
    int rc = row_range(c, name, row0, n, &t, &e0, &count);
    if (rc < 0) return rc;
    enum mm3_dtype dt = t->st->dtype;
    if (dt != MM3_DTYPE_BF16 && dt != MM3_DTYPE_F32 && dt != MM3_DTYPE_F16)
        return mm3_errorf(-EINVAL, "%s: tensor '%s' is %s: expected BF16, F16 or F32", c->dir, name, mm3_dtype_name(dt));
    if (dt == MM3_DTYPE_BF16) return ckpt_read_raw(c, t, e0 * 2, count * 2, dst);
    /* Wider on disk: read and rounded in slices through one buffer, no full-size temporary. */
    enum { SLICE = 1 << 20 };
    const uint64_t es = dt == MM3_DTYPE_F32 ? 4 : 2;
    void *raw = malloc(es * (count < SLICE ? (count ? count : 1) : SLICE));
    if (!raw) return mm3_errorf(-ENOMEM, "%s: out of memory converting '%s' to bf16", c->dir, name);
    for (uint64_t at = 0; at < count && rc == 0; at += SLICE) {
        uint64_t k = count - at < SLICE ? count - at : SLICE;
        if ((rc = ckpt_read_raw(c, t, (e0 + at) * es, k * es, raw)) < 0) break;
        for (uint64_t e = 0; e < k; e++)
            dst[at + e] = mm3_f32_to_bf16(dt == MM3_DTYPE_F32 ? ((const float *)raw)[e]
                                                              : mm3_f16_to_f32(((const uint16_t *)raw)[e]));
    }
    free(raw);
    return rc;
}

static json_t *config_get(const struct ckpt_component *c, const char *key)
{
    return json_object_get(c->config, key);
}

int ckpt_config_int(const struct ckpt_component *c, const char *key, int64_t *out)
{
    json_t *v = config_get(c, key);
    if (!json_is_integer(v))
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected an integer%s", c->dir, key, v ? "" : " (missing)");
    *out = json_integer_value(v);
    return 0;
}

int ckpt_config_double(const struct ckpt_component *c, const char *key, double *out)
{
    json_t *v = config_get(c, key);
    if (!json_is_number(v))
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected a number%s", c->dir, key, v ? "" : " (missing)");
    *out = json_number_value(v);
    return 0;
}

int ckpt_config_int_array(const struct ckpt_component *c, const char *key, int64_t *out, int *n)
{
    json_t *v = config_get(c, key);
    if (!json_is_array(v) || (int)json_array_size(v) > *n)
        return mm3_errorf(-EINVAL, "%s/config.json: key '%s': expected an array of at most %d integers", c->dir, key, *n);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return mm3_errorf(-EINVAL, "%s/config.json: key '%s'[%zu]: expected an integer", c->dir, key, i);
        out[i] = json_integer_value(e);
    }
    *n = (int)json_array_size(v);
    return 0;
}

int ckpt_config_rope_theta(const struct ckpt_component *c, double *theta)
{
    json_t *v = config_get(c, "rope_theta");
    if (!v) {
        json_t *rp = config_get(c, "rope_parameters");
        v = json_is_object(rp) ? json_object_get(rp, "rope_theta") : NULL;
    }
    if (!json_is_number(v))
        return mm3_errorf(-EINVAL, "%s/config.json: expected a number at 'rope_theta' or 'rope_parameters.rope_theta'", c->dir);
    *theta = json_number_value(v);
    return 0;
}

static uint64_t align_up(uint64_t x)
{
    return (x + CKPT_ALIGN - 1) & ~(uint64_t)(CKPT_ALIGN - 1);
}

uint64_t ckpt_component_arena_size(const struct ckpt_component *c)
{
    uint64_t total = 0;
    for (int i = 0; i < c->n_files; i++)
        for (int j = 0; j < c->files[i].n_tensors; j++) total = align_up(total) + c->files[i].tensors[j].nbytes;
    return align_up(total);
}

void ckpt_component_unload(struct ckpt_component *c)
{
    if (c->arena && c->arena_mapped) munmap(c->arena, c->arena_mapped);
    c->arena = NULL;
    c->arena_bytes = 0;
    c->arena_mapped = 0;
    for (int i = 0; i < c->n_tensors; i++) c->tensors[i].data = NULL;
}

/* Anonymous mapping rather than malloc: page aligned, returned to the system at
 * unload, and eligible for transparent huge pages, which makes the first touch of
 * tens of GB (by the kernel's copy into it) several times cheaper. */
static void *arena_map(uint64_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= (2u << 20)) madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

int ckpt_component_load_with(struct ckpt_component *c, const struct file_reader_opts *opts, void *buf,
                             uint64_t buf_bytes, struct file_reader_stats *stats)
{
    if (c->arena) {
        if (stats) memset(stats, 0, sizeof *stats);
        return 0;
    }
    uint64_t need = ckpt_component_arena_size(c);
    uint8_t *arena = buf;
    uint64_t mapped = 0;
    if (buf) {
        if (buf_bytes < need || ((uintptr_t)buf & (CKPT_ALIGN - 1)))
            return mm3_errorf(-EINVAL, "%s: caller arena of %llu bytes at %p: need %llu bytes, %u-byte aligned", c->dir,
                              (unsigned long long)buf_bytes, buf, (unsigned long long)need, CKPT_ALIGN);
    } else {
        mapped = need ? need : CKPT_ALIGN;
        arena = arena_map(mapped);
        if (!arena)
            return mm3_errorf(-ENOMEM, "%s: cannot map a %llu-byte weight arena", c->dir, (unsigned long long)need);
    }
    int total = 0;
    for (int i = 0; i < c->n_files; i++) total += c->files[i].n_tensors;
    struct file_read *reads = calloc((size_t)(total ? total : 1), sizeof *reads);
    void **dst = calloc((size_t)(total ? total : 1), sizeof *dst);
    if (!reads || !dst) {
        free(reads);
        free(dst);
        if (mapped) munmap(arena, mapped);
        return mm3_errorf(-ENOMEM, "%s: out of memory for %d read requests", c->dir, total);
    }
    /* File order (shard, then offset) keeps the reads sequential on disk. */
    uint64_t pos = 0;
    int k = 0;
    for (int i = 0; i < c->n_files; i++) {
        const struct st_file *f = &c->files[i];
        for (int j = 0; j < f->n_tensors; j++, k++) {
            /* Padding is zeroed so that equal checkpoints give byte-equal arenas
             * (a caller's buffer may hold anything). */
            if (buf) memset(arena + pos, 0, align_up(pos) - pos);
            pos = align_up(pos);
            dst[k] = arena + pos;
            reads[k] = (struct file_read){f->fd, f->tensors[j].offset, f->tensors[j].nbytes, arena + pos, f->path};
            pos += f->tensors[j].nbytes;
        }
    }
    if (buf) memset(arena + pos, 0, need - pos);
    struct file_reader_stats st;
    int rc = file_reader_run(reads, total, opts, &st);
    free(reads);
    if (rc < 0) {
        free(dst);
        if (mapped) munmap(arena, mapped);
        return mm3_error_prefix(rc, "loading %s: ", c->name);
    }
    /* dst[] follows file order; the per-file base index finds each ckpt_tensor's slot. */
    int *base = calloc((size_t)(c->n_files ? c->n_files : 1), sizeof *base);
    if (!base) {
        free(dst);
        if (mapped) munmap(arena, mapped);
        return mm3_errorf(-ENOMEM, "%s: out of memory", c->dir);
    }
    for (int i = 1; i < c->n_files; i++) base[i] = base[i - 1] + c->files[i - 1].n_tensors;
    for (int t = 0; t < c->n_tensors; t++) {
        struct ckpt_tensor *ct = &c->tensors[t];
        ct->data = dst[base[ct->file] + (int)(ct->st - c->files[ct->file].tensors)];
    }
    free(base);
    free(dst);
    c->arena = arena;
    c->arena_bytes = need;
    c->arena_mapped = mapped;
    double gbs = st.seconds > 0 ? (double)st.bytes / st.seconds / 1e9 : 0.0;
    LOG_INFO("%s: loaded %d tensors from %d file%s, %.1f MB in %.3f s (%.2f GB/s, %s)", c->name, c->n_tensors,
             c->n_files, c->n_files == 1 ? "" : "s", (double)st.bytes / 1e6, st.seconds, gbs,
             st.used_uring ? "io_uring" : "pread");
    if (stats) *stats = st;
    return 0;
}

int ckpt_component_load(struct ckpt_component *c)
{
    return ckpt_component_load_with(c, NULL, NULL, 0, NULL);
}

int ckpt_root_check(const char *root, const char *const *components, int n)
{
    char *p = path_join(root, "modular_model_index.json");
    json_t *idx;
    int rc = load_json(p, &idx);
    if (rc < 0) {
        free(p);
        return mm3_error_prefix(rc, "checkpoint %s: ", root);
    }
    for (int i = 0; i < n && rc == 0; i++) {
        json_t *e = json_object_get(idx, components[i]);
        char *dir = path_join(root, components[i]);
        struct stat st;
        if (!e)
            rc = mm3_errorf(-ENOENT, "%s: component '%s' is not listed (is this a MiniMax-Music3 checkpoint?)", p,
                            components[i]);
        else if (!json_is_array(e))
            rc = mm3_errorf(-EINVAL, "%s: entry '%s' must be an array [library, class, spec]", p, components[i]);
        else if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            rc = mm3_errorf(-ENOENT, "%s: component '%s' is listed but the folder %s is missing", p, components[i],
                            dir);
        free(dir);
    }
    json_decref(idx);
    free(p);
    return rc;
}
