/* Device, memory, stream and event wrappers: CUDA errors become error codes. */
#include <cuda_profiler_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda/cuda_internal.h"
#include "common/cuda/ops_cuda.h"

extern "C" int cuda_device_count_safe(void)
{
    int n = 0;
    /* Without a GPU the runtime answers with an error (35 on a driverless
     * machine); treat every error as "no device" and clear it. */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* Every slot cuda_env_switch has filled, for cuda_env_switches_reset (a few dozen
 * switches exist; the bound only has to hold them all). */
enum { ENV_SLOTS_MAX = 128 };
static int *env_slots[ENV_SLOTS_MAX];
static int n_env_slots;
static pthread_mutex_t env_slots_lock = PTHREAD_MUTEX_INITIALIZER;

static void env_slot_remember(int *slot)
{
    pthread_mutex_lock(&env_slots_lock);
    int known = 0;
    for (int i = 0; i < n_env_slots && !known; i++)
        known = env_slots[i] == slot;
    if (!known && n_env_slots < ENV_SLOTS_MAX) env_slots[n_env_slots++] = slot;
    pthread_mutex_unlock(&env_slots_lock);
}

/* Threads racing on the first read all store the same value. */
extern "C" int cuda_env_switch(int *slot, const char *name, int unset)
{
    int v = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv(name);
        v = e && e[0] >= '0' && e[0] <= '9' && e[1] == '\0' ? e[0] - '0' : unset;
        env_slot_remember(slot);
        __atomic_store_n(slot, v, __ATOMIC_RELAXED);
    }
    return v;
}

extern "C" void cuda_env_switches_reset(void)
{
    pthread_mutex_lock(&env_slots_lock);
    for (int i = 0; i < n_env_slots; i++)
        __atomic_store_n(env_slots[i], -1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&env_slots_lock);
}

/* common/cuda/pdl.cuh: on unless MM3_PDL=0. Every launch asks. */
extern "C" int cuda_pdl_enabled(void)
{
    static int state = -1;
    return cuda_env_switch(&state, "MM3_PDL", 1);
}

extern "C" int cuda_sm_count(void)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return sms;
}

extern "C" int cuda_device_set(int device)
{
    return cuda_status(cudaSetDevice(device), "cudaSetDevice");
}

extern "C" int cuda_device_describe(char *buf, size_t size)
{
    int dev = 0;
    int rc = cuda_status(cudaGetDevice(&dev), "cudaGetDevice");
    if (rc < 0) return rc;
    cudaDeviceProp p;
    rc = cuda_status(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
    if (rc < 0) return rc;
    snprintf(buf, size, "%s, sm_%d%d, %d SMs, %d MiB L2, %.1f GiB", p.name, p.major, p.minor, p.multiProcessorCount,
             p.l2CacheSize >> 20, (double)p.totalGlobalMem / (1 << 30));
    return 0;
}

extern "C" int cuda_malloc(void **ptr, size_t bytes)
{
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not sticky: keep it out of the next launch check */
        *ptr = NULL;
        return mm3_errorf(e == cudaErrorMemoryAllocation ? -ENOMEM : -ENODEV, "cudaMalloc(%zu bytes): %s", bytes,
                          cudaGetErrorString(e));
    }
    return 0;
}

extern "C" void cuda_free(void *ptr)
{
    if (ptr) (void)cudaFree(ptr);
}

extern "C" int cuda_memcpy_h2d(void *dst, const void *src, size_t bytes)
{
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
}

extern "C" int cuda_memcpy_d2h(void *dst, const void *src, size_t bytes)
{
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
}

extern "C" int cuda_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream_of(stream)),
                       "cudaMemcpyAsync device to device");
}

extern "C" int cuda_memset(void *ptr, int byte, size_t bytes)
{
    return cuda_status(cudaMemset(ptr, byte, bytes), "cudaMemset");
}

static int stream_priority_level;

extern "C" void cuda_stream_priority_set(int level)
{
    stream_priority_level = level;
}

extern "C" int cuda_stream_priority(void)
{
    int least = 0, greatest = 0;
    if (stream_priority_level == 0 || cudaDeviceGetStreamPriorityRange(&least, &greatest) != cudaSuccess) return 0;
    return stream_priority_level > 0 ? greatest : least;
}

extern "C" int cuda_stream_create(void **stream)
{
    cudaStream_t s = NULL;
    int rc = cuda_status(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, cuda_stream_priority()),
                         "cudaStreamCreate");
    *stream = rc < 0 ? NULL : (void *)s;
    return rc;
}

extern "C" void cuda_stream_destroy(void *stream)
{
    if (stream) (void)cudaStreamDestroy(cuda_stream_of(stream));
}

extern "C" int cuda_stream_sync(void *stream)
{
    return cuda_status(cudaStreamSynchronize(cuda_stream_of(stream)), "cudaStreamSynchronize");
}

