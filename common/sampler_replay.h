/* Forced draws for the replay sampler, read from a safetensors file with the keys
 * of the golden cases and of mm3-stage0 --frames-out:
 *   lm_sampled    [S] I64   vocab id of every c0 draw (stop id or 151675 + c0),
 *                           the non-emitted draw at <|audio_start|> first
 *   depth_sampled [D] I64   the depth codes, n_codebooks-1 per LM step, in order */
#ifndef MM3_SAMPLER_REPLAY_H
#define MM3_SAMPLER_REPLAY_H

#include <stdint.h>

struct sampler_replay_data {
    int64_t *lm_ids;
    int n_lm;
    int64_t *depth_codes;
    int n_depth;
};

#include "common/safetensors.h"

int sampler_replay_load(struct sampler_replay_data *d, const char *path);
/* The same from a file already open (x_replay_file: common/replay_file.h). */
int sampler_replay_load_file(struct sampler_replay_data *d, const struct st_file *f);
void sampler_replay_free(struct sampler_replay_data *d);

#endif
