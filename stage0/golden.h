/* Replay check of stage 0 against a golden directory (format of
 * ../shared/golden/tiny-a, see its README): for every case of manifest.json, force
 * the recorded draws, compare the guided logits of the first recorded draws and the
 * frame hiddens (rel = ||a-b|| / ||b|| <= 1e-4 in float32), check that the prompt
 * tokenizes to text_ids_pair exactly. */
#ifndef MM3_STAGE0_GOLDEN_H
#define MM3_STAGE0_GOLDEN_H

#include <stdint.h>
#include <stdio.h>

#include "common/sampler.h"
#include "stage0/generate.h"

#define GOLDEN_REL_TOL 1e-4
/* Tolerance of a backend whose numerics may differ from float32 (bf16 activations). */
#define GOLDEN_REL_TOL_BF16 2e-2

/* Prints one line per case and a final "N passed, M failed" line to out.
 * Returns 0 when the directory could be read (cases may still fail; see *n_fail),
 * < 0 when it could not (no manifest, no checkpoint). */
int golden_check_dir(const char *dir, FILE *out, int *n_pass, int *n_fail);

/* One replay of a case through some AR loop: prefill ids_pair[2, prompt_len], draw
 * through sp, report frames and guided logits through hooks, set *stop. */
typedef int (*golden_run_fn)(void *ctx, const struct talker *lm, const struct depth *dd, struct sampler *sp,
                             const int32_t *ids_pair, int prompt_len, int max_frames, float cfg_scale,
                             const struct generate_hooks *hooks, enum generate_stop *stop);

/* golden_check_dir with another AR loop and relative tolerance `tol` (guided
 * logits and frame hiddens), the models loaded as a backend of `models_for` needs
 * them (talker_backend_load_models). golden_check_dir = this with the CPU generate
 * loop and GOLDEN_REL_TOL. */
int golden_check_dir_with(const char *dir, golden_run_fn run, void *ctx, enum talker_backend_kind models_for,
                          double tol, FILE *out, int *n_pass,
                          int *n_fail);

/* The replay through a talker backend ("cpu" or "cuda", stage0/model/talker_backend.h)
 * with the loop of stage0/golden_backend.c. -ENODEV when the backend is missing. */
int golden_check_dir_backend(const char *dir, const char *backend, double tol, FILE *out, int *n_pass, int *n_fail);

/* The c0 candidate set of one draw against the reference's in guided-logit space (the
 * float32 rule): guided[n] is ours in compact columns (non-finite = outside the set),
 * ref_ids[k] / ref_logits[k] the reference's set and logits. Returns the number of
 * differences that count: a different size, an id that is no column, or ids in one set
 * and not the other, unless they tie at both sets' lower edge within tol x
 * RMS(ref_logits); such tolerated ids are counted in *swaps. */
int golden_support_compare(const float *guided, int n, const int64_t *ref_ids, const float *ref_logits, int k,
                           double tol, int *swaps);

/* The same comparison by the c0 rule's own edge (a backend whose logits differ from
 * float32): the rule keeps the codes whose CONDITIONAL logit reaches the conditional
 * row's k-th value, so an id at that edge may have any guided value. cond[n] is our
 * conditional row. The sets must have the same size; an id in one set and not the other
 * is an edge swap when its conditional logit lies within tol x RMS(cond's k largest) of
 * cond's k-th value (golden_topk_edge), and a difference otherwise. Returns the number of
 * differences that count; *swaps = the ids of the reference's set that ours lacks when
 * all of them are edge swaps. */
int golden_support_compare_cond(const float *guided, const float *cond, int n, const int64_t *ref_ids, int k,
                                double tol, int *swaps);

/* 1 when the replay's forced c0 draw forced_id (a vocab id) is outside our candidate set
 * guided[n] and inside the reference's ref_ids[k]: after the comparison tolerated the
 * draw's sets, the reference drew one of the ids rounding moved across the edge, not a
 * different distribution. 0 otherwise. */
int golden_forced_on_swap(const float *guided, int n, const int64_t *ref_ids, int k, int64_t forced_id);

/* Forced draws outside our candidate set ("flips"). Every draw keeps the top-k of its
 * row (c0: after the c0 rule's conditional top-k; depth: of the guided row); where a code
 * sits within the float error of that edge, our rounding can leave out the very code the
 * reference drew. Such an edge flip is counted and bounded, not failed: each within tol x
 * the RMS of the row's k largest values of the edge, at most golden_flip_budget(draws)
 * per case for the c0 draws and, separately, for the depth draws. A flip farther from
 * the edge fails the case. */
#define GOLDEN_FLIP_FRACTION 0.01

/* Edge swaps of the c0 candidate sets (golden_support_compare_cond) a case may have:
 * a swap is a candidate slot of a compared draw filled by another id at the edge; at
 * most max(1, GOLDEN_SWAP_FRACTION x the compared slots). A candidate set has k slots
 * and only ids near the edge can swap, so swaps are far more frequent than flips (a flip
 * needs the reference to draw the swapped id). */
#define GOLDEN_SWAP_FRACTION 0.05

/* The top-k edge of row[n] seen from column col: *edge = the k-th largest value
 * (duplicates counted), *margin = *edge - row[col] (> 0: col is below it), *scale = RMS
 * of the k largest values. Non-finite values rank lowest. For c0 draws the row is the
 * conditional one (the c0 rule's edge), for depth draws the guided one. */
void golden_topk_edge(const float *row, int n, int k, int col, double *edge, double *margin, double *scale);

/* 1 when column col is outside the sampler's candidate set of the guided row g[n]:
 * the top-k of nan_to_num(g) (common/sampler.c), as sampler_draw counts n_outside. */
int golden_topk_outside(const float *g, int n, int k, int col);

/* 1 when a flip margin (golden_topk_edge) is within tol x scale of the edge, 0 otherwise. */
int golden_flip_is_edge(double margin, double scale, double tol);

/* The edge flips a case of n_draws draws of one kind may have: max(1, GOLDEN_FLIP_FRACTION x n). */
int golden_flip_budget(int n_draws);

/* The edge swaps a case may have over n_slots compared candidate slots (the sum of the
 * compared draws' set sizes): max(1, GOLDEN_SWAP_FRACTION x n_slots). */
int golden_swap_budget(int n_slots);

/* 1 when a case's forced draws pass: all n_outside draws outside our candidate set are
 * edge flips (c0_edge c0 ones, depth_edge depth ones) and each kind is within
 * golden_flip_budget of its draws (c0_draws, depth_draws). */
int golden_flips_pass(int n_outside, int c0_edge, int c0_draws, int depth_edge, int depth_draws);

#endif
