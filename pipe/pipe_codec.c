#include "pipe/pipe_codec.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/dtype.h"
#include "common/error.h"

/* A dimension the codec leaves free ("n"): any size up to ANY_MAX, so that the receiving
 * stage may count it in an int. */
#define ANY (-1)
#define ANY_MAX INT32_MAX

_Static_assert(sizeof(struct pipe_progress) == 3 * sizeof(int64_t), "progress travels as I64 [3]");

const char *pipe_kind_name(uint32_t kind)
{
    switch (kind) {
    case PIPE_MSG_START:
        return "START";
    case PIPE_MSG_FRAMES:
        return "FRAMES";
    case PIPE_MSG_END:
        return "END";
    case PIPE_MSG_CANCEL:
        return "CANCEL";
    case PIPE_MSG_PLAY:
        return "PLAY";
    case PIPE_MSG_PCM:
        return "PCM";
    case PIPE_MSG_DONE:
        return "DONE";
    case PIPE_MSG_ERROR:
        return "ERROR";
    default:
        return "unknown";
    }
}

static const char *dtype_name(uint32_t dtype)
{
    switch (dtype) {
    case SHMCONN_DTYPE_U8:
        return "U8";
    case SHMCONN_DTYPE_I16:
        return "I16";
    case SHMCONN_DTYPE_I32:
        return "I32";
    default:
        return dtype < MM3_DTYPE_COUNT ? mm3_dtype_name((enum mm3_dtype)dtype) : "unknown";
    }
}

/* "[2, n]" of a shape (expected dimensions may be ANY). */
static const char *shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && at < cap; i++) {
        if (shape[i] == ANY)
            at += (size_t)snprintf(buf + at, cap - at, "%sn", i ? ", " : "");
        else
            at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    if (at < cap) snprintf(buf + at, cap - at, "]");
    return buf;
}

/* Elements of a shape times elem bytes into *bytes; 0 when it does not fit 64 bits. */
static int shape_bytes(int ndim, const int64_t *shape, uint64_t elem, uint64_t *bytes)
{
    uint64_t n = elem;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return 0;
        if (shape[i] != 0 && n > UINT64_MAX / (uint64_t)shape[i]) return 0;
        n *= (uint64_t)shape[i];
    }
    *bytes = n;
    return 1;
}

/* ---- encoding ---- */

static void msg_begin(struct shmconn_msg *m, uint32_t kind, uint32_t flags)
{
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->flags = flags;
}

/* Append tensor `name` of dtype and shape over data to m; a dimension past its limit
 * (shape[i] <= max[i]) or a size past 64 bits is -EOVERFLOW naming it. */
static int tensor_add(struct shmconn_msg *m, const char *name, uint32_t dtype, int ndim, const int64_t *shape,
                      const int64_t *max, const void *data)
{
    char got[96];
    uint64_t bytes = 0;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || shape[i] > max[i])
            return mm3_errorf(-EOVERFLOW, "%s message: tensor '%s': shape %s: dimension %d expected 0..%lld",
                              pipe_kind_name(m->kind), name, shape_text(got, sizeof got, ndim, shape), i,
                              (long long)max[i]);
    if (!shape_bytes(ndim, shape, shmconn_dtype_size(dtype), &bytes))
        return mm3_errorf(-EOVERFLOW, "%s message: tensor '%s': shape %s of %s: size overflows 64 bits",
                          pipe_kind_name(m->kind), name, shape_text(got, sizeof got, ndim, shape), dtype_name(dtype));
    struct shmconn_tensor *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = (uint32_t)ndim;
    memcpy(t->shape, shape, sizeof *shape * (size_t)ndim);
    t->nbytes = bytes;
    t->data = (void *)data;
    return 0;
}

static int scalar_add(struct shmconn_msg *m, const char *name, const int64_t *v)
{
    return tensor_add(m, name, MM3_DTYPE_I64, 1, (int64_t[]){1}, (int64_t[]){1}, v);
}

int pipe_encode_start(struct shmconn_msg *m, const struct pipe_start *s)
{
    msg_begin(m, PIPE_MSG_START, SHMCONN_FLAG_FIRST);
    int64_t size = sizeof s->params;
    int rc = tensor_add(m, "params", SHMCONN_DTYPE_U8, 1, &size, &size, &s->params);
    if (rc == 0 && s->replay)
        rc = tensor_add(m, "replay", SHMCONN_DTYPE_U8, 1, (int64_t[]){(int64_t)s->replay_len}, (int64_t[]){ANY_MAX},
                        s->replay);
    return rc;
}

int pipe_encode_frames(struct shmconn_msg *m, const struct pipe_frames *f)
{
    msg_begin(m, PIPE_MSG_FRAMES, 0);
    int rc = tensor_add(m, "frames", MM3_DTYPE_F32, 2, (int64_t[]){f->n, f->width}, (int64_t[]){ANY_MAX, ANY_MAX},
                        f->frames);
    return rc < 0 ? rc : scalar_add(m, "first", &f->first);
}

