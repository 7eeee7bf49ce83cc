/* Internal: the shared-memory ABI of a connector region and the helpers both
 * sides use (segment lifecycle, futex, peer liveness). Not for the stages.
 *
 * Region layout (all offsets fixed by the geometry in the header):
 *
 *   [0, 4096)                        struct shmconn_header
 *   [4096, 8192)                     cancel ring: SHMCONN_CANCEL_SLOTS x struct shmconn_cancel
 *   [8192, +n_slots*slot_bytes)      message slots: struct shmconn_slot + inline bytes
 *   [.., +payload_bytes)             payload area (a byte ring of large payloads)
 *
 * Every struct here uses sized integers only, and its size is pinned by a
 * _Static_assert: the two processes may be different builds. */
#ifndef MM3_SHMCONN_REGION_H
#define MM3_SHMCONN_REGION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "shmconn/shmconn.h"

#define SHMCONN_MAGIC UINT64_C(0x314e4f434d48534d) /* "MSHMCON1" little-endian */
#define SHMCONN_VERSION 2u
#define SHMCONN_HEADER_BYTES 4096u
#define SHMCONN_CANCEL_BYTES 4096u
#define SHMCONN_CANCEL_SLOTS 256u
#define SHMCONN_SLOT_HEADER_BYTES 768u
#define SHMCONN_ALIGN 64u
#define SHMCONN_MAX_INLINE (UINT64_C(1) << 30)
#define SHMCONN_MAX_PAYLOAD (UINT64_C(1) << 40)

/* Side states (header.producer_state / consumer_state). */
enum { SHMCONN_SIDE_NONE = 0, SHMCONN_SIDE_OPEN = 1, SHMCONN_SIDE_CLOSED = 2 };

/* Geometry and identity, written once by the creator before the magic. */
struct shmconn_geometry {
    uint64_t magic; /* stored last, with release: a reader seeing it sees the rest */
    uint32_t version;
    uint32_t header_bytes;
    uint32_t slot_header_bytes;
    uint32_t n_slots;
    uint64_t slot_bytes;    /* slot header + inline area, multiple of 64 */
    uint64_t inline_bytes;  /* shm_threshold_bytes */
    uint64_t payload_bytes; /* payload area size, multiple of 64 */
    uint64_t region_bytes;  /* whole mapping */
    int32_t creator_pid;
    uint32_t pad0;
    uint64_t creator_start_ns;          /* CLOCK_REALTIME at creation, for logs */
    uint8_t token[SHMCONN_TOKEN_BYTES]; /* the run's token (cfg.token); the opener compares */
    uint8_t pad[128 - 72 - SHMCONN_TOKEN_BYTES];
};
_Static_assert(sizeof(struct shmconn_geometry) == 128, "shm ABI");

/* Written by the producer only (own cache line so the consumer's writes never share it). */
struct shmconn_producer_line {
    _Atomic uint32_t tail;  /* free-running: messages published */
    _Atomic uint32_t wake;  /* futex word the consumer sleeps on; bumped on publish/close */
    _Atomic uint32_t state; /* SHMCONN_SIDE_* */
    _Atomic int32_t pid;
    _Atomic uint32_t waiting;     /* producer is (about to be) asleep on consumer_line.wake */
    _Atomic uint32_t cancel_head; /* free-running: cancel notices consumed */
    _Atomic uint64_t beat_ns;     /* CLOCK_MONOTONIC of the producer's last heartbeat, 0 = none */
    uint8_t pad[64 - 32];
};
_Static_assert(sizeof(struct shmconn_producer_line) == 64, "shm ABI");

/* Written by the consumer only. */
struct shmconn_consumer_line {
    _Atomic uint32_t head; /* free-running: slots handed back */
    _Atomic uint32_t wake; /* futex word the producer sleeps on; bumped on release/cancel/close */
    _Atomic uint32_t state;
    _Atomic int32_t pid;
    _Atomic uint32_t waiting;      /* consumer is (about to be) asleep on producer_line.wake */
    _Atomic uint32_t cancel_tail;  /* free-running: cancel notices posted */
    _Atomic uint64_t payload_tail; /* free-running byte position: payload area freed up to here */
    _Atomic uint64_t beat_ns;      /* CLOCK_MONOTONIC of the consumer's last heartbeat, 0 = none */
    uint8_t pad[64 - 40];
};
_Static_assert(sizeof(struct shmconn_consumer_line) == 64, "shm ABI");

struct shmconn_header {
    struct shmconn_geometry geo;
    uint8_t pad0[64];
    struct shmconn_producer_line prod;
    uint8_t pad1[64];
    struct shmconn_consumer_line cons;
    uint8_t pad2[SHMCONN_HEADER_BYTES - 6 * 64];
};
_Static_assert(sizeof(struct shmconn_header) == SHMCONN_HEADER_BYTES, "shm ABI");

struct shmconn_cancel {
    uint64_t req_id;
    uint32_t reason;
    uint32_t pad;
};
_Static_assert(sizeof(struct shmconn_cancel) * SHMCONN_CANCEL_SLOTS == SHMCONN_CANCEL_BYTES, "shm ABI");

struct shmconn_slot_tensor {
    char name[SHMCONN_TENSOR_NAME];
    uint32_t dtype;
    uint32_t ndim;
    int64_t shape[SHMCONN_MAX_DIMS];
    uint64_t offset; /* from the start of the message's payload bytes */
    uint64_t nbytes;
    uint64_t pad;
};
_Static_assert(sizeof(struct shmconn_slot_tensor) == 80, "shm ABI");

