/* SharedMemoryConnector: one unidirectional message channel between two processes
 * on one host, carried by one named POSIX shared-memory region.
 *
 * The producer creates the region (/dev/shm/<prefix>[<run_id>-]<name>, mode 0600), the
 * consumer opens it only when it belongs to our user, has no group/other bits and
 * carries the run token of the consumer's config (a segment someone else made is
 * refused with SHMCONN_E_FOREIGN, never mapped).
 * Messages are {request id, chunk index, kind, flags, up to SHMCONN_MAX_TENSORS typed
 * tensors}. Payloads up to shm_threshold_bytes travel inside the ring slot; larger
 * ones go to the payload area of the same region. The consumer reads payloads in
 * place (a view) and hands the view back with shmconn_release().
 *
 *   producer                                   consumer
 *   shmconn_create(&p, &cfg)                   shmconn_open(&c, &cfg, 5.0)
 *   shmconn_send(p, &msg, 10.0)   ------>      shmconn_recv(c, &ev, 1.0)
 *   shmconn_cancel_poll(p, ...)   <------      shmconn_request_cancel(c, id) / deadline expiry
 *   shmconn_close(p)                           shmconn_release(c, &ev.msg); shmconn_close(c)
 *
 * Every function returns 0 or a negative errno code and sets mm3_last_error().
 * The codes with a meaning of their own are the SHMCONN_E_* below.
 * A handle may be used from several threads; calls on one handle serialise.
 * docs/connector.md describes the layout, the liveness rule and the byte rates. */
#ifndef MM3_SHMCONN_H
#define MM3_SHMCONN_H

#include <errno.h>
#include <stdint.h>

#define SHMCONN_MAX_TENSORS 8
#define SHMCONN_TENSOR_NAME 16
#define SHMCONN_MAX_DIMS 4
#define SHMCONN_DEFAULT_PREFIX "mm3-"
#define SHMCONN_DEFAULT_SLICE_S 0.05
#define SHMCONN_RUN_ID_HEX 32 /* a run id: 128 random bits as lowercase hex */
#define SHMCONN_TOKEN_BYTES 16

/* Return codes with a meaning of their own (all negative errno values). */
#define SHMCONN_E_PEER_DEAD (-EOWNERDEAD) /* the other process died (kill -9, crash) */
#define SHMCONN_E_CLOSED (-EPIPE)         /* the other side closed the channel cleanly */
#define SHMCONN_E_TIMEOUT (-ETIMEDOUT)    /* nothing happened within the call's timeout */
#define SHMCONN_E_CANCELLED (-ECANCELED)  /* the consumer failed or cancelled this request */
#define SHMCONN_E_TOO_BIG (-EMSGSIZE)     /* the message can never fit the region */
#define SHMCONN_E_BAD_REGION (-EPROTO)    /* wrong magic, version, geometry or a corrupt slot */
#define SHMCONN_E_FOREIGN (-EPERM)        /* another user's segment, group/other access, or another run's token */

/* Message flags. The connector acts on LAST, ERROR and CANCELLED (they end the
 * request's deadline tracking on the consumer side); the rest is for the stages. */
enum shmconn_flag {
    SHMCONN_FLAG_FIRST = 1u << 0,     /* first message of a request */
    SHMCONN_FLAG_LAST = 1u << 1,      /* no more messages for this request */
    SHMCONN_FLAG_ERROR = 1u << 2,     /* the request failed on the producer side */
    SHMCONN_FLAG_CANCELLED = 1u << 3, /* the request was cancelled on the producer side */
};

/* Element types beyond enum mm3_dtype (common/dtype.h), whose values (0..) are used as is. */
enum shmconn_dtype_extra { SHMCONN_DTYPE_I16 = 100, SHMCONN_DTYPE_I32 = 101, SHMCONN_DTYPE_U8 = 102 };

/* Bytes per element of a dtype code (mm3_dtype or shmconn_dtype_extra); 0 = unknown. */
uint32_t shmconn_dtype_size(uint32_t dtype);

