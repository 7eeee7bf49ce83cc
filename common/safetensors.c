#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

#define ST_MAX_HEADER (100u * 1000u * 1000u)

static int cmp_offset(const void *a, const void *b)
{
    const struct st_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

static int pread_full(int fd, void *buf, uint64_t n, uint64_t off)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (r == 0) return -EIO;
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int parse_tensor(struct st_file *f, const char *name, json_t *v, struct st_tensor *t,
                        uint64_t data_size)
{
    const char *path = f->path;
    if (!json_is_object(v))
        return mm3_errorf(-EINVAL, "%s: tensor '%s': expected an object", path, name);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return mm3_errorf(-EINVAL, "%s: tensor '%s': missing string 'dtype'", path, name);
    int d = mm3_dtype_parse(json_string_value(dt));
    if (d < 0)
        return mm3_errorf(-EINVAL, "%s: tensor '%s': dtype '%s' not supported (expected F32, F16, BF16 or I64)",
                          path, name, json_string_value(dt));
    if (!json_is_array(sh) || json_array_size(sh) > ST_MAX_DIMS)
        return mm3_errorf(-EINVAL, "%s: tensor '%s': 'shape' must be an array of at most %d integers",
                          path, name, ST_MAX_DIMS);
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(json_array_get(off, 0)) ||
        !json_is_integer(json_array_get(off, 1)))
        return mm3_errorf(-EINVAL, "%s: tensor '%s': 'data_offsets' must be [begin, end]", path, name);
    t->name = strdup(name);
    t->dtype = (enum mm3_dtype)d;
    t->ndim = (int)json_array_size(sh);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *e = json_array_get(sh, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return mm3_errorf(-EINVAL, "%s: tensor '%s': shape[%d] is not a non-negative integer", path, name, i);
        t->shape[i] = json_integer_value(e);
        if (t->shape[i] && numel > UINT64_MAX / 16 / (uint64_t)t->shape[i])
            return mm3_errorf(-EINVAL, "%s: tensor '%s': shape overflows", path, name);
        numel *= (uint64_t)t->shape[i];
    }
    json_int_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
    if (b < 0 || e < b || (uint64_t)e > data_size)
        return mm3_errorf(-EINVAL,
                          "%s: tensor '%s': data_offsets [%lld, %lld] outside the data section of %llu bytes "
                          "(truncated file?)",
                          path, name, (long long)b, (long long)e, (unsigned long long)data_size);
    uint64_t want = numel * mm3_dtype_size(t->dtype);
    if ((uint64_t)(e - b) != want) {
        char sbuf[128];
        return mm3_errorf(-EINVAL, "%s: tensor '%s': %s %s needs %llu bytes but data_offsets span %lld",
                          path, name, mm3_dtype_name(t->dtype), st_shape_str(sbuf, sizeof sbuf, t->ndim, t->shape),
                          (unsigned long long)want, (long long)(e - b));
    }
    t->offset = f->data_start + (uint64_t)b;
    t->nbytes = want;
    return 0;
}

int st_file_open(struct st_file *f, const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = mm3_errorf(-errno, "%s: cannot open: %s", path, strerror(errno));
        memset(f, 0, sizeof *f);
        f->fd = -1;
        return rc;
    }
    return st_file_open_fd(f, fd, path);
}

