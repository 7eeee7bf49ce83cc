/* Finished songs kept for a while so that a later request can continue them
 * (`continue_from`, docs/api.md): per song its public request id, the request's
 * parameters (caption and lyrics included) and the codes of every LM step, step 0
 * included, as the journal has them (docs/journal.md, "What is journaled").
 *
 * Bounded three ways (deploy keys api.continue_max_songs / _max_bytes / _max_age_s):
 * past the count or the bytes the oldest songs go first; a song older than the age is
 * gone when next looked at. The store lives in stage 0's memory (a restart forgets
 * it) and is thread-safe (one mutex).
 *
 *     song_store_create(&st, &(struct song_store_limits){256, 64 << 20, 3600});
 *     song_store_put(st, job->public_id, &job->params, codes, n_steps, n_codebooks, now_ns);
 *     struct song_record rec;
 *     if (song_store_get(st, id, now_ns, &rec) == 0) { ...; song_record_free(&rec); }
 *     song_store_destroy(st);
 */
#ifndef MM3_STAGE0_RECOVERY_SONG_STORE_H
#define MM3_STAGE0_RECOVERY_SONG_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "stage0/api/job.h"

struct song_store_limits {
    int max_songs;     /* 0: keep none (continuation off) */
    int64_t max_bytes; /* codes + caption + lyrics of all songs kept */
    double max_age_s;  /* since the song was put */
};

/* One kept song (a copy: the caller owns it). */
struct song_record {
    char id[MM3_JOB_PUBLIC_ID_LEN + 1];
    struct mm3_job_params params; /* caption and lyrics owned; replay_file and journal NULL */
    int32_t *codes;               /* [n_steps, n_codebooks] */
    int n_steps, n_codebooks;
    int64_t put_ns; /* the clock the caller passed to song_store_put */
};

struct song_store;

int song_store_create(struct song_store **out, const struct song_store_limits *lim);
void song_store_destroy(struct song_store *st);

/* Bytes a song of these sizes takes against max_bytes. */
int64_t song_store_bytes(const struct mm3_job_params *p, int n_steps, int n_codebooks);

/* Keep a copy of a finished song under id (replacing one of the same id), evicting the
 * oldest past max_songs or max_bytes. A song larger than max_bytes alone, or any song
 * with max_songs 0, is not kept: 0 all the same (continuing it answers "unknown or
 * expired"). -EINVAL for bad sizes, -ENOMEM. */
int song_store_put(struct song_store *st, const char *id, const struct mm3_job_params *p, const int32_t *codes,
                   int n_steps, int n_codebooks, int64_t now_ns);

/* A copy of the song kept under id: 0, or -ENOENT when there is none or it is older than
 * max_age_s at now_ns (then it is dropped), -ENOMEM. Free with song_record_free. */
int song_store_get(struct song_store *st, const char *id, int64_t now_ns, struct song_record *out);

void song_record_free(struct song_record *r);

/* Songs and bytes kept now (tests, metrics). */
void song_store_usage(struct song_store *st, int *songs, int64_t *bytes);

#endif
