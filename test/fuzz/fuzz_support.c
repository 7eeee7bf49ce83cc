#include "test/fuzz/fuzz_support.h"

#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"

#ifndef MM3_FUZZ_SOURCE_DIR
#define MM3_FUZZ_SOURCE_DIR "."
#endif

int fuzz_split(const uint8_t *data, size_t size, struct fuzz_part *parts, int max)
{
    const size_t sep_len = strlen(FUZZ_PART_SEP);
    int n = 0;
    size_t start = 0;
    for (size_t i = 0; n < max - 1 && i + sep_len <= size; i++) {
        if (memcmp(data + i, FUZZ_PART_SEP, sep_len) != 0) continue;
        parts[n].data = data + start;
        parts[n].size = i - start;
        n++;
        i += sep_len - 1;
        start = i + 1;
    }
    parts[n].data = data + start;
    parts[n].size = size - start;
    return n + 1;
}

const char *fuzz_source_dir(void)
{
    const char *s = getenv("MM3_SOURCE_DIR");
    return s && s[0] ? s : MM3_FUZZ_SOURCE_DIR;
}

static char g_scratch[4096];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void scratch_remove(void)
{
    if (g_scratch[0]) nftw(g_scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fuzz_scratch_dir(void)
{
    if (g_scratch[0]) return g_scratch;
    const char *base = getenv("MM3_TEST_TMP");
    if (!base || !base[0]) base = getenv("TMPDIR");
    if (!base || !base[0]) base = "/tmp";
    snprintf(g_scratch, sizeof g_scratch, "%s/mm3fuzz-%d-XXXXXX", base, (int)getpid());
    if (!mkdtemp(g_scratch)) {
        perror(g_scratch);
        abort();
    }
    atexit(scratch_remove);
    return g_scratch;
}

void fuzz_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) abort();
    if (size) memcpy(s, data, size);
    s[size] = 0;
    return s;
}

void fuzz_note(const char *what, int rc)
{
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("MM3_FUZZ_VERBOSE") != NULL;
    if (verbose) fprintf(stderr, "  %s: %d%s%s\n", what, rc, rc < 0 ? " " : "", rc < 0 ? mm3_last_error() : "");
}

void fuzz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz oracle: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}
