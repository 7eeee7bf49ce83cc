/* The deploy file: one YAML document that says how the two stages of one mm3
 * replica run (devices, batch sizes, graphs, connector timeouts, HTTP limits).
 *
 * The format mirrors vLLM-Omni's `deploy/minimax_music3.yaml` so an upstream
 * file reads the same here, plus a few keys of our own (model, backend, api,
 * matmul_precision, num_inference_steps, guidance_scale, flow_shift, mps, mps_thread_percentage,
 * stream_priority, window_order). Every key is
 * documented in docs/configuration.md.
 *
 * Loading produces a fully typed struct: no YAML survives it. Unknown keys,
 * duplicate keys, wrong types and out-of-range values are errors whose message
 * reads "<file>:<line>:<col>: <key path>: <what was expected>"; doubtful but
 * legal settings are warnings in the same format, logged with LOG_WARN and
 * kept in `warnings`.
 *
 *     struct mm3_deploy d;
 *     if (mm3_deploy_load(&d, "configs/minimax_music3.yaml") < 0)
 *         fprintf(stderr, "%s\n", mm3_last_error());
 *     const struct mm3_stage_config *s0 = mm3_deploy_stage(&d, 0);
 */
#ifndef MM3_DEPLOY_H
#define MM3_DEPLOY_H

#include <stdbool.h>
#include <stdint.h>

#include "common/dtype.h"

#define MM3_DEPLOY_NUM_STAGES 2
#define MM3_DEPLOY_NAME_MAX 64
#define MM3_DEPLOY_PATH_MAX 1024
#define MM3_DEPLOY_API_KEY_MAX 256
#define MM3_DEPLOY_MAX_CONNECTORS 8
#define MM3_DEPLOY_MAX_CAPTURE_SIZES 64
#define MM3_DEPLOY_MAX_DEVICES 16
/* Stage-1 workers one stage 0 feeds at most (`replicas`). */
#define MM3_DEPLOY_MAX_WORKERS 16
#define MM3_DEPLOY_MAX_WARNINGS 32
#define MM3_DEPLOY_WARNING_MAX 512
#define MM3_DEPLOY_FILE_BYTES_MAX (1 << 20)
#define MM3_DEPLOY_MAX_LORA 8
/* Per-request talker adapters (lora_modules) loaded at once. */
#define MM3_DEPLOY_MAX_LORA_MODULES 8
#define MM3_DEPLOY_LORA_NAME_MAX 64
/* 1 when name may name a lora_modules adapter (a request, a journal name it):
 * 1..MM3_DEPLOY_LORA_NAME_MAX - 1 of [A-Za-z0-9._-]. */
int mm3_lora_name_valid(const char *name);
/* The model id the API serves (/v1/models, a request's `model`); no adapter may take it. */
#define MM3_SERVED_MODEL_NAME "MiniMax-Music3"

/* Serving limits of the model recipe (vLLM-Omni constants.py), not geometry:
 * the prompt cap of the HTTP contract, the longest song in AR frames, and the
 * two extra stage-0 steps (hold step + stop step) that deliver the last window. */
#define MM3_DEPLOY_PROMPT_TOKENS_MAX 5000
#define MM3_DEPLOY_AUDIO_FRAMES_MAX 9000
#define MM3_DEPLOY_EXTRA_AR_STEPS 2

enum mm3_backend { MM3_BACKEND_AUTO = 0, MM3_BACKEND_CPU, MM3_BACKEND_CUDA };

/* Operands of stage 1's GEMMs; float32 accumulation in every one. */
enum mm3_matmul_precision {
    MM3_MATMUL_FP32 = 0,
    MM3_MATMUL_TF32,
    MM3_MATMUL_BF16,
    MM3_MATMUL_FP16,
    MM3_MATMUL_FP8,
    MM3_MATMUL_COUNT
};

/* Whether scripts/launch.sh runs the stages under a private CUDA MPS daemon. OFF: never
 * (the two processes time-slice the GPU); AUTO: when the backend may be CUDA, falling
 * back to no MPS where the daemon cannot start; ON: required (the launcher fails without). */
