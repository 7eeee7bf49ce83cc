/* Waiting and liveness: shared futexes on words inside the mapping, and the
 * peer-death rule (pidfd when the kernel has it, kill(pid, 0) + /proc otherwise). */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shmconn/shmconn_region.h"

double shmconn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Plain FUTEX_WAIT (not _PRIVATE): the word lives in a MAP_SHARED mapping that
 * the other process maps at another address; the kernel keys it by inode+offset. */
void shmconn_futex_wait(_Atomic uint32_t *word, uint32_t val, double timeout_s)
{
    if (!(timeout_s > 0)) return;
    if (timeout_s > 3600) timeout_s = 3600;
    struct timespec ts;
    ts.tv_sec = (time_t)timeout_s;
    ts.tv_nsec = (long)((timeout_s - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    /* EAGAIN (word changed), EINTR and ETIMEDOUT all mean "look again": callers loop. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

void shmconn_futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

int shmconn_pidfd_open(int32_t pid)
{
#ifdef SYS_pidfd_open
    if (pid <= 0) return -1;
    long fd = syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (fd >= 0) {
        /* Never leak the descriptor into programs the stages may exec. */
        fcntl((int)fd, F_SETFD, FD_CLOEXEC);
        return (int)fd;
    }
#endif
    return -1;
}

/* A zombie still answers kill(pid, 0), so /proc tells "exited, not yet reaped". */
static int pid_is_zombie(int32_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    /* "pid (comm) S ...": the comm may hold spaces or ')', so take the last ')'. */
    char *p = NULL;
    for (char *q = buf; *q; q++)
        if (*q == ')') p = q;
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

int shmconn_pid_dead(int32_t pid, int pidfd)
{
    if (pid <= 0) return 0;
    if (pidfd >= 0) {
        /* A pidfd polls readable once the process has exited (zombie included),
         * and it cannot be fooled by pid reuse. */
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        int r = poll(&p, 1, 0);
        return r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
    }
    if (kill((pid_t)pid, 0) < 0 && errno == ESRCH) return 1;
    return pid_is_zombie(pid);
}

int shmconn_peer_check(struct shmconn *c, int force)
{
    double now = shmconn_now();
    if (!force && now < c->next_peer_check) return 0;
    c->next_peer_check = now + c->slice_s;
    int32_t pid = c->role == SHMCONN_ROLE_PRODUCER ? atomic_load_explicit(&c->hdr->cons.pid, memory_order_acquire)
                                                   : atomic_load_explicit(&c->hdr->prod.pid, memory_order_acquire);
    if (pid <= 0) return 0; /* no consumer attached yet */
    if (pid != c->peer_pid) {
        if (c->peer_pidfd >= 0) close(c->peer_pidfd);
        c->peer_pid = pid;
        c->peer_pidfd = shmconn_pidfd_open(pid);
        if (c->peer_pidfd < 0 && shmconn_pid_dead(pid, -1)) return SHMCONN_E_PEER_DEAD;
    }
    return shmconn_pid_dead(pid, c->peer_pidfd) ? SHMCONN_E_PEER_DEAD : 0;
}
