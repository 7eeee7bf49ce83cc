#!/usr/bin/env bash
# Where mm3 stands: every benchmark, side by side with the PyTorch baselines, in ONE table.
# Run on the GPU machine from the packed tree (scripts/device-pack.sh, then carry .device):
#
#   scripts/bench.sh [--out DIR] [--ckpt DIR] [--only PHASES] [--e2e] [--config YAML] [--bin DIR]
#   scripts/bench.sh --dry-run      tiny shapes on the CPU: checks the harness, measures nothing
#
# Phases (--only load,ops,stage0,dit,pytorch,e2e; the table is always made from what DIR holds, so a
# run can be split over several calls with the same --out):
#   load     mm3-mkckpt --preset full (random weights, release geometry) unless --ckpt, then
#            mm3-bench-load --cold: load GB/s against the disk's sequential read
#   ops      mm3-bench-ops: copy bandwidth, stage-0 kernels, the weight-streaming floor
#   stage0   mm3-bench-stage0: stage 0 through the server's scheduler (ms/frame at 1..8 pairs,
#            contexts 1000 and 5000, floor, time to first frame, peak memory); extra options from
#            $MM3_BENCH_STAGE0_ARGS (e.g. "--contexts 1000 --time-limit 400"); dry run: CPU, tiny
#   dit      mm3-bench-dit when it is built (stage-1 DiT forward)
#   pytorch  scripts/bench/pytorch_stage0.py and pytorch_dit.py (+ the golden check of the
#            DiT baseline when golden data is present)
#   e2e      scripts/launch.sh + scripts/bench/e2e.py (one 30 s song, 8 at once; --e2e-duration S,
#            --e2e-concurrency N; --e2e-allow-stall: streams start past the real-time capacity;
#            --e2e-orders deadline,fifo: one launch per stages[1].window_order, e2e-<order>.json
#            each, their figures side by side in e2e-orders.md, the first one as e2e.json; an
#            order written ORDER+stall sends allow_stall in that launch only, e.g.
#            fifo+stall,deadline: every stream at once against admission); in a
#            --dry-run only with --e2e (configs/tiny-cpu.yaml)
# Results: DIR/*.log, DIR/*.json, DIR/bench.json (everything merged), DIR/table.txt, DIR/table.md.
# DIR defaults to $OUT when set (the device tool brings $OUT back), else results/<UTC date>.
# Environment: PYTHON (default python3, needs torch + transformers), MM3_BENCH_CKPT (where the
# random full checkpoint is written, default /tmp/mm3-bench-ckpt), MM3_GOLDEN_DIR,
# MM3_BENCH_STAGE0_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD

dry=0 out="" ckpt="" only="load,ops,stage0,dit,pytorch,e2e" e2e=0 config="" bin="" e2e_duration=30 e2e_conc=8
e2e_orders="" e2e_stall=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --out) out=${2:?--out needs a value}; shift ;;
    --ckpt) ckpt=${2:?--ckpt needs a value}; shift ;;
    --only) only=${2:?--only needs a value}; shift ;;
    --e2e) e2e=1 ;;
    --config) config=${2:?--config needs a value}; shift ;;
    --e2e-duration) e2e_duration=${2:?--e2e-duration needs a value}; shift ;;
    --e2e-concurrency) e2e_conc=${2:?--e2e-concurrency needs a value}; shift ;;
    --e2e-orders) e2e_orders=${2:?--e2e-orders needs a value}; shift ;;
    --e2e-allow-stall) e2e_stall=--allow-stall ;;
    --bin) bin=${2:?--bin needs a value}; shift ;;
    -h|--help) sed -n 2,28p "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-python3}
