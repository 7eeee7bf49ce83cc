/* Stage-0 sampling: the guidance rules and one draw interface with two modes.
 *
 * Guidance (docs/model.md §4.3, §4.4):
 *   c0:    g = u + (c - u) * scale (three separately rounded float ops; the build
 *          has -ffp-contract=off), then g = -inf wherever c is below the
 *          conditional row's 50th largest value.
 *   depth: g = u + (c - u) * scale only.
 * Draw (both): v = nan_to_num(g, nan=-1e9, +inf=1e9, -inf=-1e9), keep v >= the 50th
 * largest (ties kept), draw from softmax(v).
 *
 * Modes behind sampler_draw():
 *   seeded: SGLang-Omni's position-addressed MurmurHash3 + Gumbel-max (§5.2): column
 *           `col` at draw position `pos` gets the same noise whatever else runs, so a
 *           seed gives the same song in any batch.
 *   replay: the drawn ids come from a recorded run (golden checks, forced-code replay).
 *
 * Draw positions: pos = n_codebooks * s + j, s = LM step (0 = the draw at
 * <|audio_start|>), j = 0 for c0, j = 1..n_codebooks-1 for the depth codes.
 * c0 columns are compact: column 0 = stop (<|audio_end|>), column k = code k-1. */
#ifndef MM3_SAMPLER_H
#define MM3_SAMPLER_H

#include <stdint.h>

/* Token-id contract of the MiniMax-Music3 tokenizer (not geometry). */
#define SAMPLER_STOP_ID 151670     /* <|audio_end|> */
#define SAMPLER_CODE_OFFSET 151675 /* id of semantic code 0 */
#define SAMPLER_N_CODES 16384      /* semantic (c0) codes */
#define SAMPLER_C0_COLS (1 + SAMPLER_N_CODES)
#define SAMPLER_TOP_K 50
#define SAMPLER_CFG_SCALE 1.5f

enum sampler_mode { SAMPLER_SEEDED = 0, SAMPLER_REPLAY };

struct sampler {
    enum sampler_mode mode;
    uint64_t seed; /* seeded: the derived sampling seed (31 bits for a public seed) */
    int top_k;
    /* replay: forced draws; lm_ids are vocab ids (stop id or code offset + c0),
     * depth_codes hold n_codebooks-1 codes per LM step, in order. Not owned. */
    const int64_t *lm_ids;
    int n_lm;
    const int64_t *depth_codes;
    int n_depth;
    int n_codebooks;
    int n_outside; /* replay: forced draws that fell outside the candidate set */
};

/* sampling_seed = LE_u64(BLAKE2b-64("minimax-ttm-ar:" + decimal(seed))) & 0x7FFFFFFF */
uint64_t sampler_seed_derive(uint64_t public_seed);

/* MurmurHash3-style hash of (seed lo, seed hi, pos, col) with the fmix32 finaliser. */
uint32_t sampler_murmur(uint64_t seed, uint32_t pos, uint32_t col);

/* Gumbel noise -log(-clamp(log(h / (2^32-1)), -DBL_MAX, -2^-32)) in double. */
double sampler_gumbel(uint64_t seed, uint32_t pos, uint32_t col);

/* v[i] = -inf where v[i] < the k-th largest value (duplicates counted, ties kept).
 * A NaN ranks above every number (torch.topk order) and is never masked. k >= n: no-op. */
void sampler_topk_mask(float *v, int n, int k);

/* g = u + (c - u) * scale, three separately rounded float ops. g may alias c or u. */
void sampler_cfg_blend(float *g, const float *c, const float *u, int n, float scale);

/* The c0 rule: blend, then g = -inf where c < the conditional row's top_k-th value. */
void sampler_c0_guide(float *g, const float *c, const float *u, int n, float scale, int top_k);

/* Seeded mode from a public seed (derived) or from a raw sampling seed (test vectors). */
void sampler_init_seeded(struct sampler *s, uint64_t public_seed);
void sampler_init_raw(struct sampler *s, uint64_t sampling_seed);

/* Replay mode; the arrays must outlive the sampler. */
void sampler_init_replay(struct sampler *s, const int64_t *lm_ids, int n_lm, const int64_t *depth_codes, int n_depth,
                         int n_codebooks);

/* Draw one column of guided logits g[n] (not modified) at draw position pos.
 * c0 draws use compact columns (n = SAMPLER_C0_COLS). Returns 0 with *col set, or
 * -ERANGE (replay exhausted or a forced id outside [0, n)). */
int sampler_draw(struct sampler *s, const float *g, int n, uint32_t pos, int *col);

/* The seeded rule on its own (no state): nan_to_num, top-k mask, Gumbel argmax. */
int sampler_draw_gumbel(uint64_t seed, const float *g, int n, int top_k, uint32_t pos);

/* c0 column <-> vocab id. */
static inline int64_t sampler_c0_col_to_id(int col)
{
    return col == 0 ? SAMPLER_STOP_ID : (int64_t)SAMPLER_CODE_OFFSET + col - 1;
}

/* -1 for an id that is neither the stop id nor a code (a code past the last column
 * gives a column >= SAMPLER_C0_COLS: callers check the range). */
static inline int64_t sampler_c0_id_to_col(int64_t id)
{
    if (id == SAMPLER_STOP_ID) return 0;
    return id >= SAMPLER_CODE_OFFSET ? id - SAMPLER_CODE_OFFSET + 1 : -1;
}

#endif
