/* Vocoder conv ops: hand-computed small cases (Snake, Conv1d with padding and
 * dilation, ConvTranspose1d with stride and padding, the [in, out, k] layout, weight
 * norm along dim 0 of both layouts), then the tiled loops against the defining
 * formula on inputs long enough to cross many tiles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "common/ops_conv.h"
#include "support/test_support.h"

static void assert_close(const float *got, const double *want, int n, double tol)
{
    for (int i = 0; i < n; i++) {
        if (fabs(got[i] - want[i]) > tol * (1.0 + fabs(want[i]))) {
            print_error("element %d: got %.9g, want %.9g\n", i, got[i], want[i]);
            fail();
        }
    }
}

static void test_snake(void **state)
{
    (void)state;
    const double pi = 3.14159265358979323846;
    /* y = x + sin(a x)^2 / a: a = 1 at pi/2 adds 1; a = 0.5 at pi adds 2; sin(1)^2 = 0.70807342 */
    float alpha[2] = {1.0f, 0.5f};
    float x[6] = {0.0f, (float)(pi / 2), -1.0f, 0.0f, (float)pi, 2.0f};
    double want[6] = {0.0, pi / 2 + 1.0, -1.0 + 0.7080734182735712, 0.0, pi + 2.0, 2.0 + 2 * 0.7080734182735712};
    float y[6];
    op_snake(y, x, alpha, 2, 3);
    assert_close(y, want, 6, 1e-6);
    op_snake(x, x, alpha, 2, 3); /* in place */
    assert_close(x, want, 6, 1e-6);
}

static void test_conv1d_hand(void **state)
{
    (void)state;
    float x[4] = {1, 2, 3, 4}, w[3] = {1, 10, 100}, b[1] = {0.5f}, y[4];
    /* pad 1: y[n] = b + x[n-1] + 10 x[n] + 100 x[n+1] */
    assert_int_equal(op_conv1d_out_len(4, 3, 1, 1), 4);
    op_conv1d(y, x, w, b, &(struct conv1d_geometry){.c_in = 1, .c_out = 1, .t = 4, .k = 3, .dilation = 1, .pad = 1});
    assert_close(y, (double[]){210.5, 321.5, 432.5, 43.5}, 4, 0);
    /* dilation 2, pad 2: y[n] = b + x[n-2] + 10 x[n] + 100 x[n+2] */
    op_conv1d(y, x, w, b, &(struct conv1d_geometry){.c_in = 1, .c_out = 1, .t = 4, .k = 3, .dilation = 2, .pad = 2});
    assert_close(y, (double[]){310.5, 420.5, 31.5, 42.5}, 4, 0);
    /* no padding: only the 2 full windows, no bias */
    assert_int_equal(op_conv1d_out_len(4, 3, 1, 0), 2);
    op_conv1d(y, x, w, NULL, &(struct conv1d_geometry){.c_in = 1, .c_out = 1, .t = 4, .k = 3, .dilation = 1, .pad = 0});
    assert_close(y, (double[]){321, 432}, 2, 0);
    /* channels: w [out 2, in 2, k 1] mixes rows; y0 = x0 + 2 x1, y1 = 1 - x0 + x1/2 */
    float x2[4] = {1, 2, 3, 4}, w2[4] = {1, 2, -1, 0.5f}, b2[2] = {0, 1};
    op_conv1d(y, x2, w2, b2, &(struct conv1d_geometry){.c_in = 2, .c_out = 2, .t = 2, .k = 1, .dilation = 1, .pad = 0});
    assert_close(y, (double[]){7, 10, 1.5, 1}, 4, 0);
    /* the vocoder's dilated residual conv keeps the length */
    assert_int_equal(op_conv1d_out_len(10, 7, 9, 27), 10);
}

static void test_conv_transpose1d_hand(void **state)
{
    (void)state;
    /* x = [1, 2, 3], w = [1, 10, 100, 1000], stride 2: the unpadded output is
     * [1, 10, 102, 1020, 203, 2030, 300, 3000]; pad 1 drops one sample on each side. */
    float x[3] = {1, 2, 3}, w[4] = {1, 10, 100, 1000}, b[1] = {0.25f}, y[8];
    assert_int_equal(op_conv_transpose1d_out_len(3, 4, 2, 1), 6);
    op_conv_transpose1d(y, x, w, b,
                        &(struct conv1d_geometry){.c_in = 1, .c_out = 1, .t = 3, .k = 4, .stride = 2, .pad = 1});
    assert_close(y, (double[]){10.25, 102.25, 1020.25, 203.25, 2030.25, 300.25}, 6, 0);
    assert_int_equal(op_conv_transpose1d_out_len(3, 4, 2, 0), 8);
    op_conv_transpose1d(y, x, w, NULL,
                        &(struct conv1d_geometry){.c_in = 1, .c_out = 1, .t = 3, .k = 4, .stride = 2, .pad = 0});
    assert_close(y, (double[]){1, 10, 102, 1020, 203, 2030, 300, 3000}, 8, 0);
    /* layout [in, out, k]: x = [1; 2] (T 1), W[0] = [[1,2],[3,4]], W[1] = [[5,6],[7,8]];
     * y[o, kk] = W[0,o,kk] + 2 W[1,o,kk] (an [out, in, k] reading would give [7, 10, ...]) */
    float x2[2] = {1, 2}, w2[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    op_conv_transpose1d(y, x2, w2, NULL,
                        &(struct conv1d_geometry){.c_in = 2, .c_out = 2, .t = 1, .k = 2, .stride = 2, .pad = 0});
    assert_close(y, (double[]){11, 14, 17, 20}, 4, 0);
    /* the vocoder's upsampling geometry: k = 2s, pad = ceil(s/2) gives exactly s*T */
    assert_int_equal(op_conv_transpose1d_out_len(689, 16, 8, 4), 8 * 689);
    assert_int_equal(op_conv_transpose1d_out_len(689, 8, 4, 2), 4 * 689);
    assert_int_equal(op_conv_transpose1d_out_len(689, 4, 2, 1), 2 * 689);
}

static void test_weight_norm_fold(void **state)
{
    (void)state;
    /* Conv1d [out 2, in 1, k 2]: each output row scaled to norm g[o] */
    float v[4] = {3, 4, 0, 5}, g[2] = {10, 2}, w[4];
    op_weight_norm_fold(w, g, v, 2, 2);
    assert_close(w, (double[]){6, 8, 0, 2}, 4, 1e-7);
    /* ConvTranspose1d [in 1, out 2, k 1]: dim 0 is the INPUT channel, so the norm runs
     * over both output channels together: [3, 4] / 5, not [1, 1] per output */
    float vt[2] = {3, 4}, gt[1] = {1}, wt[2];
    op_weight_norm_fold(wt, gt, vt, 1, 2);
    assert_close(wt, (double[]){0.6, 0.8}, 2, 1e-7);
    /* in place */
    op_weight_norm_fold(v, g, v, 2, 2);
    assert_close(v, (double[]){6, 8, 0, 2}, 4, 1e-7);
}

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffff) / 32768.0f - 1.0f;
}

