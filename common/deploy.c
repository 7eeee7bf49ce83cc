/* Deploy file loader: YAML tree (common/deploy_yaml.h) -> struct mm3_deploy.
 * Each mapping is read through a field table (struct field): the key, the type
 * and range of its value, where the value lands, and whether its node is kept
 * for a later check. Keys whose value needs more than a type and a range have a
 * decoder of their own. The checks that look across keys (CFG pairs, connector
 * names, memory per device, context budget) run once everything is read,
 * pointing at the nodes kept. */
#include "common/deploy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/deploy_yaml.h"
#include "common/error.h"
#include "common/log.h"

#define KEY_PATH_MAX 256
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

typedef struct mm3_yaml_node ynode;

/* Stage keys whose value nodes the checks after decoding point at. */
enum mark {
    MARK_NONE = 0,
    MARK_MAX_NUM_SEQS,
    MARK_GPU_MEMORY_UTILIZATION,
    MARK_DTYPE,
    MARK_MAX_MODEL_LEN,
    MARK_MAX_NUM_BATCHED_TOKENS,
    MARK_CAPTURE_SIZES,
    MARK_INPUT_CONNECTOR,
    MARK_OUTPUT_CONNECTOR,
    MARK_MAX_TOKENS,
    MARK_SEED,
    MARK_CFG_SCALE,
    MARK_CFG_ROLE,
    MARK_DEVICES,
    MARK_REPLICAS,
    MARK_COUNT
};

/* Nodes kept for the checks that run after decoding. NULL = key absent. */
struct stage_marks {
    const ynode *entry;
    int position; /* index in the stages list, for key paths */
    const ynode *node[MARK_COUNT];
};

struct load_ctx {
    const char *file;
    struct mm3_deploy *d;
    const ynode *stages;
    const ynode *connectors;
    struct stage_marks marks[MM3_DEPLOY_NUM_STAGES];
};

/* The enums' names, indexed by value: what the file says and what the name
 * functions print are the same strings. */
static const char *const backend_names[] = {"auto", "cpu", "cuda"};
static const char *const precision_names[] = {"fp32", "tf32", "bf16", "fp16", "fp8"};
static const char *const cudagraph_names[] = {"NONE", "FULL_DECODE_ONLY"};
static const char *const kv_cache_dtype_names[] = {"auto", "bfloat16", "float32"};
static const char *const mps_names[] = {"off", "auto", "on"};
static const char *const stream_priority_names[] = {"normal", "high", "low"};
static const char *const window_order_names[] = {"deadline", "fifo"};

/* ---- messages ------------------------------------------------------------ */

