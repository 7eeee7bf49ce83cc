/* Checkpoint loader: every golden component opens and loads with the bytes an
 * independent reader sees, io_uring and pread agree, corrupt inputs are refused
 * with a message naming the problem, both RoPE config styles, the root index. */
/* cmocka.h needs these first */
// clang-format off
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on
#include <jansson.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/file_reader.h"
#include "support/test_support.h"

static const char *const weight_components[] = {"language_model", "rvq_depth_decoder", "condition_encoder",
                                                "transformer", "vocoder"};
#define N_WEIGHT_COMPONENTS 5

static char *golden_root(void)
{
    const char *g = test_golden_dir();
    if (!g) return NULL;
    size_t n = strlen(g) + 16;
    char *p = malloc(n);
    snprintf(p, n, "%s/checkpoint", g);
    return p;
}

#define NEED_GOLDEN(root)                                                                                              \
    char *root = golden_root();                                                                                        \
    if (!root) {                                                                                                       \
        skip();                                                                                                        \
        return;                                                                                                        \
    }

/* ---- an independent safetensors reading: stdio + jansson, nothing shared with the loader ---- */

struct indep_file {
    json_t *hdr;
    uint64_t data_start;
    FILE *fp;
};

static void indep_open(struct indep_file *f, const char *path)
{
    f->fp = fopen(path, "rb");
    assert_non_null(f->fp);
    uint8_t b[8];
    assert_int_equal(fread(b, 1, 8, f->fp), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b[i];
    char *text = malloc(n + 1);
    assert_int_equal(fread(text, 1, n, f->fp), n);
    text[n] = 0;
    f->hdr = json_loads(text, 0, NULL);
    free(text);
    assert_non_null(f->hdr);
    json_object_del(f->hdr, "__metadata__");
    f->data_start = 8 + n;
}

static void indep_close(struct indep_file *f)
{
    json_decref(f->hdr);
    fclose(f->fp);
}

static void *indep_read(struct indep_file *f, const char *name, size_t *len)
{
    json_t *off = json_object_get(json_object_get(f->hdr, name), "data_offsets");
    uint64_t b = (uint64_t)json_integer_value(json_array_get(off, 0)),
             e = (uint64_t)json_integer_value(json_array_get(off, 1));
    *len = (size_t)(e - b);
    void *p = malloc(*len ? *len : 1);
    assert_int_equal(fseek(f->fp, (long)(f->data_start + b), SEEK_SET), 0);
    assert_int_equal(fread(p, 1, *len, f->fp), *len);
    return p;
}

/* Every tensor of every file of the component: name, dtype, shape, bytes. */
static void check_component_against_files(const struct ckpt_component *c)
{
    int seen = 0;
    for (int i = 0; i < c->n_files; i++) {
        struct indep_file f;
        indep_open(&f, c->files[i].path);
        const char *name;
        json_t *v;
        json_object_foreach(f.hdr, name, v)
        {
            const struct ckpt_tensor *t = ckpt_find(c, name);
            assert_non_null(t);
            assert_int_equal(t->file, i);
            assert_string_equal(mm3_dtype_name(t->st->dtype), json_string_value(json_object_get(v, "dtype")));
            json_t *shape = json_object_get(v, "shape");
            assert_int_equal(t->st->ndim, (int)json_array_size(shape));
            for (int d = 0; d < t->st->ndim; d++)
                assert_int_equal(t->st->shape[d], json_integer_value(json_array_get(shape, (size_t)d)));
            size_t len;
            void *want = indep_read(&f, name, &len);
            assert_int_equal(t->st->nbytes, len);
            assert_non_null(t->data);
            assert_int_equal((uintptr_t)t->data % 64, 0);
            assert_true((uint8_t *)t->data >= (uint8_t *)c->arena &&
                        (uint8_t *)t->data + len <= (uint8_t *)c->arena + c->arena_bytes);
            assert_memory_equal(t->data, want, len);
            free(want);
            seen++;
        }
        indep_close(&f);
    }
    assert_int_equal(seen, c->n_tensors);
}

static void test_golden_components_load(void **state)
{
    (void)state;
    NEED_GOLDEN(root);
    for (int k = 0; k < N_WEIGHT_COMPONENTS; k++) {
        struct ckpt_component c;
        int rc = ckpt_component_open(&c, root, weight_components[k]);
        if (rc < 0) fail_msg("%s", mm3_last_error());
        assert_true(c.n_tensors > 0);
        assert_null(c.arena);
        assert_int_equal(ckpt_component_load(&c), 0);
        assert_non_null(c.arena);
        assert_true(c.arena_bytes >= ckpt_component_arena_size(&c));
        check_component_against_files(&c);
        assert_int_equal(ckpt_component_load(&c), 0); /* second load: no-op */
        ckpt_component_close(&c);
    }
    struct ckpt_component s;
    assert_int_equal(ckpt_component_open(&s, root, "scheduler"), 0);
    int64_t v;
    assert_int_equal(ckpt_config_int(&s, "num_train_timesteps", &v), 0);
    assert_int_equal(v, 1);
    assert_int_equal(s.n_tensors, 0);
    ckpt_component_close(&s);
    assert_int_equal(ckpt_component_open(&s, root, "tokenizer"), 0);
    assert_string_equal(json_string_value(json_object_get(s.config, "tokenizer_class")), "TokenizersBackend");
    ckpt_component_close(&s);
    free(root);
}

/* Values as float: bf16 widening through the arena equals widening the
 * independently read bytes; f32 read through the file path equals the arena. */
static void test_golden_values(void **state)
{
    (void)state;
    NEED_GOLDEN(root);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, root, "rvq_depth_decoder"), 0);
    const struct ckpt_tensor *t = ckpt_find(&c, "projection.weight");
    assert_non_null(t);
    assert_int_equal(t->st->dtype, MM3_DTYPE_BF16);
    int64_t h = t->st->shape[0];
    size_t n = (size_t)(h * t->st->shape[1]);
    float *before = malloc(n * 4), *after = malloc(n * 4);
    assert_int_equal(ckpt_read_f32(&c, "projection.weight", before, 2, t->st->shape), 0); /* pread path */
    assert_int_equal(ckpt_component_load(&c), 0);
    assert_int_equal(ckpt_read_f32(&c, "projection.weight", after, 2, t->st->shape), 0); /* arena path */
    struct indep_file f;
    indep_open(&f, c.files[0].path);
    size_t len;
    uint16_t *raw = indep_read(&f, "projection.weight", &len);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)raw[i] << 16;
        float want;
        memcpy(&want, &u, 4);
        assert_true(before[i] == want && after[i] == want);
    }
    free(raw);
    indep_close(&f);
    /* wrong shape: error names the tensor and both shapes */
    int64_t bad[2] = {h + 1, h};
    assert_true(ckpt_read_f32(&c, "projection.weight", after, 2, bad) < 0);
    assert_non_null(strstr(mm3_last_error(), "projection.weight"));
    assert_non_null(strstr(mm3_last_error(), "expected"));
    assert_true(ckpt_read_f32(&c, "no.such.tensor", after, -1, NULL) < 0);
    assert_non_null(strstr(mm3_last_error(), "missing tensor 'no.such.tensor'"));
    free(before);
    free(after);
    ckpt_component_close(&c);
    free(root);
}

