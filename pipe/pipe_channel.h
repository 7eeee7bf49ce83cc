/* The geometry of the two pipeline channels (pipe/pipe_proto.h: "s0_to_s1",
 * "s1_to_s0"), in one place for both stages: shmconn_open refuses a segment whose
 * geometry differs from the opener's, so stage 0 and stage 1 must agree exactly.
 *
 *     struct shmconn_config c;
 *     pipe_channel_config(&deploy, PIPE_CHANNEL_S0_TO_S1, prefix, &c);
 */
#ifndef MM3_PIPE_CHANNEL_H
#define MM3_PIPE_CHANNEL_H

#include "common/deploy.h"
#include "pipe/pipe_proto.h"
#include "shmconn/shmconn.h"

/* Not in the deploy file; the same for both stages. */
#define PIPE_CHANNEL_SLOTS 64
#define PIPE_CHANNEL_PAYLOAD_BYTES (64ull << 20) /* a few windows of several requests */
/* Stage 1 stamps its heartbeat (shmconn_heartbeat on s1_to_s0) this often; stage 0's
 * /health/ready says not ready once the last stamp is older than the deadline. */
#define PIPE_HEARTBEAT_PERIOD_S 0.25
#define PIPE_HEARTBEAT_DEADLINE_S 5.0

/* Connector config of `channel` (PIPE_CHANNEL_*) from the deploy file's edge
 * connector: shm_threshold_bytes, first-chunk and steady deadlines, wait slice;
 * slots and payload area as above. `prefix` "" = SHMCONN_DEFAULT_PREFIX (the
 * connector's default). */
void pipe_channel_config(const struct mm3_deploy *d, const char *channel, const char *prefix,
                         struct shmconn_config *cfg);

/* The config of `channel` between stage 0 and stage-1 worker `worker` (0-based): worker
 * 0's channels are the plain "s0_to_s1" / "s1_to_s0", worker k's "<channel>.w<k>", so
 * that each worker has its own pair of rings. */
void pipe_worker_channel_config(const struct mm3_deploy *d, const char *channel, int worker, const char *prefix,
                                struct shmconn_config *cfg);

/* The stage-1 worker this process is, from MM3_STAGE1_WORKER (set by scripts/launch.sh;
 * absent = 0): a bad value, or one not below n_workers, is an error naming it. */
int pipe_worker_from_env(int n_workers, int *worker);

/* Who the two stages of one replica are, from the environment scripts/launch.sh sets:
 * MM3_SHM_PREFIX (1-31 characters of [A-Za-z0-9._-], no "..", default "mm3-"),
 * MM3_RUN_ID (32 lowercase hex digits: 128 random bits, part of every segment name)
 * and MM3_RUN_TOKEN (32 hex digits: the secret each stage checks in its peer's
 * segment). Without MM3_RUN_ID and MM3_RUN_TOKEN the segment names are the
 * predictable <prefix><channel> and the token is all zero: other users are still
 * kept out by the owner check, but they can take the names first (denial of service). */
struct pipe_run {
    char prefix[32];
    char run_id[SHMCONN_RUN_ID_HEX + 1]; /* "" when not set */
    uint8_t token[SHMCONN_TOKEN_BYTES];
};

/* Reads and validates the three variables; a bad value is an error naming it. */
int pipe_run_from_env(struct pipe_run *run);

/* 1 when prefix is a usable segment prefix (see struct pipe_run). */
int pipe_prefix_ok(const char *prefix);

/* Put the run's id and token into a channel config (after pipe_channel_config). */
void pipe_run_apply(const struct pipe_run *run, struct shmconn_config *cfg);

/* The segment name of a channel config, "/<prefix>[<run_id>-]<name>", for logs. */
const char *pipe_segment_name(const struct shmconn_config *cfg, char *buf, size_t cap);

#endif
