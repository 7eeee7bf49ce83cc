#include "common/sampler_replay.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/safetensors.h"

static int load_vector(const struct st_file *f, const char *name, int64_t **out, int *n)
{
    const struct st_tensor *t = st_file_find(f, name);
    if (!t) return mm3_errorf(-ENOENT, "%s: missing tensor '%s'", f->path, name);
    if (t->dtype != MM3_DTYPE_I64 || t->ndim != 1 || t->shape[0] > (1 << 30))
        return mm3_errorf(-EINVAL, "%s: tensor '%s': expected a 1-D I64 vector", f->path, name);
    *out = malloc(t->nbytes ? t->nbytes : 8);
    if (!*out) return mm3_errorf(-ENOMEM, "%s: out of memory for '%s'", f->path, name);
    *n = (int)t->shape[0];
    return st_file_read(f, t, *out);
}

int sampler_replay_load_file(struct sampler_replay_data *d, const struct st_file *f)
{
    memset(d, 0, sizeof *d);
    int rc = load_vector(f, "lm_sampled", &d->lm_ids, &d->n_lm);
    if (rc == 0) rc = load_vector(f, "depth_sampled", &d->depth_codes, &d->n_depth);
    if (rc < 0) sampler_replay_free(d);
    return rc;
}

int sampler_replay_load(struct sampler_replay_data *d, const char *path)
{
    memset(d, 0, sizeof *d);
    struct st_file f;
    int rc = st_file_open(&f, path);
    if (rc < 0) return rc;
    rc = sampler_replay_load_file(d, &f);
    st_file_close(&f);
    return rc;
}

void sampler_replay_free(struct sampler_replay_data *d)
{
    free(d->lm_ids);
    free(d->depth_codes);
    memset(d, 0, sizeof *d);
}
