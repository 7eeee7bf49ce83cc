/* The stage-0 engine's shared state (stage0/engine.h is its public face): the engine,
 * its request table's entries, and the functions its parts call across files:
 *   engine.c        life cycle and the api_engine ops (submit, cancel, health);
 *   engine_reqs.c   the request table: entries by job id, references, lifetime;
 *   engine_send.c   the scheduler's sink: START, frames, END and CANCEL to stage 1;
 *   engine_recv.c   the receiver thread: PCM, DONE, ERROR, cancels, attaching stage 1;
 *   engine_play.c   when streams play: prerolling past the real-time capacity, letting go;
 *   engine_loss.c   stage 1 lost: holding journaled songs, re-sending them from the
 *                   frame spool (or by teacher forcing), failing the rest;
 *   engine_continue.c  continue_from: a kept song (stage0/recovery/song_store.h) goes on.
 * Only the engine's files include this. */
#ifndef MM3_STAGE0_ENGINE_INTERNAL_H
#define MM3_STAGE0_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/deploy.h"
#include "common/frame_mix.h"
#include "shmconn/shmconn.h"
#include "stage0/admission.h"
#include "stage0/api/api.h"
#include "stage0/api/job.h"
#include "stage0/playback.h"
#include "stage0/recovery/frame_spool.h"
#include "stage0/recovery/journal.h"
#include "stage0/recovery/song_store.h"
#include "stage0/scheduler.h"

/* Frames per FRAMES message when a held song (async_chunk: false) is sent at its end. */
#define HELD_FRAMES_PER_MSG 100
/* How long the receiver waits for a slow client before failing its job. */
#define PCM_PUSH_TIMEOUT_MS 30000

/* Stage-1 side of one job: from START until DONE / ERROR / cancel / loss. */
struct eng_req {
    int refs;            /* the table's + each thread using it (under engine.mu) */
    struct mm3_job *job; /* one reference */
    uint32_t chunk;      /* next chunk index (step thread only) */
    float *held;         /* async_chunk false: frames kept until the end */
    int n_held, cap_held;
    /* Journal (api.journal_dir): lent by the scheduler while it generates, handed
     * over (jr_owned) when generation ended; an owned one is closed with the entry. */
    struct journal *jr;
    int jr_owned;
    enum journal_stop jr_stop;
    int jr_frames;
    int32_t *ids; /* [2, prompt_len] copy: the prompt of a re-send */
    int prompt_len;
    /* The payloads sent (or, while held, to be sent) so far, beside the journal: a
     * re-send reads them back instead of teacher forcing (step thread only). */
    struct frame_spool *spool;
    /* Stage 1 lost mid-song with a journal: held until it is back (step thread re-sends). */
    int awaiting;
    int64_t await_since_ns;
    int ended, total; /* generation ended (END sent or not): a re-send ends the song too */
    /* PCM (under engine.mu): sample frames got from the current stage 1, and pushed
     * to the client over all attempts; a re-sent song skips what was pushed. */
    int64_t pcm_got, pcm_pushed;
    /* A stream counted against stage 1's real-time capacity (stage0/admission.h), and the
     * stage-1 work (microseconds, its progress tensor) already fed to the estimate. */
    int counted;
    int64_t work_us_seen;
    /* A counted stream that does not fit yet prerolls: its audio (interleaved, pre_n sample
     * frames) is kept here until it plays; then PLAY with play_us goes to stage 1 on the
     * step thread's next tick (play_unsent). Under engine.mu. */
    int preroll;
    /* Alone on its worker at START: stage 1 is told it prerolls, and whether it plays is
     * decided at its first audio, when a burst's later songs have come (a song judged alone
     * that then plays among them would run dry). Under engine.mu. */
    int judge_at_first_audio;
    float *pre_pcm;
    int64_t pre_n, pre_cap;
    int play_unsent;
    int64_t play_us;
    /* The rate its audio has been coming from stage 1: audio seconds per second between its
     * PCM messages, averaged (-1 before two), and when the last came. Under engine.mu. */
    double rate;
    int64_t t_last_pcm_ns;
    struct playback play; /* streamed: its listener, for the stall metrics (under engine.mu) */
    /* The stage-1 worker rendering the song (under engine.mu; set at START and at a
     * re-send, by the step thread), and the frames sent to it for this attempt. */
    struct s1_worker *w;
    int64_t frames_sent;
    /* The codes of every step once generation ended (the song store keeps them when stage
     * 1 delivers the song; under engine.mu). */
    int32_t *codes;
    int n_steps, n_codebooks;
    struct eng_req *next;
};

/* One stage-1 process and its two channels: s0_to_s1 (stage 0 creates, produces) and
 * s1_to_s0 (the worker creates, stage 0 consumes), named per worker
 * (pipe_worker_channel_config). Each has its own receiver thread. */
