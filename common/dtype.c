#include "common/dtype.h"

#include <math.h>

static const struct { const char *name; size_t size; } dtype_info[MM3_DTYPE_COUNT] = {
    [MM3_DTYPE_F32] = {"F32", 4},
    [MM3_DTYPE_F16] = {"F16", 2},
    [MM3_DTYPE_BF16] = {"BF16", 2},
    [MM3_DTYPE_I64] = {"I64", 8},
};

size_t mm3_dtype_size(enum mm3_dtype t) { return (unsigned)t < MM3_DTYPE_COUNT ? dtype_info[t].size : 0; }

const char *mm3_dtype_name(enum mm3_dtype t)
{
    return (unsigned)t < MM3_DTYPE_COUNT ? dtype_info[t].name : "?";
}

int mm3_dtype_parse(const char *s)
{
    for (int t = 0; t < MM3_DTYPE_COUNT; t++)
        if (!strcmp(s, dtype_info[t].name))
            return t;
    return -1;
}

float mm3_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    int exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ffu;
    float f;
    if (exp == 0) {
        f = ldexpf((float)mant, -24);
        uint32_t u;
        memcpy(&u, &f, 4);
        u |= sign;
        memcpy(&f, &u, 4);
        return f;
    }
    uint32_t u = exp == 31 ? sign | 0x7f800000u | (mant << 13)
                           : sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13);
    memcpy(&f, &u, 4);
    return f;
}

uint16_t mm3_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* overflow after rounding -> inf */
    if (a < 0x38800000u) {                      /* subnormal or zero */
        float af;
        memcpy(&af, &a, 4);
        return sign | (uint16_t)lrintf(af * 16777216.0f);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - ((uint32_t)(127 - 15) << 23);
    return sign | (uint16_t)(r >> 13);
}

uint8_t mm3_f32_to_e4m3(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7fu;
    float af;
    memcpy(&af, &a, 4);
    if (af >= MM3_E4M3_MAX) return sign | 0x7eu;
    if (af < 0.015625f) /* below 2^-6: subnormal steps of 2^-9; 8 steps carry into the smallest normal */
        return sign | (uint8_t)lrintf(af * 512.0f);
    uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u); /* round the mantissa to 3 bits, to nearest even */
    uint32_t e = (r >> 23) - 127 + 7, m = (r >> 20) & 7u;
    uint32_t code = e << 3 | m;
    return sign | (uint8_t)(code > 0x7eu ? 0x7eu : code);
}

float mm3_e4m3_to_f32(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return b & 0x80 ? -v : v;
}

void mm3_convert_to_f32(float *dst, const void *src, enum mm3_dtype t, size_t n)
{
    switch (t) {
    case MM3_DTYPE_F32: memcpy(dst, src, n * 4); break;
    case MM3_DTYPE_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = mm3_bf16_to_f32(s[i]);
        break;
    }
    case MM3_DTYPE_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = mm3_f16_to_f32(s[i]);
        break;
    }
    case MM3_DTYPE_I64: {
        const int64_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
        break;
    }
    default: break;
    }
}