static void test_golden_sharded_lm(void **state)
{
    (void)state;
    NEED_GOLDEN(root);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, root, "language_model"), 0);
    assert_true(c.n_files > 1);
    char p[1024];
    snprintf(p, sizeof p, "%s/language_model/model.safetensors.index.json", root);
    json_t *idx = json_load_file(p, 0, NULL);
    assert_non_null(idx);
    json_t *wm = json_object_get(idx, "weight_map");
    assert_int_equal((int)json_object_size(wm), c.n_tensors);
    const char *name;
    json_t *v;
    json_object_foreach(wm, name, v)
    {
        const struct ckpt_tensor *t = ckpt_find(&c, name);
        assert_non_null(t);
        const char *base = strrchr(c.files[t->file].path, '/') + 1;
        assert_string_equal(base, json_string_value(v));
    }
    json_decref(idx);
    int64_t hidden, vocab, layers;
    assert_int_equal(ckpt_config_int(&c, "hidden_size", &hidden), 0);
    assert_int_equal(ckpt_config_int(&c, "vocab_size", &vocab), 0);
    assert_int_equal(ckpt_config_int(&c, "num_hidden_layers", &layers), 0);
    const struct ckpt_tensor *e = ckpt_find(&c, "model.embed_tokens.weight");
    assert_non_null(e);
    assert_int_equal(e->st->shape[0], vocab);
    assert_int_equal(e->st->shape[1], hidden);
    char key[128];
    snprintf(key, sizeof key, "model.layers.%lld.mlp.down_proj.weight", (long long)(layers - 1));
    assert_non_null(ckpt_find(&c, key));
    double theta;
    assert_int_equal(ckpt_config_rope_theta(&c, &theta), 0);
    assert_true(theta > 0);
    ckpt_component_close(&c);
    free(root);
}

