#!/usr/bin/env bash
# Stage 0 on the GPU in one device call: its GPU tests and the golden replay through
# CUDA (correctness first), then mm3-bench-stage0 once per argument set on the random
# release-geometry checkpoint. Results: $OUT/results.tgz plus the tables on stdout.
#
# Here:   scripts/device-stage0.sh --pack [build-dir]   (stage 0's programs only: smaller than device-final's)
# Device: run(command='scripts/device-stage0.sh "--pairs 1,8 --contexts 1000" \
#                      "MM3_PDL=0 --pairs 1,8 --contexts 1000"', carry=[".device"])
#         Each argument: optional VAR=value words (environment), then bench arguments
#         (an A/B of measuring switches in one bench process, the checkpoint loaded once:
#         "--pairs 1,8 --env-sets MM3_PDL=0;;MM3_PDL=0;").
#         Two words are not environment: BIN=prog runs another bench binary (a path, or a
#         name under .device/bin, e.g. a copy of an earlier build for an A/B), NCU=1 runs it
#         under ncu (one kernel duration per launch, or the comma-separated metrics of
#         NCU_METRICS=a,b in the environment; $OUT/results.tgz: ncu<run>.csv; pair it
#         with --profile-frame K so only one step is recorded; scripts/bench/ncu_step.py
#         sums it per kernel). TRACE=1 runs it with tools/kernel_trace (CUPTI: every
#         kernel's start and end as it ran, graph replays included; $OUT/results.tgz:
#         trace<run>.csv; scripts/bench/kernel_trace.py makes the per-kernel table).
#         MM3_S0_TESTS=0 skips the tests ("test_a test_b": only those, then the golden
#         replay; MM3_TEST_FILTER=test_name runs one test of test_ops_cuda, test_talker_cuda and
#         test_sampler_cuda); MM3_S0_OPS=1 adds mm3-bench-ops with PDL on and off, MM3_S0_OPS="A=1;B=0 C=1 --x"
#         one run per ';'-separated list of VAR=value words and mm3-bench-ops arguments.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
tests=(test_ops_cuda test_talker_cuda test_sampler_cuda test_frame_cuda test_generate_batch test_scheduler)
if [ "${1:-}" = --pack ]; then
  scripts/device-pack.sh -B "${2:-build-cuda}" mm3-stage0 mm3-mkckpt mm3-bench-stage0 mm3-bench-ops "${tests[@]}" >/dev/null || exit 1
  trace_lib=${2:-build-cuda}/lib/libmm3-kernel-trace.so # TRACE=1 below; with the CUPTI it was built against
  if cmake --build "${2:-build-cuda}" --target mm3-kernel-trace >/dev/null 2>&1 && [ -f "$trace_lib" ]; then
    cp "$trace_lib" .device/lib/ && cp -L "$(ldd "$trace_lib" | awk '/libcupti/ { print $3 }')" .device/lib/
  fi
  strip .device/bin/* 2>/dev/null
  rm -rf .device/golden && mkdir -p .device/golden && cp -r "${MM3_GOLDEN_DIR:-../shared/golden/tiny-a}" .device/golden/tiny-a
  # xz: the programs share most of their device code; gzip left 68 MB, over the 64 MiB a call carries
  rm -f .device/binlib.tgz
  XZ_OPT="-9 -T2" tar cJf .device/binlib.txz -C .device bin lib golden && rm -rf .device/bin .device/lib .device/golden
  du -sh .device
  exit 0
fi
[ -f .device/binlib.txz ] && [ ! -d .device/bin ] && tar xJf .device/binlib.txz -C .device
out=/tmp/s0; mkdir -p "$out"
finish() { tar czf "${OUT:-/tmp}/results.tgz" -C "$out" . 2>/dev/null; }
trap finish EXIT
export LD_LIBRARY_PATH="$root/.device/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MM3_GOLDEN_DIR=$root/.device/golden/tiny-a MM3_SOURCE_DIR=$root MM3_BIN_DIR=$root/.device/bin
export MM3_TEST_TMP=/tmp/mm3-test
mkdir -p "$MM3_TEST_TMP"
bin=.device/bin
ckpt=/tmp/mm3-bench-ckpt

if [ "${MM3_S0_TESTS:-1}" != 0 ]; then
  [ "${MM3_S0_TESTS:-1}" != 1 ] && read -ra tests <<< "$MM3_S0_TESTS"
  for t in "${tests[@]}"; do
    timeout 400 $bin/$t > "$out/$t.log" 2>&1; rc=$?
    echo "$t rc=$rc"; [ $rc = 0 ] || grep -E "FAIL|ERROR|error" "$out/$t.log" | head -5
  done
  timeout 60 $bin/mm3-stage0 --golden "$MM3_GOLDEN_DIR" --backend cuda > "$out/golden_s0_cuda.log" 2>&1
  echo "stage0 golden cuda rc=$?"; grep -iE "rel|pass|fail" "$out/golden_s0_cuda.log" | tail -4
  for g in test/data/golden-geometries/*/; do # the other geometries (their widths reach the tensor-core GEMVs)
    g=$(basename "$g")
    scripts/golden-geometry.sh $bin/mm3-mkckpt "test/data/golden-geometries/$g" "$MM3_TEST_TMP/geo-$g" &&
      timeout 60 $bin/mm3-stage0 --golden "$MM3_TEST_TMP/geo-$g" --backend cuda > "$out/golden_s0_cuda_$g.log" 2>&1
    echo "stage0 golden cuda $g rc=$?"; grep -iE "rel|pass|fail" "$out/golden_s0_cuda_$g.log" | tail -2
  done
