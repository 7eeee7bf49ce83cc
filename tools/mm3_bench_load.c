/* mm3-bench-load: checkpoint load speed against the disk's plain sequential read.
 *
 *   mm3-bench-load --ckpt DIR [--components a,b,...] [--cold] [--mode auto|uring|pread]
 *                  [--qd N] [--block-mib N] [--inline]
 *
 * Per component: a dd-like sequential read of its safetensors files (8 MiB
 * read(2) calls into one buffer), then ckpt_component_open + ckpt_component_load.
 * --cold evicts the files from the page cache before each measurement
 * (posix_fadvise DONTNEED, plus /proc/sys/vm/drop_caches when root); without it
 * both runs see a warm cache (the files are read once first). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/file_reader.h"
#include "common/log.h"

#define SEQ_BLOCK (8u << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void evict(const struct ckpt_component *c)
{
    sync();
    for (int i = 0; i < c->n_files; i++) {
        int fd = open(c->files[i].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "3\n", 2) < 0) LOG_DEBUG("drop_caches: %s", strerror(errno));
        close(fd);
    }
}

/* Read every file of c front to back; returns bytes, *sec the time. */
static int seq_read(const struct ckpt_component *c, void *buf, uint64_t *bytes, double *sec)
{
    double t0 = now_s();
    *bytes = 0;
    for (int i = 0; i < c->n_files; i++) {
        int fd = open(c->files[i].path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return mm3_errorf(-errno, "%s: %s", c->files[i].path, strerror(errno));
        for (;;) {
            ssize_t r = read(fd, buf, SEQ_BLOCK);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                int e = errno;
                close(fd);
                return mm3_errorf(-e, "%s: read: %s", c->files[i].path, strerror(e));
            }
            if (r == 0) break;
            *bytes += (uint64_t)r;
        }
        close(fd);
    }
    *sec = now_s() - t0;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mm3-bench-load --ckpt DIR [--components a,b,...] [--cold] [--mode auto|uring|pread]\n"
               "                      [--qd N] [--block-mib N] [--inline]\n"
               "  --inline  io_uring without worker threads (IOSQE_ASYNC off)\n");
}

int main(int argc, char **argv)
{
    mm3_log_set_tag("bench-load");
    const char *root = NULL;
    char *list = strdup("language_model,rvq_depth_decoder,condition_encoder,transformer,vocoder");
    int cold = 0;
    struct file_reader_opts opts = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--cold")) {
            cold = 1;
        } else if (!strcmp(a, "--inline")) {
            opts.inline_reads = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(list);
            return 0;
        } else if (v && !strcmp(a, "--ckpt")) {
            root = argv[++i];
        } else if (v && !strcmp(a, "--components")) {
            free(list);
            list = strdup(argv[++i]);
        } else if (v && !strcmp(a, "--mode")) {
            i++;
            if (!strcmp(v, "auto"))
                opts.mode = FILE_READER_AUTO;
            else if (!strcmp(v, "uring"))
                opts.mode = FILE_READER_URING;
            else if (!strcmp(v, "pread"))
                opts.mode = FILE_READER_PREAD;
            else {
                fprintf(stderr, "mm3-bench-load: --mode: expected auto, uring or pread, got '%s'\n", v);
                free(list);
                return 2;
            }
        } else if (v && !strcmp(a, "--qd")) {
            opts.queue_depth = atoi(argv[++i]);
        } else if (v && !strcmp(a, "--block-mib")) {
            opts.block_bytes = (uint64_t)atoi(argv[++i]) << 20;
        } else {
            fprintf(stderr, "mm3-bench-load: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            free(list);
            return 2;
        }
    }
    if (!root) {
        usage(stderr);
        free(list);
        return 2;
    }
    void *buf = malloc(SEQ_BLOCK);
    if (!buf) {
        free(list);
        return 1;
    }
    printf("%-20s %14s %9s %9s %9s %9s %7s  %s\n", "component", "bytes", "seq_s", "seq_GB/s", "load_s", "load_GB/s",
           "ratio", "reader");
    uint64_t tot_seq_b = 0, tot_load_b = 0;
    double tot_seq_s = 0, tot_load_s = 0;
    int rc = 0;
    char *save = NULL;
    for (char *name = strtok_r(list, ",", &save); name && rc == 0; name = strtok_r(NULL, ",", &save)) {
        struct ckpt_component c;
        if ((rc = ckpt_component_open(&c, root, name)) < 0) break;
        uint64_t sb;
        double ss;
        if (cold)
            evict(&c);
        else if ((rc = seq_read(&c, buf, &sb, &ss)) < 0)
            goto next; /* warm the cache */
        if ((rc = seq_read(&c, buf, &sb, &ss)) < 0) goto next;
        if (cold) evict(&c);
        struct file_reader_stats st;
        double t0 = now_s();
        rc = ckpt_component_load_with(&c, &opts, NULL, 0, &st);
        double ls = now_s() - t0; /* includes mapping and faulting in the arena */
        if (rc < 0) goto next;
        double sg = ss > 0 ? (double)sb / ss / 1e9 : 0, lg = ls > 0 ? (double)st.bytes / ls / 1e9 : 0;
        printf("%-20s %14llu %9.3f %9.2f %9.3f %9.2f %7.2f  %s\n", name, (unsigned long long)st.bytes, ss, sg, ls, lg,
               sg > 0 ? lg / sg : 0, st.used_uring ? "io_uring" : "pread");
        fflush(stdout);
        tot_seq_b += sb;
        tot_seq_s += ss;
        tot_load_b += st.bytes;
        tot_load_s += ls;
    next:
        ckpt_component_close(&c);
    }
    if (rc == 0) {
        double sg = tot_seq_s > 0 ? (double)tot_seq_b / tot_seq_s / 1e9 : 0;
        double lg = tot_load_s > 0 ? (double)tot_load_b / tot_load_s / 1e9 : 0;
        printf("%-20s %14llu %9.3f %9.2f %9.3f %9.2f %7.2f  %s\n", "total", (unsigned long long)tot_load_b, tot_seq_s,
               sg, tot_load_s, lg, sg > 0 ? lg / sg : 0, cold ? "cold" : "warm");
    } else {
        fprintf(stderr, "mm3-bench-load: %s\n", mm3_last_error());
    }
    free(buf);
    free(list);
    return rc < 0 ? 1 : 0;
}
