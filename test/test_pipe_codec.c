/* The pipeline codec (pipe/pipe_codec.h): every message kind survives encode -> decode,
 * also through a real shmconn channel (the zero-copy PCM path included), and a decoder
 * refuses a wrong kind, a missing tensor, a wrong dtype or shape, a byte size that
 * disagrees with the shape and sizes past the wire's limits, naming the tensor and what
 * it expected. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/dtype.h"
#include "common/error.h"
#include "pipe/pipe_codec.h"
#include "support/test_shm.h"

/* The last error contains every one of the NULL-terminated fragments. */
static void expect_error(int rc, int code, ...)
{
    assert_int_equal(rc, code);
    va_list ap;
    va_start(ap, code);
    for (const char *s; (s = va_arg(ap, const char *));)
        if (!strstr(mm3_last_error(), s)) fail_msg("error '%s' lacks '%s'", mm3_last_error(), s);
    va_end(ap);
}

/* A valid FRAMES message of [2, 3] zeros, for a test to spoil. */
static void frames_2x3(struct shmconn_msg *m)
{
    static const float zeros[6];
    assert_int_equal(pipe_encode_frames(m, &(struct pipe_frames){.frames = zeros, .n = 2, .width = 3}), 0);
}

static struct pipe_start start_example(void)
{
    return (struct pipe_start){.params = {.version = PIPE_PARAMS_VERSION,
                                          .frame_width = 4096,
                                          .seed = 0x123456789abcull,
                                          .max_frames = 1500,
                                          .num_inference_steps = 30,
                                          .guidance_scale = 1.7f,
                                          .sample_rate = 32000,
                                          .premixed = 1,
                                          .flow_shift = 3.0f,
                                          .streamed = 1}};
}

static void test_start_round_trip(void **state)
{
    (void)state;
    struct pipe_start in = start_example(), out;
    struct shmconn_msg m;
    assert_int_equal(pipe_encode_start(&m, &in), 0);
    assert_int_equal(m.kind, PIPE_MSG_START);
    assert_int_equal(m.flags, SHMCONN_FLAG_FIRST);
    assert_int_equal(m.n_tensors, 1);
    assert_int_equal(pipe_decode_start(&m, &out), 0);
    assert_memory_equal(&out.params, &in.params, sizeof in.params);
    assert_null(out.replay);

    const char *path = "case0.safetensors";
    in.replay = path;
    in.replay_len = strlen(path);
    assert_int_equal(pipe_encode_start(&m, &in), 0);
    assert_int_equal(m.n_tensors, 2);
    assert_int_equal(pipe_decode_start(&m, &out), 0);
    assert_int_equal(out.replay_len, strlen(path));
    assert_memory_equal(out.replay, path, strlen(path));

    /* a stale peer binary: same size, other version */
    struct pipe_start old = start_example();
    old.params.version = PIPE_PARAMS_VERSION + 1;
    assert_int_equal(pipe_encode_start(&m, &old), 0);
    expect_error(pipe_decode_start(&m, &out), -EBADMSG, "START", "version", "builds differ", NULL);
}

static void test_frames_end_cancel_play_round_trip(void **state)
{
    (void)state;
    float frames[3 * 5];
    for (int i = 0; i < 15; i++)
        frames[i] = (float)i * 0.5f;
    struct pipe_frames in = {.frames = frames, .n = 3, .width = 5, .first = 200}, out;
    struct shmconn_msg m;
    assert_int_equal(pipe_encode_frames(&m, &in), 0);
    assert_int_equal(m.kind, PIPE_MSG_FRAMES);
    assert_int_equal(m.flags, 0);
    assert_int_equal(m.tensors[0].nbytes, sizeof frames);
    assert_int_equal(pipe_decode_frames(&m, &out), 0);
    assert_int_equal(out.n, 3);
    assert_int_equal(out.width, 5);
    assert_int_equal(out.first, 200);
    assert_memory_equal(out.frames, frames, sizeof frames);

    int64_t total = 1234, got = 0;
    assert_int_equal(pipe_encode_end(&m, &total), 0);
    assert_int_equal(m.flags, SHMCONN_FLAG_LAST);
    assert_int_equal(pipe_decode_end(&m, &got), 0);
    assert_int_equal(got, 1234);

    pipe_encode_cancel(&m);
    assert_int_equal(m.kind, PIPE_MSG_CANCEL);
    assert_int_equal(m.flags, SHMCONN_FLAG_CANCELLED);
    assert_int_equal(m.n_tensors, 0);

    int64_t t_play = 123456789, t_got = 0;
    assert_int_equal(pipe_encode_play(&m, &t_play), 0);
    assert_int_equal(m.kind, PIPE_MSG_PLAY);
    assert_int_equal(m.flags, 0); /* it may follow END: it ends nothing */
    assert_int_equal(pipe_decode_play(&m, &t_got), 0);
    assert_int_equal(t_got, 123456789);
    assert_string_equal(pipe_kind_name(PIPE_MSG_PLAY), "PLAY");
    m.n_tensors = 0;
    expect_error(pipe_decode_play(&m, &t_got), -EBADMSG, "bad PLAY message", "tensor 't_play_us' missing", NULL);
}

