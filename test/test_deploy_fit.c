/* The shipped deploy files fit the device they are written for: every configs/ file
 * meant for the release model (backend not cpu) is loaded and stage 0's memory plan
 * (talker_backend_plan_compute_kv with the file's kv_cache_dtype and the release
 * geometry of common/ckpt_gen.c's "full" preset, no weights needed) must fit its
 * gpu_memory_utilization of an H200 as cudaMemGetInfo reports it; stages sharing a
 * device must not ask for more than all of it. The same check refuses the two-GPU
 * file with a float32 KV cache (what stage 0 refused on the device on 2026-11-30),
 * and the kv_cache_dtype key resolves as documented (auto: bf16 on CUDA, the CPU
 * backend float32 whatever is asked). */
/* cmocka.h needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/ckpt_gen.h"
#include "common/deploy.h"
#include "common/error.h"
#include "stage0/model/talker_backend.h"
#include "support/test_support.h"

/* An H200's memory as cudaMemGetInfo reports it (the device's own log: budget
 * 121682 MiB = 0.85 x 143156 MiB), a little under the 141 GB on the box. */
#define H200_BYTES ((size_t)143156 << 20)
/* An H100's (80 GB) the same way: 81079 MiB. */
#define H100_BYTES ((size_t)81079 << 20)

/* The device a shipped file is written for: *_h100.yaml an H100, the rest an H200. */
static size_t device_bytes(const char *file)
{
    size_t n = strlen(file);
    return n >= 10 && !strcmp(file + n - 10, "_h100.yaml") ? H100_BYTES : H200_BYTES;
}

static struct mm3_deploy deploy; /* large: keep it off the stack */

/* The release geometry (ckpt_gen "full"): configs only, no weights. */
static void release_models(struct talker *lm, struct depth *dd)
{
    struct ckpt_gen_geometry g;
    assert_int_equal(ckpt_gen_preset("full", &g), 0);
    memset(lm, 0, sizeof *lm);
    memset(dd, 0, sizeof *dd);
    lm->cfg = (struct talker_config){.hidden = g.lm_hidden,
                                     .n_layers = g.lm_layers,
                                     .n_heads = g.lm_heads,
                                     .n_kv_heads = g.lm_kv_heads,
                                     .head_dim = g.lm_head_dim,
                                     .ffn = g.lm_intermediate,
                                     .vocab = g.lm_vocab,
                                     .eps = 1e-6f,
                                     .rope_theta = g.lm_rope_theta};
    dd->cfg = (struct depth_config){.hidden = g.lm_hidden,
                                    .n_layers = g.dd_layers,
                                    .n_heads = g.dd_heads,
                                    .head_dim = g.lm_hidden / g.dd_heads,
                                    .ffn = g.dd_intermediate,
                                    .audio_vocab = g.dd_audio_vocab,
                                    .n_codebooks = g.dd_codebooks,
                                    .max_pos = g.dd_max_positions,
                                    .eps = 1e-6f};
}

