/* Fuzz target: arbitrary bytes as a deploy YAML document through
 * mm3_deploy_load_string, then backend resolution and the accessors. Oracles:
 * a refused file leaves the defaults in place; an accepted one has a message-free
 * result whose stages and edge connector can be looked up. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/deploy.h"
#include "common/error.h"
#include "common/log.h"
#include "test/fuzz/fuzz_support.h"

static struct mm3_deploy g_defaults; /* reference for "refused means defaults" */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mm3_log_set_level(MM3_LOG_ERROR);
    mm3_deploy_init_defaults(&g_defaults);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *yaml = fuzz_strndup(data, size);
    struct mm3_deploy *d = calloc(1, sizeof *d); /* heap: ASan sees overruns of the big struct */
    if (!d) abort();
    int rc = mm3_deploy_load_string(d, yaml, "fuzz.yaml");
    fuzz_note("mm3_deploy_load_string", rc);
    if (rc < 0) {
        if (!mm3_last_error()[0]) fuzz_fail("refused without a message");
        if (memcmp(d, &g_defaults, sizeof *d) != 0) fuzz_fail("refused file left a half-read config");
    } else {
        if (!mm3_deploy_stage(d, 0) || !mm3_deploy_stage(d, 1) || mm3_deploy_stage(d, 2))
            fuzz_fail("mm3_deploy_stage lookups");
        const struct mm3_connector_config *edge = mm3_deploy_edge_connector(d);
        if (!edge) fuzz_fail("no edge connector");
        (void)mm3_connector_first_chunk_deadline_s(edge);
        (void)mm3_connector_steady_deadline_s(edge);
        for (int i = 0; i < d->n_connectors; i++)
            if (mm3_deploy_connector(d, d->connectors[i].name) != &d->connectors[i])
                fuzz_fail("connector '%s' not found by name", d->connectors[i].name);
        for (int s = 0; s < MM3_DEPLOY_NUM_STAGES; s++)
            if (strnlen(d->stages[s].devices_text, sizeof d->stages[s].devices_text) == sizeof d->stages[s].devices_text)
                fuzz_fail("stage %d devices_text not terminated", s);
        (void)mm3_backend_name(d->backend);
        mm3_deploy_resolve_backend(d, (size & 1) != 0);
    }
    mm3_deploy_free(d);
    free(d);
    free(yaml);
    mm3_error_clear();
    return 0;
}
