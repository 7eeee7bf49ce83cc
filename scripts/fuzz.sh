#!/usr/bin/env bash
# Build the libFuzzer targets (clang, -DMM3_FUZZ=ON, ASan+UBSan) in build-fuzz and
# run each for SECONDS_PER_TARGET seconds (default 60) from a copy of its seed
# corpus, so the committed corpus stays as it is. Exits 1 on the first target that
# finds a crash, leak, timeout or sanitizer report, printing the reproducer;
# docs/testing.md says how to turn it into a regression test.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   (targets: all by default)
#   FUZZ_JOBS=N        run N targets at once (default: half the cores, at least 1)
#   FUZZ_CORPUS_DIR=D  keep each target's working corpus in D/<target> across runs
#                      (seeded from the committed one) instead of a temporary copy
#   MM3_WERROR=ON      build with warnings as errors (scripts/test.sh sets it)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
secs=${1:-60}
shift || true
case "$secs" in ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2 ;; esac

if ! command -v clang >/dev/null; then
  echo "fuzz.sh: clang not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
build=build-fuzz
echo "=== $build: cmake -DMM3_FUZZ=ON (clang, ASan+UBSan, libFuzzer)"
CC=clang cmake -S . -B "$build" -G Ninja -DMM3_FUZZ=ON -DMM3_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMM3_WERROR="${MM3_WERROR:-OFF}" -DCMAKE_PROJECT_INCLUDE="$root/cmake/fuzz.cmake" >/dev/null
cmake --build "$build" -j "$(nproc)" --target mm3_fuzzers

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in test/fuzz/fuzz_*.c; do
    t=$(basename "$f" .c); t=${t#fuzz_}
    [ "$t" = support ] || targets+=("$t")
  done
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/mm3-fuzz.XXXXXX")
mkdir -p "$build/fuzz-findings"
jobs=${FUZZ_JOBS:-$(( $(nproc) / 2 ))}
[ "$jobs" -ge 1 ] || jobs=1
export MM3_SOURCE_DIR="$root" MM3_TEST_TMP="$work"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

run_one() { # target -> 0 clean, 1 finding
  local t=$1 corpus="$work/corpus-$t" art="$root/$build/fuzz-findings/$t-"
  [ -n "${FUZZ_CORPUS_DIR:-}" ] && corpus="$FUZZ_CORPUS_DIR/$t"
  mkdir -p "$corpus"
  cp test/fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  find test/fuzz/regressions/"$t" -maxdepth 1 -type f ! -name '.*' -exec cp {} "$corpus"/ \; 2>/dev/null || true
  local dict=()
  [ -f "test/fuzz/$t.dict" ] && dict=(-dict="test/fuzz/$t.dict")
  if "$build/bin/fuzz-$t" "$corpus" ${dict[@]+"${dict[@]}"} -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 \
       -artifact_prefix="$art" -print_final_stats=1 >"$work/$t.log" 2>&1; then
    echo "fuzz-$t: clean ($(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | grep -o '[0-9]*$') runs," \
         "$(ls "$corpus" | wc -l) corpus inputs)"
    return 0
  fi
  echo "fuzz-$t: FINDING; log tail:"
  tail -n 60 "$work/$t.log"
  for f in "$art"*; do [ -e "$f" ] && echo "fuzz-$t: reproducer: $f"; done
  echo "fuzz-$t: replay with: $build/bin/fuzz-$t <reproducer>"
  return 1
}

rc=0
pids=()
names=()
for t in "${targets[@]}"; do
  if [ ! -x "$build/bin/fuzz-$t" ]; then echo "fuzz.sh: no target fuzz-$t" >&2; rc=1; continue; fi
  run_one "$t" & pids+=($!); names+=("$t")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || rc=1
    pids=("${pids[@]:1}"); names=("${names[@]:1}")
  fi
done
for p in ${pids[@]+"${pids[@]}"}; do wait "$p" || rc=1; done
rm -rf "$work"
if [ "$rc" = 0 ]; then echo "=== fuzzing: no findings (${#targets[@]} targets x ${secs} s)"; else echo "=== fuzzing: FINDINGS (see above)"; fi
exit "$rc"
