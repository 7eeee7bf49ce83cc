#include "pipe/pipe_channel.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

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

void pipe_worker_channel_config(const struct mm3_deploy *d, const char *channel, int worker, const char *prefix,
                                struct shmconn_config *cfg)
{
    pipe_channel_config(d, channel, prefix, cfg);
    if (worker > 0) snprintf(cfg->name, sizeof cfg->name, "%s.w%d", channel, worker);
}

int pipe_worker_from_env(int n_workers, int *worker)
{
    *worker = 0;
    const char *v = getenv("MM3_STAGE1_WORKER");
    if (!v || !*v) return 0;
    char *end;
    errno = 0;
    long k = strtol(v, &end, 10);
    if (errno || *end || k < 0 || k >= n_workers)
        return mm3_errorf(-EINVAL,
                          "MM3_STAGE1_WORKER '%.32s': expected a worker index 0..%d (the deploy file gives stage 1 %d "
                          "worker%s)",
                          v, n_workers - 1, n_workers, n_workers == 1 ? "" : "s");
    *worker = (int)k;
    return 0;
}

int pipe_prefix_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > 31 || strstr(p, "..")) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= '0' && p[i] <= '9') ||
              p[i] == '.' || p[i] == '_' || p[i] == '-'))
            return 0;
    return 1;
}

static int hex_digit(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

int pipe_run_from_env(struct pipe_run *run)
{
    memset(run, 0, sizeof *run);
    const char *p = getenv("MM3_SHM_PREFIX");
    if (!p || !*p) p = SHMCONN_DEFAULT_PREFIX;
    if (!pipe_prefix_ok(p))
        return mm3_errorf(-EINVAL, "MM3_SHM_PREFIX '%.64s': expected 1-31 characters of [A-Za-z0-9._-] without '..'",
                          p);
    snprintf(run->prefix, sizeof run->prefix, "%s", p);
    const char *id = getenv("MM3_RUN_ID"), *tok = getenv("MM3_RUN_TOKEN");
    if (id && !*id) id = NULL;
    if (tok && !*tok) tok = NULL;
    if (!id && !tok) return 0;
    if (!id || !tok)
        return mm3_errorf(-EINVAL, "%s is set but %s is not: set both (scripts/launch.sh does) or neither",
                          id ? "MM3_RUN_ID" : "MM3_RUN_TOKEN", id ? "MM3_RUN_TOKEN" : "MM3_RUN_ID");
    if (!shmconn_run_id_ok(id))
        return mm3_errorf(-EINVAL, "MM3_RUN_ID '%.40s': expected %d lowercase hex digits", id, SHMCONN_RUN_ID_HEX);
    if (strlen(tok) != 2 * SHMCONN_TOKEN_BYTES)
        return mm3_errorf(-EINVAL, "MM3_RUN_TOKEN: expected %d hex digits", 2 * SHMCONN_TOKEN_BYTES);
    for (int i = 0; i < SHMCONN_TOKEN_BYTES; i++) {
        int hi = hex_digit(tok[2 * i]), lo = hex_digit(tok[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return mm3_errorf(-EINVAL, "MM3_RUN_TOKEN: expected %d hex digits", 2 * SHMCONN_TOKEN_BYTES);
        run->token[i] = (uint8_t)(hi << 4 | lo);
    }
    snprintf(run->run_id, sizeof run->run_id, "%s", id);
    return 0;
}

const char *pipe_segment_name(const struct shmconn_config *cfg, char *buf, size_t cap)
{
    snprintf(buf, cap, "/%s%s%s%s", cfg->prefix[0] ? cfg->prefix : SHMCONN_DEFAULT_PREFIX, cfg->run_id,
             cfg->run_id[0] ? "-" : "", cfg->name);
    return buf;
}

void pipe_run_apply(const struct pipe_run *run, struct shmconn_config *cfg)
{
    snprintf(cfg->run_id, sizeof cfg->run_id, "%s", run->run_id);
    memcpy(cfg->token, run->token, sizeof cfg->token);
}
