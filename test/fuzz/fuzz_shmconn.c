/* Fuzz target: the connector's trust boundary. Each side validates what the
 * other process wrote into the shared region (docs/connector.md); here the
 * other process is the fuzz input.
 *
 * Input: byte 0 = flags, then patch records {u16 le offset, u8 len, len bytes}.
 *   flags bit 0 clear (consumer mode): a well-formed empty region of a small
 *     geometry (4 slots, 256 inline bytes, 4 KiB payload area; the creator is
 *     this process) is patched, each record writing its bytes at offset modulo
 *     the region size, and stored as the segment; then shmconn_open and up to
 *     10 shmconn_recv / shmconn_release. Bit 1 truncates the segment by a page,
 *     bit 2 starts deadline tracking of request 1 first.
 *   flags bit 0 set (producer mode): a real shmconn_create, then the records
 *     patch only what a consumer may write (its header line and the cancel
 *     ring, offsets modulo that span); then shmconn_cancel_poll and one inline
 *     and one payload-area shmconn_send, none of them waiting.
 * Oracles: every received tensor view lies inside its slot's inline area or
 * inside the payload area, 64-byte aligned, and its bytes can be read; errors
 * carry a message.
 * Segments are /dev/shm/mm3f<pid>-*, always unlinked. */
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "shmconn/shmconn.h"
#include "shmconn/shmconn_region.h"
#include "test/fuzz/fuzz_support.h"

#define FUZZ_RECV_MAX 10

static struct shmconn_config g_cfg;
static uint8_t *g_image; /* the template region */
static struct shmconn_geometry g_geo;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mm3_log_set_level(MM3_LOG_ERROR);
    snprintf(g_cfg.name, sizeof g_cfg.name, "fz");
    snprintf(g_cfg.prefix, sizeof g_cfg.prefix, "mm3f%d-", (int)getpid());
    g_cfg.shm_threshold_bytes = 256;
    g_cfg.payload_bytes = 4096;
    g_cfg.n_slots = 4;
    g_cfg.first_chunk_deadline_s = 30;
    g_cfg.steady_deadline_s = 30;
    g_cfg.wait_slice_s = 0.001;
    shmconn_geometry_make(&g_cfg, &g_geo);
    g_geo.creator_pid = (int32_t)getpid();
    g_image = calloc(1, g_geo.region_bytes);
    if (!g_image) abort();
    struct shmconn_header *h = (struct shmconn_header *)g_image;
    memcpy(&h->geo, &g_geo, sizeof g_geo);
    atomic_store(&h->prod.pid, (int32_t)getpid());
    atomic_store(&h->prod.state, SHMCONN_SIDE_OPEN);
    return 0;
}

static void segment_path(char *out, size_t cap)
{
    snprintf(out, cap, "/%s%s", g_cfg.prefix, g_cfg.name);
}

/* Apply the patch records of in[0..n) to buf[0..span), offsets modulo span. */
static void apply_patches(uint8_t *buf, uint64_t span, const uint8_t *in, size_t n)
{
    size_t i = 0;
    while (i + 3 <= n) {
        uint64_t off = ((uint64_t)in[i] | (uint64_t)in[i + 1] << 8) % span;
        size_t len = in[i + 2];
        i += 3;
        if (len > n - i) len = n - i;
        if (len > span - off) len = (size_t)(span - off);
        memcpy(buf + off, in + i, len);
        i += len;
    }
}

static void check_view(const struct shmconn *c, const struct shmconn_msg *m)
{
    const uint8_t *slot = (const uint8_t *)shmconn_slot_at(c, (uint32_t)m->seq);
    const uint8_t *inl = slot + SHMCONN_SLOT_HEADER_BYTES, *inl_end = slot + c->slot_bytes;
    const uint8_t *pay = c->payload, *pay_end = c->payload + c->hdr->geo.payload_bytes;
    if (m->n_tensors > SHMCONN_MAX_TENSORS) fuzz_fail("n_tensors %u", m->n_tensors);
    for (uint32_t i = 0; i < m->n_tensors; i++) {
        const struct shmconn_tensor *t = &m->tensors[i];
        const uint8_t *d = t->data;
        int in_slot = d >= inl && d <= inl_end && t->nbytes <= (uint64_t)(inl_end - d);
        int in_pay = d >= pay && d <= pay_end && t->nbytes <= (uint64_t)(pay_end - d);
        if (!in_slot && !in_pay) fuzz_fail("tensor %u: view of %llu bytes outside its slot and the payload area", i,
                                           (unsigned long long)t->nbytes);
        /* docs/connector.md: every tensor 64-byte aligned, so the stages may cast views to float *. */
        if ((uintptr_t)d % SHMCONN_ALIGN) fuzz_fail("tensor %u: view not %u-byte aligned", i, SHMCONN_ALIGN);
        if (!memchr(t->name, 0, sizeof t->name)) fuzz_fail("tensor %u: name not terminated", i);
        volatile uint8_t sum = 0;
        for (uint64_t k = 0; k < t->nbytes; k++) sum ^= d[k];
        (void)sum;
    }
}

