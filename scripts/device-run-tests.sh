#!/usr/bin/env bash
# Run on the device machine (the `run` tool, carry=[".device"], after
# scripts/device-pack.sh here): every packed GPU test, then the kernel benchmark.
# Logs go to $OUT (or ./device-out when OUT is unset).
#
#   scripts/device-run-tests.sh [--no-bench] [--sanitize]
#   --sanitize: also run the tests under compute-sanitizer memcheck (slow)
set -uo pipefail
cd "$(dirname "$0")/.."
pack=${MM3_DEVICE_DIR:-.device} # scripts/device-pack.sh -o
out=${OUT:-device-out}
mkdir -p "$out"
bench=1 sanitize=0
for a in "$@"; do
  case "$a" in
    --no-bench) bench=0 ;;
    --sanitize) sanitize=1 ;;
    *) echo "usage: $0 [--no-bench] [--sanitize]" >&2; exit 2 ;;
  esac
done

# The CUDA runtime and cuBLAS come from the device image.
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/lib; do
  [ -e "$d/libcublasLt.so.13" ] && cuda_dirs="$cuda_dirs:$d"
done
if [ -z "$cuda_dirs" ]; then
  f=$(find /usr /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  [ -n "$f" ] && cuda_dirs=":$(dirname "$f")"
  f=$(find /usr /opt -name 'libcudart.so.13*' 2>/dev/null | head -1)
  [ -n "$f" ] && cuda_dirs="$cuda_dirs:$(dirname "$f")"
fi
export LD_LIBRARY_PATH="$PWD/$pack/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MM3_SOURCE_DIR=$PWD MM3_BIN_DIR=$PWD/$pack/bin MM3_TEST_TMP=/tmp/mm3-test
mkdir -p "$MM3_TEST_TMP"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in $pack/bin/*; do echo "== ldd $b"; ldd "$b" | grep -E "not found|cuda|cublas"; done
} 2>&1 | tee "$out/env.txt"

status=0
for t in $pack/bin/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  echo "=== $name"
  "$t" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || status=1
done

if [ "$bench" = 1 ] && [ -x $pack/bin/mm3-bench-ops ]; then
  echo "=== mm3-bench-ops"
  $pack/bin/mm3-bench-ops 2>&1 | tee "$out/bench.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
# Last, so that a slow sanitizer run cannot cost the timings.
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for t in $pack/bin/test_*; do
    name=$(basename "$t")
    timeout 150 compute-sanitizer --tool memcheck --leak-check no --report-api-errors no "$t" > "$out/$name.memcheck.log" 2>&1
    echo "=== $name under compute-sanitizer memcheck: exit $?"
    grep -E "ERROR SUMMARY|Invalid|out of bounds" "$out/$name.memcheck.log" | head -5
  done
fi
exit $status
