#include "stage0/api/api_jobs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

void api_jobs_init(struct api_jobs *t)
{
    pthread_mutex_init(&t->mu, NULL);
    t->v = NULL;
    t->n = t->cap = 0;
}

void api_jobs_free(struct api_jobs *t)
{
    for (size_t i = 0; i < t->n; i++)
        mm3_job_unref(t->v[i]);
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
    pthread_mutex_destroy(&t->mu);
}

int api_jobs_add(struct api_jobs *t, struct mm3_job *job)
{
    pthread_mutex_lock(&t->mu);
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        struct mm3_job **v = realloc(t->v, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&t->mu);
            return mm3_errorf(-ENOMEM, "api jobs: out of memory");
        }
        t->v = v;
        t->cap = cap;
    }
    mm3_job_ref(job);
    t->v[t->n++] = job;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

void api_jobs_remove(struct api_jobs *t, struct mm3_job *job)
{
    struct mm3_job *found = NULL;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i] == job) {
            found = job;
            t->v[i] = t->v[--t->n];
            break;
        }
    pthread_mutex_unlock(&t->mu);
    if (found) mm3_job_unref(found);
}

/* Whether two public ids are equal, in a time that does not depend on where they differ. */
static bool same_id(const char *a, const char *b)
{
    unsigned char d = 0;
    for (size_t i = 0; i < MM3_JOB_PUBLIC_ID_LEN; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

struct mm3_job *api_jobs_find(struct api_jobs *t, const char *id)
{
    struct mm3_job *found = NULL;
    if (!id || strlen(id) != MM3_JOB_PUBLIC_ID_LEN) return NULL;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n && !found; i++)
        if (same_id(t->v[i]->public_id, id)) {
            found = t->v[i];
            mm3_job_ref(found);
        }
    pthread_mutex_unlock(&t->mu);
    return found;
}
