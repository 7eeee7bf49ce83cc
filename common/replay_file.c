/* Opening a client-named replay file inside api.replay_dir (replay_file.h). */
#include "common/replay_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

#define FIELD "x_replay_file"

/* name minus the folder's prefix when it is absolute (dir as configured, or its real
 * path); NULL when it is absolute and outside. */
static const char *relative_part(const char *dir, const char *real, const char *name)
{
    if (name[0] != '/') return name;
    const char *roots[2] = {dir, real};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(roots[i]);
        while (n > 1 && roots[i][n - 1] == '/')
            n--;
        if (n && strncmp(name, roots[i], n) == 0 && name[n] == '/') return name + n + 1;
    }
    return NULL;
}

int replay_file_open(const char *dir, const char *name)
{
    if (!dir || !dir[0])
        return mm3_errorf(-EPERM, "field '" FIELD
                                  "': no replay folder is configured (api.replay_dir), so replay files are refused");
    if (!name || !name[0]) return mm3_errorf(-EINVAL, "field '" FIELD "': expected a non-empty path");
    char real[PATH_MAX];
    if (!realpath(dir, real)) real[0] = 0;
    const char *rel = relative_part(dir, real, name);
    if (!rel || !rel[0])
        return mm3_errorf(-EPERM, "field '" FIELD "': '%s' is not a file inside the replay folder (api.replay_dir)",
                          name);
    size_t n = strlen(rel);
    char *path = malloc(n + 1);
    if (!path) return mm3_errorf(-ENOMEM, "field '" FIELD "': out of memory");
    memcpy(path, rel, n + 1);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        free(path);
        return mm3_errorf(-EIO, "field '" FIELD "': the replay folder (api.replay_dir) cannot be opened");
    }
    int rc = 0;
    char *comp = path;
    for (;;) {
        char *slash = strchr(comp, '/');
        if (slash) *slash = 0;
        if (!strcmp(comp, ".") || !strcmp(comp, "..")) {
            rc = mm3_errorf(-EPERM, "field '" FIELD "': '%s': '.' and '..' are not allowed in the path", name);
            break;
        }
        if (!comp[0]) { /* "a//b" or a trailing slash */
            if (!slash) {
                rc = mm3_errorf(-EISDIR, "field '" FIELD "': '%s' names a folder, expected a file", name);
                break;
            }
            comp = slash + 1;
            continue;
        }
        int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (slash ? O_DIRECTORY : O_NONBLOCK);
        int fd = openat(dfd, comp, flags);
        if (fd < 0) {
            int err = errno;
            if (err == ELOOP || (slash && err == ENOTDIR))
                rc = mm3_errorf(-EPERM, "field '" FIELD "': '%s': symbolic links and non-folders are not followed",
                                name);
            else if (err == ENOENT)
                rc = mm3_errorf(-ENOENT, "field '" FIELD "': '%s': no such file in the replay folder", name);
            else
                rc = mm3_errorf(-EPERM, "field '" FIELD "': '%s' cannot be opened", name);
            break;
        }
        close(dfd);
        dfd = fd;
        if (!slash) break;
        comp = slash + 1;
    }
    free(path);
    if (rc < 0) {
        close(dfd);
        return rc;
    }
    struct stat st;
    if (fstat(dfd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(dfd);
        return mm3_errorf(-EPERM, "field '" FIELD "': '%s' is not a regular file", name);
    }
    int fl = fcntl(dfd, F_GETFL);
    if (fl >= 0) fcntl(dfd, F_SETFL, fl & ~O_NONBLOCK);
    return dfd;
}

int replay_file_open_st(struct st_file *f, const char *dir, const char *name)
{
    int fd = replay_file_open(dir, name);
    if (fd < 0) {
        memset(f, 0, sizeof *f);
        f->fd = -1;
        return fd;
    }
    int rc = st_file_open_fd(f, fd, name);
    /* the parser's own message may quote header bytes or the size: say only what it is not */
    if (rc < 0)
        rc = mm3_errorf(rc == -ENOMEM ? -ENOMEM : -EINVAL,
                        "field '" FIELD "': '%s' is not a golden case file (a safetensors file)", name);
    return rc;
}
