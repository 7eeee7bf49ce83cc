/* Segment lifecycle: geometry from the config, create (producer), open and
 * validate (consumer), unlink on close, reclaim of stale segments. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "shmconn/shmconn_region.h"

static const char *config_prefix(const struct shmconn_config *cfg)
{
    return cfg->prefix[0] ? cfg->prefix : SHMCONN_DEFAULT_PREFIX;
}

/* Segment names end up as one /dev/shm file name: no '/', no surprises. */
static int name_ok(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n == cap) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
              ch == '_' || ch == '.'))
            return 0;
    }
    return 1;
}

int shmconn_run_id_ok(const char *s)
{
    size_t n = strnlen(s, SHMCONN_RUN_ID_HEX + 1);
    if (n != SHMCONN_RUN_ID_HEX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

int shmconn_config_check(const struct shmconn_config *cfg)
{
    if (!cfg) return mm3_errorf(-EINVAL, "shmconn: no config");
    if (!cfg->name[0] || !name_ok(cfg->name, sizeof cfg->name))
        return mm3_errorf(-EINVAL, "shmconn: config name '%.64s': expected 1-63 characters of [A-Za-z0-9._-]",
                          cfg->name);
    if (!name_ok(cfg->prefix, sizeof cfg->prefix))
        return mm3_errorf(-EINVAL, "shmconn: config prefix '%.32s': expected up to 31 characters of [A-Za-z0-9._-]",
                          cfg->prefix);
    if (cfg->run_id[0] && !shmconn_run_id_ok(cfg->run_id))
        return mm3_errorf(-EINVAL, "shmconn '%s': run id '%.40s': expected %d lowercase hex digits", cfg->name,
                          cfg->run_id, SHMCONN_RUN_ID_HEX);
    if (cfg->n_slots < 2 || cfg->n_slots > 65536 || (cfg->n_slots & (cfg->n_slots - 1)))
        return mm3_errorf(-EINVAL, "shmconn '%s': n_slots %u: expected a power of two in [2, 65536]", cfg->name,
                          cfg->n_slots);
    if (cfg->shm_threshold_bytes > SHMCONN_MAX_INLINE)
        return mm3_errorf(-EINVAL, "shmconn '%s': shm_threshold_bytes %llu: expected at most %llu", cfg->name,
                          (unsigned long long)cfg->shm_threshold_bytes, (unsigned long long)SHMCONN_MAX_INLINE);
    if (cfg->payload_bytes > SHMCONN_MAX_PAYLOAD)
        return mm3_errorf(-EINVAL, "shmconn '%s': payload_bytes %llu: expected at most %llu", cfg->name,
                          (unsigned long long)cfg->payload_bytes, (unsigned long long)SHMCONN_MAX_PAYLOAD);
    if (!(cfg->first_chunk_deadline_s > 0) || !(cfg->steady_deadline_s > 0))
        return mm3_errorf(-EINVAL, "shmconn '%s': first_chunk_deadline_s %g / steady_deadline_s %g: expected > 0",
                          cfg->name, cfg->first_chunk_deadline_s, cfg->steady_deadline_s);
    if (!(cfg->wait_slice_s >= 0 && cfg->wait_slice_s <= 60))
        return mm3_errorf(-EINVAL, "shmconn '%s': wait_slice_s %g: expected 0 (default) or up to 60 s", cfg->name,
                          cfg->wait_slice_s);
    uint64_t slots = (uint64_t)cfg->n_slots * (SHMCONN_SLOT_HEADER_BYTES + shmconn_align(cfg->shm_threshold_bytes));
    if (slots > (UINT64_C(16) << 30))
        return mm3_errorf(-EINVAL,
                          "shmconn '%s': n_slots x (768 + shm_threshold_bytes) = %llu bytes: expected at most 16 GiB",
                          cfg->name, (unsigned long long)slots);
    return 0;
}

void shmconn_geometry_make(const struct shmconn_config *cfg, struct shmconn_geometry *g)
{
    memset(g, 0, sizeof *g);
    g->magic = SHMCONN_MAGIC;
    g->version = SHMCONN_VERSION;
    g->header_bytes = SHMCONN_HEADER_BYTES;
    g->slot_header_bytes = SHMCONN_SLOT_HEADER_BYTES;
    g->n_slots = cfg->n_slots;
    g->inline_bytes = cfg->shm_threshold_bytes;
    g->slot_bytes = SHMCONN_SLOT_HEADER_BYTES + shmconn_align(cfg->shm_threshold_bytes);
    g->payload_bytes = shmconn_align(cfg->payload_bytes);
    uint64_t page = 4096;
    uint64_t n = SHMCONN_HEADER_BYTES + SHMCONN_CANCEL_BYTES + (uint64_t)g->n_slots * g->slot_bytes + g->payload_bytes;
    g->region_bytes = (n + page - 1) / page * page;
}

int shmconn_geometry_check(const struct shmconn_geometry *got, const struct shmconn_geometry *want, uint64_t file_bytes,
                           const char *name)
{
    if (got->magic != SHMCONN_MAGIC)
        return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: magic 0x%016llx: expected 0x%016llx", name,
                          (unsigned long long)got->magic, (unsigned long long)SHMCONN_MAGIC);
    if (got->version != SHMCONN_VERSION)
        return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: version %u: expected %u", name, got->version,
                          SHMCONN_VERSION);
#define GEO(field)                                                                                                     \
    if (got->field != want->field)                                                                                     \
        return mm3_errorf(SHMCONN_E_BAD_REGION,                                                                        \
                          "shmconn %s: geometry " #field " %llu: expected %llu (check "                                \
                          "both stages use the same connector config)",                                                \
                          name, (unsigned long long)got->field, (unsigned long long)want->field);
    GEO(header_bytes)
    GEO(slot_header_bytes)
    GEO(n_slots)
    GEO(slot_bytes)
    GEO(inline_bytes)
    GEO(payload_bytes)
    GEO(region_bytes)
#undef GEO
    if (file_bytes != got->region_bytes)
        return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: segment is %llu bytes: expected %llu", name,
                          (unsigned long long)file_bytes, (unsigned long long)got->region_bytes);
    return 0;
}

