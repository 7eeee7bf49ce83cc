/* Fuzz target: a checkpoint component folder built from the input, opened with
 * ckpt_component_open, then its config read and its tensors read and loaded.
 *
 * Input: parts split at "\n--\n" (fuzz_support.h):
 *   part 0     transformer/config.json, also used as modular_model_index.json
 *              for ckpt_root_check
 *   part 1     transformer/diffusion_pytorch_model.safetensors.index.json (absent when empty)
 *   parts 2..  transformer/s0.safetensors, s1.safetensors, ... (shards)
 * Oracles: an opened component's tensors are sorted, unique and found by name;
 * after loading, every tensor's bytes sit 64-byte aligned inside the arena and
 * equal what st_file_read gives. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/checkpoint.h"
#include "common/error.h"
#include "common/log.h"
#include "test/fuzz/fuzz_support.h"

#define INDEX_NAME "diffusion_pytorch_model.safetensors.index.json"
#define READ_MAX_NUMEL (1u << 20)

static char g_root[4096], g_dir[4200];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mm3_log_set_level(MM3_LOG_ERROR);
    snprintf(g_root, sizeof g_root, "%s", fuzz_scratch_dir());
    snprintf(g_dir, sizeof g_dir, "%s/transformer", g_root);
    if (mkdir(g_dir, 0700) < 0) abort();
    return 0;
}

static void path_in_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", g_dir, name);
}

static void shard_name(char *out, size_t cap, int i)
{
    char name[32];
    snprintf(name, sizeof name, "s%d.safetensors", i);
    path_in_dir(out, cap, name);
}

static void check_component(struct ckpt_component *c)
{
    for (int i = 0; i < c->n_tensors; i++) {
        const struct ckpt_tensor *t = &c->tensors[i];
        if (i > 0 && strcmp(c->tensors[i - 1].st->name, t->st->name) >= 0) fuzz_fail("tensors not sorted/unique");
        if (ckpt_find(c, t->st->name) != t) fuzz_fail("tensor '%s' not found by name", t->st->name);
        if (t->file < 0 || t->file >= c->n_files) fuzz_fail("tensor '%s' file %d", t->st->name, t->file);
    }
    int64_t iv;
    double dv;
    int64_t arr[8];
    int n = 8;
    ckpt_config_int(c, "num_layers", &iv);
    ckpt_config_double(c, "rope_theta", &dv);
    ckpt_config_int_array(c, "upsampling_ratios", arr, &n);
    if (n < 0 || n > 8) fuzz_fail("ckpt_config_int_array count %d", n);
    ckpt_config_rope_theta(c, &dv);
    for (int i = 0; i < c->n_tensors; i++) {
        const struct st_tensor *st = c->tensors[i].st;
        uint64_t numel = st_tensor_numel(st);
        if (numel > READ_MAX_NUMEL) continue;
        float *v = malloc((numel ? numel : 1) * sizeof *v);
        if (!v) abort();
        ckpt_read_f32(c, st->name, v, st->ndim, st->shape);
        free(v);
    }
    if (ckpt_component_arena_size(c) > (64u << 20)) return;
    struct file_reader_opts opts = {.mode = FILE_READER_PREAD};
    int rc = ckpt_component_load_with(c, &opts, NULL, 0, NULL);
    fuzz_note("ckpt_component_load_with", rc);
    if (rc < 0) return;
    const uint8_t *arena = c->arena;
    for (int i = 0; i < c->n_tensors; i++) {
        const struct ckpt_tensor *t = &c->tensors[i];
        const uint8_t *d = t->data;
        if (!d || ((uintptr_t)d & 63) || d < arena || t->st->nbytes > c->arena_bytes - (uint64_t)(d - arena))
            fuzz_fail("tensor '%s' outside the arena or misaligned", t->st->name);
        if (t->st->nbytes <= (1u << 20)) {
            void *b = malloc(t->st->nbytes ? t->st->nbytes : 1);
            if (!b) abort();
            if (st_file_read(&c->files[t->file], t->st, b) == 0 && memcmp(b, d, t->st->nbytes) != 0)
                fuzz_fail("tensor '%s': arena bytes differ from the file", t->st->name);
            free(b);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_part p[FUZZ_MAX_PARTS];
    int n = fuzz_split(data, size, p, FUZZ_MAX_PARTS);
    char path[4400];
    path_in_dir(path, sizeof path, "config.json");
    fuzz_write_file(path, p[0].data, p[0].size);
    path_in_dir(path, sizeof path, INDEX_NAME);
    if (n > 1 && p[1].size > 0) fuzz_write_file(path, p[1].data, p[1].size);
    for (int i = 2; i < n; i++) {
        shard_name(path, sizeof path, i - 2);
        fuzz_write_file(path, p[i].data, p[i].size);
    }

    char index_path[4200];
    snprintf(index_path, sizeof index_path, "%s/modular_model_index.json", g_root);
    fuzz_write_file(index_path, p[0].data, p[0].size);
    const char *const components[] = {"transformer", "vocoder"};
    fuzz_note("ckpt_root_check", ckpt_root_check(g_root, components, 1 + (int)(size & 1)));
    unlink(index_path);

    struct ckpt_component c;
    int rc = ckpt_component_open(&c, g_root, "transformer");
    fuzz_note("ckpt_component_open", rc);
    if (rc == 0) {
        check_component(&c);
        ckpt_component_close(&c);
    } else if (!mm3_last_error()[0]) {
        fuzz_fail("ckpt_component_open failed without a message");
    }
    mm3_error_clear();

    path_in_dir(path, sizeof path, "config.json");
    unlink(path);
    path_in_dir(path, sizeof path, INDEX_NAME);
    unlink(path);
    for (int i = 2; i < n; i++) {
        shard_name(path, sizeof path, i - 2);
        unlink(path);
    }
    return 0;
}
