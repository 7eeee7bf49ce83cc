#!/usr/bin/env bash
# One device call that checks and measures everything, for sessions whose device time is
# short: GPU tests and golden replays first (correctness before speed), then the random
# full checkpoint, the end-to-end run through both processes, the stage-0 benchmark and
# the PyTorch baselines, each phase under its own deadline so the call ends inside the
# run tool's limit. Results: one archive $OUT/results.tgz plus the table on stdout.
#
# Here:   scripts/device-final.sh --pack [build-dir]     (builds + packs into .device/)
# Device: run(command="scripts/device-final.sh", carry=[".device"])
#         MM3_FINAL_PHASES=tests,e2e,stage0,vocoder,pytorch (default all, in that order)
#         MM3_FINAL_CONFIG=deploy.yaml for the e2e phase (default configs/minimax_music3.yaml);
#         MM3_MPS=1 runs the stages under a private MPS daemon (scripts/launch.sh --mps)
#         MM3_FINAL_STAGE0_ARGS: the stage-0 benchmark's grid (default --contexts 1000 --pairs 1,2,4,8;
#         e.g. add --lora 16,64 for the per-request adapter figures)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
gpu_tests=(test_condition_cuda test_dit_cuda test_flow_cuda test_frame_cuda test_generate_batch test_ops_cuda test_render_batch test_sampler_cuda test_scheduler test_cuda_env_switch test_talker_cuda test_vocoder_cuda)
progs=(mm3-stage0 mm3-stage1 mm3-deploy mm3-flow-fast mm3-mkckpt mm3-bench-stage0 mm3-bench-ops mm3-bench-vocoder mm3-bench-dit mm3-bench-load
       "${gpu_tests[@]}")

if [ "${1:-}" = --pack ]; then
  build=${2:-build-cuda}
  scripts/device-pack.sh -B "$build" "${progs[@]}" >/dev/null || exit 1
  strip .device/bin/* 2>/dev/null
  rm -rf .device/golden && mkdir -p .device/golden && cp -r "${MM3_GOLDEN_DIR:-../shared/golden/tiny-a}" .device/golden/tiny-a
  # The working tree that travels is capped at 64 MiB: gzip left 79 MB (programs + tiny-a)
  # in the twelfth session, xz leaves 29 MB (the programs share most of their device code).
  rm -f .device/binlib.tgz
  XZ_OPT="-9 -T2" tar cJf .device/binlib.txz -C .device bin lib golden && rm -rf .device/bin .device/lib .device/golden
  du -sh --apparent-size .device
  exit 0
fi

[ -f .device/binlib.txz ] && [ ! -d .device/bin ] && tar xJf .device/binlib.txz -C .device
out=/tmp/final; mkdir -p "$out"
phases=${MM3_FINAL_PHASES:-tests,e2e,stage0,vocoder,pytorch}
want() { [[ ",$phases," == *",$1,"* ]]; }
finish() { tar czf "${OUT:-/tmp}/results.tgz" -C "$out" . 2>/dev/null; }
trap finish EXIT
t0=$SECONDS
stamp() { finish; echo "== $* (t=$((SECONDS - t0)) s)"; } # archive what exists at each phase
export LD_LIBRARY_PATH="$root/.device/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MM3_GOLDEN_DIR=$root/.device/golden/tiny-a MM3_SOURCE_DIR=$root MM3_BIN_DIR=$root/.device/bin
export MM3_TEST_TMP=/tmp/mm3-test MM3_BENCH_CKPT=/tmp/mm3-bench-ckpt PYTHONUNBUFFERED=1
mkdir -p "$MM3_TEST_TMP"
bin=.device/bin

if want tests; then
  stamp tests
  for t in "${gpu_tests[@]}"; do
    MM3_TEST_DIT_QUICK=1 timeout 120 $bin/$t > "$out/$t.log" 2>&1; rc=$?
    echo "$t rc=$rc"; [ $rc = 0 ] || grep -E "FAIL|ERROR|error" "$out/$t.log" | head -5
  done
  timeout 60 $bin/mm3-stage0 --golden "$MM3_GOLDEN_DIR" --backend cuda > "$out/golden_s0_cuda.log" 2>&1
  echo "stage0 golden cuda rc=$?"; grep -iE "rel|pass|fail" "$out/golden_s0_cuda.log" | tail -4
  for p in tf32 bf16 fp16 fp8; do
    timeout 60 $bin/mm3-stage1 --golden "$MM3_GOLDEN_DIR" --backend cuda --precision $p > "$out/golden_s1_$p.log" 2>&1
    echo "stage1 golden cuda $p rc=$?"; grep -iE "rel|pass|fail" "$out/golden_s1_$p.log" | tail -3
  done
  for g in test/data/golden-geometries/*/; do # the other geometries, stage 1 in fp32 (the CPU's bound)
    g=$(basename "$g") d=$MM3_TEST_TMP/geo-$g
    scripts/golden-geometry.sh $bin/mm3-mkckpt "test/data/golden-geometries/$g" "$d" || { echo "geometry $g: no checkpoint"; continue; }
    timeout 60 $bin/mm3-stage0 --golden "$d" --backend cuda > "$out/golden_s0_cuda_$g.log" 2>&1
    echo "stage0 golden cuda $g rc=$?"; grep -iE "rel|pass|fail" "$out/golden_s0_cuda_$g.log" | tail -2
    timeout 60 $bin/mm3-stage1 --golden "$d" --backend cuda --precision fp32 > "$out/golden_s1_fp32_$g.log" 2>&1
    echo "stage1 golden cuda fp32 $g rc=$?"; grep -iE "rel|pass|fail" "$out/golden_s1_fp32_$g.log" | tail -2
  done
