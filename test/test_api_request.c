/* Request parsing for POST /v1/audio/speech: every field, every error names its
 * field, the compat/our-name pairs, and the duration -> frames rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/replay_file.h"
#include "common/safetensors.h"
#include "stage0/api/api_request.h"
#include "support/test_support.h"

static struct api_limits lim;

static int parse(const char *json, struct mm3_job_params *p, char *field)
{
    return api_request_parse(json, strlen(json), &lim, p, field, 64);
}

/* The body must fail, name `field` and say something containing `needle`. */
static void expect_bad(const char *json, const char *field, const char *needle)
{
    struct mm3_job_params p;
    char f[64];
    int rc = parse(json, &p, f);
    if (rc != -EINVAL) fail_msg("accepted: %s", json);
    if (strcmp(f, field) != 0) fail_msg("%s: field '%s', want '%s' (%s)", json, f, field, mm3_last_error());
    if (!strstr(mm3_last_error(), needle)) fail_msg("%s: message '%s' lacks '%s'", json, mm3_last_error(), needle);
    assert_null(p.lyrics);
    assert_null(p.caption);
}

#define BASE "\"input\":\"[verse]\\nhello\",\"instructions\":\"pop\""

static void test_defaults(void **state)
{
    struct mm3_job_params p;
    char f[64];
    assert_int_equal(parse("{" BASE "}", &p, f), 0);
    assert_string_equal(p.lyrics, "[verse]\nhello");
    assert_string_equal(p.caption, "pop");
    assert_int_equal(p.max_frames, 9000);
    assert_int_equal(p.seed, 0);
    assert_int_equal(p.sample_rate, 44100);
    assert_int_equal(p.num_inference_steps, 30);
    assert_true(p.guidance_scale == 1.7f);
    assert_true(p.cfg_scale == 1.5f);
    assert_int_equal(p.format, MM3_AUDIO_WAV);
    assert_false(p.stream);
    assert_false(p.ignore_eos);
    assert_false(p.allow_stall);
    mm3_job_params_free(&p);

    lim.default_frames = 750; /* the defaults are configurable */
    lim.default_sample_rate = 32000;
    assert_int_equal(parse("{" BASE "}", &p, f), 0);
    assert_int_equal(p.max_frames, 750);
    assert_int_equal(p.sample_rate, 32000);
    mm3_job_params_free(&p);
    api_limits_default(&lim);
}

/* Fields left out take the operator's defaults (deploy file), not the recipe's constants. */
static void test_deploy_defaults(void **state)
{
    (void)state;
    struct api_limits saved = lim;
    lim.default_seed = 1234;
    lim.default_steps = 8;
    lim.default_guidance_scale = 2.5f;
    lim.default_cfg_scale = 1.25f;
    lim.default_flow_shift = 1.5f;
    struct mm3_job_params p;
    char f[64];
    assert_int_equal(parse("{\"input\":\"la\",\"instructions\":\"pop\"}", &p, f), 0);
    assert_int_equal(p.seed, 1234);
    assert_int_equal(p.num_inference_steps, 8);
    assert_true(p.guidance_scale == 2.5f && p.cfg_scale == 1.25f && p.flow_shift == 1.5f);
    mm3_job_params_free(&p);
    assert_int_equal(parse("{\"input\":\"la\",\"instructions\":\"pop\",\"seed\":5,\"num_inference_steps\":3,"
                           "\"guidance_scale\":1.0,\"cfg_scale\":1.5,\"flow_shift\":2}", &p, f), 0);
    assert_int_equal(p.seed, 5);
    assert_int_equal(p.num_inference_steps, 3);
    assert_true(p.guidance_scale == 1.0f && p.cfg_scale == 1.5f && p.flow_shift == 2.0f);
    mm3_job_params_free(&p);
    lim = saved;
}

