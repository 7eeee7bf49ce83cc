/* shmconn across two processes (fork): round trips both ways with content
 * checks, and kill -9 of the producer and of the consumer mid-stream.
 * Children never return into cmocka: they _exit with 0 (ok) or a line number. */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "shmconn/shmconn.h"
#include "support/test_shm.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* FNV-1a over the payload, sent along in a second tensor: the receiver in the
 * other process checks content without sharing any state with the sender. */
static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static size_t size_of(uint32_t k)
{
    static const size_t sizes[] = {64, 16384, 1u << 20, 3000000, 0, 50000};
    return sizes[k % 6];
}

/* Send n_msgs messages of request req (sizes cycling through size_of). */
static int send_stream(shmconn_t *p, uint64_t req, uint32_t n_msgs, double gap_s)
{
    uint8_t *buf = malloc(3000000);
    if (!buf) return -ENOMEM;
    for (uint32_t k = 0; k < n_msgs; k++) {
        size_t n = size_of(k);
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)(i * 31 + k * 7 + req);
        uint64_t h = hash_bytes(buf, n);
        struct shmconn_msg m;
        memset(&m, 0, sizeof m);
        m.req_id = req;
        m.chunk = k;
        m.flags = (k == 0 ? SHMCONN_FLAG_FIRST : 0) | (k + 1 == n_msgs ? SHMCONN_FLAG_LAST : 0);
        m.n_tensors = 2;
        test_shm_tensor_1d(&m.tensors[0], "data", SHMCONN_DTYPE_U8, buf, (int64_t)n, 1);
        test_shm_tensor_1d(&m.tensors[1], "hash", SHMCONN_DTYPE_U8, &h, 8, 1);
        int rc = shmconn_send(p, &m, 10.0);
        if (rc < 0) {
            free(buf);
            return rc;
        }
        if (gap_s > 0) {
            struct timespec ts = {0, (long)(gap_s * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    free(buf);
    return 0;
}

/* 0 when m is message k of a stream from send_stream with an intact payload. */
static int check_msg(const struct shmconn_msg *m, uint32_t k)
{
    if (m->chunk != k || m->n_tensors != 2 || m->tensors[0].nbytes != size_of(k) || m->tensors[1].nbytes != 8)
        return -1;
    uint64_t h;
    memcpy(&h, m->tensors[1].data, 8);
    return hash_bytes(m->tensors[0].data, m->tensors[0].nbytes) == h ? 0 : -2;
}

/* Receive a whole stream of n_msgs messages of req; 0 when all arrive intact and in order. */
static int recv_stream(shmconn_t *c, uint64_t req, uint32_t n_msgs)
{
    for (uint32_t k = 0; k < n_msgs; k++) {
        struct shmconn_event ev;
        int rc = shmconn_recv(c, &ev, 10.0);
        if (rc < 0) return rc;
        if (ev.type != SHMCONN_EVENT_MESSAGE || ev.msg.req_id != req || check_msg(&ev.msg, k) < 0)
            return -1000 - (int)k;
        if ((k + 1 == n_msgs) != !!(ev.msg.flags & SHMCONN_FLAG_LAST)) return -2000;
        shmconn_release(c, &ev.msg);
    }
    return 0;
}

/* fork() for a test child: the child dies with the test (a failed assertion in
 * the parent must never leave a child behind holding CTest's output pipe). */
static pid_t fork_child(void)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(99);
        alarm(60); /* and never outlives a minute whatever happens */
    }
    return pid;
}

/* A child's idle wait until it is killed, bounded. */
static void child_idle(void)
{
    for (int i = 0; i < 600; i++) {
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    _exit(98);
}

#define CHILD_CHECK(cond)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) _exit(__LINE__ % 250 + 1);                                                                        \
    } while (0)

static void wait_child_ok(pid_t pid)
{
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "child status 0x%x (exit code = source line %% 250 + 1)\n", status);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_fork_producer_child(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("f1", 16384, 8u << 20, 8);
    pid_t pid = fork_child();
    assert_true(pid >= 0);
    if (pid == 0) {
        shmconn_t *p;
        CHILD_CHECK(shmconn_create(&p, &cfg) == 0);
        CHILD_CHECK(send_stream(p, 77, 60, 0) == 0);
        shmconn_close(p); /* everything published stays readable for the consumer */
        _exit(0);
    }
    shmconn_t *c;
    assert_int_equal(shmconn_open(&c, &cfg, 5.0), 0);
    assert_int_equal(recv_stream(c, 77, 60), 0);
    struct shmconn_event ev;
    assert_int_equal(shmconn_recv(c, &ev, 5.0), SHMCONN_E_CLOSED);
    shmconn_close(c);
    wait_child_ok(pid);
    assert_int_equal(test_shm_count(), 0);
}

static void test_fork_consumer_child(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("f2", 65536, 4u << 20, 4);
    shmconn_t *p;
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    pid_t pid = fork_child();
    assert_true(pid >= 0);
    if (pid == 0) {
        shmconn_t *c;
        CHILD_CHECK(shmconn_open(&c, &cfg, 5.0) == 0);
        CHILD_CHECK(shmconn_request_begin(c, 5) == 0);
        CHILD_CHECK(recv_stream(c, 5, 40) == 0);
        shmconn_close(c);
        _exit(0);
    }
    assert_int_equal(send_stream(p, 5, 40, 0), 0);
    wait_child_ok(pid);
    shmconn_close(p);
    assert_int_equal(test_shm_count(), 0);
}

/* A producer that streams request req forever, one small message every 10 ms. */
static pid_t spawn_endless_producer(const struct shmconn_config *cfg, uint64_t req)
{
    pid_t pid = fork_child();
    if (pid != 0) return pid;
    shmconn_t *p;
    CHILD_CHECK(shmconn_create(&p, cfg) == 0);
    uint8_t b[64] = {0};
    for (uint32_t k = 0;; k++) {
        struct shmconn_msg m;
        memset(&m, 0, sizeof m);
        m.req_id = req;
        m.chunk = k;
        m.n_tensors = 1;
        test_shm_tensor_1d(&m.tensors[0], "x", SHMCONN_DTYPE_U8, b, 64, 1);
        int rc = shmconn_send(p, &m, 30.0);
        if (rc == SHMCONN_E_CLOSED || rc == SHMCONN_E_PEER_DEAD) {
            shmconn_close(p);
            _exit(0);
        }
        CHILD_CHECK(rc == 0);
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
}

static void test_kill_producer(void **state)
{
    (void)state;
    struct shmconn_config ca = test_shm_config("ka", 1024, 0, 8), cb = test_shm_config("kb", 1024, 0, 8);
    pid_t pa = spawn_endless_producer(&ca, 1);
    pid_t pb = spawn_endless_producer(&cb, 2);
    assert_true(pa > 0 && pb > 0);
    shmconn_t *a, *b;
    assert_int_equal(shmconn_open(&a, &ca, 5.0), 0);
    assert_int_equal(shmconn_open(&b, &cb, 5.0), 0);
    assert_int_equal(shmconn_request_begin(a, 1), 0);
    struct shmconn_event ev;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(shmconn_recv(a, &ev, 5.0), 0);
        assert_int_equal(ev.type, SHMCONN_EVENT_MESSAGE);
        assert_int_equal(ev.msg.chunk, (uint32_t)i);
        shmconn_release(a, &ev.msg);
    }
    assert_int_equal(shmconn_peer_status(a), 0);
    assert_int_equal(kill(pa, SIGKILL), 0);
    double t0 = now_s();
    /* Drain what was published before the death, then the in-flight request fails. */
    int rc;
    while ((rc = shmconn_recv(a, &ev, 5.0)) == 0 && ev.type == SHMCONN_EVENT_MESSAGE)
        shmconn_release(a, &ev.msg);
    double dt = now_s() - t0;
    assert_int_equal(rc, 0);
    assert_int_equal(ev.type, SHMCONN_EVENT_PEER_LOST);
    assert_int_equal(ev.req_id, 1);
    assert_int_equal(ev.status, SHMCONN_E_PEER_DEAD);
    assert_true(dt < 0.5); /* bounded detection: the pid check runs every 50 ms of waiting */
    assert_int_equal(shmconn_recv(a, &ev, 1.0), SHMCONN_E_PEER_DEAD);
    assert_int_equal(shmconn_peer_status(a), SHMCONN_E_PEER_DEAD);
    assert_int_equal(shmconn_peer_status(b), 0);
    /* The survivor keeps serving the other channel. */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(shmconn_recv(b, &ev, 5.0), 0);
        assert_int_equal(ev.req_id, 2);
        shmconn_release(b, &ev.msg);
    }
    /* Start-up reclaim removes the dead producer's segment and nothing else. */
    int status;
    assert_int_equal(waitpid(pa, &status, 0), pa);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(test_shm_count(), 2);
    assert_int_equal(shmconn_reclaim_stale(test_shm_prefix()), 1);
    assert_int_equal(test_shm_count(), 1);
    shmconn_close(a);
    /* A restarted producer under the same name is served again. */
    pa = spawn_endless_producer(&ca, 3);
    assert_int_equal(shmconn_open(&a, &ca, 5.0), 0);
    assert_int_equal(shmconn_recv(a, &ev, 5.0), 0);
    assert_int_equal(ev.req_id, 3);
    shmconn_release(a, &ev.msg);
    shmconn_close(a); /* producers see CLOSED and exit 0 */
    shmconn_close(b);
    wait_child_ok(pa);
    wait_child_ok(pb);
    assert_int_equal(test_shm_count(), 0);
}