static void run_consumer(uint8_t flags, const uint8_t *in, size_t n)
{
    uint8_t *img = malloc(g_geo.region_bytes);
    if (!img) abort();
    memcpy(img, g_image, g_geo.region_bytes);
    apply_patches(img, g_geo.region_bytes, in, n);
    char name[128];
    segment_path(name, sizeof name);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(name);
        abort();
    }
    uint64_t size = g_geo.region_bytes - ((flags & 2) ? 4096 : 0);
    if (ftruncate(fd, (off_t)size) < 0 || pwrite(fd, img, size, 0) != (ssize_t)size) abort();
    close(fd);
    free(img);

    shmconn_t *c = NULL;
    int rc = shmconn_open(&c, &g_cfg, 0);
    fuzz_note("shmconn_open", rc);
    if (rc == 0) {
        if (flags & 4) shmconn_request_begin(c, 1);
        for (int k = 0; k < FUZZ_RECV_MAX; k++) {
            struct shmconn_event ev;
            rc = shmconn_recv(c, &ev, 0);
            fuzz_note("shmconn_recv", rc);
            if (rc < 0) {
                if (!mm3_last_error()[0]) fuzz_fail("recv failed without a message");
                break;
            }
            if (ev.type != SHMCONN_EVENT_MESSAGE) continue;
            check_view(c, &ev.msg);
            if (shmconn_release(c, &ev.msg) < 0) fuzz_fail("release of a received message: %s", mm3_last_error());
        }
        struct shmconn_stats st;
        shmconn_stats_get(c, &st);
        shmconn_close(c);
    } else if (!mm3_last_error()[0]) {
        fuzz_fail("open failed without a message");
    }
    shm_unlink(name);
}

static void run_producer(const uint8_t *in, size_t n)
{
    shmconn_t *p = NULL;
    if (shmconn_create(&p, &g_cfg) < 0) {
        fprintf(stderr, "fuzz_shmconn: %s\n", mm3_last_error());
        abort();
    }
    /* What a consumer writes: its line of the header, then the cancel ring. */
    const size_t line = offsetof(struct shmconn_header, cons);
    uint8_t buf[64 + SHMCONN_CANCEL_BYTES];
    memcpy(buf, p->base + line, 64);
    memcpy(buf + 64, p->base + SHMCONN_HEADER_BYTES, SHMCONN_CANCEL_BYTES);
    apply_patches(buf, sizeof buf, in, n);
    memcpy(p->base + line, buf, 64);
    memcpy(p->base + SHMCONN_HEADER_BYTES, buf + 64, SHMCONN_CANCEL_BYTES);

    uint64_t id;
    uint32_t reason;
    for (int k = 0; k < 2 * (int)SHMCONN_CANCEL_SLOTS && shmconn_cancel_poll(p, &id, &reason) == 1; k++) {
    }
    static uint8_t payload[1024];
    struct shmconn_msg m;
    memset(&m, 0, sizeof m);
    m.req_id = 1;
    m.n_tensors = 1;
    snprintf(m.tensors[0].name, sizeof m.tensors[0].name, "x");
    m.tensors[0].dtype = SHMCONN_DTYPE_U8;
    m.tensors[0].ndim = 1;
    m.tensors[0].shape[0] = 16;
    m.tensors[0].nbytes = 16;
    m.tensors[0].data = payload;
    fuzz_note("shmconn_send inline", shmconn_send(p, &m, 0));
    m.req_id = 2;
    m.tensors[0].shape[0] = sizeof payload;
    m.tensors[0].nbytes = sizeof payload;
    fuzz_note("shmconn_send payload", shmconn_send(p, &m, 0));
    shmconn_peer_status(p);
    shmconn_close(p);
    char name[128];
    segment_path(name, sizeof name);
    shm_unlink(name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    if (data[0] & 1) run_producer(data + 1, size - 1);
    else run_consumer(data[0], data + 1, size - 1);
    mm3_error_clear();
    return 0;
}