static int fail(const struct load_ctx *c, const ynode *n, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(const struct load_ctx *c, const ynode *n, const char *path, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return mm3_errorf(-EINVAL, "%s:%d:%d: %s: %s", c->file, n ? n->line : 1, n ? n->col : 1, path, msg);
}

static void warn(struct load_ctx *c, const ynode *n, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void warn(struct load_ctx *c, const ynode *n, const char *path, const char *fmt, ...)
{
    char msg[MM3_DEPLOY_WARNING_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct mm3_deploy *d = c->d;
    char line[MM3_DEPLOY_PATH_MAX + KEY_PATH_MAX + MM3_DEPLOY_WARNING_MAX + 32];
    snprintf(line, sizeof line, "%s:%d:%d: %s: %s", c->file, n ? n->line : 1, n ? n->col : 1, path, msg);
    LOG_WARN("%s", line);
    if (d->n_warnings < MM3_DEPLOY_MAX_WARNINGS) {
        /* kept cut to the slot's size; the log has it whole */
        snprintf(d->warnings[d->n_warnings], MM3_DEPLOY_WARNING_MAX, "%.*s", MM3_DEPLOY_WARNING_MAX - 1, line);
        d->n_warnings++;
    }
}

/* out = parent.key, cut at KEY_PATH_MAX - 1 (a cut path still reads well). */
static void path_join(char *out, const char *parent, const char *key)
{
    size_t len = strnlen(parent, KEY_PATH_MAX - 1);
    memcpy(out, parent, len);
    if (len && len < KEY_PATH_MAX - 1) out[len++] = '.';
    size_t k = strnlen(key, KEY_PATH_MAX - 1 - len);
    memcpy(out + len, key, k);
    out[len + k] = 0;
}

/* out = parent[i], the parent cut if need be. */
static void path_index(char *out, const char *parent, size_t i)
{
    char index[24];
    snprintf(index, sizeof index, "[%zu]", i);
    size_t len = strnlen(parent, KEY_PATH_MAX - 1 - strlen(index));
    memcpy(out, parent, len);
    memcpy(out + len, index, strlen(index) + 1);
}

/* Appends ", item" (just "item" to an empty list), cut at cap. */
static void list_append(char *list, size_t cap, const char *item)
{
    size_t len = strlen(list);
    snprintf(list + len, cap - len, "%s%s", len ? ", " : "", item);
}

/* ---- typed values ------------------------------------------------------- */

static int get_int(const struct load_ctx *c, const ynode *n, const char *path, long long lo, long long hi,
                   long long *out)
{
    char what[96];
    long long v;
    if (mm3_yaml_int(n, &v) == 0 && v >= lo && v <= hi) {
        *out = v;
        return 0;
    }
    if (hi == LLONG_MAX)
        return fail(c, n, path, "expected an integer >= %lld, got %s", lo, mm3_yaml_describe(n, what, sizeof what));
    return fail(c, n, path, "expected an integer in [%lld, %lld], got %s", lo, hi,
                mm3_yaml_describe(n, what, sizeof what));
}

static int get_int32(const struct load_ctx *c, const ynode *n, const char *path, int lo, int hi, int *out)
{
    long long v;
    int rc = get_int(c, n, path, lo, hi, &v);
    if (rc == 0) *out = (int)v;
    return rc;
}

/* A finite number in the interval written by lo/hi with open or closed ends;
 * hi = INFINITY means unbounded above. */
static int get_number(const struct load_ctx *c, const ynode *n, const char *path, double lo, bool lo_open, double hi,
                      bool hi_open, double *out)
{
    char what[96];
    double v;
    if (mm3_yaml_number(n, &v) == 0 && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi)) {
        *out = v;
        return 0;
    }
    if (isinf(hi))
        return fail(c, n, path, "expected a number %s %g, got %s", lo_open ? ">" : ">=", lo,
                    mm3_yaml_describe(n, what, sizeof what));
    return fail(c, n, path, "expected a number in %c%g, %g%c, got %s", lo_open ? '(' : '[', lo, hi, hi_open ? ')' : ']',
                mm3_yaml_describe(n, what, sizeof what));
}

static int get_bool(const struct load_ctx *c, const ynode *n, const char *path, bool *out)
{
    char what[96];
    int v = mm3_yaml_bool(n);
    if (v < 0) return fail(c, n, path, "expected true or false, got %s", mm3_yaml_describe(n, what, sizeof what));
    *out = v;
    return 0;
}

/* Any scalar's text. Null is refused unless allow_empty (then it is ""). */
static int get_string(const struct load_ctx *c, const ynode *n, const char *path, char *buf, size_t cap,
                      bool allow_empty)
{
    char what[96];
    if (n->kind != MM3_YAML_SCALAR || (!allow_empty && mm3_yaml_is_null(n)))
        return fail(c, n, path, "expected a string, got %s", mm3_yaml_describe(n, what, sizeof what));
    const char *t = mm3_yaml_is_null(n) ? "" : n->text;
    if (!allow_empty && !t[0]) return fail(c, n, path, "expected a non-empty string");
    if (strlen(t) >= cap) return fail(c, n, path, "expected at most %zu characters, got %zu", cap - 1, strlen(t));
    memcpy(buf, t, strlen(t) + 1);
    return 0;
}

/* The index of text in names[count], -1 if absent. */
static int index_of(const char *const *names, int count, const char *text)
{
    for (int i = 0; text && i < count; i++)
        if (!strcmp(text, names[i])) return i;
    return -1;
}

static int get_choice(const struct load_ctx *c, const ynode *n, const char *path, const char *const *names, int count,
                      int *out)
{
    char what[96], list[256] = "";
    int i = n->kind == MM3_YAML_SCALAR ? index_of(names, count, n->text) : -1;
    if (i >= 0) {
        *out = i;
        return 0;
    }
    for (i = 0; i < count; i++)
        list_append(list, sizeof list, names[i]);
    return fail(c, n, path, "expected one of %s, got %s", list, mm3_yaml_describe(n, what, sizeof what));
}

/* A mapping; an empty value (null) counts as an empty mapping. Returns 1 when
 * there is something to iterate. */
static int get_map(const struct load_ctx *c, const ynode *n, const char *path)
{
    char what[96];
    if (n->kind == MM3_YAML_MAP) return n->n > 0;
    if (mm3_yaml_is_null(n)) return 0;
    return fail(c, n, path, "expected a mapping, got %s", mm3_yaml_describe(n, what, sizeof what));
}

/* ---- field tables -------------------------------------------------------- */

/* What a field table is read into: fields' offsets point into `target`; stage
 * tables also keep nodes in `marks` and know their stage (else -1). */
struct scope {
    struct load_ctx *c;
    void *target;
    struct stage_marks *marks;
    int stage;
};

enum field_kind {
    FIELD_I64,    /* integer in [lo, hi] -> int64_t (uint64_t when lo >= 0) */
    FIELD_I32,    /* integer in [lo, hi] -> int */
    FIELD_NUMBER, /* finite number between min and max -> double */
    FIELD_BOOL,   /* true / false -> bool */
    FIELD_STRING, /* scalar text -> char[cap] */
    FIELD_CHOICE, /* one of names[] -> its index, stored in an enum */
    FIELD_CUSTOM, /* decode() reads it */
};

struct field {
    const char *key;
    enum field_kind kind;
    size_t at; /* offset of the destination in the scope's target */
    long long lo, hi;
    double min, max; /* max = INFINITY: unbounded above */
    bool min_open, max_open;
    size_t cap;
    bool allow_empty; /* a string may be null or "" */
    const char *const *names;
    int n_names;
    enum mark mark;      /* keep the value's node under this mark */
    bool stage1_only;    /* refused at the key in stage 0's entry */
    bool stage0_only;    /* refused at the key in stage 1's entry */
    const char *refusal; /* refused at the key with this message; not listed as a known key */
    int (*decode)(const struct scope *s, const ynode *key, const ynode *v, const char *path);
    /* Runs after a typed read succeeded; `value` is the destination. */
    int (*check)(const struct scope *s, const ynode *v, const char *path, const void *value);
};

/* offsetof(T, m), refusing to compile when m is not `size` bytes wide: a table
 * entry cannot write a type its member does not have. */
#define AT(T, m, size) (offsetof(T, m) + 0 * sizeof(char[sizeof(((T *)0)->m) == (size) ? 1 : -1]))
#define I64_AT(T, m) .kind = FIELD_I64, .at = AT(T, m, sizeof(int64_t))
#define I32_AT(T, m) .kind = FIELD_I32, .at = AT(T, m, sizeof(int))
#define NUMBER_AT(T, m) .kind = FIELD_NUMBER, .at = AT(T, m, sizeof(double))
#define BOOL_AT(T, m) .kind = FIELD_BOOL, .at = AT(T, m, sizeof(bool))
#define STRING_AT(T, m) .kind = FIELD_STRING, .at = offsetof(T, m), .cap = sizeof(((T *)0)->m)
#define CHOICE_AT(T, m, list) .kind = FIELD_CHOICE, .at = AT(T, m, sizeof(int)), .names = list, .n_names = COUNT(list)
#define CUSTOM(fn) .kind = FIELD_CUSTOM, .decode = fn

static int decode_field(const struct scope *s, const struct field *f, const ynode *key, const ynode *v,
                        const char *path)
{
    struct load_ctx *c = s->c;
    char *dst = (char *)s->target + f->at;
    long long iv = 0;
    int rc = 0;
    if (f->refusal) return fail(c, key, path, "%s", f->refusal);
    if (f->stage1_only && s->stage != 1) return fail(c, key, path, "only stage 1 (the DiT) has this key");
    if (f->stage0_only && s->stage != 0)
        return fail(c, key, path, "only stage 0 (the talker, the one KV cache) has this key");
    if (f->mark) {
        CHECK(s->marks);
        s->marks->node[f->mark] = v;
    }
    switch (f->kind) {
    case FIELD_I64:
        rc = get_int(c, v, path, f->lo, f->hi, &iv);
        if (rc == 0) memcpy(dst, &(int64_t){iv}, sizeof(int64_t));
        break;
    case FIELD_I32:
        rc = get_int32(c, v, path, (int)f->lo, (int)f->hi, (int *)(void *)dst);
        break;
    case FIELD_NUMBER:
        rc = get_number(c, v, path, f->min, f->min_open, f->max, f->max_open, (double *)(void *)dst);
        break;
    case FIELD_BOOL:
        rc = get_bool(c, v, path, (bool *)(void *)dst);
        break;
    case FIELD_STRING:
        rc = get_string(c, v, path, dst, f->cap, f->allow_empty);
        break;
    case FIELD_CHOICE:
        rc = get_choice(c, v, path, f->names, f->n_names, (int *)(void *)dst);
        break;
    case FIELD_CUSTOM:
        return f->decode(s, key, v, path);
    }
    if (rc == 0 && f->check) rc = f->check(s, v, path, dst);
    return rc;
}

static int unknown_key(const struct load_ctx *c, const ynode *key, const char *path, const char *known)
{
    return fail(c, key, path, "unknown key (expected one of: %s)", known);
}

/* Reads every key of mapping n through the table; a key it lacks is an error
 * that lists the keys it has. */
static int decode_fields(const struct scope *s, const ynode *n, const char *path, const struct field *fields,
                         size_t count)
{
    int has = get_map(s->c, n, path);
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        const ynode *key = n->keys[i];
        char joined[KEY_PATH_MAX];
        path_join(joined, path, key->text);
        /* A top-level key is its own path, never cut. */
        const char *p = path[0] ? joined : key->text;
        const struct field *f = NULL;
        for (size_t j = 0; j < count && !f; j++)
            if (!strcmp(key->text, fields[j].key)) f = &fields[j];
        int rc;
        if (f) {
            rc = decode_field(s, f, key, n->items[i], p);
        } else {
            char known[512] = "";
            for (size_t j = 0; j < count; j++)
                if (!fields[j].refusal) list_append(known, sizeof known, fields[j].key);
            rc = unknown_key(s->c, key, p, known);
        }
        if (rc < 0) return rc;
    }
    return 0;
}

static struct mm3_stage_config *scope_stage(const struct scope *s)
{
    return &s->c->d->stages[s->stage];
}

/* ---- defaults ------------------------------------------------------------ */

static void capture_sizes_default(struct mm3_stage_config *s)
{
    /* Powers of two up to the stage ceiling, plus the ceiling itself. */
    struct mm3_compilation_config *cc = &s->compilation;
    cc->n_capture_sizes = 0;
    for (int v = 1; v <= s->max_num_seqs && cc->n_capture_sizes < MM3_DEPLOY_MAX_CAPTURE_SIZES - 1; v *= 2)
        cc->capture_sizes[cc->n_capture_sizes++] = v;
    if (cc->capture_sizes[cc->n_capture_sizes - 1] != s->max_num_seqs)
        cc->capture_sizes[cc->n_capture_sizes++] = s->max_num_seqs;
}

static void connector_defaults(struct mm3_connector_config *k, const char *name)
{
    memset(k, 0, sizeof *k);
    snprintf(k->name, sizeof k->name, "%s", name);
    snprintf(k->connector_class, sizeof k->connector_class, "SharedMemoryConnector");
    k->codec_streaming = true;
    k->shm_threshold_bytes = 65536;
    k->get_sleep_s = 0.01;
    k->get_max_wait_first_chunk = 30000;
    k->get_max_wait = 10000;
}

void mm3_deploy_init_defaults(struct mm3_deploy *d)
{
    memset(d, 0, sizeof *d);
    snprintf(d->source, sizeof d->source, "(defaults)");
    snprintf(d->pipeline, sizeof d->pipeline, "minimax_music3");
    d->async_chunk = true;
    d->trust_remote_code = true;
    d->backend = MM3_BACKEND_AUTO;
    snprintf(d->api.host, sizeof d->api.host, "127.0.0.1");
    d->api.port = 8000;
    d->api.max_queue_depth = 64;
    d->api.max_body_bytes = 1 << 20;
    d->api.max_connections = 256;
    d->api.request_timeout_s = 1800;
    d->api.stream_capacity_share = 0.85;
    d->api.default_sample_rate = 44100;
    d->api.max_buffered_bytes = 1LL << 30;
    d->api.idle_timeout_s = 60;
    d->api.request_read_timeout_s = 30;
    d->api.max_connections_per_client = 32;
    d->api.admin_connections = 8;
    d->api.drain_timeout_s = 10;
    d->api.continue_max_songs = 256;
    d->api.continue_max_bytes = 64LL << 20;
    d->api.continue_max_age_s = 3600;
    connector_defaults(&d->edge, "(default)");
    for (int i = 0; i < MM3_DEPLOY_NUM_STAGES; i++) {
        struct mm3_stage_config *s = &d->stages[i];
        s->stage_id = i;
        s->max_num_seqs = i == 0 ? 32 : 16;
        s->gpu_memory_utilization = i == 0 ? 0.6 : 0.2;
        s->dtype = i == 0 ? MM3_DTYPE_BF16 : MM3_DTYPE_F32;
        s->max_model_len = i == 0 ? 10240 : 4096;
        s->max_num_batched_tokens = i == 0 ? 10240 : 4096;
        s->enforce_eager = i == 1;
        s->compilation.mode = 0;
        s->compilation.cudagraph_mode = MM3_CUDAGRAPH_FULL_DECODE_ONLY;
        s->compilation.cudagraph_num_of_warmups = 1;
        s->compilation.fused_ops = true;
        capture_sizes_default(s);
        snprintf(s->devices_text, sizeof s->devices_text, "0");
        s->n_devices = 1;
        s->devices[0] = 0;
        s->replicas = 1;
        s->temperature = i == 0 ? 1.0 : 0.0;
        s->max_tokens = i == 0 ? MM3_DEPLOY_AUDIO_FRAMES_MAX + MM3_DEPLOY_EXTRA_AR_STEPS : 4096;
        s->seed = 0;
        s->cfg_scale = i == 0 ? 1.5 : 1.0;
        s->cfg_enabled = i == 0;
        s->matmul_precision = MM3_MATMUL_FP16;
        s->num_inference_steps = 30;
        s->guidance_scale = 1.7;
    }
}

/* ---- connectors ---------------------------------------------------------- */

#define DIT_KNOB                                                                                                       \
    "unknown key: this is a vLLM-Omni acoustic-model knob; in mm3 the DiT's matmul precision is "                      \
    "stages[<stage 1>].matmul_precision"

static const struct field connector_extra_fields[] = {
    {"codec_streaming", BOOL_AT(struct mm3_connector_config, codec_streaming)},
    {"shm_threshold_bytes", I64_AT(struct mm3_connector_config, shm_threshold_bytes), .lo = 0, .hi = 1LL << 30},
    {"connector_get_sleep_s", NUMBER_AT(struct mm3_connector_config, get_sleep_s), .min = 0, .min_open = true,
     .max = 60},
    {"connector_get_max_wait_first_chunk", I64_AT(struct mm3_connector_config, get_max_wait_first_chunk), .lo = 1,
     .hi = 1000000000},
    {"connector_get_max_wait", I64_AT(struct mm3_connector_config, get_max_wait), .lo = 1, .hi = 1000000000},
    {"vocoder_cudnn", .refusal = DIT_KNOB},
    {"compile_dit", .refusal = DIT_KNOB},
    {"dit_autocast_dtype", .refusal = DIT_KNOB},
    {"dit_fp16_linear_weights", .refusal = DIT_KNOB},
};

static int decode_connector_extra(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    return decode_fields(s, v, path, connector_extra_fields, COUNT(connector_extra_fields));
}

static int check_connector_class(const struct scope *s, const ynode *v, const char *path, const void *value)
{
    if (!strcmp(value, "SharedMemoryConnector")) return 0;
    return fail(s->c, v, path,
                "expected SharedMemoryConnector (the only connector mm3 has: "
                "a ring over /dev/shm between the two stage processes of one host), got '%s'",
                (const char *)value);
}

static const struct field connector_fields[] = {
    {"name", STRING_AT(struct mm3_connector_config, connector_class), .check = check_connector_class},
    {"extra", CUSTOM(decode_connector_extra)},
};

static int decode_connectors(const struct scope *top, const ynode *key, const ynode *n, const char *path)
{
    struct load_ctx *c = top->c;
    struct mm3_deploy *d = c->d;
    c->connectors = n;
    int has = get_map(c, n, path);
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        const ynode *kn = n->keys[i];
        char p[KEY_PATH_MAX];
        path_join(p, path, kn->text);
        if (d->n_connectors == MM3_DEPLOY_MAX_CONNECTORS)
            return fail(c, kn, p, "more than %d connectors", MM3_DEPLOY_MAX_CONNECTORS);
        if (!kn->text[0] || strlen(kn->text) >= MM3_DEPLOY_NAME_MAX)
            return fail(c, kn, p, "expected a connector name of 1 to %d characters", MM3_DEPLOY_NAME_MAX - 1);
        struct mm3_connector_config *k = &d->connectors[d->n_connectors++];
        connector_defaults(k, kn->text);
        /* Set again only by a valid name: key, so empty means it is missing. */
        k->connector_class[0] = 0;
        struct scope s = {c, k, NULL, -1};
        int rc = decode_fields(&s, n->items[i], p, connector_fields, COUNT(connector_fields));
        if (rc < 0) return rc;
        if (!k->connector_class[0]) {
            char q[KEY_PATH_MAX];
            path_join(q, p, "name");
            return fail(c, kn, q, "missing (expected name: SharedMemoryConnector)");
        }
    }
    return 0;
}

