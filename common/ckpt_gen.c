#include "common/ckpt_gen.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/log.h"

#define GEN_MAX_DIMS 4
#define GEN_CHUNK (1u << 22) /* elements generated per write */

enum gen_init { INIT_NORMAL, INIT_CONST, INIT_UNIFORM, INIT_WNORM_G };

struct gen_tensor {
    char name[96];
    enum mm3_dtype dtype;
    int ndim;
    int64_t shape[GEN_MAX_DIMS];
    enum gen_init init;
    float a, b;   /* NORMAL: std; CONST: value; UNIFORM: [a, b) */
    int v_index;  /* WNORM_G: the weight_v tensor of the same conv */
    uint64_t key; /* stream of this tensor's random numbers */
    int shard;
};

struct gen_component {
    const char *name;
    const char *stem; /* "model" or "diffusion_pytorch_model" */
    enum mm3_dtype dtype;
    uint64_t shard_bytes; /* 0: largest tensor; UINT64_MAX: one file */
    struct gen_tensor *t;
    int n, cap;
    int oom;
};

int ckpt_gen_preset(const char *name, struct ckpt_gen_geometry *g)
{
    memset(g, 0, sizeof *g);
    if (!strcmp(name, "tiny")) {
        *g = (struct ckpt_gen_geometry){
            .lm_hidden = 16,
            .lm_layers = 3,
            .lm_heads = 2,
            .lm_kv_heads = 1,
            .lm_head_dim = 16,
            .lm_intermediate = 48,
            .lm_vocab = 168064,
            .lm_max_positions = 10240,
            .lm_rope_theta = 1000000.0,
            .lm_shard_bytes = 0,
            .dd_layers = 2,
            .dd_heads = 2,
            .dd_intermediate = 40,
            .dd_audio_vocab = 1024,
            .dd_codebooks = 8,
            .dd_max_positions = 16,
            .ce_out = 48,
            .dit_in = 128,
            .dit_layers = 2,
            .dit_heads = 2,
            .dit_head_dim = 32,
            .dit_ff_inner = 128,
            .dit_rotary = 16,
            .dit_fourier = 16,
            .dit_shard_bytes = UINT64_MAX,
            .voc_input_dim = 48,
            .voc_hidden = 32,
            .n_ratios = 4,
            .ratios = {8, 8, 4, 2},
        };
        return 0;
    }
    if (!strcmp(name, "full")) {
        *g = (struct ckpt_gen_geometry){
            .lm_hidden = 4096,
            .lm_layers = 36,
            .lm_heads = 32,
            .lm_kv_heads = 8,
            .lm_head_dim = 128,
            .lm_intermediate = 12288,
            .lm_vocab = 200000,
            .lm_max_positions = 10240,
            .lm_rope_theta = 1000000.0,
            .lm_shard_bytes = 5000000000ull,
            .dd_layers = 4,
            .dd_heads = 16,
            .dd_intermediate = 6144,
            .dd_audio_vocab = 1024,
            .dd_codebooks = 8,
            .dd_max_positions = 16,
            .ce_out = 2048,
            .dit_in = 128,
            .dit_layers = 36,
            .dit_heads = 32,
            .dit_head_dim = 64,
            .dit_ff_inner = 8192,
            .dit_rotary = 32,
            .dit_fourier = 256,
            .dit_shard_bytes = 5000000000ull,
            .voc_input_dim = 1024,
            .voc_hidden = 1536,
            .n_ratios = 4,
            .ratios = {8, 8, 4, 2},
        };
        return 0;
    }
    return mm3_errorf(-EINVAL, "checkpoint preset '%s': expected 'tiny' or 'full'", name);
}

#define GEOM_INT(f)                                                                                                    \
    {                                                                                                                  \
#f, offsetof(struct ckpt_gen_geometry, f)                                                                      \
    }
static const struct {
    const char *name;
    size_t off;
} geom_ints[] = {
    GEOM_INT(lm_hidden),    GEOM_INT(lm_layers),        GEOM_INT(lm_heads),        GEOM_INT(lm_kv_heads),
    GEOM_INT(lm_head_dim),  GEOM_INT(lm_intermediate),  GEOM_INT(lm_vocab),        GEOM_INT(lm_max_positions),
    GEOM_INT(dd_layers),    GEOM_INT(dd_heads),         GEOM_INT(dd_intermediate), GEOM_INT(dd_audio_vocab),
    GEOM_INT(dd_codebooks), GEOM_INT(dd_max_positions), GEOM_INT(ce_out),          GEOM_INT(dit_in),
    GEOM_INT(dit_layers),   GEOM_INT(dit_heads),        GEOM_INT(dit_head_dim),    GEOM_INT(dit_ff_inner),
    GEOM_INT(dit_rotary),   GEOM_INT(dit_fourier),      GEOM_INT(voc_input_dim),   GEOM_INT(voc_hidden),
};

