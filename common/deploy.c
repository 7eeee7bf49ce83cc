/* Deploy file loader: YAML tree (common/deploy_yaml.h) -> struct mm3_deploy.
 * Decoding checks each key's type and range where it is read; the checks that
 * look across keys (CFG pairs, connector names, memory per device, context
 * budget) run once everything is read, pointing at the nodes they kept. */
#include "common/deploy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/deploy_yaml.h"

#define KEY_PATH_MAX 256

typedef struct mm3_yaml_node ynode;

/* Nodes kept for the checks that run after decoding. NULL = key absent. */
struct stage_marks {
    const ynode *entry;
    int position; /* index in the stages list, for key paths */
    const ynode *max_num_seqs, *gpu_memory_utilization, *dtype, *max_model_len;
    const ynode *max_num_batched_tokens, *capture_sizes, *input_connector, *output_connector;
    const ynode *max_tokens, *seed, *cfg_scale, *cfg_role, *devices;
};

struct load_ctx {
    const char *file;
    struct mm3_deploy *d;
    const ynode *stages;
    const ynode *connectors;
    const ynode *backend;
    struct stage_marks marks[MM3_DEPLOY_NUM_STAGES];
};

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

static int unknown_key(const struct load_ctx *c, const ynode *key, const char *path, const char *known)
{
    return fail(c, key, path, "unknown key (expected one of: %s)", known);
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

static int get_choice(const struct load_ctx *c, const ynode *n, const char *path, const char *const *names, int count,
                      int *out)
{
    char what[96], list[256] = "";
    if (n->kind == MM3_YAML_SCALAR)
        for (int i = 0; i < count; i++)
            if (!strcmp(n->text, names[i])) {
                *out = i;
                return 0;
            }
    for (int i = 0; i < count; i++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", names[i]);
    }
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
    d->api.default_sample_rate = 44100;
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
        s->temperature = i == 0 ? 1.0 : 0.0;
        s->max_tokens = i == 0 ? MM3_DEPLOY_AUDIO_FRAMES_MAX + MM3_DEPLOY_EXTRA_AR_STEPS : 4096;
        s->seed = 0;
        s->cfg_scale = i == 0 ? 1.5 : 1.0;
        s->cfg_enabled = i == 0;
        s->matmul_precision = MM3_MATMUL_TF32;
        s->num_inference_steps = 30;
        s->guidance_scale = 1.7;
    }
}

/* ---- connectors ---------------------------------------------------------- */

static int decode_connector_extra(struct load_ctx *c, const ynode *n, const char *path, struct mm3_connector_config *k)
{
    int has = get_map(c, n, path);
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        const char *key = n->keys[i]->text;
        const ynode *v = n->items[i];
        char p[KEY_PATH_MAX];
        long long iv;
        int rc;
        path_join(p, path, key);
        if (!strcmp(key, "codec_streaming")) {
            rc = get_bool(c, v, p, &k->codec_streaming);
        } else if (!strcmp(key, "shm_threshold_bytes")) {
            rc = get_int(c, v, p, 0, 1LL << 30, &iv);
            k->shm_threshold_bytes = iv;
        } else if (!strcmp(key, "connector_get_sleep_s")) {
            rc = get_number(c, v, p, 0, true, 60, false, &k->get_sleep_s);
        } else if (!strcmp(key, "connector_get_max_wait_first_chunk")) {
            rc = get_int(c, v, p, 1, 1000000000, &iv);
            k->get_max_wait_first_chunk = iv;
        } else if (!strcmp(key, "connector_get_max_wait")) {
            rc = get_int(c, v, p, 1, 1000000000, &iv);
            k->get_max_wait = iv;
        } else if (!strcmp(key, "vocoder_cudnn") || !strcmp(key, "compile_dit") || !strcmp(key, "dit_autocast_dtype") ||
                   !strcmp(key, "dit_fp16_linear_weights")) {
            rc = fail(c, n->keys[i], p,
                      "unknown key: this is a vLLM-Omni acoustic-model knob; in mm3 the "
                      "DiT's matmul precision is stages[<stage 1>].matmul_precision");
        } else {
            rc = unknown_key(c, n->keys[i], p,
                             "codec_streaming, shm_threshold_bytes, connector_get_sleep_s, "
                             "connector_get_max_wait_first_chunk, connector_get_max_wait");
        }
        if (rc < 0) return rc;
    }
    return 0;
}