/* ---- stages -------------------------------------------------------------- */

static int decode_devices(const struct scope *sc, const ynode *key, const ynode *n, const char *path)
{
    struct load_ctx *c = sc->c;
    struct mm3_stage_config *s = scope_stage(sc);
    char what[96];
    if (n->kind != MM3_YAML_SCALAR || mm3_yaml_is_null(n))
        return fail(c, n, path, "expected a device list like \"0\" or \"0,1\", got %s",
                    mm3_yaml_describe(n, what, sizeof what));
    int rc = get_string(c, n, path, s->devices_text, sizeof s->devices_text, false);
    if (rc < 0) return rc;
    s->n_devices = 0;
    const char *p = s->devices_text;
    for (;;) {
        while (*p == ' ')
            p++;
        if (!isdigit((unsigned char)*p) || s->n_devices == MM3_DEPLOY_MAX_DEVICES)
            return fail(c, n, path,
                        "expected a comma-separated list of up to %d device numbers like \"0\" or "
                        "\"0,1\", got %s",
                        MM3_DEPLOY_MAX_DEVICES, mm3_yaml_describe(n, what, sizeof what));
        char *end;
        long v = strtol(p, &end, 10);
        if (v > 1023) return fail(c, n, path, "device %ld is out of range [0, 1023]", v);
        for (int i = 0; i < s->n_devices; i++)
            if (s->devices[i] == v) return fail(c, n, path, "device %ld is listed twice", v);
        s->devices[s->n_devices++] = (int)v;
        p = end;
        while (*p == ' ')
            p++;
        if (!*p) break;
        if (*p != ',')
            return fail(c, n, path,
                        "expected a comma-separated list of device numbers like \"0\" or \"0,1\", "
                        "got %s",
                        mm3_yaml_describe(n, what, sizeof what));
        p++;
    }
    return 0;
}

static int decode_compilation_mode(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    char what[96];
    long long m;
    if (mm3_yaml_int(v, &m) == 0 && m == 0) return 0;
    return fail(s->c, v, path, "expected 0 (mm3 has no graph compiler; vLLM's other modes do not apply), got %s",
                mm3_yaml_describe(v, what, sizeof what));
}

static int decode_capture_sizes(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    struct load_ctx *c = s->c;
    struct mm3_compilation_config *cc = &scope_stage(s)->compilation;
    char what[96];
    if (v->kind != MM3_YAML_SEQ)
        return fail(c, v, path, "expected a list of batch sizes like [1, 2, 4], got %s",
                    mm3_yaml_describe(v, what, sizeof what));
    if (v->n > MM3_DEPLOY_MAX_CAPTURE_SIZES)
        return fail(c, v, path, "expected at most %d sizes, got %zu", MM3_DEPLOY_MAX_CAPTURE_SIZES, v->n);
    cc->n_capture_sizes = 0;
    for (size_t j = 0; j < v->n; j++) {
        char q[KEY_PATH_MAX];
        int size = 0;
        path_index(q, path, j);
        int rc = get_int32(c, v->items[j], q, 1, 65536, &size);
        if (rc == 0 && j > 0 && size <= cc->capture_sizes[j - 1])
            rc = fail(c, v->items[j], q, "capture sizes must be strictly ascending: %d follows %d", size,
                      cc->capture_sizes[j - 1]);
        if (rc < 0) return rc;
        cc->capture_sizes[cc->n_capture_sizes++] = size;
    }
    return 0;
}