int ckpt_gen_geometry_set(struct ckpt_gen_geometry *g, const char *key, const char *value)
{
    char *end;
    if (!strcmp(key, "ratios")) {
        int n = 0;
        const char *p = value;
        while (*p && n < CKPT_GEN_MAX_RATIOS) {
            long v = strtol(p, &end, 10);
            if (end == p || v <= 0 || v > 64 || (*end && *end != ','))
                return mm3_errorf(-EINVAL,
                                  "geometry 'ratios': expected positive integers separated by commas, got '%s'", value);
            g->ratios[n++] = (int)v;
            p = *end ? end + 1 : end;
        }
        if (*p || n == 0) return mm3_errorf(-EINVAL, "geometry 'ratios': 1 to %d values expected", CKPT_GEN_MAX_RATIOS);
        g->n_ratios = n;
        return 0;
    }
    if (!strcmp(key, "lm_rope_theta")) {
        double v = strtod(value, &end);
        if (end == value || *end || !(v > 0))
            return mm3_errorf(-EINVAL, "geometry 'lm_rope_theta': expected a positive number");
        g->lm_rope_theta = v;
        return 0;
    }
    if (!strcmp(key, "lm_shard_bytes") || !strcmp(key, "dit_shard_bytes")) {
        unsigned long long v = strtoull(value, &end, 10);
        if (end == value || *end) return mm3_errorf(-EINVAL, "geometry '%s': expected a byte count", key);
        *(key[0] == 'l' ? &g->lm_shard_bytes : &g->dit_shard_bytes) = v ? v : (key[0] == 'l' ? 0 : UINT64_MAX);
        return 0;
    }
    for (size_t i = 0; i < sizeof geom_ints / sizeof geom_ints[0]; i++)
        if (!strcmp(key, geom_ints[i].name)) {
            long v = strtol(value, &end, 10);
            if (end == value || *end || v <= 0 || v > (1L << 30))
                return mm3_errorf(-EINVAL, "geometry '%s': expected a positive integer, got '%s'", key, value);
            *(int *)((char *)g + geom_ints[i].off) = (int)v;
            return 0;
        }
    char names[1024];
    size_t o = 0;
    for (size_t i = 0; i < sizeof geom_ints / sizeof geom_ints[0] && o < sizeof names; i++)
        o += (size_t)snprintf(names + o, sizeof names - o, "%s ", geom_ints[i].name);
    return mm3_errorf(-EINVAL,
                      "geometry: unknown field '%s' (known: %sratios lm_rope_theta lm_shard_bytes dit_shard_bytes)",
                      key, names);
}

/* ---- random numbers: counter based, so chunks and threads need no shared state ---- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t fnv1a(const char *s, uint64_t h)
{
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* Irwin-Hall sum of four 16-bit uniforms: mean 0, variance 1, |z| < 3.47. Cheap
 * (one hash per element), which is what lets the 27 GB preset run at disk speed. */
static float gen_normal(uint64_t key, uint64_t i)
{
    uint64_t x = splitmix64(key ^ (i * 0xd1b54a32d192ed03ull));
    double s = 0;
    for (int k = 0; k < 4; k++)
        s += ((double)((x >> (16 * k)) & 0xffff) + 0.5) / 65536.0;
    return (float)((s - 2.0) * 1.7320508075688772);
}

static float gen_uniform(uint64_t key, uint64_t i)
{
    uint64_t x = splitmix64(key ^ (i * 0xd1b54a32d192ed03ull));
    return (float)((double)(x >> 40) / 16777216.0);
}

static uint64_t tensor_numel(const struct gen_tensor *t)
{
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->shape[d];
    return n;
}

static float gen_value(const struct gen_component *c, const struct gen_tensor *t, uint64_t i)
{
    switch (t->init) {
    case INIT_NORMAL:
        return t->a * gen_normal(t->key, i);
    case INIT_CONST:
        return t->a;
    case INIT_UNIFORM:
        return t->a + (t->b - t->a) * gen_uniform(t->key, i);
    case INIT_WNORM_G: {
        /* torch weight_norm(dim=0): g[o] = ||v[o, ...]||, making W = v exactly. */
        const struct gen_tensor *v = &c->t[t->v_index];
        uint64_t slice = tensor_numel(v) / (uint64_t)v->shape[0];
        double ss = 0;
        for (uint64_t k = 0; k < slice; k++) {
            double x = gen_value(c, v, i * slice + k);
            ss += x * x;
        }
        return (float)sqrt(ss);
    }
    }
    return 0;
}

/* ---- tensor lists in module (state-dict) order ---- */

static struct gen_tensor *add(struct gen_component *c, const char *name, enum gen_init init, float a, float b, int ndim,
                              const int64_t *shape)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        struct gen_tensor *t = realloc(c->t, (size_t)cap * sizeof *t);
        if (!t) {
            c->oom = 1;
            return NULL;
        }
        c->t = t;
        c->cap = cap;
    }
    struct gen_tensor *t = &c->t[c->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = c->dtype;
    t->init = init;
    t->a = a;
    t->b = b;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        t->shape[d] = shape[d];
    return t;
}

static void add_linear(struct gen_component *c, const char *name, int64_t out, int64_t in)
{
    add(c, name, INIT_NORMAL, (float)(1.0 / sqrt((double)in)), 0, 2, (int64_t[]){out, in});
}

static void add_ones(struct gen_component *c, const char *name, int64_t n)
{
    add(c, name, INIT_CONST, 1.0f, 0, 1, (int64_t[]){n});
}

static void add_bias(struct gen_component *c, const char *name, int64_t n)
{
    add(c, name, INIT_NORMAL, 0.02f, 0, 1, (int64_t[]){n});
}