struct shmconn_config {
    char name[64];                       /* channel name, e.g. "s0_to_s1" */
    char prefix[32];                     /* segment name prefix; "" = SHMCONN_DEFAULT_PREFIX */
    char run_id[SHMCONN_RUN_ID_HEX + 1]; /* "" or 32 lowercase hex digits: the segment is
                                            <prefix><run_id>-<name>, a name nobody can guess */
    uint8_t token[SHMCONN_TOKEN_BYTES];  /* the run's secret: the creator stores it in the
                                            header, the opener refuses a segment without it */
    uint64_t shm_threshold_bytes;        /* payloads up to this size travel inline in the slot */
    uint64_t payload_bytes;              /* size of the large-payload area (0 = inline only) */
    uint32_t n_slots;                    /* ring slots, a power of two in [2, 65536] */
    double first_chunk_deadline_s;       /* consumer: request_begin -> first message (sleep_s x max_wait_first_chunk) */
    double steady_deadline_s;            /* consumer: between later messages (sleep_s x max_wait) */
    double wait_slice_s;                 /* longest single sleep; the peer is checked once per slice
                                            (connector_get_sleep_s); 0 = SHMCONN_DEFAULT_SLICE_S */
};

/* One tensor of a message. On send, data points at the source bytes (or is NULL
 * with shmconn_send_begin, which fills it with the region address to write to);
 * on receive, data points into the region and stays valid until shmconn_release. */
struct shmconn_tensor {
    char name[SHMCONN_TENSOR_NAME]; /* NUL-terminated tag, e.g. "latent" */
    uint32_t dtype;                 /* mm3_dtype or shmconn_dtype_extra */
    uint32_t ndim;                  /* 0..SHMCONN_MAX_DIMS */
    int64_t shape[SHMCONN_MAX_DIMS];
    uint64_t nbytes; /* must equal dtype size x product(shape) */
    void *data;
};

struct shmconn_msg {
    uint64_t req_id;
    uint32_t chunk; /* chunk index within the request */
    uint32_t kind;  /* stage-defined message kind (start, frames, pcm, ...) */
    uint32_t flags; /* enum shmconn_flag */
    uint32_t n_tensors;
    struct shmconn_tensor tensors[SHMCONN_MAX_TENSORS];
    uint64_t seq; /* set by recv / send_begin: the ring position, used by release / commit */
};

enum shmconn_event_type {
    SHMCONN_EVENT_MESSAGE = 1, /* ev.msg is a view: hand it back with shmconn_release */
    SHMCONN_EVENT_TIMEOUT,     /* ev.req_id missed its deadline; it is cancelled towards the producer */
    SHMCONN_EVENT_PEER_LOST,   /* the producer died or closed while ev.req_id was in flight */
};

struct shmconn_event {
    enum shmconn_event_type type;
    uint64_t req_id;
    int first_chunk; /* TIMEOUT: 1 when it was the first-chunk deadline */
    int status;      /* TIMEOUT: SHMCONN_E_TIMEOUT; PEER_LOST: PEER_DEAD or CLOSED */
    double waited_s; /* TIMEOUT: seconds since the clock was (re)started */
    struct shmconn_msg msg;
};

/* Reasons a consumer posts back to the producer. */
enum shmconn_cancel_reason { SHMCONN_CANCEL_BY_CONSUMER = 1, SHMCONN_CANCEL_TIMEOUT = 2 };

typedef struct shmconn shmconn_t;

/* ---- producer ---- */

/* Create the region as producer. A leftover region of the same name whose creator
 * is dead is unlinked first; a live one gives -EEXIST. The caller owns *out. */
int shmconn_create(shmconn_t **out, const struct shmconn_config *cfg);

/* Copy the message into the ring (inline or payload area) and publish it.
 * Blocks while the ring or payload area is full, at most timeout_s:
 * SHMCONN_E_TIMEOUT, SHMCONN_E_PEER_DEAD, SHMCONN_E_CLOSED, SHMCONN_E_CANCELLED
 * (the consumer gave up on msg->req_id), SHMCONN_E_TOO_BIG. */
int shmconn_send(shmconn_t *c, const struct shmconn_msg *msg, double timeout_s);

/* Zero-copy send: reserve space for msg (tensor nbytes and shapes set, data ignored),
 * set each msg->tensors[i].data to the region address to fill, then publish with
 * shmconn_send_commit. One reservation at a time per handle; same errors as send. */