extern "C" int cuda_event_create(void **event)
{
    cudaEvent_t e = NULL;
    int rc = cuda_status(cudaEventCreate(&e), "cudaEventCreate");
    *event = rc < 0 ? NULL : (void *)e;
    return rc;
}

extern "C" void cuda_event_destroy(void *event)
{
    if (event) (void)cudaEventDestroy((cudaEvent_t)event);
}

extern "C" int cuda_event_record(void *event, void *stream)
{
    return cuda_status(cudaEventRecord((cudaEvent_t)event, cuda_stream_of(stream)), "cudaEventRecord");
}

extern "C" int cuda_stream_wait_event(void *stream, void *event)
{
    return cuda_status(cudaStreamWaitEvent(cuda_stream_of(stream), (cudaEvent_t)event, 0), "cudaStreamWaitEvent");
}

extern "C" int cuda_event_sync(void *event)
{
    return cuda_status(cudaEventSynchronize((cudaEvent_t)event), "cudaEventSynchronize");
}

extern "C" int cuda_event_done(void *event)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaErrorNotReady) return 0;
    int rc = cuda_status(e, "cudaEventQuery");
    return rc < 0 ? rc : 1;
}

extern "C" int cuda_event_elapsed_ms(float *ms, void *start, void *stop)
{
    int rc = cuda_status(cudaEventSynchronize((cudaEvent_t)stop), "cudaEventSynchronize");
    if (rc < 0) return rc;
    return cuda_status(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)stop), "cudaEventElapsedTime");
}

extern "C" int cuda_profiler_range(int on)
{
    return on ? cuda_status(cudaProfilerStart(), "cudaProfilerStart")
              : cuda_status(cudaProfilerStop(), "cudaProfilerStop");
}

extern "C" int cuda_graph_capture_begin(void *stream)
{
    if (!stream) return mm3_errorf(-EINVAL, "cuda_graph_capture_begin: the legacy default stream cannot be captured");
    return cuda_status(cudaStreamBeginCapture(cuda_stream_of(stream), cudaStreamCaptureModeThreadLocal),
                       "cudaStreamBeginCapture");
}

extern "C" int cuda_graph_capture_end(void *stream, void **graph_exec)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    *graph_exec = NULL;
    int rc = cuda_status(cudaStreamEndCapture(cuda_stream_of(stream), &graph), "cudaStreamEndCapture");
    if (rc < 0) return rc;
    rc = cuda_status(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    (void)cudaGraphDestroy(graph);
    if (rc == 0) *graph_exec = (void *)exec;
    return rc;
}

extern "C" int cuda_graph_launch(void *graph_exec, void *stream)
{
    return cuda_status(cudaGraphLaunch((cudaGraphExec_t)graph_exec, cuda_stream_of(stream)), "cudaGraphLaunch");
}

extern "C" void cuda_graph_destroy(void *graph_exec)
{
    if (graph_exec) (void)cudaGraphExecDestroy((cudaGraphExec_t)graph_exec);
}

extern "C" int cuda_graph_timer_init(struct cuda_graph_timer *t)
{
    static int timing = -1;
    memset(t, 0, sizeof *t);
    if (!cuda_env_switch(&timing, "MM3_GRAPH_TIMING", 0)) return 0;
    int rc = cuda_event_create(&t->ev[0]);
    if (rc == 0) rc = cuda_event_create(&t->ev[1]);
    if (rc < 0) cuda_graph_timer_free(t);
    return rc;
}

extern "C" void cuda_graph_timer_free(struct cuda_graph_timer *t)
{
    cuda_event_destroy(t->ev[0]);
    cuda_event_destroy(t->ev[1]);
    memset(t, 0, sizeof *t);
}

/* The pending launch's time into t->ms; wait = 0 leaves one still running pending. */
static void timer_read(struct cuda_graph_timer *t, int wait)
{
    if (!t->pending || (!wait && cuda_event_done(t->ev[1]) == 0)) return;
    if (cuda_event_elapsed_ms(&t->ms, t->ev[0], t->ev[1]) < 0) t->ms = 0.0f;
    t->pending = 0;
}

extern "C" int cuda_graph_launch_timed(struct cuda_graph_timer *t, void *graph_exec, void *stream)
{
    if (!t->ev[0]) return cuda_graph_launch(graph_exec, stream);
    /* The launch before is read first (its events are recorded again below); where
     * steps overlap (frame_cuda's look-ahead) it is done by now, and the reader gets
     * the last finished launch without waiting for the one in flight. */
    timer_read(t, 1);
    int rc = cuda_event_record(t->ev[0], stream);
    if (rc == 0) rc = cuda_graph_launch(graph_exec, stream);
    if (rc == 0 && (rc = cuda_event_record(t->ev[1], stream)) == 0) t->pending = 1;
    return rc;
}

extern "C" float cuda_graph_timer_ms(struct cuda_graph_timer *t)
{
    timer_read(t, 0); /* a launch in flight: the one before it */
    return t->ms;
}
