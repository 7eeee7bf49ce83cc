/* Deploy file loader: the shipped configs load, defaults and derived deadlines
 * are right, and every class of bad file is refused (or warned about) with the
 * right file:line and key path. The bad files live in test/data/deploy/; each
 * marks the line the message must point at with "# <-- here". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/deploy.h"
#include "common/error.h"
#include "support/test_support.h"

static struct mm3_deploy deploy; /* large: keep it off the stack */

static void source_path(char *out, size_t cap, const char *rel)
{
    snprintf(out, cap, "%s/%s", test_source_dir(), rel);
}

/* 1-based number of the line holding "# <-- here", or 0. */
static int marked_line(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char buf[512];
    int line = 0, found = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        if (strstr(buf, "# <-- here")) {
            found = line;
            break;
        }
    }
    fclose(f);
    return found;
}

static bool has_warning(const struct mm3_deploy *d, const char *text)
{
    for (int i = 0; i < d->n_warnings; i++)
        if (strstr(d->warnings[i], text)) return true;
    return false;
}

static void test_shipped_configs_load(void **state)
{
    (void)state;
    char dir[1024], path[2048];
    source_path(dir, sizeof dir, "configs");
    DIR *dh = opendir(dir);
    assert_non_null(dh);
    int loaded = 0;
    struct dirent *e;
    while ((e = readdir(dh))) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".yaml")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        int rc = mm3_deploy_load(&deploy, path);
        if (rc != 0) fail_msg("%s: %s", e->d_name, mm3_last_error());
        loaded++;
    }
    closedir(dh);
    assert_true(loaded >= 3);
}

static void test_one_gpu_config_values(void **state)
{
    (void)state;
    char path[1024];
    source_path(path, sizeof path, "configs/minimax_music3.yaml");
    assert_int_equal(mm3_deploy_load(&deploy, path), 0);
    const struct mm3_stage_config *s0 = mm3_deploy_stage(&deploy, 0), *s1 = mm3_deploy_stage(&deploy, 1);
    assert_non_null(s0);
    assert_non_null(s1);
    assert_null(mm3_deploy_stage(&deploy, 2));
    assert_int_equal(s0->max_num_seqs, 32); /* 16 songs, as many as stage 1 holds; test_deploy_fit checks the room */
    assert_int_equal(s0->kv_cache_dtype, MM3_KV_CACHE_AUTO);
    assert_int_equal(s1->max_num_seqs, 16);
    assert_true(s0->gpu_memory_utilization == 0.6 && s1->gpu_memory_utilization == 0.2);
    assert_int_equal(s0->dtype, MM3_DTYPE_BF16);
    assert_int_equal(s1->dtype, MM3_DTYPE_F32);
    int sizes[] = {1, 2, 4, 8, 16, 32};
    assert_int_equal(s0->compilation.n_capture_sizes, 6);
    for (int i = 0; i < 6; i++) assert_int_equal(s0->compilation.capture_sizes[i], sizes[i]);
    assert_int_equal(s0->compilation.cudagraph_mode, MM3_CUDAGRAPH_FULL_DECODE_ONLY);
    assert_false(s0->enforce_eager);
    assert_true(s1->enforce_eager);
    assert_true(s0->cfg_enabled);
    assert_true(s0->cfg_scale == 1.5);
    assert_int_equal(s0->max_tokens, 9002);
    assert_int_equal(s1->n_devices, 1);
    assert_int_equal(s1->devices[0], 0);
    assert_int_equal(s1->matmul_precision, MM3_MATMUL_FP16);
    assert_int_equal(s1->num_inference_steps, 30);
    assert_true(s1->guidance_scale == 1.7);
    assert_string_equal(deploy.api.host, "127.0.0.1");
    assert_int_equal(deploy.api.port, 8000);
    assert_int_equal(deploy.api.default_sample_rate, 44100);
    assert_int_equal(deploy.backend, MM3_BACKEND_AUTO);
    const struct mm3_connector_config *k = mm3_deploy_connector(&deploy, "connector_of_shared_memory");
    assert_non_null(k);
    assert_null(mm3_deploy_connector(&deploy, "nope"));
    assert_int_equal(mm3_deploy_edge_connector(&deploy)->get_max_wait, k->get_max_wait);
    assert_true(fabs(mm3_connector_first_chunk_deadline_s(k) - 300.0) < 1e-9);
    assert_true(fabs(mm3_connector_steady_deadline_s(k) - 100.0) < 1e-9);
    /* The checkpoint's own limit: a maximal prompt and a full song do not fit. */
    assert_true(has_warning(&deploy, "stages[0].max_model_len"));

    source_path(path, sizeof path, "configs/minimax_music3_2gpu.yaml");
    assert_int_equal(mm3_deploy_load(&deploy, path), 0);
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->max_num_seqs, 64);
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->devices[0], 0);
    assert_int_equal(mm3_deploy_stage(&deploy, 1)->devices[0], 1);
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->compilation.capture_sizes[6], 64);
}