static double mib(size_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* Stage 0's plan of the loaded file on a device of `bytes` (CUDA backend), printed. */
static int stage0_fits_on(const struct mm3_deploy *d, const char *name, size_t bytes, struct talker_backend_plan *p)
{
    struct talker lm;
    struct depth dd;
    release_models(&lm, &dd);
    const struct mm3_stage_config *s0 = mm3_deploy_stage(d, 0);
    talker_backend_plan_compute_kv(TALKER_BACKEND_CUDA, s0->kv_cache_dtype, &lm, &dd, s0->max_num_seqs,
                                   s0->max_model_len, p);
    int fits = talker_backend_plan_fits(p, s0->gpu_memory_utilization, bytes);
    print_message("%s: weights %.1f MiB + KV (%s) %.1f MiB/row x %d rows + workspace %.1f MiB = %.1f MiB; "
                  "budget %g x %.0f MiB = %.1f MiB: %s\n",
                  name, mib(p->weights_bytes), mm3_kv_cache_dtype_name(p->kv_dtype), mib(p->kv_bytes_per_row), p->rows,
                  mib(p->workspace_bytes), mib(p->total_bytes), s0->gpu_memory_utilization, mib(bytes),
                  s0->gpu_memory_utilization * mib(bytes), fits ? "fits" : "does NOT fit");
    return fits;
}

static int stage0_fits(const struct mm3_deploy *d, const char *name, struct talker_backend_plan *p)
{
    return stage0_fits_on(d, name, H200_BYTES, p);
}

static int is_release_file(const struct mm3_deploy *d)
{
    return d->backend != MM3_BACKEND_CPU;
}

static void test_release_configs_fit_h200(void **state)
{
    (void)state;
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s/configs", test_source_dir());
    DIR *dh = opendir(dir);
    assert_non_null(dh);
    int checked = 0;
    struct dirent *e;
    while ((e = readdir(dh))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".yaml")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (mm3_deploy_load(&deploy, path) != 0) fail_msg("%s: %s", e->d_name, mm3_last_error());
        if (!is_release_file(&deploy)) continue;
        struct talker_backend_plan p;
        if (!stage0_fits_on(&deploy, e->d_name, device_bytes(e->d_name), &p))
            fail_msg("%s: stage 0 does not fit the device it is written for", e->d_name);
        assert_int_equal(p.kv_dtype, MM3_KV_CACHE_BF16); /* auto on CUDA */
        const struct mm3_stage_config *s0 = mm3_deploy_stage(&deploy, 0), *s1 = mm3_deploy_stage(&deploy, 1);
        /* every stage-1 worker's device: its workers' shares, and stage 0's where it is there too */
        int n = mm3_deploy_stage1_workers(&deploy);
        for (int k = 0; k < n; k++) {
            int dev = mm3_deploy_stage1_worker_device(&deploy, k), on_dev = 0;
            for (int j = 0; j < n; j++)
                on_dev += mm3_deploy_stage1_worker_device(&deploy, j) == dev;
            double want =
                on_dev * s1->gpu_memory_utilization + (s0->devices[0] == dev ? s0->gpu_memory_utilization : 0);
            if (want > 1.0)
                fail_msg("%s: device %d holds %d stage-1 worker(s)%s and asks for %g of it", e->d_name, dev, on_dev,
                         s0->devices[0] == dev ? " and stage 0" : "", want);
        }
        if (!strcmp(e->d_name, "minimax_music3_4gpu.yaml")) {
            assert_int_equal(n, 3); /* stage 1 on GPUs 1-3, stage 0 alone on GPU 0 */
            for (int k = 0; k < n; k++)
                assert_int_equal(mm3_deploy_stage1_worker_device(&deploy, k), k + 1);
            assert_int_equal(s0->devices[0], 0);
        }
        checked++;
    }
    closedir(dh);
    assert_true(checked >= 4); /* minimax_music3.yaml, _h100.yaml, _2gpu.yaml and _4gpu.yaml */
}

/* The one-GPU file is an H200's: on an H100 stage 0 refuses it at start (61 GB of plan
 * for 0.6 x 79 GB), which is why the H100 file exists. */
static void test_one_gpu_file_needs_h100_file(void **state)
{
    (void)state;
    char path[1024];
    struct talker_backend_plan p;
    snprintf(path, sizeof path, "%s/configs/minimax_music3.yaml", test_source_dir());
    assert_int_equal(mm3_deploy_load(&deploy, path), 0);
    assert_false(stage0_fits_on(&deploy, "minimax_music3.yaml on an H100", H100_BYTES, &p));
    snprintf(path, sizeof path, "%s/configs/minimax_music3_h100.yaml", test_source_dir());
    assert_int_equal(mm3_deploy_load(&deploy, path), 0);
    assert_true(stage0_fits_on(&deploy, "minimax_music3_h100.yaml", H100_BYTES, &p));
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->max_model_len, 10240); /* full-length songs kept */
}

/* The two-GPU file with `kv_cache_dtype: float32` in stage 0 (this morning's file):
 * refused by the same check (64 rows of 2880 MiB), while the shipped file fits. */