enum mm3_mps_mode { MM3_MPS_OFF = 0, MM3_MPS_AUTO, MM3_MPS_ON };

/* Priority of the CUDA streams a stage creates, against the other stage's under MPS:
 * NORMAL is CUDA's default priority, HIGH its greatest, LOW its least. */
enum mm3_stream_priority { MM3_STREAM_PRIORITY_NORMAL = 0, MM3_STREAM_PRIORITY_HIGH, MM3_STREAM_PRIORITY_LOW };
/* How stage 1 picks the windows of a DiT batch (stage1/window_order.h). */
enum mm3_window_order { MM3_WINDOW_ORDER_DEADLINE = 0, MM3_WINDOW_ORDER_FIFO };

/* NONE: every step eager. FULL_DECODE_ONLY: steps in which every row is in
 * steady state (stage 0: pure decode) replay a graph captured per batch size. */
enum mm3_cudagraph_mode { MM3_CUDAGRAPH_NONE = 0, MM3_CUDAGRAPH_FULL_DECODE_ONLY };

/* Element type of stage 0's KV cache (vLLM's kv_cache_dtype). AUTO: bfloat16 on the
 * CUDA backend (the model runs in bf16), float32 on the CPU backend, which keeps
 * float32 whatever is asked (stage0/model/talker_backend.h decides). */
enum mm3_kv_cache_dtype { MM3_KV_CACHE_AUTO = 0, MM3_KV_CACHE_BF16, MM3_KV_CACHE_F32 };

/* One entry of `connectors:`. */
struct mm3_connector_config {
    char name[MM3_DEPLOY_NAME_MAX];            /* key under connectors:, what stages refer to */
    char connector_class[MM3_DEPLOY_NAME_MAX]; /* its `name:` value: "SharedMemoryConnector" */
    bool codec_streaming;                      /* stage 1 returns PCM per window (true) or once per song */
    int64_t shm_threshold_bytes;               /* payloads up to this travel inline in the ring slot */
    double get_sleep_s;                        /* connector_get_sleep_s: one wait slice of a receiver */
    int64_t get_max_wait_first_chunk;          /* slices to wait for the first message of a request */
    int64_t get_max_wait;                      /* slices to wait between later messages */
    bool used;                                 /* some stage names it */
};

/* One entry of a stage's `lora:` list: a PEFT adapter folder merged into the
 * weights of `component` at load, scaled by `scale` (common/lora_merge.h). */
struct mm3_lora_config {
    char path[MM3_DEPLOY_PATH_MAX];
    double scale;
    char component[MM3_DEPLOY_NAME_MAX]; /* stage 0: language_model | rvq_depth_decoder; stage 1: transformer */
};

/* One entry of stage 0's `lora_modules:` list: a talker adapter a request picks by
 * name (its `model` or `lora` field), applied without merging (stage0/model/talker_lora.h). */
struct mm3_lora_module_config {
    char name[MM3_DEPLOY_LORA_NAME_MAX]; /* 1..63 of [A-Za-z0-9._-], unique, not MM3_SERVED_MODEL_NAME */
    char path[MM3_DEPLOY_PATH_MAX];
    double scale;
};

struct mm3_compilation_config {
    int mode; /* always 0: mm3 compiles nothing */
    int n_capture_sizes;
    int capture_sizes[MM3_DEPLOY_MAX_CAPTURE_SIZES]; /* strictly ascending batch sizes (rows) */
    enum mm3_cudagraph_mode cudagraph_mode;
    int cudagraph_num_of_warmups; /* eager runs of a size before it is captured */
    bool fused_ops;               /* custom_ops ["all"] (true) or ["none"] (unfused chain) */
};