static void test_pcm_done_error_round_trip(void **state)
{
    (void)state;
    float pcm[2 * 4] = {1, 2, 3, 4, -1, -2, -3, -4};
    struct pipe_pcm in = {.pcm = pcm, .n = 4, .progress = {3, 7, 1500000}}, out;
    struct shmconn_msg m;
    assert_int_equal(pipe_encode_pcm(&m, &in), 0);
    assert_int_equal(pipe_decode_pcm(&m, &out), 0);
    assert_int_equal(out.n, 4);
    assert_memory_equal(out.pcm, pcm, sizeof pcm);
    assert_int_equal(out.progress.windows_done, 3);
    assert_int_equal(out.progress.windows_planned, 7);
    assert_int_equal(out.progress.work_us, 1500000);

    /* zero copy: shapes only, then the writer fills what the connector reserved */
    float region_pcm[8];
    int64_t region_progress[3];
    assert_int_equal(pipe_encode_pcm(&m, &(struct pipe_pcm){.n = 4}), 0);
    assert_null(m.tensors[0].data);
    assert_null(m.tensors[1].data);
    m.tensors[0].data = region_pcm;
    m.tensors[1].data = region_progress;
    pipe_pcm_write(&m, pcm, pcm + 4, &in.progress);
    assert_int_equal(pipe_decode_pcm(&m, &out), 0);
    assert_memory_equal(out.pcm, pcm, sizeof pcm);
    assert_int_equal(out.progress.work_us, 1500000);

    struct pipe_done done = {.total = 96000, .fp16_rescues = 2}, d;
    assert_int_equal(pipe_encode_done(&m, &done), 0);
    assert_int_equal(m.flags, SHMCONN_FLAG_LAST);
    assert_int_equal(pipe_decode_done(&m, &d), 0);
    assert_int_equal(d.total, 96000);
    assert_int_equal(d.fp16_rescues, 2);
    done.fp16_rescues = -1; /* left out: the decoder says so with -1 */
    assert_int_equal(pipe_encode_done(&m, &done), 0);
    assert_int_equal(m.n_tensors, 1);
    assert_int_equal(pipe_decode_done(&m, &d), 0);
    assert_int_equal(d.fp16_rescues, -1);

    const char *why = "window 3 failed";
    const char *text;
    size_t len;
    assert_int_equal(pipe_encode_error(&m, why, strlen(why)), 0);
    assert_int_equal(m.flags, SHMCONN_FLAG_ERROR);
    assert_int_equal(pipe_decode_error(&m, &text, &len), 0);
    assert_int_equal(len, strlen(why));
    assert_memory_equal(text, why, len);
}

static void test_rejects_wrong_kind_and_missing(void **state)
{
    (void)state;
    int64_t total = 5;
    struct shmconn_msg m;
    struct pipe_frames f;
    assert_int_equal(pipe_encode_end(&m, &total), 0);
    expect_error(pipe_decode_frames(&m, &f), -EBADMSG, "bad FRAMES message", "kind 3 (END)", NULL);

    float frames[4] = {0};
    assert_int_equal(pipe_encode_frames(&m, &(struct pipe_frames){.frames = frames, .n = 1, .width = 4}), 0);
    m.n_tensors = 1; /* "first" dropped */
    expect_error(pipe_decode_frames(&m, &f), -EBADMSG, "bad FRAMES message", "tensor 'first' missing", NULL);

    struct pipe_pcm p;
    assert_int_equal(pipe_encode_pcm(&m, &(struct pipe_pcm){.pcm = frames, .n = 2}), 0);
    m.n_tensors = 1; /* progress is part of every PCM message */
    expect_error(pipe_decode_pcm(&m, &p), -EBADMSG, "tensor 'progress' missing", NULL);

    struct pipe_done d;
    pipe_encode_cancel(&m);
    m.kind = PIPE_MSG_DONE;
    expect_error(pipe_decode_done(&m, &d), -EBADMSG, "bad DONE message", "tensor 'total' missing", NULL);
}

