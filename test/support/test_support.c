#include "test_support.h"

#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *test_golden_dir(void)
{
    const char *d = getenv("MM3_GOLDEN_DIR");
    struct stat st;
    if (!d || stat(d, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    return d;
}

const char *test_source_dir(void)
{
    const char *d = getenv("MM3_SOURCE_DIR");
    return d ? d : ".";
}

const char *test_bin_dir(void)
{
    const char *d = getenv("MM3_BIN_DIR");
    return d ? d : "build/bin";
}

char *test_make_tmpdir(const char *tag)
{
    const char *base = getenv("MM3_TEST_TMP");
    if (!base) base = "/tmp";
    mkdir(base, 0755);
    size_t n = strlen(base) + strlen(tag) + 32;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s-XXXXXX", base, tag);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void test_remove_tree(const char *dir)
{
    if (dir) nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

double test_rel_error(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0) return sqrt(num);
    return sqrt(num / den);
}

void test_sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

char *test_file_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (b) b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

int test_dead_pid(void)
{
    pid_t c = fork();
    if (c == 0) _exit(0);
    if (c < 0 || waitpid(c, NULL, 0) != c) abort(); /* a test machine that cannot fork */
    return (int)c;
}