int shmconn_handle_init(struct shmconn *c, const struct shmconn_config *cfg, enum shmconn_role role)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->peer_pidfd = -1;
    c->role = role;
    c->cfg = *cfg;
    c->slice_s = cfg->wait_slice_s > 0 ? cfg->wait_slice_s : SHMCONN_DEFAULT_SLICE_S;
    snprintf(c->shm_name, sizeof c->shm_name, "/%s%s%s%s", config_prefix(cfg), cfg->run_id, cfg->run_id[0] ? "-" : "",
             cfg->name);
    pthread_mutex_init(&c->lock, NULL);
    return 0;
}

static void handle_map(struct shmconn *c, uint8_t *base, const struct shmconn_geometry *g)
{
    c->base = base;
    c->map_bytes = g->region_bytes;
    c->hdr = (struct shmconn_header *)base;
    c->cancels = (struct shmconn_cancel *)(base + SHMCONN_HEADER_BYTES);
    c->slots = base + SHMCONN_HEADER_BYTES + SHMCONN_CANCEL_BYTES;
    c->payload = c->slots + (uint64_t)g->n_slots * g->slot_bytes;
    c->mask = g->n_slots - 1;
    c->slot_bytes = g->slot_bytes;
}

static void handle_remember_inode(struct shmconn *c)
{
    struct stat st;
    if (fstat(c->fd, &st) == 0) {
        c->dev = st.st_dev;
        c->ino = st.st_ino;
    }
}