static void fmt(char *buf, size_t n, const char *f, ...) __attribute__((format(printf, 3, 4)));
static void fmt(char *buf, size_t n, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, n, f, ap);
    va_end(ap);
}

static void build_lm(struct gen_component *c, const struct ckpt_gen_geometry *g)
{
    int64_t h = g->lm_hidden, q = (int64_t)g->lm_heads * g->lm_head_dim, kv = (int64_t)g->lm_kv_heads * g->lm_head_dim;
    char n[96];
    add(c, "model.embed_tokens.weight", INIT_NORMAL, 1.0f, 0, 2, (int64_t[]){g->lm_vocab, h});
    for (int l = 0; l < g->lm_layers; l++) {
#define P(s) (fmt(n, sizeof n, "model.layers.%d.%s", l, s), n)
        add_ones(c, P("input_layernorm.weight"), h);
        add_linear(c, P("self_attn.q_proj.weight"), q, h);
        add_linear(c, P("self_attn.k_proj.weight"), kv, h);
        add_linear(c, P("self_attn.v_proj.weight"), kv, h);
        add_linear(c, P("self_attn.o_proj.weight"), h, q);
        add_ones(c, P("self_attn.q_norm.weight"), g->lm_head_dim);
        add_ones(c, P("self_attn.k_norm.weight"), g->lm_head_dim);
        add_ones(c, P("post_attention_layernorm.weight"), h);
        add_linear(c, P("mlp.gate_proj.weight"), g->lm_intermediate, h);
        add_linear(c, P("mlp.up_proj.weight"), g->lm_intermediate, h);
        add_linear(c, P("mlp.down_proj.weight"), h, g->lm_intermediate);
#undef P
    }
    add_ones(c, "model.norm.weight", h);
    add_linear(c, "lm_head.weight", g->lm_vocab, h);
}

static void build_depth(struct gen_component *c, const struct ckpt_gen_geometry *g)
{
    int64_t h = g->lm_hidden, v = g->dd_audio_vocab, ncb = g->dd_codebooks - 1;
    char n[96];
    add(c, "audio_embeddings.weight", INIT_NORMAL, 1.0f, 0, 2, (int64_t[]){ncb * v, h});
    add_linear(c, "projection.weight", h, h);
    add(c, "pos_embedding.weight", INIT_NORMAL, 0.5f, 0, 2, (int64_t[]){g->dd_max_positions, h});
    for (int l = 0; l < g->dd_layers; l++) {
#define P(s) (fmt(n, sizeof n, "layers.%d.%s", l, s), n)
        add_ones(c, P("input_layernorm.weight"), h);
        add_linear(c, P("attn.to_q.weight"), h, h);
        add_linear(c, P("attn.to_k.weight"), h, h);
        add_linear(c, P("attn.to_v.weight"), h, h);
        add_linear(c, P("attn.to_out.weight"), h, h);
        add_ones(c, P("post_attention_layernorm.weight"), h);
        add_linear(c, P("gate_proj.weight"), g->dd_intermediate, h);
        add_linear(c, P("up_proj.weight"), g->dd_intermediate, h);
        add_linear(c, P("down_proj.weight"), h, g->dd_intermediate);
#undef P
    }
    add_ones(c, "norm.weight", h);
    for (int k = 0; k < ncb; k++) {
        fmt(n, sizeof n, "audio_heads.%d.weight", k);
        add_linear(c, n, v, h);
    }
}

static void build_condition(struct gen_component *c, const struct ckpt_gen_geometry *g)
{
    add(c, "layer_weight_logits", INIT_NORMAL, 1.0f, 0, 1, (int64_t[]){g->dd_codebooks});
    add(c, "layer_scale", INIT_CONST, 1.0f, 0, 1, (int64_t[]){1});
    add(c, "proj.weight", INIT_NORMAL, (float)(1.0 / sqrt(3.0 * g->lm_hidden)), 0, 3,
        (int64_t[]){g->ce_out, g->lm_hidden, 3});
    add_bias(c, "proj.bias", g->ce_out);
}

static void build_dit(struct gen_component *c, const struct ckpt_gen_geometry *g)
{
    int64_t d = (int64_t)g->dit_heads * g->dit_head_dim, cat = 2 * (int64_t)g->dit_in + g->ce_out;
    char n[96];
    add(c, "time_proj.weight", INIT_NORMAL, 1.0f, 0, 2, (int64_t[]){g->dit_fourier / 2, 1});
    add_linear(c, "time_embed.linear_1.weight", d, g->dit_fourier);
    add_bias(c, "time_embed.linear_1.bias", d);
    add_linear(c, "time_embed.linear_2.weight", d, d);
    add_bias(c, "time_embed.linear_2.bias", d);
    add(c, "preprocess_conv.weight", INIT_NORMAL, (float)(1.0 / sqrt((double)cat)), 0, 3, (int64_t[]){cat, cat, 1});
    add_linear(c, "proj_in.weight", d, cat);
    for (int b = 0; b < g->dit_layers; b++) {
#define P(s) (fmt(n, sizeof n, "transformer_blocks.%d.%s", b, s), n)
        add_ones(c, P("norm1.weight"), d);
        add(c, P("norm1.bias"), INIT_CONST, 0.0f, 0, 1, (int64_t[]){d});
        add_linear(c, P("attn.to_q.weight"), d, d);
        add_linear(c, P("attn.to_k.weight"), d, d);
        add_linear(c, P("attn.to_v.weight"), d, d);
        add_linear(c, P("attn.to_out.0.weight"), d, d);
        add_ones(c, P("norm2.weight"), d);
        add(c, P("norm2.bias"), INIT_CONST, 0.0f, 0, 1, (int64_t[]){d});
        add_linear(c, P("ff_in.weight"), 2 * (int64_t)g->dit_ff_inner, d);
        add_bias(c, P("ff_in.bias"), 2 * (int64_t)g->dit_ff_inner);
        add_linear(c, P("ff_out.weight"), d, g->dit_ff_inner);
        add_bias(c, P("ff_out.bias"), d);
#undef P
    }
    add_linear(c, "proj_out.weight", g->dit_in, d);
    add(c, "postprocess_conv.weight", INIT_NORMAL, (float)(1.0 / sqrt((double)g->dit_in)), 0, 3,
        (int64_t[]){g->dit_in, g->dit_in, 1});
}