static void test_all_fields(void **state)
{
    struct mm3_job_params p;
    char f[64];
    assert_int_equal(parse("{\"lyrics\":\"la\",\"caption\":\"jazz\",\"duration_s\":60.5,\"seed\":42,"
                           "\"response_format\":\"flac\",\"sample_rate\":32000,"
                           "\"num_inference_steps\":8,\"guidance_scale\":2,\"cfg_scale\":1.25,"
                           "\"stream\":true,\"stream_format\":\"audio\",\"model\":\"anything\",\"ignore_eos\":true,"
                           "\"allow_stall\":true,"
                           "\"voice\":\"default\",\"speed\":1.0,\"temperature\":null}",
                           &p, f),
                     0);
    assert_string_equal(p.lyrics, "la");
    assert_string_equal(p.caption, "jazz");
    assert_int_equal(p.max_frames, 1512); /* int(60.5 * 25), as the ComfyUI node */
    assert_int_equal(p.seed, 42);
    assert_int_equal(p.format, MM3_AUDIO_FLAC);
    assert_int_equal(p.sample_rate, 32000);
    assert_int_equal(p.num_inference_steps, 8);
    assert_true(p.guidance_scale == 2.0f);
    assert_true(p.cfg_scale == 1.25f);
    assert_true(p.flow_shift == 0.0f); /* not given: stage 1's default */
    assert_true(p.stream);
    assert_true(p.ignore_eos);
    assert_true(p.allow_stall);
    mm3_job_params_free(&p);

    assert_int_equal(parse("{" BASE ",\"max_new_tokens\":1,\"response_format\":\"pcm\",\"voice\":\"\"}", &p, f), 0);
    assert_int_equal(p.max_frames, 1);
    assert_int_equal(p.format, MM3_AUDIO_PCM);
    mm3_job_params_free(&p);
}

static void test_duration_rules(void **state)
{
    struct mm3_job_params p;
    char f[64];
    struct {
        const char *d;
        int frames;
    } ok[] = {
        {"0.04", 1}, {"1", 25}, {"1.039", 25}, {"360", 9000}, {"359.99", 8999}, {"30", 750},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char json[256];
        snprintf(json, sizeof json, "{" BASE ",\"duration_s\":%s}", ok[i].d);
        assert_int_equal(parse(json, &p, f), 0);
        if (p.max_frames != ok[i].frames)
            fail_msg("duration %s: %d frames, want %d", ok[i].d, p.max_frames, ok[i].frames);
        mm3_job_params_free(&p);
    }
    expect_bad("{" BASE ",\"duration_s\":0.03}", "duration_s", "out of range");
    expect_bad("{" BASE ",\"duration_s\":360.1}", "duration_s", "out of range");
    expect_bad("{" BASE ",\"duration_s\":-1}", "duration_s", "out of range");
    expect_bad("{" BASE ",\"duration_s\":\"30\"}", "duration_s", "expected a number");
    expect_bad("{" BASE ",\"duration_s\":30,\"max_new_tokens\":100}", "duration_s", "only one");
    expect_bad("{" BASE ",\"max_new_tokens\":0}", "max_new_tokens", "out of range");
    expect_bad("{" BASE ",\"max_new_tokens\":9001}", "max_new_tokens", "1..9000");
    expect_bad("{" BASE ",\"max_new_tokens\":10.5}", "max_new_tokens", "expected an integer");
}

