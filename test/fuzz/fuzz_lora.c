/* Fuzz target: a LoRA adapter folder built from the input, loaded with
 * lora_adapter_load for the talker's component.
 *
 * Input: parts split at "\n--\n" (fuzz_support.h):
 *   part 0  adapter_config.json
 *   part 1  adapter_model.safetensors
 * Oracles: a loaded adapter has a rank in [1, LORA_MAX_RANK], a finite scaling, its
 * modules sorted by weight name and found by it, each "<name>.weight" with positive
 * sizes; a refused one is freed to zero. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "common/log.h"
#include "common/lora.h"
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
    struct fuzz_part parts[2];
    int n = fuzz_split(data, size, parts, 2);
    const char *dir = fuzz_scratch_dir();
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    fuzz_write_file(path, parts[0].data, parts[0].size);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    fuzz_write_file(path, n > 1 ? parts[1].data : NULL, n > 1 ? parts[1].size : 0);
    struct lora_adapter a;
    int rc = lora_adapter_load(&a, dir, "language_model");
    fuzz_note("lora_adapter_load", rc);
    if (rc < 0) {
        if (a.modules || a.dir || a.n_modules) fuzz_fail("a refused adapter was not freed");
        return 0;
    }
    if (a.rank < 1 || a.rank > LORA_MAX_RANK || !isfinite(a.scaling))
        fuzz_fail("rank %d scaling %g", a.rank, a.scaling);
    for (int i = 0; i < a.n_modules; i++) {
        const struct lora_module *m = &a.modules[i];
        if (i > 0 && strcmp(a.modules[i - 1].weight, m->weight) >= 0) fuzz_fail("modules not sorted/unique");
        if (lora_adapter_find(&a, m->weight) != m) fuzz_fail("module '%s' not found by name", m->weight);
        if (m->out < 1 || m->in < 1 || !m->a || !m->b) fuzz_fail("module '%s' sizes", m->name);
        size_t len = strlen(m->name);
        if (strncmp(m->weight, m->name, len) || strcmp(m->weight + len, ".weight")) fuzz_fail("weight name");
    }
    lora_adapter_free(&a);
    return 0;
}