static void test_tiny_cpu_config_values(void **state)
{
    (void)state;
    char path[1024];
    source_path(path, sizeof path, "configs/tiny-cpu.yaml");
    assert_int_equal(mm3_deploy_load(&deploy, path), 0);
    assert_int_equal(deploy.backend, MM3_BACKEND_CPU);
    assert_string_equal(deploy.model, "build/tiny-ckpt");
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->max_num_seqs, 8);
    assert_int_equal(mm3_deploy_stage(&deploy, 1)->max_num_seqs, 4);
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->dtype, MM3_DTYPE_F32);
    const struct mm3_connector_config *k = mm3_deploy_edge_connector(&deploy);
    assert_true(fabs(mm3_connector_first_chunk_deadline_s(k) - 60.0) < 1e-9);
    assert_true(fabs(mm3_connector_steady_deadline_s(k) - 30.0) < 1e-9);
    assert_int_equal(mm3_deploy_resolve_backend(&deploy, true), 0); /* cpu stays cpu with a GPU present */
    assert_int_equal(deploy.backend, MM3_BACKEND_CPU);
    assert_int_equal(mm3_deploy_set_model(&deploy, "/data/ckpt"), 0);
    assert_string_equal(deploy.model, "/data/ckpt");
}

static void test_deadlines(void **state)
{
    (void)state;
    struct mm3_connector_config k = {.get_sleep_s = 0.25, .get_max_wait_first_chunk = 12, .get_max_wait = 3};
    assert_true(mm3_connector_first_chunk_deadline_s(&k) == 3.0);
    assert_true(mm3_connector_steady_deadline_s(&k) == 0.75);
    const char *yaml =
        "connectors:\n"
        "  c:\n"
        "    name: SharedMemoryConnector\n"
        "    extra:\n"
        "      connector_get_sleep_s: 0.002\n"
        "      connector_get_max_wait_first_chunk: 500\n"
        "      connector_get_max_wait: 250\n"
        "stages:\n"
        "  - {stage_id: 1, input_connectors: {from_stage_0: c}}\n"
        "  - {stage_id: 0, output_connectors: {to_stage_1: c}}\n";
    assert_int_equal(mm3_deploy_load_string(&deploy, yaml, "inline"), 0);
    const struct mm3_connector_config *e = mm3_deploy_edge_connector(&deploy);
    assert_string_equal(e->name, "c");
    assert_true(fabs(mm3_connector_first_chunk_deadline_s(e) - 1.0) < 1e-12);
    assert_true(fabs(mm3_connector_steady_deadline_s(e) - 0.5) < 1e-12);
}

/* kv_cache_dtype: vLLM's key and spellings, stage 0 only; a bad value names the
 * place and the accepted values. */
static void test_kv_cache_dtype_key(void **state)
{
    (void)state;
    static const char *const names[] = {"auto", "bfloat16", "float32"};
    static const enum mm3_kv_cache_dtype want[] = {MM3_KV_CACHE_AUTO, MM3_KV_CACHE_BF16, MM3_KV_CACHE_F32};
    char yaml[256];
    for (int i = 0; i < 3; i++) {
        snprintf(yaml, sizeof yaml, "stages:\n  - stage_id: 0\n    kv_cache_dtype: %s\n  - stage_id: 1\n", names[i]);
        assert_int_equal(mm3_deploy_load_string(&deploy, yaml, "kv"), 0);
        assert_int_equal(mm3_deploy_stage(&deploy, 0)->kv_cache_dtype, want[i]);
        assert_string_equal(mm3_kv_cache_dtype_name(want[i]), names[i]);
        enum mm3_kv_cache_dtype t = MM3_KV_CACHE_AUTO;
        assert_int_equal(mm3_kv_cache_dtype_parse(names[i], &t), 0);
        assert_int_equal(t, want[i]);
    }
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - stage_id: 1\n", "kv"), 0);
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->kv_cache_dtype, MM3_KV_CACHE_AUTO);
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n    kv_cache_dtype: fp8\n"
                                                     "  - stage_id: 1\n", "kv"),
                     -EINVAL);
    const char *msg = mm3_last_error();
    assert_non_null(strstr(msg, "kv:3:21: stages[0].kv_cache_dtype"));
    assert_non_null(strstr(msg, "auto, bfloat16, float32"));
    assert_non_null(strstr(msg, "fp8"));
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->kv_cache_dtype, MM3_KV_CACHE_AUTO); /* defaults again */
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - stage_id: 1\n"
                                                     "    kv_cache_dtype: bfloat16\n", "kv"),
                     -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "kv:4:5: stages[1].kv_cache_dtype: only stage 0"));
    enum mm3_kv_cache_dtype t;
    assert_int_equal(mm3_kv_cache_dtype_parse("half", &t), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "half"));
}