/* The owner uid of /dev/shm/<name> for an error message, or -1 when it cannot be read. */
static long segment_owner(const char *shm_name)
{
    char path[200];
    struct stat st;
    snprintf(path, sizeof path, "/dev/shm%s", shm_name);
    return lstat(path, &st) == 0 ? (long)st.st_uid : -1;
}

/* The segment behind fd may be used only when our effective user made it and no
 * other user can read or write it: anything else was put there by someone else.
 * Fills *st for the caller. */
static int segment_owner_check(const char *shm_name, int fd, const char *what, struct stat *st)
{
    if (fstat(fd, st) < 0) return mm3_errorf(-errno, "shmconn %s: fstat: %s", shm_name, strerror(errno));
    if (st->st_uid != geteuid())
        return mm3_errorf(SHMCONN_E_FOREIGN,
                          "shmconn %s: segment is owned by uid %ld, not by us (uid %ld): refusing to %s it (another "
                          "user created this name)",
                          shm_name, (long)st->st_uid, (long)geteuid(), what);
    if (st->st_mode & 077)
        return mm3_errorf(SHMCONN_E_FOREIGN,
                          "shmconn %s: segment (owner uid %ld) has mode %04o: expected 0600 (no group/other "
                          "access); refusing to %s it",
                          shm_name, (long)st->st_uid, (unsigned)(st->st_mode & 07777), what);
    return 0;
}

/* Unlink a leftover segment of the same name when it is ours and its creator is dead. */
static int region_clear_stale(struct shmconn *c)
{
    int fd = shm_open(c->shm_name, O_RDONLY, 0);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        int e = errno;
        return mm3_errorf(e == EACCES ? SHMCONN_E_FOREIGN : -e, "shmconn %s: exists, owner uid %ld: shm_open: %s",
                          c->shm_name, segment_owner(c->shm_name), strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_uid != geteuid()) {
        close(fd); /* never remove (or use) a name another user holds */
        return mm3_errorf(SHMCONN_E_FOREIGN,
                          "shmconn %s: segment exists and is owned by uid %ld, not by us (uid %ld): refusing to "
                          "remove or use it",
                          c->shm_name, (long)st.st_uid, (long)geteuid());
    }
    struct shmconn_geometry g;
    memset(&g, 0, sizeof g);
    int stale = 1;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= sizeof g && pread(fd, &g, sizeof g, 0) == (ssize_t)sizeof g &&
        g.magic == SHMCONN_MAGIC && g.creator_pid > 0 && !shmconn_pid_dead(g.creator_pid, -1))
        stale = 0;
    close(fd);
    if (!stale)
        return mm3_errorf(-EEXIST, "shmconn %s: segment exists and its creator pid %d is alive", c->shm_name,
                          (int)g.creator_pid);
    LOG_WARN("shmconn %s: unlinking a stale segment left by a dead process", c->shm_name);
    if (shm_unlink(c->shm_name) < 0 && errno != ENOENT)
        return mm3_errorf(-errno, "shmconn %s: shm_unlink: %s", c->shm_name, strerror(errno));
    return 0;
}