struct mm3_stage_config {
    int stage_id;
    int max_num_seqs;                       /* stage 0: rows (2 per song with CFG); stage 1: songs */
    double gpu_memory_utilization;          /* share of the device this stage may allocate, (0,1] */
    enum mm3_dtype dtype;                   /* MM3_DTYPE_BF16 or MM3_DTYPE_F32 */
    enum mm3_kv_cache_dtype kv_cache_dtype; /* stage 0 only: "auto" | "bfloat16" | "float32" */
    int max_model_len;                      /* stage 0: KV positions per row; stage 1: windows per song */
    int max_num_batched_tokens;             /* stage 0: tokens per step; stage 1: windows per DiT batch */
    bool enforce_eager;                     /* true: no CUDA graphs in this stage */
    struct mm3_compilation_config compilation;
    bool async_scheduling;      /* always false (checked) */
    bool enable_prefix_caching; /* always false (checked) */
    char devices_text[MM3_DEPLOY_NAME_MAX];
    int n_devices;
    int devices[MM3_DEPLOY_MAX_DEVICES];        /* CUDA ordinals; stage 0 runs on devices[0], stage 1 runs
                                                   one worker per listed device */
    int replicas; /* stage 1 only: workers on its one device (1 unless given); with several devices, = n_devices */
    char input_connector[MM3_DEPLOY_NAME_MAX];  /* stage 1: from_stage_0 ("" = default) */
    char output_connector[MM3_DEPLOY_NAME_MAX]; /* stage 0: to_stage_1 ("" = default) */
    int mps_thread_percentage;                  /* CUDA_MPS_ACTIVE_THREAD_PERCENTAGE under MPS, 1..100; 0 = no limit */
    enum mm3_stream_priority stream_priority;   /* of the CUDA streams the stage creates */
    int n_lora;
    struct mm3_lora_config lora[MM3_DEPLOY_MAX_LORA]; /* merged at load, in list order */
    int n_lora_modules;                               /* stage 0 only */
    struct mm3_lora_module_config lora_modules[MM3_DEPLOY_MAX_LORA_MODULES]; /* served per request */

    /* default_sampling_params */
    double temperature; /* stage 0: 1.0; stage 1: 0.0 (both checked) */
    int64_t max_tokens; /* stage 0: AR steps incl. hold+stop; stage 1: windows */
    uint64_t seed;      /* default request seed (stage 1 must equal stage 0) */
    /* default_sampling_params.extra_args (stage 0) */
    double cfg_scale; /* AR guidance; CFG is on when > 1 */
    bool cfg_enabled;

    /* stage 1 only */
    enum mm3_matmul_precision matmul_precision;
    int num_inference_steps; /* default Euler steps per window */
    double guidance_scale;   /* default DiT guidance; 1.0 skips the uncond branch */
    double flow_shift;       /* default scheduler shift, (0, 20]; 0 = the checkpoint's */
    enum mm3_window_order window_order; /* deadline (streams' playback first) or fifo (round robin) */

    int line; /* where the stage's entry starts (1-based) */
};

struct mm3_api_config {
    char host[MM3_DEPLOY_NAME_MAX];
    int port; /* 0 = any free port */
    int max_queue_depth;
    int64_t max_body_bytes;
    int max_connections;
    double request_timeout_s;
    char journal_dir[MM3_DEPLOY_PATH_MAX]; /* "" = no journal */
    char replay_dir[MM3_DEPLOY_PATH_MAX];  /* x_replay_file names must be files inside it; "" = refused */
    int64_t max_buffered_bytes;            /* whole-file answers held in memory, all connections together */
    int default_sample_rate;               /* 44100 or 32000 */
    int idle_timeout_s;                    /* a connection silent this long is closed */
    double request_read_timeout_s;         /* a whole request (headers + body) must arrive in this */
    int max_connections_per_client;        /* per client address; 0 = no limit */
    int admin_connections;                 /* beyond max_connections, for /health* and /metrics only */
    double drain_timeout_s;                /* on SIGTERM: in-flight songs may finish within this */
    double stream_capacity_share;          /* of stage 1's real-time capacity playing streams fill (0, 1] */
    char api_key[MM3_DEPLOY_API_KEY_MAX];  /* "" = no key; else Bearer required on /v1 paths */
    /* Finished songs kept in stage 0's memory for continue_from (stage0/recovery/song_store.h). */
    int continue_max_songs;      /* 0 = continuation off */
    int64_t continue_max_bytes;  /* their codes, captions and lyrics together */
    double continue_max_age_s;   /* a song older than this cannot be continued */
};