/* io_uring (small blocks, shallow queue: many reads in flight and reused slots)
 * and the pread fallback fill identical arenas; a caller arena works too. */
static void test_uring_equals_pread(void **state)
{
    (void)state;
    NEED_GOLDEN(root);
    struct ckpt_component a, b;
    assert_int_equal(ckpt_component_open(&a, root, "language_model"), 0);
    assert_int_equal(ckpt_component_open(&b, root, "language_model"), 0);
    struct file_reader_opts pread_opts = {.mode = FILE_READER_PREAD, .block_bytes = 1 << 20};
    struct file_reader_stats st;
    assert_int_equal(ckpt_component_load_with(&a, &pread_opts, NULL, 0, &st), 0);
    assert_int_equal(st.used_uring, 0);
    uint64_t total = 0;
    for (int i = 0; i < a.n_tensors; i++)
        total += a.tensors[i].st->nbytes;
    assert_int_equal(st.bytes, total);

    uint64_t need = ckpt_component_arena_size(&b);
    void *buf = NULL;
    assert_int_equal(posix_memalign(&buf, 64, need), 0);
    assert_true(ckpt_component_load_with(&b, NULL, buf, need - 64, NULL) < 0); /* too small */
    assert_non_null(strstr(mm3_last_error(), "need"));
    if (file_reader_uring_available()) {
        /* inline first (then unload), worker threads second */
        for (int inl = 1; inl >= 0; inl--) {
            struct file_reader_opts uring_opts = {
                .mode = FILE_READER_URING, .queue_depth = 3, .block_bytes = 4096, .inline_reads = inl};
            memset(buf, 0xa5, need);
            assert_int_equal(ckpt_component_load_with(&b, &uring_opts, buf, need, &st), 0);
            assert_int_equal(st.used_uring, 1);
            assert_true(st.reads > 100);
            if (inl) {
                assert_memory_equal(a.arena, b.arena, a.arena_bytes);
                ckpt_component_unload(&b);
            }
        }
    } else {
        struct file_reader_opts auto_opts = {.mode = FILE_READER_AUTO};
        assert_int_equal(ckpt_component_load_with(&b, &auto_opts, buf, need, &st), 0);
        print_message("io_uring unavailable: compared pread with the automatic fallback\n");
    }
    assert_int_equal(st.bytes, total);
    assert_ptr_equal(b.arena, buf);
    assert_int_equal(a.arena_bytes, b.arena_bytes);
    assert_memory_equal(a.arena, b.arena, a.arena_bytes);
    for (int i = 0; i < a.n_tensors; i++)
        assert_int_equal((uint8_t *)a.tensors[i].data - (uint8_t *)a.arena,
                         (uint8_t *)b.tensors[i].data - (uint8_t *)b.arena);
    ckpt_component_unload(&a);
    assert_null(a.arena);
    assert_null(a.tensors[0].data);
    ckpt_component_close(&a);
    ckpt_component_close(&b); /* caller arena: not freed by close */
    free(buf);
    free(root);
}

/* Where io_uring_setup is refused (as under gVisor or a seccomp profile), loads
 * fall back to pread with the same bytes, and FILE_READER_URING says why. Run in
 * a child whose seccomp filter fails io_uring_setup with ENOSYS. */
static int child_without_uring(const char *root)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof f / sizeof f[0]), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return 77;
    struct ckpt_component a, b;
    if (ckpt_component_open(&a, root, "transformer") < 0 || ckpt_component_open(&b, root, "transformer") < 0) return 2;
    struct file_reader_opts uring = {.mode = FILE_READER_URING}, pread_only = {.mode = FILE_READER_PREAD};
    struct file_reader_stats st;
    if (ckpt_component_load_with(&a, &uring, NULL, 0, NULL) != -ENOSYS) return 3;
    if (!strstr(mm3_last_error(), "io_uring unavailable")) return 4;
    if (a.arena) return 5;
    if (ckpt_component_load_with(&a, NULL, NULL, 0, &st) != 0 || st.used_uring) return 6; /* AUTO: fallback */
    if (ckpt_component_load_with(&b, &pread_only, NULL, 0, NULL) != 0) return 7;
    if (a.arena_bytes != b.arena_bytes || memcmp(a.arena, b.arena, a.arena_bytes)) return 8;
    ckpt_component_close(&a);
    ckpt_component_close(&b);
    return 0;
}