static void test_kill_consumer(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("kc", 256, 4u << 20, 4);
    shmconn_t *p;
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork_child();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* Read two messages, keep them (never release), say so, then hang. */
        shmconn_t *c;
        CHILD_CHECK(shmconn_open(&c, &cfg, 5.0) == 0);
        struct shmconn_event ev;
        for (int i = 0; i < 2; i++)
            CHILD_CHECK(shmconn_recv(c, &ev, 5.0) == 0);
        CHILD_CHECK(write(fds[1], "r", 1) == 1);
        child_idle();
    }
    close(fds[1]);
    /* Fill the ring: 4 slots, the child holds 2 and releases none; the 5th send cannot fit. */
    assert_int_equal(send_stream(p, 9, 2, 0), 0);
    char ch;
    assert_int_equal(read(fds[0], &ch, 1), 1);
    close(fds[0]);
    uint8_t b[32] = {0};
    struct shmconn_msg m;
    memset(&m, 0, sizeof m);
    m.req_id = 9;
    m.n_tensors = 1;
    snprintf(m.tensors[0].name, 16, "x");
    m.tensors[0].dtype = SHMCONN_DTYPE_U8;
    m.tensors[0].ndim = 1;
    m.tensors[0].shape[0] = 32;
    m.tensors[0].nbytes = 32;
    m.tensors[0].data = b;
    for (int i = 0; i < 2; i++)
        assert_int_equal(shmconn_send(p, &m, 1.0), 0);
    assert_int_equal(shmconn_send(p, &m, 0.1), SHMCONN_E_TIMEOUT); /* full, consumer alive */
    assert_int_equal(shmconn_peer_status(p), 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    double t0 = now_s();
    assert_int_equal(shmconn_send(p, &m, 10.0), SHMCONN_E_PEER_DEAD);
    double dt = now_s() - t0;
    assert_true(dt < 0.5);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(shmconn_peer_status(p), SHMCONN_E_PEER_DEAD);
    /* The producer recreates its region and a new consumer is served. */
    shmconn_close(p);
    assert_int_equal(test_shm_count(), 0);
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    pid = fork_child();
    if (pid == 0) {
        shmconn_t *c;
        CHILD_CHECK(shmconn_open(&c, &cfg, 5.0) == 0);
        CHILD_CHECK(recv_stream(c, 10, 12) == 0);
        shmconn_close(c);
        _exit(0);
    }
    assert_int_equal(send_stream(p, 10, 12, 0), 0);
    wait_child_ok(pid);
    shmconn_close(p);
    assert_int_equal(test_shm_count(), 0);
}