static void test_defaults(void **state)
{
    (void)state;
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - stage_id: 1\n", "min"), 0);
    const struct mm3_stage_config *s0 = mm3_deploy_stage(&deploy, 0), *s1 = mm3_deploy_stage(&deploy, 1);
    assert_int_equal(s0->max_num_seqs, 32);
    assert_int_equal(s0->compilation.n_capture_sizes, 6); /* 1..32 powers of two */
    assert_int_equal(s1->compilation.capture_sizes[s1->compilation.n_capture_sizes - 1], 16);
    assert_true(s0->cfg_enabled);
    assert_string_equal(deploy.api.host, "127.0.0.1");
    assert_int_equal(deploy.api.max_queue_depth, 64);
    assert_int_equal(deploy.api.max_body_bytes, 1 << 20);
    assert_int_equal(deploy.api.max_connections, 256);
    assert_true(deploy.api.request_timeout_s == 1800);
    assert_string_equal(deploy.api.journal_dir, "");
    assert_string_equal(deploy.api.replay_dir, "");
    assert_int_equal(deploy.api.max_buffered_bytes, 1LL << 30);
    assert_int_equal(deploy.api.idle_timeout_s, 60);
    assert_true(deploy.api.request_read_timeout_s == 30);
    assert_int_equal(deploy.api.max_connections_per_client, 32);
    assert_int_equal(deploy.api.admin_connections, 8);
    assert_true(deploy.api.drain_timeout_s == 10);
    assert_true(deploy.api.stream_capacity_share == 0.85);
    assert_int_equal(deploy.api.continue_max_songs, 256);
    assert_int_equal(deploy.api.continue_max_bytes, 64LL << 20);
    assert_true(deploy.api.continue_max_age_s == 3600);
    assert_string_equal(deploy.api.api_key, "");
    assert_string_equal(deploy.model, "");
    assert_string_equal(mm3_deploy_edge_connector(&deploy)->connector_class, "SharedMemoryConnector");
    assert_true(fabs(mm3_connector_first_chunk_deadline_s(mm3_deploy_edge_connector(&deploy)) - 300) < 1e-9);
    /* A non-power-of-two ceiling is captured too. */
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - {stage_id: 0, max_num_seqs: 24}\n"
                                                     "  - {stage_id: 1}\n", "min"), 0);
    s0 = mm3_deploy_stage(&deploy, 0);
    assert_int_equal(s0->compilation.capture_sizes[s0->compilation.n_capture_sizes - 1], 24);
    assert_int_equal(s0->compilation.capture_sizes[s0->compilation.n_capture_sizes - 2], 16);
    /* Stage 1's window cap follows a smaller max_model_len when not written. */
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - {stage_id: 0}\n  - {stage_id: 1, max_model_len: 90}\n",
                                            "win"), 0);
    assert_int_equal(mm3_deploy_stage(&deploy, 1)->max_tokens, 90);
    /* cfg_scale 1 turns guidance off: odd rows become legal, with a warning. */
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n    max_num_seqs: 7\n"
                                                     "    default_sampling_params: {extra_args: {cfg_scale: 1}}\n"
                                                     "  - stage_id: 1\n", "nocfg"), 0);
    assert_false(mm3_deploy_stage(&deploy, 0)->cfg_enabled);
    assert_true(has_warning(&deploy, "nocfg:4:"));
}

struct bad_case {
    const char *file;
    const char *key_path;
    const char *text;
};

static void check_bad_file(const struct bad_case *bc, bool warning)
{
    char path[1024], want[1200];
    snprintf(path, sizeof path, "%s/test/data/deploy/%s", test_source_dir(), bc->file);
    int line = marked_line(path);
    assert_true(line > 0);
    snprintf(want, sizeof want, "%s:%d:", path, line);
    int rc = mm3_deploy_load(&deploy, path);
    const char *msg = mm3_last_error();
    if (warning) {
        if (rc != 0) fail_msg("%s: expected to load, got: %s", bc->file, msg);
        bool seen = false;
        for (int i = 0; i < deploy.n_warnings; i++)
            if (strstr(deploy.warnings[i], want) && strstr(deploy.warnings[i], bc->key_path) &&
                strstr(deploy.warnings[i], bc->text))
                seen = true;
        if (!seen) fail_msg("%s: no warning with '%s', '%s' and '%s' (%d warnings, first: %s)", bc->file, want,
                            bc->key_path, bc->text, deploy.n_warnings,
                            deploy.n_warnings ? deploy.warnings[0] : "-");
        return;
    }
    if (rc != -EINVAL) fail_msg("%s: expected -EINVAL, got %d (%s)", bc->file, rc, msg);
    if (!strstr(msg, want) || !strstr(msg, bc->key_path) || !strstr(msg, bc->text))
        fail_msg("%s: message lacks '%s', '%s' or '%s': %s", bc->file, want, bc->key_path, bc->text, msg);
    /* A failed load leaves nothing half-filled behind. */
    assert_int_equal(deploy.n_connectors, 0);
}

