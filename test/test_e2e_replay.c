/* The golden cases replayed through the two served processes: with MM3_ALLOW_REPLAY=1
 * a request's x_replay_file forces the recorded draws in stage 0 and the recorded
 * window noise in stage 1, so the HTTP answer must be the reference pipeline's
 * `audio` (the pipeline itself adds no error). Without the variable the field is a
 * 400 naming it. Skips (77) without the golden directory or the programs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/http_client.h"
#include "common/safetensors.h"
#include "support/test_replica.h"
#include "support/test_support.h"

struct env {
    char *tmp;
    char ckpt[1024];
    struct test_replica on, off; /* MM3_ALLOW_REPLAY=1 / unset */
};

/* The deploy file of both replicas (caller frees), or NULL: replay files may come
 * from the golden folder only. */
static char *deploy_text(const char *ckpt)
{
    char *base = test_replica_cpu_deploy(ckpt, 1, 1, NULL, 2, 2, 300, 6000, 3000);
    char *at = base ? strstr(base, "  journal_dir:") : NULL;
    char *text = NULL;
    if (at && asprintf(&text, "%.*s  replay_dir: \"%s\"\n%s", (int)(at - base), base, test_golden_dir(), at) < 0)
        text = NULL;
    free(base);
    return text;
}

/* Start a replica, with MM3_ALLOW_REPLAY=1 or without it; 0 once it printed READY. */
static int replica_start(struct test_replica *r, const char *tmp, const char *tag, const char *ckpt, int allow_replay)
{
    char *yaml = deploy_text(ckpt);
    const char *env[] = {"MM3_ALLOW_REPLAY", allow_replay ? "1" : NULL, NULL};
    int rc = yaml ? test_replica_start(r, tmp, tag, "rp", yaml, env) : -1;
    free(yaml);
    return rc;
}

static int post(const struct test_replica *r, const char *json, struct http_client_response *resp)
{
    return test_replica_post(r, json, 300000, resp);
}