struct mm3_deploy {
    char source[MM3_DEPLOY_PATH_MAX]; /* file name used in messages */
    char pipeline[MM3_DEPLOY_NAME_MAX];
    bool async_chunk;
    bool trust_remote_code;
    char model[MM3_DEPLOY_PATH_MAX]; /* checkpoint directory; "" = must come from --model */
    enum mm3_backend backend;
    enum mm3_mps_mode mps; /* read by scripts/launch.sh (mm3-deploy --launch-env) */
    struct mm3_api_config api;
    int n_connectors;
    struct mm3_connector_config connectors[MM3_DEPLOY_MAX_CONNECTORS];
    /* The 0->1 edge (and its return path): the named connector, or built-in
     * defaults when no stage names one. */
    struct mm3_connector_config edge;
    struct mm3_stage_config stages[MM3_DEPLOY_NUM_STAGES];
    int n_warnings;
    char warnings[MM3_DEPLOY_MAX_WARNINGS][MM3_DEPLOY_WARNING_MAX];
};

/* Fill every field with its documented default (the values of
 * configs/minimax_music3.yaml); what a program runs with when given no file. */
void mm3_deploy_init_defaults(struct mm3_deploy *d);

/* Load and validate a deploy file (keys absent from it keep their defaults).
 * On error `d` holds the defaults again, never a half-read file, and the
 * message says "<file>:<line>:<col>: <key path>: <expected>". */
int mm3_deploy_load(struct mm3_deploy *d, const char *path);
int mm3_deploy_load_string(struct mm3_deploy *d, const char *yaml, const char *name_for_messages);
void mm3_deploy_free(struct mm3_deploy *d);

/* --model overrides the file's `model`. */
int mm3_deploy_set_model(struct mm3_deploy *d, const char *path);

/* Decide `backend: auto` (cuda when a GPU is present) and check that the
 * stages' dtypes exist on the result (the CPU backend is float32 only). */
int mm3_deploy_resolve_backend(struct mm3_deploy *d, bool gpu_present);

/* NULL when stage_id is not 0 or 1. */
const struct mm3_stage_config *mm3_deploy_stage(const struct mm3_deploy *d, int stage_id);
/* The connector declared under `connectors.<name>`, or NULL. */
/* Stage-1 workers (each its own process and channel pair): one per device of stage 1's
 * `devices`, or `replicas` on its one device; 1 by default. */
int mm3_deploy_stage1_workers(const struct mm3_deploy *d);
/* The CUDA device of stage-1 worker k (0 <= k < mm3_deploy_stage1_workers). */
int mm3_deploy_stage1_worker_device(const struct mm3_deploy *d, int k);
const struct mm3_connector_config *mm3_deploy_connector(const struct mm3_deploy *d, const char *name);
/* The connector of the stage-0 -> stage-1 edge; never NULL. */
const struct mm3_connector_config *mm3_deploy_edge_connector(const struct mm3_deploy *d);

/* sleep_s x max_wait_first_chunk: how long a receiver waits for the first
 * message of a request before failing it. */
double mm3_connector_first_chunk_deadline_s(const struct mm3_connector_config *c);
/* sleep_s x max_wait: how long it waits for each later message. */
double mm3_connector_steady_deadline_s(const struct mm3_connector_config *c);

const char *mm3_backend_name(enum mm3_backend b);
const char *mm3_matmul_precision_name(enum mm3_matmul_precision p);
const char *mm3_cudagraph_mode_name(enum mm3_cudagraph_mode m);
const char *mm3_mps_mode_name(enum mm3_mps_mode m);
const char *mm3_stream_priority_name(enum mm3_stream_priority p);
/* +1 (high), 0 (normal) or -1 (low): the level cuda_stream_priority_set takes. */
int mm3_deploy_stream_priority_level(enum mm3_stream_priority p);
const char *mm3_window_order_name(enum mm3_window_order o);
/* "auto", "bfloat16" or "float32" (the deploy file's spelling). */
const char *mm3_kv_cache_dtype_name(enum mm3_kv_cache_dtype t);
/* The inverse (command-line options); -EINVAL naming the accepted values. */
int mm3_kv_cache_dtype_parse(const char *name, enum mm3_kv_cache_dtype *out);

#endif
