/* The frame spool (docs/journal.md): the exact frame payloads stage 0 sends to
 * stage 1 for one journaled request (the pre-mixed frames, or raw ones with
 * MM3_STAGE0_RAW_FRAMES=1), appended to <journal_dir>/<request id>.mm3s beside the
 * request's journal, so that a restarted stage 1 gets frames 0..n-1 back byte for
 * byte, without recomputing them by teacher forcing.
 *
 *     char *path; char id[JOURNAL_ID_MAX];
 *     frame_spool_path_for(journal_path(jr), &path, id);
 *     struct frame_spool *sp = NULL;
 *     if (frame_spool_open(&sp, path, id, width, MM3_DTYPE_F32) < 0)
 *         LOG_WARN("%s", mm3_last_error());            // goes on without (NULL is a no-op)
 *     frame_spool_append(sp, first, n, mixed);          // every payload, in frame order
 *     frame_spool_read_back(sp, 100, &sink, &n);        // stage 1 is back: frames 0..n-1
 *     frame_spool_remove(sp);                            // the journal is closed
 *
 * File (little-endian):
 *   header  "MM3SPOOL" | u32 version | u32 dtype (enum mm3_dtype) | u32 width
 *           | u32 id length | request id | u64 BLAKE2b-64(all of the above)
 *   records u32 first frame | u32 n | n * width elements | u64 BLAKE2b-64(first, n, data)
 * Records are contiguous (first = frames before it). Writes are buffered (stdio) and
 * flushed every FRAME_SPOOL_FLUSH_FRAMES frames, like the journal; a torn or corrupt
 * record ends the readable prefix. One writer per request, not shared between threads.
 *
 * Failure policy (as the journal's): spooling never fails a request. A NULL writer
 * is a valid no-op; the first write error is logged once with the path and reason and
 * disables the writer (later appends are dropped; a read-back says -ENODATA), and the
 * re-send falls back to teacher forcing from the journal. */
#ifndef MM3_STAGE0_FRAME_SPOOL_H
#define MM3_STAGE0_FRAME_SPOOL_H

#include <stdint.h>

#include "common/dtype.h"
#include "stage0/recovery/journal.h"

#define FRAME_SPOOL_VERSION 1
#define FRAME_SPOOL_SUFFIX ".mm3s"
#define FRAME_SPOOL_FLUSH_FRAMES JOURNAL_FLUSH_STEPS /* the journal's flush points */
#define FRAME_SPOOL_MAX_FRAMES (1 << 24)             /* frames per spool (days of audio) */
#define FRAME_SPOOL_MAX_WIDTH (1 << 24)              /* elements per frame */

struct frame_spool;

/* Receives frames [first, first + n) (n * width elements of the spool's dtype), in
 * order, in pieces of at most the reader's chunk; nonzero stops the read. */
struct frame_spool_sink {
    void *ctx;
    int (*emit)(void *ctx, int first, const void *frames, int n);
};

/* The spool of a journal: "<dir>/<id>.mm3j" -> *path = "<dir>/<id>.mm3s" (malloc'ed)
 * and id = "<id>". -EINVAL when journal_path does not end in JOURNAL_SUFFIX. */
int frame_spool_path_for(const char *journal_path, char **path, char id[JOURNAL_ID_MAX]);

/* Create path (never overwriting an existing file) and write the header. On error *sp
 * is NULL and the message names the path and the reason. width: elements per frame
 * (1..FRAME_SPOOL_MAX_WIDTH); dtype: their type. */
int frame_spool_open(struct frame_spool **sp, const char *path, const char *req_id, int width, enum mm3_dtype dtype);

/* Append frames [first, first + n) as one record; first must be frame_spool_frames()
 * (frames are spooled in order, each once). Returns 0, or the error of the first
 * failed write (logged once; the writer is disabled, later calls return 0 and do
 * nothing). A gap or overlap is -EINVAL and disables the writer too (a bug upstream).
 * sp NULL: no-op. */
int frame_spool_append(struct frame_spool *sp, int first, int n, const void *frames);

/* Push what stdio buffers to the file (as a periodic flush does). */
int frame_spool_flush(struct frame_spool *sp);

/* Frames appended so far (0 for NULL). */
int frame_spool_frames(const struct frame_spool *sp);
/* 1 when a write error disabled the writer, or sp is NULL. */
int frame_spool_disabled(const struct frame_spool *sp);
/* The file's path ("" for NULL); valid until close / remove. */
const char *frame_spool_path(const struct frame_spool *sp);

/* Flush and read back every frame appended so far (frames 0..frame_spool_frames()-1)
 * from the file into sink, in pieces of at most chunk_frames; *n_frames = how many.
 * -ENODATA when there is no usable spool (sp NULL or disabled), else as
 * frame_spool_read. */
int frame_spool_read_back(struct frame_spool *sp, int chunk_frames, const struct frame_spool_sink *sink, int *n_frames);

/* Close the file and free the writer, keeping the file (what a crash leaves). */
void frame_spool_close(struct frame_spool *sp);
/* Close the file, delete it and free the writer. sp NULL: no-op. */
void frame_spool_remove(struct frame_spool *sp);

/* Check the header of path against req_id / width / dtype and count the frames of
 * its intact records (*n_frames); *torn = 1 when bytes after them were ignored (a
 * torn or corrupt tail). Errors: missing file (-ENOENT, ...), header that is
 * truncated, corrupt or names another request, width or dtype (-EINVAL): the message
 * names the file and the field. */
int frame_spool_scan(const char *path, const char *req_id, int width, enum mm3_dtype dtype, int *n_frames, int *torn);

/* Frames 0..n_frames-1 of path to sink in pieces of at most chunk_frames, each piece
 * taken from records whose checksum was verified. The file is scanned first: when it
 * holds fewer intact frames the sink is not called and the result is -ENODATA (the
 * message says how many it has). Returns 0, the errors of frame_spool_scan, -EIO
 * (read error, or the file changed between the scan and the read), -ENOMEM, or the
 * sink's nonzero value. */
int frame_spool_read(const char *path, const char *req_id, int width, enum mm3_dtype dtype, int n_frames,
                     int chunk_frames, const struct frame_spool_sink *sink);

#endif