/* One message descriptor. Its payload is inline (payload_pos == SHMCONN_INLINE, the
 * bytes follow the slot header) or at payload_pos % payload_bytes in the payload area. */
#define SHMCONN_INLINE UINT64_MAX
struct shmconn_slot {
    uint64_t req_id;
    uint32_t chunk;
    uint32_t kind;
    uint32_t flags;
    uint32_t n_tensors;
    uint64_t payload_pos; /* free-running byte position or SHMCONN_INLINE */
    uint64_t payload_len; /* bytes used, multiple of 64 */
    uint64_t payload_end; /* payload_tail after this slot is released */
    uint64_t seq;         /* ring sequence number of this message, checked by the reader */
    uint8_t pad0[64 - 56];
    struct shmconn_slot_tensor tensors[SHMCONN_MAX_TENSORS];
    uint8_t pad1[SHMCONN_SLOT_HEADER_BYTES - 64 - SHMCONN_MAX_TENSORS * 80];
};
_Static_assert(sizeof(struct shmconn_slot) == SHMCONN_SLOT_HEADER_BYTES, "shm ABI");

enum shmconn_role { SHMCONN_ROLE_PRODUCER = 1, SHMCONN_ROLE_CONSUMER = 2 };

/* Consumer-side deadline tracking of one request. */
struct shmconn_track {
    uint64_t req_id;
    double clock_start; /* monotonic s: request_begin or last message */
    int n_received;
};

/* Process-local handle (both roles). */
struct shmconn {
    enum shmconn_role role;
    struct shmconn_config cfg;
    char shm_name[160]; /* "/<prefix>[<run_id>-]<name>" */
    int fd;
    dev_t dev;
    ino_t ino;
    uint8_t *base;
    uint64_t map_bytes;
    struct shmconn_header *hdr;
    struct shmconn_cancel *cancels;
    uint8_t *slots;
    uint8_t *payload;
    uint32_t mask;
    uint64_t slot_bytes;
    pthread_mutex_t lock;
    struct shmconn_stats stats;

    double slice_s; /* cfg.wait_slice_s or the default */

    /* peer liveness */
    int32_t peer_pid;
    int peer_pidfd;         /* -1 when pidfd_open is unavailable */
    double next_peer_check; /* monotonic s */

    /* producer */
    uint64_t pay_head;   /* free-running payload allocation position */
    int reserved;        /* a send_begin is waiting for its commit */
    uint64_t *cancelled; /* ring of request ids the consumer gave up on */
    uint32_t *cancelled_reason;
    uint32_t n_cancelled;   /* free-running count written */
    uint32_t cancel_polled; /* free-running count handed to cancel_poll */

    /* consumer */
    uint32_t rd;        /* next slot to read (head <= rd <= tail) */
    uint8_t *released;  /* per slot: view handed back */
    uint64_t *slot_end; /* per slot: validated payload_end, or SHMCONN_INLINE */
    uint64_t last_end;  /* payload_end of the last message read */
    uint64_t *dropped;  /* ring of request ids whose messages are dropped */
    uint32_t n_dropped; /* free-running count written */
    struct shmconn_track *tracks;
    uint32_t n_tracks, cap_tracks;
    int peer_gone; /* 0, SHMCONN_E_PEER_DEAD or SHMCONN_E_CLOSED */
};

/* Bytes used in a slot / payload area by n bytes of payload. */
static inline uint64_t shmconn_align(uint64_t n)
{
    return (n + SHMCONN_ALIGN - 1) & ~(uint64_t)(SHMCONN_ALIGN - 1);
}

static inline struct shmconn_slot *shmconn_slot_at(const struct shmconn *c, uint32_t seq)
{
    return (struct shmconn_slot *)(c->slots + (uint64_t)(seq & c->mask) * c->slot_bytes);
}

/* shmconn_region.c: geometry, segment create / open / validate / close, reclaim. */
int shmconn_config_check(const struct shmconn_config *cfg);
void shmconn_geometry_make(const struct shmconn_config *cfg, struct shmconn_geometry *g);
int shmconn_geometry_check(const struct shmconn_geometry *got, const struct shmconn_geometry *want, uint64_t file_bytes,
                           const char *name);
int shmconn_handle_init(struct shmconn *c, const struct shmconn_config *cfg, enum shmconn_role role);
int shmconn_region_create(struct shmconn *c);
int shmconn_region_open(struct shmconn *c, double wait_s);
void shmconn_region_unlink_if_ours(struct shmconn *c);
void shmconn_handle_free(struct shmconn *c);

/* shmconn_wait.c: monotonic clock, futex, peer liveness. */
double shmconn_now(void);
/* Sleep on *word while it equals val, at most timeout_s; returns on wake, change, signal or timeout. */
void shmconn_futex_wait(_Atomic uint32_t *word, uint32_t val, double timeout_s);
void shmconn_futex_wake(_Atomic uint32_t *word);
/* 1 when pid is known dead (exited, zombie or gone), 0 otherwise. */
int shmconn_pid_dead(int32_t pid, int pidfd);
int shmconn_pidfd_open(int32_t pid);
/* Check the peer at most once per wait slice: 0 alive/unknown, SHMCONN_E_PEER_DEAD. */
int shmconn_peer_check(struct shmconn *c, int force);
#define SHMCONN_ID_RING 1024u /* remembered cancelled request ids, each side */

#endif