static int decode_custom_ops(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    if (v->kind != MM3_YAML_SEQ || v->n != 1 || v->items[0]->kind != MM3_YAML_SCALAR ||
        (strcmp(v->items[0]->text, "all") && strcmp(v->items[0]->text, "none")))
        return fail(s->c, v, path,
                    "expected [\"all\"] (fused kernels) or [\"none\"] (unfused op chain); "
                    "per-op lists are not supported");
    scope_stage(s)->compilation.fused_ops = !strcmp(v->items[0]->text, "all");
    return 0;
}

static const struct field compilation_fields[] = {
    {"mode", CUSTOM(decode_compilation_mode)},
    {"cudagraph_capture_sizes", CUSTOM(decode_capture_sizes), .mark = MARK_CAPTURE_SIZES},
    {"cudagraph_mode", CHOICE_AT(struct mm3_compilation_config, cudagraph_mode, cudagraph_names)},
    {"cudagraph_num_of_warmups", I32_AT(struct mm3_compilation_config, cudagraph_num_of_warmups), .lo = 0, .hi = 100},
    {"custom_ops", CUSTOM(decode_custom_ops)},
};

static int decode_compilation(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    struct scope cs = {s->c, &scope_stage(s)->compilation, s->marks, s->stage};
    return decode_fields(&cs, v, path, compilation_fields, COUNT(compilation_fields));
}

/* input_connectors / output_connectors: the only edge is 0 -> 1, written
 * to_stage_1 on stage 0 and from_stage_0 on stage 1. */
static int decode_edge(const struct scope *sc, const ynode *n, const char *path, bool output)
{
    struct load_ctx *c = sc->c;
    int stage = sc->stage;
    struct mm3_stage_config *s = scope_stage(sc);
    const char *want = output ? (stage == 0 ? "to_stage_1" : NULL) : (stage == 1 ? "from_stage_0" : NULL);
    int has = get_map(c, n, path);
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        char p[KEY_PATH_MAX];
        path_join(p, path, n->keys[i]->text);
        if (!want)
            return fail(c, n->keys[i], p,
                        "stage %d has no %s edge (the only edge is stage 0 -> stage 1; "
                        "audio returns over the same connector)",
                        stage, output ? "output" : "input");
        if (strcmp(n->keys[i]->text, want)) return unknown_key(c, n->keys[i], p, want);
        char *dst = output ? s->output_connector : s->input_connector;
        int rc = get_string(c, n->items[i], p, dst, MM3_DEPLOY_NAME_MAX, false);
        if (rc < 0) return rc;
        sc->marks->node[output ? MARK_OUTPUT_CONNECTOR : MARK_INPUT_CONNECTOR] = n->items[i];
    }
    return 0;
}

static int decode_input_edge(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    return decode_edge(s, v, path, false);
}

static int decode_output_edge(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    return decode_edge(s, v, path, true);
}

static int decode_cfg_role(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    char role[16];
    int rc = get_string(s->c, v, path, role, sizeof role, false);
    if (rc == 0 && strcmp(role, "cond"))
        rc = fail(s->c, v, path,
                  "expected 'cond' (requests enter as the conditional row; mm3 adds the "
                  "unconditional twin itself), got '%s'",
                  role);
    return rc;
}

static const struct field extra_args_fields[] = {
    {"cfg_role", CUSTOM(decode_cfg_role), .mark = MARK_CFG_ROLE},
    {"cfg_scale", NUMBER_AT(struct mm3_stage_config, cfg_scale), .min = 1, .max = 100, .mark = MARK_CFG_SCALE},
};

static int decode_extra_args(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    if (s->stage == 0) return decode_fields(s, v, path, extra_args_fields, COUNT(extra_args_fields));
    int has = get_map(s->c, v, path);
    if (has <= 0) return has;
    char p[KEY_PATH_MAX];
    path_join(p, path, v->keys[0]->text);
    return fail(s->c, v->keys[0], p,
                "unknown key: stage 1 takes no extra_args (its knobs are "
                "num_inference_steps, guidance_scale, flow_shift and matmul_precision on the stage)");
}

static int check_temperature(const struct scope *s, const ynode *v, const char *path, const void *value)
{
    double t = *(const double *)value;
    if (s->stage == 0 && t != 1.0)
        return fail(s->c, v, path,
                    "expected 1.0: the model's recipe samples at temperature 1 (top-k 50 "
                    "after CFG); other temperatures are not supported, got %g",
                    t);
    if (s->stage == 1 && t != 0.0)
        return fail(s->c, v, path, "expected 0.0: stage 1 draws no tokens (its noise is seeded), got %g", t);
    return 0;
}

static int decode_max_tokens(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    long long iv;
    int rc = s->stage == 0 ? get_int(s->c, v, path, 1 + MM3_DEPLOY_EXTRA_AR_STEPS,
                                     MM3_DEPLOY_AUDIO_FRAMES_MAX + MM3_DEPLOY_EXTRA_AR_STEPS, &iv)
                           : get_int(s->c, v, path, 1, 1 << 20, &iv);
    if (rc == 0) scope_stage(s)->max_tokens = iv;
    return rc;
}

static const struct field sampling_fields[] = {
    {"temperature", NUMBER_AT(struct mm3_stage_config, temperature), .min = 0, .max = INFINITY,
     .check = check_temperature},
    {"max_tokens", CUSTOM(decode_max_tokens), .mark = MARK_MAX_TOKENS},
    {"seed", I64_AT(struct mm3_stage_config, seed), .lo = 0, .hi = LLONG_MAX, .mark = MARK_SEED},
    {"extra_args", CUSTOM(decode_extra_args)},
};

static int decode_sampling(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    return decode_fields(s, v, path, sampling_fields, COUNT(sampling_fields));
}

/* The components a stage's adapters may adapt; the first is the default. */
static const char *const lora_components[MM3_DEPLOY_NUM_STAGES][2] = {{"language_model", "rvq_depth_decoder"},
                                                                      {"transformer", NULL}};

static int decode_lora_entry(const struct scope *sc, const ynode *n, const char *path, struct mm3_lora_config *l)
{
    struct load_ctx *c = sc->c;
    const char *const *comps = lora_components[sc->stage];
    int n_comps = comps[1] ? 2 : 1;
    char what[96], p[KEY_PATH_MAX];
    if (n->kind != MM3_YAML_MAP)
        return fail(c, n, path, "expected a mapping {path: ADAPTER_DIR, scale: 1.0}, got %s",
                    mm3_yaml_describe(n, what, sizeof what));
    l->scale = 1.0;
    snprintf(l->component, sizeof l->component, "%s", comps[0]);
    const ynode *path_node = NULL;
    for (size_t i = 0; i < n->n; i++) {
        const char *k = n->keys[i]->text;
        const ynode *v = n->items[i];
        path_join(p, path, k);
        int rc, choice = 0;
        if (!strcmp(k, "path")) {
            path_node = v;
            rc = get_string(c, v, p, l->path, sizeof l->path, false);
        } else if (!strcmp(k, "scale")) {
            rc = get_number(c, v, p, -100, false, 100, false, &l->scale);
        } else if (!strcmp(k, "component")) {
            if ((rc = get_choice(c, v, p, comps, n_comps, &choice)) == 0)
                snprintf(l->component, sizeof l->component, "%s", comps[choice]);
        } else {
            rc = unknown_key(c, n->keys[i], p, "path, scale, component");
        }
        if (rc < 0) return rc;
    }
    path_join(p, path, "path");
    if (!path_node)
        return fail(c, n, p,
                    "missing (expected the adapter's folder: adapter_config.json and "
                    "adapter_model.safetensors)");
    return 0;
}

static int decode_lora(const struct scope *sc, const ynode *key, const ynode *v, const char *path)
{
    struct mm3_stage_config *s = scope_stage(sc);
    char what[96];
    s->n_lora = 0;
    if (mm3_yaml_is_null(v)) return 0;
    if (v->kind != MM3_YAML_SEQ)
        return fail(sc->c, v, path, "expected a list of adapters like [{path: DIR, scale: 1.0}], got %s",
                    mm3_yaml_describe(v, what, sizeof what));
    if (v->n > MM3_DEPLOY_MAX_LORA)
        return fail(sc->c, v, path, "expected at most %d adapters, got %zu", MM3_DEPLOY_MAX_LORA, v->n);
    for (size_t j = 0; j < v->n; j++) {
        char q[KEY_PATH_MAX];
        path_index(q, path, j);
        int rc = decode_lora_entry(sc, v->items[j], q, &s->lora[j]);
        if (rc < 0) return rc;
        s->n_lora++;
    }
    return 0;
}