static void test_two_gpu_file_needs_bf16_kv(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/minimax_music3_2gpu.yaml", test_source_dir());
    char *text = test_file_read(path, NULL);
    assert_non_null(text);
    /* Stage 0 is the only stage with the key: rewrite its value, or add it. */
    const char *written = "kv_cache_dtype: auto\n", *anchor = "  - stage_id: 0\n";
    const char *key = "    kv_cache_dtype: float32\n";
    char *at = strstr(text, written);
    size_t head, skip = 0, n = strlen(text);
    if (at) {
        head = (size_t)(at - text) - 4; /* the key's indentation is part of `key` */
        skip = 4 + strlen(written);
    } else {
        assert_non_null(at = strstr(text, anchor));
        head = (size_t)(at - text) + strlen(anchor);
    }
    char *edited = malloc(n + strlen(key) + 1);
    assert_non_null(edited);
    memcpy(edited, text, head);
    strcpy(edited + head, key);
    strcpy(edited + head + strlen(key), text + head + skip);
    struct talker_backend_plan f32, auto_plan;
    int rc = mm3_deploy_load_string(&deploy, edited, "2gpu+float32");
    if (rc) fail_msg("%s", mm3_last_error());
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->kv_cache_dtype, MM3_KV_CACHE_F32);
    assert_false(stage0_fits(&deploy, "2gpu, kv float32", &f32));
    assert_int_equal(f32.kv_dtype, MM3_KV_CACHE_F32);
    assert_int_equal(mm3_deploy_load(&deploy, path), 0);
    assert_true(stage0_fits(&deploy, "2gpu, as shipped", &auto_plan));
    assert_int_equal(auto_plan.kv_dtype, MM3_KV_CACHE_BF16);
    /* bf16 halves the cache exactly; the rest of the plan does not depend on it. */
    assert_true(f32.kv_bytes_per_row == 2 * auto_plan.kv_bytes_per_row);
    assert_true(f32.weights_bytes == auto_plan.weights_bytes && f32.workspace_bytes == auto_plan.workspace_bytes);
    free(edited);
    free(text);
}

/* auto -> bf16 on CUDA, float32 on the CPU; the CPU keeps float32 when bf16 is asked. */
static void test_kv_dtype_resolution(void **state)
{
    (void)state;
    assert_int_equal(talker_backend_kv_dtype(TALKER_BACKEND_CUDA, MM3_KV_CACHE_AUTO), MM3_KV_CACHE_BF16);
    assert_int_equal(talker_backend_kv_dtype(TALKER_BACKEND_CUDA, MM3_KV_CACHE_BF16), MM3_KV_CACHE_BF16);
    assert_int_equal(talker_backend_kv_dtype(TALKER_BACKEND_CUDA, MM3_KV_CACHE_F32), MM3_KV_CACHE_F32);
    assert_int_equal(talker_backend_kv_dtype(TALKER_BACKEND_CPU, MM3_KV_CACHE_AUTO), MM3_KV_CACHE_F32);
    assert_int_equal(talker_backend_kv_dtype(TALKER_BACKEND_CPU, MM3_KV_CACHE_BF16), MM3_KV_CACHE_F32);
    struct talker lm;
    struct depth dd;
    release_models(&lm, &dd);
    struct talker_backend_plan a, b, c;
    talker_backend_plan_compute_kv(TALKER_BACKEND_CPU, MM3_KV_CACHE_BF16, &lm, &dd, 2, 100, &a);
    talker_backend_plan_compute_kv(TALKER_BACKEND_CPU, MM3_KV_CACHE_F32, &lm, &dd, 2, 100, &b);
    assert_true(a.kv_bytes_per_row == b.kv_bytes_per_row);
    /* K and V, every layer, every kv head's dims, 100 positions, 4 bytes. */
    size_t kd = (size_t)lm.cfg.n_kv_heads * lm.cfg.head_dim;
    assert_true(b.kv_bytes_per_row == 2 * (size_t)lm.cfg.n_layers * 100 * kd * 4);
    talker_backend_plan_compute(TALKER_BACKEND_CUDA, &lm, &dd, 2, 100, &c); /* auto */
    assert_int_equal(c.kv_dtype, MM3_KV_CACHE_BF16);
    assert_true(c.kv_bytes_per_row == 2 * (size_t)lm.cfg.n_layers * 100 * kd * 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_configs_fit_h200), cmocka_unit_test(test_one_gpu_file_needs_h100_file),
        cmocka_unit_test(test_two_gpu_file_needs_bf16_kv),
        cmocka_unit_test(test_kv_dtype_resolution),
    };
    return cmocka_run_group_tests_name("deploy files fit the device", tests, NULL, NULL);
}