int st_file_open_fd(struct st_file *f, int fd, const char *path)
{
    memset(f, 0, sizeof *f);
    f->fd = fd;
    int rc;
    if (!(f->path = strdup(path))) {
        rc = mm3_errorf(-ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    struct stat st;
    if (fstat(f->fd, &st) < 0) {
        rc = mm3_errorf(-errno, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    f->file_size = (uint64_t)st.st_size;
    uint8_t lenbuf[8];
    if (f->file_size < 8 || pread_full(f->fd, lenbuf, 8, 0) < 0) {
        rc = mm3_errorf(-EINVAL, "%s: truncated: a safetensors file starts with an 8-byte header length", path);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenbuf[i];
    if (hlen > ST_MAX_HEADER || hlen > f->file_size - 8) {
        rc = mm3_errorf(-EINVAL, "%s: header length %llu runs past the end of the file (%llu bytes) or over 100 MB",
                        path, (unsigned long long)hlen, (unsigned long long)f->file_size);
        goto fail;
    }
    f->data_start = 8 + hlen;
    char *hdr = malloc(hlen + 1);
    if (!hdr) {
        rc = mm3_errorf(-ENOMEM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)hlen);
        goto fail;
    }
    rc = pread_full(f->fd, hdr, hlen, 8);
    hdr[hlen] = 0;
    if (rc < 0) {
        free(hdr);
        rc = mm3_errorf(rc, "%s: cannot read header", path);
        goto fail;
    }
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    free(hdr);
    if (!root || !json_is_object(root)) {
        rc = mm3_errorf(-EINVAL, "%s: header is not a JSON object (line %d column %d: %s)", path,
                        root ? 0 : jerr.line, root ? 0 : jerr.column, root ? "not an object" : jerr.text);
        json_decref(root);
        goto fail;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    const char *key;
    json_t *val;
    uint64_t data_size = f->file_size - f->data_start;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        rc = parse_tensor(f, key, val, &f->tensors[f->n_tensors], data_size);
        f->n_tensors++;
        if (rc < 0) {
            json_decref(root);
            goto fail;
        }
    }
    json_decref(root);
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_offset);
    for (int i = 1; i < f->n_tensors; i++) {
        const struct st_tensor *a = &f->tensors[i - 1], *b = &f->tensors[i];
        if (a->nbytes && b->nbytes && a->offset + a->nbytes > b->offset) {
            rc = mm3_errorf(-EINVAL, "%s: tensors '%s' and '%s' overlap", path, a->name, b->name);
            goto fail;
        }
    }
    return 0;
fail:
    st_file_close(f);
    return rc;
}

void st_file_close(struct st_file *f)
{
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const struct st_tensor *st_file_find(const struct st_file *f, const char *name)
{
    for (int i = 0; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

uint64_t st_tensor_numel(const struct st_tensor *t)
{
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

int st_file_read(const struct st_file *f, const struct st_tensor *t, void *dst)
{
    int rc = pread_full(f->fd, dst, t->nbytes, t->offset);
    if (rc < 0) return mm3_errorf(rc, "%s: reading tensor '%s': %s", f->path, t->name, strerror(-rc));
    return 0;
}

const char *st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < ndim && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
    return buf;
}

static int check_shape(const struct st_file *f, const struct st_tensor *t, int want_ndim, const int64_t *want)
{
    if (want_ndim < 0) return 0;
    int ok = t->ndim == want_ndim;
    for (int i = 0; ok && i < want_ndim; i++) ok = t->shape[i] == want[i];
    if (ok) return 0;
    char a[128], b[128];
    return mm3_errorf(-EINVAL, "%s: tensor '%s' has shape %s, expected %s", f->path, t->name,
                      st_shape_str(a, sizeof a, t->ndim, t->shape), st_shape_str(b, sizeof b, want_ndim, want));
}

int st_file_read_f32(const struct st_file *f, const char *name, float *dst, int want_ndim, const int64_t *want_shape)
{
    const struct st_tensor *t = st_file_find(f, name);
    if (!t) return mm3_errorf(-ENOENT, "%s: missing tensor '%s'", f->path, name);
    int rc = check_shape(f, t, want_ndim, want_shape);
    if (rc < 0) return rc;
    if (t->dtype == MM3_DTYPE_F32) return st_file_read(f, t, dst);
    void *tmp = malloc(t->nbytes ? t->nbytes : 1);
    if (!tmp) return mm3_errorf(-ENOMEM, "%s: out of memory reading '%s'", f->path, name);
    rc = st_file_read(f, t, tmp);
    if (rc == 0) mm3_convert_to_f32(dst, tmp, t->dtype, st_tensor_numel(t));
    free(tmp);
    return rc;
}

int st_file_load_f32(const struct st_file *f, const char *name, float **out, int *ndim, int64_t shape[ST_MAX_DIMS])
{
    const struct st_tensor *t = st_file_find(f, name);
    *out = NULL;
    if (!t) return mm3_errorf(-ENOENT, "%s: missing tensor '%s'", f->path, name);
    uint64_t n = st_tensor_numel(t);
    float *buf = malloc(n ? n * sizeof(float) : 1);
    if (!buf) return mm3_errorf(-ENOMEM, "%s: out of memory reading '%s'", f->path, name);
    int rc = st_file_read_f32(f, name, buf, -1, NULL);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    if (ndim) *ndim = t->ndim;
    if (shape) memcpy(shape, t->shape, sizeof(int64_t) * ST_MAX_DIMS);
    *out = buf;
    return 0;
}

int st_write_file(const char *path, const struct st_writer_tensor *tensors, int n, const char *metadata_json)
{
    json_t *root = json_object();
    if (metadata_json) {
        json_t *meta = json_loads(metadata_json, 0, NULL);
        if (meta) json_object_set_new(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const struct st_writer_tensor *t = &tensors[i];
        uint64_t numel = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) {
            numel *= (uint64_t)t->shape[d];
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        uint64_t nb = numel * mm3_dtype_size(t->dtype);
        json_t *o = json_object();
        json_object_set_new(o, "dtype", json_string(mm3_dtype_name(t->dtype)));
        json_object_set_new(o, "shape", shape);
        json_t *offs = json_array();
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + nb)));
        json_object_set_new(o, "data_offsets", offs);
        json_object_set_new(root, t->name, o);
        off += nb;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!hdr) return mm3_errorf(-ENOMEM, "%s: cannot serialise header", path);
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) & ~(size_t)7; /* data section 8-byte aligned, as safetensors does */
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        int e = errno;
        free(hdr);
        return mm3_errorf(-e, "%s: cannot create: %s", path, strerror(e));
    }
    uint8_t lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenbuf, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', fp) != EOF;
    free(hdr);
    for (int i = 0; ok && i < n; i++) {
        const struct st_writer_tensor *t = &tensors[i];
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
        size_t nb = (size_t)(numel * mm3_dtype_size(t->dtype));
        ok = nb == 0 || fwrite(t->data, 1, nb, fp) == nb;
    }
    if (fclose(fp) != 0) ok = 0;
    if (!ok) return mm3_errorf(-EIO, "%s: write failed (disk full?)", path);
    return 0;
}