static void test_text_fields(void **state)
{
    /* a missing text is named as OpenAI-style clients know it */
    expect_bad("{\"instructions\":\"pop\"}", "input", "'input' (or 'lyrics') is required");
    expect_bad("{\"input\":\"la\"}", "instructions", "'instructions' (or 'caption') is required");
    expect_bad("{\"input\":\" \\n\\t \",\"instructions\":\"pop\"}", "input", "empty");
    expect_bad("{\"lyrics\":\"\",\"instructions\":\"pop\"}", "lyrics", "empty");
    expect_bad("{\"input\":\"la\",\"caption\":\"  \"}", "caption", "empty");
    expect_bad("{\"input\":\"la\",\"lyrics\":\"la\",\"instructions\":\"pop\"}", "lyrics", "'input' and 'lyrics'");
    expect_bad("{\"input\":\"la\",\"instructions\":\"a\",\"caption\":\"b\"}", "caption",
               "'instructions' and 'caption'");
    expect_bad("{\"input\":5,\"instructions\":\"pop\"}", "input", "expected a string");
    lim.max_text_chars = 4;
    expect_bad("{\"input\":\"hello\",\"instructions\":\"pop\"}", "input", "too long");
    struct mm3_job_params p;
    char f[64];
    /* Code points, not bytes: four CJK characters are 12 bytes. */
    assert_int_equal(
        parse("{\"input\":\"\xe5\x8f\xa4\xe7\x90\xb4\xe5\x8f\xa4\xe7\x90\xb4\",\"instructions\":\"pop\"}", &p, f), 0);
    mm3_job_params_free(&p);
    api_limits_default(&lim);
}

static void test_field_errors(void **state)
{
    expect_bad("{" BASE ",\"seed\":-1}", "seed", "out of range");
    expect_bad("{" BASE ",\"seed\":1.5}", "seed", "integer");
    expect_bad("{" BASE ",\"response_format\":\"aac\"}", "response_format", "wav, pcm, flac, mp3 or opus");
    expect_bad("{" BASE ",\"response_format\":1}", "response_format", "string");
    expect_bad("{" BASE ",\"sample_rate\":48000}", "sample_rate", "44100 or 32000");
    expect_bad("{" BASE ",\"num_inference_steps\":0}", "num_inference_steps", "1..200");
    expect_bad("{" BASE ",\"num_inference_steps\":201}", "num_inference_steps", "1..200");
    expect_bad("{" BASE ",\"guidance_scale\":\"high\"}", "guidance_scale", "number");
    expect_bad("{" BASE ",\"cfg_scale\":-0.5}", "cfg_scale", "out of range");
    expect_bad("{" BASE ",\"flow_shift\":0}", "flow_shift", "(0, 20]");
    expect_bad("{" BASE ",\"flow_shift\":-1}", "flow_shift", "out of range");
    expect_bad("{" BASE ",\"flow_shift\":20.5}", "flow_shift", "(0, 20]");
    expect_bad("{" BASE ",\"flow_shift\":\"2\"}", "flow_shift", "number");
    expect_bad("{" BASE ",\"stream\":\"yes\"}", "stream", "true or false");
    expect_bad("{" BASE ",\"ignore_eos\":1}", "ignore_eos", "true or false");
    expect_bad("{" BASE ",\"allow_stall\":\"yes\"}", "allow_stall", "true or false");
    expect_bad("{" BASE ",\"stream_format\":\"websocket\"}", "stream_format", "\"audio\" (raw bytes) or \"sse\"");
    expect_bad("{" BASE ",\"stream_format\":true}", "stream_format", "\"sse\"");
    expect_bad("{" BASE ",\"model\":3}", "model", "string");
    expect_bad("{" BASE ",\"voice\":\"alloy\"}", "voice", "no voices");
    expect_bad("{" BASE ",\"speed\":1.5}", "speed", "1.0");
    expect_bad("{" BASE ",\"temperature\":0.9}", "temperature", "recipe");
    expect_bad("{" BASE ",\"top_p\":0.9}", "top_p", "recipe");
    expect_bad("{" BASE ",\"top_k\":50}", "top_k", "recipe");
    expect_bad("{" BASE ",\"repetition_penalty\":1.1}", "repetition_penalty", "recipe");
    expect_bad("{" BASE ",\"ref_audio\":\"x\"}", "ref_audio", "no reference audio");
    expect_bad("{" BASE ",\"durationS\":3}", "durationS", "unknown field");
}

/* vLLM-Omni and SGLang-Omni clients send their own fields, often explicitly at their
 * defaults: the neutral values pass, anything mm3 cannot honour is a 400 naming the field,
 * and truly unknown fields stay refused. */
