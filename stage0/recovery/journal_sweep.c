/* Start-up sweep of a dead stage-0 process's journals and spools (journal_sweep.h). */
#include "stage0/recovery/journal_sweep.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "stage0/recovery/frame_spool.h"
#include "stage0/recovery/journal.h"

int journal_id_parse(const char *id, long long *unix_s)
{
    const char *p = id;
    if (*p < '0' || *p > '9') return -1;
    long long t = 0;
    while (*p >= '0' && *p <= '9' && t < 1LL << 40)
        t = t * 10 + (*p++ - '0');
    if (*p++ != '-') return -1;
    long pid = 0;
    const char *q = p;
    while (*p >= '0' && *p <= '9' && pid <= 1L << 30)
        pid = pid * 10 + (*p++ - '0');
    if (p == q || *p++ != '-' || pid < 1 || pid > 1L << 30) return -1;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p) return -1;
    if (unix_s) *unix_s = t;
    return (int)pid;
}

/* Whether the writer of a file named by (pid, created) may still be running. This
 * process's pid with a time before `since` is a predecessor's (a restarted container
 * often gets the same pid). */
static int writer_alive(int pid, long long created, long long since)
{
    if (pid == (int)getpid()) return created >= since;
    return kill(pid, 0) == 0 || errno == EPERM;
}

/* name minus suffix into id; 0 when name does not end in suffix or is too long */
static int id_of(const char *name, const char *suffix, char id[JOURNAL_ID_MAX])
{
    size_t l = strlen(name), sl = strlen(suffix);
    if (l <= sl || l - sl >= JOURNAL_ID_MAX || strcmp(name + l - sl, suffix)) return 0;
    memcpy(id, name, l - sl);
    id[l - sl] = '\0';
    return 1;
}

static void close_orphan(const char *path, const char *id, int pid, struct journal_sweep_result *res)
{
    if (journal_ended(path) == 1) return; /* the usual case: finished long ago */
    struct journal *j = NULL;
    struct journal_record rec;
    if (journal_open_append(&j, path, &rec) < 0) {
        LOG_WARN("journal sweep: %s", mm3_last_error());
        return;
    }
    /* A journal whose last end record is intact but followed by a torn write, or one
     * a completion reopened, keeps its status; only "open" becomes "interrupted". */
    const enum journal_status st = rec.status == JOURNAL_OPEN ? JOURNAL_INTERRUPTED : rec.status;
    if (journal_close(j, st, rec.stop, rec.n_frames) < 0) {
        LOG_WARN("journal sweep: %s", mm3_last_error());
    } else if (rec.status == JOURNAL_OPEN) {
        res->closed++;
        LOG_WARN("journal %s: request %s was in flight when stage 0 (pid %d) stopped: %d frames journaled, marked "
                 "interrupted (mm3-rerender --journal %s renders them)",
                 path, id, pid, rec.n_frames, path);
    }
    journal_record_free(&rec);
}

int journal_sweep_orphans(const char *dir, long long since_unix, struct journal_sweep_result *res)
{
    *res = (struct journal_sweep_result){0};
    DIR *d = opendir(dir);
    if (!d) return mm3_errorf(-errno, "journal_dir %s: cannot open: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        char id[JOURNAL_ID_MAX];
        const int journal = id_of(e->d_name, JOURNAL_SUFFIX, id);
        if (!journal && !id_of(e->d_name, FRAME_SPOOL_SUFFIX, id)) continue;
        long long created;
        const int pid = journal_id_parse(id, &created);
        if (pid < 0) continue;
        if (writer_alive(pid, created, since_unix)) {
            res->live++;
            continue;
        }
        /* a symbolic link (or FIFO, device...) under a request's name was planted: the
         * journal and spool code opens with O_NOFOLLOW, and the sweep leaves it alone */
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
        if (!S_ISREG(st.st_mode)) {
            LOG_WARN("journal_dir %s: %s is not a regular file: left alone", dir, e->d_name);
            continue;
        }
        const size_t pl = strlen(dir) + strlen(e->d_name) + 2;
        char *path = malloc(pl);
        if (!path) {
            closedir(d);
            return mm3_errorf(-ENOMEM, "journal_dir %s: out of memory", dir);
        }
        snprintf(path, pl, "%s/%s", dir, e->d_name);
        if (journal) {
            close_orphan(path, id, pid, res);
        } else if (unlink(path) == 0) {
            res->spools_removed++;
            LOG_INFO("frame spool %s: its writer (pid %d) is gone: removed", path, pid);
        } else if (errno != ENOENT) {
            LOG_WARN("frame spool %s: cannot remove: %s", path, strerror(errno));
        }
        free(path);
    }
    closedir(d);
    return 0;
}