static int decode_connectors(struct load_ctx *c, const ynode *n)
{
    struct mm3_deploy *d = c->d;
    int has = get_map(c, n, "connectors");
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        const ynode *kn = n->keys[i], *v = n->items[i];
        char p[KEY_PATH_MAX];
        path_join(p, "connectors", kn->text);
        if (d->n_connectors == MM3_DEPLOY_MAX_CONNECTORS)
            return fail(c, kn, p, "more than %d connectors", MM3_DEPLOY_MAX_CONNECTORS);
        if (!kn->text[0] || strlen(kn->text) >= MM3_DEPLOY_NAME_MAX)
            return fail(c, kn, p, "expected a connector name of 1 to %d characters", MM3_DEPLOY_NAME_MAX - 1);
        struct mm3_connector_config *k = &d->connectors[d->n_connectors++];
        connector_defaults(k, kn->text);
        k->connector_class[0] = 0;
        int rc = get_map(c, v, p);
        if (rc < 0) return rc;
        const ynode *class_node = NULL;
        for (size_t j = 0; j < v->n; j++) {
            const char *key = v->keys[j]->text;
            char q[KEY_PATH_MAX];
            path_join(q, p, key);
            if (!strcmp(key, "name")) {
                class_node = v->items[j];
                rc = get_string(c, class_node, q, k->connector_class, sizeof k->connector_class, false);
                if (rc == 0 && strcmp(k->connector_class, "SharedMemoryConnector"))
                    rc = fail(c, class_node, q,
                              "expected SharedMemoryConnector (the only connector mm3 has: "
                              "a ring over /dev/shm between the two stage processes of one host), got '%s'",
                              k->connector_class);
            } else if (!strcmp(key, "extra")) {
                rc = decode_connector_extra(c, v->items[j], q, k);
            } else {
                rc = unknown_key(c, v->keys[j], q, "name, extra");
            }
            if (rc < 0) return rc;
        }
        if (!class_node) {
            char q[KEY_PATH_MAX];
            path_join(q, p, "name");
            return fail(c, kn, q, "missing (expected name: SharedMemoryConnector)");
        }
    }
    return 0;
}

/* ---- stages -------------------------------------------------------------- */

