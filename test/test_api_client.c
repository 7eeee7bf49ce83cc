/* The mm3 client program against a server with the fake engine: generate and continue
 * writes a complete WAV (sizes patched after streaming) with the engine's
 * samples, server errors exit 1 and leave no file, health reports readiness;
 * every bad numeric flag or format is exit 2 before anything is sent, --url
 * takes /v1 or not, a 404 is explained, and a signal leaves no OUT.part; continue sends
 * continue_from with its flags (or a journal file as continue_journal) and refuses a
 * malformed id. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/test_support.h"
#include "test_api_fake.h"

extern char **environ;

static char mm3_bin[1024];

/* Start mm3 with args (NULL-terminated), its stderr into err_path when not NULL. */
static pid_t spawn_mm3(const char *const *args, const char *err_path)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = mm3_bin;
    for (; *args && n < 31; args++)
        argv[n++] = *args;
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (err_path) posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, mm3_bin, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

/* Run mm3 with args (NULL-terminated); returns its exit status. */
static int run_mm3(const char *const *args)
{
    pid_t pid = spawn_mm3(args, NULL);
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

static long long file_size_of(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static uint32_t rd32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void test_continue(void **state)
{
    (void)state;
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    char *dir = test_make_tmpdir("mm3cont");
    char out[600], part[700];
    snprintf(out, sizeof out, "%s/more.wav", dir);
    snprintf(part, sizeof part, "%s.part", out);
    const char *id = "00112233445566778899aabbccddeeff";
    const char *whole[] = {"continue", id, "--duration", "2", "--whole", "-o", out, "--url", fx->base, "--quiet", NULL};
    assert_int_equal(run_mm3(whole), 0);
    size_t len;
    uint8_t *b = read_file(out, &len);
    assert_non_null(b);
    assert_int_equal(len, 44 + 5 * 4410 * 4);
    assert_int_equal(rd32(b + 40), len - 44);
    free(b);
    pthread_mutex_lock(&fx->fe.mu);
    assert_string_equal(fx->fe.last.continue_from, id);
    assert_true(fx->fe.last.return_whole);
    assert_true(fx->fe.last.stream);
    assert_int_equal(fx->fe.last.max_frames, 50);
    assert_int_equal(fx->fe.last.given, MM3_GIVEN_LENGTH);
    pthread_mutex_unlock(&fx->fe.mu);
    /* the new part, a minimum, no length: the server's default */
    const char *fresh[] = {"continue", id, "--min-duration", "1", "-o", out, "--url", fx->base, "--quiet", NULL};
    assert_int_equal(run_mm3(fresh), 0);
    pthread_mutex_lock(&fx->fe.mu);
    assert_false(fx->fe.last.return_whole);
    assert_int_equal(fx->fe.last.min_frames, 25);
    assert_int_equal(fx->fe.last.given, 0);
    pthread_mutex_unlock(&fx->fe.mu);
    /* a journal file, uploaded as it is */
    char jpath[600];
    snprintf(jpath, sizeof jpath, "%s/song.mm3j", dir);
    static const uint8_t jbytes[] = {'M', 'M', '3', 'J', 'R', 'N', 'L', 0, 1, 0, 0, 0, 0xff, 0x80, 7};
    FILE *jf = fopen(jpath, "wb");
    assert_non_null(jf);
    assert_int_equal(fwrite(jbytes, 1, sizeof jbytes, jf), sizeof jbytes);
    fclose(jf);
    const char *up[] = {"continue", "--journal", jpath, "--duration", "1", "-o", out, "--url", fx->base, "--quiet", NULL};
    assert_int_equal(run_mm3(up), 0);
    pthread_mutex_lock(&fx->fe.mu);
    assert_string_equal(fx->fe.last.continue_from, "");
    assert_int_equal(fx->fe.last.journal_len, sizeof jbytes);
    pthread_mutex_unlock(&fx->fe.mu);
    int submits = atomic_load(&fx->fe.submits);
    /* refused before anything is sent: exit 2 */
    static const char *const bad[][6] = {
        {"continue", NULL},
        {"continue", "00112233", NULL},
        {"continue", "00112233445566778899AABBCCDDEEFF", NULL},
        {"continue", "00112233445566778899aabbccddeeff", "00112233445566778899aabbccddeeff", NULL},
        {"continue", "00112233445566778899aabbccddeeff", "--duration", "nan", NULL},
        {"continue", "00112233445566778899aabbccddeeff", "--duration", "1", "--min-duration", "2"},
        {"continue", "00112233445566778899aabbccddeeff", "--journal", "x.mm3j", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *args[12] = {0};
        int n = 0;
        for (int k = 0; k < 6 && bad[i][k]; k++)
            args[n++] = bad[i][k];
        args[n++] = "--url";
        args[n++] = fx->base;
        args[n++] = "--quiet";
        if (run_mm3(args) != 2) fail_msg("mm3 continue case %zu was not refused with exit 2", i);
    }
    assert_int_equal(atomic_load(&fx->fe.submits), submits);
    /* the server does not know the song: exit 1, no file, and the error names the field */
    unlink(out);
    fx->fe.mode = FAKE_NO_SONG;
    assert_int_equal(run_mm3(whole), 1);
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);
    assert_int_not_equal(stat(part, &st), 0);
    struct http_client_response resp;
    char body[128];
    snprintf(body, sizeof body, "{\"continue_from\": \"%s\"}", id);
    assert_int_equal(do_request(fx, "POST", "/v1/audio/speech", body, &resp), 0);
    assert_int_equal(resp.status, 404);
    assert_non_null(strstr(resp.body, "\"param\":\"continue_from\""));
    http_client_response_free(&resp);
    fixture_stop(fx);
    free(dir);
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

/* A one-connection server with a scripted answer, for what the fake engine cannot
 * send: an endless error body, or a long song whose arrival on disk is watched. */
struct raw_server {
    int listen_fd, port;
    bool endless_error;        /* 500 with a chunked body that never ends */
    const char *watch_path;    /* 200: after `first` bytes, wait until this file holds them */
    size_t first, rest;        /* audio bytes before and after the wait */
    _Atomic size_t sent;       /* body bytes sent */
    _Atomic bool seen_on_disk; /* the first part was on disk before the rest was sent */
    pthread_t th;
};

static bool send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}

static bool send_chunk(struct raw_server *s, int fd, const char *data, size_t n)
{
    char head[32];
    int h = snprintf(head, sizeof head, "%zx\r\n", n);
    if (!send_all(fd, head, (size_t)h) || !send_all(fd, data, n) || !send_all(fd, "\r\n", 2)) return false;
    atomic_fetch_add(&s->sent, n);
    return true;
}

static long long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static void *raw_serve(void *arg)
{
    struct raw_server *s = arg;
    int fd = accept(s->listen_fd, NULL, NULL);
    if (fd < 0) return NULL;
    char req[8192];
    size_t n = 0;
    for (;;) { /* the head and the JSON body (mm3 sends Content-Length) */
        ssize_t k = recv(fd, req + n, sizeof req - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
        req[n] = 0;
        char *end = strstr(req, "\r\n\r\n");
        const char *cl = strstr(req, "Content-Length: ");
        if (end && cl && n >= (size_t)(end + 4 - req) + strtoul(cl + 16, NULL, 10)) break;
    }
    static char block[64 * 1024];
    memset(block, 'x', sizeof block);
    if (s->endless_error) {
        const char *h = "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n";
        if (send_all(fd, h, strlen(h)))
            while (atomic_load(&s->sent) < ((size_t)1 << 30) && send_chunk(s, fd, block, sizeof block)) {
            }
    } else {
        const char *h = "HTTP/1.1 200 OK\r\nContent-Type: audio/pcm\r\nX-Sample-Rate: 44100\r\n"
                        "X-Channels: 2\r\nTransfer-Encoding: chunked\r\n\r\n";
        bool ok = send_all(fd, h, strlen(h));
        for (size_t k = 0; ok && k < s->first; k += sizeof block)
            ok = send_chunk(s, fd, block, sizeof block);
        /* the client must have written what it got (less its stdio buffer) before more comes */
        for (int i = 0; ok && i < 1000 && !s->seen_on_disk; i++) {
            if (file_size(s->watch_path) >= (long long)(s->first - sizeof block))
                s->seen_on_disk = true;
            else
                nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
        }
        for (size_t k = 0; ok && k < s->rest; k += sizeof block)
            ok = send_chunk(s, fd, block, sizeof block);
        if (ok) send_all(fd, "0\r\n\r\n", 5);
    }
    shutdown(fd, SHUT_WR);
    char drain[4096];
    while (recv(fd, drain, sizeof drain, 0) > 0) {
    }
    close(fd);
    return NULL;
}

static void raw_start(struct raw_server *s, char *base, size_t base_cap)
{
    s->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(bind(s->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(s->listen_fd, (struct sockaddr *)&a, &len);
    s->port = ntohs(a.sin_port);
    assert_int_equal(listen(s->listen_fd, 4), 0);
    snprintf(base, base_cap, "http://127.0.0.1:%d", s->port);
    assert_int_equal(pthread_create(&s->th, NULL, raw_serve, s), 0);
}

static void raw_stop(struct raw_server *s)
{
    pthread_join(s->th, NULL);
    close(s->listen_fd);
}

/* The client holds no body without limit: an endless error answer is given up after
 * a bounded read (exit 1), and a song goes to disk as it arrives, not at the end. */
static void test_bounded_memory(void **state)
{
    (void)state;
    char *dir = test_make_tmpdir("mm3cli_bounded");
    char out[600], part[700], base[64];
    snprintf(out, sizeof out, "%s/song.pcm", dir);
    snprintf(part, sizeof part, "%s.part", out);
    struct raw_server s = {.endless_error = true};
    raw_start(&s, base, sizeof base);
    const char *gen[] = {"generate", "--caption", "x",  "--lyrics", "y",     "--duration", "2", "--format",
                         "pcm",      "--quiet",   "-o", out,        "--url", base,         NULL};
    assert_int_equal(run_mm3(gen), 1);
    raw_stop(&s);
    if (atomic_load(&s.sent) >= (size_t)16 << 20) fail_msg("the client read %zu bytes of an error body", s.sent);
    assert_true(file_size(out) < 0 && file_size(part) < 0);

    struct raw_server t = {.watch_path = part, .first = (size_t)8 << 20, .rest = (size_t)8 << 20};
    raw_start(&t, base, sizeof base);
    assert_int_equal(run_mm3(gen), 0);
    raw_stop(&t);
    assert_true(t.seen_on_disk);
    assert_int_equal(file_size(out), (long long)(t.first + t.rest));
    test_remove_tree(dir);
    free(dir);
}

/* Every malformed or out-of-range flag is refused with exit 2 and a message naming
 * the flag, before any request reaches the server. */
static void test_strict_flags(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    char *dir = test_make_tmpdir("mm3strict");
    char err[600], out[600];
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    snprintf(out, sizeof out, "%s/song.wav", dir);
    static const char *const bad[][4] = {
        {"--duration", "-1"},    {"--duration", "nan"},  {"--duration", "inf"},     {"--duration", "-inf"},
        {"--duration", "2x"},    {"--duration", ""},     {"--duration", "0"},       {"--duration", "361"},
        {"--duration", "1e999"}, {"--seed", "-1"},       {"--seed", "1.5"},         {"--seed", " 7"},
        {"--seed", "7 "},        {"--seed", "+7"},       {"--seed", "9223372036854775808"},
        {"--seed", "99999999999999999999999"},           {"--steps", "-1"},         {"--steps", "0"},
        {"--steps", "201"},      {"--steps", "3x"},      {"--sample-rate", "48000"}, {"--sample-rate", "44100.0"},
        {"--format", "ogg"},     {"--format", "WAV"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *args[] = {"generate", "--caption", "c",   "--lyrics", "l",      bad[i][0], bad[i][1],
                              "-o",       out,         "--url", fx->base,  "--quiet", NULL};
        pid_t pid = spawn_mm3(args, err);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2) fail_msg("%s '%s' was not refused with exit 2", bad[i][0], bad[i][1]);
        size_t len;
        char *msg = (char *)read_file(err, &len);
        assert_non_null(msg);
        msg = realloc(msg, len + 1);
        msg[len] = 0;
        if (!strstr(msg, bad[i][0])) fail_msg("%s '%s': the message does not name the flag: %s", bad[i][0], bad[i][1], msg);
        free(msg);
    }
    /* The format: -o's extension and --format must agree; an unknown extension needs --format. */
    static const char *const mismatch[][4] = {
        {"-o", "x.mp3", "--format", "wav"}, {"-o", "x.flac", "--format", "pcm"}, {"-o", "x.xyz", NULL, NULL}};
    for (size_t i = 0; i < sizeof mismatch / sizeof *mismatch; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s", dir, mismatch[i][1]);
        const char *args[] = {"generate", "--caption", "c", "--lyrics", "l", "--url", fx->base, "--quiet",
                              "-o", path, mismatch[i][2], mismatch[i][3], NULL};
        if (run_mm3(args) != 2) fail_msg("-o %s --format %s was not refused", mismatch[i][1], mismatch[i][2]);
    }
    assert_int_equal(atomic_load(&fx->fe.submits), 0);
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);

    /* Boundary values pass: a 64-bit seed at INT64_MAX, 200 steps, 32 kHz. */
    const char *ok[] = {"generate", "--caption", "c", "--lyrics", "l", "--seed", "9223372036854775807", "--steps",
                        "200", "--duration", "0.04", "--sample-rate", "32000", "-o", out, "--url", fx->base, "--quiet",
                        NULL};
    assert_int_equal(run_mm3(ok), 0);
    assert_int_equal(atomic_load(&fx->fe.submits), 1);
    fixture_stop(fx);
    test_remove_tree(dir);
    free(dir);
}

/* --url works with or without /v1 (and a trailing slash); a wrong path is a 404 the
 * message explains; the format follows -o's extension. */
static void test_url_and_format(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    char *dir = test_make_tmpdir("mm3url");
    char out[600], err[600], url[128];
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    static const char *const suffixes[] = {"", "/", "/v1", "/v1/"};
    for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
        snprintf(url, sizeof url, "%s%s", fx->base, suffixes[i]);
        snprintf(out, sizeof out, "%s/song%zu.pcm", dir, i);
        const char *args[] = {"generate", "--caption", "c", "--lyrics", "l", "-o", out, "--url", url, "--quiet", NULL};
        if (run_mm3(args) != 0) fail_msg("--url %s failed", url);
        size_t len;
        uint8_t *b = read_file(out, &len);
        assert_non_null(b);
        assert_int_equal(len, 5 * 4410 * 4); /* raw PCM: the format came from .pcm */
        free(b);
    }
    snprintf(out, sizeof out, "%s/song.flac", dir);
    const char *flac[] = {"generate", "--caption", "c", "--lyrics", "l", "-o", out, "--url", fx->base, "--quiet", NULL};
    assert_int_equal(run_mm3(flac), 0);
    size_t len;
    uint8_t *b = read_file(out, &len);
    assert_non_null(b);
    assert_true(len > 4 && memcmp(b, "fLaC", 4) == 0);
    free(b);
    /* mp3 and opus too: an MPEG audio frame, an Ogg page */
    static const char *const lossy[] = {"mp3", "opus"};
    for (int k = 0; k < 2; k++) {
        snprintf(out, sizeof out, "%s/song.%s", dir, lossy[k]);
        const char *args[] = {"generate", "--caption", "c", "--lyrics", "l", "-o", out, "--url", fx->base, "--quiet", NULL};
        assert_int_equal(run_mm3(args), 0);
        b = read_file(out, &len);
        assert_non_null(b);
        if (k == 0)
            assert_true(len > 4 && b[0] == 0xff && (b[1] & 0xe0) == 0xe0);
        else
            assert_true(len > 4 && memcmp(b, "OggS", 4) == 0);
        free(b);
    }

    snprintf(url, sizeof url, "%s/api", fx->base);
    snprintf(out, sizeof out, "%s/lost.wav", dir);
    const char *lost[] = {"generate", "--caption", "c", "--lyrics", "l", "-o", out, "--url", url, "--quiet", NULL};
    pid_t pid = spawn_mm3(lost, err);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    char *msg = (char *)read_file(err, &len);
    msg = realloc(msg, len + 1);
    msg[len] = 0;
    if (!strstr(msg, "404") || !strstr(msg, "--url")) fail_msg("the 404 is not explained: %s", msg);
    free(msg);
    struct stat sb;
    char part[700];
    snprintf(part, sizeof part, "%s.part", out);
    assert_int_not_equal(stat(out, &sb), 0);
    assert_int_not_equal(stat(part, &sb), 0);
    fixture_stop(fx);
    test_remove_tree(dir);
    free(dir);
}

/* SIGINT or SIGTERM in the middle of a song: the client dies of the signal and
 * leaves no OUT.part (nor OUT). */
static void test_signal_removes_part(void **state)
{
    static const int sigs[] = {SIGINT, SIGTERM};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) {
        struct fixture *fx = fixture_start(FAKE_ENDLESS, 0);
        fx->fe.delay_ms = 20;
        char *dir = test_make_tmpdir("mm3sig");
        char out[600], part[700];
        snprintf(out, sizeof out, "%s/song.wav", dir);
        snprintf(part, sizeof part, "%s.part", out);
        const char *args[] = {"generate", "--caption", "c", "--lyrics", "l", "-o", out, "--url", fx->base, "--quiet",
                              NULL};
        pid_t pid = spawn_mm3(args, NULL);
        bool streaming = false;
        for (int t = 0; t < 1000 && !streaming; t++) {
            streaming = file_size_of(part) > 44 * 2;
            if (!streaming) sleep_ms(10);
        }
        assert_true(streaming);
        assert_int_equal(kill(pid, sigs[i]), 0);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFSIGNALED(st) && WTERMSIG(st) == sigs[i]);
        if (file_size_of(part) >= 0) fail_msg("signal %d left %s", sigs[i], part);
        assert_true(file_size_of(out) < 0);
        fixture_stop(fx);
        test_remove_tree(dir);
        free(dir);
    }
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
        cmocka_unit_test(test_generate_and_health), cmocka_unit_test(test_continue),
        cmocka_unit_test(test_bounded_memory),
        cmocka_unit_test(test_api_key),
        cmocka_unit_test(test_strict_flags),
        cmocka_unit_test(test_url_and_format),
        cmocka_unit_test(test_signal_removes_part),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