static void test_rejects_wrong_dtype(void **state)
{
    (void)state;
    struct shmconn_msg m;
    struct pipe_frames f;
    frames_2x3(&m);
    m.tensors[0].dtype = MM3_DTYPE_F16; /* 12 bytes would be F16 [2, 3] */
    m.tensors[0].nbytes = 12;
    expect_error(pipe_decode_frames(&m, &f), -EBADMSG, "tensor 'frames'", "dtype F16, expected F32", NULL);

    int64_t total = 9, got;
    assert_int_equal(pipe_encode_end(&m, &total), 0);
    m.tensors[0].dtype = SHMCONN_DTYPE_I32;
    m.tensors[0].nbytes = 4;
    expect_error(pipe_decode_end(&m, &got), -EBADMSG, "bad END message", "tensor 'total'", "dtype I32, expected I64",
                 NULL);

    const char *text;
    size_t len;
    assert_int_equal(pipe_encode_error(&m, "abcd", 4), 0);
    m.tensors[0].dtype = MM3_DTYPE_F32;
    m.tensors[0].nbytes = 16;
    expect_error(pipe_decode_error(&m, &text, &len), -EBADMSG, "tensor 'message'", "dtype F32, expected U8", NULL);
}

static void test_rejects_wrong_shape(void **state)
{
    (void)state;
    float pcm[6] = {0};
    struct shmconn_msg m;
    struct pipe_pcm p;
    /* mono PCM: [1, 6] instead of [2, n] */
    assert_int_equal(pipe_encode_pcm(&m, &(struct pipe_pcm){.pcm = pcm, .n = 3}), 0);
    m.tensors[0].shape[0] = 1;
    m.tensors[0].shape[1] = 6;
    expect_error(pipe_decode_pcm(&m, &p), -EBADMSG, "tensor 'pcm'", "shape [1, 6], expected [2, n]", NULL);

    /* rank: frames as [6] */
    struct pipe_frames f;
    frames_2x3(&m);
    m.tensors[0].ndim = 1;
    m.tensors[0].shape[0] = 6;
    expect_error(pipe_decode_frames(&m, &f), -EBADMSG, "tensor 'frames'", "shape [6], expected [n, n]", NULL);

    /* a scalar of two values */
    int64_t two[2] = {1, 2};
    frames_2x3(&m);
    m.tensors[1].shape[0] = 2;
    m.tensors[1].nbytes = sizeof two;
    m.tensors[1].data = two;
    expect_error(pipe_decode_frames(&m, &f), -EBADMSG, "tensor 'first'", "shape [2], expected [1]", NULL);

    /* params of another size (a peer with another struct layout) */
    struct pipe_start st = start_example(), got;
    assert_int_equal(pipe_encode_start(&m, &st), 0);
    m.tensors[0].shape[0] = 60;
    m.tensors[0].nbytes = 60;
    expect_error(pipe_decode_start(&m, &got), -EBADMSG, "tensor 'params'", "shape [60], expected [64]", NULL);
}

static void test_rejects_sizes(void **state)
{
    (void)state;
    float frames[6] = {0};
    struct shmconn_msg m;
    struct pipe_frames f;
    /* bytes that disagree with the shape */
    frames_2x3(&m);
    m.tensors[0].nbytes = 20;
    expect_error(pipe_decode_frames(&m, &f), -EBADMSG, "tensor 'frames'", "20 bytes for shape [2, 3] of F32", NULL);

    /* a dimension past what a stage counts in an int, and a product past 64 bits */
    frames_2x3(&m);
    m.tensors[0].shape[0] = (int64_t)1 << 40;
    m.tensors[0].shape[1] = (int64_t)1 << 40;
    expect_error(pipe_decode_frames(&m, &f), -EBADMSG, "tensor 'frames'", "expected [n, n] (n up to 2147483647)", NULL);
    m.tensors[0].shape[0] = (int64_t)1 << 31;
    expect_error(pipe_decode_frames(&m, &f), -EBADMSG, "tensor 'frames'", NULL);

    /* the encoder refuses what the decoder would: nothing past the limits goes out */
    expect_error(pipe_encode_frames(&m, &(struct pipe_frames){.frames = frames, .n = (int64_t)1 << 31, .width = 3}),
                 -EOVERFLOW, "FRAMES message", "tensor 'frames'", "dimension 0 expected 0..2147483647", NULL);
    expect_error(pipe_encode_frames(&m, &(struct pipe_frames){.frames = frames, .n = 2, .width = -1}), -EOVERFLOW,
                 "tensor 'frames'", "dimension 1", NULL);
    expect_error(pipe_encode_pcm(&m, &(struct pipe_pcm){.n = INT64_MAX}), -EOVERFLOW, "PCM message", "tensor 'pcm'",
                 NULL);
    expect_error(pipe_encode_error(&m, "x", SIZE_MAX / 2), -EOVERFLOW, "ERROR message", "tensor 'message'", NULL);
}