int shmconn_region_create(struct shmconn *c)
{
    struct shmconn_geometry g;
    shmconn_geometry_make(&c->cfg, &g);
    int fd = -1;
    for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
        fd = shm_open(c->shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno == EEXIST && attempt == 0) {
            int rc = region_clear_stale(c);
            if (rc < 0) return rc;
        } else if (fd < 0) {
            return mm3_errorf(-errno, "shmconn %s: shm_open(O_CREAT): %s", c->shm_name, strerror(errno));
        }
    }
    /* Exactly 0600: a umask may have taken away the owner's write bit the peer opens with. */
    if (fchmod(fd, 0600) < 0) {
        int e = errno;
        close(fd);
        shm_unlink(c->shm_name);
        return mm3_errorf(-e, "shmconn %s: fchmod(0600): %s", c->shm_name, strerror(e));
    }
    c->fd = fd;
    handle_remember_inode(c);
    if (ftruncate(fd, (off_t)g.region_bytes) < 0) {
        int e = errno;
        shm_unlink(c->shm_name);
        return mm3_errorf(-e, "shmconn %s: ftruncate(%llu): %s", c->shm_name, (unsigned long long)g.region_bytes,
                          strerror(e));
    }
    /* MAP_POPULATE: take the page faults of the whole region at start-up, not on
     * the first pass of 13 MB windows through the payload area. */
    void *base = mmap(NULL, g.region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        shm_unlink(c->shm_name);
        return mm3_errorf(-e, "shmconn %s: mmap(%llu): %s", c->shm_name, (unsigned long long)g.region_bytes,
                          strerror(e));
    }
    handle_map(c, base, &g);
    /* The fresh tmpfs pages are zero: counters start at 0. Geometry first, magic last. */
    struct shmconn_geometry *hg = &c->hdr->geo;
    uint64_t magic = g.magic;
    g.magic = 0;
    g.creator_pid = (int32_t)getpid();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    g.creator_start_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    memcpy(g.token, c->cfg.token, sizeof g.token);
    memcpy(hg, &g, sizeof g);
    atomic_store_explicit(&c->hdr->prod.pid, (int32_t)getpid(), memory_order_relaxed);
    atomic_store_explicit(&c->hdr->prod.state, SHMCONN_SIDE_OPEN, memory_order_relaxed);
    atomic_store_explicit((_Atomic uint64_t *)&hg->magic, magic, memory_order_release);
    return 0;
}

/* Compared without an early exit: how long the comparison takes says nothing of the token. */
static int token_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;
    for (int i = 0; i < SHMCONN_TOKEN_BYTES; i++)
        d |= (uint8_t)(a[i] ^ b[i]);
    return d == 0;
}

/* One attempt to open and validate; -EAGAIN when the segment is not there / not ready yet. */
static int region_try_open(struct shmconn *c)
{
    int fd = shm_open(c->shm_name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        if (errno == ENOENT) return -EAGAIN;
        int e = errno;
        return mm3_errorf(e == EACCES ? SHMCONN_E_FOREIGN : -e, "shmconn %s: owner uid %ld: shm_open: %s", c->shm_name,
                          segment_owner(c->shm_name), strerror(e));
    }
    struct stat st;
    int rc = segment_owner_check(c->shm_name, fd, "map", &st);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    struct shmconn_geometry g, want;
    shmconn_geometry_make(&c->cfg, &want);
    if ((uint64_t)st.st_size < sizeof g || pread(fd, &g, sizeof g, 0) != (ssize_t)sizeof g || g.magic == 0) {
        close(fd); /* the producer is still between shm_open and the magic store */
        return -EAGAIN;
    }
    rc = shmconn_geometry_check(&g, &want, (uint64_t)st.st_size, c->shm_name);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    if (!token_equal(g.token, c->cfg.token)) {
        close(fd);
        return mm3_errorf(SHMCONN_E_FOREIGN,
                          "shmconn %s: segment (owner uid %ld, creator pid %d) does not carry this run's token: "
                          "refusing to map it (another run or process created this name)",
                          c->shm_name, (long)st.st_uid, (int)g.creator_pid);
    }
    if (g.creator_pid <= 0 || shmconn_pid_dead(g.creator_pid, -1)) {
        close(fd); /* left by a dead producer: wait for its successor to replace it */
        return -EAGAIN;
    }
    void *base = mmap(NULL, g.region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        int e = errno;
        close(fd);
        return mm3_errorf(-e, "shmconn %s: mmap: %s", c->shm_name, strerror(e));
    }
    /* Validate again on the mapping: pread above and the mapping are the same
     * bytes, but a writer racing us could have changed them in between. */
    struct shmconn_geometry *hg = (struct shmconn_geometry *)base;
    if (atomic_load_explicit((_Atomic uint64_t *)&hg->magic, memory_order_acquire) != SHMCONN_MAGIC ||
        shmconn_geometry_check(hg, &want, (uint64_t)st.st_size, c->shm_name) < 0 ||
        !token_equal(hg->token, c->cfg.token)) {
        munmap(base, g.region_bytes);
        close(fd);
        return mm3_errorf(SHMCONN_E_BAD_REGION, "shmconn %s: header changed while opening", c->shm_name);
    }
    c->fd = fd;
    handle_remember_inode(c);
    handle_map(c, base, &g);
    return 0;
}

