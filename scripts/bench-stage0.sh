#!/usr/bin/env bash
# Stage 0 through the server's scheduler on the release geometry (random weights), on the GPU
# machine: ms per frame for 1..8 CFG pairs at contexts 1000 and 5000 against the memory floor,
# time to first frame, peak GPU memory (tools/mm3_bench_stage0.c says what each figure is).
#
#   scripts/bench-stage0.sh [--out DIR] [--ckpt DIR] [--bin DIR] [--deadline S] [--stage0-only]
#                           [-- mm3-bench-stage0 options]
#
#   --out DIR      log and results (default $OUT, else results/<UTC date>): stage0.log, mkckpt.log,
#                  stage0.json (parsed by scripts/bench/parse_tools.py when python3 is there)
#   --ckpt DIR     an existing checkpoint (the real release included); default: the random full one
#                  at $MM3_BENCH_CKPT (default /tmp/mm3-bench-ckpt), written by mm3-mkckpt if missing
#   --stage0-only  when the checkpoint must be written: release geometry for everything stage 0
#                  reads, the DiT cut to 1 layer (~19 GB instead of ~27 GB), in
#                  $MM3_BENCH_CKPT-stage0; never used as the full checkpoint
#   --deadline S   the whole script should end within S seconds: the benchmark gets what the
#                  checkpoint writing left (its --time-limit), minus a margin for its start-up
#   --bin DIR      the programs (default: the first of .device-s0bench/bin .device/bin
#                  build-cuda/bin build/bin holding mm3-bench-stage0)
# The device recipe (here, then the run tool with carry [".device-s0bench"]):
#   scripts/device-pack.sh -B build-s0bench-cuda -o .device-s0bench mm3-bench-stage0 mm3-mkckpt
#   scripts/bench-stage0.sh --stage0-only --deadline 165 -- --frames 16 --warmup 2
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

out="" ckpt="" bin="" deadline=0 s0only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:?--out needs a value}; shift ;;
    --ckpt) ckpt=${2:?--ckpt needs a value}; shift ;;
    --bin) bin=${2:?--bin needs a value}; shift ;;
    --deadline) deadline=${2:?--deadline needs a value}; shift ;;
    --stage0-only) s0only=1 ;;
    --) shift; break ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "bench-stage0.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
t_start=$SECONDS
out=${out:-${OUT:-results/$(date -u +%Y-%m-%d)}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
log() { echo "bench-stage0.sh: $*" >&2; }

if [ -z "$bin" ]; then
  for d in .device-s0bench/bin .device/bin build-cuda/bin build/bin; do
    [ -x "$d/mm3-bench-stage0" ] && { bin=$d; break; }
  done
fi
if [ -z "$bin" ] || [ ! -x "$bin/mm3-bench-stage0" ]; then
  log "mm3-bench-stage0 not found (pack it: scripts/device-pack.sh -o .device-s0bench mm3-bench-stage0 mm3-mkckpt)"
  exit 1
fi
# The pack's own libraries, then the CUDA runtime and cuBLAS of the device image.
libs="$(cd "$bin/.." && pwd)/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do [ -d "$d" ] && libs="$libs:$d"; done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [ -z "$ckpt" ]; then
  ckpt=${MM3_BENCH_CKPT:-/tmp/mm3-bench-ckpt}
  # A full checkpoint left by scripts/bench.sh (or an earlier run) serves as it is.
  if [ ! -f "$ckpt/modular_model_index.json" ] && [ "$s0only" = 1 ]; then ckpt=$ckpt-stage0; fi
  if [ ! -f "$ckpt/modular_model_index.json" ]; then
    if [ ! -x "$bin/mm3-mkckpt" ]; then log "no checkpoint at $ckpt and no mm3-mkckpt in $bin"; exit 1; fi
    set_args=()
    [ "$s0only" = 1 ] && set_args=(--set dit_layers=1)
    log "writing a random checkpoint to $ckpt ${set_args[*]}"
    t0=$SECONDS
    if ! "$bin/mm3-mkckpt" --preset full --out "$ckpt" --seed 1 "${set_args[@]}" > "$out/mkckpt.log" 2>&1; then
      log "mm3-mkckpt failed (see mkckpt.log)"; rm -rf "$ckpt"; exit 1
    fi
    echo "mkckpt wall $((SECONDS - t0)) s, $(du -sh "$ckpt" | cut -f1)" | tee -a "$out/mkckpt.log" >&2
  fi
fi

limit=()
if [ "$deadline" -gt 0 ]; then
  left=$((deadline - (SECONDS - t_start) - 10)) # 10 s: printing and freeing after the limit
  [ "$left" -lt 1 ] && left=1
  limit=(--time-limit "$left")
fi
log "mm3-bench-stage0 --ckpt $ckpt ${limit[*]} $*"
t0=$SECONDS
"$bin/mm3-bench-stage0" --ckpt "$ckpt" "${limit[@]}" "$@" 2>&1 | tee "$out/stage0.log"
rc=${PIPESTATUS[0]}
echo "mm3-bench-stage0 exit $rc, wall $((SECONDS - t0)) s" | tee -a "$out/stage0.log" >&2
if command -v python3 > /dev/null; then
  python3 scripts/bench/parse_tools.py stage0 "$out/stage0.log" --rc "$rc" --json "$out/stage0.json" >&2
fi
exit "$rc"
