/* Read-rate kernels for mm3-bench-ops --read-patterns (read_bench.cu): one bf16
 * matrix [rows, cuda_read_bench_width()] read by `blocks` blocks in one of four ways:
 * 0 contiguous parts per block (16-byte loads), 1 tiles of 16 rows chunk by chunk
 * (16-byte loads, as the decode GEMVs read), 2 the same tiles as tensor-map boxes into
 * a shared-memory ring, 3 contiguous 16 KiB bulk copies into the same ring. sink: one
 * word per block, written practically never. Returns 0 or a negative errno code with
 * a message. Only compiled with CUDA. */
#ifndef MM3_TOOLS_CUDA_READ_BENCH_H
#define MM3_TOOLS_CUDA_READ_BENCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int cuda_read_bench_width(void);
int cuda_read_bench(int pattern, const uint16_t *w, int rows, int blocks, unsigned *sink, void *stream);

#ifdef __cplusplus
}
#endif

#endif
