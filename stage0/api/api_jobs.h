/* The jobs the HTTP layer is answering right now, by id, so that
 * GET /v1/audio/speech/{id} can report progress while the audio streams on
 * another connection (the mm3 client's progress bar). */
#ifndef MM3_STAGE0_API_JOBS_H
#define MM3_STAGE0_API_JOBS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "stage0/api/job.h"

struct api_jobs {
    pthread_mutex_t mu;
    struct mm3_job **v;
    size_t n, cap;
};

void api_jobs_init(struct api_jobs *t);
/* Drops the references of any jobs still listed. */
void api_jobs_free(struct api_jobs *t);
/* List a job (takes a reference). Returns 0 or -ENOMEM. */
int api_jobs_add(struct api_jobs *t, struct mm3_job *job);
/* Unlist a job and drop the table's reference; no-op if not listed. */
void api_jobs_remove(struct api_jobs *t, struct mm3_job *job);
/* The job whose public id (mm3_job.public_id) is `id`, with a new reference for the
 * caller, or NULL. Compared in constant time. */
struct mm3_job *api_jobs_find(struct api_jobs *t, const char *id);

#endif
