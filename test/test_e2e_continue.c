/* Continuing a song (continue_from, docs/api.md) end to end on the CPU with tiny-a,
 * served by scripts/launch.sh with a journal:
 *   - a song of N frames continued by M frames equals, byte for byte, the song of N + M
 *     frames generated at once with the same seed: the journaled codes of every step and
 *     the whole audio ("return": "whole"); the new part alone ("return": "new") is the
 *     whole song's audio from N frames' time on;
 *   - a continuation is itself kept: continuing it again equals the longer song too;
 *   - the first song's journal file uploaded (continue_journal) continues it the same way;
 *     a cut or corrupt upload, or one that is not base64, is a 400 naming the field;
 *   - errors name the field: an id of the wrong form (400), an unknown id (404), a seed
 *     or a caption that differs from the song's (400), a length past the longest song
 *     (the deploy file's 4000 frames: 400), `return` without continue_from (400), a song
 *     still streaming (409).
 * Skips (77) without the golden directory or the programs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/http_client.h"
#include "stage0/api/base64.h"
#include "stage0/recovery/journal.h"
#include "support/test_replica.h"
#include "support/test_support.h"

#define N_FIRST 60 /* frames of the first song (2.4 s at 25 fps) */
#define N_MORE 40  /* frames the continuation adds */
#define N_AGAIN 30 /* frames a second continuation adds */
#define SEED 11
#define PCM_RATE 44100
#define FPS 25

struct cont {
    char *tmp;
    char ckpt[1024];
    char journal_dir[1200];
    struct test_replica r;
};

static const char *k_text = "\"input\": \"[verse]\\nkeep on going\\n\", \"instructions\": \"a calm piano piece\"";

static int group_setup(void **state)
{
    const char *g = test_golden_dir();
    if (!g) return 0;
    struct cont *c = calloc(1, sizeof *c);
    snprintf(c->ckpt, sizeof c->ckpt, "%s/checkpoint", g);
    c->tmp = test_make_tmpdir("e2e_continue");
    snprintf(c->journal_dir, sizeof c->journal_dir, "%s/journal", c->tmp);
    char *yaml = test_replica_cpu_deploy(c->ckpt, 1, 1, c->journal_dir, 8, 4, 120, 6000, 3000);
    int rc = yaml ? test_replica_start(&c->r, c->tmp, "a", "e2ec", yaml, NULL) : -1;
    free(yaml);
    if (rc < 0) {
        fprintf(stderr, "replica did not start\n");
        return -1;
    }
    *state = c;
    return 0;
}

static int group_teardown(void **state)
{
    struct cont *c = *state;
    if (!c) return 0;
    int rc = test_replica_stop(&c->r);
    free(c->tmp);
    free(c);
    return rc == 0 ? 0 : -1;
}

static int skip_without_golden(void **state)
{
    if (!*state) skip();
    return 0;
}

/* POST body; the response in resp (caller frees). */
static void post(struct cont *c, const char *body, struct http_client_response *resp)
{
    assert_int_equal(test_replica_post(&c->r, body, 120000, resp), 0);
}

/* A whole WAV answer: 200, its request id into id, its 16-bit stereo data (caller frees). */
static uint8_t *song(struct cont *c, const char *body, char *id, size_t *len)
{
    struct http_client_response resp;
    post(c, body, &resp);
    if (resp.status != 200) fprintf(stderr, "%d: %s\n", resp.status, resp.body ? resp.body : "");
    assert_int_equal(resp.status, 200);
    assert_true(resp.complete);
    const char *rid = http_client_header(&resp, "X-Request-Id");
    assert_non_null(rid);
    if (id) snprintf(id, MM3_JOB_PUBLIC_ID_LEN + 1, "%s", rid);
    assert_true(resp.body_len > 44);
    assert_memory_equal(resp.body + 36, "data", 4);
    *len = resp.body_len - 44;
    uint8_t *pcm = malloc(*len);
    memcpy(pcm, resp.body + 44, *len);
    http_client_response_free(&resp);
    return pcm;
}

/* The status and the error's param of a refused request. */
static int refused(struct cont *c, const char *body, char *param, size_t cap)
{
    struct http_client_response resp;
    post(c, body, &resp);
    int st = resp.status;
    param[0] = 0;
    const char *p = resp.body ? strstr(resp.body, "\"param\"") : NULL;
    if (p && (p = strchr(p + 7, '"'))) sscanf(p + 1, "%31[^\"]", param);
    if (st != 200 && (!param[0] || cap < 2)) fprintf(stderr, "%d: %s\n", st, resp.body ? resp.body : "");
    http_client_response_free(&resp);
    return st;
}

