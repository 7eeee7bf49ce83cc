/* Fuzz target: arbitrary bytes as the JSON body of POST /v1/audio/speech
 * through api_request_parse with the default limits. Oracles: a refused body
 * has a terminated field name and a message; an accepted one has non-empty UTF-8 text
 * fields (a continuation may leave them empty: its song's are taken), a frame count within
 * the limits and a known sample rate; a continuation's id is 32 lowercase hex digits, and
 * return "whole" comes only with one. The limits load two adapters ("rock", "jazz"): an
 * accepted body's adapter is "" or one of them, marked given exactly when set, and only
 * an unknown `lora` is refused with -ENOENT (404). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "stage0/api/api_request.h"
#include "test/fuzz/fuzz_support.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mm3_log_set_level(MM3_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct api_limits lim;
    api_limits_default(&lim);
    lim.n_lora = 2;
    strcpy(lim.lora_names[0], "rock");
    strcpy(lim.lora_names[1], "jazz");
    /* The body is not NUL-terminated on the wire either: give the parser an exact copy. */
    char *body = malloc(size ? size : 1);
    if (!body) abort();
    if (size) memcpy(body, data, size);
    struct mm3_job_params p;
    memset(&p, 0, sizeof p);
    char field[64];
    memset(field, 0, sizeof field);
    int rc = api_request_parse(body, size, &lim, &p, field, sizeof field);
    fuzz_note("api_request_parse", rc);
    if (rc < 0) {
        if (rc != -EINVAL && !(rc == -ENOENT && !strcmp(field, "lora")))
            fuzz_fail("refused with %d (field '%.63s'), expected -EINVAL, or -ENOENT for lora", rc, field);
        /* The field is the offending key as sent, which may be "" ({"": 1}). */
        if (!memchr(field, 0, sizeof field)) fuzz_fail("field name not terminated");
        if (!mm3_last_error()[0]) fuzz_fail("refused without a message");
    } else {
        /* a continuation (by id or by an uploaded journal) may leave its text out */
        int by_id = p.continue_from[0] != 0, cont = by_id || p.journal;
        if (!p.lyrics || !p.caption || (!cont && (!p.lyrics[0] || !p.caption[0])))
            fuzz_fail("accepted without caption/lyrics");
        if (by_id && (strlen(p.continue_from) != 32 || strspn(p.continue_from, "0123456789abcdef") != 32))
            fuzz_fail("continue_from '%s' is not a request id", p.continue_from);
        if (by_id && p.journal) fuzz_fail("both continue_from and continue_journal accepted");
        if (p.journal && !p.journal_len) fuzz_fail("an empty uploaded journal accepted");
        if (p.return_whole && !cont) fuzz_fail("return whole without a continuation");
        if (p.max_frames < 1 || p.max_frames > lim.max_frames) fuzz_fail("max_frames %d", (int)p.max_frames);
        if (p.sample_rate != 44100 && p.sample_rate != 32000) fuzz_fail("sample_rate %d", (int)p.sample_rate);
        if (p.lora[0] && strcmp(p.lora, "rock") && strcmp(p.lora, "jazz")) fuzz_fail("adapter '%.63s'", p.lora);
        if (!p.lora[0] != !(p.given & MM3_GIVEN_LORA)) fuzz_fail("adapter '%s' and its given bit disagree", p.lora);
        mm3_job_params_free(&p);
    }
    free(body);
    mm3_error_clear();
    return 0;
}
