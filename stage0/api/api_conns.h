/* The HTTP server's open connections, for the limits libmicrohttpd does not
 * enforce the way we need: connections per client address (checked at accept),
 * the read deadline (a watchdog thread closes a connection whose request has not
 * fully arrived in time: MHD's own timeout restarts with every byte, so a client
 * trickling a byte at a time would hold its slot forever), and the slots of
 * requests other than /health* and /metrics. Every function is thread-safe. */
#ifndef MM3_STAGE0_API_CONNS_H
#define MM3_STAGE0_API_CONNS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct api_conn {
    struct api_conn *prev, *next;
    int fd;
    struct sockaddr_storage addr;
    int64_t read_since_ns; /* waiting for a request since then; 0 = answering one */
    bool cut;              /* the read deadline closed it */
};

struct api_conns {
    pthread_mutex_t mu;
    struct api_conn *head;
    unsigned n_general; /* slots taken by requests other than admin paths */
    double read_timeout_s;
    pthread_cond_t wake;
    bool stop, have_watchdog;
    pthread_t watchdog;
};

/* read_timeout_s > 0 starts the watchdog. Returns 0 or -ENOMEM with a message. */
int api_conns_init(struct api_conns *t, double read_timeout_s);
/* Stops the watchdog and forgets every connection still listed. */
void api_conns_free(struct api_conns *t);

/* Open connections from the address of `addr` (its port aside). */
unsigned api_conns_count_client(struct api_conns *t, const struct sockaddr *addr);
/* List a new connection, waiting for its first request from now. NULL when out
 * of memory (the connection then goes untracked). */
struct api_conn *api_conns_add(struct api_conns *t, int fd, const struct sockaddr *addr);
void api_conns_remove(struct api_conns *t, struct api_conn *k);
/* The connection's request has fully arrived (false), or it now waits for the
 * next one (true: the deadline starts). No-op when k is NULL or no longer listed. */
void api_conns_reading(struct api_conns *t, struct api_conn *k, bool reading);

/* Take one of `max` general slots; false when all are taken. */
bool api_conns_take_general(struct api_conns *t, unsigned max);
void api_conns_release_general(struct api_conns *t);

/* The numeric address of `a` for a log line. */
const char *api_conns_client_name(const struct sockaddr *a, char *buf, size_t cap);

#endif