/* A refused request's status; its error names param and its message holds needle. */
static int refused_saying(struct cont *c, const char *body, const char *param, const char *needle)
{
    struct http_client_response resp;
    post(c, body, &resp);
    int st = resp.status;
    if (!resp.body || !strstr(resp.body, param) || !strstr(resp.body, needle))
        fail_msg("%d %s: wanted param %s and '%s'", st, resp.body ? resp.body : "", param, needle);
    http_client_response_free(&resp);
    return st;
}

/* A journal of the song rec (its codes) with other parameters or prompt ids, as a file's
 * bytes (caller frees). */
static uint8_t *crafted_journal(struct cont *c, const struct journal_record *rec, int steps, const int32_t *ids,
                                int prompt_len, size_t *len)
{
    static int k;
    struct mm3_job_params p = rec->h.params;
    p.num_inference_steps = steps;
    char id[32];
    snprintf(id, sizeof id, "crafted-%d", k++);
    struct journal *w;
    assert_int_equal(journal_open_write(&w, c->tmp, id, &p, rec->h.n_codebooks, rec->h.audio_vocab, ids, prompt_len),
                     0);
    assert_int_equal(journal_append_codes(w, rec->codes, rec->n_steps), 0);
    char *path = strdup(journal_path(w));
    assert_int_equal(journal_close(w, JOURNAL_DONE, JOURNAL_STOP_BUDGET, rec->n_steps - 1), 0);
    uint8_t *b = (uint8_t *)test_file_read(path, len);
    assert_non_null(b);
    free(path);
    return b;
}

/* Every finished journal of the folder with n_steps steps, its codes into codes[k]
 * (*ncb codes a step). */
static int journals_with_steps(const char *dir, int n_steps, int32_t **codes, int max, int *ncb)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int k = 0;
    struct dirent *de;
    while ((de = readdir(d)) && k < max) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".mm3j") != 0) continue;
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct journal_record rec;
        assert_int_equal(journal_read(path, &rec), 0);
        if (rec.n_steps == n_steps) {
            *ncb = rec.h.n_codebooks;
            size_t bytes = sizeof(int32_t) * (size_t)n_steps * rec.h.n_codebooks;
            codes[k] = malloc(bytes);
            memcpy(codes[k++], rec.codes, bytes);
        }
        journal_record_free(&rec);
    }
    closedir(d);
    return k;
}

/* The bytes of the one journal of the folder with n_steps steps (caller frees). */
static uint8_t *journal_file_with_steps(const char *dir, int n_steps, size_t *len)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    uint8_t *bytes = NULL;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".mm3j") != 0) continue;
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct journal_record rec;
        assert_int_equal(journal_read(path, &rec), 0);
        if (rec.n_steps == n_steps) {
            assert_null(bytes);
            bytes = (uint8_t *)test_file_read(path, len);
        }
        journal_record_free(&rec);
    }
    closedir(d);
    assert_non_null(bytes);
    return bytes;
}

/* A body continuing the uploaded journal file bytes[len] by N_MORE frames, whole. */
static char *upload_body(const uint8_t *bytes, size_t len)
{
    char *b64, *body;
    assert_int_equal(base64_encode(bytes, len, &b64), 0);
    assert_true(asprintf(&body,
                         "{\"continue_journal\": \"%s\", \"max_new_tokens\": %d, \"return\": \"whole\", "
                         "\"ignore_eos\": true}",
                         b64, N_MORE) > 0);
    free(b64);
    return body;
}

