/* Metrics registry: Prometheus text format 0.0.4 with HELP/TYPE lines, labels,
 * cumulative histogram buckets, and counts that survive concurrent updates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/metrics.h"

static char *render(void)
{
    char *text;
    size_t n;
    assert_int_equal(metrics_render(&text, &n), 0);
    assert_int_equal(strlen(text), n);
    return text;
}

static void expect_line(const char *text, const char *line)
{
    char want[256];
    snprintf(want, sizeof want, "\n%s\n", line);
    if (!strstr(text, want)) fail_msg("missing line '%s' in:\n%s", line, text);
}

static void test_format(void **state)
{
    metrics_reset();
    metrics_counter_add(&mm3_metrics.requests[METRICS_OUTCOME_OK], 3);
    metrics_counter_add(&mm3_metrics.requests[METRICS_OUTCOME_REJECTED], 1);
    metrics_gauge_set(&mm3_metrics.queue_depth, 7);
    metrics_gauge_add(&mm3_metrics.active_rows, 4);
    metrics_gauge_add(&mm3_metrics.active_rows, -2);
    metrics_counter_add(&mm3_metrics.conn_bytes[METRICS_EDGE_S0_TO_S1], 1234);
    metrics_counter_add(&mm3_metrics.conn_wait_us[METRICS_EDGE_S1_TO_S0], 1500000);
    metrics_histogram_observe(&mm3_metrics.ttfa_seconds, 0.3);  /* le 0.5 */
    metrics_histogram_observe(&mm3_metrics.ttfa_seconds, 0.5);  /* le 0.5: bounds are inclusive */
    metrics_histogram_observe(&mm3_metrics.ttfa_seconds, 1000); /* +Inf only */
    char *t = render();
    assert_memory_equal(t, "# HELP mm3_requests_total ", 26);
    expect_line(t, "# TYPE mm3_requests_total counter");
    expect_line(t, "mm3_requests_total{outcome=\"ok\"} 3");
    expect_line(t, "mm3_requests_total{outcome=\"rejected\"} 1");
    expect_line(t, "mm3_requests_total{outcome=\"cancelled\"} 0");
    expect_line(t, "# TYPE mm3_queue_depth gauge");
    expect_line(t, "mm3_queue_depth 7");
    expect_line(t, "mm3_active_rows 2");
    expect_line(t, "mm3_connector_bytes_total{edge=\"stage0_to_stage1\"} 1234");
    expect_line(t, "mm3_connector_wait_seconds_total{edge=\"stage1_to_stage0\"} 1.500000");
    expect_line(t, "# TYPE mm3_time_to_first_audio_seconds histogram");
    expect_line(t, "mm3_time_to_first_audio_seconds_bucket{le=\"0.25\"} 0");
    expect_line(t, "mm3_time_to_first_audio_seconds_bucket{le=\"0.5\"} 2");
    expect_line(t, "mm3_time_to_first_audio_seconds_bucket{le=\"300\"} 2");
    expect_line(t, "mm3_time_to_first_audio_seconds_bucket{le=\"+Inf\"} 3");
    expect_line(t, "mm3_time_to_first_audio_seconds_sum 1000.8");
    expect_line(t, "mm3_time_to_first_audio_seconds_count 3");
    expect_line(t, "mm3_real_time_factor_count 0");
    assert_int_equal(t[strlen(t) - 1], '\n');
    /* Every metric family has HELP and TYPE right before its samples. */
    int help = 0, type = 0;
    for (char *p = t; (p = strstr(p, "# HELP ")); p++)
        help++;
    for (char *p = t; (p = strstr(p, "# TYPE ")); p++)
        type++;
    assert_int_equal(help, type);
    assert_true(help >= 14);
    free(t);
}

static void *hammer(void *arg)
{
    for (int i = 0; i < 20000; i++) {
        metrics_counter_add(&mm3_metrics.frames, 1);
        metrics_histogram_observe(&mm3_metrics.rtf, 0.25);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    metrics_reset();
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, hammer, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    char *t = render();
    expect_line(t, "mm3_frames_total 80000");
    expect_line(t, "mm3_real_time_factor_count 80000");
    expect_line(t, "mm3_real_time_factor_sum 20000");
    expect_line(t, "mm3_real_time_factor_bucket{le=\"0.2\"} 0");
    expect_line(t, "mm3_real_time_factor_bucket{le=\"0.3\"} 80000");
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
