/* The render knobs of the command line (common/cli_render.h): values in range are
 * stored and marked given, values out of range are refused with a message naming
 * the option and the range, other options are left to the program. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "common/cli_render.h"
#include "common/error.h"

static void test_values_stored(void **state)
{
    (void)state;
    struct cli_render r = {.steps = 30, .guidance = 1.7f};
    assert_int_equal(cli_render_option(&r, CLI_RENDER_SEED, "18446744073709551615"), 1);
    assert_true(r.seed == UINT64_MAX && r.seed_given);
    assert_false(r.steps_given || r.guidance_given || r.as_float);
    assert_int_equal(r.steps, 30); /* defaults kept until given */
    assert_int_equal(cli_render_option(&r, CLI_RENDER_STEPS, "1000"), 1);
    assert_true(r.steps == 1000 && r.steps_given);
    assert_int_equal(cli_render_option(&r, CLI_RENDER_GUIDANCE, "0"), 1);
    assert_true(r.guidance == 0.0f && r.guidance_given);
    assert_false(r.shift_given);
    assert_int_equal(cli_render_option(&r, CLI_RENDER_SHIFT, "2.5"), 1);
    assert_true(r.shift == 2.5f && r.shift_given);
    assert_int_equal(cli_render_option(&r, CLI_RENDER_FLOAT, NULL), 1);
    assert_true(r.as_float);
}

static void test_bad_values_refused(void **state)
{
    (void)state;
    struct cli_render r = {.steps = 30, .guidance = 1.7f};
    static const struct {
        int opt;
        const char *arg, *message;
    } bad[] = {
        {CLI_RENDER_SEED, "-1", "--seed '-1': expected a non-negative integer"},
        {CLI_RENDER_SEED, "18446744073709551616", "--seed '18446744073709551616': expected a non-negative integer"},
        {CLI_RENDER_SEED, "", "--seed '': expected a non-negative integer"},
        {CLI_RENDER_STEPS, "0", "--steps '0': expected an integer in 1..1000"},
        {CLI_RENDER_STEPS, "1001", "--steps '1001': expected an integer in 1..1000"},
        {CLI_RENDER_STEPS, "5x", "--steps '5x': expected an integer in 1..1000"},
        {CLI_RENDER_GUIDANCE, "100.5", "--guidance '100.5': expected a number in 0..100"},
        {CLI_RENDER_GUIDANCE, "-0.1", "--guidance '-0.1': expected a number in 0..100"},
        {CLI_RENDER_GUIDANCE, "nan", "--guidance 'nan': expected a number in 0..100"},
        {CLI_RENDER_GUIDANCE, "1e", "--guidance '1e': expected a number in 0..100"},
        {CLI_RENDER_SHIFT, "0", "--shift '0': expected a number in (0, 20]"},
        {CLI_RENDER_SHIFT, "20.5", "--shift '20.5': expected a number in (0, 20]"},
        {CLI_RENDER_SHIFT, "nan", "--shift 'nan': expected a number in (0, 20]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(cli_render_option(&r, bad[i].opt, bad[i].arg), -EINVAL);
        assert_string_equal(mm3_last_error(), bad[i].message);
    }
    /* nothing was taken from the refused values */
    assert_false(r.seed_given || r.steps_given || r.guidance_given || r.shift_given);
    assert_int_equal(r.steps, 30);
    assert_true(r.guidance == 1.7f);
}

static void test_other_options_not_taken(void **state)
{
    (void)state;
    struct cli_render r = {0};
    assert_int_equal(cli_render_option(&r, 'o', "out.wav"), 0);
    assert_int_equal(cli_render_option(&r, '?', NULL), 0);
    struct cli_render zero = {0};
    assert_memory_equal(&r, &zero, sizeof r);
}

static void test_u64_parse(void **state)
{
    (void)state;
    uint64_t v = 7;
    assert_int_equal(cli_u64_parse("0", &v), 0);
    assert_true(v == 0);
    assert_int_equal(cli_u64_parse("44100", &v), 0);
    assert_true(v == 44100);
    assert_int_equal(cli_u64_parse("-0", &v), -EINVAL);
    assert_int_equal(cli_u64_parse("1 ", &v), -EINVAL);
    assert_int_equal(cli_u64_parse("", &v), -EINVAL);
    assert_true(v == 44100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_stored),
        cmocka_unit_test(test_bad_values_refused),
        cmocka_unit_test(test_other_options_not_taken),
        cmocka_unit_test(test_u64_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
