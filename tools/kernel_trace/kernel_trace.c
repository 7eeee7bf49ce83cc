/* Every kernel's start and end on the GPU, for a program that does not know it is
 * traced: an LD_PRELOAD library over CUPTI's activity API.
 *
 *   MM3_KERNEL_TRACE=trace.csv LD_PRELOAD=build-cuda/lib/libmm3-kernel-trace.so \
 *       mm3-bench-stage0 --ckpt ... --pairs 1 --frames 3 --warmup 2
 *
 * ncu replays kernels one at a time, each with its own ramp, so its durations do not
 * add up to a CUDA graph's time where programmatic dependent launch overlaps them
 * (twenty-third session: 7.51 ms of serial sums against 6.74 ms in the graphs). CUPTI
 * records kernels as they ran, graph nodes included: the gap between one kernel's end
 * and the next one's is what each kernel adds to a step. scripts/bench/kernel_trace.py
 * turns the file into a per-kernel table of one graph replay.
 *
 * The file: one line per kernel,
 * "start_ns,end_ns,graph_id,graph_node_id,stream,grid,name" (CUPTI's timestamps; graph
 * ids 0 outside graphs; grid as XxYxZ; the mangled name), written as CUPTI hands over
 * its buffers and at exit. Errors go to stderr; the traced program runs on regardless. */
#include <cupti.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

enum { TRACE_BUFFER_BYTES = 8 << 20 };

static FILE *trace_file;

static void trace_warn(const char *what, CUptiResult r)
{
    const char *msg = NULL;
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "mm3-kernel-trace: %s: %s\n", what, msg ? msg : "unknown CUPTI error");
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    /* CUPTI wants 8-byte alignment; malloc gives 16. */
    *buffer = malloc(TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        if (trace_file)
            fprintf(trace_file, "%" PRIu64 ",%" PRIu64 ",%u,%" PRIu64 ",%u,%dx%dx%d,%s\n", k->start, k->end, k->graphId,
                    k->graphNodeId, k->streamId, k->gridX, k->gridY, k->gridZ, k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "mm3-kernel-trace: %zu records dropped\n", dropped);
    free(buffer);
}

__attribute__((constructor)) static void trace_start(void)
{
    const char *path = getenv("MM3_KERNEL_TRACE");
    if (!path || !*path) return;
    trace_file = fopen(path, "w");
    if (!trace_file) {
        fprintf(stderr, "mm3-kernel-trace: %s: cannot open for writing\n", path);
        return;
    }
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) trace_warn("enabling kernel activity records", r);
}

__attribute__((destructor)) static void trace_stop(void)
{
    if (!trace_file) return;
    CUptiResult r = cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (r != CUPTI_SUCCESS) trace_warn("flushing", r);
    fclose(trace_file);
    trace_file = NULL;
}