/* The request of manifest case jc, replaying case file `path`. */
static char *case_request(json_t *jc, const char *path)
{
    json_t *o = json_pack("{s:O, s:O, s:O, s:O, s:O, s:s, s:s}", "caption", json_object_get(jc, "prompt"), "lyrics",
                          json_object_get(jc, "lyrics"), "duration_s", json_object_get(jc, "audio_duration"),
                          "num_inference_steps", json_object_get(jc, "num_inference_steps"), "seed",
                          json_object_get(jc, "seed"), "response_format", "pcm", "x_replay_file", path);
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static int group_setup(void **state)
{
    const char *g = test_golden_dir();
    char probe[1200];
    snprintf(probe, sizeof probe, "%s/mm3-stage1", test_bin_dir());
    if (!g || access(probe, X_OK)) return 0;
    struct env *e = calloc(1, sizeof *e);
    if (!e) return -1;
    snprintf(e->ckpt, sizeof e->ckpt, "%s/checkpoint", g);
    e->tmp = test_make_tmpdir("e2e_replay");
    if (replica_start(&e->on, e->tmp, "on", e->ckpt, 1) < 0 || replica_start(&e->off, e->tmp, "off", e->ckpt, 0) < 0) {
        test_replica_stop(&e->on);
        test_replica_stop(&e->off);
        free(e->tmp);
        free(e);
        return -1;
    }
    *state = e;
    return 0;
}

static int group_teardown(void **state)
{
    struct env *e = *state;
    if (!e) return 0;
    int rc = test_replica_stop(&e->on) | test_replica_stop(&e->off);
    test_remove_tree(e->tmp);
    free(e->tmp);
    free(e);
    return rc;
}

static void test_cases_replay_to_golden_audio(void **state)
{
    struct env *e = *state;
    if (!e) skip();
    char mpath[1200];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", test_golden_dir());
    json_error_t jerr;
    json_t *man = json_load_file(mpath, 0, &jerr);
    assert_non_null(man);
    json_t *cases = json_object_get(man, "cases");
    assert_true(json_array_size(cases) > 0);
    size_t i;
    json_t *jc;
    json_array_foreach(cases, i, jc)
    {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", test_golden_dir(), json_string_value(json_object_get(jc, "file")));
        char *req = case_request(jc, path);
        assert_non_null(req);
        struct http_client_response resp;
        assert_int_equal(post(&e->on, req, &resp), 0);
        if (resp.status != 200) fprintf(stderr, "case %zu: %d: %s\n", i, resp.status, resp.body ? resp.body : "");
        assert_int_equal(resp.status, 200);
        assert_true(resp.complete);

        struct st_file f;
        assert_int_equal(st_file_open(&f, path), 0);
        float *gold = NULL;
        int nd;
        int64_t sh[ST_MAX_DIMS];
        assert_int_equal(st_file_load_f32(&f, "audio", &gold, &nd, sh), 0);
        st_file_close(&f);
        assert_int_equal(nd, 2);
        assert_int_equal(sh[0], 2);
        size_t S = (size_t)sh[1];
        /* raw PCM16 LE, interleaved stereo: the same length as the reference */
        assert_int_equal(resp.body_len, 4 * S);
        const uint8_t *b = (const uint8_t *)resp.body;
        float *got = malloc(sizeof(float) * 2 * S);
        assert_non_null(got);
        for (size_t k = 0; k < S; k++)
            for (int c = 0; c < 2; c++) {
                const uint8_t *p = b + 4 * k + 2 * (size_t)c;
                got[(size_t)c * S + k] = (float)(int16_t)(p[0] | p[1] << 8) / 32767.0f;
            }
        /* PCM16 rounding alone costs about 3e-5 relative on these waveforms (half a
         * step of 1/32767 against an RMS near 0.1), inside the 1e-4 of the float path. */
        double rel = test_rel_error(got, gold, 2 * S);
        fprintf(stderr, "case %zu: %zu samples, rel %.3g\n", i, S, rel);
        assert_true(rel <= 1e-4);
        free(got);
        free(gold);
        free(req);
        http_client_response_free(&resp);
    }
    json_decref(man);
}

static void test_replay_field_refused_when_not_enabled(void **state)
{
    struct env *e = *state;
    if (!e) skip();
    char path[1200];
    snprintf(path, sizeof path, "%s/case0.safetensors", test_golden_dir());
    char req[2048];
    snprintf(req, sizeof req, "{\"caption\":\"x\",\"lyrics\":\"y\",\"duration_s\":1,\"x_replay_file\":\"%s\"}", path);
    struct http_client_response resp;
    assert_int_equal(post(&e->off, req, &resp), 0);
    assert_int_equal(resp.status, 400);
    assert_non_null(resp.body);
    assert_non_null(strstr(resp.body, "x_replay_file"));
    http_client_response_free(&resp);
}

/* Enabled, a file outside api.replay_dir is a 400 that says nothing of its bytes or
 * size (the old answer quoted both), and the replica keeps serving. */
static void test_replay_outside_folder_refused(void **state)
{
    struct env *e = *state;
    if (!e) skip();
    char secret[1200];
    snprintf(secret, sizeof secret, "%s/shadow", e->tmp);
    FILE *f = fopen(secret, "wb");
    assert_non_null(f);
    fputs("root:$6$SECRETHASH:19000:0:99999:7:::\n", f);
    fclose(f);
    char req[2048];
    snprintf(req, sizeof req, "{\"caption\":\"x\",\"lyrics\":\"y\",\"duration_s\":1,\"x_replay_file\":\"%s\"}", secret);
    struct http_client_response resp;
    assert_int_equal(post(&e->on, req, &resp), 0);
    assert_int_equal(resp.status, 400);
    assert_non_null(resp.body);
    assert_non_null(strstr(resp.body, "x_replay_file"));
    assert_null(strstr(resp.body, "SECRET"));
    assert_null(strstr(resp.body, "root:"));
    assert_null(strstr(resp.body, "bytes"));
    http_client_response_free(&resp);
    snprintf(req, sizeof req, "{\"caption\":\"x\",\"lyrics\":\"y\",\"duration_s\":1,\"x_replay_file\":\"%s\"}",
             "../../../../../../../../etc/passwd");
    assert_int_equal(post(&e->on, req, &resp), 0);
    assert_int_equal(resp.status, 400);
    assert_null(strstr(resp.body, "root:"));
    http_client_response_free(&resp);
}

int main(void)
{
    if (!test_golden_dir()) return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_field_refused_when_not_enabled),
        cmocka_unit_test(test_replay_outside_folder_refused),
        cmocka_unit_test(test_cases_replay_to_golden_audio),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
