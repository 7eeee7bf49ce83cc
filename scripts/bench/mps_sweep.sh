#!/usr/bin/env bash
# Both stages on one GPU: the end-to-end figures of several arrangements, one table.
# Run on the GPU machine from the packed tree (as scripts/device-final.sh, programs in .device/bin):
#
#   scripts/bench/mps_sweep.sh [--arrangements LIST] [--config YAML] [--ckpt DIR] [--bin DIR] [--out DIR]
#                              [--duration S] [--concurrency N] [--each-s S] [--dry-run]
#
# An arrangement is a name:
#   off            no MPS (the stages time-slice the GPU)
#   mps            MPS, no thread limit
#   mps-s1-P       MPS, stage 1 at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE P (stage 0 unlimited)
#   mps-s0-Q-s1-P  both limited
#   NAME+prio      the same with stage 0's streams at the greatest priority and stage 1's at the least
# (the deploy keys mps_thread_percentage and stream_priority, written into a copy of --config;
# MPS itself is forced with MM3_MPS=1 / 0, so an MPS that cannot start fails the arrangement
# instead of silently measuring no MPS). Default LIST: off,mps,mps-s1-55,mps-s1-70: with the release
# checkpoint each takes ~75-90 s (start-up, a warm-up song, one song, 8 at once) and --each-s (100)
# bounds it, so the default fits one 9-minute device call with the checkpoint written first; run
# e.g. mps-s1-40,mps-s1-100,mps+prio,mps-s1-55+prio in a second call.
#
# Per arrangement: scripts/launch.sh --model CKPT, then scripts/bench/e2e.py --allow-stall (every
# stream starts at once: the sweep measures how the stages share the GPU, not admission) --duration S (30)
# --concurrency N (8): one song alone (wall and first audio), then N at once (audio s per s).
# Prints one row per arrangement as it finishes and the whole table at the end (markdown);
# logs and JSON in --out (default $OUT, else /tmp/mps-sweep). CKPT: --ckpt, else $MM3_BENCH_CKPT
# (default /tmp/mm3-bench-ckpt), written by mm3-mkckpt --preset full when absent.
# --dry-run: configs/tiny-cpu.yaml on a tiny checkpoint through the CPU pipeline (2 s songs,
# 2 at once): proves the harness, measures nothing.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD

arrangements="off,mps,mps-s1-55,mps-s1-70"
config="" ckpt="" bin="" out="" duration=30 conc=8 each_s=100 dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --arrangements) arrangements=${2:?--arrangements needs a value}; shift ;;
    --config) config=${2:?--config needs a value}; shift ;;
    --ckpt) ckpt=${2:?--ckpt needs a value}; shift ;;
    --bin) bin=${2:?--bin needs a value}; shift ;;
    --out) out=${2:?--out needs a value}; shift ;;
    --duration) duration=${2:?--duration needs a value}; shift ;;
    --concurrency) conc=${2:?--concurrency needs a value}; shift ;;
    --each-s) each_s=${2:?--each-s needs a value}; shift ;;
    --dry-run) dry=1 ;;
    -h|--help) sed -n 2,27p "$0"; exit 0 ;;
    *) echo "mps_sweep.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
