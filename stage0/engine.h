/* The stage-0 engine: the scheduler (stage0/scheduler.h) wired to stage 1 over the
 * two pipeline channels (pipe/pipe_proto.h), behind struct api_engine.
 *
 * Channels: stage 0 CREATES "s0_to_s1" (producer) and OPENS "s1_to_s0" (consumer,
 * created by stage 1), both under the segment prefix and run id (MM3_SHM_PREFIX,
 * MM3_RUN_ID, MM3_RUN_TOKEN), with the geometry stage 1 uses (pipe/pipe_channel.h).
 *
 * Frames go to stage 1 as produced (async_chunk: true), pre-mixed to `hidden`
 * floats with common/frame_mix.h, or held and sent when the song ends
 * (async_chunk: false); MM3_STAGE0_RAW_FRAMES=1 sends raw frames instead (premixed 0,
 * for comparisons). A receiver thread turns PCM into job chunks (channel-major
 * [2, n] -> interleaved), DONE into mm3_job_finish, ERROR into a failure. Stage 1 may
 * be several workers (mm3_deploy_stage1_workers), each with its own pair of channels
 * (pipe_worker_channel_config) and receiver thread; each song is bound to the least
 * loaded live worker. When a worker dies, its journaled songs are re-sent to a live
 * worker, the others fail ("stage 1 died mid-song"); with no worker left /health says
 * stage 1 down and new requests get 503 "stage 1 unavailable"; the engine re-creates
 * the worker's channel and waits for its next process to attach.
 *
 *     engine_create(&e, &deploy, &lm, &dd, tok, ckpt_root, &run);
 *     engine_start(e, 30.0);              // waits up to 30 s for stage 1, then serves anyway
 *     http_server_start(&srv, &cfg, engine_api(e));
 *     ...
 *     http_server_stop(srv);
 *     engine_destroy(e);                   // fails what is left, closes both channels
 */
#ifndef MM3_STAGE0_ENGINE_H
#define MM3_STAGE0_ENGINE_H

#include "common/deploy.h"
#include "stage0/api/api.h"
#include "stage0/model/depth.h"
#include "stage0/model/talker.h"
#include "stage0/text/tokenizer.h"

struct engine;
struct pipe_run;

/* Reads the frame mix from ckpt_root/condition_encoder. run: the segment prefix, run id
 * and token (pipe/pipe_channel.h: pipe_run_from_env); NULL = the default prefix,
 * no run id. */
int engine_create(struct engine **out, const struct mm3_deploy *d, const struct talker *lm, const struct depth *dd,
                  const struct tokenizer *tok, const char *ckpt_root, const struct pipe_run *run);

/* Reclaim stale segments, create s0_to_s1, start the receiver and the step loop;
 * wait up to wait_s for stage 1 to attach (logged), but come up without it. */
int engine_start(struct engine *e, double wait_s);

/* 1 while stage 1 is attached. */
int engine_stage1_up(struct engine *e);

/* The ops table for http_server_start (valid until engine_destroy). */
struct api_engine *engine_api(struct engine *e);

/* Stop the step loop and the receiver, fail every in-flight job with 503
 * "server shutting down" (stage 1 gets CANCEL), close both channels. */
void engine_destroy(struct engine *e);

#endif