static void test_continue_equals_one_shot(void **state)
{
    struct cont *c = *state;
    char body[1024], first_id[64], whole_id[64];
    size_t first_len, whole_len, new_len, once_len;
    snprintf(body, sizeof body, "{%s, \"max_new_tokens\": %d, \"seed\": %d, \"ignore_eos\": true}", k_text, N_FIRST,
             SEED);
    uint8_t *first = song(c, body, first_id, &first_len);

    snprintf(body, sizeof body,
             "{\"continue_from\": \"%s\", \"max_new_tokens\": %d, \"return\": \"whole\", \"ignore_eos\": true}",
             first_id, N_MORE);
    uint8_t *whole = song(c, body, whole_id, &whole_len);
    snprintf(body, sizeof body, "{\"continue_from\": \"%s\", \"max_new_tokens\": %d, \"ignore_eos\": true}", first_id,
             N_MORE);
    uint8_t *fresh = song(c, body, NULL, &new_len);
    snprintf(body, sizeof body, "{%s, \"max_new_tokens\": %d, \"seed\": %d, \"ignore_eos\": true}", k_text,
             N_FIRST + N_MORE, SEED);
    uint8_t *once = song(c, body, NULL, &once_len);

    /* the whole continued song is the longer song, sample for sample */
    assert_int_equal(whole_len, once_len);
    assert_memory_equal(whole, once, once_len);
    /* the new part is the longer song from N_FIRST frames' time on */
    size_t skip = (size_t)N_FIRST * (PCM_RATE / FPS) * 4;
    assert_int_equal(new_len, once_len - skip);
    assert_memory_equal(fresh, once + skip, new_len);

    /* the codes of every step, journaled: the two continuations and the one-shot song */
    int32_t *codes[8] = {0};
    int ncb = 0;
    int n = journals_with_steps(c->journal_dir, N_FIRST + N_MORE + 1, codes, 8, &ncb);
    assert_int_equal(n, 3);
    size_t bytes = sizeof(int32_t) * (N_FIRST + N_MORE + 1) * ncb;
    for (int k = 1; k < n; k++)
        assert_memory_equal(codes[k], codes[0], bytes);
    for (int k = 0; k < n; k++)
        free(codes[k]);

    /* the first song's journal file, uploaded, continues it the same way */
    size_t jlen, up_len;
    uint8_t *jbytes = journal_file_with_steps(c->journal_dir, N_FIRST + 1, &jlen);
    char *up = upload_body(jbytes, jlen);
    uint8_t *uploaded = song(c, up, NULL, &up_len);
    free(up);
    assert_int_equal(up_len, once_len);
    assert_memory_equal(uploaded, once, once_len);
    free(uploaded);
    /* cut, or a byte flipped in its codes: the file is refused, naming the field */
    char param[32];
    up = upload_body(jbytes, jlen - 30);
    assert_int_equal(refused(c, up, param, sizeof param), 400);
    assert_string_equal(param, "continue_journal");
    free(up);
    /* a journal whose parameters stage 1 must not get, or written for another prompt */
    struct journal_record first_rec;
    assert_int_equal(journal_read_buffer("first", jbytes, jlen, 100000, &first_rec), 0);
    const int32_t other_ids[2] = {1, 1};
    size_t clen;
    uint8_t *crafted = crafted_journal(c, &first_rec, 100000, other_ids, 1, &clen);
    up = upload_body(crafted, clen);
    assert_int_equal(refused_saying(c, up, "continue_journal", "num_inference_steps"), 400);
    free(up), free(crafted);
    crafted = crafted_journal(c, &first_rec, first_rec.h.params.num_inference_steps, other_ids, 1, &clen);
    up = upload_body(crafted, clen);
    assert_int_equal(refused_saying(c, up, "continue_journal", "another prompt"), 400);
    free(up), free(crafted);
    journal_record_free(&first_rec);
    jbytes[jlen - 40] ^= 0x10;
    up = upload_body(jbytes, jlen);
    assert_int_equal(refused(c, up, param, sizeof param), 400);
    assert_string_equal(param, "continue_journal");
    free(up);
    free(jbytes);

    /* a continuation is kept in turn: continued again it is the still longer song */
    snprintf(body, sizeof body,
             "{\"continue_from\": \"%s\", \"max_new_tokens\": %d, \"return\": \"whole\", \"ignore_eos\": true, "
             "\"seed\": %d, %s}",
             whole_id, N_AGAIN, SEED, k_text);
    size_t again_len, longer_len;
    uint8_t *again = song(c, body, NULL, &again_len);
    snprintf(body, sizeof body, "{%s, \"max_new_tokens\": %d, \"seed\": %d, \"ignore_eos\": true}", k_text,
             N_FIRST + N_MORE + N_AGAIN, SEED);
    uint8_t *longer = song(c, body, NULL, &longer_len);
    assert_int_equal(again_len, longer_len);
    assert_memory_equal(again, longer, longer_len);
    free(first), free(whole), free(fresh), free(once), free(again), free(longer);
}