struct s1_worker {
    struct engine *e;
    int index;
    struct shmconn_config cfg_out, cfg_in;
    pthread_rwlock_t conn_mu; /* read: any use of a handle (they are thread-safe); write: swapping them */
    shmconn_t *out, *in;
    _Atomic int up; /* attached */
    pthread_t rx;
    int rx_started;
    _Atomic int64_t rx_turn_ns; /* mm3_job_now_ns of the receiver's last turn (readiness) */
    int64_t last_connect_log_ns;
};

struct engine {
    const struct mm3_deploy *d;
    struct talker_lora_set lora; /* stage 0's lora_modules, served per request */
    time_t created_unix; /* before any journal of this process (the start-up sweep) */
    struct sched *sched;
    struct api_engine api;
    struct frame_mix mix;
    int raw_width;
    float *mixed; /* [HELD_FRAMES_PER_MSG, hidden] step-thread scratch */
    char prefix[32];
    double send_timeout_s;
    double await_limit_s; /* how long a held song waits for a live worker */
    int raw;              /* MM3_STAGE0_RAW_FRAMES=1: send unmixed frames (premixed 0), to compare */
    int width;            /* floats per frame sent: mix.hidden, or raw_width when raw */

    struct song_store *songs; /* finished songs for continue_from; NULL = continuation off */
    int max_song_frames;      /* the longest song the API serves (stage 0 max_tokens, at most 9000) */
    int n_codebooks, audio_vocab; /* the depth decoder's: an uploaded journal must match them */

    struct s1_worker *workers;
    int n_workers;
    _Atomic int stopping;

    pthread_mutex_t mu;    /* guards reqs, n_reqs, adm */
    struct admission adm;  /* stage 1's measured work per audio second: its real-time capacity */
    double fps;            /* AR frames per second of audio */
    struct eng_req *reqs;
    int n_reqs;
    int max_per_worker;           /* songs one stage-1 worker holds at once (its own bound) */
    _Atomic int n_awaiting;       /* entries held for a stage-1 restart */
    _Atomic int64_t step_turn_ns; /* mm3_job_now_ns of the step loop's last turn (readiness) */
    /* Songs waiting in the scheduler's queue, as the step loop last saw them: the receivers
     * read this, never the scheduler, which engine_destroy frees before joining them. */
    _Atomic int sched_queued;
};

/* ---- engine_reqs.c: the request table (entries live under engine.mu) ---- */

/* A worker that is attached and whose consumer side is not dead. */
int eng_worker_alive(struct s1_worker *w);
/* Windows the worker still has to render for its songs (engine.mu held): per song the
 * frames sent and not yet back as audio, in window hops, at least one while it runs. */
int eng_worker_windows_queued_locked(const struct engine *e, const struct s1_worker *w);
/* Songs bound to the worker and not held (engine.mu held). */
int eng_worker_songs_locked(const struct engine *e, const struct s1_worker *w);
/* The live worker with room (fewer than max_per_worker songs) and the fewest windows
 * queued (then the fewest songs; then the lowest index), or NULL (engine.mu held). */
struct s1_worker *eng_pick_worker_locked(struct engine *e);
/* Publish each worker's up, songs and windows queued (engine.mu held). */
void eng_publish_worker_load_locked(const struct engine *e);

/* 1 for a streamed song that counts against stage 1's real-time capacity. */
int eng_counts_as_stream(const struct mm3_job *job);
/* Entries counted as streams and playing, not prerolling (engine.mu held). */
int eng_streams_locked(const struct engine *e);
/* Link an entry (its refs already set by the caller). */
void eng_req_add(struct engine *e, struct eng_req *r);
/* Unlink the entry of job id bound to worker w (any worker when w is NULL); NULL if
 * gone. The caller owns the table's reference. */
struct eng_req *eng_req_take(struct engine *e, uint64_t id, const struct s1_worker *w);
/* A referenced job of id bound to w (any when NULL), without unlinking (NULL if gone). */
struct mm3_job *eng_req_job(struct engine *e, uint64_t id, const struct s1_worker *w);
/* The entry of job (engine.mu held), NULL if gone. */
struct eng_req *eng_req_find_locked(struct engine *e, struct mm3_job *job);
/* The entry of a job with a reference for the caller (NULL if gone). */
struct eng_req *eng_req_get(struct engine *e, struct mm3_job *job);
/* Drop a reference; the last one closes the journal, removes the spool, frees it. */
void eng_req_put(struct engine *e, struct eng_req *r);
/* Unlink and release the entry of job, if any. */
void eng_drop(struct engine *e, struct mm3_job *job);
/* Fail every entry with msg (MM3_FAIL_STAGE1) and empty the table. */
void eng_fail_all(struct engine *e, const char *msg);

/* ---- engine_send.c: to stage 1 (step thread) ---- */