static int decode_devices(struct load_ctx *c, const ynode *n, const char *path, struct mm3_stage_config *s)
{
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

static int decode_compilation(struct load_ctx *c, const ynode *n, const char *path, int stage)
{
    struct mm3_stage_config *s = &c->d->stages[stage];
    struct mm3_compilation_config *cc = &s->compilation;
    int has = get_map(c, n, path);
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        const char *key = n->keys[i]->text;
        const ynode *v = n->items[i];
        char p[KEY_PATH_MAX], what[96];
        int rc;
        path_join(p, path, key);
        if (!strcmp(key, "mode")) {
            long long m;
            rc = mm3_yaml_int(v, &m) == 0 && m == 0
                     ? 0
                     : fail(c, v, p, "expected 0 (mm3 has no graph compiler; vLLM's other modes do not apply), got %s",
                            mm3_yaml_describe(v, what, sizeof what));
            cc->mode = 0;
        } else if (!strcmp(key, "cudagraph_capture_sizes")) {
            c->marks[stage].capture_sizes = v;
            if (v->kind != MM3_YAML_SEQ)
                return fail(c, v, p, "expected a list of batch sizes like [1, 2, 4], got %s",
                            mm3_yaml_describe(v, what, sizeof what));
            if (v->n > MM3_DEPLOY_MAX_CAPTURE_SIZES)
                return fail(c, v, p, "expected at most %d sizes, got %zu", MM3_DEPLOY_MAX_CAPTURE_SIZES, v->n);
            cc->n_capture_sizes = 0;
            rc = 0;
            for (size_t j = 0; j < v->n && rc == 0; j++) {
                char q[KEY_PATH_MAX];
                int size = 0;
                path_index(q, p, j);
                rc = get_int32(c, v->items[j], q, 1, 65536, &size);
                if (rc == 0 && j > 0 && size <= cc->capture_sizes[j - 1])
                    rc = fail(c, v->items[j], q, "capture sizes must be strictly ascending: %d follows %d", size,
                              cc->capture_sizes[j - 1]);
                cc->capture_sizes[cc->n_capture_sizes++] = size;
            }
        } else if (!strcmp(key, "cudagraph_mode")) {
            static const char *const names[] = {"NONE", "FULL_DECODE_ONLY"};
            int m = 0;
            rc = get_choice(c, v, p, names, 2, &m);
            cc->cudagraph_mode = (enum mm3_cudagraph_mode)m;
        } else if (!strcmp(key, "cudagraph_num_of_warmups")) {
            rc = get_int32(c, v, p, 0, 100, &cc->cudagraph_num_of_warmups);
        } else if (!strcmp(key, "custom_ops")) {
            if (v->kind != MM3_YAML_SEQ || v->n != 1 || v->items[0]->kind != MM3_YAML_SCALAR ||
                (strcmp(v->items[0]->text, "all") && strcmp(v->items[0]->text, "none")))
                return fail(c, v, p,
                            "expected [\"all\"] (fused kernels) or [\"none\"] (unfused op chain); "
                            "per-op lists are not supported");
            cc->fused_ops = !strcmp(v->items[0]->text, "all");
            rc = 0;
        } else {
            rc = unknown_key(c, n->keys[i], p,
                             "mode, cudagraph_capture_sizes, cudagraph_mode, "
                             "cudagraph_num_of_warmups, custom_ops");
        }
        if (rc < 0) return rc;
    }
    return 0;
}

/* input_connectors / output_connectors: the only edge is 0 -> 1, written
 * to_stage_1 on stage 0 and from_stage_0 on stage 1. */
static int decode_edge(struct load_ctx *c, const ynode *n, const char *path, int stage, bool output)
{
    struct mm3_stage_config *s = &c->d->stages[stage];
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
        if (output)
            c->marks[stage].output_connector = n->items[i];
        else
            c->marks[stage].input_connector = n->items[i];
    }
    return 0;
}

static int decode_extra_args(struct load_ctx *c, const ynode *n, const char *path, int stage)
{
    struct mm3_stage_config *s = &c->d->stages[stage];
    int has = get_map(c, n, path);
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        const char *key = n->keys[i]->text;
        const ynode *v = n->items[i];
        char p[KEY_PATH_MAX], role[16];
        int rc;
        path_join(p, path, key);
        if (stage != 0) {
            rc = fail(c, n->keys[i], p,
                      "unknown key: stage 1 takes no extra_args (its knobs are "
                      "num_inference_steps, guidance_scale and matmul_precision on the stage)");
        } else if (!strcmp(key, "cfg_role")) {
            c->marks[0].cfg_role = v;
            rc = get_string(c, v, p, role, sizeof role, false);
            if (rc == 0 && strcmp(role, "cond"))
                rc = fail(c, v, p,
                          "expected 'cond' (requests enter as the conditional row; mm3 adds the "
                          "unconditional twin itself), got '%s'",
                          role);
        } else if (!strcmp(key, "cfg_scale")) {
            c->marks[0].cfg_scale = v;
            rc = get_number(c, v, p, 1, false, 100, false, &s->cfg_scale);
        } else {
            rc = unknown_key(c, n->keys[i], p, "cfg_role, cfg_scale");
        }
        if (rc < 0) return rc;
    }
    return 0;
}

