/* Fuzz target: arbitrary bytes as an uploaded journal file (the request field
 * continue_journal, after base64) through journal_read_buffer with the served cap of
 * 9001 steps. Oracles: a refused file is -EINVAL with a message; a read one has at most
 * the cap's steps, codes inside the header's ranges, a status and stop the format knows,
 * and frames of at most its steps. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "stage0/recovery/journal.h"
#include "test/fuzz/fuzz_support.h"

#define MAX_STEPS 9001

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mm3_log_set_level(MM3_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact copy: the reader must not look past size */
    uint8_t *b = malloc(size ? size : 1);
    if (!b) abort();
    if (size) memcpy(b, data, size);
    struct journal_record rec;
    int rc = journal_read_buffer("(fuzz)", b, size, MAX_STEPS, &rec);
    fuzz_note("journal_read_buffer", rc);
    if (rc < 0) {
        if (rc != -EINVAL && rc != -ENOMEM) fuzz_fail("refused with %d, expected -EINVAL", rc);
        if (!mm3_last_error()[0]) fuzz_fail("refused without a message");
    } else {
        if (rec.n_steps < 0 || rec.n_steps > MAX_STEPS) fuzz_fail("%d steps past the cap", rec.n_steps);
        if (rec.n_frames < 0 || rec.n_frames > rec.n_steps) fuzz_fail("%d frames of %d steps", rec.n_frames, rec.n_steps);
        if (rec.status < JOURNAL_OPEN || rec.status > JOURNAL_INTERRUPTED) fuzz_fail("status %d", (int)rec.status);
        for (int s = 0; s < rec.n_steps; s++)
            for (int k = 0; k < rec.h.n_codebooks; k++) {
                int32_t c = rec.codes[(size_t)s * rec.h.n_codebooks + k];
                if (c < 0 || c >= (k == 0 ? rec.h.c0_codes : rec.h.audio_vocab))
                    fuzz_fail("step %d codebook %d: code %d out of range", s, k, c);
            }
        journal_record_free(&rec);
    }
    free(b);
    mm3_error_clear();
    return 0;
}
