/* Bulk file reads at the disk's (or the page cache's) speed.
 *
 * A batch of (fd, offset, length, destination) reads is cut into blocks of
 * block_bytes and kept queue_depth deep in flight through io_uring (liburing
 * 2.3 API, no registered buffers or files, so no `ulimit -l` needs). Where
 * io_uring cannot be set up or refuses plain reads (gVisor, old kernels,
 * seccomp), the same batch runs through pread(2) instead.
 *
 *     struct file_read r[2] = {{fd, off_a, len_a, dst_a, path}, {fd, off_b, len_b, dst_b, path}};
 *     struct file_reader_stats st;
 *     if ((rc = file_reader_run(r, 2, NULL, &st)) < 0) return rc;   // NULL: defaults
 *
 * Reads are handed to io_uring's worker threads (IOSQE_ASYNC), so copies out of
 * the page cache run on several cores: a warm load runs several times faster than
 * one thread's read(2) loop, a cold one at the disk's sequential speed.
 *
 * Environment: MM3_IO=pread forces the fallback for mode AUTO; MM3_IO=inline
 * sets inline_reads. */
#ifndef MM3_FILE_READER_H
#define MM3_FILE_READER_H

#include <stdint.h>

enum file_reader_mode {
    FILE_READER_AUTO = 0, /* io_uring, falling back to pread */
    FILE_READER_URING,    /* io_uring or fail with -ENOSYS (tests) */
    FILE_READER_PREAD,    /* pread only */
};

struct file_reader_opts {
    enum file_reader_mode mode;
    int queue_depth;      /* reads in flight; 0: 16 */
    uint64_t block_bytes; /* largest single read; 0: 4 MiB; rounded to 4 KiB, at most 64 MiB */
    int inline_reads;     /* 1: no IOSQE_ASYNC, the submitting thread copies cached data itself */
};

struct file_read {
    int fd;
    uint64_t offset;
    uint64_t nbytes;
    void *dst;
    const char *path; /* for error messages */
};

struct file_reader_stats {
    uint64_t bytes;
    uint64_t reads; /* block reads issued (short reads resubmitted count again) */
    double seconds;
    int used_uring; /* 1 when io_uring did the reads */
};

/* Read every request completely; a short file is an error naming the path.
 * opts and stats may be NULL. */
int file_reader_run(const struct file_read *reads, int n, const struct file_reader_opts *opts,
                    struct file_reader_stats *stats);

/* Whether io_uring can be set up here (cached after the first call). */
int file_reader_uring_available(void);

#endif