static int decode_sampling(struct load_ctx *c, const ynode *n, const char *path, int stage)
{
    struct mm3_stage_config *s = &c->d->stages[stage];
    int has = get_map(c, n, path);
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        const char *key = n->keys[i]->text;
        const ynode *v = n->items[i];
        char p[KEY_PATH_MAX];
        long long iv;
        int rc;
        path_join(p, path, key);
        if (!strcmp(key, "temperature")) {
            rc = get_number(c, v, p, 0, false, INFINITY, false, &s->temperature);
            if (rc == 0 && stage == 0 && s->temperature != 1.0)
                rc = fail(c, v, p,
                          "expected 1.0: the model's recipe samples at temperature 1 (top-k 50 "
                          "after CFG); other temperatures are not supported, got %g",
                          s->temperature);
            if (rc == 0 && stage == 1 && s->temperature != 0.0)
                rc = fail(c, v, p, "expected 0.0: stage 1 draws no tokens (its noise is seeded), got %g",
                          s->temperature);
        } else if (!strcmp(key, "max_tokens")) {
            c->marks[stage].max_tokens = v;
            if (stage == 0)
                rc = get_int(c, v, p, 1 + MM3_DEPLOY_EXTRA_AR_STEPS,
                             MM3_DEPLOY_AUDIO_FRAMES_MAX + MM3_DEPLOY_EXTRA_AR_STEPS, &iv);
            else
                rc = get_int(c, v, p, 1, 1 << 20, &iv);
            s->max_tokens = iv;
        } else if (!strcmp(key, "seed")) {
            c->marks[stage].seed = v;
            rc = get_int(c, v, p, 0, LLONG_MAX, &iv);
            s->seed = (uint64_t)iv;
        } else if (!strcmp(key, "extra_args")) {
            rc = decode_extra_args(c, v, p, stage);
        } else {
            rc = unknown_key(c, n->keys[i], p, "temperature, max_tokens, seed, extra_args");
        }
        if (rc < 0) return rc;
    }
    return 0;
}