static void test_other_servers_fields(void **state)
{
    static const char *const neutral[] = {
        "\"language\":null",       "\"language\":\"auto\"",      "\"language\":\"Auto\"",
        "\"task_type\":null",      "\"task_type\":\"music\"",    "\"task_type\":\"Music\"",
        "\"ref_audio\":null",      "\"ref_audio\":\"\"",         "\"ref_text\":null",
        "\"ref_text\":\"\"",       "\"x_vector_only_mode\":false", "\"extra_params\":{}",
        "\"extra_params\":null",   "\"speaker\":null",           "\"speaker\":\"Default\"",
        "\"voice\":\"Default\"",   "\"voice\":\"DEFAULT\"",      "\"voice\":null",
        "\"word_timestamps\":false", "\"word_timestamps\":null", "\"initial_codec_chunk_frames\":null",
        "\"non_streaming_mode\":null",
    };
    for (size_t i = 0; i < sizeof neutral / sizeof *neutral; i++) {
        char body[512];
        snprintf(body, sizeof body, "{" BASE ",%s}", neutral[i]);
        struct mm3_job_params p;
        char f[64];
        if (parse(body, &p, f) != 0) fail_msg("%s refused: %s", neutral[i], mm3_last_error());
        mm3_job_params_free(&p);
    }
    /* All of them at once, as a vLLM-Omni client sends them. */
    struct mm3_job_params p;
    char f[64];
    assert_int_equal(parse("{" BASE ",\"language\":\"Auto\",\"task_type\":null,\"ref_audio\":null,\"ref_text\":null,"
                           "\"extra_params\":{},\"speaker\":null,\"word_timestamps\":false,\"voice\":\"default\"}",
                           &p, f),
                     0);
    mm3_job_params_free(&p);

    expect_bad("{" BASE ",\"language\":\"English\"}", "language", "\"auto\"");
    expect_bad("{" BASE ",\"language\":5}", "language", "\"auto\"");
    expect_bad("{" BASE ",\"task_type\":\"CustomVoice\"}", "task_type", "\"music\"");
    expect_bad("{" BASE ",\"ref_text\":\"hello\"}", "ref_text", "no reference");
    expect_bad("{" BASE ",\"x_vector_only_mode\":true}", "x_vector_only_mode", "no reference audio");
    expect_bad("{" BASE ",\"extra_params\":{\"a\":1}}", "extra_params", "{}");
    expect_bad("{" BASE ",\"extra_params\":[]}", "extra_params", "{}");
    expect_bad("{" BASE ",\"speaker\":\"vivian\"}", "speaker", "no speakers");
    expect_bad("{" BASE ",\"voice\":\"alloy\"}", "voice", "no voices");
    expect_bad("{" BASE ",\"word_timestamps\":true}", "word_timestamps", "not produced");
    expect_bad("{" BASE ",\"initial_codec_chunk_frames\":4}", "initial_codec_chunk_frames", "null");
    expect_bad("{" BASE ",\"non_streaming_mode\":true}", "non_streaming_mode", "null");
    expect_bad("{" BASE ",\"emotion\":null}", "emotion", "unknown field");
}

