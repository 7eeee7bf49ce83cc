/* The mm3 client program against a server with the fake engine: generate
 * writes a complete WAV (sizes patched after streaming) with the engine's
 * samples, server errors exit 1 and leave no file, health reports readiness. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/test_support.h"
#include "test_api_fake.h"

extern char **environ;

static char mm3_bin[1024];

/* Run mm3 with args (NULL-terminated); returns its exit status. */
static int run_mm3(const char *const *args)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = mm3_bin;
    for (; *args && n < 31; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, mm3_bin, NULL, NULL, (char *const *)argv, environ), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static uint32_t rd32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void test_generate_and_health(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    fx->fe.delay_ms = 5;
    char *dir = test_make_tmpdir("mm3cli");
    char cap[600], lyr[600], out[600], part[700];
    snprintf(cap, sizeof cap, "%s/caption.txt", dir);
    snprintf(lyr, sizeof lyr, "%s/lyrics.txt", dir);
    snprintf(out, sizeof out, "%s/song.wav", dir);
    snprintf(part, sizeof part, "%s.part", out);
    write_file(cap, "warm lo-fi, 80 bpm");
    write_file(lyr, "[verse]\nla la la\n");

    const char *gen[] = {
        "generate", "--caption-file", cap, "--lyrics-file", lyr, "--duration", "2", "--seed", "3", "-o", out,
        "--url",    fx->base,         NULL};
    assert_int_equal(run_mm3(gen), 0);
    size_t len;
    uint8_t *b = read_file(out, &len);
    assert_non_null(b);
    size_t n_frames = 5 * 4410;
    assert_int_equal(len, 44 + n_frames * 4);
    assert_memory_equal(b, "RIFF", 4);
    assert_int_equal(rd32(b + 4), len - 8); /* patched after the stream ended */
    assert_int_equal(rd32(b + 40), len - 44);
    for (size_t f = 0; f < n_frames; f++)
        for (int c = 0; c < 2; c++) {
            int16_t got = (int16_t)(b[44 + (f * 2 + c) * 2] | b[45 + (f * 2 + c) * 2] << 8);
            if (got != wav_sample_pcm16(fake_sample(f, c))) fail_msg("frame %zu differs", f);
        }
    free(b);
    struct stat st;
    assert_int_not_equal(stat(part, &st), 0);

    /* A refused request: exit 1, no output left behind. */
    unlink(out);
    fx->fe.mode = FAKE_EINVAL;
    assert_int_equal(run_mm3(gen), 1);
    assert_int_not_equal(stat(out, &st), 0);
    assert_int_not_equal(stat(part, &st), 0);
    /* Cut mid-stream: exit 1, no output either. */
    fx->fe.mode = FAKE_FAIL_MID;
    assert_int_equal(run_mm3(gen), 1);
    assert_int_not_equal(stat(out, &st), 0);

    const char *health[] = {"health", "--url", fx->base, NULL};
    assert_int_equal(run_mm3(health), 0);
    fx->fe.ready = false;
    assert_int_equal(run_mm3(health), 1);
    const char *bad[] = {"generate", "--caption", "x", NULL}; /* no lyrics */
    assert_int_equal(run_mm3(bad), 2);

    fixture_stop(fx);
    test_remove_tree(dir);
    free(dir);
}

#define KEY "0123456789abcdef-client-key"

static void with_key(struct http_server_config *cfg)
{
    cfg->api_key = KEY;
}

/* The key from --api-key or $MM3_API_KEY; without it the server's 401 is exit 1. */
static void test_api_key(void **state)
{
    fixture_tweak = with_key;
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    char *dir = test_make_tmpdir("mm3key");
    char out[600];
    snprintf(out, sizeof out, "%s/song.wav", dir);
    struct stat st;
    unsetenv("MM3_API_KEY");
    const char *gen[] = {"generate", "--caption", "c", "--lyrics", "l", "--quiet", "-o", out, "--url", fx->base, NULL};
    assert_int_equal(run_mm3(gen), 1);
    assert_int_not_equal(stat(out, &st), 0);
    const char *keyed[] = {"generate", "--caption", "c",      "--lyrics",  "l", "--quiet", "-o",
                           out,        "--url",     fx->base, "--api-key", KEY, NULL};
    assert_int_equal(run_mm3(keyed), 0);
    assert_int_equal(stat(out, &st), 0);
    unlink(out);
    setenv("MM3_API_KEY", KEY, 1);
    assert_int_equal(run_mm3(gen), 0);
    assert_int_equal(stat(out, &st), 0);
    setenv("MM3_API_KEY", "0123456789abcdef-wrong-key", 1);
    unlink(out);
    assert_int_equal(run_mm3(gen), 1);
    unsetenv("MM3_API_KEY");
    const char *health[] = {"health", "--url", fx->base, NULL}; /* open without a key */
    assert_int_equal(run_mm3(health), 0);
    assert_int_equal(atomic_load(&fx->fe.submits), 2);
    fixture_stop(fx);
    test_remove_tree(dir);
    free(dir);
}

int main(void)
{
    snprintf(mm3_bin, sizeof mm3_bin, "%s/mm3", test_bin_dir() ? test_bin_dir() : ".");
    if (access(mm3_bin, X_OK) != 0) {
        fprintf(stderr, "skip: %s not built\n", mm3_bin);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_and_health),
        cmocka_unit_test(test_api_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