static int decode_stage_key(struct load_ctx *c, const ynode *kn, const ynode *v, const char *p, int stage)
{
    struct mm3_stage_config *s = &c->d->stages[stage];
    struct stage_marks *m = &c->marks[stage];
    const char *key = kn->text;
    bool flag = false;
    int rc, choice = 0;
    if (!strcmp(key, "stage_id")) return 0; /* read first, by decode_stage */
    if (!strcmp(key, "max_num_seqs")) {
        m->max_num_seqs = v;
        return get_int32(c, v, p, 1, 65536, &s->max_num_seqs);
    }
    if (!strcmp(key, "gpu_memory_utilization")) {
        m->gpu_memory_utilization = v;
        return get_number(c, v, p, 0, true, 1, false, &s->gpu_memory_utilization);
    }
    if (!strcmp(key, "dtype")) {
        static const char *const s0[] = {"bfloat16", "float32"}, *const s1[] = {"float32", "bfloat16"};
        static const enum mm3_dtype t0[] = {MM3_DTYPE_BF16, MM3_DTYPE_F32}, t1[] = {MM3_DTYPE_F32, MM3_DTYPE_BF16};
        m->dtype = v;
        rc = get_choice(c, v, p, stage == 0 ? s0 : s1, 2, &choice);
        s->dtype = stage == 0 ? t0[choice] : t1[choice];
        return rc;
    }
    if (!strcmp(key, "max_model_len")) {
        m->max_model_len = v;
        return get_int32(c, v, p, 1, 1 << 24, &s->max_model_len);
    }
    if (!strcmp(key, "max_num_batched_tokens")) {
        m->max_num_batched_tokens = v;
        return get_int32(c, v, p, 1, 1 << 24, &s->max_num_batched_tokens);
    }
    if (!strcmp(key, "enforce_eager")) return get_bool(c, v, p, &s->enforce_eager);
    if (!strcmp(key, "compilation_config")) return decode_compilation(c, v, p, stage);
    if (!strcmp(key, "async_scheduling")) {
        rc = get_bool(c, v, p, &flag);
        if (rc == 0 && flag)
            rc = fail(c, v, p,
                      "expected false: mm3 schedules a step only once the previous step's frames "
                      "are known (a CFG pair is sampled inside one step)");
        s->async_scheduling = false;
        return rc;
    }
    if (!strcmp(key, "enable_prefix_caching")) {
        rc = get_bool(c, v, p, &flag);
        if (rc == 0 && flag)
            rc = fail(c, v, p,
                      "expected false: mm3 has no prefix cache (a shared prefix would also skew the "
                      "cond/uncond pair)");
        s->enable_prefix_caching = false;
        return rc;
    }
    if (!strcmp(key, "devices")) {
        m->devices = v;
        return decode_devices(c, v, p, s);
    }
    if (!strcmp(key, "input_connectors")) return decode_edge(c, v, p, stage, false);
    if (!strcmp(key, "output_connectors")) return decode_edge(c, v, p, stage, true);
    if (!strcmp(key, "default_sampling_params")) return decode_sampling(c, v, p, stage);
    if (!strcmp(key, "matmul_precision") || !strcmp(key, "num_inference_steps") || !strcmp(key, "guidance_scale")) {
        if (stage != 1) return fail(c, kn, p, "only stage 1 (the DiT) has this key");
        if (!strcmp(key, "matmul_precision")) {
            static const char *const names[] = {"fp32", "tf32", "bf16"};
            rc = get_choice(c, v, p, names, 3, &choice);
            s->matmul_precision = (enum mm3_matmul_precision)choice;
            return rc;
        }
        if (!strcmp(key, "num_inference_steps")) return get_int32(c, v, p, 1, 1000, &s->num_inference_steps);
        return get_number(c, v, p, 0, false, 100, false, &s->guidance_scale);
    }
    return unknown_key(c, kn, p,
                       "stage_id, max_num_seqs, gpu_memory_utilization, dtype, max_model_len, "
                       "max_num_batched_tokens, enforce_eager, compilation_config, async_scheduling, "
                       "enable_prefix_caching, devices, input_connectors, output_connectors, "
                       "default_sampling_params, matmul_precision, num_inference_steps, guidance_scale");
}

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
    for (size_t i = 0; i < n->n; i++) {
        path_join(p, path, n->keys[i]->text);
        rc = decode_stage_key(c, n->keys[i], n->items[i], p, stage);
        if (rc < 0) return rc;
    }
    if (!c->marks[stage].capture_sizes) capture_sizes_default(&c->d->stages[stage]);
    return 0;
}

static int decode_stages(struct load_ctx *c, const ynode *n)
{
    char what[96];
    c->stages = n;
    if (n->kind != MM3_YAML_SEQ)
        return fail(c, n, "stages", "expected a list of two stages (stage_id 0 and 1), got %s",
                    mm3_yaml_describe(n, what, sizeof what));
    for (size_t i = 0; i < n->n; i++) {
        int rc = decode_stage(c, n->items[i], (int)i);
        if (rc < 0) return rc;
    }
    for (int s = 0; s < MM3_DEPLOY_NUM_STAGES; s++)
        if (!c->marks[s].entry)
            return fail(c, n, "stages", "stage %d is missing (both stage_id 0 and stage_id 1 are required)", s);
    return 0;
}

/* ---- top level ----------------------------------------------------------- */

static int decode_host(const struct load_ctx *c, const ynode *v, const char *p, char *host, size_t cap)
{
    int rc = get_string(c, v, p, host, cap, false);
    if (rc < 0) return rc;
    unsigned char buf[16];
    if (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1) return 0;
    for (const char *q = host; *q; q++)
        if (!isalnum((unsigned char)*q) && *q != '-' && *q != '.')
            return fail(c, v, p, "expected an IP address or host name, got '%s'", host);
    return 0;
}