out=${out:-${OUT:-results/$(date -u +%Y-%m-%d)}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
phase() { [[ ",$only," == *",$1,"* ]]; }

# The programs: packed for the device, else a local build.
if [ -z "$bin" ]; then
  for d in .device/bin build-cuda/bin build/bin; do
    if [ -x "$d/mm3-bench-ops" ] || [ -x "$d/mm3-bench-load" ]; then bin=$d; break; fi
  done
fi
bin=${bin:-.device/bin}
# The CUDA runtime and cuBLAS come from the device image (as scripts/device-run-tests.sh).
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/lib; do
  [ -e "$d/libcublasLt.so.13" ] && cuda_dirs="$cuda_dirs:$d"
done
export LD_LIBRARY_PATH="$root/.device/lib:$root/.device/dit/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# stub NAME REASON: the JSON of a step that could not give figures.
stub() {
  "$py" -c 'import json, sys; json.dump({"tool": sys.argv[2], "ok": False, "reason": sys.argv[3]}, open(sys.argv[1], "w"))' \
    "$out/$1.json" "$1" "$2"
}
# A program from $bin, or from the stage-1 pack (scripts/device-pack-stage1.sh).
prog() { if [ -x "$bin/$1" ]; then echo "$bin/$1"; elif [ -x ".device/dit/bin/$1" ]; then echo ".device/dit/bin/$1"; fi; }
have() { [ -n "$(prog "$1")" ]; }
log() { echo "bench.sh: $*" >&2; }

device=cpu
if [ "$dry" = 0 ] && command -v nvidia-smi >/dev/null; then
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$out/gpu.txt" 2>&1
fi
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
e2e_na=""
[ "$dry" = 1 ] && [ "$e2e" = 0 ] && e2e_na="dry run: no GPU (add --e2e for the CPU pipeline)"
"$py" - "$out/meta.json" <<EOF
import json, sys
json.dump({"date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "host": "$(hostname)", "device": "$device",
           "commit": "$commit", "dry_run": bool($dry), "bin": "$bin",
           "e2e_na": "$e2e_na" or None}, open(sys.argv[1], "w"), indent=1)
EOF
log "results in $out (programs from $bin, python $py)"

# ---- checkpoint + load ----------------------------------------------------------------------
if [ -z "$ckpt" ]; then
  if [ "$dry" = 1 ]; then ckpt=${TMPDIR:-/tmp}/mm3-bench-tiny-ckpt; preset=tiny; else ckpt=${MM3_BENCH_CKPT:-/tmp/mm3-bench-ckpt}; preset=full; fi
  # Only the load, stage-0 and end-to-end phases need weights; the baselines take its configs
  # when it exists and their built-in release geometry otherwise.
  if [ ! -f "$ckpt/modular_model_index.json" ] &&
     { phase load || phase stage0 || { phase e2e && [ -z "$e2e_na" ]; }; }; then
    if have mm3-mkckpt; then
      log "writing a random $preset checkpoint to $ckpt"
      t0=$SECONDS
      "$(prog mm3-mkckpt)" --preset $preset --out "$ckpt" --seed 1 > "$out/mkckpt.log" 2>&1 ||
        { log "mm3-mkckpt failed (see mkckpt.log)"; rm -rf "$ckpt"; }
      echo "mkckpt wall $((SECONDS - t0)) s" >> "$out/mkckpt.log"
    else
      log "mm3-mkckpt not built: no checkpoint"
    fi
  fi
fi
if phase load; then
  if ! have mm3-bench-load; then
    stub load "mm3-bench-load not built"
  elif [ ! -f "$ckpt/modular_model_index.json" ]; then
    stub load "no checkpoint (mm3-mkckpt failed or not built)"
  else
    cold=--cold; [ "$dry" = 1 ] && cold=""
    log "mm3-bench-load $cold"
    timeout 900 "$(prog mm3-bench-load)" --ckpt "$ckpt" $cold > "$out/load.log" 2>&1
    "$py" scripts/bench/parse_tools.py load "$out/load.log" --rc $? --json "$out/load.json" >&2
  fi
fi

# ---- stage-0 kernels -----------------------------------------------------------------------
if phase ops; then
  if have mm3-bench-ops; then
    log "mm3-bench-ops"
    timeout 900 "$(prog mm3-bench-ops)" > "$out/ops.log" 2>&1
    "$py" scripts/bench/parse_tools.py ops "$out/ops.log" --rc $? --json "$out/ops.json" >&2
  else
    stub ops "mm3-bench-ops not built"
  fi
fi

# ---- stage 0 through the scheduler ------------------------------------------------------------
if phase stage0; then
  if ! have mm3-bench-stage0; then
    stub stage0 "mm3-bench-stage0 not built"
  elif [ ! -f "$ckpt/modular_model_index.json" ]; then
    stub stage0 "no checkpoint (mm3-mkckpt failed or not built)"
  else
    s0b_args=()
    # The tiny model on the CPU: proves the phase and its parser, measures nothing.
    [ "$dry" = 1 ] && s0b_args=(--backend cpu --pairs "1,2" --contexts "80,160" --frames 3 --warmup 1 --ttff-tokens 80
                                --copy-mib 8)
    # shellcheck disable=SC2206 # word splitting of the extra options is wanted
    s0b_args+=(${MM3_BENCH_STAGE0_ARGS:-})
    log "mm3-bench-stage0 ${s0b_args[*]}"
    timeout 900 "$(prog mm3-bench-stage0)" --ckpt "$ckpt" "${s0b_args[@]}" > "$out/stage0.log" 2>&1
    "$py" scripts/bench/parse_tools.py stage0 "$out/stage0.log" --rc $? --json "$out/stage0.json" >&2
  fi
fi

# ---- stage-1 DiT (mm3) ---------------------------------------------------------------------
if phase dit; then
  if have mm3-bench-dit; then
    log "mm3-bench-dit"
    dit_bin=$(prog mm3-bench-dit)
    if "$dit_bin" --help 2>&1 | grep -q -- "--json"; then
      timeout 900 "$dit_bin" --json "$out/dit.json" > "$out/dit.log" 2>&1
      rc=$?
      # Its own JSON is used as it is; without one, parse the text.
      [ -s "$out/dit.json" ] || "$py" scripts/bench/parse_tools.py dit "$out/dit.log" --rc $rc --json "$out/dit.json" >&2
    else
      timeout 900 "$dit_bin" > "$out/dit.log" 2>&1
      "$py" scripts/bench/parse_tools.py dit "$out/dit.log" --rc $? --json "$out/dit.json" >&2
    fi
  else
    stub dit "mm3-bench-dit not built"
  fi
fi

# ---- PyTorch baselines -----------------------------------------------------------------------
if phase pytorch; then
  if "$py" -c "import torch, transformers" 2>/dev/null; then
    if [ "$dry" = 1 ]; then
      s0_args=(--tiny --contexts 40 --frames 2 --warmup 1) dit_args=(--tiny --reps 2 --warmup 1)
    else
      s0_args=() dit_args=()
      # Geometry from the checkpoint's config files when there is one.
      if [ -f "$ckpt/language_model/config.json" ]; then
        s0_args=(--checkpoint "$ckpt") dit_args=(--checkpoint "$ckpt")
      fi
    fi
    log "pytorch_stage0.py ${s0_args[*]}"
    timeout 1200 "$py" scripts/bench/pytorch_stage0.py "${s0_args[@]}" --json "$out/pytorch_stage0.json" \
      > "$out/pytorch_stage0.log" 2>&1 || [ -s "$out/pytorch_stage0.json" ] ||
      stub pytorch_stage0 "pytorch_stage0.py failed: $(tail -1 "$out/pytorch_stage0.log" | cut -c1-120)"
    log "pytorch_dit.py ${dit_args[*]}"
    timeout 1200 "$py" scripts/bench/pytorch_dit.py "${dit_args[@]}" --json "$out/pytorch_dit.json" \
      > "$out/pytorch_dit.log" 2>&1 || [ -s "$out/pytorch_dit.json" ] ||
      stub pytorch_dit "pytorch_dit.py failed: $(tail -1 "$out/pytorch_dit.log" | cut -c1-120)"
    golden=${MM3_GOLDEN_DIR:-}
    for g in "$golden" shared/golden/tiny-a ../shared/golden/tiny-a; do
      if [ -n "$g" ] && [ -f "$g/case0.safetensors" ]; then
        log "pytorch_dit.py --check against $g"
        "$py" scripts/bench/pytorch_dit.py --check "$g/checkpoint/transformer" --golden "$g/case0.safetensors" \
          --json "$out/pytorch_dit_check.json" > "$out/pytorch_dit_check.log" 2>&1
        break
      fi
    done
  else
    stub pytorch_stage0 "$py has no torch/transformers"
    stub pytorch_dit "$py has no torch/transformers"
  fi
fi

# ---- end to end through both processes and the HTTP API ----------------------------------
if phase e2e && [ -z "$e2e_na" ]; then
  if [ ! -x scripts/launch.sh ] || ! have mm3-stage0 || ! have mm3-stage1; then
    stub e2e "scripts/launch.sh or the stage programs missing"
  else
    # A dry run drives the CPU pipeline on the tiny checkpoint: it proves the harness, not speed.
    if [ "$dry" = 1 ]; then config=${config:-configs/tiny-cpu.yaml}; else config=${config:-configs/minimax_music3.yaml}; fi
    # The stage-1 precision the end-to-end figures were made in (the table shows its parity dB).
    prec=$("$bin/mm3-deploy" --launch-env "$config" 2>/dev/null | awk '$1 == "stage1_matmul_precision" { print $2 }')
    echo "{\"stage1_precision\": \"${prec:-unknown}\", \"config\": \"$config\"}" > "$out/e2e_config.json"
    # e2e_run CONFIG NAME [LABEL]: one launch, e2e.py into $out/NAME.json and NAME.log
    e2e_run() {
      local cfg=$1 name=$2 label=${3:-} port launcher llog
      llog=$out/launch.log
      [ "$name" = e2e ] || llog=$out/launch-$name.log
      port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
      export MM3_SHM_PREFIX="mm3-bench-$$-" MM3_BIN_DIR="$(cd "$bin" && pwd)"
      log "launch.sh $cfg on port $port"
      scripts/launch.sh "$cfg" --model "$ckpt" --port "$port" > "$llog" 2>&1 &
      launcher=$!
      for _ in $(seq 1200); do
        grep -q "^READY http" "$llog" 2>/dev/null && break
        kill -0 $launcher 2>/dev/null || break
        sleep 0.5
      done
      if grep -q "^READY http" "$llog"; then
        log "e2e.py${label:+ ($label)}"
        timeout 1500 "$py" scripts/bench/e2e.py --url "http://127.0.0.1:$port" --duration "$e2e_duration" \
          --concurrency "$e2e_conc" ${run_stall:-$e2e_stall} ${label:+--label "$label"} --json "$out/$name.json" \
          > "$out/$name.log" 2>&1 ||
          [ -s "$out/$name.json" ] || stub "$name" "e2e.py failed: $(tail -1 "$out/$name.log" | cut -c1-120)"
      else
        stub "$name" "the stages did not start ($(basename "$llog"))"
      fi
      kill -TERM $launcher 2>/dev/null
      wait $launcher 2>/dev/null
    }
    if [ -z "$e2e_orders" ]; then
      e2e_run "$config" e2e
    else
      runs=()
      for spec in ${e2e_orders//,/ }; do
        order=${spec%+stall} run_stall=""
        [ "$order" != "$spec" ] && run_stall=--allow-stall
        # the deploy file with stages[1].window_order set (inserted under "- stage_id: 1")
        "$py" - "$config" "$out/deploy-$order.yaml" "$order" <<'PY'
import re, sys
src, dst, order = sys.argv[1:]
text = open(src).read()
text = re.sub(r"^\s*window_order:.*\n", "", text, flags=re.M)
text, n = re.subn(r"^(\s*)- stage_id: 1\s*$", lambda m: m.group(0) + "\n" + m.group(1) + "  window_order: " + order,
                  text, count=1, flags=re.M)
if n != 1:
    sys.exit(f"{src}: no '- stage_id: 1' line to add window_order under")
open(dst, "w").write(text)
PY
        e2e_run "$out/deploy-$order.yaml" "e2e-$spec" "$spec"
        runs+=("$out/e2e-$spec.json")
      done
      run_stall=""
      cp "${runs[0]}" "$out/e2e.json" 2>/dev/null
      "$py" scripts/bench/e2e.py --compare "${runs[@]}" > "$out/e2e-orders.md" 2>&1 && cat "$out/e2e-orders.md"
    fi
  fi
elif phase e2e; then
  stub e2e "$e2e_na"
fi

# In a dry run, also prove the end-to-end client measures right (a local fake server).
if [ "$dry" = 1 ]; then
  "$py" scripts/bench/e2e.py --selftest > "$out/e2e_selftest.log" 2>&1 || log "e2e.py --selftest FAILED"
fi

"$py" scripts/bench/table.py --dir "$out" --markdown "$out/table.md"
