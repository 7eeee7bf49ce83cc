/* Plain-C float32 reference of the vocoder's 1-D convolution ops (common/ops_conv.h).
 *
 * The loops walk output tiles so that the tile of y and the rows of x it needs
 * stay in cache; within a tile every output element is summed in the same order
 * (bias, then input channel, then tap), so the tile size never changes a result. */
#include "common/ops_conv.h"

#include <math.h>
#include <stddef.h>

/* About 256 KiB of input rows per tile: long rows (tens of thousands of samples
 * after upsampling) would otherwise be streamed from memory once per output channel. */
static int conv_tile_len(int c_in)
{
    int tile = 65536 / (c_in > 0 ? c_in : 1);
    if (tile < 64) tile = 64;
    if (tile > 8192) tile = 8192;
    return tile;
}

static inline int imax(int a, int b)
{
    return a > b ? a : b;
}
static inline int imin(int a, int b)
{
    return a < b ? a : b;
}

/* y[n] += a * x[n] for n < len. Written 8 wide so that -O2 (whose cost model does not
 * vectorise loops with a remainder) packs the independent lanes into SIMD; each element
 * is still one multiply and one add, so results do not change. */
static inline void axpy(float *restrict y, const float *restrict x, float a, int len)
{
    int n = 0;
    for (; n + 8 <= len; n += 8) {
        float *restrict yy = y + n;
        const float *restrict xx = x + n;
        yy[0] += a * xx[0];
        yy[1] += a * xx[1];
        yy[2] += a * xx[2];
        yy[3] += a * xx[3];
        yy[4] += a * xx[4];
        yy[5] += a * xx[5];
        yy[6] += a * xx[6];
        yy[7] += a * xx[7];
    }
    for (; n < len; n++)
        y[n] += a * x[n];
}

/* floor(a / b) for b > 0 */
static inline int floor_div(int a, int b)
{
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

int op_conv1d_out_len(int t, int k, int dilation, int pad)
{
    return t + 2 * pad - dilation * (k - 1);
}

void op_conv1d(float *y, const float *x, const float *w, const float *b, const struct conv1d_geometry *g)
{
    int c_in = g->c_in, c_out = g->c_out, t = g->t, k = g->k, dilation = g->dilation, pad = g->pad;
    int t_out = op_conv1d_out_len(t, k, dilation, pad);
    if (t_out <= 0) return;
    int tile = conv_tile_len(c_in);
    for (int n0 = 0; n0 < t_out; n0 += tile) {
        int n1 = imin(n0 + tile, t_out);
        for (int o = 0; o < c_out; o++) {
            float *yo = y + (size_t)o * t_out;
            float bias = b ? b[o] : 0.0f;
            for (int n = n0; n < n1; n++)
                yo[n] = bias;
            for (int i = 0; i < c_in; i++) {
                const float *xi = x + (size_t)i * t;
                const float *wo = w + ((size_t)o * c_in + i) * k;
                for (int kk = 0; kk < k; kk++) {
                    int off = kk * dilation - pad; /* y[n] reads x[n + off] */
                    int lo = imax(n0, -off), hi = imin(n1, t - off);
                    if (hi > lo) axpy(yo + lo, xi + lo + off, wo[kk], hi - lo);
                }
            }
        }
    }
}

int op_conv_transpose1d_out_len(int t_in, int k, int stride, int pad)
{
    return (t_in - 1) * stride - 2 * pad + k;
}

void op_conv_transpose1d(float *y, const float *x, const float *w, const float *b, const struct conv1d_geometry *g)
{
    int c_in = g->c_in, c_out = g->c_out, t_in = g->t, k = g->k, stride = g->stride, pad = g->pad;
    int t_out = op_conv_transpose1d_out_len(t_in, k, stride, pad);
    if (t_out <= 0 || t_in <= 0) return;
    int tile = conv_tile_len(c_in) * stride;
    for (int n0 = 0; n0 < t_out; n0 += tile) {
        int n1 = imin(n0 + tile, t_out);
        for (int o = 0; o < c_out; o++) {
            float *yo = y + (size_t)o * t_out;
            float bias = b ? b[o] : 0.0f;
            for (int n = n0; n < n1; n++)
                yo[n] = bias;
            for (int i = 0; i < c_in; i++) {
                const float *xi = x + (size_t)i * t_in;
                const float *wi = w + ((size_t)i * c_out + o) * k;
                for (int kk = 0; kk < k; kk++) {
                    /* input m lands on output n = m*stride - pad + kk; keep n in [n0, n1) */
                    int m_lo = imax(0, floor_div(n0 + pad - kk + stride - 1, stride));
                    int m_hi = imin(t_in - 1, floor_div(n1 - 1 + pad - kk, stride));
                    if (m_lo > m_hi) continue;
                    float wv = wi[kk];
                    int n = m_lo * stride - pad + kk;
                    for (int m = m_lo; m <= m_hi; m++, n += stride)
                        yo[n] += wv * xi[m];
                }
            }
        }
    }
}

void op_snake(float *y, const float *x, const float *alpha, int c, int t)
{
    for (int ch = 0; ch < c; ch++) {
        float a = alpha[ch];
        /* (alpha + 1e-9).reciprocal() in float32, as the reference computes it */
        float inv = 1.0f / (a + 1e-9f);
        const float *xr = x + (size_t)ch * t;
        float *yr = y + (size_t)ch * t;
        for (int n = 0; n < t; n++) {
            float s = sinf(a * xr[n]);
            yr[n] = xr[n] + inv * (s * s);
        }
    }
}

void op_weight_norm_fold(float *w, const float *g, const float *v, int dim0, int rest)
{
    for (int o = 0; o < dim0; o++) {
        const float *vr = v + (size_t)o * rest;
        float *wr = w + (size_t)o * rest;
        double ss = 0.0;
        for (int j = 0; j < rest; j++)
            ss += (double)vr[j] * vr[j];
        /* torch: v * (g / norm), the ratio rounded to float32 once per row */
        float scale = g[o] / (float)sqrt(ss);
        for (int j = 0; j < rest; j++)
            wr[j] = vr[j] * scale;
    }
}
