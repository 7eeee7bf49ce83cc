/* The request journal (docs/journal.md): one append-only file per accepted request
 * in api.journal_dir, so that a song whose stage-1 side was lost can be completed
 * from its codes, and any finished song re-rendered (mm3-rerender).
 *
 * A journal holds the request (id, seed, caption, lyrics, every mm3_job_params field,
 * the prompt length and a hash of the prompt ids pair), then the codes of every LM
 * step in order (n_codebooks int32 per step, step 0 = the draw at <|audio_start|>,
 * which is fed back but not emitted: frame t is step t + 1), zstd-compressed and
 * flushed every JOURNAL_FLUSH_STEPS steps, then an end record (status, stop reason).
 * Teacher forcing from these codes gives the frames exactly (stage0/teacher_force.h).
 *
 *     struct journal *j = NULL;
 *     if (journal_open_write(&j, dir, id, &params, ncb, audio_vocab, ids_pair, P) < 0)
 *         LOG_WARN("%s", mm3_last_error());          // the request goes on without one
 *     ... after every generate_sample()/generate_step(): journal_append_codes(j, g.codes, 1);
 *     journal_close(j, JOURNAL_DONE, JOURNAL_STOP_TOKEN);
 *
 * Failure policy: journaling never fails a request. A NULL writer is a valid no-op;
 * a write error (disk full, I/O error) is logged once with the path and reason, and
 * the writer then drops everything for that request. Readers ignore a torn tail.
 * One writer per request; a writer is not shared between threads. */
#ifndef MM3_STAGE0_JOURNAL_H
#define MM3_STAGE0_JOURNAL_H

#include <stdint.h>

#include "stage0/api/job.h"

/* Version 2: the header may name the song's per-request adapter ("lora"), which a
 * reader must apply; journals without one are written as version 1, which readers of
 * either version read the same. */
#define JOURNAL_VERSION 2
#define JOURNAL_VERSION_NO_LORA 1
#define JOURNAL_SUFFIX ".mm3j"
#define JOURNAL_ID_MAX 96      /* request id: 1..95 of [A-Za-z0-9._-] */
#define JOURNAL_FLUSH_STEPS 25 /* a crash loses at most this many steps (one second of audio) */
#define JOURNAL_MAX_CODEBOOKS 64

enum journal_status {
    JOURNAL_OPEN = 0,    /* no end record (yet): the writer died, or still writing */
    JOURNAL_DONE,        /* the song was delivered */
    JOURNAL_FAILED,      /* the request failed (not by stage 1) */
    JOURNAL_CANCELLED,   /* the client went away */
    JOURNAL_INTERRUPTED, /* stage 1 went away before the song was delivered */
};

enum journal_stop {
    JOURNAL_STOP_NONE = 0, /* generation did not end (failed, cancelled, interrupted early) */
    JOURNAL_STOP_TOKEN,    /* <|audio_end|> drawn */
    JOURNAL_STOP_BUDGET,   /* max_frames reached */
};

struct journal_header {
    char request_id[JOURNAL_ID_MAX];
    struct mm3_job_params params; /* strings owned by the record */
    int32_t n_codebooks;
    int32_t c0_codes;     /* c0 in [0, c0_codes) (SAMPLER_N_CODES) */
    int32_t audio_vocab;  /* c1.. in [0, audio_vocab) */
    int32_t prompt_len;   /* tokens per row of the ids pair */
    uint64_t prompt_hash; /* journal_prompt_hash(ids_pair, prompt_len) */
    int64_t created_unix_ms;
};

struct journal_record {
    struct journal_header h;
    int32_t *codes; /* [n_steps, n_codebooks], step 0 first */
    int n_steps;
    enum journal_status status; /* of the last end record; JOURNAL_OPEN if none */
    enum journal_stop stop;
    int n_frames;        /* emitted frames: from the end record, else max(n_steps - 1, 0) */
    int torn;            /* 1 when a torn or corrupt tail was ignored */
    int64_t valid_bytes; /* length of the intact prefix of the file */
};

struct journal;