/* The minimum length: frames or seconds (rounded up), one of the two, never past the cap. */
static void test_min_length(void **state)
{
    static const struct {
        const char *extra;
        int min_frames;
    } ok[] = {
        {"", 0},
        {",\"min_new_tokens\":250", 250},
        {",\"min_new_tokens\":null", 0},
        {",\"min_duration_s\":30", 750},
        {",\"min_duration_s\":10.01", 251},
        {",\"min_duration_s\":0", 0},
        {",\"duration_s\":20,\"min_duration_s\":20", 500},
        {",\"max_new_tokens\":100,\"min_new_tokens\":100", 100},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char body[256];
        snprintf(body, sizeof body, "{" BASE "%s}", ok[i].extra);
        struct mm3_job_params p;
        char f[64];
        if (parse(body, &p, f) != 0) fail_msg("%s refused: %s", ok[i].extra, mm3_last_error());
        if (p.min_frames != ok[i].min_frames) fail_msg("%s: min_frames %d, want %d", ok[i].extra, p.min_frames, ok[i].min_frames);
        mm3_job_params_free(&p);
    }
    expect_bad("{" BASE ",\"min_new_tokens\":10,\"min_duration_s\":1}", "min_duration_s", "only one");
    expect_bad("{" BASE ",\"max_new_tokens\":100,\"min_new_tokens\":101}", "min_new_tokens", "length cap");
    expect_bad("{" BASE ",\"duration_s\":10,\"min_duration_s\":10.5}", "min_duration_s", "length cap");
    expect_bad("{" BASE ",\"min_new_tokens\":-1}", "min_new_tokens", "out of range");
    expect_bad("{" BASE ",\"min_new_tokens\":9001}", "min_new_tokens", "0..9000");
    expect_bad("{" BASE ",\"min_new_tokens\":1.5}", "min_new_tokens", "integer");
    expect_bad("{" BASE ",\"min_duration_s\":\"30\"}", "min_duration_s", "number");
    expect_bad("{" BASE ",\"min_duration_s\":361}", "min_duration_s", "out of range");
}

