/* Plain-C float32 reference of the op interface (common/ops.h). */
#include "common/ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

void op_matmul(float *y, const float *x, const float *w, const float *bias, int n, int in, int out)
{
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * in;
        float *yr = y + (size_t)t * out;
        for (int o = 0; o < out; o++) {
            const float *wr = w + (size_t)o * in;
            float s = 0.0f;
            for (int i = 0; i < in; i++) s += xr[i] * wr[i];
            yr[o] = bias ? s + bias[o] : s;
        }
    }
}

void op_rmsnorm(float *y, const float *x, const float *w, int n, int dim, float eps)
{
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * dim;
        float *yr = y + (size_t)t * dim;
        float ss = 0.0f;
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        float r = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) yr[i] = w[i] * (xr[i] * r);
    }
}

void op_layernorm(float *y, const float *x, const float *w, const float *b, int n, int dim, float eps)
{
    for (int t = 0; t < n; t++) {
        const float *xr = x + (size_t)t * dim;
        float *yr = y + (size_t)t * dim;
        float mean = 0.0f;
        for (int i = 0; i < dim; i++) mean += xr[i];
        mean /= (float)dim;
        float var = 0.0f;
        for (int i = 0; i < dim; i++) var += (xr[i] - mean) * (xr[i] - mean);
        var /= (float)dim;
        float r = 1.0f / sqrtf(var + eps);
        for (int i = 0; i < dim; i++) yr[i] = (xr[i] - mean) * r * w[i] + (b ? b[i] : 0.0f);
    }
}

/* float.hex values dumped from torch 2.11 (../shared/golden/rope_inv_freq.json). */
static const uint32_t inv_freq_1e6_128[64] = {
    0x3f800000, 0x3f4e4bad, 0x3f263de0, 0x3f05f6ef, 0x3ed7e89b, 0x3eadfcff, 0x3e8c3504, 0x3e61f835,
    0x3e361887, 0x3e12bd91, 0x3dec7fd6, 0x3dbe94c6, 0x3d99940d, 0x3d778513, 0x3d47763f, 0x3d20bc1d,
    0x3d0186e3, 0x3cd0c1a8, 0x3ca8398b, 0x3c879008, 0x3c5a7bf2, 0x3c301052, 0x3c0de12d, 0x3be4aa46,
    0x3bb8449c, 0x3b947dae, 0x3b6f520e, 0x3b40dac5, 0x3b1b690d, 0x3afa78f0, 0x3ac9d75c, 0x3aa2a6f7,
    0x3a83126f, 0x3a533f28, 0x3a2a3b44, 0x3a092e02, 0x39dd1725, 0x39b229fb, 0x398f9272, 0x39676492,
    0x393a7753, 0x39164324, 0x38f22ce2, 0x38c327b5, 0x389d43a4, 0x387d75d4, 0x384c3fbe, 0x382497ab,
    0x3804a2b2, 0x37d5c441, 0x37ac431d, 0x378ad0ed, 0x375fba4f, 0x37344a0e, 0x371148e3, 0x36ea2732,
    0x36bcb0c1, 0x36980e02, 0x36751070, 0x36457bab, 0x361f23e4, 0x36003dec, 0x35ceaf79, 0x35a68e4c,
};
static const uint32_t inv_freq_1e4_32[16] = {
    0x3f800000, 0x3f0ff59a, 0x3ea1e89b, 0x3e361887, 0x3dcccccd, 0x3d6655c2, 0x3d0186e3, 0x3c91ad39,
    0x3c23d70a, 0x3bb8449c, 0x3b4f3e38, 0x3ae91528, 0x3a83126f, 0x3a136a16, 0x39a5cb60, 0x393a7753,
};

void op_rope_inv_freq(float *inv_freq, double theta, int dim)
{
    const uint32_t *table = NULL;
    if (theta == 1e6 && dim == 128) table = inv_freq_1e6_128;
    if (theta == 1e4 && dim == 32) table = inv_freq_1e4_32;
    for (int i = 0; i < dim / 2; i++) {
        if (table) {
            memcpy(&inv_freq[i], &table[i], 4);
        } else {
            float e = (float)(2 * i) / (float)dim;
            inv_freq[i] = 1.0f / powf((float)theta, e);
        }
    }
}

void op_rope(float *x, int n, int stride, int n_heads, int head_dim, int rotary_dim, const int *pos,
             const float *inv_freq)
{
    int half = rotary_dim / 2;
    for (int t = 0; t < n; t++) {
        float p = (float)pos[t];
        for (int h = 0; h < n_heads; h++) {
            float *u = x + (size_t)t * stride + (size_t)h * head_dim;
            for (int i = 0; i < half; i++) {
                float ang = inv_freq[i] * p;
                float c = cosf(ang), s = sinf(ang);
                float x1 = u[i], x2 = u[i + half];
                u[i] = x1 * c - x2 * s;
                u[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void op_attention(const struct attention_rows *r, const struct attention_heads *heads)
{
    float *out = r->out;
    const float *q = r->q, *k = r->k, *v = r->v;
    const int out_stride = r->out_stride, q_stride = r->q_stride, kv_stride = r->kv_stride;
    const int n_q = r->n_q, n_kv = r->n_kv, causal = r->causal, q_pos0 = r->q_pos0;
    const int n_heads = heads->n_heads, n_kv_heads = heads->n_kv_heads, head_dim = heads->head_dim;
    const float scale = heads->scale;
    CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    int group = n_heads / n_kv_heads;
    float *score = malloc(sizeof(float) * (size_t)(n_kv > 0 ? n_kv : 1));
    CHECK(score);
    for (int i = 0; i < n_q; i++) {
        int n_see = causal ? q_pos0 + i + 1 : n_kv;
        if (n_see > n_kv) n_see = n_kv;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + (size_t)i * q_stride + (size_t)h * head_dim;
            int g = h / group;
            float mx = -INFINITY;
            for (int j = 0; j < n_see; j++) {
                const float *kh = k + (size_t)j * kv_stride + (size_t)g * head_dim;
                float s = 0.0f;
                for (int d = 0; d < head_dim; d++) s += qh[d] * kh[d];
                s *= scale;
                score[j] = s;
                if (s > mx) mx = s;
            }
            float sum = 0.0f;
            for (int j = 0; j < n_see; j++) {
                score[j] = expf(score[j] - mx);
                sum += score[j];
            }
            float *oh = out + (size_t)i * out_stride + (size_t)h * head_dim;
            for (int d = 0; d < head_dim; d++) oh[d] = 0.0f;
            for (int j = 0; j < n_see; j++) {
                const float *vh = v + (size_t)j * kv_stride + (size_t)g * head_dim;
                float p = score[j] / sum;
                for (int d = 0; d < head_dim; d++) oh[d] += p * vh[d];
            }
        }
    }
    free(score);
}

void op_silu(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
}

void op_silu_mul(float *y, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

void op_softmax(float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

void op_add(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void op_lora_down(float *t, const float *x, const float *a, int n, int in, int rank)
{
    op_matmul(t, x, a, NULL, n, in, rank);
}

void op_lora_up(float *y, const float *t, const float *b, float scale, int n, int rank, int out)
{
    for (int r = 0; r < n; r++) {
        const float *tr = t + (size_t)r * rank;
        float *yr = y + (size_t)r * out;
        for (int o = 0; o < out; o++) {
            const float *br = b + (size_t)o * rank;
            float s = 0.0f;
            for (int k = 0; k < rank; k++)
                s += tr[k] * br[k];
            yr[o] += scale * s;
        }
    }
}