fi
if want e2e; then
  stamp e2e
  timeout "${MM3_FINAL_E2E_S:-300}" scripts/bench.sh --out "$out" --bin $bin --only e2e --e2e \
    ${MM3_FINAL_CONFIG:+--config "$MM3_FINAL_CONFIG"} >/dev/null 2>&1
  echo "e2e rc=$?"; tail -3 "$out/e2e.log" 2>/dev/null
  grep "request .* done\|totals" "$out/launch.log" | tail -3
fi
if want stage0; then
  stamp stage0
  MM3_BENCH_STAGE0_ARGS="${MM3_FINAL_STAGE0_ARGS:---contexts 1000 --pairs 1,2,4,8} --time-limit ${MM3_FINAL_STAGE0_S:-100}" \
    timeout $((${MM3_FINAL_STAGE0_S:-100} + 50)) scripts/bench.sh --out "$out" --bin $bin --only stage0 >/dev/null 2>&1
  echo "stage0 rc=$?"; grep -E "^\|" "$out/stage0.log" 2>/dev/null | tail -12
fi
if want vocoder; then
  # The vocoder per window against the DiT per window, same run (issue 8: <= 5%).
  stamp vocoder
  for p in fp32 tf32 bf16; do
    timeout 60 $bin/mm3-bench-vocoder --release 689 10 $p > "$out/vocoder_$p.log" 2>&1; echo "vocoder $p rc=$?"
    tail -1 "$out/vocoder_$p.log"
  done
  timeout 120 $bin/mm3-bench-dit --windows 1,8 --precisions tf32,bf16 --reps 3 > "$out/dit.log" 2>&1
  echo "dit rc=$?"; grep -E "^\|" "$out/dit.log" | tail -8
fi
if want pytorch; then
  stamp pytorch
  timeout 100 python3 scripts/bench/pytorch_stage0.py --checkpoint "$MM3_BENCH_CKPT" --contexts 1000 --pairs 1,8 \
    --modes graph --frames 16 --json "$out/pytorch_stage0.json" > "$out/pytorch_stage0.log" 2>&1
  echo "pytorch_stage0 rc=$?"
  timeout 100 python3 scripts/bench/pytorch_dit.py --checkpoint "$MM3_BENCH_CKPT" --windows 1,8 --precisions bf16,tf32 \
    --modes graph --reps 5 --json "$out/pytorch_dit.json" > "$out/pytorch_dit.log" 2>&1
  echo "pytorch_dit rc=$?"
fi
stamp table
python3 scripts/bench/table.py --dir "$out" --markdown "$out/table.md" > "$out/table.txt" 2>&1
cat "$out/table.txt"
