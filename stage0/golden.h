/* Replay check of stage 0 against a golden directory (format of
 * ../shared/golden/tiny-a, see its README): for every case of manifest.json, force
 * the recorded draws, compare the guided logits of the first recorded draws and the
 * frame hiddens (rel = ||a-b|| / ||b|| <= 1e-4 in float32), check that the prompt
 * tokenizes to text_ids_pair exactly. */
#ifndef MM3_STAGE0_GOLDEN_H
#define MM3_STAGE0_GOLDEN_H

#include <stdio.h>

#define GOLDEN_REL_TOL 1e-4

/* Prints one line per case and a final "N passed, M failed" line to out.
 * Returns 0 when the directory could be read (cases may still fail; see *n_fail),
 * < 0 when it could not (no manifest, no checkpoint). */
int golden_check_dir(const char *dir, FILE *out, int *n_pass, int *n_fail);

#endif