/* Streamed song in progress: its id is continued from inside the header callback. */
struct running {
    struct cont *c;
    int status;
    char param[32];
};

static int on_running_headers(void *user, const struct http_client_response *resp)
{
    struct running *r = user;
    const char *id = http_client_header(resp, "X-Request-Id");
    if (!id) return -1;
    char body[256];
    snprintf(body, sizeof body, "{\"continue_from\": \"%s\", \"max_new_tokens\": 10}", id);
    r->status = refused(r->c, body, r->param, sizeof r->param);
    return -1; /* done with it: the client goes away, the song is cancelled */
}

static int discard(void *user, const void *data, size_t n)
{
    (void)user, (void)data, (void)n;
    return 0;
}

static void test_errors_name_the_field(void **state)
{
    struct cont *c = *state;
    char body[1024], param[32], id[64];
    snprintf(body, sizeof body, "{\"continue_from\": \"12ab\", \"max_new_tokens\": 10}");
    assert_int_equal(refused(c, body, param, sizeof param), 400);
    assert_string_equal(param, "continue_from");
    snprintf(body, sizeof body, "{\"continue_from\": \"%032d\", \"max_new_tokens\": 10}", 7);
    assert_int_equal(refused(c, body, param, sizeof param), 404);
    assert_string_equal(param, "continue_from");
    snprintf(body, sizeof body, "{%s, \"max_new_tokens\": 10, \"return\": \"whole\"}", k_text);
    assert_int_equal(refused(c, body, param, sizeof param), 400);
    assert_string_equal(param, "return");
    snprintf(body, sizeof body, "{\"continue_journal\": \"not base64!\", \"max_new_tokens\": 10}");
    assert_int_equal(refused(c, body, param, sizeof param), 400);
    assert_string_equal(param, "continue_journal");
    snprintf(body, sizeof body, "{\"continue_journal\": \"TU0zSlJOTAA=\", \"max_new_tokens\": 10}");
    assert_int_equal(refused(c, body, param, sizeof param), 400); /* the magic alone */
    assert_string_equal(param, "continue_journal");

    size_t len;
    snprintf(body, sizeof body, "{%s, \"max_new_tokens\": 20, \"seed\": 3}", k_text);
    free(song(c, body, id, &len));
    snprintf(body, sizeof body, "{\"continue_from\": \"%s\", \"max_new_tokens\": 10, \"seed\": 4}", id);
    assert_int_equal(refused(c, body, param, sizeof param), 400);
    assert_string_equal(param, "seed");
    snprintf(body, sizeof body,
             "{\"continue_from\": \"%s\", \"max_new_tokens\": 10, \"instructions\": \"another caption\"}", id);
    assert_int_equal(refused(c, body, param, sizeof param), 400);
    assert_string_equal(param, "instructions");
    snprintf(body, sizeof body, "{\"continue_from\": \"%s\", \"max_new_tokens\": 3990}", id);
    assert_int_equal(refused(c, body, param, sizeof param), 400);
    assert_string_equal(param, "duration_s");
    snprintf(body, sizeof body, "{\"continue_from\": \"%s\", \"max_new_tokens\": 10, \"return\": \"all\"}", id);
    assert_int_equal(refused(c, body, param, sizeof param), 400);
    assert_string_equal(param, "return");

    /* a song still streaming: 409 */
    struct running run = {.c = c};
    char url[256];
    snprintf(url, sizeof url, "%s/v1/audio/speech", c->r.url);
    snprintf(body, sizeof body, "{%s, \"max_new_tokens\": 600, \"ignore_eos\": true, \"stream\": true}", k_text);
    struct http_client_response resp;
    http_client_request(&(struct http_client_request){.url = url,
                                                      .method = "POST",
                                                      .body = body,
                                                      .body_len = strlen(body),
                                                      .timeout_ms = 120000,
                                                      .on_headers = on_running_headers,
                                                      .on_body = discard,
                                                      .user = &run},
                        &resp);
    http_client_response_free(&resp);
    assert_int_equal(run.status, 409);
    assert_string_equal(run.param, "continue_from");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_continue_equals_one_shot, skip_without_golden),
        cmocka_unit_test_setup(test_errors_name_the_field, skip_without_golden),
    };
    if (!test_golden_dir()) return 77;
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