int shmconn_send_begin(shmconn_t *c, struct shmconn_msg *msg, double timeout_s);
int shmconn_send_commit(shmconn_t *c, const struct shmconn_msg *msg);

/* Next request the consumer gave up on (timeout or cancel): 1 with *req_id and
 * *reason (enum shmconn_cancel_reason) set, 0 when none is pending, < 0 on error. */
int shmconn_cancel_poll(shmconn_t *c, uint64_t *req_id, uint32_t *reason);

/* ---- consumer ---- */

/* Open a producer's region, waiting up to wait_s for it to appear (a region left
 * by a dead producer does not count: SHMCONN_E_TIMEOUT). The geometry in cfg must
 * match the region's; anything else is refused (SHMCONN_E_BAD_REGION). */
int shmconn_open(shmconn_t **out, const struct shmconn_config *cfg, double wait_s);

/* Start tracking req_id: its first message must come within first_chunk_deadline_s,
 * each later one within steady_deadline_s of the previous. A message with LAST,
 * ERROR or CANCELLED ends tracking. -EEXIST if it is already tracked. */
int shmconn_request_begin(shmconn_t *c, uint64_t req_id);

/* Stop tracking req_id without telling the producer (e.g. the consumer finished it). */
int shmconn_request_end(shmconn_t *c, uint64_t req_id);

/* Give up on req_id: stop tracking, drop its later messages, and tell the producer. */
int shmconn_request_cancel(shmconn_t *c, uint64_t req_id);

/* Wait up to timeout_s for the next event of any request: a message (any request
 * id, tracked or not, except dropped ones), a deadline expiry, or the loss of the
 * producer (one PEER_LOST event per tracked request). Returns 0 with *ev set,
 * SHMCONN_E_TIMEOUT when nothing happened, or, once the ring is drained and every
 * tracked request has had its PEER_LOST event, SHMCONN_E_PEER_DEAD / SHMCONN_E_CLOSED. */
int shmconn_recv(shmconn_t *c, struct shmconn_event *ev, double timeout_s);

/* Hand back a received message view (in any order). Its slot and payload bytes
 * become reusable once every earlier message has been released too. */
int shmconn_release(shmconn_t *c, const struct shmconn_msg *msg);

/* ---- both ---- */

/* Mark this side closed, wake the peer, unlink the segment name (if it is still
 * ours) and unmap. NULL is a no-op. */
void shmconn_close(shmconn_t *c);

/* Stamp this side's heartbeat (CLOCK_MONOTONIC, in its own header line) so the peer can
 * tell a frozen process (SIGSTOP, a hung loop) from a live one. Costs one store. */
void shmconn_heartbeat(shmconn_t *c);

/* Seconds since the peer last called shmconn_heartbeat on this region, or a negative
 * value when it never did (or is not attached). For readiness checks. */
double shmconn_peer_heartbeat_age(shmconn_t *c);

/* 0 while the peer is alive (or not attached yet), SHMCONN_E_PEER_DEAD when it died,
 * SHMCONN_E_CLOSED when it closed the channel. For /health; costs one poll(2) at most. */
int shmconn_peer_status(shmconn_t *c);

/* Path of the segment, e.g. "/mm3-<run_id>-s0_to_s1" (for logs). */
const char *shmconn_segment_name(const shmconn_t *c);

/* Counters for metrics. */
struct shmconn_stats {
    uint64_t messages; /* sent (producer) or received (consumer) */
    uint64_t bytes;    /* payload bytes sent / received */
    uint64_t waits;    /* times the call had to sleep on the futex */
    uint64_t timeouts; /* request deadline expiries (consumer) */
    uint64_t dropped;  /* messages of cancelled requests dropped (consumer) */
};
void shmconn_stats_get(const shmconn_t *c, struct shmconn_stats *out);

/* Unlink every /dev/shm/<prefix>* segment of our user whose creator process is dead (or
 * that is not a valid region and is older than a few seconds); another user's segment
 * and a live creator's are never touched. prefix "" = default.
 * Returns the number unlinked or a negative errno. */
int shmconn_reclaim_stale(const char *prefix);

/* 1 when s is a run id: exactly SHMCONN_RUN_ID_HEX lowercase hex digits. */
int shmconn_run_id_ok(const char *s);

#endif