static void test_bad_files_rejected(void **state)
{
    (void)state;
    static const struct bad_case cases[] = {
        {"unknown_key.yaml", "stages[0].max_num_seq:", "unknown key"},
        {"wrong_type.yaml", "stages[0].max_num_seqs:", "expected an integer"},
        {"mem_fraction_zero.yaml", "stages[1].gpu_memory_utilization:", "(0, 1]"},
        {"mem_fraction_high.yaml", "stages[0].gpu_memory_utilization:", "got '1.5'"},
        {"max_num_seqs_zero.yaml", "stages[1].max_num_seqs:", "expected an integer"},
        {"odd_rows_with_cfg.yaml", "stages[0].max_num_seqs:", "even"},
        {"capture_sizes_descending.yaml", "stages[0].compilation_config.cudagraph_capture_sizes[2]:", "ascending"},
        {"connector_unknown.yaml", "stages[1].input_connectors.from_stage_0:", "shm_typo"},
        {"duplicate_key.yaml", "stages[0].max_num_seqs:", "duplicate key"},
        {"malformed.yaml", "stages[1]", "YAML syntax error"},
        {"temperature.yaml", "stages[0].default_sampling_params.temperature:", "expected 1.0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_bad_file(&cases[i], false);
}

static void test_short_context_warns(void **state)
{
    (void)state;
    static const struct bad_case warn_case = {"max_model_len_short.yaml", "stages[0].max_model_len:", "5000"};
    check_bad_file(&warn_case, true);
    assert_int_equal(mm3_deploy_stage(&deploy, 0)->max_model_len, 4096);
}

/* Inline documents for the classes that need no file of their own:
 * expected "name:line:" prefix and key path. */
static int inline_failures;

static void expect_inline_error(const char *yaml, int line, const char *key_path, const char *text)
{
    char want[64];
    snprintf(want, sizeof want, "t:%d:", line);
    int rc = mm3_deploy_load_string(&deploy, yaml, "t");
    const char *msg = mm3_last_error();
    if (rc >= 0) {
        print_error("expected an error for:\n%s\n", yaml);
        inline_failures++;
    } else if (!strstr(msg, want) || !strstr(msg, key_path) || !strstr(msg, text)) {
        print_error("message lacks '%s', '%s' or '%s': %s\n", want, key_path, text, msg);
        inline_failures++;
    }
}

static void test_inline_errors(void **state)
{
    (void)state;
    expect_inline_error("", 1, "(top level)", "empty");
    expect_inline_error("- 1\n", 1, "(top level)", "mapping");
    expect_inline_error("stages:\n  - stage_id: 0\n", 2, "stages:", "stage 1 is missing");
    expect_inline_error("stages:\n  - stage_id: 0\n  - stage_id: 0\n", 3, "stages[1].stage_id", "already defined");
    expect_inline_error("stages:\n  - stage_id: 2\n", 2, "stages[0].stage_id", "[0, 1]");
    expect_inline_error("stages:\n  - max_num_seqs: 2\n", 2, "stages[0].stage_id", "missing");
    expect_inline_error("pipeline: qwen3_omni\nstages: []\n", 1, "pipeline", "minimax_music3");
    expect_inline_error("backend: tpu\n", 1, "backend", "cuda");
    expect_inline_error("async_chunk: yes\n", 1, "async_chunk", "true or false");
    expect_inline_error("api:\n  port: 70000\n", 2, "api.port", "[0, 65535]");
    expect_inline_error("api:\n  default_sample_rate: 48000\n", 2, "api.default_sample_rate", "44100 or 32000");
    expect_inline_error("api:\n  host: 'a b'\n", 2, "api.host", "IP address");
    expect_inline_error("api:\n  max_body_bytes: 10\n", 2, "api.max_body_bytes", "[1024, ");
    expect_inline_error("api:\n  max_buffered_bytes: 4096\n", 2, "api.max_buffered_bytes", "[1048576, ");
    expect_inline_error("api:\n  request_timeout_s: 0\n", 2, "api.request_timeout_s", "(0, ");
    expect_inline_error("api:\n  idle_timeout_s: 0\n", 2, "api.idle_timeout_s", "[1, 86400]");
    expect_inline_error("api:\n  request_read_timeout_s: 0\n", 2, "api.request_read_timeout_s", "(0, 3600]");
    expect_inline_error("api:\n  max_connections_per_client: -1\n", 2, "api.max_connections_per_client", "[0, ");
    expect_inline_error("api:\n  admin_connections: 5000\n", 2, "api.admin_connections", "[0, 1024]");
    expect_inline_error("api:\n  drain_timeout_s: -1\n", 2, "api.drain_timeout_s", "[0, 3600]");
    expect_inline_error("api:\n  stream_capacity_share: 0\n", 2, "api.stream_capacity_share", "(0, 1]");
    expect_inline_error("api:\n  stream_capacity_share: 1.5\n", 2, "api.stream_capacity_share", "(0, 1]");
    expect_inline_error("api:\n  continue_max_songs: -1\n", 2, "api.continue_max_songs", "[0, ");
    expect_inline_error("api:\n  continue_max_bytes: -5\n", 2, "api.continue_max_bytes", "[0, ");
    expect_inline_error("api:\n  continue_max_age_s: -1\n", 2, "api.continue_max_age_s", "[0, ");
    expect_inline_error("api:\n  api_key: short\n", 2, "api.api_key", "at least 16");
    expect_inline_error("api:\n  api_key: 'with a space in the key'\n", 2, "api.api_key", "printable ASCII");
    expect_inline_error("connectors:\n  c:\n    name: MooncakeStoreConnector\n", 3, "connectors.c.name",
                        "SharedMemoryConnector");
    expect_inline_error("connectors:\n  c:\n    extra: {connector_get_sleep_s: 0}\n", 3,
                        "connectors.c.extra.connector_get_sleep_s", "(0, 60]");
    expect_inline_error("connectors:\n  c:\n    extra:\n      connector_get_max_wait: 0\n", 4,
                        "connectors.c.extra.connector_get_max_wait", "[1, ");
    expect_inline_error("connectors:\n  c:\n    extra:\n      shm_threshold_bytes: -1\n", 4,
                        "connectors.c.extra.shm_threshold_bytes", "[0, ");
    expect_inline_error("connectors:\n  c:\n    extra:\n      compile_dit: true\n", 4,
                        "connectors.c.extra.compile_dit", "matmul_precision");
    expect_inline_error("connectors:\n  c:\n    extra: {}\n", 2, "connectors.c.name", "missing");
    expect_inline_error("stages:\n  - {stage_id: 0, num_inference_steps: 4}\n", 2,
                        "stages[0].num_inference_steps", "only stage 1");
    expect_inline_error("stages:\n  - {stage_id: 1, num_inference_steps: 0}\n", 2,
                        "stages[0].num_inference_steps", "[1, 1000]");
    assert_int_equal(
        mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - {stage_id: 1, matmul_precision: fp8}\n", "k"),
        0);
    assert_int_equal(mm3_deploy_stage(&deploy, 1)->matmul_precision, MM3_MATMUL_FP8);
    assert_string_equal(mm3_matmul_precision_name(MM3_MATMUL_FP8), "fp8");
    expect_inline_error("stages:\n  - {stage_id: 1, matmul_precision: int8}\n", 2, "stages[0].matmul_precision",
                        "fp32, tf32, bf16, fp16, fp8");
    expect_inline_error("stages:\n  - {stage_id: 0, dtype: float16}\n", 2, "stages[0].dtype", "bfloat16");
    expect_inline_error("stages:\n  - {stage_id: 0, devices: \"0,x\"}\n", 2, "stages[0].devices", "device");
    expect_inline_error("stages:\n  - {stage_id: 0, devices: \"1,1\"}\n", 2, "stages[0].devices", "twice");
    expect_inline_error("stages:\n  - {stage_id: 0, async_scheduling: true}\n", 2, "stages[0].async_scheduling",
                        "expected false");
    expect_inline_error("stages:\n  - {stage_id: 0, enable_prefix_caching: true}\n", 2,
                        "stages[0].enable_prefix_caching", "expected false");
    expect_inline_error("stages:\n  - stage_id: 0\n    compilation_config: {mode: 3}\n", 3,
                        "stages[0].compilation_config.mode", "expected 0");
    expect_inline_error("stages:\n  - stage_id: 0\n    compilation_config: {cudagraph_mode: PIECEWISE}\n", 3,
                        "stages[0].compilation_config.cudagraph_mode", "FULL_DECODE_ONLY");
    expect_inline_error("stages:\n  - stage_id: 0\n    compilation_config: {custom_ops: [\"+rms_norm\"]}\n", 3,
                        "stages[0].compilation_config.custom_ops", "all");
    expect_inline_error("stages:\n  - stage_id: 0\n    input_connectors: {from_stage_1: c}\n", 3,
                        "stages[0].input_connectors.from_stage_1", "no input edge");
    expect_inline_error("stages:\n  - stage_id: 0\n    default_sampling_params:\n      extra_args: {cfg_role: uncond}\n",
                        4, "stages[0].default_sampling_params.extra_args.cfg_role", "cond");
    expect_inline_error("stages:\n  - stage_id: 1\n    default_sampling_params: {temperature: 1.0}\n", 3,
                        "stages[0].default_sampling_params.temperature", "expected 0.0");
    expect_inline_error("stages:\n  - stage_id: 0\n    default_sampling_params: {max_tokens: 9003}\n", 3,
                        "stages[0].default_sampling_params.max_tokens", "[3, 9002]");
    /* Checks across keys. */
    expect_inline_error("stages:\n  - {stage_id: 0, seed: 1}\n", 2, "stages[0].seed", "unknown key");
    expect_inline_error("stages:\n  - {stage_id: 0, default_sampling_params: {seed: 3}}\n"
                        "  - {stage_id: 1, default_sampling_params: {seed: 4}}\n",
                        3, "stages[1].default_sampling_params.seed", "expected 3");
    expect_inline_error("stages:\n  - stage_id: 0\n  - stage_id: 1\n    max_model_len: 10\n"
                        "    default_sampling_params: {max_tokens: 11}\n",
                        5, "stages[1].default_sampling_params.max_tokens", "at most max_model_len");
    expect_inline_error("stages:\n  - {stage_id: 0, gpu_memory_utilization: 0.7}\n"
                        "  - {stage_id: 1, gpu_memory_utilization: 0.5}\n",
                        3, "stages[1].gpu_memory_utilization", "share device 0");
    expect_inline_error("stages:\n  - {stage_id: 0, max_num_seqs: 64, max_num_batched_tokens: 32}\n"
                        "  - {stage_id: 1}\n", 2, "stages[0].max_num_batched_tokens", "at least max_num_seqs");
    expect_inline_error("backend: cpu\nstages:\n  - {stage_id: 0, dtype: float32}\n  - {stage_id: 1, dtype: bfloat16}\n",
                        4, "stages[1].dtype", "CPU");
    expect_inline_error("backend: cuda\nstages:\n  - {stage_id: 0, dtype: float32}\n  - {stage_id: 1}\n", 3,
                        "stages[0].dtype", "CPU backend");
    expect_inline_error("connectors:\n  a: {name: SharedMemoryConnector}\n  b: {name: SharedMemoryConnector}\n"
                        "stages:\n  - {stage_id: 0, output_connectors: {to_stage_1: a}}\n"
                        "  - {stage_id: 1, input_connectors: {from_stage_0: b}}\n",
                        6, "stages[1].input_connectors.from_stage_0", "same connector");
    /* YAML features a config has no use for. */
    expect_inline_error("a: &x 1\nb: *x\n", 2, "b:", "aliases");
    expect_inline_error("api: !!map {}\n", 1, "api", "tags");
    expect_inline_error("api: {}\n---\napi: {}\n", 2, "(top level)", "one YAML document");
    expect_inline_error("stages:\n  - stage_id: 0\n    devices: \"0\n", 4, "stages[0]", "YAML syntax error");
    expect_inline_error("api:\n  port: 1\n  port: 2\n", 3, "api.port", "duplicate key (first set at line 2)");
    expect_inline_error("api: {port: 80, port: 81}\n", 1, "api.port", "duplicate key");
    assert_int_equal(inline_failures, 0);
}

/* flow_shift (stage 1), mps (top level), mps_thread_percentage and stream_priority (either
 * stage): defaults, values read back, and refusals naming the key and the range. */
static void test_flow_shift_and_mps_keys(void **state)
{
    (void)state;
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - stage_id: 1\n", "k"), 0);
    const struct mm3_stage_config *s0 = mm3_deploy_stage(&deploy, 0), *s1 = mm3_deploy_stage(&deploy, 1);
    assert_true(s1->flow_shift == 0.0); /* the checkpoint's */
    assert_int_equal(deploy.mps, MM3_MPS_OFF);
    assert_int_equal(s0->mps_thread_percentage, 0);
    assert_int_equal(s1->mps_thread_percentage, 0);
    assert_int_equal(s0->stream_priority, MM3_STREAM_PRIORITY_NORMAL);
    assert_int_equal(s1->stream_priority, MM3_STREAM_PRIORITY_NORMAL);
    assert_int_equal(mm3_deploy_load_string(&deploy,
                                            "mps: auto\nstages:\n"
                                            "  - {stage_id: 0, mps_thread_percentage: 100, stream_priority: high}\n"
                                            "  - {stage_id: 1, flow_shift: 2.5, mps_thread_percentage: 40,"
                                            " stream_priority: low}\n",
                                            "k"),
                     0);
    assert_true(s1->flow_shift == 2.5);
    assert_int_equal(deploy.mps, MM3_MPS_AUTO);
    assert_int_equal(s0->mps_thread_percentage, 100);
    assert_int_equal(s1->mps_thread_percentage, 40);
    assert_int_equal(s0->stream_priority, MM3_STREAM_PRIORITY_HIGH);
    assert_int_equal(s1->stream_priority, MM3_STREAM_PRIORITY_LOW);
    assert_string_equal(mm3_mps_mode_name(MM3_MPS_ON), "on");
    assert_string_equal(mm3_stream_priority_name(MM3_STREAM_PRIORITY_LOW), "low");
    assert_int_equal(mm3_deploy_stream_priority_level(MM3_STREAM_PRIORITY_HIGH), 1);
    assert_int_equal(mm3_deploy_stream_priority_level(MM3_STREAM_PRIORITY_NORMAL), 0);
    assert_int_equal(mm3_deploy_stream_priority_level(MM3_STREAM_PRIORITY_LOW), -1);
    expect_inline_error("stages:\n  - {stage_id: 0, flow_shift: 2}\n", 2, "stages[0].flow_shift", "only stage 1");
    expect_inline_error("stages:\n  - {stage_id: 1, flow_shift: 0}\n", 2, "stages[0].flow_shift", "(0, 20]");
    expect_inline_error("stages:\n  - {stage_id: 1, flow_shift: 20.5}\n", 2, "stages[0].flow_shift", "(0, 20]");
    expect_inline_error("stages:\n  - {stage_id: 1, mps_thread_percentage: 0}\n", 2,
                        "stages[0].mps_thread_percentage", "[1, 100]");
    expect_inline_error("stages:\n  - {stage_id: 0, mps_thread_percentage: 101}\n", 2,
                        "stages[0].mps_thread_percentage", "[1, 100]");
    expect_inline_error("stages:\n  - {stage_id: 0, stream_priority: urgent}\n", 2, "stages[0].stream_priority",
                        "normal, high, low");
    expect_inline_error("mps: yes\n", 1, "mps", "off, auto, on");
    assert_int_equal(inline_failures, 0);
}

/* stages[1].window_order: deadline by default, fifo read back, stage 0 and other words refused. */
/* Stage-1 workers: one per device of stage 1's devices, or replicas on one device; the
 * key is stage 1's, a devices list and a different replicas count conflict, and workers
 * sharing a device share its memory. */
static void test_stage1_workers_key(void **state)
{
    (void)state;
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - stage_id: 1\n", "k"), 0);
    assert_int_equal(mm3_deploy_stage1_workers(&deploy), 1);
    assert_int_equal(mm3_deploy_load_string(&deploy,
                                            "backend: cuda\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
                                            "  - {stage_id: 1, devices: \"1,2,3\", gpu_memory_utilization: 0.6}\n",
                                            "k"),
                     0);
    assert_int_equal(mm3_deploy_stage1_workers(&deploy), 3);
    assert_int_equal(mm3_deploy_stage1_worker_device(&deploy, 0), 1);
    assert_int_equal(mm3_deploy_stage1_worker_device(&deploy, 2), 3);
    assert_false(has_warning(&deploy, "does not split a stage"));
    assert_int_equal(mm3_deploy_load_string(&deploy,
                                            "backend: cpu\nstages:\n  - {stage_id: 0, dtype: float32}\n"
                                            "  - {stage_id: 1, replicas: 2}\n",
                                            "k"),
                     0);
    assert_int_equal(mm3_deploy_stage1_workers(&deploy), 2);
    assert_int_equal(mm3_deploy_stage1_worker_device(&deploy, 1), 0);
    expect_inline_error("stages:\n  - {stage_id: 0, replicas: 2}\n", 2, "stages[0].replicas", "only stage 1");
    expect_inline_error("stages:\n  - {stage_id: 1, replicas: 0}\n", 2, "stages[0].replicas", "1");
    expect_inline_error("stages:\n  - stage_id: 0\n  - {stage_id: 1, devices: \"1,2\", replicas: 3}\n", 3,
                        "stages[1].replicas", "one worker per device");
    expect_inline_error("backend: cuda\nstages:\n  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.5}\n"
                        "  - {stage_id: 1, devices: \"1\", replicas: 3, gpu_memory_utilization: 0.4}\n",
                        4, "stages[1].gpu_memory_utilization", "3 stage-1 worker(s) x 0.4");
    assert_int_equal(inline_failures, 0);
}

static void test_window_order_key(void **state)
{
    (void)state;
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - stage_id: 1\n", "k"), 0);
    assert_int_equal(mm3_deploy_stage(&deploy, 1)->window_order, MM3_WINDOW_ORDER_DEADLINE);
    assert_int_equal(
        mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - {stage_id: 1, window_order: fifo}\n", "k"), 0);
    assert_int_equal(mm3_deploy_stage(&deploy, 1)->window_order, MM3_WINDOW_ORDER_FIFO);
    assert_string_equal(mm3_window_order_name(MM3_WINDOW_ORDER_DEADLINE), "deadline");
    expect_inline_error("stages:\n  - {stage_id: 0, window_order: fifo}\n", 2, "stages[0].window_order",
                        "only stage 1");
    expect_inline_error("stages:\n  - {stage_id: 1, window_order: edf}\n", 2, "stages[0].window_order",
                        "deadline, fifo");
    assert_int_equal(inline_failures, 0);
}

static void test_warnings_and_backend(void **state)
{
    (void)state;
    const char *yaml =
        "connectors:\n"
        "  spare: {name: SharedMemoryConnector}\n"
        "stages:\n"
        "  - stage_id: 0\n"
        "    max_num_seqs: 16\n"
        "    max_num_batched_tokens: 4096\n"
        "    enforce_eager: false\n"
        "    compilation_config: {cudagraph_capture_sizes: [2, 4, 8]}\n"
        "    devices: \"0, 1\"\n"
        "  - stage_id: 1\n";
    assert_int_equal(mm3_deploy_load_string(&deploy, yaml, "w"), 0);
    assert_true(has_warning(&deploy, "w:2:3: connectors.spare: connector is not used"));
    assert_true(has_warning(&deploy, "w:6:"));  /* batched tokens below a prompt pair */
    assert_true(has_warning(&deploy, "w:8:"));  /* largest capture size below max_num_seqs */
    assert_true(has_warning(&deploy, "w:9:"));  /* two devices, one used */
    const struct mm3_stage_config *s0 = mm3_deploy_stage(&deploy, 0);
    assert_int_equal(s0->n_devices, 2);
    assert_int_equal(s0->devices[1], 1);
    assert_string_equal(mm3_deploy_edge_connector(&deploy)->name, "(default)");

    /* auto resolves by GPU presence, and the CPU backend is float32 only. */
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - stage_id: 1\n", "b"), 0);
    assert_int_equal(mm3_deploy_resolve_backend(&deploy, true), 0);
    assert_int_equal(deploy.backend, MM3_BACKEND_CUDA);
    assert_int_equal(mm3_deploy_load_string(&deploy, "stages:\n  - stage_id: 0\n  - stage_id: 1\n", "b"), 0);
    assert_true(mm3_deploy_resolve_backend(&deploy, false) < 0);
    assert_non_null(strstr(mm3_last_error(), "stage 0 dtype"));
    assert_int_equal(mm3_deploy_load_string(&deploy, "backend: cuda\nstages:\n  - stage_id: 0\n  - stage_id: 1\n",
                                            "b"), 0);
    assert_int_equal(mm3_deploy_resolve_backend(&deploy, false), -ENODEV);

    /* An empty value counts as an empty mapping; a quoted number is not a number. */
    assert_int_equal(mm3_deploy_load_string(&deploy, "api:\nstages:\n  - stage_id: 0\n    default_sampling_params:\n"
                                                     "  - stage_id: 1\n", "e"), 0);
    inline_failures = 0;
    expect_inline_error("stages:\n  - {stage_id: 0, max_num_seqs: \"8\"}\n", 2, "stages[0].max_num_seqs", "'8'");
    assert_int_equal(inline_failures, 0);
}

static void test_missing_file(void **state)
{
    (void)state;
    assert_int_equal(mm3_deploy_load(&deploy, "/nonexistent/deploy.yaml"), -ENOENT);
    assert_non_null(strstr(mm3_last_error(), "/nonexistent/deploy.yaml"));
    mm3_deploy_free(&deploy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_configs_load),
        cmocka_unit_test(test_one_gpu_config_values),
        cmocka_unit_test(test_tiny_cpu_config_values),
        cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_flow_shift_and_mps_keys),
        cmocka_unit_test(test_window_order_key),
        cmocka_unit_test(test_kv_cache_dtype_key),
        cmocka_unit_test(test_bad_files_rejected),
        cmocka_unit_test(test_short_context_warns),
        cmocka_unit_test(test_inline_errors),
        cmocka_unit_test(test_warnings_and_backend),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_stage1_workers_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
