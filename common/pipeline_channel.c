#include "common/pipeline_channel.h"

#include <stdio.h>
#include <string.h>

void pipe_channel_config(const struct mm3_deploy *d, const char *channel, const char *prefix,
                         struct shmconn_config *cfg)
{
    const struct mm3_connector_config *k = mm3_deploy_edge_connector(d);
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->name, sizeof cfg->name, "%s", channel);
    snprintf(cfg->prefix, sizeof cfg->prefix, "%s", prefix);
    cfg->shm_threshold_bytes = (uint64_t)k->shm_threshold_bytes;
    cfg->payload_bytes = PIPE_CHANNEL_PAYLOAD_BYTES;
    cfg->n_slots = PIPE_CHANNEL_SLOTS;
    cfg->first_chunk_deadline_s = mm3_connector_first_chunk_deadline_s(k);
    cfg->steady_deadline_s = mm3_connector_steady_deadline_s(k);
    cfg->wait_slice_s = k->get_sleep_s;
}