static void test_fallback_without_uring(void **state)
{
    (void)state;
    NEED_GOLDEN(root);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_without_uring(root));
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    free(root);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) skip(); /* no seccomp here */
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_file_reader_short_file(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("fr");
    char path[512];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    FILE *fp = fopen(path, "wb");
    for (int i = 0; i < 10000; i++)
        fputc(i & 0xff, fp);
    fclose(fp);
    FILE *rf = fopen(path, "rb");
    int fd = fileno(rf);
    uint8_t dst[12000];
    for (int mode = FILE_READER_AUTO; mode <= FILE_READER_PREAD; mode++) {
        if (mode == FILE_READER_URING && !file_reader_uring_available()) continue;
        struct file_reader_opts o = {.mode = (enum file_reader_mode)mode, .block_bytes = 4096};
        struct file_read ok = {fd, 100, 9000, dst, path};
        memset(dst, 0, sizeof dst);
        assert_int_equal(file_reader_run(&ok, 1, &o, NULL), 0);
        for (int i = 0; i < 9000; i++)
            assert_int_equal(dst[i], (100 + i) & 0xff);
        struct file_read past = {fd, 5000, 6000, dst, path};
        assert_true(file_reader_run(&past, 1, &o, NULL) < 0);
        assert_non_null(strstr(mm3_last_error(), "end of file"));
        assert_non_null(strstr(mm3_last_error(), "f.bin"));
    }
    fclose(rf);
    test_remove_tree(dir);
    free(dir);
}

/* ---- corrupt inputs ---- */

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void write_str(const char *dir, const char *name, const char *s)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_bytes(p, s, strlen(s));
}

/* A safetensors file from a header text and data_len bytes of data. */
static void write_raw_st(const char *dir, const char *name, const char *header, size_t data_len)
{
    size_t h = strlen(header);
    uint8_t *buf = calloc(8 + h + data_len + 1, 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + h + i] = (uint8_t)i;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_bytes(p, buf, 8 + h + data_len);
    free(buf);
}

/* root/comp with a config.json; returns the component folder (caller frees). */
static char *make_component(const char *root, const char *comp, const char *config)
{
    size_t n = strlen(root) + strlen(comp) + 2;
    char *d = malloc(n);
    snprintf(d, n, "%s/%s", root, comp);
    mkdir(d, 0755);
    write_str(d, "config.json", config ? config : "{\"hidden_size\": 4}");
    return d;
}

static void expect_open_error(const char *root, const char *comp, const char *substr)
{
    struct ckpt_component c;
    int rc = ckpt_component_open(&c, root, comp);
    if (rc >= 0) fail_msg("%s: opened although corrupt (expected an error with '%s')", comp, substr);
    if (!strstr(mm3_last_error(), substr)) fail_msg("%s: error '%s' lacks '%s'", comp, mm3_last_error(), substr);
    /* c was reset by the failed open: closing again must be harmless */
    ckpt_component_close(&c);
}

#define GOOD_HDR                                                                                                       \
    "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_"  \
    "offsets\":[8,16]}}"

