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

/* The replay through a talker backend ("cpu" or "cuda", stage0/talker_backend.h)
 * with the loop of stage0/golden_backend.c. -ENODEV when the backend is missing. */
int golden_check_dir_backend(const char *dir, const char *backend, double tol, FILE *out, int *n_pass, int *n_fail);

/* The c0 candidate set of one draw against the reference's: guided[n] is ours in
 * compact columns (non-finite = outside the set), ref_ids[k] / ref_logits[k] the
 * reference's set and logits. Returns the number of differences that count: a
 * different size, or ids in one set and not the other, unless they tie at both sets'
 * lower edge within tol x RMS(ref_logits) or number at most max_flips (a bf16
 * backend: an id whose conditional logit crosses the c0 rule's threshold); such
 * tolerated ids are counted in *swaps. */
int golden_support_compare(const float *guided, int n, const int64_t *ref_ids, const float *ref_logits, int k,
                           double tol, int max_flips, int *swaps);

/* 1 when the replay's forced c0 draw forced_id (a vocab id) is outside our candidate set
 * guided[n] and inside the reference's ref_ids[k]: after golden_support_compare
 * tolerated the draw's sets, the reference drew one of the ids rounding moved across the
 * edge (a bf16 backend at a near-tie of the conditional row's 50th value), not a
 * different distribution. 0 otherwise. */
int golden_forced_on_swap(const float *guided, int n, const int64_t *ref_ids, int k, int64_t forced_id);

/* Forced c0 draws outside our candidate set ("flips"). The c0 rule keeps the codes whose
 * conditional logit reaches the conditional row's top-k-th value; where a code sits
 * within the float error of that edge, our rounding can leave out the very code the
 * reference drew. Such an edge flip is counted and bounded, not failed: at most
 * golden_flip_budget(c0 draws) per case, each within tol x the RMS of the row's k
 * largest logits of the edge. A flip farther from the edge, or any forced depth draw
 * outside the candidate set, fails the case. */
#define GOLDEN_FLIP_FRACTION 0.01

/* The c0 top-k edge of the conditional row cond[n] seen from column col: *edge = the
 * k-th largest value (duplicates counted), *margin = *edge - cond[col] (> 0: col is
 * below it), *scale = RMS of the k largest values. Non-finite values rank lowest. */
void golden_c0_edge(const float *cond, int n, int k, int col, double *edge, double *margin, double *scale);

/* 1 when a flip margin (golden_c0_edge) is within tol x scale of the edge, 0 otherwise. */
int golden_flip_is_edge(double margin, double scale, double tol);

/* The edge flips a case of n_c0_draws c0 draws may have: max(1, GOLDEN_FLIP_FRACTION x n). */
int golden_flip_budget(int n_c0_draws);

/* 1 when a case's forced draws pass: all n_outside draws outside our candidate set are
 * edge flips (n_edge_flips of them) and they are within golden_flip_budget(n_c0_draws). */
int golden_flips_pass(int n_outside, int n_edge_flips, int n_c0_draws);

#endif