/* stream_format decides streaming when given (OpenAI's and vLLM-Omni's switch). */
static void test_stream_format(void **state)
{
    static const struct {
        const char *extra;
        bool stream, sse;
    } cases[] = {
        {"", false, false},
        {",\"stream\":true", true, false},
        {",\"stream_format\":\"audio\"", true, false},
        {",\"stream_format\":\"sse\"", true, true},
        {",\"stream\":false,\"stream_format\":\"sse\"", true, true},
        {",\"stream\":true,\"stream_format\":null", true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[256];
        snprintf(body, sizeof body, "{" BASE "%s}", cases[i].extra);
        struct mm3_job_params p;
        char f[64];
        assert_int_equal(parse(body, &p, f), 0);
        if (p.stream != cases[i].stream || p.sse != cases[i].sse)
            fail_msg("%s: stream %d sse %d", cases[i].extra, p.stream, p.sse);
        mm3_job_params_free(&p);
    }
}

/* An integer past 64 bits is valid JSON: a seed of 2^63 or more is out of range. */
static void test_continuation(void **state)
{
    (void)state;
    struct mm3_job_params p;
    char f[64];
    const char *id = "0123456789abcdef0123456789abcdef";
    char json[512];
    /* caption and lyrics may be left out: the continued song's are taken */
    snprintf(json, sizeof json, "{\"continue_from\":\"%s\",\"duration_s\":2}", id);
    assert_int_equal(parse(json, &p, f), 0);
    assert_string_equal(p.continue_from, id);
    assert_false(p.return_whole);
    assert_string_equal(p.lyrics, "");
    assert_string_equal(p.caption, "");
    assert_int_equal(p.max_frames, 50);
    assert_int_equal(p.given, MM3_GIVEN_LENGTH);
    mm3_job_params_free(&p);
    snprintf(json, sizeof json,
             "{" BASE ",\"continue_from\":\"%s\",\"return\":\"whole\",\"seed\":4,\"cfg_scale\":2,"
             "\"num_inference_steps\":8,\"guidance_scale\":1,\"flow_shift\":2,\"sample_rate\":32000}",
             id);
    assert_int_equal(parse(json, &p, f), 0);
    assert_true(p.return_whole);
    assert_string_equal(p.caption, "pop");
    assert_int_equal(p.given, MM3_GIVEN_LYRICS | MM3_GIVEN_CAPTION | MM3_GIVEN_SEED | MM3_GIVEN_CFG_SCALE |
                                  MM3_GIVEN_STEPS | MM3_GIVEN_GUIDANCE | MM3_GIVEN_FLOW_SHIFT |
                                  MM3_GIVEN_SAMPLE_RATE);
    mm3_job_params_free(&p);
    /* a new song sets no continuation and needs its text */
    assert_int_equal(parse("{" BASE "}", &p, f), 0);
    assert_string_equal(p.continue_from, "");
    mm3_job_params_free(&p);
    expect_bad("{\"duration_s\":2}", "input", "required");
    expect_bad("{\"continue_from\":\"0123\"}", "continue_from", "32 lowercase hex digits");
    expect_bad("{\"continue_from\":\"0123456789ABCDEF0123456789abcdef\"}", "continue_from", "request id");
    expect_bad("{\"continue_from\":7}", "continue_from", "request id");
    expect_bad("{" BASE ",\"return\":\"whole\"}", "return", "needs continue_from");
    snprintf(json, sizeof json, "{\"continue_from\":\"%s\",\"return\":\"all\"}", id);
    expect_bad(json, "return", "\"new\"");
    snprintf(json, sizeof json, "{\"continue_from\":\"%s\",\"input\":\" \"}", id);
    expect_bad(json, "input", "must not be empty");
    /* an uploaded journal file, base64 */
    assert_int_equal(parse("{\"continue_journal\":\"TU0zSlJOTAA=\",\"return\":\"whole\"}", &p, f), 0);
    assert_int_equal(p.journal_len, 8);
    assert_memory_equal(p.journal, "MM3JRNL", 8);
    assert_true(p.return_whole);
    assert_string_equal(p.lyrics, "");
    mm3_job_params_free(&p);
    assert_null(p.journal);
    snprintf(json, sizeof json, "{\"continue_from\":\"%s\",\"continue_journal\":\"TU0zSlJOTAA=\"}", id);
    expect_bad(json, "continue_journal", "not both");
    expect_bad("{\"continue_journal\":\"TU0z*lJOTAA=\"}", "continue_journal", "not base64");
    expect_bad("{\"continue_journal\":\"\"}", "continue_journal", "base64");
    expect_bad("{\"continue_journal\":5}", "continue_journal", "base64");
}

static void test_seed_beyond_64_bits(void **state)
{
    expect_bad("{" BASE ",\"seed\":9223372036854775808}", "seed", "0..9223372036854775807");
    expect_bad("{" BASE ",\"seed\":123456789012345678901234567890}", "seed", "out of range");
    expect_bad("{" BASE ",\"seed\":-9223372036854775809}", "seed", "out of range");
    expect_bad("{" BASE ",\"max_new_tokens\":99999999999999999999}", "max_new_tokens", "out of range");
    /* nested, it stays a body error; and the largest seed passes */
    expect_bad("{" BASE ",\"extra_params\":{\"seed\":99999999999999999999}}", "body", "invalid JSON");
    struct mm3_job_params p;
    char f[64];
    assert_int_equal(parse("{" BASE ",\"seed\":9223372036854775807}", &p, f), 0);
    assert_true(p.seed == 9223372036854775807ull);
    mm3_job_params_free(&p);
}

static void test_malformed(void **state)
{
    expect_bad("", "body", "invalid JSON");
    expect_bad("{\"input\":", "body", "line 1");
    expect_bad("{\"input\":\"a\",\n\"instructions\" \"b\"}", "body", "line 2");
    expect_bad("[1,2]", "body", "JSON object");
    expect_bad("\"text\"", "body", "invalid JSON"); /* jansson refuses bare scalars by default */
    expect_bad("{" BASE ",\"seed\":1,\"seed\":2}", "body", "duplicate");
    expect_bad("{\"input\":\"\\u0000\",\"instructions\":\"pop\"}", "body", "invalid JSON");
    expect_bad("{\"input\":\"\xff\",\"instructions\":\"pop\"}", "body", "invalid JSON");
}

/* x_replay_file (replay enabled): only a regular file inside api.replay_dir, reached
 * without links or "..", is accepted; whatever is refused, no message holds a byte or
 * the size of a file, and a FIFO is refused at once instead of blocking. */
static void test_replay_file_confined(void **state)
{
    (void)state;
    setenv("MM3_ALLOW_REPLAY", "1", 1);
    char *tmp = test_make_tmpdir("replay_confined");
    char dir[1024], secret[1100], req[4096], p[1200];
    snprintf(dir, sizeof dir, "%s/replay", tmp);
    assert_int_equal(mkdir(dir, 0700), 0);
    /* a secret outside the folder: the old code quoted its first 8 bytes (as a header
     * length) and its size */
    snprintf(secret, sizeof secret, "%s/shadow", tmp);
    FILE *f = fopen(secret, "wb");
    assert_non_null(f);
    fputs("root:$6$SECRETHASH:19000:0:99999:7:::\n", f);
    for (int i = 0; i < 1000; i++) fputc('x', f);
    fclose(f);
    struct stat st;
    assert_int_equal(stat(secret, &st), 0);
    char size_text[32];
    snprintf(size_text, sizeof size_text, "%lld", (long long)st.st_size);
    /* a regular non-safetensors file and a valid case file inside the folder */
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    f = fopen(p, "wb");
    assert_non_null(f);
    fputs("root:$6$SECRETHASH:19000", f);
    fclose(f);
    int64_t v[3] = {1, 2, 3};
    struct st_writer_tensor t[2] = {{"lm_sampled", MM3_DTYPE_I64, 1, {3}, v}, {"depth_sampled", MM3_DTYPE_I64, 1, {3}, v}};
    snprintf(p, sizeof p, "%s/case0.safetensors", dir);
    assert_int_equal(st_write_file(p, t, 2, NULL), 0);
    assert_int_equal(mkdir(strcat(strcpy(p, dir), "/sub"), 0700), 0);
    snprintf(p, sizeof p, "%s/sub/case1.safetensors", dir);
    assert_int_equal(st_write_file(p, t, 2, NULL), 0);
    /* links and a FIFO inside it */
    snprintf(p, sizeof p, "%s/link.safetensors", dir);
    assert_int_equal(symlink(secret, p), 0);
    snprintf(p, sizeof p, "%s/linkdir", dir);
    assert_int_equal(symlink(tmp, p), 0);
    snprintf(p, sizeof p, "%s/fifo", dir);
    assert_int_equal(mkfifo(p, 0600), 0);

    lim.replay_dir = dir;
    struct mm3_job_params jp;
    char field[64];
    const char *refused[] = {secret, "../shadow", "sub/../../shadow", "link.safetensors", "linkdir/shadow", "fifo",
                             "/etc/shadow", "sub/", "missing.safetensors", NULL};
    for (int i = 0; refused[i]; i++) {
        snprintf(req, sizeof req, "{" BASE ",\"x_replay_file\":\"%s\"}", refused[i]);
        time_t t0 = time(NULL);
        if (parse(req, &jp, field) != -EINVAL) fail_msg("x_replay_file '%s' accepted", refused[i]);
        assert_true(time(NULL) - t0 < 5); /* not blocked opening the FIFO */
        assert_string_equal(field, "x_replay_file");
        const char *msg = mm3_last_error();
        if (strstr(msg, "SECRET") || strstr(msg, "root:") || strstr(msg, size_text) || strstr(msg, "bytes"))
            fail_msg("x_replay_file '%s': the message tells about the file: %s", refused[i], msg);
    }
    /* accepted: relative, absolute under the folder, in a subfolder */
    snprintf(p, sizeof p, "%s/case0.safetensors", dir);
    const char *ok[] = {"case0.safetensors", p, "sub/case1.safetensors", "sub//case1.safetensors", NULL};
    for (int i = 0; ok[i]; i++) {
        snprintf(req, sizeof req, "{" BASE ",\"x_replay_file\":\"%s\"}", ok[i]);
        if (parse(req, &jp, field) != 0) fail_msg("x_replay_file '%s' refused: %s", ok[i], mm3_last_error());
        assert_string_equal(jp.replay_file, ok[i]);
        mm3_job_params_free(&jp);
    }
    /* inside the folder but not a case file: refused when loaded, without its bytes */
    struct st_file sf;
    assert_true(replay_file_open_st(&sf, dir, "notes.txt") < 0);
    assert_null(strstr(mm3_last_error(), "SECRET"));
    assert_null(strstr(mm3_last_error(), "root"));
    assert_non_null(strstr(mm3_last_error(), "not a golden case file"));
    assert_int_equal(replay_file_open_st(&sf, dir, "sub/case1.safetensors"), 0);
    assert_non_null(st_file_find(&sf, "lm_sampled"));
    st_file_close(&sf);
    /* no folder configured: every name refused */
    lim.replay_dir = "";
    snprintf(req, sizeof req, "{" BASE ",\"x_replay_file\":\"case0.safetensors\"}");
    assert_int_equal(parse(req, &jp, field), -EINVAL);
    assert_non_null(strstr(mm3_last_error(), "api.replay_dir"));
    lim.replay_dir = NULL;
    assert_int_equal(parse(req, &jp, field), -EINVAL);
    unsetenv("MM3_ALLOW_REPLAY");
    test_remove_tree(tmp);
    free(tmp);
}

/* An adapter is picked by `model` (when it names one; other model names are the base
 * model) or by `lora`, which must name one: 404 (-ENOENT) naming the known adapters. */
static void test_lora(void **state)
{
    (void)state;
    struct api_limits saved = lim;
    lim.n_lora = 2;
    snprintf(lim.lora_names[0], sizeof lim.lora_names[0], "rock");
    snprintf(lim.lora_names[1], sizeof lim.lora_names[1], "jazz.v2");
    struct mm3_job_params p;
    char f[64];
    assert_int_equal(parse("{" BASE ",\"model\":\"rock\"}", &p, f), 0);
    assert_string_equal(p.lora, "rock");
    assert_true(p.given & MM3_GIVEN_LORA);
    mm3_job_params_free(&p);
    assert_int_equal(parse("{" BASE ",\"lora\":\"jazz.v2\",\"model\":\"MiniMax-Music3\"}", &p, f), 0);
    assert_string_equal(p.lora, "jazz.v2");
    mm3_job_params_free(&p);
    assert_int_equal(parse("{" BASE ",\"model\":\"tts-1\",\"lora\":null}", &p, f), 0);
    assert_string_equal(p.lora, "");
    assert_false(p.given & MM3_GIVEN_LORA);
    mm3_job_params_free(&p);
    assert_int_equal(parse("{" BASE ",\"model\":\"rock\",\"lora\":\"rock\"}", &p, f), 0);
    assert_string_equal(p.lora, "rock");
    mm3_job_params_free(&p);

    assert_int_equal(parse("{" BASE ",\"lora\":\"pop\"}", &p, f), -ENOENT);
    assert_string_equal(f, "lora");
    assert_non_null(strstr(mm3_last_error(), "no adapter 'pop' here; this server serves 'rock', 'jazz.v2'"));
    assert_null(p.lyrics);
    expect_bad("{" BASE ",\"lora\":3}", "lora", "expected a string");
    expect_bad("{" BASE ",\"model\":\"rock\",\"lora\":\"jazz.v2\"}", "lora", "names another adapter than `model`");
    lim = saved;
    assert_int_equal(parse("{" BASE ",\"lora\":\"rock\"}", &p, f), -ENOENT);
    assert_non_null(strstr(mm3_last_error(), "this server serves no adapters"));
    assert_int_equal(parse("{" BASE ",\"model\":\"rock\"}", &p, f), 0);
    assert_string_equal(p.lora, "");
    mm3_job_params_free(&p);
}

int main(void)
{
    api_limits_default(&lim);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_deploy_defaults),
        cmocka_unit_test(test_all_fields),
        cmocka_unit_test(test_duration_rules),
        cmocka_unit_test(test_text_fields),
        cmocka_unit_test(test_field_errors),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_replay_file_confined),
        cmocka_unit_test(test_other_servers_fields),
        cmocka_unit_test(test_seed_beyond_64_bits),
        cmocka_unit_test(test_stream_format),
        cmocka_unit_test(test_min_length),
        cmocka_unit_test(test_continuation),
        cmocka_unit_test(test_lora),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
