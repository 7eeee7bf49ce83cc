#include "stage0/api/api_conns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "common/log.h"
#include "stage0/api/job.h"

static bool same_client(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family) return false;
    if (b->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (b->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

const char *api_conns_client_name(const struct sockaddr *a, char *buf, size_t cap)
{
    const void *p = a->sa_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)a)->sin6_addr
                                             : (const void *)&((const struct sockaddr_in *)a)->sin_addr;
    if ((a->sa_family != AF_INET && a->sa_family != AF_INET6) || !inet_ntop(a->sa_family, p, buf, (socklen_t)cap))
        snprintf(buf, cap, "?");
    return buf;
}

static void *watchdog_main(void *arg)
{
    struct api_conns *t = arg;
    double tick = t->read_timeout_s / 4;
    if (tick > 1) tick = 1;
    if (tick < 0.01) tick = 0.01;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        int64_t now = mm3_job_now_ns();
        for (struct api_conn *k = t->head; k; k = k->next) {
            if (!k->read_since_ns || k->cut || (double)(now - k->read_since_ns) * 1e-9 <= t->read_timeout_s) continue;
            k->cut = true;
            /* MHD's thread for the connection sees the socket end and closes it;
             * the fd stays valid until MHD reports the close (api_conns_remove). */
            if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
            char name[INET6_ADDRSTRLEN];
            LOG_INFO("http: %s: no complete request within request_read_timeout_s (%g s): closed",
                     api_conns_client_name((const struct sockaddr *)&k->addr, name, sizeof name), t->read_timeout_s);
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        int64_t ns = until.tv_nsec + (int64_t)(tick * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&t->wake, &t->mu, &until);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int api_conns_init(struct api_conns *t, double read_timeout_s)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->wake, NULL);
    t->read_timeout_s = read_timeout_s;
    if (read_timeout_s > 0) {
        if (pthread_create(&t->watchdog, NULL, watchdog_main, t) != 0) {
            pthread_cond_destroy(&t->wake);
            pthread_mutex_destroy(&t->mu);
            return mm3_errorf(-ENOMEM, "http server: cannot start the read-deadline thread");
        }
        t->have_watchdog = true;
    }
    return 0;
}

void api_conns_free(struct api_conns *t)
{
    if (t->have_watchdog) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_signal(&t->wake);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->watchdog, NULL);
    }
    while (t->head) {
        struct api_conn *k = t->head;
        t->head = k->next;
        free(k);
    }
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->mu);
}

unsigned api_conns_count_client(struct api_conns *t, const struct sockaddr *addr)
{
    unsigned n = 0;
    pthread_mutex_lock(&t->mu);
    for (struct api_conn *k = t->head; k; k = k->next)
        n += same_client(&k->addr, addr);
    pthread_mutex_unlock(&t->mu);
    return n;
}

struct api_conn *api_conns_add(struct api_conns *t, int fd, const struct sockaddr *addr)
{
    struct api_conn *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->fd = fd;
    if (addr && (addr->sa_family == AF_INET || addr->sa_family == AF_INET6))
        memcpy(&k->addr, addr, addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    k->read_since_ns = mm3_job_now_ns();
    pthread_mutex_lock(&t->mu);
    k->next = t->head;
    if (t->head) t->head->prev = k;
    t->head = k;
    pthread_mutex_unlock(&t->mu);
    return k;
}

void api_conns_remove(struct api_conns *t, struct api_conn *k)
{
    if (!k) return;
    pthread_mutex_lock(&t->mu);
    if (k->prev)
        k->prev->next = k->next;
    else
        t->head = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&t->mu);
    free(k);
}

void api_conns_reading(struct api_conns *t, struct api_conn *k, bool reading)
{
    if (!k) return;
    pthread_mutex_lock(&t->mu);
    for (struct api_conn *q = t->head; q; q = q->next)
        if (q == k) q->read_since_ns = reading ? mm3_job_now_ns() : 0;
    pthread_mutex_unlock(&t->mu);
}

bool api_conns_take_general(struct api_conns *t, unsigned max)
{
    pthread_mutex_lock(&t->mu);
    bool ok = t->n_general < max;
    if (ok) t->n_general++;
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void api_conns_release_general(struct api_conns *t)
{
    pthread_mutex_lock(&t->mu);
    if (t->n_general) t->n_general--;
    pthread_mutex_unlock(&t->mu);
}
