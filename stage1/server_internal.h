/* Internals shared by stage1/server.c (process, channels, scheduling loop) and
 * stage1/server_request.c (one request: messages in, render, PCM out). */
#ifndef MM3_STAGE1_SERVER_INTERNAL_H
#define MM3_STAGE1_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/resample.h"
#include "pipe/pipe_channel.h"
#include "pipe/pipe_codec.h"
#include "shmconn/shmconn.h"
#include "stage1/backend.h"
#include "stage1/condition.h"
#include "stage1/dit.h"
#include "stage1/flow.h"
#include "stage1/render.h"
#include "stage1/replay_noise.h"
#include "stage1/server.h"
#include "stage1/vocoder.h"
#include "stage1/window_order.h"

/* Server totals, logged at shutdown. */
struct s1_counters {
    uint64_t requests_done, requests_failed, requests_cancelled;
    int64_t windows;
    double audio_s;   /* seconds of audio sent */
    double compute_s; /* seconds spent in windows (condition + DiT + vocoder) */
};

struct s1_server;

struct s1_request {
    uint64_t id;
    struct pipe_request_params p;
    struct s1_server *srv;
    int active;            /* owns a render; else waiting with frames in `held` */
    struct render *render; /* active only */
    float *held;           /* waiting only: mixed frames [n_held, hidden] */
    int n_held, held_cap;
    int64_t frames_in;   /* frames received = the next expected `first` */
    int ended;           /* END received (frames_in is the song's length) */
    int untracked;       /* the consumer no longer tracks its deadlines */
    struct resample *rs; /* sample_rate != native: streaming resampler */
    float *rs_buf;       /* [2, rs_cap] */
    int64_t rs_cap;
    float *song; /* codec_streaming false: [2, song_cap] PCM of the whole song */
    int64_t song_n, song_cap;
    uint32_t chunk_out;  /* next chunk index on s1_to_s0 */
    int64_t samples_out; /* samples per channel sent */
    double t_first_audio; /* s1_now() when its first samples went out, 0 before */
    double t_play;        /* preroll: when its client started playing (PLAY), 0 before */
    double t_last_out;    /* s1_now() of its last PCM message, 0 before */
    int windows_done;    /* for the progress tensor */
    int in_flow;         /* a window of it is out in the server's flow batch */
    int send_rc;         /* first failed send inside the render's sink */
    double t_start, compute_s;
    struct replay_noise replay; /* n > 0: START's "replay" file noise instead of the seed */
};

struct s1_server {
    struct mm3_deploy d;
    const struct mm3_stage_config *st;
    int worker; /* this stage-1 worker's index (MM3_STAGE1_WORKER): its channels and device */
    struct condition_model *cm;
    struct dit_model *dm;
    struct vocoder *voc;
    struct s1_backend be;  /* backend cuda: the GPU DiT, flow loop and vocoder */
    struct flow_batch fb;  /* windows of several requests in one Euler + CFG loop */
    struct flow_job *jobs; /* [fb.max_windows]: the batch in flight */
    uint64_t *job_ids;     /* its requests */
    int *job_rc;
    int rr; /* where the next batch starts looking (round robin) */
    /* Windows are being finished while a DiT batch runs: the wall time is already the
     * batch's, shared among its windows, so a finish adds none to a song's work (the
     * work sums must add up to stage 1's busy time for admission's capacity). */
    int finishing_overlapped;
    struct window_candidate *cand; /* [max_reqs + 1]: the ready windows of a round */
    int native_rate, hop;
    float default_shift; /* START's flow_shift 0: stages[1].flow_shift, else the checkpoint's */
    char prefix[32];
    struct pipe_run run; /* prefix, run id and token (MM3_SHM_PREFIX, MM3_RUN_ID, MM3_RUN_TOKEN) */
    struct shmconn_config in_cfg, out_cfg;
    shmconn_t *in;            /* s0_to_s1 consumer, NULL until stage 0 is there */
    shmconn_t *out;           /* s1_to_s0 producer */
    int stage0_lost;          /* a send or receive found stage 0 dead or closed */
    struct s1_request **reqs; /* arrival order */
    int n_reqs, max_reqs, max_active;
    int codec_streaming;
    double send_timeout_s;
    struct s1_counters tot;

    /* Readiness (docs/operations.md, "Probes"): a thread stamps the heartbeat in
     * s1_to_s0's header every PIPE_HEARTBEAT_PERIOD_S while the serve loop keeps
     * turning (loop_ns), so neither a stopped process nor a stuck loop looks alive. */
    pthread_t hb;
    int hb_started;
    _Atomic int hb_stop;
    _Atomic int64_t loop_ns; /* CLOCK_MONOTONIC of the serve loop's last turn */
    pthread_mutex_t hb_mu;   /* held while `out` is swapped and while the thread uses it */
};

double s1_now(void);

/* One message from s0_to_s1 (the caller releases the view afterwards). */
void s1_request_on_message(struct s1_server *s, const struct shmconn_msg *m);
/* A deadline or peer-loss event of the consumer for request id. */
void s1_request_on_event(struct s1_server *s, const struct shmconn_event *ev);
/* Stage 0 gave up on the request (cancel notice on s1_to_s0): drop it silently. */
void s1_request_drop(struct s1_server *s, uint64_t id, const char *why);

/* Waiting -> active (render created, held frames pushed). */
int s1_request_activate(struct s1_server *s, struct s1_request *q);
/* Window in the batch: prepare the next ready window into *job (1; 0 none ready; < 0 the
 * request failed and is gone). */
int s1_request_prepare(struct s1_server *s, struct s1_request *q, struct flow_job *job);
/* Its flow ended with flow_rc after dit_s seconds of the batch's time: carry it on, or
 * fail the request (then it is gone). */
void s1_request_collect(struct s1_server *s, struct s1_request *q, int flow_rc, double dit_s);
/* Vocode and emit the oldest collected window of an active request, if any, then finish
 * the request when it is complete (it is then gone). */
void s1_request_step(struct s1_server *s, struct s1_request *q);
/* An active request's next window as a batch candidate: its deadline, when its client runs
 * out of audio without it (stage1/window_order.h). */
void s1_request_candidate(const struct s1_server *s, const struct s1_request *q, double now,
                          struct window_candidate *c);
/* 1 when the request has a window to run, a window to finish, or is complete. */
int s1_request_ready(const struct s1_request *q);

/* Fail it: ERROR to stage 0 when `tell` and the channel is alive, stop tracking, free. */
void s1_request_fail(struct s1_server *s, struct s1_request *q, int tell, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

struct s1_request *s1_request_find(struct s1_server *s, uint64_t id);
/* Remove from the list and free. */
void s1_request_remove(struct s1_server *s, struct s1_request *q);

#endif
