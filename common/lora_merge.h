/* LoRA adapters merged into the weights as they are read from the checkpoint.
 *
 * A stage registers its deploy file's adapters once, before it loads a model
 * (lora_merge_add, or lora_merge_add_stage for a stage's `lora:` list); from then
 * on every weight read of that component through the functions below returns
 *     W + sum over adapters of scale * s * B A        (common/lora.h)
 * The sum is formed in float32 over the widened base weight and then rounded ONCE
 * to the base tensor's dtype when that is BF16 or F16, so the CPU reference (which
 * widens the result again) and the GPU upload (which keeps it in bf16) hold the
 * same merged values. The weight tables (common/weights.c) and stage 0's GPU
 * upload read through here.
 *
 * The registry is process-wide and is written only before the models load (one
 * thread); reads afterwards take no lock. lora_merge_check validates every
 * adapter of a component against the opened base checkpoint: each adapted
 * module's "<module>.weight" exists, is 2-D and has shape [out, in] of its B and A
 * factors; errors name the adapter folder, the tensor and both shapes. */
#ifndef MM3_LORA_MERGE_H
#define MM3_LORA_MERGE_H

#include <stdint.h>

#include "common/checkpoint.h"
#include "common/deploy.h"

#define LORA_MERGE_MAX 16

/* Load the adapter in dir for `component` and merge it with factor `scale` into
 * every later read of that component. */
int lora_merge_add(const char *component, const char *dir, double scale);
/* Every entry of stage s's `lora:` list (mm3_stage_config.lora). */
int lora_merge_add_stage(const struct mm3_stage_config *s);
/* The adapters a golden directory's manifest lists, for the given components:
 * "lora": [{"component": C, "path": P (relative to dir), "scale": S}, ...] (absent:
 * none). A golden made with adapters (scripts/make_golden.py --lora) replays with them. */
int lora_merge_add_golden(const char *dir, const void *manifest_json, const char *const *components, int n);
/* Drop every registered adapter (tests; a process that reloads). */
void lora_merge_clear(void);
/* Adapters registered for component (0 when none). */
int lora_merge_count(const char *component);

/* Every adapter of c's component against c's tensors; 0 when none is registered. */
int lora_merge_check(const struct ckpt_component *c);

/* ckpt_read_f32, ckpt_read_rows_f32 and ckpt_read_rows_bf16 with the adapters of
 * c's component merged into what they return (common/checkpoint.h). */
int lora_merge_read_f32(const struct ckpt_component *c, const char *name, float *dst, int ndim, const int64_t *shape);
int lora_merge_read_rows_f32(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n, float *dst);
int lora_merge_read_rows_bf16(const struct ckpt_component *c, const char *name, int64_t row0, int64_t n, uint16_t *dst);

#endif
