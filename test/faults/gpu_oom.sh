#!/usr/bin/env bash
# Out of GPU memory at start-up: stage 0 on backend cuda with a gpu_memory_utilization
# far too small for the tiny checkpoint's plan must exit 1 (not crash) with a message
# that gives the numbers (MiB) and names gpu_memory_utilization. Only meaningful on a
# CUDA build with a visible GPU: skips (77) elsewhere.
# Usage: gpu_oom.sh SOURCE_DIR BIN_DIR CKPT_DIR TMP_DIR
src=$1 bin=$2 ckpt=$3 tmp=$4
d="$tmp/fault_gpu_oom.$$"
. "$src/test/load/lib.sh"
skip_unless_ready
command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1 || { echo "skip: no GPU"; exit 77; }
rm -rf "$d" && mkdir -p "$d" || exit 1
export MM3_SHM_PREFIX="fg$$-" MM3_STAGE1_WAIT_S=1
cat > "$d/deploy.yaml" <<YAML
pipeline: minimax_music3
model: $ckpt
backend: cuda
api:
  host: 127.0.0.1
  port: 0
stages:
  - stage_id: 0
    max_num_seqs: 64
    max_model_len: 10240
    gpu_memory_utilization: 0.00001
  - stage_id: 1
    max_num_seqs: 1
YAML
timeout -s KILL 60 "$bin/mm3-stage0" --config "$d/deploy.yaml" > "$d/out" 2> "$d/err"
rc=$?
cat "$d/err" | tail -n 3
if grep -q "not available in this build" "$d/err"; then echo "skip: CPU-only build"; rm -rf "$d"; exit 77; fi
[ $rc -eq 1 ] || fail "stage 0 exited $rc, expected 1 (137 = still running after 60 s or killed)"
grep -q "gpu_memory_utilization" "$d/err" && grep -q "MiB" "$d/err" ||
    fail "the message does not give the memory numbers and gpu_memory_utilization"
grep -q -e 'Sanitizer' -e 'runtime error:' "$d/err" && fail "sanitizer report"
[ "$(segments)" -eq 0 ] || fail "segments left"
rm -rf "$d"
exit 0