int pipe_encode_end(struct shmconn_msg *m, const int64_t *total)
{
    msg_begin(m, PIPE_MSG_END, SHMCONN_FLAG_LAST);
    return scalar_add(m, "total", total);
}

void pipe_encode_cancel(struct shmconn_msg *m)
{
    msg_begin(m, PIPE_MSG_CANCEL, SHMCONN_FLAG_CANCELLED);
}

int pipe_encode_play(struct shmconn_msg *m, const int64_t *t_play_us)
{
    msg_begin(m, PIPE_MSG_PLAY, 0);
    return scalar_add(m, "t_play_us", t_play_us);
}

int pipe_encode_pcm(struct shmconn_msg *m, const struct pipe_pcm *p)
{
    msg_begin(m, PIPE_MSG_PCM, 0);
    int rc = tensor_add(m, "pcm", MM3_DTYPE_F32, 2, (int64_t[]){2, p->n}, (int64_t[]){2, ANY_MAX}, p->pcm);
    if (rc == 0)
        rc = tensor_add(m, "progress", MM3_DTYPE_I64, 1, (int64_t[]){3}, (int64_t[]){3}, p->pcm ? &p->progress : NULL);
    return rc;
}

void pipe_pcm_write(struct shmconn_msg *m, const float *left, const float *right, const struct pipe_progress *pr)
{
    float *dst = m->tensors[0].data;
    size_t n = (size_t)m->tensors[0].shape[1];
    if (n) {
        memcpy(dst, left, sizeof *dst * n);
        memcpy(dst + n, right, sizeof *dst * n);
    }
    memcpy(m->tensors[1].data, pr, sizeof *pr);
}

int pipe_encode_done(struct shmconn_msg *m, const struct pipe_done *d)
{
    msg_begin(m, PIPE_MSG_DONE, SHMCONN_FLAG_LAST);
    int rc = scalar_add(m, "total", &d->total);
    if (rc == 0 && d->fp16_rescues >= 0) rc = scalar_add(m, "fp16_rescues", &d->fp16_rescues);
    return rc;
}

int pipe_encode_error(struct shmconn_msg *m, const char *text, size_t len)
{
    msg_begin(m, PIPE_MSG_ERROR, SHMCONN_FLAG_ERROR);
    return tensor_add(m, "message", SHMCONN_DTYPE_U8, 1, (int64_t[]){(int64_t)len}, (int64_t[]){ANY_MAX}, text);
}

/* ---- decoding ---- */

static const struct shmconn_tensor *tensor_find(const struct shmconn_msg *m, const char *name)
{
    for (uint32_t i = 0; i < m->n_tensors && i < SHMCONN_MAX_TENSORS; i++)
        if (!strncmp(m->tensors[i].name, name, sizeof m->tensors[i].name)) return &m->tensors[i];
    return NULL;
}

static int kind_check(const struct shmconn_msg *m, uint32_t kind)
{
    if (m->kind == kind) return 0;
    return mm3_errorf(-EBADMSG, "bad %s message: kind %u (%s)", pipe_kind_name(kind), m->kind, pipe_kind_name(m->kind));
}

/* Tensor `name` of m with dtype and shape (a dimension ANY: 0..ANY_MAX) whose byte size
 * matches its shape; else NULL with the error naming the tensor and what was expected. */
static const struct shmconn_tensor *tensor_get(const struct shmconn_msg *m, const char *name, uint32_t dtype, int ndim,
                                               const int64_t *shape)
{
    const char *kind = pipe_kind_name(m->kind);
    const struct shmconn_tensor *t = tensor_find(m, name);
    char got[96], want[96];
    if (!t) {
        mm3_errorf(-EBADMSG, "bad %s message: tensor '%s' missing", kind, name);
        return NULL;
    }
    if (t->dtype != dtype) {
        mm3_errorf(-EBADMSG, "bad %s message: tensor '%s': dtype %s, expected %s", kind, name, dtype_name(t->dtype),
                   dtype_name(dtype));
        return NULL;
    }
    int ok = (int)t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = shape[i] == ANY ? t->shape[i] >= 0 && t->shape[i] <= ANY_MAX : t->shape[i] == shape[i];
    if (!ok) {
        uint32_t n = t->ndim <= SHMCONN_MAX_DIMS ? t->ndim : SHMCONN_MAX_DIMS;
        mm3_errorf(-EBADMSG, "bad %s message: tensor '%s': shape %s, expected %s (n up to %d)", kind, name,
                   shape_text(got, sizeof got, (int)n, t->shape), shape_text(want, sizeof want, ndim, shape), ANY_MAX);
        return NULL;
    }
    uint64_t bytes = 0;
    if (!shape_bytes(ndim, t->shape, shmconn_dtype_size(dtype), &bytes) || bytes != t->nbytes) {
        mm3_errorf(-EBADMSG, "bad %s message: tensor '%s': %llu bytes for shape %s of %s", kind, name,
                   (unsigned long long)t->nbytes, shape_text(got, sizeof got, ndim, t->shape), dtype_name(dtype));
        return NULL;
    }
    if (!t->data && t->nbytes) {
        mm3_errorf(-EBADMSG, "bad %s message: tensor '%s': no data", kind, name);
        return NULL;
    }
    return t;
}

