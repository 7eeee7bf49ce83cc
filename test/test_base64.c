/* Base64 of uploaded files (stage0/api/base64.h): every length round-trips, the known
 * vectors of RFC 4648 come out, and the strict decoder refuses what is not base64. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "stage0/api/base64.h"

static void test_rfc_vectors(void **state)
{
    (void)state;
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        char *s;
        assert_int_equal(base64_encode((const uint8_t *)plain[i], strlen(plain[i]), &s), 0);
        assert_string_equal(s, coded[i]);
        uint8_t *b;
        size_t n;
        assert_int_equal(base64_decode(s, strlen(s), &b, &n), 0);
        assert_int_equal(n, strlen(plain[i]));
        assert_memory_equal(b, plain[i], n);
        free(s);
        free(b);
    }
}

static void test_round_trip_every_byte(void **state)
{
    (void)state;
    uint8_t data[300];
    for (int i = 0; i < 300; i++)
        data[i] = (uint8_t)(i * 151 + 7);
    for (size_t len = 0; len <= sizeof data; len++) {
        char *s;
        assert_int_equal(base64_encode(data, len, &s), 0);
        assert_int_equal(strlen(s), (len + 2) / 3 * 4);
        uint8_t *b;
        size_t n;
        assert_int_equal(base64_decode(s, strlen(s), &b, &n), 0);
        assert_int_equal(n, len);
        assert_memory_equal(b, data, len);
        free(s);
        free(b);
    }
}

static void test_refuses_what_is_not_base64(void **state)
{
    (void)state;
    static const char *const bad[] = {"Zg=", "Zm9vY", "Zm9v\nYmFy", "Zm-v", "Z===", "=Zm9", "Zm=v", "Zm9vYmF$"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint8_t *b = (uint8_t *)1;
        size_t n = 1;
        if (base64_decode(bad[i], strlen(bad[i]), &b, &n) != -EINVAL) fail_msg("accepted '%s'", bad[i]);
        assert_null(b);
        assert_int_equal(n, 0);
        assert_non_null(strstr(mm3_last_error(), "not base64"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc_vectors),
        cmocka_unit_test(test_round_trip_every_byte),
        cmocka_unit_test(test_refuses_what_is_not_base64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
