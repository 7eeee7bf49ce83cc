/* The deploy file's per-stage `lora:` list and stage 0's `lora_modules:` (common/deploy.c):
 * entries with their defaults, and each malformed entry refused with the key path and
 * what was expected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include "common/deploy.h"
#include "common/error.h"

static void test_lora_lists(void **state)
{
    (void)state;
    struct mm3_deploy d;
    const char *yaml = "stages:\n"
                       "  - stage_id: 0\n"
                       "    lora:\n"
                       "      - {path: /a/voice}\n"
                       "      - {path: /a/depth, scale: 0.5, component: rvq_depth_decoder}\n"
                       "  - stage_id: 1\n"
                       "    lora: [{path: /a/lcm, scale: -1}]\n";
    assert_int_equal(mm3_deploy_load_string(&d, yaml, "l"), 0);
    const struct mm3_stage_config *s0 = mm3_deploy_stage(&d, 0), *s1 = mm3_deploy_stage(&d, 1);
    assert_int_equal(s0->n_lora, 2);
    assert_string_equal(s0->lora[0].path, "/a/voice");
    assert_string_equal(s0->lora[0].component, "language_model");
    assert_true(s0->lora[0].scale == 1.0);
    assert_string_equal(s0->lora[1].component, "rvq_depth_decoder");
    assert_true(s0->lora[1].scale == 0.5);
    assert_int_equal(s1->n_lora, 1);
    assert_string_equal(s1->lora[0].component, "transformer");
    assert_true(s1->lora[0].scale == -1.0);
    mm3_deploy_free(&d);
    assert_int_equal(mm3_deploy_load_string(&d, "stages:\n  - stage_id: 0\n  - stage_id: 1\n", "l"), 0);
    assert_int_equal(d.stages[0].n_lora, 0);
    assert_int_equal(d.stages[1].n_lora, 0);
    mm3_deploy_free(&d);
}

static void expect_error(const char *stage0_lora, const char *stage1_lora, const char *needle)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "stages:\n  - stage_id: 0\n%s  - stage_id: 1\n%s", stage0_lora, stage1_lora);
    struct mm3_deploy d;
    assert_true(mm3_deploy_load_string(&d, yaml, "bad") < 0);
    if (!strstr(mm3_last_error(), needle)) fail_msg("error '%s' lacks '%s'", mm3_last_error(), needle);
    mm3_deploy_free(&d);
}

static void test_lora_errors(void **state)
{
    (void)state;
    expect_error("    lora: /a\n", "", "stages[0].lora: expected a list of adapters");
    expect_error("    lora: [{scale: 1}]\n", "", "stages[0].lora[0].path: missing");
    expect_error("    lora: [{path: /a, rank: 4}]\n", "", "stages[0].lora[0].rank: unknown key");
    expect_error("    lora: [{path: /a, scale: 1000}]\n", "", "stages[0].lora[0].scale: expected a number in");
    expect_error("    lora: [{path: /a, component: transformer}]\n", "",
                 "stages[0].lora[0].component: expected one of language_model, rvq_depth_decoder");
    expect_error("", "    lora: [{path: /a}, {path: /b, component: language_model}]\n",
                 "stages[1].lora[1].component: expected one of transformer");
    expect_error("    lora: [/a]\n", "", "stages[0].lora[0]: expected a mapping");
    expect_error("    lora: [{path: ''}]\n", "", "stages[0].lora[0].path: expected a non-empty string");
    expect_error("    lora: [{path: a}, {path: a}, {path: a}, {path: a}, {path: a}, {path: a}, {path: a}, {path: a},"
                 " {path: a}]\n",
                 "", "stages[0].lora: expected at most 8 adapters");
}

static void test_lora_modules(void **state)
{
    (void)state;
    struct mm3_deploy d;
    const char *yaml = "stages:\n"
                       "  - stage_id: 0\n"
                       "    lora_modules:\n"
                       "      - {name: rock, path: /a/rock}\n"
                       "      - {name: jazz.v2_x-1, path: /a/jazz, scale: 0.5, component: language_model}\n"
                       "  - stage_id: 1\n";
    assert_int_equal(mm3_deploy_load_string(&d, yaml, "m"), 0);
    const struct mm3_stage_config *s0 = mm3_deploy_stage(&d, 0);
    assert_int_equal(s0->n_lora_modules, 2);
    assert_string_equal(s0->lora_modules[0].name, "rock");
    assert_string_equal(s0->lora_modules[0].path, "/a/rock");
    assert_true(s0->lora_modules[0].scale == 1.0);
    assert_string_equal(s0->lora_modules[1].name, "jazz.v2_x-1");
    assert_true(s0->lora_modules[1].scale == 0.5);
    assert_int_equal(s0->n_lora, 0);
    mm3_deploy_free(&d);
}

static void test_lora_modules_errors(void **state)
{
    (void)state;
    expect_error("    lora_modules: /a\n", "", "bad:3:19: stages[0].lora_modules: expected a list of adapters");
    expect_error("    lora_modules: [{path: /a}]\n", "", "stages[0].lora_modules[0].name: missing");
    expect_error("    lora_modules: [{name: a}]\n", "", "stages[0].lora_modules[0].path: missing");
    expect_error("    lora_modules: [{name: 'a b', path: /a}]\n", "",
                 "bad:3:27: stages[0].lora_modules[0].name: expected only letters, digits");
    expect_error("    lora_modules: [{name: a/b, path: /a}]\n", "", "stages[0].lora_modules[0].name: expected only");
    expect_error("    lora_modules: [{name: MiniMax-Music3, path: /a}]\n", "",
                 "stages[0].lora_modules[0].name: 'MiniMax-Music3' is the base model's name");
    expect_error("    lora_modules: [{name: a, path: /a}, {name: b, path: /b}, {name: a, path: /c}]\n", "",
                 "stages[0].lora_modules[2].name: 'a' is already the name of lora_modules[0]");
    expect_error("    lora_modules: [{name: a, path: /a, component: rvq_depth_decoder}]\n", "",
                 "stages[0].lora_modules[0].component: expected 'language_model': only talker adapters");
    expect_error("    lora_modules: [{name: a, path: /a, rank: 4}]\n", "",
                 "stages[0].lora_modules[0].rank: unknown key");
    expect_error("", "    lora_modules: [{name: a, path: /a}]\n", "stages[1].lora_modules: only stage 0");
    char many[1024] = "    lora_modules: [";
    for (int i = 0; i < 9; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s{name: a%d, path: /a}", i ? ", " : "", i);
    strcat(many, "]\n");
    expect_error(many, "", "stages[0].lora_modules: expected at most 8 adapters served per request");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lora_lists),
        cmocka_unit_test(test_lora_errors),
        cmocka_unit_test(test_lora_modules),
        cmocka_unit_test(test_lora_modules_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