static int scalar_get(const struct shmconn_msg *m, const char *name, int64_t *v)
{
    const struct shmconn_tensor *t = tensor_get(m, name, MM3_DTYPE_I64, 1, (int64_t[]){1});
    if (!t) return -EBADMSG;
    memcpy(v, t->data, sizeof *v);
    return 0;
}

int pipe_decode_start(const struct shmconn_msg *m, struct pipe_start *s)
{
    memset(s, 0, sizeof *s);
    if (kind_check(m, PIPE_MSG_START) < 0) return -EBADMSG;
    const struct shmconn_tensor *p =
        tensor_get(m, "params", SHMCONN_DTYPE_U8, 1, (int64_t[]){(int64_t)sizeof s->params});
    if (!p) return -EBADMSG;
    memcpy(&s->params, p->data, sizeof s->params);
    if (s->params.version != PIPE_PARAMS_VERSION)
        return mm3_errorf(-EBADMSG,
                          "bad START message: params version %u, expected %d (stage 0 and stage 1 builds "
                          "differ)",
                          s->params.version, PIPE_PARAMS_VERSION);
    if (tensor_find(m, "replay")) {
        const struct shmconn_tensor *r = tensor_get(m, "replay", SHMCONN_DTYPE_U8, 1, (int64_t[]){ANY});
        if (!r) return -EBADMSG;
        s->replay = r->data ? r->data : ""; /* present and empty is not absent */
        s->replay_len = (size_t)r->nbytes;
    }
    return 0;
}

int pipe_decode_frames(const struct shmconn_msg *m, struct pipe_frames *f)
{
    memset(f, 0, sizeof *f);
    if (kind_check(m, PIPE_MSG_FRAMES) < 0) return -EBADMSG;
    const struct shmconn_tensor *t = tensor_get(m, "frames", MM3_DTYPE_F32, 2, (int64_t[]){ANY, ANY});
    if (!t || scalar_get(m, "first", &f->first) < 0) return -EBADMSG;
    f->frames = t->data;
    f->n = t->shape[0];
    f->width = t->shape[1];
    return 0;
}

int pipe_decode_end(const struct shmconn_msg *m, int64_t *total)
{
    *total = 0;
    if (kind_check(m, PIPE_MSG_END) < 0) return -EBADMSG;
    return scalar_get(m, "total", total);
}

int pipe_decode_play(const struct shmconn_msg *m, int64_t *t_play_us)
{
    *t_play_us = 0;
    if (kind_check(m, PIPE_MSG_PLAY) < 0) return -EBADMSG;
    return scalar_get(m, "t_play_us", t_play_us);
}

int pipe_decode_pcm(const struct shmconn_msg *m, struct pipe_pcm *p)
{
    memset(p, 0, sizeof *p);
    if (kind_check(m, PIPE_MSG_PCM) < 0) return -EBADMSG;
    const struct shmconn_tensor *t = tensor_get(m, "pcm", MM3_DTYPE_F32, 2, (int64_t[]){2, ANY});
    const struct shmconn_tensor *g = t ? tensor_get(m, "progress", MM3_DTYPE_I64, 1, (int64_t[]){3}) : NULL;
    if (!g) return -EBADMSG;
    p->pcm = t->data;
    p->n = t->shape[1];
    memcpy(&p->progress, g->data, sizeof p->progress);
    return 0;
}

int pipe_decode_done(const struct shmconn_msg *m, struct pipe_done *d)
{
    d->total = 0;
    d->fp16_rescues = -1;
    if (kind_check(m, PIPE_MSG_DONE) < 0 || scalar_get(m, "total", &d->total) < 0) return -EBADMSG;
    if (tensor_find(m, "fp16_rescues") && scalar_get(m, "fp16_rescues", &d->fp16_rescues) < 0) return -EBADMSG;
    return 0;
}

int pipe_decode_error(const struct shmconn_msg *m, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    if (kind_check(m, PIPE_MSG_ERROR) < 0) return -EBADMSG;
    const struct shmconn_tensor *t = tensor_get(m, "message", SHMCONN_DTYPE_U8, 1, (int64_t[]){ANY});
    if (!t) return -EBADMSG;
    *text = t->data ? t->data : "";
    *len = (size_t)t->nbytes;
    return 0;
}