static int decode_api(struct load_ctx *c, const ynode *n)
{
    struct mm3_api_config *a = &c->d->api;
    int has = get_map(c, n, "api");
    if (has <= 0) return has;
    for (size_t i = 0; i < n->n; i++) {
        const char *key = n->keys[i]->text;
        const ynode *v = n->items[i];
        char p[KEY_PATH_MAX];
        long long iv;
        int rc;
        path_join(p, "api", key);
        if (!strcmp(key, "host")) {
            rc = decode_host(c, v, p, a->host, sizeof a->host);
        } else if (!strcmp(key, "port")) {
            rc = get_int32(c, v, p, 0, 65535, &a->port);
        } else if (!strcmp(key, "max_queue_depth")) {
            rc = get_int32(c, v, p, 0, 1000000, &a->max_queue_depth);
        } else if (!strcmp(key, "max_body_bytes")) {
            rc = get_int(c, v, p, 1024, 1LL << 30, &iv);
            a->max_body_bytes = iv;
        } else if (!strcmp(key, "max_connections")) {
            rc = get_int32(c, v, p, 1, 65536, &a->max_connections);
        } else if (!strcmp(key, "request_timeout_s")) {
            rc = get_number(c, v, p, 0, true, 7 * 86400, false, &a->request_timeout_s);
        } else if (!strcmp(key, "journal_dir")) {
            rc = get_string(c, v, p, a->journal_dir, sizeof a->journal_dir, true);
        } else if (!strcmp(key, "default_sample_rate")) {
            long long r = 0;
            char what[96];
            rc = mm3_yaml_int(v, &r) == 0 && (r == 44100 || r == 32000)
                     ? 0
                     : fail(c, v, p, "expected 44100 or 32000, got %s", mm3_yaml_describe(v, what, sizeof what));
            a->default_sample_rate = (int)r;
        } else {
            rc = unknown_key(c, n->keys[i], p,
                             "host, port, max_queue_depth, max_body_bytes, max_connections, "
                             "request_timeout_s, journal_dir, default_sample_rate");
        }
        if (rc < 0) return rc;
    }
    return 0;
}

