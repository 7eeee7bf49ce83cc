/* The store of finished songs for continuation (stage0/recovery/song_store.h): a copy
 * comes back whole, and each bound (count, bytes, age) evicts what it should. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stage0/recovery/song_store.h"

#define NCB 4
#define SEC 1000000000LL

static void make_id(char *id, int k)
{
    snprintf(id, MM3_JOB_PUBLIC_ID_LEN + 1, "%032x", k);
}

static struct mm3_job_params params_of(int k)
{
    static char cap[64], ly[64];
    snprintf(cap, sizeof cap, "caption %d", k);
    snprintf(ly, sizeof ly, "lyrics %d", k);
    return (struct mm3_job_params){.caption = cap, .lyrics = ly, .seed = 1000u + (unsigned)k, .max_frames = 10 + k};
}

/* Put song k with n_steps steps whose codes are k * 1000 + their index. */
static int put(struct song_store *st, int k, int n_steps, int64_t now)
{
    int32_t *codes = malloc(sizeof(int32_t) * n_steps * NCB);
    for (int i = 0; i < n_steps * NCB; i++)
        codes[i] = k * 1000 + i;
    char id[MM3_JOB_PUBLIC_ID_LEN + 1];
    make_id(id, k);
    struct mm3_job_params p = params_of(k);
    int rc = song_store_put(st, id, &p, codes, n_steps, NCB, now);
    free(codes);
    return rc;
}

static int has(struct song_store *st, int k, int64_t now)
{
    char id[MM3_JOB_PUBLIC_ID_LEN + 1];
    make_id(id, k);
    struct song_record r;
    int rc = song_store_get(st, id, now, &r);
    song_record_free(&r);
    return rc == 0;
}

static void test_round_trip(void **state)
{
    (void)state;
    struct song_store *st;
    assert_int_equal(song_store_create(&st, &(struct song_store_limits){8, 1 << 20, 60}), 0);
    assert_int_equal(put(st, 3, 5, 0), 0);
    char id[MM3_JOB_PUBLIC_ID_LEN + 1];
    make_id(id, 3);
    struct song_record r;
    assert_int_equal(song_store_get(st, id, 1 * SEC, &r), 0);
    assert_string_equal(r.id, id);
    assert_string_equal(r.params.caption, "caption 3");
    assert_string_equal(r.params.lyrics, "lyrics 3");
    assert_int_equal(r.params.seed, 1003);
    assert_int_equal(r.params.max_frames, 13);
    assert_int_equal(r.n_steps, 5);
    assert_int_equal(r.n_codebooks, NCB);
    for (int i = 0; i < 5 * NCB; i++)
        assert_int_equal(r.codes[i], 3000 + i);
    song_record_free(&r);
    make_id(id, 4);
    assert_int_equal(song_store_get(st, id, 1 * SEC, &r), -ENOENT);
    /* the same id again replaces the song */
    assert_int_equal(put(st, 3, 2, 2 * SEC), 0);
    int n;
    int64_t bytes;
    song_store_usage(st, &n, &bytes);
    assert_int_equal(n, 1);
    struct mm3_job_params p = params_of(3);
    assert_int_equal(bytes, song_store_bytes(&p, 2, NCB));
    song_store_destroy(st);
}

static void test_count_bound(void **state)
{
    (void)state;
    struct song_store *st;
    assert_int_equal(song_store_create(&st, &(struct song_store_limits){3, 1 << 20, 60}), 0);
    for (int k = 1; k <= 5; k++)
        assert_int_equal(put(st, k, 4, k), 0);
    assert_false(has(st, 1, 10));
    assert_false(has(st, 2, 10));
    for (int k = 3; k <= 5; k++)
        assert_true(has(st, k, 10));
    song_store_destroy(st);
}

static void test_bytes_bound(void **state)
{
    (void)state;
    struct mm3_job_params p = params_of(1);
    int64_t one = song_store_bytes(&p, 100, NCB);
    struct song_store *st;
    /* room for two songs of 100 steps, not three */
    assert_int_equal(song_store_create(&st, &(struct song_store_limits){100, 2 * one + one / 2, 60}), 0);
    for (int k = 1; k <= 3; k++)
        assert_int_equal(put(st, k, 100, k), 0);
    assert_false(has(st, 1, 10));
    assert_true(has(st, 2, 10));
    assert_true(has(st, 3, 10));
    /* a song larger than the whole budget is not kept, and evicts nothing */
    assert_int_equal(put(st, 9, 1000, 11), 0);
    assert_false(has(st, 9, 12));
    assert_true(has(st, 2, 12));
    song_store_destroy(st);
}

static void test_age_bound(void **state)
{
    (void)state;
    struct song_store *st;
    assert_int_equal(song_store_create(&st, &(struct song_store_limits){10, 1 << 20, 30}), 0);
    assert_int_equal(put(st, 1, 3, 0), 0);
    assert_int_equal(put(st, 2, 3, 20 * SEC), 0);
    assert_true(has(st, 1, 30 * SEC));
    assert_false(has(st, 1, 31 * SEC));
    assert_true(has(st, 2, 31 * SEC));
    int n;
    int64_t bytes;
    song_store_usage(st, &n, &bytes);
    assert_int_equal(n, 1); /* the expired one was dropped when looked at */
    song_store_destroy(st);
}

static void test_off_and_bad_input(void **state)
{
    (void)state;
    struct song_store *st;
    assert_int_equal(song_store_create(&st, &(struct song_store_limits){-1, 0, 0}), -EINVAL);
    assert_int_equal(song_store_create(&st, &(struct song_store_limits){0, 1 << 20, 60}), 0);
    assert_int_equal(put(st, 1, 3, 0), 0);
    assert_false(has(st, 1, 0));
    struct mm3_job_params p = params_of(1);
    int32_t c[NCB] = {0};
    assert_int_equal(song_store_put(st, "short", &p, c, 1, NCB, 0), -EINVAL);
    song_store_destroy(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),      cmocka_unit_test(test_count_bound),
        cmocka_unit_test(test_bytes_bound),     cmocka_unit_test(test_age_bound),
        cmocka_unit_test(test_off_and_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
