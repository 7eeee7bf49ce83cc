/* Golden replay through a talker backend (stage0/model/talker_backend.h): the AR loop of
 * stage0/generate.c on the backend's rows, so that the GPU path is checked against
 * the reference data by the very loop the server runs. */
#include "stage0/golden.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sampler.h"
#include "stage0/model/talker_backend.h"

struct backend_ctx {
    enum talker_backend_kind kind;
};

/* The one AR loop of stage0/generate.c on a backend's rows 0 and 1. */
static int replay(struct talker_backend *b, struct sampler *sp, const int32_t *ids_pair, int P, int max_frames,
                  float cfg_scale, const struct generate_hooks *hooks, enum generate_stop *stop)
{
    struct generate g;
    int rc = generate_begin_backend(&g, b, sp, ids_pair, P, max_frames, cfg_scale, hooks);
    if (rc < 0) return rc;
    while (!g.done)
        if ((rc = generate_step(&g)) < 0) break;
    *stop = g.stop;
    generate_end(&g);
    return rc;
}

static int run_backend(void *ctx, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                       const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                       const struct generate_hooks *hooks, enum generate_stop *stop)
{
    const struct backend_ctx *c = ctx;
    if (dd->cfg.hidden != lm->cfg.hidden)
        return mm3_errorf(-EINVAL, "depth decoder hidden_size %d differs from the language model's %d", dd->cfg.hidden,
                          lm->cfg.hidden);
    struct talker_backend b;
    /* One backend per case sized for it: the golden cases are small, weights upload in milliseconds. */
    int rc = talker_backend_open(&b, c->kind, lm, dd, 2, prompt_len + max_frames, 2);
    if (rc < 0) return rc;
    struct generate_hooks h = *hooks;
    rc = replay(&b, sp, ids_pair, prompt_len, max_frames, cfg_scale, &h, stop);
    talker_backend_close(&b);
    return rc;
}

int golden_check_dir_backend(const char *dir, const char *backend, double tol, FILE *out, int *n_pass, int *n_fail)
{
    *n_pass = *n_fail = 0;
    struct backend_ctx c;
    int rc = talker_backend_parse(backend, &c.kind);
    if (rc < 0) return rc;
    if (!talker_backend_available(c.kind))
        return mm3_errorf(-ENODEV, "backend %s: not available in this build or on this machine", backend);
    return golden_check_dir_with(dir, run_backend, &c, c.kind, tol, out, n_pass, n_fail);
}
