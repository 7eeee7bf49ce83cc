#!/usr/bin/env bash
# Build the stage-1 CUDA test and benchmark here and pack them, with the shared
# libraries the device machine lacks and the tiny-a DiT golden files, into
# .device/dit/ (git-ignored; apart from scripts/device-pack.sh's .device/bin and
# .device/lib, so the two packs do not clobber each other). Then:
#   run(command="scripts/bench-stage1.sh --tests", carry=[".device/dit"])
#
#   scripts/device-pack-stage1.sh [-B build-dir]     (default build-cuda-stage1)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-cuda-stage1
if [ "${1:-}" = -B ]; then build=$2; shift 2; fi
targets=(test_dit_cuda mm3-bench-dit)

if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DMM3_CUDA=ON >/dev/null
fi
cmake --build "$build" --target "${targets[@]}"

dst=.device/dit
rm -rf "$dst"
mkdir -p "$dst/bin" "$dst/lib"
# On any glibc system, or provided by the device's CUDA install and driver.
system_re='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart\.|libcublas\.|libcublasLt\.|libnvidia)'
for t in "${targets[@]}"; do
  cp "$build/bin/$t" "$dst/bin/"
  ldd "$build/bin/$t" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    [[ "$name" =~ $system_re ]] || cp -L "$path" "$dst/lib/$name"
  done
done
# The golden files the DiT test reads (../shared does not travel).
golden=${MM3_GOLDEN_DIR:-../shared/golden/tiny-a}
if [ -d "$golden/checkpoint/transformer" ]; then
  mkdir -p "$dst/golden/checkpoint"
  cp -r "$golden/checkpoint/transformer" "$dst/golden/checkpoint/"
  cp "$golden/checkpoint/modular_model_index.json" "$dst/golden/checkpoint/"
  cp "$golden/case0.safetensors" "$dst/golden/"
fi
echo "device-pack-stage1: $(du -sh "$dst" | cut -f1) in $dst"