/* A weight-normed conv: bias, weight_g (= ||v|| over dim 0 slices), weight_v.
 * fan_in is what one output sums over (ConvTranspose: in * k / stride). */
static void add_wn_conv(struct gen_component *c, const char *prefix, int64_t d0, int64_t d1, int64_t k, int64_t bias_n,
                        double fan_in)
{
    char n[96];
    fmt(n, sizeof n, "%s.bias", prefix);
    add_bias(c, n, bias_n);
    fmt(n, sizeof n, "%s.weight_v", prefix);
    add(c, n, INIT_NORMAL, (float)(1.0 / sqrt(fan_in)), 0, 3, (int64_t[]){d0, d1, k});
    int v = c->n - 1;
    fmt(n, sizeof n, "%s.weight_g", prefix);
    struct gen_tensor *t = add(c, n, INIT_WNORM_G, 0, 0, 3, (int64_t[]){d0, 1, 1});
    if (t) t->v_index = v;
}

static void add_alpha(struct gen_component *c, const char *name, int64_t ch)
{
    add(c, name, INIT_UNIFORM, 0.5f, 1.5f, 3, (int64_t[]){1, ch, 1});
}

static void build_vocoder(struct gen_component *c, const struct ckpt_gen_geometry *g)
{
    char n[96], p[96];
    int64_t in = g->voc_input_dim, hid = g->voc_hidden, half = g->dit_in / 2;
    add(c, "dec_in_proj.weight", INIT_NORMAL, (float)(1.0 / sqrt((double)half)), 0, 3, (int64_t[]){in, half, 1});
    add_bias(c, "dec_in_proj.bias", in);
    add_wn_conv(c, "conv_in", hid, in, 7, hid, 7.0 * (double)in);
    int64_t ch = hid;
    for (int b = 0; b < g->n_ratios; b++) {
        int64_t cout = ch / 2, s = g->ratios[b];
        fmt(n, sizeof n, "blocks.%d.snake1.alpha", b);
        add_alpha(c, n, ch);
        fmt(p, sizeof p, "blocks.%d.conv_t1", b);
        add_wn_conv(c, p, ch, cout, 2 * s, cout, 2.0 * (double)ch);
        for (int r = 1; r <= 3; r++) {
            fmt(n, sizeof n, "blocks.%d.res_unit%d.snake1.alpha", b, r);
            add_alpha(c, n, cout);
            fmt(p, sizeof p, "blocks.%d.res_unit%d.conv1", b, r);
            add_wn_conv(c, p, cout, cout, 7, cout, 7.0 * (double)cout);
            fmt(n, sizeof n, "blocks.%d.res_unit%d.snake2.alpha", b, r);
            add_alpha(c, n, cout);
            fmt(p, sizeof p, "blocks.%d.res_unit%d.conv2", b, r);
            /* residual branch at 0.1 gain: twelve Snake units stacked at full gain drive
             * the final tanh into saturation (nearly every sample at |x| > 0.99) */
            add_wn_conv(c, p, cout, cout, 1, cout, (double)cout / (0.1 * 0.1));
        }
        ch = cout;
    }
    add_alpha(c, "snake_out.alpha", ch);
    /* 0.2 gain: N(0, 1) latents then give audio of RMS ~0.27, nothing clipped */
    add_wn_conv(c, "conv_out", 1, ch, 7, 1, 7.0 * (double)ch / (0.2 * 0.2));
}

/* ---- writing ---- */

struct fill_job {
    const struct gen_component *c;
    const struct gen_tensor *t;
    float *buf;
    uint64_t first, count;
};

static void *fill_thread(void *arg)
{
    struct fill_job *j = arg;
    for (uint64_t i = 0; i < j->count; i++)
        j->buf[i] = gen_value(j->c, j->t, j->first + i);
    return NULL;
}