/* A consumer that dies while the ring still has room: the next send after one
 * wait slice says PEER_DEAD instead of filling the ring for nobody. */
static void test_dead_consumer_with_room(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("kr", 1024, 1u << 20, 64);
    cfg.wait_slice_s = 0.02;
    shmconn_t *p;
    assert_int_equal(shmconn_create(&p, &cfg), 0);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork_child();
    assert_true(pid >= 0);
    if (pid == 0) {
        shmconn_t *c;
        CHILD_CHECK(shmconn_open(&c, &cfg, 5.0) == 0);
        CHILD_CHECK(write(fds[1], "r", 1) == 1);
        child_idle();
    }
    close(fds[1]);
    char ch;
    assert_int_equal(read(fds[0], &ch, 1), 1);
    close(fds[0]);
    assert_int_equal(send_stream(p, 1, 2, 0), 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid); /* reaped: the pid is gone, not a zombie */
    struct timespec ts = {0, 30000000};              /* > one wait slice */
    nanosleep(&ts, NULL);
    assert_int_equal(send_stream(p, 1, 1, 0), SHMCONN_E_PEER_DEAD);
    shmconn_close(p);
    assert_int_equal(test_shm_count(), 0);
}

/* Another local user (nobody) creates the channel's name first, with a valid header and
 * a live creator: the consumer must refuse to map it and name the owner, the producer
 * must refuse to use or remove it, and stale reclaim must leave it alone even once its
 * creator is dead. */
