#!/usr/bin/env bash
# Build CUDA programs here and pack them, with the shared libraries the device
# machine lacks, into .device/ (git-ignored) for the `run` tool's `carry`.
#
#   scripts/device-pack.sh [-B build-dir] [-o pack-dir] [target...]
#   default pack dir: .device (helpers working side by side use .device-<name>)
#   default build dir: build-cuda (configured with -DMM3_CUDA=ON if missing)
#   default targets:   test_ops_cuda mm3-bench-ops
#
# Result: .device/bin/<programs>, .device/lib/<non-system .so files>. Then:
#   run(command="scripts/device-run-tests.sh", carry=[".device"])
# The device image has the CUDA 13 runtime and cuBLAS (too big to carry) and a
# glibc at least as new as ours; everything else a program links (jansson, yaml,
# uring, zstd, b2, pcre2, utf8proc, microhttpd, FLAC, cmocka ...) travels.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-cuda pack=.device
while [ $# -gt 0 ]; do
  case "$1" in
    -B) build=$2; shift 2 ;;
    -o) pack=$2; shift 2 ;;
    *) break ;;
  esac
done
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(test_ops_cuda mm3-bench-ops)

if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DMM3_CUDA=ON >/dev/null
fi
cmake --build "$build" --target "${targets[@]}"

rm -rf "$pack"/bin "$pack"/lib
mkdir -p "$pack"/bin "$pack"/lib
# Present on any glibc system or provided by the device's CUDA install / driver.
system_re='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart\.|libcublas\.|libcublasLt\.|libnvidia)'
for t in "${targets[@]}"; do
  bin="$build/bin/$t"
  [ -x "$bin" ] || { echo "device-pack: $bin not built" >&2; exit 1; }
  cp "$bin" "$pack"/bin/
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    if ! [[ "$name" =~ $system_re ]]; then
      cp -L "$path" "$pack/lib/$name"
    fi
  done
done
echo "device-pack: $(ls "$pack"/bin | wc -l) programs, $(ls "$pack"/lib | wc -l) libraries," \
     "$(du -sh "$pack" | cut -f1) in $pack/"
ls "$pack"/bin "$pack"/lib
