/* The x_replay_file request field: a client names a golden case file that the
 * server then opens (a testing aid, MM3_ALLOW_REPLAY=1). Since the name comes from
 * the network, only a regular file inside the operator's folder api.replay_dir can
 * be opened:
 *
 *   - no folder configured: every name is refused;
 *   - the name is relative to the folder, or absolute under it; "." and ".."
 *     components are refused, every component is opened with O_NOFOLLOW below the
 *     folder (openat), so neither ".." nor a symbolic link leads out of it;
 *   - the file is opened O_NONBLOCK and must be a regular file (fstat), so a FIFO
 *     or a device is refused at once instead of stalling the server;
 *   - no message says anything about a file's bytes or size: a file that is not a
 *     golden case file is refused as that, nothing more.
 *
 *     struct st_file f;
 *     if (replay_file_open_st(&f, d->api.replay_dir, name) < 0) refuse(mm3_last_error());
 */
#ifndef MM3_REPLAY_FILE_H
#define MM3_REPLAY_FILE_H

#include "common/safetensors.h"

/* A read-only descriptor of the file `name` inside `dir`, or a negative errno code
 * whose message names the field and the reason. */
int replay_file_open(const char *dir, const char *name);

/* replay_file_open, then the safetensors header (st_file_open_fd). */
int replay_file_open_st(struct st_file *f, const char *dir, const char *name);

#endif
