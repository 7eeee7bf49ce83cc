/* The thread's error message: a prefix goes in front of the current message, and a
 * message longer than the buffer is cut, still terminated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "common/error.h"

static void test_prefix(void **state)
{
    (void)state;
    assert_int_equal(mm3_errorf(-EINVAL, "key '%s': expected integer", "x"), -EINVAL);
    assert_int_equal(mm3_error_prefix(-EIO, "%s: ", "deploy.yaml"), -EIO);
    assert_string_equal(mm3_last_error(), "deploy.yaml: key 'x': expected integer");
    mm3_error_clear();
    assert_string_equal(mm3_last_error(), "");
}

static void test_prefix_cuts_a_long_message(void **state)
{
    (void)state;
    char big[4096];
    memset(big, 'm', sizeof big - 1);
    big[sizeof big - 1] = 0;
    mm3_errorf(-EINVAL, "%s", big);
    size_t cap = strlen(mm3_last_error()) + 1; /* the buffer's size: the message filled it */
    assert_true(cap > 512 && cap < sizeof big);
    mm3_error_prefix(-EINVAL, "loading %s: ", "transformer");
    const char *m = mm3_last_error();
    assert_int_equal(strlen(m), cap - 1);
    assert_memory_equal(m, "loading transformer: mmm", 24);
    assert_int_equal(m[cap - 2], 'm');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_prefix_cuts_a_long_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
