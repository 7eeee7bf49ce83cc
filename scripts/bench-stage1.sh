#!/usr/bin/env bash
# Stage-1 DiT benchmark (and, with --tests, the CUDA DiT test first) on the device
# machine, from the pack of scripts/device-pack-stage1.sh:
#   here:   scripts/device-pack-stage1.sh
#   device: run(command="scripts/bench-stage1.sh [--tests] [--memcheck] [-- bench args]", carry=[".device/dit"])
# --memcheck: last, the quick test under compute-sanitizer memcheck (60 s cap).
# Bench arguments go to mm3-bench-dit (default: release geometry, 1/2/4/8 windows,
# fp32/tf32/bf16). Logs go to $OUT (or ./device-out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-out}
mkdir -p "$out"
pack=.device/dit
tests=0 memcheck=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests=1; shift ;;
    --memcheck) memcheck=1; shift ;;
    --) shift; break ;;
    *) echo "usage: $0 [--tests] [--memcheck] [-- mm3-bench-dit args]" >&2; exit 2 ;;
  esac
done

# The CUDA runtime and cuBLAS come from the device image.
cuda_dirs=""
for lib in libcublasLt.so.13 libcudart.so.13; do
  f=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/local/lib /usr/lib /opt -name "$lib*" 2>/dev/null | head -1)
  [ -n "$f" ] && cuda_dirs="$cuda_dirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$PWD/$pack/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MM3_SOURCE_DIR=$PWD MM3_BIN_DIR=$PWD/$pack/bin MM3_TEST_TMP=/tmp/mm3-test
[ -d "$pack/golden" ] && export MM3_GOLDEN_DIR=$PWD/$pack/golden
mkdir -p "$MM3_TEST_TMP"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$out/env.txt"

status=0
if [ "$tests" = 1 ]; then
  echo "=== test_dit_cuda"
  "$pack/bin/test_dit_cuda" 2>&1 | tee "$out/test_dit_cuda.log"
  rc=${PIPESTATUS[0]}
  echo "=== test_dit_cuda: exit $rc"
  [ "$rc" = 0 ] || status=1
fi
echo "=== mm3-bench-dit $*"
"$pack/bin/mm3-bench-dit" "$@" 2>&1 | tee "$out/bench-dit.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
if [ "$memcheck" = 1 ] && command -v compute-sanitizer >/dev/null; then
  MM3_TEST_DIT_QUICK=1 timeout 60 compute-sanitizer --tool memcheck --leak-check no "$pack/bin/test_dit_cuda" \
    > "$out/memcheck.log" 2>&1
  echo "=== test_dit_cuda under compute-sanitizer memcheck: exit $?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds|PASSED|FAILED" "$out/memcheck.log" | head -8
fi
exit $status
