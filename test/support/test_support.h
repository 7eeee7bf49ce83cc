/* Helpers shared by the cmocka test programs. */
#ifndef MM3_TEST_SUPPORT_H
#define MM3_TEST_SUPPORT_H

#include <stddef.h>

/* $MM3_GOLDEN_DIR or NULL if unset / not a directory. */
const char *test_golden_dir(void);
/* $MM3_SOURCE_DIR (repository root); never NULL in CTest. */
const char *test_source_dir(void);
/* $MM3_BIN_DIR (build/bin). */
const char *test_bin_dir(void);
/* A fresh empty directory under $MM3_TEST_TMP (or /tmp) named after `tag`; caller frees. */
char *test_make_tmpdir(const char *tag);
/* rm -rf a directory made by test_make_tmpdir. */
void test_remove_tree(const char *dir);
/* Sleep ms milliseconds. */
void test_sleep_ms(int ms);
/* The whole file, NUL-terminated (*len without the NUL when len is not NULL); NULL when unreadable. */
char *test_file_read(const char *path, size_t *len);
/* A pid no process has: a child's, exited and reaped (reuse during a test is improbable). */
int test_dead_pid(void);
/* Relative L2 error ||a-b|| / ||b|| (b all zero: ||a||). */
double test_rel_error(const float *a, const float *b, size_t n);

#endif
