/* Shared-memory helpers for the tests of shmconn and of the served stages: a
 * per-run segment prefix, channel configs under it, the segments it left in
 * /dev/shm, and one-dimensional message tensors.
 *
 *     static int group_setup(void **state) { test_shm_prefix_init("mm3t"); return 0; }
 *     return cmocka_run_group_tests(tests, group_setup, test_shm_group_teardown);
 *
 * Header only (static inline): test/CMakeLists.txt links just test_support.c into
 * each test, and only the tests that include this need shmconn. */
#ifndef MM3_TEST_SHM_H
#define MM3_TEST_SHM_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shmconn/shmconn.h"

/* This run's segment prefix, "<stem><pid>-" once test_shm_prefix_init ran. */
static inline char *test_shm_prefix(void)
{
    static char prefix[32];
    return prefix;
}

static inline void test_shm_prefix_init(const char *stem)
{
    snprintf(test_shm_prefix(), 32, "%s%d-", stem, (int)getpid());
}

/* The number of /dev/shm entries whose name starts with prefix. */
static inline int test_shm_segments_left(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

/* The number of this run's segments. */
static inline int test_shm_count(void)
{
    return test_shm_segments_left(test_shm_prefix());
}

/* Unlink every segment whose name starts with prefix (after a failed assertion left some). */
static inline void test_shm_segments_unlink(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) {
            char name[300];
            snprintf(name, sizeof name, "/%s", e->d_name);
            shm_unlink(name);
        }
    closedir(d);
}

/* A channel `name` under this run's prefix, with 30 s deadlines. */
static inline struct shmconn_config test_shm_config(const char *name, uint64_t threshold, uint64_t payload,
                                                    uint32_t slots)
{
    struct shmconn_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "%s", name);
    snprintf(c.prefix, sizeof c.prefix, "%s", test_shm_prefix());
    c.shm_threshold_bytes = threshold;
    c.payload_bytes = payload;
    c.n_slots = slots;
    c.first_chunk_deadline_s = 30;
    c.steady_deadline_s = 30;
    return c;
}

/* cmocka group teardown: fails (and cleans up) when the run left a segment behind. */
static inline int test_shm_group_teardown(void **state)
{
    (void)state;
    int n = test_shm_count();
    if (n) {
        fprintf(stderr, "%d segment(s) /dev/shm/%s* left behind\n", n, test_shm_prefix());
        test_shm_segments_unlink(test_shm_prefix());
        return 1;
    }
    return 0;
}

/* t = a one-dimensional tensor of n elements of elem_size bytes at data. */
static inline void test_shm_tensor_1d(struct shmconn_tensor *t, const char *name, uint32_t dtype, void *data, int64_t n,
                                      size_t elem_size)
{
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = 1;
    t->shape[0] = n;
    t->nbytes = (uint64_t)n * elem_size;
    t->data = data;
}

#endif
