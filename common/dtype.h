/* Element types of checkpoint tensors and the conversions between them. */
#ifndef MM3_DTYPE_H
#define MM3_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" { /* also read by the CUDA sources */
#endif

enum mm3_dtype { MM3_DTYPE_F32 = 0, MM3_DTYPE_F16, MM3_DTYPE_BF16, MM3_DTYPE_I64, MM3_DTYPE_COUNT };

/* Bytes per element; name as in safetensors headers ("F32", "BF16", ...). */
size_t mm3_dtype_size(enum mm3_dtype t);
const char *mm3_dtype_name(enum mm3_dtype t);
/* Parse a safetensors dtype string; returns -1 when unsupported. */
int mm3_dtype_parse(const char *s);

static inline float mm3_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch's .to(torch.bfloat16); NaN stays NaN. */
static inline uint16_t mm3_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float mm3_f16_to_f32(uint16_t h);
uint16_t mm3_f32_to_f16(float f);

/* FP8 e4m3 (OCP "E4M3FN": bias 7, no infinities, 0x7f / 0xff NaN, largest finite 448), as
 * the GPU's cvt with saturation: round to nearest even, magnitudes beyond 448 (and
 * infinities) become +-448, NaN stays NaN. The fp8 GEMMs' operands (stage1/cuda). */
#define MM3_E4M3_MAX 448.0f
uint8_t mm3_f32_to_e4m3(float f);
float mm3_e4m3_to_f32(uint8_t b);

/* Widen n elements of type t at src into float32 dst (I64 is converted by value). */
void mm3_convert_to_f32(float *dst, const void *src, enum mm3_dtype t, size_t n);

#ifdef __cplusplus
}
#endif

#endif
