/* Helpers shared by the fuzz targets (test/fuzz/fuzz_*.c): scratch folders,
 * splitting one input into several files, the repository root. */
#ifndef MM3_FUZZ_SUPPORT_H
#define MM3_FUZZ_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

/* Separator between the parts of a multi-file input ("\n--\n"). */
#define FUZZ_PART_SEP "\n--\n"
#define FUZZ_MAX_PARTS 8

struct fuzz_part {
    const uint8_t *data;
    size_t size;
};

/* Split data at each FUZZ_PART_SEP into at most max parts (the last part keeps
 * any further separators). Returns the number of parts (>= 1). */
int fuzz_split(const uint8_t *data, size_t size, struct fuzz_part *parts, int max);

/* $MM3_SOURCE_DIR, else the source folder this was built from. */
const char *fuzz_source_dir(void);

/* A scratch folder for this process, made on first use under $MM3_TEST_TMP,
 * $TMPDIR or /tmp and removed with its files at exit. Never NULL (aborts). */
const char *fuzz_scratch_dir(void);

/* Write size bytes to path (created or truncated); aborts on I/O errors, which
 * are a broken harness, not a finding. */
void fuzz_write_file(const char *path, const void *data, size_t size);

/* A NUL-terminated malloc'ed copy of data (embedded NULs kept). */
char *fuzz_strndup(const uint8_t *data, size_t size);

/* With $MM3_FUZZ_VERBOSE set, print "what: rc (message)" to stderr: shows which
 * path each seed takes (MM3_FUZZ_VERBOSE=1 fuzz_replay_<target> corpus/<target>). */
void fuzz_note(const char *what, int rc);

/* Crash with a message: an oracle of the harness found a wrong result. */
void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