/* Send m as chunk `chunk` of request 7. */
static void send_chunk(shmconn_t *tx, struct shmconn_msg *m, uint32_t chunk)
{
    m->req_id = 7;
    m->chunk = chunk;
    assert_int_equal(shmconn_send(tx, m, 1.0), 0);
}

/* The codec's messages pass the connector's own checks: START, FRAMES (through the
 * payload area), a zero-copy PCM as stage 1 sends it, and END, decoded from the region. */
static void test_through_shmconn(void **state)
{
    (void)state;
    struct shmconn_config cfg = test_shm_config("codec", 256, 1u << 20, 8);
    shmconn_t *tx, *rx;
    assert_int_equal(shmconn_create(&tx, &cfg), 0);
    assert_int_equal(shmconn_open(&rx, &cfg, 1.0), 0);
    assert_int_equal(shmconn_request_begin(rx, 7), 0);

    float frames[100 * 8];
    for (int i = 0; i < 800; i++)
        frames[i] = (float)i;
    struct pipe_start st = start_example();
    int64_t total = 100;
    float left[5] = {1, 2, 3, 4, 5}, right[5] = {-1, -2, -3, -4, -5};
    struct pipe_progress pr = {1, 2, 3};
    struct shmconn_msg m;
    assert_int_equal(pipe_encode_start(&m, &st), 0);
    send_chunk(tx, &m, 0);
    assert_int_equal(pipe_encode_frames(&m, &(struct pipe_frames){.frames = frames, .n = 100, .width = 8}), 0);
    send_chunk(tx, &m, 1);
    assert_int_equal(pipe_encode_pcm(&m, &(struct pipe_pcm){.n = 5}), 0);
    m.req_id = 7, m.chunk = 2;
    assert_int_equal(shmconn_send_begin(tx, &m, 1.0), 0);
    pipe_pcm_write(&m, left, right, &pr);
    assert_int_equal(shmconn_send_commit(tx, &m), 0);
    assert_int_equal(pipe_encode_end(&m, &total), 0);
    send_chunk(tx, &m, 3);

    struct shmconn_event ev[4];
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(shmconn_recv(rx, &ev[i], 1.0), 0);
        assert_int_equal(ev[i].msg.chunk, i);
    }
    struct pipe_start st_got;
    assert_int_equal(pipe_decode_start(&ev[0].msg, &st_got), 0);
    assert_memory_equal(&st_got.params, &st.params, sizeof st.params);
    struct pipe_frames fr_got;
    assert_int_equal(pipe_decode_frames(&ev[1].msg, &fr_got), 0);
    assert_int_equal(fr_got.n, 100);
    assert_memory_equal(fr_got.frames, frames, sizeof frames);
    struct pipe_pcm pcm;
    assert_int_equal(pipe_decode_pcm(&ev[2].msg, &pcm), 0);
    assert_int_equal(pcm.n, 5);
    assert_memory_equal(pcm.pcm, left, sizeof left);
    assert_memory_equal(pcm.pcm + 5, right, sizeof right);
    assert_int_equal(pcm.progress.windows_planned, 2);
    int64_t total_got;
    assert_int_equal(pipe_decode_end(&ev[3].msg, &total_got), 0);
    assert_int_equal(total_got, 100);
    for (int i = 0; i < 4; i++)
        assert_int_equal(shmconn_release(rx, &ev[i].msg), 0);

    shmconn_close(rx);
    shmconn_close(tx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_round_trip),
        cmocka_unit_test(test_frames_end_cancel_play_round_trip),
        cmocka_unit_test(test_pcm_done_error_round_trip),
        cmocka_unit_test(test_rejects_wrong_kind_and_missing),
        cmocka_unit_test(test_rejects_wrong_dtype),
        cmocka_unit_test(test_rejects_wrong_shape),
        cmocka_unit_test(test_rejects_sizes),
        cmocka_unit_test(test_through_shmconn),
    };
    test_shm_prefix_init("mm3t"); /* under test/shmconn.cmake's leak check */
    return cmocka_run_group_tests(tests, NULL, test_shm_group_teardown);
}