/* Fill the scheduler's sink with the engine's callbacks (on_tick: engine_loss.c). */
void eng_sink_fill(struct engine *e, struct sched_sink *sink);
/* START with the job's parameters (the same on a re-send). */
int eng_send_start(struct engine *e, struct mm3_job *job, struct eng_req *r);
/* PLAY: the prerolled stream's client started playing at t_play_us (step thread). */
int eng_send_play(struct engine *e, struct eng_req *r, int64_t t_play_us);
/* Payloads [first, first + k) to stage 1 (sent, or kept for the end of a held song).
 * 0, -1 (the job failed), 1 (stage 1 lost: the entry is held). */
int eng_payload_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int k,
                          const float *payload);
/* Model frames [first, first + n) mixed to payloads, spooled, and sent unless send is 0. */
int eng_frames_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int first, int n,
                         const float *frames, int width, int send);
/* Held payloads, then END with the song's total. 0 or -1 (the job failed). */
int eng_end_to_stage1(struct engine *e, struct mm3_job *job, struct eng_req *r, int total);
/* Fail a job whose send returned rc (a SHMCONN_E_* code). */
void eng_fail_send(struct engine *e, struct mm3_job *job, int rc, const char *what);
/* Publish stage 1's real-time capacity (mm3_realtime_capacity_milli). */
void eng_capacity_publish(double cap);
/* The frame spool beside the job's journal, NULL when it cannot be made (logged). */
struct frame_spool *eng_spool_open(struct engine *e, struct mm3_job *job, struct journal *jr);

/* ---- engine_recv.c: from stage 1 (receiver thread) ---- */

/* The receiver of one worker (arg: its struct s1_worker). */
void *eng_rx_thread(void *arg);
/* Close the worker's channels and offer a fresh s0_to_s1 for its next process. */
void eng_reset_channels(struct s1_worker *w);

/* ---- engine_play.c: when streams play (stage0/admission.h) ---- */

/* A new entry bound to its worker, `queued` songs waiting behind it in the scheduler: a
 * counted stream that does not fit prerolls, one alone is judged at its first audio
 * (engine.mu held). */
void eng_play_decide_locked(struct engine *e, struct eng_req *r, int queued);
/* Seconds of the entry's song stage 1 still has to render: its planned length, lowered at
 * the end of generation, less the audio back from the current stage 1 (engine.mu held). */
double eng_left_s_locked(const struct engine *e, const struct eng_req *r);
/* `new_s` seconds of a streamed song's audio go to its client now: its listener is advanced
 * (stall metrics; engine.mu held). */
void eng_listener_advance_locked(struct eng_req *r, double new_s);
/* A PCM message of audio_s seconds for the entry arrived now: its rate (engine.mu held). */
void eng_play_rate_locked(struct eng_req *r, double audio_s, int64_t now_ns);
/* A prerolling entry's audio, interleaved: kept. 0, or -ENOMEM (engine.mu held). */
int eng_preroll_keep_locked(struct eng_req *r, const float *pcm, int64_t n);
/* Let the prerolled streams of worker w that fit now play: their kept audio goes to the
 * client at once (receiver thread of w). */
void eng_play_check(struct engine *e, struct s1_worker *w);
/* Let entry r play now, fit or not (its song is complete); the caller holds a reference. */
void eng_play_now(struct engine *e, struct eng_req *r);
/* PLAY to stage 1 for the entries that began to play (step thread). */
void eng_play_send(struct engine *e);
/* Publish the streams playing and prerolling (engine.mu held). */
void eng_publish_streams_locked(const struct engine *e);

/* ---- engine_continue.c: continue_from ---- */

/* Submit a job whose params.continue_from names a kept song, or whose params.journal is
 * an uploaded journal (validated: intact, finished, this model's, its prompt hash): its
 * params become the song's (conflicts refused naming the field), the whole song's
 * length, the PCM the client does not want skipped; then sched_submit_continue. -EINVAL
 * with the job's error and param set (404 unknown or expired, 400 a conflict or a bad
 * journal), or sched's codes. */
int eng_continue_submit(struct engine *e, struct mm3_job *job);
/* Keep the song of a delivered entry (stage 1's DONE, before the job finishes). */
void eng_continue_keep(struct engine *e, struct eng_req *r);

/* ---- engine_loss.c: stage 1 lost ---- */

/* Hold a journaled entry for stage 1's return instead of failing it (engine.mu held).
 * 1 when held. */
int eng_hold_locked(struct engine *e, struct eng_req *r);
int eng_hold(struct engine *e, struct eng_req *r);
/* A worker is gone: hold its journaled songs (re-sent to a live worker), fail its
 * others, reset its channels. */
void eng_stage1_lost(struct s1_worker *w, const char *why);
/* The scheduler's on_tick: re-send held songs once stage 1 is back, fail the late. */
void eng_sink_tick(void *ctx);

#endif
