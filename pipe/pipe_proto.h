/* The messages between the two stage processes (over shmconn/, one channel each way);
 * pipe/pipe_codec.h encodes and checks them, pipe/pipe_channel.h sets the channels up.
 *
 * stage 0 -> stage 1 (channel "s0_to_s1"), per request, in order:
 *   PIPE_MSG_START  flags FIRST   tensor "params": U8 [sizeof(struct pipe_request_params)];
 *                                 optional tensor "replay": U8 [n] path (no NUL) of a golden
 *                                 case file whose window.w.noise replaces the seeded noise
 *                                 (testing aid, refused unless MM3_ALLOW_REPLAY=1 in stage 1
 *                                 and the file is inside api.replay_dir: replay_file.h)
 *   PIPE_MSG_FRAMES               tensor "frames": F32 [n, width] (width = 8*hidden raw, or
 *                                 hidden when pre-mixed), tensor "first": I64 [1] = index of
 *                                 the first frame; each frame is sent exactly once
 *   PIPE_MSG_END    flags LAST    tensor "total": I64 [1] = number of frames of the song
 *   PIPE_MSG_CANCEL flags CANCELLED (client went away or stage 0 failed the request)
 *   PIPE_MSG_PLAY                 tensor "t_play_us": I64 [1] = CLOCK_MONOTONIC microseconds
 *                                 when stage 0 let a prerolled stream's client start playing
 *                                 (params.preroll 1); may come after END
 *
 * stage 1 -> stage 0 (channel "s1_to_s0"):
 *   PIPE_MSG_PCM                  tensor "pcm": F32 [2, n] channel-major, clamped, at the
 *                                 request's sample rate; tensor "progress": I64 [3] =
 *                                 {windows done, windows planned or 0 if unknown,
 *                                 microseconds of stage-1 work on the song so far (stage 0's
 *                                 real-time capacity: stage0/admission.h)}; n = 0
 *                                 (codec_streaming off: the audio waits for the end) is a
 *                                 rendered window's progress alone
 *   PIPE_MSG_DONE   flags LAST    tensor "total": I64 [1] = samples per channel sent; optional
 *                                 tensor "fp16_rescues": I64 [1] = windows and decodes stage 1
 *                                 reran since it started because fp16 operands overflowed
 *   PIPE_MSG_ERROR  flags ERROR   tensor "message": U8 [n] UTF-8 text (no NUL)
 *
 * Everything a stage needs to know about a request travels in START. */
#ifndef MM3_PIPE_PROTO_H
#define MM3_PIPE_PROTO_H

#include <stdint.h>

#define PIPE_CHANNEL_S0_TO_S1 "s0_to_s1"
#define PIPE_CHANNEL_S1_TO_S0 "s1_to_s0"

/* Windows in one stage-1 DiT batch at most, whatever max_num_seqs / max_num_batched_tokens
 * allow: mm3-bench-dit shows the gain flat from 4 to 8 windows while activations keep
 * growing. Stage 0 counts on it for the wait a ready window can meet (stage0/admission.h). */
#define PIPE_BATCH_WINDOWS_MAX 8

enum pipe_msg_kind {
    PIPE_MSG_START = 1,
    PIPE_MSG_FRAMES = 2,
    PIPE_MSG_END = 3,
    PIPE_MSG_CANCEL = 4,
    PIPE_MSG_PLAY = 5,
    PIPE_MSG_PCM = 16,
    PIPE_MSG_DONE = 17,
    PIPE_MSG_ERROR = 18,
};

/* Fixed little-endian layout (both processes are the same build on one host; the
 * version field still guards against a stale peer binary). */
#define PIPE_PARAMS_VERSION 2
struct pipe_request_params {
    uint32_t version;             /* PIPE_PARAMS_VERSION */
    uint32_t frame_width;         /* floats per frame in FRAMES messages */
    uint64_t seed;                /* request seed (stage-1 noise derives from it per window) */
    int32_t max_frames;           /* frame budget of the request (upper bound of the song) */
    int32_t num_inference_steps;  /* Euler steps per window */
    float guidance_scale;         /* DiT CFG scale */
    int32_t sample_rate;          /* 44100 (native) or 32000 (resampled in stage 1) */
    int32_t premixed;             /* 1: frames already softmax-mixed to `hidden` values */
    float flow_shift;             /* scheduler shift in (0, 20]; 0 = stage 1's default */
    int32_t streamed;             /* 1: the client plays the audio as it arrives (stage 1 gives the
                                     song's windows playback deadlines); 0: one file at the end */
    int32_t preroll;              /* streamed: 1 when stage 0 keeps the audio back until the
                                     server can keep the stream fed: no deadlines until PLAY */
    int32_t reserved[4];
};
_Static_assert(sizeof(struct pipe_request_params) == 64, "pipeline ABI");

#endif
