/* Fuzz target: a whole safetensors file (u64 header length, JSON header, data)
 * through st_file_open, then every tensor read back as float32. The input lives
 * in a memfd, so no disk is touched. Oracles: an accepted file's tensors lie in
 * the data section, are sorted and disjoint, and their byte sizes match their
 * dtype and shape. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "common/safetensors.h"
#include "test/fuzz/fuzz_support.h"

/* Tensors above this are validated but not read (keeps one run fast). */
#define READ_MAX_NUMEL (1u << 20)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mm3_log_set_level(MM3_LOG_ERROR);
    return 0;
}

static void check_file(const struct st_file *f)
{
    uint64_t prev_end = f->data_start;
    if (f->data_start < 8 || f->data_start > f->file_size) fuzz_fail("data_start %llu", (unsigned long long)f->data_start);
    for (int i = 0; i < f->n_tensors; i++) {
        const struct st_tensor *t = &f->tensors[i];
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) fuzz_fail("tensor %d: ndim %d", i, t->ndim);
        /* An empty tensor covers no bytes: it may sit anywhere in the data section. */
        if ((t->nbytes && t->offset < prev_end) || t->offset < f->data_start || t->offset > f->file_size ||
            t->nbytes > f->file_size - t->offset)
            fuzz_fail("tensor '%s': [%llu, +%llu) overlaps or leaves the file", t->name,
                      (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        if (st_tensor_numel(t) * mm3_dtype_size(t->dtype) != t->nbytes) fuzz_fail("tensor '%s': nbytes", t->name);
        if (st_file_find(f, t->name) == NULL) fuzz_fail("tensor '%s' not found by name", t->name);
        if (t->nbytes) prev_end = t->offset + t->nbytes;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("mm3-fuzz-st", MFD_CLOEXEC);
    if (fd < 0) abort();
    if (size && write(fd, data, size) != (ssize_t)size) abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    struct st_file f;
    int rc = st_file_open(&f, path);
    fuzz_note("st_file_open", rc);
    if (rc == 0) {
        check_file(&f);
        for (int i = 0; i < f.n_tensors; i++) {
            const struct st_tensor *t = &f.tensors[i];
            if (st_tensor_numel(t) > READ_MAX_NUMEL) continue;
            float *v = NULL;
            int ndim;
            int64_t shape[ST_MAX_DIMS];
            if (st_file_load_f32(&f, t->name, &v, &ndim, shape) == 0) {
                if (ndim != t->ndim) fuzz_fail("tensor '%s': loaded ndim %d, header %d", t->name, ndim, t->ndim);
                free(v);
            }
        }
        st_file_close(&f);
    } else if (mm3_last_error()[0] == 0) {
        fuzz_fail("st_file_open failed without a message");
    }
    mm3_error_clear();
    close(fd);
    return 0;
}
