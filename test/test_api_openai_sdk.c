/* The official OpenAI Python SDK against the HTTP API with the fake engine: runs
 * test/openai_sdk/speech.py (models, a whole file, stream_format "sse" through the SDK's
 * SSE decoder, stream_format "audio", a 400). Skips (77) where the openai package is not
 * importable; $MM3_PYTHON picks the interpreter (default python3). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <spawn.h>
#include <sys/wait.h>

#include "support/test_support.h"
#include "test_api_fake.h"

extern char **environ;

static int sdk_status;

static void test_openai_sdk(void **state)
{
    struct fixture *fx = fixture_start(FAKE_OK, 0);
    fx->fe.delay_ms = 5;
    const char *src = getenv("MM3_SOURCE_DIR"), *py = getenv("MM3_PYTHON");
    char script[1024], frames[32];
    snprintf(script, sizeof script, "%s/test/openai_sdk/speech.py", src ? src : ".");
    snprintf(frames, sizeof frames, "%zu", (size_t)fx->fe.n_chunks * fx->fe.chunk_frames);
    char *argv[] = {(char *)(py && *py ? py : "python3"), script, fx->base, frames, NULL};
    pid_t pid;
    if (posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ) != 0) {
        sdk_status = 77; /* no Python at all */
    } else {
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        sdk_status = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    fixture_stop(fx);
    if (sdk_status != 0 && sdk_status != 77) fail_msg("%s exited %d", script, sdk_status);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_openai_sdk)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    return rc == 0 && sdk_status == 77 ? 77 : rc;
}