int shmconn_region_open(struct shmconn *c, double wait_s)
{
    double end = shmconn_now() + (wait_s > 0 ? wait_s : 0);
    for (;;) {
        int rc = region_try_open(c);
        if (rc != -EAGAIN) return rc;
        if (shmconn_now() >= end)
            return mm3_errorf(SHMCONN_E_TIMEOUT, "shmconn %s: no producer created the segment within %.3f s",
                              c->shm_name, wait_s);
        struct timespec ts = {0, 1000000}; /* 1 ms: start-up only, never on the message path */
        nanosleep(&ts, NULL);
    }
}

/* Unlink the name only while it still refers to our segment: a restarted
 * producer may already have created a new one under the same name. */
void shmconn_region_unlink_if_ours(struct shmconn *c)
{
    if (c->fd < 0) return;
    int fd = shm_open(c->shm_name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return;
    struct stat st;
    int ours = fstat(fd, &st) == 0 && st.st_dev == c->dev && st.st_ino == c->ino;
    close(fd);
    if (ours) shm_unlink(c->shm_name);
}

void shmconn_handle_free(struct shmconn *c)
{
    if (c->base) munmap(c->base, c->map_bytes);
    if (c->fd >= 0) close(c->fd);
    if (c->peer_pidfd >= 0) close(c->peer_pidfd);
    free(c->cancelled);
    free(c->cancelled_reason);
    free(c->released);
    free(c->slot_end);
    free(c->dropped);
    free(c->tracks);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

int shmconn_reclaim_stale(const char *prefix)
{
    if (!prefix || !prefix[0]) prefix = SHMCONN_DEFAULT_PREFIX;
    if (!name_ok(prefix, 32))
        return mm3_errorf(-EINVAL, "shmconn_reclaim_stale: prefix '%s': expected [A-Za-z0-9._-]", prefix);
    DIR *d = opendir("/dev/shm");
    if (!d) return mm3_errorf(-errno, "shmconn_reclaim_stale: /dev/shm: %s", strerror(errno));
    size_t plen = strlen(prefix);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, plen) != 0 || strlen(e->d_name) > 120) continue;
        char name[128];
        snprintf(name, sizeof name, "/%.126s", e->d_name); /* never cut: at most 120 */
        int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
        if (fd < 0) continue;
        struct stat st;
        struct shmconn_geometry g;
        memset(&g, 0, sizeof g);
        int stale = 0;
        /* another user's segment is never ours to remove, whatever it holds */
        if (fstat(fd, &st) == 0 && st.st_uid == geteuid()) {
            int have = (uint64_t)st.st_size >= sizeof g && pread(fd, &g, sizeof g, 0) == (ssize_t)sizeof g &&
                       g.magic == SHMCONN_MAGIC;
            if (have)
                stale = g.creator_pid <= 0 || shmconn_pid_dead(g.creator_pid, -1);
            else /* not a region, or one being created right now: only old ones go */
                stale = time(NULL) - st.st_mtime > 10;
        }
        close(fd);
        if (stale && shm_unlink(name) == 0) {
            LOG_INFO("shmconn: reclaimed stale segment %s (creator pid %d)", name, (int)g.creator_pid);
            n++;
        }
    }
    closedir(d);
    return n;
}