static void test_corrupt_inputs(void **state)
{
    (void)state;
    char *root = test_make_tmpdir("ckbad");
    char *d;
    const char *st = "diffusion_pytorch_model.safetensors";

    /* the good one first, so every failure below is the corruption's */
    d = make_component(root, "good", NULL);
    write_raw_st(d, st, GOOD_HDR, 16);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, root, "good"), 0);
    assert_int_equal(ckpt_component_load(&c), 0);
    assert_int_equal(c.n_tensors, 2);
    ckpt_component_close(&c);
    free(d);

    d = make_component(root, "truncated", NULL);
    write_raw_st(d, st, GOOD_HDR, 12);
    expect_open_error(root, "truncated", "outside the data section");
    free(d);

    d = make_component(root, "tiny_file", NULL);
    write_str(d, st, "abc");
    expect_open_error(root, "tiny_file", "truncated");
    free(d);

    d = make_component(root, "header_past_eof", NULL);
    {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", d, st);
        uint8_t buf[64] = {0};
        buf[0] = 0x00;
        buf[1] = 0x10; /* 4096-byte header in a 64-byte file */
        memcpy(buf + 8, "{}", 2);
        write_bytes(p, buf, sizeof buf);
    }
    expect_open_error(root, "header_past_eof", "runs past the end of the file");
    free(d);

    d = make_component(root, "overlap", NULL);
    write_raw_st(d, st,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                 16);
    expect_open_error(root, "overlap", "overlap");
    free(d);

    d = make_component(root, "out_of_file", NULL);
    write_raw_st(d, st,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[8,1008]}}",
                 16);
    expect_open_error(root, "out_of_file", "outside the data section");
    free(d);

    d = make_component(root, "bad_dtype", NULL);
    write_raw_st(d, st, "{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_open_error(root, "bad_dtype", "dtype 'Q7' not supported");
    free(d);

    d = make_component(root, "size_mismatch", NULL);
    write_raw_st(d, st, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_open_error(root, "size_mismatch", "needs 12 bytes but data_offsets span 8");
    free(d);

    d = make_component(root, "bad_header_json", NULL);
    write_raw_st(d, st, "{\"a\":{\"dtype\":\"F32\",", 8);
    expect_open_error(root, "bad_header_json", "header is not a JSON object");
    free(d);

    d = make_component(root, "bad_config", "{\"hidden_size\": 4,,}");
    write_raw_st(d, st, GOOD_HDR, 16);
    expect_open_error(root, "bad_config", "config.json:1:");
    expect_open_error(root, "bad_config", "malformed JSON");
    free(d);

    d = make_component(root, "no_config", NULL);
    {
        char p[1024];
        snprintf(p, sizeof p, "%s/config.json", d);
        unlink(p);
    }
    write_raw_st(d, st, GOOD_HDR, 16);
    expect_open_error(root, "no_config", "config.json: missing");
    free(d);

    expect_open_error(root, "no_such_component", "missing");

    d = make_component(root, "missing_shard", NULL);
    write_raw_st(d, "model-00001-of-00002.safetensors", GOOD_HDR, 16);
    write_str(d, "model.safetensors.index.json",
              "{\"metadata\":{},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
              "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_error(root, "missing_shard", "model-00002-of-00002.safetensors: shard listed in the index is missing");
    free(d);

    d = make_component(root, "bad_index_json", NULL);
    write_raw_st(d, "model-00001-of-00001.safetensors", GOOD_HDR, 16);
    write_str(d, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"model-00001-of-00001.safetensors\"");
    expect_open_error(root, "bad_index_json", "model.safetensors.index.json:1:");
    free(d);

    d = make_component(root, "index_wrong_shard", NULL);
    write_raw_st(d, "model-00001-of-00002.safetensors", GOOD_HDR, 16);
    write_raw_st(d, "model-00002-of-00002.safetensors",
                 "{\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    write_str(d, "model.safetensors.index.json",
              "{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\","
              "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_error(root, "index_wrong_shard", "index maps 'a' to model-00002-of-00002.safetensors");
    free(d);

    d = make_component(root, "index_not_map", NULL);
    write_raw_st(d, "model-00001-of-00001.safetensors", GOOD_HDR, 16);
    write_str(d, "model.safetensors.index.json", "{\"weight_map\": [1, 2]}");
    expect_open_error(root, "index_not_map", "'weight_map' must be an object");
    free(d);

    d = make_component(root, "duplicate_tensor", NULL);
    write_raw_st(d, "model-00001-of-00002.safetensors", GOOD_HDR, 16);
    write_raw_st(d, "model-00002-of-00002.safetensors", GOOD_HDR, 16);
    write_str(
        d, "model.safetensors.index.json",
        "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_error(root, "duplicate_tensor", "appears in more than one shard");
    free(d);

    d = make_component(root, "two_files_no_index", NULL);
    write_raw_st(d, "x.safetensors", GOOD_HDR, 16);
    write_raw_st(d, "y.safetensors", GOOD_HDR, 16);
    expect_open_error(root, "two_files_no_index", "found 2 files and no index");
    free(d);

    test_remove_tree(root);
    free(root);
}

/* A file that shrinks between open (header validated) and load is an error, not a crash. */
static void test_shrunk_after_open(void **state)
{
    (void)state;
    char *root = test_make_tmpdir("ckshrink");
    char *d = make_component(root, "c", NULL);
    write_raw_st(d, "diffusion_pytorch_model.safetensors", GOOD_HDR, 16);
    struct ckpt_component c;
    assert_int_equal(ckpt_component_open(&c, root, "c"), 0);
    char p[1024];
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", d);
    assert_int_equal(truncate(p, 8 + (off_t)strlen(GOOD_HDR) + 10), 0);
    assert_true(ckpt_component_load(&c) < 0);
    assert_non_null(strstr(mm3_last_error(), "end of file"));
    assert_null(c.arena);
    ckpt_component_close(&c);
    free(d);
    test_remove_tree(root);
    free(root);
}

static void test_rope_styles(void **state)
{
    (void)state;
    char *root = test_make_tmpdir("ckrope");
    const char *cfgs[3] = {"{\"rope_theta\": 500000.0}",
                           "{\"rope_parameters\": {\"rope_theta\": 1000000, \"rope_type\": \"default\"}}",
                           "{\"rope_parameters\": {\"rope_type\": \"default\"}}"};
    const char *names[3] = {"top", "nested", "none"};
    const double want[2] = {500000.0, 1000000.0};
    for (int i = 0; i < 3; i++) {
        char *d = make_component(root, names[i], cfgs[i]);
        write_raw_st(d, "diffusion_pytorch_model.safetensors", GOOD_HDR, 16);
        struct ckpt_component c;
        assert_int_equal(ckpt_component_open(&c, root, names[i]), 0);
        double theta = 0;
        if (i < 2) {
            assert_int_equal(ckpt_config_rope_theta(&c, &theta), 0);
            assert_true(theta == want[i]);
        } else {
            assert_true(ckpt_config_rope_theta(&c, &theta) < 0);
            assert_non_null(strstr(mm3_last_error(), "rope_parameters.rope_theta"));
        }
        ckpt_component_close(&c);
        free(d);
    }
    test_remove_tree(root);
    free(root);
}

static void test_root_check(void **state)
{
    (void)state;
    NEED_GOLDEN(root);
    const char *all[] = {"language_model", "rvq_depth_decoder", "condition_encoder", "transformer",
                         "vocoder",        "scheduler",         "tokenizer"};
    assert_int_equal(ckpt_root_check(root, all, 7), 0);
    const char *more[] = {"language_model", "guider"};
    assert_true(ckpt_root_check(root, more, 2) < 0);
    assert_non_null(strstr(mm3_last_error(), "'guider' is not listed"));
    free(root);

    char *tmp = test_make_tmpdir("ckroot");
    assert_true(ckpt_root_check(tmp, all, 1) < 0);
    assert_non_null(strstr(mm3_last_error(), "modular_model_index.json: missing"));
    write_str(tmp, "modular_model_index.json", "{\"language_model\": [\"transformers\", \"Qwen3ForCausalLM\", {}],");
    assert_true(ckpt_root_check(tmp, all, 1) < 0);
    assert_non_null(strstr(mm3_last_error(), "malformed JSON"));
    write_str(tmp, "modular_model_index.json", "{\"language_model\": [\"transformers\", \"Qwen3ForCausalLM\", {}]}");
    assert_true(ckpt_root_check(tmp, all, 1) < 0); /* listed, but no folder */
    assert_non_null(strstr(mm3_last_error(), "folder"));
    char *d = make_component(tmp, "language_model", NULL);
    assert_int_equal(ckpt_root_check(tmp, all, 1), 0);
    free(d);
    test_remove_tree(tmp);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_components_load),
        cmocka_unit_test(test_golden_values),
        cmocka_unit_test(test_golden_sharded_lm),
        cmocka_unit_test(test_uring_equals_pread),
        cmocka_unit_test(test_fallback_without_uring),
        cmocka_unit_test(test_file_reader_short_file),
        cmocka_unit_test(test_corrupt_inputs),
        cmocka_unit_test(test_shrunk_after_open),
        cmocka_unit_test(test_rope_styles),
        cmocka_unit_test(test_root_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
