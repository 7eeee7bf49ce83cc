/* What a stage-0 process that stopped without closing its requests (crash, kill -9,
 * power loss) leaves in api.journal_dir: journals with no end record, which
 * journal_list_unfinished would offer for completion forever, and frame spools
 * (up to ~150 MB each) that only the dead process could read. At start-up, before
 * any request, mm3-stage0 sweeps them (engine_start):
 *
 *   - a journal with no end record whose writer is gone is closed "interrupted"
 *     (its codes kept; mm3-rerender --journal FILE renders what it holds), logged
 *     with its path and frame count;
 *   - a spool whose writer is gone is deleted.
 *
 * The writer is the pid inside the request id ("<unix s>-<pid>-<job id>",
 * journal_make_id). Files of a live process (this one, or another replica sharing
 * the folder) are left alone; so is a file whose pid has been reused by an unrelated
 * live process (the next sweep after it exits takes it). A file with this process's
 * own pid but created before it started is a predecessor's (containers restart with
 * the same pid) and is swept. Pids are per machine: a
 * journal_dir shared between machines is not supported. Names that are not request
 * ids are ignored. */
#ifndef MM3_STAGE0_JOURNAL_SWEEP_H
#define MM3_STAGE0_JOURNAL_SWEEP_H

struct journal_sweep_result {
    int closed;         /* journals closed "interrupted" */
    int spools_removed; /* frame spools deleted */
    int live;           /* journals or spools of a live process, left alone */
};

/* The writer pid of a request id (and its creation time, unix seconds, when unix_s is
 * not NULL), or -1 when the id is not "<digits>-<pid>-<digits>". */
int journal_id_parse(const char *id, long long *unix_s);

/* Sweep dir as above; since_unix: when this process started (unix seconds). Errors on
 * single files are logged and skipped; only an unreadable folder is an error (with the
 * path and reason). */
int journal_sweep_orphans(const char *dir, long long since_unix, struct journal_sweep_result *res);

#endif
