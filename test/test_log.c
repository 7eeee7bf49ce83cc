/* The logger: one call is one line whatever the message holds, and
 * mm3_log_escape makes request text safe to log (no forged lines, no terminal
 * escapes, bounded length). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

static void test_escape(void **state)
{
    char out[64];
    assert_string_equal(mm3_log_escape(out, sizeof out, "plain text: ok"), "plain text: ok");
    assert_string_equal(mm3_log_escape(out, sizeof out, "a\nb\r\tc\x1b[2J"), "a\\x0ab\\x0d\\x09c\\x1b[2J");
    assert_string_equal(mm3_log_escape(out, sizeof out, "\\x0a"), "\\x5cx0a"); /* not confusable with an escape */
    assert_string_equal(mm3_log_escape(out, sizeof out, "caf\xc3\xa9\x7f"), "caf\\xc3\\xa9\\x7f");
    assert_string_equal(mm3_log_escape(out, sizeof out, NULL), "");
    /* Too long: cut, marked, terminated, never past cap. */
    char big[300];
    memset(big, '\n', sizeof big - 1);
    big[sizeof big - 1] = 0;
    memset(out, 'Z', sizeof out);
    mm3_log_escape(out, 16, big);
    assert_true(strlen(out) < 16);
    assert_string_equal(out, "\\x0a\\x0a\\x0a...");
    assert_int_equal(out[16], 'Z');
    mm3_log_escape(out, 8, "abcdefghijkl");
    assert_string_equal(out, "abcd...");
    mm3_log_escape(out, 8, "abcdefg"); /* fits exactly: not cut */
    assert_string_equal(out, "abcdefg");
}

static void test_one_call_one_line(void **state)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(p[1], 2);
    close(p[1]);
    LOG_WARN("field '%s' unknown", "x\nstage1[1] 0.000 ERROR forged:1: owned");
    dup2(saved, 2);
    close(saved);
    char buf[4096];
    ssize_t n = read(p[0], buf, sizeof buf - 1);
    close(p[0]);
    assert_true(n > 0);
    buf[n] = 0;
    assert_int_equal(strchr(buf, '\n') - buf, n - 1); /* the only newline ends the line */
    assert_non_null(strstr(buf, "field 'x\\x0astage1[1] 0.000 ERROR forged:1: owned' unknown"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_one_call_one_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