static void test_squatter_refused(void **state)
{
    (void)state;
    if (geteuid() != 0) skip(); /* dropping to uid 65534 needs root; CI runs as root */
    struct shmconn_config cfg = test_shm_config("sq", 1024, 0, 4);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork_child();
    assert_true(pid >= 0);
    if (pid == 0) {
        CHILD_CHECK(setresgid(65534, 65534, 65534) == 0);
        CHILD_CHECK(setresuid(65534, 65534, 65534) == 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* cleared by the credential change */
        shmconn_t *p;
        CHILD_CHECK(shmconn_create(&p, &cfg) == 0);
        CHILD_CHECK(write(fds[1], "r", 1) == 1);
        child_idle();
    }
    close(fds[1]);
    char ch;
    assert_int_equal(read(fds[0], &ch, 1), 1);
    close(fds[0]);
    assert_int_equal(test_shm_count(), 1);

    shmconn_t *c = NULL;
    assert_int_equal(shmconn_open(&c, &cfg, 0.5), SHMCONN_E_FOREIGN);
    assert_non_null(strstr(mm3_last_error(), "uid 65534"));
    assert_non_null(strstr(mm3_last_error(), "/mm3f"));
    shmconn_t *p = NULL;
    assert_int_equal(shmconn_create(&p, &cfg), SHMCONN_E_FOREIGN);
    assert_non_null(strstr(mm3_last_error(), "uid 65534"));
    assert_int_equal(test_shm_count(), 1);

    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(shmconn_reclaim_stale(test_shm_prefix()), 0);
    assert_int_equal(shmconn_create(&p, &cfg), SHMCONN_E_FOREIGN); /* dead creator, still not ours */
    assert_int_equal(test_shm_count(), 1);
    test_shm_segments_unlink(test_shm_prefix());
}

static int group_setup(void **state)
{
    (void)state;
    test_shm_prefix_init("mm3f");
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fork_producer_child),     cmocka_unit_test(test_fork_consumer_child),
        cmocka_unit_test(test_kill_producer),           cmocka_unit_test(test_kill_consumer),
        cmocka_unit_test(test_dead_consumer_with_room), cmocka_unit_test(test_squatter_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, test_shm_group_teardown);
}