/* BLAKE2b-64 (little-endian u64) of the ids pair [2, prompt_len] as int32 LE. */
uint64_t journal_prompt_hash(const int32_t *ids_pair, int prompt_len);

/* Make dir ready to hold journals and spools: created 0700 when absent (its parent
 * must exist); an existing folder keeps its mode, which is never loosened, with a
 * warning when other users may enter it. -errno naming the folder when it cannot be
 * made or is not a directory. Files in it are created 0600. */
int journal_dir_prepare(const char *dir);

/* A request id unique across restarts: "<unix seconds>-<pid>-<job id>". */
void journal_make_id(char out[JOURNAL_ID_MAX], uint64_t job_id);

/* Create dir/<req_id>.mm3j (never overwriting) and write the header. On error *j is
 * NULL and the message names the path and the reason (missing or unwritable folder,
 * existing file, disk full). n_codebooks / audio_vocab from the depth decoder's
 * config (c0 is below SAMPLER_N_CODES); they fix the packed size of a step.
 * ids_pair is [2, prompt_len], row 0 conditional. */
int journal_open_write(struct journal **j, const char *dir, const char *req_id, const struct mm3_job_params *params,
                       int n_codebooks, int audio_vocab, const int32_t *ids_pair, int prompt_len);

/* Continue an existing journal (completion after a restart): reads it into *rec
 * (caller frees), cuts a torn tail and starts a new compressed segment after the
 * last intact step. Further appends continue at step rec->n_steps. */
int journal_open_append(struct journal **j, const char *path, struct journal_record *rec);

/* Append the codes of n_steps LM steps (codes[n_steps * n_codebooks], c0 first, every
 * step including step 0). Flushes to the file every JOURNAL_FLUSH_STEPS steps.
 * Returns 0, or the error of the first failed write (logged once; the journal of
 * this request is disabled, later calls return 0 and do nothing). j NULL: no-op.
 * A code out of range is -EINVAL and disables the journal too (a bug upstream). */
int journal_append_codes(struct journal *j, const int32_t *codes, int n_steps);

/* Flush what is buffered (as a periodic flush does). */
int journal_flush(struct journal *j);

/* Flush, write the end record (status != JOURNAL_OPEN) and free the writer. With
 * JOURNAL_OPEN no end record is written (what a crash leaves). n_frames = emitted
 * frames. Returns 0 or the write error (logged as for appends). j NULL: no-op. */
int journal_close(struct journal *j, enum journal_status status, enum journal_stop stop, int n_frames);

/* Path of the writer's file (valid until journal_close). */
const char *journal_path(const struct journal *j);
/* 1 when a write error disabled the writer. */
int journal_disabled(const struct journal *j);
/* Steps written so far (appended, flushed or not). */
int journal_steps(const struct journal *j);

/* Read a whole journal. A torn or corrupt tail after the header is ignored
 * (rec->torn = 1); a missing, truncated or corrupt header is -EINVAL naming the path
 * and what is wrong. */
int journal_read(const char *path, struct journal_record *rec);
/* The same from n bytes in memory (an uploaded journal: untrusted), path naming it in
 * messages; at most max_steps steps are decoded (more end the readable prefix, torn), so
 * a small upload cannot inflate into a large allocation. */
int journal_read_buffer(const char *path, const uint8_t *b, size_t n, int max_steps, struct journal_record *rec);
void journal_record_free(struct journal_record *rec);

/* Journals in dir to complete after a restart: no end record, or the last one says
 * JOURNAL_INTERRUPTED. Unreadable files are skipped with a warning. *paths: malloc'ed
 * sorted array of malloc'ed full paths (free with journal_list_free). */
int journal_list_unfinished(const char *dir, char ***paths, int *n);
void journal_list_free(char **paths, int n);

/* 1 when the file's last record is an intact end record (the request was closed; a
 * read of 23 bytes, for scans of folders of finished journals), 0 when it is not
 * (still open, torn, reopened), -errno naming the path when it cannot be read. */
int journal_ended(const char *path);

const char *journal_status_name(enum journal_status s);

#endif