fi
if [ "${MM3_S0_OPS:-0}" != 0 ]; then # the kernels alone (mm3-bench-ops), once per ';'-separated setting
  settings=${MM3_S0_OPS}; [ "$settings" = 1 ] && settings="MM3_PDL=1;MM3_PDL=0"
  IFS=';' read -ra runs <<< "$settings"
  for k in "${!runs[@]}"; do
    envs=(); args=()
    for w in ${runs[$k]}; do if [[ $w == *=* && $w != -* ]]; then envs+=("$w"); else args+=("$w"); fi; done
    env "${envs[@]}" $bin/mm3-bench-ops "${args[@]}" > "$out/ops$k.log" 2>&1; echo "ops (${runs[$k]}) rc=$?"
  done
fi
[ $# -gt 0 ] || exit 0 # tests only: no checkpoint needed
[ -d "$ckpt" ] || $bin/mm3-mkckpt --preset full --out "$ckpt" --seed 1 > "$out/mkckpt.log" 2>&1 || { echo "mkckpt failed"; exit 1; }
i=0
for set in "$@"; do
  i=$((i + 1))
  envs=(); args=(); prog=$bin/mm3-bench-stage0; wrap=()
  for w in $set; do
    if [[ $w == *=* && $w != -* && ${#args[@]} == 0 ]]; then
      case $w in
        BIN=*) prog=${w#BIN=}; [[ $prog == */* ]] || prog=$bin/$prog ;;
        TRACE=1) wrap=(env MM3_KERNEL_TRACE="$out/trace$i.csv" LD_PRELOAD="$root/.device/lib/libmm3-kernel-trace.so") ;;
        NCU=1) wrap=(ncu --profile-from-start off --metrics "${NCU_METRICS:-gpu__time_duration.sum}" --cache-control none
                     --clock-control none --csv --log-file "$out/ncu$i.csv") ;;
        *) envs+=("$w") ;;
      esac
    else args+=("$w"); fi
  done
  echo "== run $i: ${envs[*]} ${prog##*/} ${wrap[*]:0:1} ${args[*]}"
  env "${envs[@]}" "${wrap[@]}" $prog --ckpt "$ckpt" --backend cuda "${args[@]}" > "$out/bench$i.log" 2>&1
  echo "rc=$?"; grep -v "^S0BENCH" "$out/bench$i.log" | tail -30
done
