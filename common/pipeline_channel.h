/* The geometry of the two pipeline channels (common/pipeline_proto.h: "s0_to_s1",
 * "s1_to_s0"), in one place for both stages: shmconn_open refuses a segment whose
 * geometry differs from the opener's, so stage 0 and stage 1 must agree exactly.
 *
 *     struct shmconn_config c;
 *     pipe_channel_config(&deploy, PIPE_CHANNEL_S0_TO_S1, prefix, &c);
 *
 * Only the struct of shmconn/shmconn.h is used here (no call into mm3_shmconn). */
#ifndef MM3_COMMON_PIPELINE_CHANNEL_H
#define MM3_COMMON_PIPELINE_CHANNEL_H

#include "common/deploy.h"
#include "shmconn/shmconn.h"

/* Not in the deploy file; the same for both stages. */
#define PIPE_CHANNEL_SLOTS 64
#define PIPE_CHANNEL_PAYLOAD_BYTES (64ull << 20) /* a few windows of several requests */

/* Connector config of `channel` (PIPE_CHANNEL_*) from the deploy file's edge
 * connector: shm_threshold_bytes, first-chunk and steady deadlines, wait slice;
 * slots and payload area as above. `prefix` "" = SHMCONN_DEFAULT_PREFIX (the
 * connector's default). */
void pipe_channel_config(const struct mm3_deploy *d, const char *channel, const char *prefix,
                         struct shmconn_config *cfg);

#endif