static void fill_parallel(const struct gen_component *c, const struct gen_tensor *t, float *buf, uint64_t first,
                          uint64_t count, int threads)
{
    /* WNORM_G elements each cost a whole slice of v: split those too. */
    if (threads <= 1 || (count < 65536 && t->init != INIT_WNORM_G)) {
        struct fill_job j = {c, t, buf, first, count};
        fill_thread(&j);
        return;
    }
    pthread_t tid[32];
    int joined[32];
    struct fill_job jobs[32];
    int started = 0;
    uint64_t per = (count + (uint64_t)threads - 1) / (uint64_t)threads;
    for (int k = 0; k < threads; k++) {
        uint64_t a = (uint64_t)k * per;
        if (a >= count) break;
        uint64_t n = count - a < per ? count - a : per;
        jobs[k] = (struct fill_job){c, t, buf + a, first + a, n};
        joined[k] = pthread_create(&tid[k], NULL, fill_thread, &jobs[k]) == 0;
        if (!joined[k]) fill_thread(&jobs[k]);
        started = k + 1;
    }
    for (int k = 0; k < started; k++)
        if (joined[k]) pthread_join(tid[k], NULL);
}

static int write_all(int fd, const void *buf, size_t n, const char *path)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return mm3_errorf(-errno, "%s: write failed: %s", path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int cmp_name_ptr(const void *a, const void *b)
{
    const struct gen_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* One safetensors file: the tensors of shard `shard`, sorted by name as the
 * reference writer lays them out. */
static int write_shard(const struct gen_component *c, int shard, const char *path, const struct ckpt_gen_opts *o,
                       float *fbuf, void *obuf)
{
    int n = 0;
    for (int i = 0; i < c->n; i++)
        n += c->t[i].shard == shard;
    const struct gen_tensor **ts = calloc((size_t)(n ? n : 1), sizeof *ts);
    if (!ts) return mm3_errorf(-ENOMEM, "%s: out of memory", path);
    n = 0;
    for (int i = 0; i < c->n; i++)
        if (c->t[i].shard == shard) ts[n++] = &c->t[i];
    qsort(ts, (size_t)n, sizeof *ts, cmp_name_ptr);

    json_t *hdr = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(hdr, "__metadata__", meta);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < ts[i]->ndim; d++)
            json_array_append_new(shape, json_integer(ts[i]->shape[d]));
        uint64_t nb = tensor_numel(ts[i]) * mm3_dtype_size(ts[i]->dtype);
        json_array_append_new(offs, json_integer((json_int_t)off));
        json_array_append_new(offs, json_integer((json_int_t)(off + nb)));
        json_object_set_new(e, "dtype", json_string(mm3_dtype_name(ts[i]->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", offs);
        json_object_set_new(hdr, ts[i]->name, e);
        off += nb;
    }
    char *text = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(hdr);
    if (!text) {
        free(ts);
        return mm3_errorf(-ENOMEM, "%s: cannot serialise header", path);
    }
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(text);
        free(ts);
        return mm3_errorf(-e, "%s: cannot create: %s", path, strerror(e));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int rc = write_all(fd, len8, 8, path);
    if (rc == 0) rc = write_all(fd, text, hlen, path);
    if (rc == 0) rc = write_all(fd, "        ", padded - hlen, path);
    free(text);
    if (rc == 0 && o->sparse) {
        if (ftruncate(fd, (off_t)(8 + padded + off)) < 0)
            rc = mm3_errorf(-errno, "%s: ftruncate: %s", path, strerror(errno));
    }
    for (int i = 0; rc == 0 && !o->sparse && i < n; i++) {
        const struct gen_tensor *t = ts[i];
        uint64_t numel = tensor_numel(t);
        for (uint64_t a = 0; rc == 0 && a < numel; a += GEN_CHUNK) {
            uint64_t cnt = numel - a < GEN_CHUNK ? numel - a : GEN_CHUNK;
            fill_parallel(c, t, fbuf, a, cnt, o->threads);
            const void *out = fbuf;
            if (t->dtype == MM3_DTYPE_BF16) {
                uint16_t *h = obuf;
                for (uint64_t k = 0; k < cnt; k++)
                    h[k] = mm3_f32_to_bf16(fbuf[k]);
                out = h;
            }
            rc = write_all(fd, out, (size_t)(cnt * mm3_dtype_size(t->dtype)), path);
        }
    }
    if (close(fd) < 0 && rc == 0) rc = mm3_errorf(-errno, "%s: close: %s", path, strerror(errno));
    free(ts);
    return rc;
}

static int mkdir_p(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            return mm3_errorf(-errno, "%s: cannot create: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return mm3_errorf(-errno, "%s: cannot create: %s", buf, strerror(errno));
    return 0;
}

static int write_text(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return mm3_errorf(-errno, "%s: cannot create: %s", path, strerror(errno));
    int ok = fputs(text, f) >= 0;
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : mm3_errorf(-EIO, "%s: write failed", path);
}

static int write_json(const char *dir, const char *name, json_t *j)
{
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(j);
    if (!text) return mm3_errorf(-ENOMEM, "%s/%s: cannot serialise", dir, name);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return mm3_errorf(-ENOMEM, "%s/%s: out of memory", dir, name);
    }
    t2[n] = '\n';
    t2[n + 1] = 0;
    int rc = write_text(dir, name, t2);
    free(t2);
    return rc;
}

/* Assign shards greedily in module order, as save_pretrained(max_shard_size) does. */
static int assign_shards(struct gen_component *c)
{
    uint64_t limit = c->shard_bytes;
    if (limit == 0)
        for (int i = 0; i < c->n; i++) {
            uint64_t nb = tensor_numel(&c->t[i]) * mm3_dtype_size(c->t[i].dtype);
            if (nb > limit) limit = nb;
        }
    int shard = 0;
    uint64_t cur = 0;
    for (int i = 0; i < c->n; i++) {
        uint64_t nb = tensor_numel(&c->t[i]) * mm3_dtype_size(c->t[i].dtype);
        if (cur > 0 && limit != UINT64_MAX && cur + nb > limit) {
            shard++;
            cur = 0;
        }
        c->t[i].shard = shard;
        cur += nb;
    }
    return shard + 1;
}

static int write_component(const char *root, struct gen_component *c, const struct ckpt_gen_opts *o, json_t *config)
{
    char dir[4096], path[8192];
    snprintf(dir, sizeof dir, "%s/%s", root, c->name);
    int rc = mkdir_p(dir);
    if (rc < 0) {
        json_decref(config);
        return rc;
    }
    rc = write_json(dir, "config.json", config);
    if (rc < 0) return rc;
    if (c->oom) return mm3_errorf(-ENOMEM, "%s: out of memory listing tensors", dir);
    for (int i = 0; i < c->n; i++)
        c->t[i].key = splitmix64(fnv1a(c->t[i].name, fnv1a(c->name, 0xcbf29ce484222325ull)) ^ splitmix64(o->seed));
    int n_shards = assign_shards(c);
    float *fbuf = malloc((size_t)GEN_CHUNK * sizeof(float));
    uint16_t *obuf = malloc((size_t)GEN_CHUNK * sizeof(uint16_t));
    if (!fbuf || !obuf) {
        free(fbuf);
        free(obuf);
        return mm3_errorf(-ENOMEM, "%s: out of memory for generation buffers", dir);
    }
    json_t *wmap = json_object();
    uint64_t total = 0, params = 0;
    for (int s = 0; rc == 0 && s < n_shards; s++) {
        char file[256];
        if (n_shards == 1)
            snprintf(file, sizeof file, "%s.safetensors", c->stem);
        else
            snprintf(file, sizeof file, "%s-%05d-of-%05d.safetensors", c->stem, s + 1, n_shards);
        snprintf(path, sizeof path, "%s/%s", dir, file);
        LOG_INFO("writing %s%s", path, o->sparse ? " (sparse)" : "");
        rc = write_shard(c, s, path, o, fbuf, obuf);
        for (int i = 0; i < c->n; i++)
            if (c->t[i].shard == s) json_object_set_new(wmap, c->t[i].name, json_string(file));
    }
    for (int i = 0; i < c->n; i++) {
        params += tensor_numel(&c->t[i]);
        total += tensor_numel(&c->t[i]) * mm3_dtype_size(c->t[i].dtype);
    }
    free(fbuf);
    free(obuf);
    if (rc == 0 && n_shards > 1) {
        json_t *idx = json_object(), *meta = json_object();
        if (!strcmp(c->stem, "model")) json_object_set_new(meta, "total_parameters", json_integer((json_int_t)params));
        json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
        json_object_set_new(idx, "metadata", meta);
        json_object_set_new(idx, "weight_map", wmap);
        snprintf(path, sizeof path, "%s.safetensors.index.json", c->stem);
        rc = write_json(dir, path, idx);
    } else {
        json_decref(wmap);
    }
    return rc;
}

static json_t *diffusers_config(const char *cls)
{
    json_t *j = json_object();
    json_object_set_new(j, "_class_name", json_string(cls));
    json_object_set_new(j, "_diffusers_version", json_string("0.40.0.dev0"));
    return j;
}

#define SETI(j, k, v) json_object_set_new(j, k, json_integer(v))

static json_t *lm_config(const struct ckpt_gen_geometry *g, const struct ckpt_gen_opts *o)
{
    json_t *j = json_object(), *types = json_array();
    json_object_set_new(j, "architectures", json_pack("[s]", "Qwen3ForCausalLM"));
    json_object_set_new(j, "attention_bias", json_false());
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    json_object_set_new(j, "bos_token_id", json_null());
    json_object_set_new(j, "dtype", json_string("bfloat16"));
    json_object_set_new(j, "eos_token_id", json_null());
    SETI(j, "head_dim", g->lm_head_dim);
    json_object_set_new(j, "hidden_act", json_string("silu"));
    SETI(j, "hidden_size", g->lm_hidden);
    json_object_set_new(j, "initializer_range", json_real(0.02));
    SETI(j, "intermediate_size", g->lm_intermediate);
    for (int l = 0; l < g->lm_layers; l++)
        json_array_append_new(types, json_string("full_attention"));
    json_object_set_new(j, "layer_types", types);
    SETI(j, "max_position_embeddings", g->lm_max_positions);
    SETI(j, "max_window_layers", 28);
    json_object_set_new(j, "model_type", json_string("qwen3"));
    SETI(j, "num_attention_heads", g->lm_heads);
    SETI(j, "num_hidden_layers", g->lm_layers);
    SETI(j, "num_key_value_heads", g->lm_kv_heads);
    json_object_set_new(j, "pad_token_id", json_null());
    json_object_set_new(j, "rms_norm_eps", json_real(1e-6));
    if (o->rope_top_level) {
        json_object_set_new(j, "rope_theta", json_real(g->lm_rope_theta));
        json_object_set_new(j, "rope_scaling", json_null());
    } else {
        json_object_set_new(j, "rope_parameters",
                            json_pack("{s:f,s:s}", "rope_theta", g->lm_rope_theta, "rope_type", "default"));
    }
    json_object_set_new(j, "sliding_window", json_null());
    json_object_set_new(j, "tie_word_embeddings", json_false());
    json_object_set_new(j, "transformers_version", json_string("5.17.0"));
    json_object_set_new(j, "use_cache", json_true());
    json_object_set_new(j, "use_sliding_window", json_false());
    SETI(j, "vocab_size", g->lm_vocab);
    return j;
}

static const char *const component_classes[][3] = {
    {"condition_encoder", "diffusers", "MiniMaxMusic3ConditionEncoder"},
    {"language_model", "transformers", "Qwen3ForCausalLM"},
    {"rvq_depth_decoder", "diffusers", "MiniMaxMusic3RVQDepthDecoder"},
    {"scheduler", "diffusers", "FlowMatchEulerDiscreteScheduler"},
    {"tokenizer", "transformers", "TokenizersBackend"},
    {"transformer", "diffusers", "MiniMaxMusic3Transformer1DModel"},
    {"vocoder", "diffusers", "MiniMaxMusic3Vocoder"},
};

static json_t *model_index(void)
{
    json_t *j = json_object();
    json_object_set_new(j, "_blocks_class_name", json_string("MiniMaxMusic3Blocks"));
    json_object_set_new(j, "_class_name", json_string("MiniMaxMusic3ModularPipeline"));
    json_object_set_new(j, "_diffusers_version", json_string("0.40.0.dev0"));
    for (size_t i = 0; i < sizeof component_classes / sizeof component_classes[0]; i++) {
        const char *const *e = component_classes[i];
        json_t *spec =
            json_pack("{s:s,s:n,s:s,s:[s,s],s:n}", "pretrained_model_name_or_path", "MiniMaxAI/MiniMax-Music3",
                      "revision", "subfolder", e[0], "type_hint", e[1], e[2], "variant");
        json_object_set_new(j, e[0], json_pack("[s,s,o]", e[1], e[2], spec));
    }
    return j;
}

static const char scheduler_config[] =
    "{\n  \"_class_name\": \"FlowMatchEulerDiscreteScheduler\",\n  \"_diffusers_version\": \"0.40.0.dev0\",\n"
    "  \"base_image_seq_len\": 256,\n  \"base_shift\": 0.5,\n  \"invert_sigmas\": true,\n"
    "  \"max_image_seq_len\": 4096,\n  \"max_shift\": 1.15,\n  \"num_train_timesteps\": 1,\n  \"shift\": 1.0,\n"
    "  \"shift_terminal\": null,\n  \"stochastic_sampling\": false,\n  \"time_shift_type\": \"exponential\",\n"
    "  \"use_beta_sigmas\": false,\n  \"use_dynamic_shifting\": false,\n  \"use_exponential_sigmas\": false,\n"
    "  \"use_karras_sigmas\": false\n}\n";

static const char generation_config[] =
    "{\n  \"_from_model_config\": true,\n  \"output_attentions\": false,\n  \"output_hidden_states\": false,\n"
    "  \"transformers_version\": \"5.17.0\",\n  \"use_cache\": true\n}\n";

/* model_max_length does not fit an int64, hence literal text rather than jansson. */
static const char tokenizer_config[] =
    "{\n  \"backend\": \"tokenizers\",\n  \"model_max_length\": 1000000000000000019884624838656,\n"
    "  \"tokenizer_class\": \"TokenizersBackend\"\n}\n";

static int check_geometry(const struct ckpt_gen_geometry *g)
{
    if (g->lm_hidden <= 0 || g->lm_layers <= 0 || g->lm_heads <= 0 || g->lm_kv_heads <= 0 || g->lm_head_dim <= 0 ||
        g->lm_intermediate <= 0 || g->dd_layers <= 0 || g->dd_heads <= 0 || g->dd_codebooks < 2 ||
        g->dd_audio_vocab <= 0 || g->ce_out <= 0 || g->dit_in <= 0 || g->dit_in % 2 || g->dit_fourier % 2 ||
        g->dit_layers <= 0 || g->dit_heads <= 0 || g->dit_head_dim <= 0 || g->voc_hidden >> g->n_ratios <= 0 ||
        g->n_ratios <= 0 || g->n_ratios > CKPT_GEN_MAX_RATIOS)
        return mm3_errorf(-EINVAL, "checkpoint geometry: a size is zero, odd where it must be even, or out of range");
    if (g->lm_hidden % g->dd_heads || g->dit_rotary > g->dit_head_dim || g->dit_rotary % 2 ||
        g->voc_hidden % (1 << g->n_ratios))
        return mm3_errorf(-EINVAL, "checkpoint geometry: dd_heads must divide lm_hidden, dit_rotary be even and <= "
                                   "dit_head_dim, voc_hidden be divisible by 2^(number of ratios)");
    if (g->lm_vocab < 151675 + 16384)
        return mm3_errorf(-EINVAL, "checkpoint geometry: vocab_size %d < 151675 + 16384 (special tokens + c0 codes)",
                          g->lm_vocab);
    return 0;
}

int ckpt_gen_write(const char *dir, const struct ckpt_gen_geometry *g, const struct ckpt_gen_opts *opts)
{
    int rc = check_geometry(g);
    if (rc < 0) return rc;
    struct ckpt_gen_opts o = *opts;
    if (o.threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o.threads = n > 0 ? (int)n : 1;
    }
    if (o.threads > 32) o.threads = 32;
    if ((rc = mkdir_p(dir)) < 0) return rc;
    if ((rc = write_json(dir, "modular_model_index.json", model_index())) < 0) return rc;

    struct gen_component lm = {
        .name = "language_model", .stem = "model", .dtype = MM3_DTYPE_BF16, .shard_bytes = g->lm_shard_bytes};
    struct gen_component dd = {.name = "rvq_depth_decoder",
                               .stem = "diffusion_pytorch_model",
                               .dtype = MM3_DTYPE_BF16,
                               .shard_bytes = UINT64_MAX};
    struct gen_component ce = {.name = "condition_encoder",
                               .stem = "diffusion_pytorch_model",
                               .dtype = MM3_DTYPE_F32,
                               .shard_bytes = UINT64_MAX};
    struct gen_component dit = {.name = "transformer",
                                .stem = "diffusion_pytorch_model",
                                .dtype = MM3_DTYPE_F32,
                                .shard_bytes = g->dit_shard_bytes};
    struct gen_component voc = {
        .name = "vocoder", .stem = "diffusion_pytorch_model", .dtype = MM3_DTYPE_F32, .shard_bytes = UINT64_MAX};
    build_lm(&lm, g);
    build_depth(&dd, g);
    build_condition(&ce, g);
    build_dit(&dit, g);
    build_vocoder(&voc, g);

    json_t *cfg;
    rc = write_component(dir, &lm, &o, lm_config(g, &o));
    if (rc == 0) {
        char d[4096];
        snprintf(d, sizeof d, "%s/language_model", dir);
        rc = write_text(d, "generation_config.json", generation_config);
    }
    if (rc == 0) {
        cfg = diffusers_config("MiniMaxMusic3RVQDepthDecoder");
        SETI(cfg, "audio_vocab_size", g->dd_audio_vocab);
        SETI(cfg, "hidden_size", g->lm_hidden);
        SETI(cfg, "intermediate_size", g->dd_intermediate);
        SETI(cfg, "max_position_embeddings", g->dd_max_positions);
        SETI(cfg, "num_attention_heads", g->dd_heads);
        SETI(cfg, "num_codebooks", g->dd_codebooks);
        SETI(cfg, "num_layers", g->dd_layers);
        rc = write_component(dir, &dd, &o, cfg);
    }
    if (rc == 0) {
        cfg = diffusers_config("MiniMaxMusic3ConditionEncoder");
        SETI(cfg, "condition_hidden_dim", g->lm_hidden);
        SETI(cfg, "input_hop_length", 960);
        SETI(cfg, "input_sampling_rate", 24000);
        SETI(cfg, "num_condition_layers", g->dd_codebooks);
        SETI(cfg, "out_dim", g->ce_out);
        SETI(cfg, "output_hop_length", 512);
        SETI(cfg, "output_sampling_rate", 44100);
        rc = write_component(dir, &ce, &o, cfg);
    }
    if (rc == 0) {
        cfg = diffusers_config("MiniMaxMusic3Transformer1DModel");
        SETI(cfg, "attention_head_dim", g->dit_head_dim);
        SETI(cfg, "condition_dim", g->ce_out);
        SETI(cfg, "ff_inner_dim", g->dit_ff_inner);
        SETI(cfg, "fourier_embedding_dim", g->dit_fourier);
        SETI(cfg, "in_channels", g->dit_in);
        SETI(cfg, "num_attention_heads", g->dit_heads);
        SETI(cfg, "num_layers", g->dit_layers);
        SETI(cfg, "rotary_dim", g->dit_rotary);
        rc = write_component(dir, &dit, &o, cfg);
    }
    if (rc == 0) {
        cfg = diffusers_config("MiniMaxMusic3Vocoder");
        json_t *ratios = json_array();
        for (int i = 0; i < g->n_ratios; i++)
            json_array_append_new(ratios, json_integer(g->ratios[i]));
        SETI(cfg, "decoder_hidden_dim", g->voc_hidden);
        SETI(cfg, "decoder_input_dim", g->voc_input_dim);
        SETI(cfg, "latent_channels", g->dit_in);
        SETI(cfg, "sampling_rate", 44100);
        json_object_set_new(cfg, "upsampling_ratios", ratios);
        rc = write_component(dir, &voc, &o, cfg);
    }
    char sub[4096];
    if (rc == 0) {
        snprintf(sub, sizeof sub, "%s/scheduler", dir);
        rc = mkdir_p(sub);
        if (rc == 0) rc = write_text(sub, "scheduler_config.json", scheduler_config);
    }
    if (rc == 0) {
        snprintf(sub, sizeof sub, "%s/tokenizer", dir);
        rc = mkdir_p(sub);
        if (rc == 0) rc = write_text(sub, "tokenizer_config.json", tokenizer_config);
        char tp[4096 + 32];
        snprintf(tp, sizeof tp, "%s/tokenizer.json", sub);
        if (rc == 0) rc = ckpt_gen_tokenizer_write(tp, 300);
    }
    free(lm.t);
    free(dd.t);
    free(ce.t);
    free(dit.t);
    free(voc.t);
    return rc;
}