int mm3_lora_name_valid(const char *name)
{
    size_t n = strlen(name);
    return n > 0 && n < MM3_DEPLOY_LORA_NAME_MAX &&
           strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

static int decode_lora_module(const struct scope *sc, const ynode *n, const char *path, int j)
{
    struct load_ctx *c = sc->c;
    struct mm3_stage_config *s = scope_stage(sc);
    struct mm3_lora_module_config *l = &s->lora_modules[j];
    char what[96], p[KEY_PATH_MAX];
    if (n->kind != MM3_YAML_MAP)
        return fail(c, n, path, "expected a mapping {name: NAME, path: ADAPTER_DIR, scale: 1.0}, got %s",
                    mm3_yaml_describe(n, what, sizeof what));
    l->scale = 1.0;
    const ynode *name_node = NULL, *path_node = NULL;
    for (size_t i = 0; i < n->n; i++) {
        const char *k = n->keys[i]->text;
        const ynode *v = n->items[i];
        path_join(p, path, k);
        int rc;
        if (!strcmp(k, "name")) {
            name_node = v;
            if ((rc = get_string(c, v, p, l->name, sizeof l->name, false)) == 0 && !mm3_lora_name_valid(l->name))
                rc = fail(c, v, p,
                          "expected only letters, digits, '.', '_' and '-', 1 to %d of them (a request names it), "
                          "got '%s'",
                          MM3_DEPLOY_LORA_NAME_MAX - 1, l->name);
            if (rc == 0 && !strcmp(l->name, MM3_SERVED_MODEL_NAME))
                rc = fail(c, v, p, "'%s' is the base model's name: a request naming it gets no adapter", l->name);
            for (int o = 0; rc == 0 && o < j; o++)
                if (!strcmp(s->lora_modules[o].name, l->name))
                    rc = fail(c, v, p, "'%s' is already the name of lora_modules[%d]", l->name, o);
        } else if (!strcmp(k, "path")) {
            path_node = v;
            rc = get_string(c, v, p, l->path, sizeof l->path, false);
        } else if (!strcmp(k, "scale")) {
            rc = get_number(c, v, p, -100, false, 100, false, &l->scale);
        } else if (!strcmp(k, "component")) {
            char comp[MM3_DEPLOY_NAME_MAX];
            if ((rc = get_string(c, v, p, comp, sizeof comp, false)) == 0 && strcmp(comp, "language_model"))
                rc = fail(c, v, p,
                          "expected 'language_model': only talker adapters are served per request (merge a "
                          "'%s' adapter at load with stages[0].lora)",
                          comp);
        } else {
            rc = unknown_key(c, n->keys[i], p, "name, path, scale, component");
        }
        if (rc < 0) return rc;
    }
    if (!name_node) {
        path_join(p, path, "name");
        return fail(c, n, p, "missing (expected the name a request picks the adapter by)");
    }
    if (!path_node) {
        path_join(p, path, "path");
        return fail(c, n, p,
                    "missing (expected the adapter's folder: adapter_config.json and adapter_model.safetensors)");
    }
    return 0;
}

static int decode_lora_modules(const struct scope *sc, const ynode *key, const ynode *v, const char *path)
{
    struct mm3_stage_config *s = scope_stage(sc);
    char what[96];
    s->n_lora_modules = 0;
    if (mm3_yaml_is_null(v)) return 0;
    if (v->kind != MM3_YAML_SEQ)
        return fail(sc->c, v, path, "expected a list of adapters like [{name: NAME, path: DIR}], got %s",
                    mm3_yaml_describe(v, what, sizeof what));
    if (v->n > MM3_DEPLOY_MAX_LORA_MODULES)
        return fail(sc->c, v, path, "expected at most %d adapters served per request, got %zu",
                    MM3_DEPLOY_MAX_LORA_MODULES, v->n);
    for (size_t j = 0; j < v->n; j++) {
        char q[KEY_PATH_MAX];
        path_index(q, path, j);
        int rc = decode_lora_module(sc, v->items[j], q, (int)j);
        if (rc < 0) return rc;
        s->n_lora_modules++;
    }
    return 0;
}

static int decode_stage_id(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    return 0; /* read first, by decode_stage */
}

static int decode_dtype(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    /* Each stage lists its usual dtype first. */
    static const char *const s0[] = {"bfloat16", "float32"}, *const s1[] = {"float32", "bfloat16"};
    static const enum mm3_dtype t0[] = {MM3_DTYPE_BF16, MM3_DTYPE_F32}, t1[] = {MM3_DTYPE_F32, MM3_DTYPE_BF16};
    int choice = 0;
    int rc = get_choice(s->c, v, path, s->stage == 0 ? s0 : s1, 2, &choice);
    if (rc == 0) scope_stage(s)->dtype = s->stage == 0 ? t0[choice] : t1[choice];
    return rc;
}

static int check_async_scheduling(const struct scope *s, const ynode *v, const char *path, const void *value)
{
    if (!*(const bool *)value) return 0;
    return fail(s->c, v, path,
                "expected false: mm3 schedules a step only once the previous step's frames "
                "are known (a CFG pair is sampled inside one step)");
}

static int check_prefix_caching(const struct scope *s, const ynode *v, const char *path, const void *value)
{
    if (!*(const bool *)value) return 0;
    return fail(s->c, v, path,
                "expected false: mm3 has no prefix cache (a shared prefix would also skew the "
                "cond/uncond pair)");
}

static const struct field stage_fields[] = {
    {"stage_id", CUSTOM(decode_stage_id)},
    {"max_num_seqs", I32_AT(struct mm3_stage_config, max_num_seqs), .lo = 1, .hi = 65536, .mark = MARK_MAX_NUM_SEQS},
    {"gpu_memory_utilization", NUMBER_AT(struct mm3_stage_config, gpu_memory_utilization), .min = 0, .min_open = true,
     .max = 1, .mark = MARK_GPU_MEMORY_UTILIZATION},
    {"dtype", CUSTOM(decode_dtype), .mark = MARK_DTYPE},
    {"kv_cache_dtype", CHOICE_AT(struct mm3_stage_config, kv_cache_dtype, kv_cache_dtype_names), .stage0_only = true},
    {"max_model_len", I32_AT(struct mm3_stage_config, max_model_len), .lo = 1, .hi = 1 << 24,
     .mark = MARK_MAX_MODEL_LEN},
    {"max_num_batched_tokens", I32_AT(struct mm3_stage_config, max_num_batched_tokens), .lo = 1, .hi = 1 << 24,
     .mark = MARK_MAX_NUM_BATCHED_TOKENS},
    {"enforce_eager", BOOL_AT(struct mm3_stage_config, enforce_eager)},
    {"compilation_config", CUSTOM(decode_compilation)},
    {"async_scheduling", BOOL_AT(struct mm3_stage_config, async_scheduling), .check = check_async_scheduling},
    {"enable_prefix_caching", BOOL_AT(struct mm3_stage_config, enable_prefix_caching), .check = check_prefix_caching},
    {"devices", CUSTOM(decode_devices), .mark = MARK_DEVICES},
    {"replicas", I32_AT(struct mm3_stage_config, replicas), .lo = 1, .hi = MM3_DEPLOY_MAX_WORKERS,
     .mark = MARK_REPLICAS, .stage1_only = true},
    {"input_connectors", CUSTOM(decode_input_edge)},
    {"output_connectors", CUSTOM(decode_output_edge)},
    {"default_sampling_params", CUSTOM(decode_sampling)},
    {"matmul_precision", CHOICE_AT(struct mm3_stage_config, matmul_precision, precision_names), .stage1_only = true},
    {"num_inference_steps", I32_AT(struct mm3_stage_config, num_inference_steps), .lo = 1, .hi = 1000,
     .stage1_only = true},
    {"guidance_scale", NUMBER_AT(struct mm3_stage_config, guidance_scale), .min = 0, .max = 100, .stage1_only = true},
    {"flow_shift", NUMBER_AT(struct mm3_stage_config, flow_shift), .min = 0, .min_open = true, .max = 20,
     .stage1_only = true},
    {"mps_thread_percentage", I32_AT(struct mm3_stage_config, mps_thread_percentage), .lo = 1, .hi = 100},
    {"stream_priority", CHOICE_AT(struct mm3_stage_config, stream_priority, stream_priority_names)},
    {"window_order", CHOICE_AT(struct mm3_stage_config, window_order, window_order_names), .stage1_only = true},
    {"lora", CUSTOM(decode_lora)},
    {"lora_modules", CUSTOM(decode_lora_modules), .stage0_only = true},
};

static int decode_stage(struct load_ctx *c, const ynode *n, int position)
{
    char path[KEY_PATH_MAX], p[KEY_PATH_MAX], what[96];
    snprintf(path, sizeof path, "stages[%d]", position);
    if (n->kind != MM3_YAML_MAP)
        return fail(c, n, path, "expected a mapping with stage_id and the stage's settings, got %s",
                    mm3_yaml_describe(n, what, sizeof what));
    const ynode *id_node = NULL;
    for (size_t i = 0; i < n->n; i++)
        if (!strcmp(n->keys[i]->text, "stage_id")) id_node = n->items[i];
    path_join(p, path, "stage_id");
    if (!id_node) return fail(c, n, p, "missing (expected 0 or 1)");
    int stage = 0;
    int rc = get_int32(c, id_node, p, 0, MM3_DEPLOY_NUM_STAGES - 1, &stage);
    if (rc < 0) return rc;
    if (c->marks[stage].entry)
        return fail(c, id_node, p, "stage %d is already defined at line %d", stage, c->marks[stage].entry->line);
    c->marks[stage].entry = n;
    c->marks[stage].position = position;
    c->d->stages[stage].line = n->line;
    struct scope s = {c, &c->d->stages[stage], &c->marks[stage], stage};
    rc = decode_fields(&s, n, path, stage_fields, COUNT(stage_fields));
    if (rc < 0) return rc;
    if (!c->marks[stage].node[MARK_CAPTURE_SIZES]) capture_sizes_default(&c->d->stages[stage]);
    return 0;
}

static int decode_stages(const struct scope *top, const ynode *key, const ynode *n, const char *path)
{
    struct load_ctx *c = top->c;
    char what[96];
    c->stages = n;
    if (n->kind != MM3_YAML_SEQ)
        return fail(c, n, path, "expected a list of two stages (stage_id 0 and 1), got %s",
                    mm3_yaml_describe(n, what, sizeof what));
    for (size_t i = 0; i < n->n; i++) {
        int rc = decode_stage(c, n->items[i], (int)i);
        if (rc < 0) return rc;
    }
    for (int s = 0; s < MM3_DEPLOY_NUM_STAGES; s++)
        if (!c->marks[s].entry)
            return fail(c, n, path, "stage %d is missing (both stage_id 0 and stage_id 1 are required)", s);
    return 0;
}

/* ---- top level ----------------------------------------------------------- */

static int check_host(const struct scope *s, const ynode *v, const char *path, const void *value)
{
    const char *host = value;
    unsigned char buf[16];
    if (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1) return 0;
    for (const char *q = host; *q; q++)
        if (!isalnum((unsigned char)*q) && *q != '-' && *q != '.')
            return fail(s->c, v, path, "expected an IP address or host name, got '%s'", host);
    return 0;
}

static int decode_sample_rate(const struct scope *s, const ynode *key, const ynode *v, const char *path)
{
    struct mm3_api_config *a = s->target;
    long long r = 0;
    char what[96];
    if (mm3_yaml_int(v, &r) == 0 && (r == 44100 || r == 32000)) {
        a->default_sample_rate = (int)r;
        return 0;
    }
    return fail(s->c, v, path, "expected 44100 or 32000, got %s", mm3_yaml_describe(v, what, sizeof what));
}

/* The key travels in an HTTP header: printable ASCII without spaces, and long
 * enough that guessing it is hopeless. */
static int check_api_key(const struct scope *s, const ynode *v, const char *path, const void *value)
{
    const char *key = value;
    if (!key[0]) return 0;
    for (const char *q = key; *q; q++)
        if (*q <= ' ' || *q > '~')
            return fail(s->c, v, path, "expected printable ASCII without spaces or control characters");
    if (strlen(key) < 16) return fail(s->c, v, path, "too short: expected at least 16 characters");
    return 0;
}

static const struct field api_fields[] = {
    {"host", STRING_AT(struct mm3_api_config, host), .check = check_host},
    {"port", I32_AT(struct mm3_api_config, port), .lo = 0, .hi = 65535},
    {"max_queue_depth", I32_AT(struct mm3_api_config, max_queue_depth), .lo = 0, .hi = 1000000},
    {"max_body_bytes", I64_AT(struct mm3_api_config, max_body_bytes), .lo = 1024, .hi = 1LL << 30},
    {"max_connections", I32_AT(struct mm3_api_config, max_connections), .lo = 1, .hi = 65536},
    {"request_timeout_s", NUMBER_AT(struct mm3_api_config, request_timeout_s), .min = 0, .min_open = true,
     .max = 7 * 86400},
    {"journal_dir", STRING_AT(struct mm3_api_config, journal_dir), .allow_empty = true},
    {"replay_dir", STRING_AT(struct mm3_api_config, replay_dir), .allow_empty = true},
    {"max_buffered_bytes", I64_AT(struct mm3_api_config, max_buffered_bytes), .lo = 1LL << 20, .hi = 1LL << 40},
    {"continue_max_songs", I32_AT(struct mm3_api_config, continue_max_songs), .lo = 0, .hi = 1000000},
    {"continue_max_bytes", I64_AT(struct mm3_api_config, continue_max_bytes), .lo = 0, .hi = 1LL << 40},
    {"continue_max_age_s", NUMBER_AT(struct mm3_api_config, continue_max_age_s), .min = 0, .max = 30 * 86400},
    {"default_sample_rate", CUSTOM(decode_sample_rate)},
    {"idle_timeout_s", I32_AT(struct mm3_api_config, idle_timeout_s), .lo = 1, .hi = 86400},
    {"request_read_timeout_s", NUMBER_AT(struct mm3_api_config, request_read_timeout_s), .min = 0, .min_open = true,
     .max = 3600},
    {"max_connections_per_client", I32_AT(struct mm3_api_config, max_connections_per_client), .lo = 0, .hi = 65536},
    {"admin_connections", I32_AT(struct mm3_api_config, admin_connections), .lo = 0, .hi = 1024},
    {"drain_timeout_s", NUMBER_AT(struct mm3_api_config, drain_timeout_s), .min = 0, .max = 3600},
    {"stream_capacity_share", NUMBER_AT(struct mm3_api_config, stream_capacity_share), .min = 0, .min_open = true,
     .max = 1},
    {"api_key", STRING_AT(struct mm3_api_config, api_key), .allow_empty = true, .check = check_api_key},
};

static int decode_api(const struct scope *top, const ynode *key, const ynode *v, const char *path)
{
    struct scope s = {top->c, &top->c->d->api, NULL, -1};
    return decode_fields(&s, v, path, api_fields, COUNT(api_fields));
}

static int check_pipeline(const struct scope *s, const ynode *v, const char *path, const void *value)
{
    if (!strcmp(value, "minimax_music3")) return 0;
    return fail(s->c, v, path, "expected minimax_music3 (the only pipeline mm3 serves), got '%s'", (const char *)value);
}

static const struct field top_fields[] = {
    {"pipeline", STRING_AT(struct mm3_deploy, pipeline), .check = check_pipeline},
    {"async_chunk", BOOL_AT(struct mm3_deploy, async_chunk)},
    {"trust_remote_code", BOOL_AT(struct mm3_deploy, trust_remote_code)},
    {"model", STRING_AT(struct mm3_deploy, model), .allow_empty = true},
    {"backend", CHOICE_AT(struct mm3_deploy, backend, backend_names)},
    {"mps", CHOICE_AT(struct mm3_deploy, mps, mps_names)},
    {"api", CUSTOM(decode_api)},
    {"connectors", CUSTOM(decode_connectors)},
    {"stages", CUSTOM(decode_stages)},
};

static int decode_top(struct load_ctx *c, const ynode *root)
{
    char what[96];
    if (!root) return fail(c, NULL, "(top level)", "empty deploy file (expected a mapping with stages:)");
    if (root->kind != MM3_YAML_MAP)
        return fail(c, root, "(top level)", "expected a mapping with stages:, got %s",
                    mm3_yaml_describe(root, what, sizeof what));
    struct scope s = {c, c->d, NULL, -1};
    int rc = decode_fields(&s, root, "", top_fields, COUNT(top_fields));
    if (rc < 0) return rc;
    if (!c->stages) return fail(c, root, "stages", "missing (both stage_id 0 and stage_id 1 are required)");
    return 0;
}

/* ---- checks across keys -------------------------------------------------- */

static void stage_path(const struct load_ctx *c, int stage, const char *key, char *out)
{
    char base[32];
    snprintf(base, sizeof base, "stages[%d]", c->marks[stage].position);
    path_join(out, base, key);
}

/* The node to blame for a stage key: the key's value, else the stage entry. */
static const ynode *stage_node(const struct load_ctx *c, int stage, enum mark m)
{
    const ynode *n = c->marks[stage].node[m];
    return n ? n : c->marks[stage].entry;
}

/* NULL when the stage's dtype has kernels on `backend`. */
static const char *dtype_backend_problem(const struct mm3_stage_config *s, enum mm3_backend backend)
{
    if (backend == MM3_BACKEND_CPU && s->dtype == MM3_DTYPE_BF16)
        return "bfloat16 is not available on the CPU backend (float32 only)";
    if (backend == MM3_BACKEND_CUDA && s->stage_id == 0 && s->dtype == MM3_DTYPE_F32)
        return "float32 for stage 0 is for the CPU backend; on CUDA stage 0 runs bfloat16";
    return NULL;
}

static int check_connectors(struct load_ctx *c)
{
    struct mm3_deploy *d = c->d;
    const char *names[2] = {d->stages[0].output_connector, d->stages[1].input_connector};
    const ynode *nodes[2] = {c->marks[0].node[MARK_OUTPUT_CONNECTOR], c->marks[1].node[MARK_INPUT_CONNECTOR]};
    const char *keys[2] = {"output_connectors.to_stage_1", "input_connectors.from_stage_0"};
    for (int i = 0; i < 2; i++) {
        if (!names[i][0]) continue;
        char p[KEY_PATH_MAX];
        stage_path(c, i, keys[i], p);
        struct mm3_connector_config *k = (struct mm3_connector_config *)mm3_deploy_connector(d, names[i]);
        if (!k) {
            char list[256] = "";
            for (int j = 0; j < d->n_connectors; j++)
                list_append(list, sizeof list, d->connectors[j].name);
            return fail(c, nodes[i], p, "no connector named '%s' under connectors: (defined: %s)", names[i],
                        list[0] ? list : "none");
        }
        k->used = true;
        d->edge = *k;
    }
    if (names[0][0] && names[1][0] && strcmp(names[0], names[1])) {
        char p[KEY_PATH_MAX];
        stage_path(c, 1, keys[1], p);
        return fail(c, nodes[1], p,
                    "names '%s' but stage 0's to_stage_1 names '%s'; both ends of the edge "
                    "must use the same connector",
                    names[1], names[0]);
    }
    for (int j = 0; j < d->n_connectors; j++) {
        if (d->connectors[j].used) continue;
        char p[KEY_PATH_MAX];
        path_join(p, "connectors", d->connectors[j].name);
        const ynode *at = c->connectors;
        for (size_t i = 0; c->connectors && i < c->connectors->n; i++)
            if (!strcmp(c->connectors->keys[i]->text, d->connectors[j].name)) at = c->connectors->keys[i];
        warn(c, at, p, "connector is not used by any stage");
    }
    return 0;
}

static int check_cross(struct load_ctx *c)
{
    struct mm3_deploy *d = c->d;
    struct mm3_stage_config *s0 = &d->stages[0], *s1 = &d->stages[1];
    char p[KEY_PATH_MAX];

    s0->cfg_enabled = s0->cfg_scale > 1.0;
    if (s0->cfg_enabled && s0->max_num_seqs % 2) {
        stage_path(c, 0, "max_num_seqs", p);
        return fail(c, stage_node(c, 0, MARK_MAX_NUM_SEQS), p,
                    "expected an even number while CFG is on (cfg_scale %g: every song decodes as a cond/uncond "
                    "row pair), got %d",
                    s0->cfg_scale, s0->max_num_seqs);
    }
    if (!s0->cfg_enabled) {
        stage_path(c, 0, "default_sampling_params.extra_args.cfg_scale", p);
        warn(c, stage_node(c, 0, MARK_CFG_SCALE), p,
             "cfg_scale 1 turns classifier-free guidance off; the model is trained to be sampled with it");
    }

    for (int i = 0; i < MM3_DEPLOY_NUM_STAGES; i++) {
        const struct mm3_stage_config *s = &d->stages[i];
        const struct mm3_compilation_config *cc = &s->compilation;
        if (s->max_num_batched_tokens < s->max_num_seqs && i == 0) {
            stage_path(c, i, "max_num_batched_tokens", p);
            return fail(c, stage_node(c, i, MARK_MAX_NUM_BATCHED_TOKENS), p,
                        "expected at least max_num_seqs (%d): a decode step of every row needs one token per row, "
                        "got %d",
                        s->max_num_seqs, s->max_num_batched_tokens);
        }
        if (!s->enforce_eager && cc->cudagraph_mode != MM3_CUDAGRAPH_NONE && d->backend != MM3_BACKEND_CPU &&
            cc->n_capture_sizes && cc->capture_sizes[cc->n_capture_sizes - 1] < s->max_num_seqs) {
            stage_path(c, i, "compilation_config.cudagraph_capture_sizes", p);
            warn(c, stage_node(c, i, MARK_CAPTURE_SIZES), p,
                 "largest capture size %d is below max_num_seqs %d: steps with more rows run eager",
                 cc->capture_sizes[cc->n_capture_sizes - 1], s->max_num_seqs);
        }
        if (d->backend != MM3_BACKEND_AUTO) {
            const char *why = dtype_backend_problem(s, d->backend);
            if (why) {
                stage_path(c, i, "dtype", p);
                return fail(c, stage_node(c, i, MARK_DTYPE), p, "%s (backend: %s)", why, mm3_backend_name(d->backend));
            }
        }
        if (i == 0 && s->n_devices > 1) {
            stage_path(c, i, "devices", p);
            warn(c, c->marks[i].node[MARK_DEVICES], p,
                 "a stage runs on its first device (%d); mm3 does not split a stage "
                 "across GPUs",
                 s->devices[0]);
        }
    }

    /* Stage 0's context must hold the prompt plus every step of the song. */
    long long need = MM3_DEPLOY_PROMPT_TOKENS_MAX + s0->max_tokens;
    if (need > s0->max_model_len) {
        stage_path(c, 0, "max_model_len", p);
        long long room = s0->max_model_len - MM3_DEPLOY_PROMPT_TOKENS_MAX - MM3_DEPLOY_EXTRA_AR_STEPS;
        char tail[96];
        if (room > 0)
            snprintf(tail, sizeof tail, "with a maximal prompt a song ends after %lld frames", room);
        else
            snprintf(tail, sizeof tail, "a maximal prompt leaves no room for a single frame");
        warn(c, stage_node(c, 0, MARK_MAX_MODEL_LEN), p,
             "%d positions cannot hold a %d-token prompt plus %lld steps (prompt cap + frame budget = %lld); %s",
             s0->max_model_len, MM3_DEPLOY_PROMPT_TOKENS_MAX, (long long)s0->max_tokens, need, tail);
    }
    int rows_per_song = s0->cfg_enabled ? 2 : 1;
    if (s0->max_num_batched_tokens < rows_per_song * MM3_DEPLOY_PROMPT_TOKENS_MAX) {
        stage_path(c, 0, "max_num_batched_tokens", p);
        warn(c, stage_node(c, 0, MARK_MAX_NUM_BATCHED_TOKENS), p,
             "%d tokens per step cannot prefill a maximal prompt%s (%d tokens) in one step; long prompts "
             "prefill over several steps",
             s0->max_num_batched_tokens, s0->cfg_enabled ? " pair" : "", rows_per_song * MM3_DEPLOY_PROMPT_TOKENS_MAX);
    }
    /* An unwritten window cap follows a smaller window capacity. */
    if (!c->marks[1].node[MARK_MAX_TOKENS] && s1->max_tokens > s1->max_model_len) s1->max_tokens = s1->max_model_len;
    if (s1->max_tokens > s1->max_model_len) {
        stage_path(c, 1, "default_sampling_params.max_tokens", p);
        return fail(c, stage_node(c, 1, MARK_MAX_TOKENS), p,
                    "expected at most max_model_len (%d windows per song), got %lld", s1->max_model_len,
                    (long long)s1->max_tokens);
    }
    if (c->marks[1].node[MARK_SEED] && s1->seed != s0->seed) {
        stage_path(c, 1, "default_sampling_params.seed", p);
        return fail(c, c->marks[1].node[MARK_SEED], p,
                    "expected %llu (stage 0's default seed): the seed travels with each "
                    "request, so stage 1 cannot have its own",
                    (unsigned long long)s0->seed);
    }
    s1->seed = s0->seed;

    /* Several devices give one worker each; `replicas` puts several on one device. */
    if (c->marks[1].node[MARK_REPLICAS] && s1->n_devices > 1 && s1->replicas != s1->n_devices) {
        stage_path(c, 1, "replicas", p);
        return fail(c, c->marks[1].node[MARK_REPLICAS], p,
                    "%d, but devices \"%s\" already gives one worker per device (%d): drop replicas, or list "
                    "one device",
                    s1->replicas, s1->devices_text, s1->n_devices);
    }
    if (s1->n_devices > 1) s1->replicas = s1->n_devices;
    /* Stages sharing a device share its memory: stage 1's workers on one device each take
     * their gpu_memory_utilization of it, and stage 0 its own where it shares one. */
    int per_device = s1->n_devices > 1 ? 1 : s1->replicas;
    for (int k = 0; k < s1->n_devices && d->backend != MM3_BACKEND_CPU; k++) {
        int with_s0 = s0->devices[0] == s1->devices[k];
        double want = per_device * s1->gpu_memory_utilization + (with_s0 ? s0->gpu_memory_utilization : 0);
        if (want <= 1.0 + 1e-9) continue;
        stage_path(c, 1, "gpu_memory_utilization", p);
        if (with_s0 && per_device == 1)
            return fail(c, stage_node(c, 1, MARK_GPU_MEMORY_UTILIZATION), p,
                        "stages 0 and 1 share device %d and ask for %g + %g > 1 of its memory", s0->devices[0],
                        s0->gpu_memory_utilization, s1->gpu_memory_utilization);
        return fail(c, stage_node(c, 1, MARK_GPU_MEMORY_UTILIZATION), p,
                    "device %d holds %d stage-1 worker(s) x %g%s = %g > 1 of its memory (replicas: %d)", s1->devices[k],
                    per_device, s1->gpu_memory_utilization, with_s0 ? " + stage 0's share" : "", want, s1->replicas);
    }
    return check_connectors(c);
}

/* ---- public -------------------------------------------------------------- */

int mm3_deploy_stage1_workers(const struct mm3_deploy *d)
{
    const struct mm3_stage_config *s1 = mm3_deploy_stage(d, 1);
    return s1->n_devices > 1 ? s1->n_devices : s1->replicas;
}

int mm3_deploy_stage1_worker_device(const struct mm3_deploy *d, int k)
{
    const struct mm3_stage_config *s1 = mm3_deploy_stage(d, 1);
    if (s1->n_devices <= 0) return 0;
    return s1->n_devices > 1 ? s1->devices[k % s1->n_devices] : s1->devices[0];
}

int mm3_deploy_load_string(struct mm3_deploy *d, const char *yaml, const char *name_for_messages)
{
    const char *name = name_for_messages ? name_for_messages : "(deploy)";
    mm3_deploy_init_defaults(d);
    snprintf(d->source, sizeof d->source, "%s", name);
    struct mm3_yaml_node *root;
    int rc = mm3_yaml_tree_parse(yaml, strlen(yaml), name, &root);
    if (rc < 0) {
        mm3_deploy_init_defaults(d);
        return rc;
    }
    struct load_ctx c = {.file = name, .d = d};
    rc = decode_top(&c, root);
    if (rc == 0) rc = check_cross(&c);
    mm3_yaml_tree_free(root);
    if (rc < 0) {
        mm3_deploy_init_defaults(d);
        return rc;
    }
    return 0;
}

int mm3_deploy_load(struct mm3_deploy *d, const char *path)
{
    mm3_deploy_init_defaults(d);
    FILE *f = fopen(path, "rb");
    if (!f) return mm3_errorf(-errno, "%s: cannot open deploy file: %s", path, strerror(errno));
    char *buf = malloc(MM3_DEPLOY_FILE_BYTES_MAX + 1);
    if (!buf) {
        fclose(f);
        return mm3_errorf(-ENOMEM, "%s: out of memory", path);
    }
    size_t len = fread(buf, 1, MM3_DEPLOY_FILE_BYTES_MAX + 1, f);
    int err = ferror(f);
    fclose(f);
    int rc;
    if (err) {
        rc = mm3_errorf(-EIO, "%s: read error", path);
    } else if (len > MM3_DEPLOY_FILE_BYTES_MAX) {
        rc = mm3_errorf(-EFBIG, "%s: deploy file larger than %d bytes", path, MM3_DEPLOY_FILE_BYTES_MAX);
    } else if (memchr(buf, 0, len)) {
        rc = mm3_errorf(-EINVAL, "%s: deploy file contains a NUL byte (expected YAML text)", path);
    } else {
        buf[len] = 0;
        rc = mm3_deploy_load_string(d, buf, path);
    }
    free(buf);
    return rc;
}

void mm3_deploy_free(struct mm3_deploy *d)
{
    /* Everything lives inside the struct; clearing it keeps a freed deploy
     * from being mistaken for a loaded one. */
    if (d) memset(d, 0, sizeof *d);
}

int mm3_deploy_set_model(struct mm3_deploy *d, const char *path)
{
    if (!path || !path[0]) return mm3_errorf(-EINVAL, "--model: expected a checkpoint directory");
    if (strlen(path) >= sizeof d->model)
        return mm3_errorf(-ENAMETOOLONG, "--model: path longer than %zu characters", sizeof d->model - 1);
    snprintf(d->model, sizeof d->model, "%s", path);
    return 0;
}

int mm3_deploy_resolve_backend(struct mm3_deploy *d, bool gpu_present)
{
    if (d->backend == MM3_BACKEND_AUTO) d->backend = gpu_present ? MM3_BACKEND_CUDA : MM3_BACKEND_CPU;
    if (d->backend == MM3_BACKEND_CUDA && !gpu_present)
        return mm3_errorf(-ENODEV, "%s: backend: cuda, but no CUDA device is present", d->source);
    for (int i = 0; i < MM3_DEPLOY_NUM_STAGES; i++) {
        const char *why = dtype_backend_problem(&d->stages[i], d->backend);
        if (why)
            return mm3_errorf(-EINVAL, "%s: stage %d dtype: %s (backend resolved to %s)", d->source, i, why,
                              mm3_backend_name(d->backend));
    }
    return 0;
}

const struct mm3_stage_config *mm3_deploy_stage(const struct mm3_deploy *d, int stage_id)
{
    if (stage_id < 0 || stage_id >= MM3_DEPLOY_NUM_STAGES) return NULL;
    return &d->stages[stage_id];
}

const struct mm3_connector_config *mm3_deploy_connector(const struct mm3_deploy *d, const char *name)
{
    for (int i = 0; i < d->n_connectors; i++)
        if (!strcmp(d->connectors[i].name, name)) return &d->connectors[i];
    return NULL;
}

const struct mm3_connector_config *mm3_deploy_edge_connector(const struct mm3_deploy *d)
{
    return &d->edge;
}

double mm3_connector_first_chunk_deadline_s(const struct mm3_connector_config *c)
{
    return c->get_sleep_s * (double)c->get_max_wait_first_chunk;
}

double mm3_connector_steady_deadline_s(const struct mm3_connector_config *c)
{
    return c->get_sleep_s * (double)c->get_max_wait;
}

/* "?" for a value outside the enum. */
static const char *name_of(const char *const *names, size_t count, int v)
{
    return v >= 0 && (size_t)v < count ? names[v] : "?";
}

const char *mm3_backend_name(enum mm3_backend b)
{
    return name_of(backend_names, COUNT(backend_names), (int)b);
}

const char *mm3_matmul_precision_name(enum mm3_matmul_precision p)
{
    return name_of(precision_names, COUNT(precision_names), (int)p);
}

const char *mm3_cudagraph_mode_name(enum mm3_cudagraph_mode m)
{
    return name_of(cudagraph_names, COUNT(cudagraph_names), (int)m);
}

const char *mm3_mps_mode_name(enum mm3_mps_mode m)
{
    return name_of(mps_names, COUNT(mps_names), (int)m);
}

const char *mm3_stream_priority_name(enum mm3_stream_priority p)
{
    return name_of(stream_priority_names, COUNT(stream_priority_names), (int)p);
}

const char *mm3_window_order_name(enum mm3_window_order o)
{
    return name_of(window_order_names, COUNT(window_order_names), (int)o);
}

int mm3_deploy_stream_priority_level(enum mm3_stream_priority p)
{
    return p == MM3_STREAM_PRIORITY_HIGH ? 1 : p == MM3_STREAM_PRIORITY_LOW ? -1 : 0;
}

const char *mm3_kv_cache_dtype_name(enum mm3_kv_cache_dtype t)
{
    return name_of(kv_cache_dtype_names, COUNT(kv_cache_dtype_names), (int)t);
}

int mm3_kv_cache_dtype_parse(const char *name, enum mm3_kv_cache_dtype *out)
{
    int i = index_of(kv_cache_dtype_names, (int)COUNT(kv_cache_dtype_names), name);
    if (i >= 0) {
        *out = (enum mm3_kv_cache_dtype)i;
        return 0;
    }
    return mm3_errorf(-EINVAL, "kv cache dtype '%s': expected auto, bfloat16 or float32", name ? name : "(null)");
}