static int decode_top(struct load_ctx *c, const ynode *root)
{
    struct mm3_deploy *d = c->d;
    char what[96];
    if (!root) return fail(c, NULL, "(top level)", "empty deploy file (expected a mapping with stages:)");
    if (root->kind != MM3_YAML_MAP)
        return fail(c, root, "(top level)", "expected a mapping with stages:, got %s",
                    mm3_yaml_describe(root, what, sizeof what));
    for (size_t i = 0; i < root->n; i++) {
        const char *key = root->keys[i]->text;
        const ynode *v = root->items[i];
        int rc, choice = 0;
        if (!strcmp(key, "pipeline")) {
            rc = get_string(c, v, key, d->pipeline, sizeof d->pipeline, false);
            if (rc == 0 && strcmp(d->pipeline, "minimax_music3"))
                rc = fail(c, v, key, "expected minimax_music3 (the only pipeline mm3 serves), got '%s'", d->pipeline);
        } else if (!strcmp(key, "async_chunk")) {
            rc = get_bool(c, v, key, &d->async_chunk);
        } else if (!strcmp(key, "trust_remote_code")) {
            rc = get_bool(c, v, key, &d->trust_remote_code);
        } else if (!strcmp(key, "model")) {
            rc = get_string(c, v, key, d->model, sizeof d->model, true);
        } else if (!strcmp(key, "backend")) {
            static const char *const names[] = {"auto", "cpu", "cuda"};
            c->backend = v;
            rc = get_choice(c, v, key, names, 3, &choice);
            d->backend = (enum mm3_backend)choice;
        } else if (!strcmp(key, "api")) {
            rc = decode_api(c, v);
        } else if (!strcmp(key, "connectors")) {
            c->connectors = v;
            rc = decode_connectors(c, v);
        } else if (!strcmp(key, "stages")) {
            rc = decode_stages(c, v);
        } else {
            rc = unknown_key(c, root->keys[i], key,
                             "pipeline, async_chunk, trust_remote_code, model, backend, "
                             "api, connectors, stages");
        }
        if (rc < 0) return rc;
    }
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
static const ynode *stage_node(const struct load_ctx *c, int stage, const ynode *n)
{
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
    const ynode *nodes[2] = {c->marks[0].output_connector, c->marks[1].input_connector};
    const char *keys[2] = {"output_connectors.to_stage_1", "input_connectors.from_stage_0"};
    for (int i = 0; i < 2; i++) {
        if (!names[i][0]) continue;
        char p[KEY_PATH_MAX];
        stage_path(c, i, keys[i], p);
        struct mm3_connector_config *k = (struct mm3_connector_config *)mm3_deploy_connector(d, names[i]);
        if (!k) {
            char list[256] = "";
            for (int j = 0; j < d->n_connectors; j++) {
                size_t len = strlen(list);
                snprintf(list + len, sizeof list - len, "%s%s", j ? ", " : "", d->connectors[j].name);
            }
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
        return fail(c, stage_node(c, 0, c->marks[0].max_num_seqs), p,
                    "expected an even number while CFG is on (cfg_scale %g: every song decodes as a cond/uncond "
                    "row pair), got %d",
                    s0->cfg_scale, s0->max_num_seqs);
    }
    if (!s0->cfg_enabled) {
        stage_path(c, 0, "default_sampling_params.extra_args.cfg_scale", p);
        warn(c, stage_node(c, 0, c->marks[0].cfg_scale), p,
             "cfg_scale 1 turns classifier-free guidance off; the model is trained to be sampled with it");
    }

    for (int i = 0; i < MM3_DEPLOY_NUM_STAGES; i++) {
        const struct mm3_stage_config *s = &d->stages[i];
        const struct mm3_compilation_config *cc = &s->compilation;
        if (s->max_num_batched_tokens < s->max_num_seqs && i == 0) {
            stage_path(c, i, "max_num_batched_tokens", p);
            return fail(c, stage_node(c, i, c->marks[i].max_num_batched_tokens), p,
                        "expected at least max_num_seqs (%d): a decode step of every row needs one token per row, "
                        "got %d",
                        s->max_num_seqs, s->max_num_batched_tokens);
        }
        if (!s->enforce_eager && cc->cudagraph_mode != MM3_CUDAGRAPH_NONE && d->backend != MM3_BACKEND_CPU &&
            cc->n_capture_sizes && cc->capture_sizes[cc->n_capture_sizes - 1] < s->max_num_seqs) {
            stage_path(c, i, "compilation_config.cudagraph_capture_sizes", p);
            warn(c, stage_node(c, i, c->marks[i].capture_sizes), p,
                 "largest capture size %d is below max_num_seqs %d: steps with more rows run eager",
                 cc->capture_sizes[cc->n_capture_sizes - 1], s->max_num_seqs);
        }
        if (d->backend != MM3_BACKEND_AUTO) {
            const char *why = dtype_backend_problem(s, d->backend);
            if (why) {
                stage_path(c, i, "dtype", p);
                return fail(c, stage_node(c, i, c->marks[i].dtype), p, "%s (backend: %s)", why,
                            mm3_backend_name(d->backend));
            }
        }
        if (s->n_devices > 1) {
            stage_path(c, i, "devices", p);
            warn(c, c->marks[i].devices, p,
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
        warn(c, stage_node(c, 0, c->marks[0].max_model_len), p,
             "%d positions cannot hold a %d-token prompt plus %lld steps (prompt cap + frame budget = %lld); %s",
             s0->max_model_len, MM3_DEPLOY_PROMPT_TOKENS_MAX, (long long)s0->max_tokens, need, tail);
    }
    int rows_per_song = s0->cfg_enabled ? 2 : 1;
    if (s0->max_num_batched_tokens < rows_per_song * MM3_DEPLOY_PROMPT_TOKENS_MAX) {
        stage_path(c, 0, "max_num_batched_tokens", p);
        warn(c, stage_node(c, 0, c->marks[0].max_num_batched_tokens), p,
             "%d tokens per step cannot prefill a maximal prompt%s (%d tokens) in one step; long prompts "
             "prefill over several steps",
             s0->max_num_batched_tokens, s0->cfg_enabled ? " pair" : "", rows_per_song * MM3_DEPLOY_PROMPT_TOKENS_MAX);
    }
    /* An unwritten window cap follows a smaller window capacity. */
    if (!c->marks[1].max_tokens && s1->max_tokens > s1->max_model_len) s1->max_tokens = s1->max_model_len;
    if (s1->max_tokens > s1->max_model_len) {
        stage_path(c, 1, "default_sampling_params.max_tokens", p);
        return fail(c, stage_node(c, 1, c->marks[1].max_tokens), p,
                    "expected at most max_model_len (%d windows per song), got %lld", s1->max_model_len,
                    (long long)s1->max_tokens);
    }
    if (c->marks[1].seed && s1->seed != s0->seed) {
        stage_path(c, 1, "default_sampling_params.seed", p);
        return fail(c, c->marks[1].seed, p,
                    "expected %llu (stage 0's default seed): the seed travels with each "
                    "request, so stage 1 cannot have its own",
                    (unsigned long long)s0->seed);
    }
    s1->seed = s0->seed;

    /* Stages sharing a device share its memory. */
    if (d->backend != MM3_BACKEND_CPU && s0->devices[0] == s1->devices[0] &&
        s0->gpu_memory_utilization + s1->gpu_memory_utilization > 1.0 + 1e-9) {
        stage_path(c, 1, "gpu_memory_utilization", p);
        return fail(c, stage_node(c, 1, c->marks[1].gpu_memory_utilization), p,
                    "stages 0 and 1 share device %d and ask for %g + %g > 1 of its memory", s0->devices[0],
                    s0->gpu_memory_utilization, s1->gpu_memory_utilization);
    }
    return check_connectors(c);
}

/* ---- public -------------------------------------------------------------- */

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
    if (err) {
        free(buf);
        return mm3_errorf(-EIO, "%s: read error", path);
    }
    if (len > MM3_DEPLOY_FILE_BYTES_MAX) {
        free(buf);
        return mm3_errorf(-EFBIG, "%s: deploy file larger than %d bytes", path, MM3_DEPLOY_FILE_BYTES_MAX);
    }
    buf[len] = 0;
    if (memchr(buf, 0, len)) {
        free(buf);
        return mm3_errorf(-EINVAL, "%s: deploy file contains a NUL byte (expected YAML text)", path);
    }
    int rc = mm3_deploy_load_string(d, buf, path);
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

const char *mm3_backend_name(enum mm3_backend b)
{
    switch (b) {
    case MM3_BACKEND_AUTO:
        return "auto";
    case MM3_BACKEND_CPU:
        return "cpu";
    case MM3_BACKEND_CUDA:
        return "cuda";
    }
    return "?";
}

const char *mm3_matmul_precision_name(enum mm3_matmul_precision p)
{
    switch (p) {
    case MM3_MATMUL_FP32:
        return "fp32";
    case MM3_MATMUL_TF32:
        return "tf32";
    case MM3_MATMUL_BF16:
        return "bf16";
    }
    return "?";
}

const char *mm3_cudagraph_mode_name(enum mm3_cudagraph_mode m)
{
    switch (m) {
    case MM3_CUDAGRAPH_NONE:
        return "NONE";
    case MM3_CUDAGRAPH_FULL_DECODE_ONLY:
        return "FULL_DECODE_ONLY";
    }
    return "?";
}
