/* mm3-stage1 as a server process: the stage-1 half of the pipeline (pipe/pipe_proto.h).
 *
 *     struct s1_server_options o = {.config = "configs/tiny-cpu.yaml", .model = NULL};
 *     return s1_server_run(&o) < 0 ? 1 : 0;       // until SIGINT / SIGTERM
 *
 * Channels: stage 1 creates "s1_to_s0" (producer) and opens "s0_to_s1" (consumer, created
 * by stage 0), both under the segment prefix and run id ($MM3_SHM_PREFIX, default "mm3-";
 * $MM3_RUN_ID and $MM3_RUN_TOKEN, see pipe_run_from_env), with the geometry of
 * pipe/pipe_channel.h (both stages use it: shmconn_open refuses a different geometry).
 *
 * START's num_inference_steps 0 and a negative guidance_scale stand for stage 1's deploy-file
 * defaults (stages[1].num_inference_steps / guidance_scale); stage 0 normally fills both.
 * flow_shift 0 stands for stages[1].flow_shift, or the checkpoint's scheduler shift where
 * the deploy file sets none (stage1/flow.h).
 *
 * Scheduling: at most stage 1's max_num_seqs requests are active (own a render and its DiT
 * workspace); each scheduling round takes at most one ready window per active request, of
 * up to min(max_num_seqs, max_num_batched_tokens, 8) requests (round robin), and runs them
 * as ONE flow batch (stage1/flow_batch.h); on the GPU the previous round's windows are
 * vocoded and sent while the batch's DiT runs (docs/architecture.md, "Batching"). Later requests wait
 * in arrival order; their frames are copied out of the connector (mixed to `hidden` values
 * per frame) into a buffer of their own, so the ring never stalls on them and deadlines keep
 * running. Bounds: at most max_num_seqs(stage 1) + max_num_seqs(stage 0) requests in stage
 * 1 (more: ERROR "stage 1 is full"), each holding at most its max_frames mixed frames.
 * docs/operations.md ("Stage 1 on its own") describes the process from the outside. */
#ifndef MM3_STAGE1_SERVER_H
#define MM3_STAGE1_SERVER_H

/* PCM messages carry at most this many samples per channel (2 MiB of float32 stereo),
 * so any vocoder geometry fits the payload area many times over. */
#define S1_PCM_MAX_SAMPLES (1 << 18)

struct s1_server_options {
    const char *config; /* deploy file (required) */
    const char *model;  /* overrides the file's `model:`; NULL = keep */
};

/* Load everything, print "READY stage1", serve until SIGINT/SIGTERM. Returns 0 after a
 * clean shutdown, < 0 when start-up fails (message in mm3_last_error()). */
int s1_server_run(const struct s1_server_options *o);

#endif