static void fill(float *p, size_t n, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        p[i] = frand(s);
}

/* Conv1d by its definition, summed in double. */
static void conv1d_naive(double *y, const float *x, const float *w, const float *b, int ci, int co, int t, int k,
                         int dil, int pad)
{
    int to = op_conv1d_out_len(t, k, dil, pad);
    for (int o = 0; o < co; o++)
        for (int n = 0; n < to; n++) {
            double s = b[o];
            for (int i = 0; i < ci; i++)
                for (int kk = 0; kk < k; kk++) {
                    int m = n - pad + kk * dil;
                    if (m >= 0 && m < t) s += (double)w[(o * ci + i) * k + kk] * x[i * t + m];
                }
            y[o * to + n] = s;
        }
}

/* ConvTranspose1d by its definition, as a gather over inputs. */
static void conv_t_naive(double *y, const float *x, const float *w, const float *b, int ci, int co, int t, int k, int s,
                         int pad)
{
    int to = op_conv_transpose1d_out_len(t, k, s, pad);
    for (int o = 0; o < co; o++)
        for (int n = 0; n < to; n++) {
            double acc = b[o];
            for (int i = 0; i < ci; i++)
                for (int kk = 0; kk < k; kk++) {
                    int q = n + pad - kk;
                    if (q % s == 0 && q / s >= 0 && q / s < t)
                        acc += (double)x[i * t + q / s] * w[(i * co + o) * k + kk];
                }
            y[o * to + n] = acc;
        }
}

static void test_against_definition(void **state)
{
    (void)state;
    uint64_t seed = 42;
    /* long rows (past several tiles), dilation 9, and a wide channel count */
    const int cases[][5] = {{3, 5, 20000, 7, 9}, {130, 3, 700, 7, 3}, {4, 2, 5000, 1, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int ci = cases[c][0], co = cases[c][1], t = cases[c][2], k = cases[c][3], d = cases[c][4];
        int pad = d * (k - 1) / 2, to = op_conv1d_out_len(t, k, d, pad);
        float *x = malloc(sizeof(float) * ci * t), *w = malloc(sizeof(float) * co * ci * k),
              *b = malloc(sizeof(float) * co);
        float *y = malloc(sizeof(float) * co * to);
        double *want = malloc(sizeof(double) * co * to);
        fill(x, (size_t)ci * t, &seed);
        fill(w, (size_t)co * ci * k, &seed);
        fill(b, (size_t)co, &seed);
        op_conv1d(y, x, w, b,
                  &(struct conv1d_geometry){.c_in = ci, .c_out = co, .t = t, .k = k, .dilation = d, .pad = pad});
        conv1d_naive(want, x, w, b, ci, co, t, k, d, pad);
        assert_close(y, want, co * to, 1e-5);
        free(x), free(w), free(b), free(y), free(want);
    }
    const int tcases[][5] = {{3, 2, 3000, 8, 4}, {70, 3, 50, 16, 8}, {2, 1, 9000, 4, 2}};
    for (size_t c = 0; c < sizeof tcases / sizeof tcases[0]; c++) {
        int ci = tcases[c][0], co = tcases[c][1], t = tcases[c][2], k = tcases[c][3], s = tcases[c][4];
        int pad = (s + 1) / 2, to = op_conv_transpose1d_out_len(t, k, s, pad);
        assert_int_equal(to, s * t);
        float *x = malloc(sizeof(float) * ci * t), *w = malloc(sizeof(float) * ci * co * k),
              *b = malloc(sizeof(float) * co);
        float *y = malloc(sizeof(float) * co * to);
        double *want = malloc(sizeof(double) * co * to);
        fill(x, (size_t)ci * t, &seed);
        fill(w, (size_t)ci * co * k, &seed);
        fill(b, (size_t)co, &seed);
        op_conv_transpose1d(
            y, x, w, b, &(struct conv1d_geometry){.c_in = ci, .c_out = co, .t = t, .k = k, .stride = s, .pad = pad});
        conv_t_naive(want, x, w, b, ci, co, t, k, s, pad);
        assert_close(y, want, co * to, 1e-5);
        free(x), free(w), free(b), free(y), free(want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snake),
        cmocka_unit_test(test_conv1d_hand),
        cmocka_unit_test(test_conv_transpose1d_hand),
        cmocka_unit_test(test_weight_norm_fold),
        cmocka_unit_test(test_against_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
