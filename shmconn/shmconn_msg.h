/* Internal: message layout and validation shared by producer and consumer. */
#ifndef MM3_SHMCONN_MSG_H
#define MM3_SHMCONN_MSG_H

#include <stdint.h>

#include "shmconn/shmconn.h"

/* Validate one tensor descriptor; `where` and `i` name it in the message. */
int shmconn_tensor_check(const char *name, uint32_t dtype, uint32_t ndim, const int64_t *shape, uint64_t nbytes,
                         const char *where, uint32_t i);

/* Validate m's tensors and lay them out: offsets[i] (64-byte aligned) and the total bytes. */
int shmconn_msg_layout(const struct shmconn_msg *m, uint64_t *offsets, uint64_t *total, const char *where);

#endif
