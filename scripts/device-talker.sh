#!/usr/bin/env bash
# The GPU talker's tests on the device machine, packed apart from the other
# helpers' .device/ folders.
#
#   scripts/device-talker.sh pack [-B build-dir]   here: build test_talker_cuda with CUDA,
#                                                  pack it, its libraries and tiny-a into .device/talker
#   scripts/device-talker.sh run [--sanitize]      there (run tool, carry [".device/talker"]):
#                                                  the test, then optionally under compute-sanitizer
# Logs go to $OUT (or ./device-out).
set -uo pipefail
cd "$(dirname "$0")/.."
dest=.device/talker
mode=${1:-}
shift || true

if [ "$mode" = pack ]; then
  set -e
  build=build-cuda
  if [ "${1:-}" = -B ]; then build=$2; shift 2; fi
  [ -f "$build/build.ninja" ] || cmake -S . -B "$build" -G Ninja -DMM3_CUDA=ON >/dev/null
  cmake --build "$build" --target test_talker_cuda
  golden=${MM3_GOLDEN_DIR:-$(cd .. && pwd)/shared/golden/tiny-a}
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/lib" "$dest/golden"
  cp "$build/bin/test_talker_cuda" "$dest/bin/"
  # Same rule as scripts/device-pack.sh: the device image has glibc, the CUDA runtime and cuBLAS.
  system_re='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart\.|libcublas\.|libcublasLt\.|libnvidia)'
  ldd "$dest/bin/test_talker_cuda" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    if ! [[ "$name" =~ $system_re ]]; then cp -L "$path" "$dest/lib/$name"; fi
  done
  cp -r "$golden" "$dest/golden/tiny-a"
  echo "device-talker: $(du -sh "$dest" | cut -f1) in $dest"
  exit 0
fi

[ "$mode" = run ] || { echo "usage: $0 pack [-B build] | run [--sanitize]" >&2; exit 2; }
sanitize=0
[ "${1:-}" = --sanitize ] && sanitize=1
out=${OUT:-device-out}
mkdir -p "$out"
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
export LD_LIBRARY_PATH="$PWD/$dest/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MM3_SOURCE_DIR=$PWD MM3_BIN_DIR=$PWD/$dest/bin MM3_TEST_TMP=/tmp/mm3-test
export MM3_GOLDEN_DIR=$PWD/$dest/golden/tiny-a
mkdir -p "$MM3_TEST_TMP"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/env.txt"
ldd "$dest/bin/test_talker_cuda" | grep -E "not found|cuda|cublas" | tee -a "$out/env.txt"

SECONDS=0
"$dest/bin/test_talker_cuda" 2>&1 | tee "$out/test_talker_cuda.log"
rc=${PIPESTATUS[0]}
echo "=== test_talker_cuda: exit $rc (${SECONDS} s)"
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  # Tiny shapes only (the release-shaped CPU references are slow), time-boxed.
  MM3_TALKER_TINY_ONLY=1 timeout "${MM3_SANITIZE_TIMEOUT:-90}" compute-sanitizer --tool memcheck --leak-check no --report-api-errors no \
    "$dest/bin/test_talker_cuda" > "$out/test_talker_cuda.memcheck.log" 2>&1
  echo "=== test_talker_cuda under compute-sanitizer memcheck: exit $?"
  grep -E "ERROR SUMMARY|Invalid|out of bounds|PASSED|FAILED|OK \]" "$out/test_talker_cuda.memcheck.log" | head -20
fi
exit "$rc"
