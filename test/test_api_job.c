/* The job object shared by the HTTP and engine threads: bounded PCM queue with
 * timeouts, end markers that stick, cancel exactly once, reference counting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "stage0/api/job.h"

static struct mm3_job *make_job(size_t queue)
{
    struct mm3_job_params p = {.lyrics = "la", .caption = "pop", .max_frames = 100};
    struct mm3_job *j;
    assert_int_equal(mm3_job_create(&j, &p, 2, 44100, queue), 0);
    assert_ptr_not_equal(j->params.lyrics, p.lyrics); /* copied */
    return j;
}

static void test_queue_and_markers(void **state)
{
    struct mm3_job *j = make_job(2);
    float pcm[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    assert_int_equal(mm3_job_state(j), MM3_JOB_QUEUED);
    mm3_job_set_running(j);
    assert_int_equal(mm3_job_state(j), MM3_JOB_RUNNING);
    assert_int_equal(mm3_job_push_pcm(j, pcm, 4, 0), 0);
    assert_int_equal(mm3_job_push_pcm(j, pcm, 2, 0), 0);
    assert_int_equal(mm3_job_push_pcm(j, pcm, 2, 0), -ETIMEDOUT);  /* full, no wait */
    assert_int_equal(mm3_job_push_pcm(j, pcm, 2, 30), -ETIMEDOUT); /* full, waited */
    assert_int_equal(mm3_job_finish(j), 0);                        /* the end marker always fits */
    assert_int_equal(mm3_job_finish(j), -EPIPE);
    assert_int_equal(mm3_job_fail(j, 500, "late"), -EPIPE);
    assert_int_equal(mm3_job_state(j), MM3_JOB_DONE);
    assert_false(mm3_job_cancel(j)); /* nothing to cancel any more */

    struct mm3_job_chunk c;
    assert_int_equal(mm3_job_pop(j, &c, 0), 0);
    assert_int_equal(c.kind, MM3_CHUNK_PCM);
    assert_int_equal(c.n_frames, 4);
    assert_memory_equal(c.pcm, pcm, sizeof pcm);
    mm3_job_chunk_release(&c);
    assert_int_equal(mm3_job_pop(j, &c, 0), 0);
    assert_int_equal(c.n_frames, 2);
    mm3_job_chunk_release(&c);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(mm3_job_pop(j, &c, 0), 0);
        assert_int_equal(c.kind, MM3_CHUNK_END);
    }
    assert_int_equal(j->pcm_frames_pushed, 6);
    assert_true(j->t_first_audio_ns > 0);
    mm3_job_unref(j);
}

static void test_fail_and_error(void **state)
{
    struct mm3_job *j = make_job(1);
    struct mm3_job_chunk c;
    assert_int_equal(mm3_job_pop(j, &c, 20), -ETIMEDOUT);
    assert_int_equal(mm3_job_fail(j, 0, "stage %d died", 1), 0);
    assert_int_equal(mm3_job_state(j), MM3_JOB_FAILED);
    char msg[64];
    assert_int_equal(mm3_job_error(j, msg, sizeof msg), 500); /* 0 means "server error" */
    assert_string_equal(msg, "stage 1 died");
    assert_int_equal(mm3_job_pop(j, &c, 0), 0);
    assert_int_equal(c.kind, MM3_CHUNK_ERROR);
    float x[2] = {0};
    assert_int_equal(mm3_job_push_pcm(j, x, 1, 0), -EPIPE);
    mm3_job_set_error(j, 400, "field 'input': too many tokens");
    assert_int_equal(mm3_job_error(j, msg, sizeof msg), 400);
    mm3_job_unref(j);
}

static void *blocked_pusher(void *arg)
{
    struct mm3_job *j = arg;
    float x[2] = {0};
    intptr_t rc = mm3_job_push_pcm(j, x, 1, -1); /* queue is full: waits until cancelled */
    mm3_job_unref(j);
    return (void *)rc;
}

static void test_cancel_once_wakes_pusher(void **state)
{
    struct mm3_job *j = make_job(1);
    float x[2] = {0};
    assert_int_equal(mm3_job_push_pcm(j, x, 1, 0), 0);
    mm3_job_ref(j); /* the "engine" reference */
    pthread_t th;
    pthread_create(&th, NULL, blocked_pusher, j);
    assert_true(mm3_job_cancel(j));
    assert_false(mm3_job_cancel(j));
    void *rc;
    pthread_join(th, &rc);
    assert_int_equal((intptr_t)rc, -ECANCELED);
    assert_int_equal(mm3_job_state(j), MM3_JOB_CANCELLED);
    assert_int_equal(mm3_job_finish(j), 0); /* an engine finishing late changes nothing */
    assert_int_equal(mm3_job_state(j), MM3_JOB_CANCELLED);
    mm3_job_unref(j); /* last reference frees the queued chunk too (ASan checks) */
}

static void test_progress(void **state)
{
    struct mm3_job *j = make_job(1);
    assert_int_equal(j->frames_total, 100);
    mm3_job_progress_add(j, 25, 0);
    mm3_job_progress_add(j, 75, 1);
    mm3_job_set_frames_total(j, 80);
    assert_int_equal(j->frames_done, 100);
    assert_int_equal(j->windows_done, 1);
    assert_int_equal(j->frames_total, 80);
    mm3_job_unref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_queue_and_markers),
        cmocka_unit_test(test_fail_and_error),
        cmocka_unit_test(test_cancel_once_wakes_pusher),
        cmocka_unit_test(test_progress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
