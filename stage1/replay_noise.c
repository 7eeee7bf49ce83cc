#include "stage1/replay_noise.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/safetensors.h"

static int grow(struct replay_noise *rn)
{
    float **w = realloc(rn->w, sizeof *w * (size_t)(rn->n + 1));
    if (!w) return -ENOMEM;
    rn->w = w;
    int64_t *len = realloc(rn->len, sizeof *len * (size_t)(rn->n + 1));
    if (!len) return -ENOMEM;
    rn->len = len;
    return 0;
}

int replay_noise_load(struct replay_noise *rn, const char *path)
{
    memset(rn, 0, sizeof *rn);
    struct st_file f;
    int rc = st_file_open(&f, path);
    if (rc < 0) return rc;
    rc = replay_noise_load_file(rn, &f);
    st_file_close(&f);
    return rc;
}

int replay_noise_load_file(struct replay_noise *rn, const struct st_file *f)
{
    memset(rn, 0, sizeof *rn);
    const char *path = f->path;
    int rc = 0;
    for (;;) {
        char k[48];
        snprintf(k, sizeof k, "window.%d.noise", rn->n);
        const struct st_tensor *t = st_file_find(f, k);
        if (!t) break;
        if ((rc = grow(rn)) < 0) {
            rc = mm3_errorf(rc, "%s: out of memory for %s", path, k);
            break;
        }
        int nd;
        int64_t sh[ST_MAX_DIMS];
        if ((rc = st_file_load_f32(f, k, &rn->w[rn->n], &nd, sh)) < 0) break;
        rn->len[rn->n++] = (int64_t)st_tensor_numel(t);
    }
    if (rc == 0 && rn->n == 0)
        rc = mm3_errorf(-EINVAL, "%s: no tensor 'window.0.noise' (not a golden case file)", path);
    if (rc < 0) replay_noise_free(rn);
    return rc;
}

struct render_noise replay_noise_render(const struct replay_noise *rn)
{
    return (struct render_noise){RENDER_NOISE_REPLAY, 0, rn->n, (const float *const *)rn->w, rn->len};
}

void replay_noise_free(struct replay_noise *rn)
{
    for (int i = 0; i < rn->n; i++)
        free(rn->w[i]);
    free(rn->w);
    free(rn->len);
    memset(rn, 0, sizeof *rn);
}
