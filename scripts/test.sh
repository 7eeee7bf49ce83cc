#!/usr/bin/env bash
# Install dependencies, build, and run the whole test suite: a normal build, an
# ASan+UBSan build of the CPU suite, a TSan build of the connector tests, and
# every fuzz target for MM3_FUZZ_SECONDS (default 60) each. Every build treats
# warnings as errors (-DMM3_WERROR=ON).
# Usage: scripts/test.sh [--no-install] [--quick]   (--quick: normal build only)
set -euo pipefail
cd "$(dirname "$0")/.."
install=1 quick=0
for a in "$@"; do
  case "$a" in
    --no-install) install=0 ;;
    --quick) quick=1 ;;
    *) echo "usage: scripts/test.sh [--no-install] [--quick]" >&2; exit 2 ;;
  esac
done
[ "$install" = 1 ] && scripts/install-deps.sh
jobs=$(nproc)
cuda_flag=()
# CI has no GPU but may have the toolkit: compile-check the CUDA code, GPU tests skip (77).
[ -x /usr/local/cuda/bin/nvcc ] && export CUDACXX=/usr/local/cuda/bin/nvcc

run_suite() { # dir cmake-args... -- ctest-args...
  local dir=$1; shift
  local cm=() ct=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do cm+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  ct=("$@")
  echo "=== $dir: cmake ${cm[*]}"
  cmake -S . -B "$dir" -G Ninja -DMM3_WERROR=ON "${cm[@]}" >/dev/null
  cmake --build "$dir" -j "$jobs"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" "${ct[@]}")
}

run_suite build ${cuda_flag[@]+"${cuda_flag[@]}"} --
if [ "$quick" = 0 ]; then
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  run_suite build-asan -DMM3_CUDA=OFF -DMM3_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug --
  export TSAN_OPTIONS=halt_on_error=1
  run_suite build-tsan -DMM3_CUDA=OFF -DMM3_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug -- -R 'shmconn'
  # Every libFuzzer target for a bounded time from its committed corpus (docs/testing.md).
  MM3_WERROR=ON scripts/fuzz.sh "${MM3_FUZZ_SECONDS:-60}"
fi
echo "=== all test suites passed"