log() { echo "mps_sweep: $*" >&2; }
py=${PYTHON:-python3}
out=${out:-${OUT:-/tmp/mps-sweep}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
if [ -z "$bin" ]; then
  [ -f .device/binlib.txz ] && [ ! -d .device/bin ] && tar xJf .device/binlib.txz -C .device
  for d in .device/bin build-cuda/bin build/bin; do [ -x "$d/mm3-stage0" ] && { bin=$d; break; }; done
fi
[ -n "$bin" ] && [ -x "$bin/mm3-stage0" ] && [ -x "$bin/mm3-stage1" ] || { log "no mm3-stage0/1 (--bin)"; exit 2; }
bin=$(cd "$bin" && pwd)
export LD_LIBRARY_PATH="$root/.device/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "$dry" = 1 ]; then
  config=${config:-configs/tiny-cpu.yaml} ckpt=${ckpt:-${TMPDIR:-/tmp}/mm3-sweep-tiny-ckpt} preset=tiny
  duration=2 conc=2
else
  config=${config:-configs/minimax_music3.yaml} ckpt=${ckpt:-${MM3_BENCH_CKPT:-/tmp/mm3-bench-ckpt}} preset=full
fi
if [ ! -f "$ckpt/modular_model_index.json" ]; then
  log "writing a random $preset checkpoint to $ckpt"
  "$bin/mm3-mkckpt" --preset $preset --out "$ckpt" --seed 1 > "$out/mkckpt.log" 2>&1 ||
    { log "mm3-mkckpt failed (see $out/mkckpt.log)"; exit 1; }
fi

# deploy_for NAME FILE: --config with the arrangement's stage keys; sets mps_env (MM3_MPS value).
deploy_for() {
  local name=$1 base=${1%+prio} prio=0 s0="" s1="" rest
  [ "$name" != "$base" ] && prio=1
  case "$base" in
    off) mps_env=0 ;;
    mps) mps_env=1 ;;
    mps-*)
      mps_env=1 rest=${base#mps}
      while [ -n "$rest" ]; do
        case "$rest" in
          -s0-*) rest=${rest#-s0-}; s0=${rest%%-*}; rest=${rest#"$s0"} ;;
          -s1-*) rest=${rest#-s1-}; s1=${rest%%-*}; rest=${rest#"$s1"} ;;
          *) log "arrangement '$name': expected off, mps, mps-s1-P, mps-s0-Q-s1-P, each with an optional +prio"; return 1 ;;
        esac
      done ;;
    *) log "arrangement '$name': expected off, mps, mps-s1-P, mps-s0-Q-s1-P, each with an optional +prio"; return 1 ;;
  esac
  local k0="" k1=""
  [ -n "$s0" ] && k0="    mps_thread_percentage: $s0\n"
  [ -n "$s1" ] && k1="    mps_thread_percentage: $s1\n"
  [ "$prio" = 1 ] && k0="$k0    stream_priority: high\n" && k1="$k1    stream_priority: low\n"
  # The keys go right under each stage's "- stage_id: N" line; the file's own copies go.
  local ins=()
  [ -n "$k0" ] && ins+=(-e "s/^(  - stage_id: 0)\$/\\1\n${k0%\\n}/")
  [ -n "$k1" ] && ins+=(-e "s/^(  - stage_id: 1)\$/\\1\n${k1%\\n}/")
  sed -E -e '/^[[:space:]]+(mps_thread_percentage|stream_priority):/d' -e '/^mps:/d' "${ins[@]}" "$config" > "$2"
  grep -q "^  - stage_id: 0" "$2" && grep -q "^  - stage_id: 1" "$2" ||
    { log "$config: expected '  - stage_id: 0' and '  - stage_id: 1' lines"; return 1; }
}

rows=()
header="| arrangement | one ${duration} s song s | first audio s | ${conc} songs: audio s/s | note |"
echo "$header"
echo "|---|---|---|---|---|"
IFS=, read -r -a list <<< "$arrangements"
for name in "${list[@]}"; do
  t0=$SECONDS
  d="$out/$name"
  rm -rf "$d" && mkdir -p "$d"
  if ! deploy_for "$name" "$d/deploy.yaml"; then
    rows+=("| $name | - | - | - | bad name |"); echo "${rows[-1]}"; continue
  fi
  port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  MM3_MPS=$mps_env MM3_SHM_PREFIX="mm3-sweep-$$-" MM3_BIN_DIR=$bin \
    scripts/launch.sh "$d/deploy.yaml" --model "$ckpt" --port "$port" > "$d/launch.log" 2>&1 &
  launcher=$!
  note=""
  while :; do
    grep -q "^READY http" "$d/launch.log" 2>/dev/null && break
    kill -0 $launcher 2>/dev/null || { note="did not start: $(grep '^launch:' "$d/launch.log" | tail -1 | cut -c9-110)"; break; }
    [ $((SECONDS - t0)) -ge "$each_s" ] && { note="not ready within ${each_s} s"; break; }
    sleep 0.5
  done
  if [ -z "$note" ]; then
    left=$((each_s - (SECONDS - t0)))
    [ "$left" -lt 10 ] && left=10
    timeout "$left" "$py" scripts/bench/e2e.py --url "http://127.0.0.1:$port" --duration "$duration" \
      --concurrency "$conc" --allow-stall --json "$d/e2e.json" > "$d/e2e.log" 2>&1 || note="e2e.py: $(tail -1 "$d/e2e.log" | cut -c1-80)"
  fi
  kill -TERM $launcher 2>/dev/null
  wait $launcher 2>/dev/null
  grep -q "MPS daemon started" "$d/launch.log" && [ "$mps_env" = 0 ] && note="$note MPS up?!"
  row=$("$py" - "$d/e2e.json" "$name" "$note ($((SECONDS - t0)) s)" <<'PY'
import json, sys
path, name, note = sys.argv[1:4]
try:
    doc = json.load(open(path))
except (OSError, ValueError):
    doc = {}
f = lambda v: "-" if v is None else f"{v:.2f}"
s = doc.get("single") or {}
c = doc.get("concurrent") or {}
print(f"| {name} | {f(s.get('wall_s') if s.get('ok') else None)} | {f(s.get('ttfa_s') if s.get('ok') else None)} "
      f"| {f(c.get('audio_s_per_s') if c.get('ok') else None)} | {note.strip()} |")
PY
)
  rows+=("$row")
  echo "$row"
done
{
  echo
  echo "## One GPU, both stages: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" \
       "$config, checkpoint $ckpt"
  echo
  echo "$header"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/table.md"
