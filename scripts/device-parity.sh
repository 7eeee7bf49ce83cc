#!/usr/bin/env bash
# The release-geometry parity check, one device call: make the release-geometry checkpoint
# (random weights), record diffusers' reference in float32 on the GPU (TF32 off) with one
# two-window case, record PyTorch's own tf32 / bf16 / fp16 / naive-bf16 stage 1 on the same
# draws (yardsticks.json), replay mm3's stage 1 through CUDA in every precision and stage 0
# through CUDA, and print one table (rel error and SNR per precision beside PyTorch's, the
# bounds' verdicts, stage 0's guided-logit and frame-hidden errors, edge flips and edge swaps).
#
# Here:   scripts/device-parity.sh --pack [build-dir]   (CUDA build + diffusers wheel into .device-parity/)
# Device: run(command="scripts/device-parity.sh", carry=[".device-parity"])
# Test here on the CPU with tiny-a (torch + diffusers in a venv, make_golden.py's docstring):
#         scripts/device-parity.sh --checkpoint ../shared/golden/tiny-a/checkpoint --device cpu \
#             --bin build/bin --python /tmp/ref/bin/python --out /tmp/parity-cpu
#
# Options: --checkpoint DIR (skip mkckpt, use DIR), --device cuda|cpu (reference and replays;
# cpu replays have only fp32), --bin DIR, --python PY, --duration S (10: 250 frames = 2
# windows, the second with the overlap prefix), --steps N (30, the serving default), --seed N (42; a song may end before
# --duration where the draws give the stop code),
# --precisions LIST (fp32,tf32,bf16,fp16,fp8; PyTorch has no fp8 run: "-" beside it), --out DIR ($OUT, else /tmp/parity).
# --lora R: random rank-R LoRA adapters (mm3-mkckpt --lora; the talker's q_proj,v_proj, the depth
# decoder's and the DiT's attention) applied to the reference by PEFT (make_golden.py --lora; the
# pack carries the peft wheel) and merged by mm3 from the golden manifest: the adapter parity check.
# Each phase runs under its own timeout, all inside MM3_PARITY_DEADLINE_S (570 s) so the
# call ends inside the run tool's 600 s; a failed phase is reported and the rest go on.
# $OUT gets table.md, yardsticks.json, manifest.json and parity-logs.tgz (every log).
# MM3_PARITY_CKPT: where the release checkpoint goes (/tmp/parity-ckpt; kept and reused when
# complete, so a second call on a warm machine skips mkckpt); MM3_PARITY_WORK: the work folder
# (/tmp/parity-work: the golden directory, the unpacked programs, the logs).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD pack=.device-parity

if [ "${1:-}" = --pack ]; then
  build=${2:-build-cuda}
  scripts/device-pack.sh -B "$build" -o "$pack" mm3-stage0 mm3-stage1 mm3-mkckpt >/dev/null || exit 1
  strip "$pack"/bin/* 2>/dev/null
  rm -f "$pack"/binlib.txz
  XZ_OPT="-9 -T2" tar cJf "$pack"/binlib.txz -C "$pack" bin lib && rm -rf "$pack"/bin "$pack"/lib
  # diffusers is pure Python; its dependencies are on the device (KINDS.md): it travels alone.
  rm -rf "$pack"/whl && mkdir -p "$pack"/whl
  if [ -n "${MM3_DIFFUSERS_WHEEL:-}" ]; then
    cp "$MM3_DIFFUSERS_WHEEL" "$pack"/whl/
  else
    python3 -m pip download -q --no-deps -d "$pack"/whl "diffusers==${MM3_DIFFUSERS_VERSION:-0.42.1}" || exit 1
  fi
  # PEFT applies the adapters of --lora to the reference; pure Python like diffusers.
  python3 -m pip download -q --no-deps -d "$pack"/whl "peft${MM3_PEFT_VERSION:+==$MM3_PEFT_VERSION}" || exit 1
  du -sh --apparent-size "$pack"; ls "$pack" "$pack"/whl
  exit 0
fi

ckpt="" device=cuda bin="" py=python3 lora=0 duration=10 steps=30 seed=42 precisions=fp32,tf32,bf16,fp16,fp8 out=${OUT:-/tmp/parity}
while [ $# -gt 0 ]; do
  case "$1" in
    --checkpoint) ckpt=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --lora) lora=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --precisions) precisions=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "device-parity: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
case "$device" in cuda|cpu) ;; *) echo "device-parity: --device $device: expected cuda or cpu" >&2; exit 2 ;; esac

t0=$SECONDS deadline=${MM3_PARITY_DEADLINE_S:-570}
work=${MM3_PARITY_WORK:-/tmp/parity-work}
rm -rf "$work" && mkdir -p "$work/logs" "$out" || exit 1
logs=$work/logs
# phase NAME CAP CMD...: CMD under timeout min(CAP, what is left of the deadline - 20 s for the table)
phase() {
  local name=$1 cap=$2; shift 2
  local left=$((deadline - (SECONDS - t0) - 20))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -le 0 ]; then echo "== $name: skipped, no time left"; echo "skipped: no time left" > "$logs/$name.log"; return 124; fi
  echo "== $name (t=$((SECONDS - t0)) s, limit $cap s)"
  timeout "$cap" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ($((SECONDS - t0)) s)"; [ $rc = 0 ] || tail -3 "$logs/$name.log"
  return $rc
}
finish() {
  python3 scripts/parity_table.py --dir "$work" --markdown "$out/table.md" 2>&1
  cp "$work"/golden/yardsticks.json "$work"/golden/manifest.json "$out"/ 2>/dev/null
  tar czf "$out/parity-logs.tgz" -C "$work" logs 2>/dev/null
}
trap finish EXIT

# Programs and diffusers from the pack (device), else the given or local build (here).
if [ -z "$bin" ]; then
  if [ -f $pack/binlib.txz ]; then
    tar xJf $pack/binlib.txz -C "$work" && bin=$work/bin
    export LD_LIBRARY_PATH="$work/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    bin=$(ls -d build-cuda/bin build/bin 2>/dev/null | head -1)
  fi
fi
[ -x "$bin/mm3-stage1" ] || { echo "device-parity: no mm3-stage1 in '$bin' (--pack here first, or --bin)"; exit 1; }
if ! "$py" -c "import diffusers, peft" 2>/dev/null; then
  ls $pack/whl/*.whl >/dev/null 2>&1 || { echo "device-parity: no diffusers for $py and no $pack/whl"; exit 1; }
  "$py" -m pip install -q --no-index --no-deps --target "$work/py" $pack/whl/*.whl > "$logs/pip.log" 2>&1 ||
    { echo "device-parity: installing the diffusers wheel failed"; cat "$logs/pip.log"; exit 1; }
  export PYTHONPATH="$work/py${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; df -h /tmp | tail -1
  "$py" -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)"
} > "$logs/machine.log" 2>&1
cat "$logs/machine.log"

# 1. the checkpoint: release geometry, random weights (~28.5 GB on a 64 GB disk)
if [ -z "$ckpt" ]; then
  ckpt=${MM3_PARITY_CKPT:-/tmp/parity-ckpt}
  if [ ! -f "$ckpt/.mkckpt-done" ]; then # mkckpt writes the index first: a marker says it finished
    rm -rf "$ckpt"
    phase mkckpt 150 "$bin/mm3-mkckpt" --preset full --out "$ckpt" && touch "$ckpt/.mkckpt-done" || exit 1
  fi
fi
ckpt=$(cd "$ckpt" && pwd) || exit 1

# 2. the reference in float32 and PyTorch's yardsticks, one case of two windows
golden=$work/golden
mkdir -p "$golden" && ln -sfn "$ckpt" "$golden/checkpoint"
cat > "$work/cases.json" <<EOF
{"cases": [{"prompt": "Genre: acoustic pop. BPM: 96. Key: C major.", "lyrics": "[verse]\nMorning light\n[outro]",
  "audio_duration": $duration, "num_inference_steps": $steps, "seed": $seed}]}
EOF
lora_args=()
if [ "$lora" != 0 ]; then
  mkdir -p "$work/lora"
  for spec in language_model:q_proj,v_proj rvq_depth_decoder:to_q,to_k,to_v,to_out transformer:to_q,to_k,to_v,to_out.0; do
    c=${spec%%:*}
    phase "lora_$c" 60 "$bin/mm3-mkckpt" --lora "$work/lora/$c" --model "$ckpt" --component "$c" --rank "$lora" \
      --alpha $((2 * lora)) --targets "${spec#*:}" --seed 3 || exit 1
    lora_args+=(--lora "$c=$work/lora/$c")
  done
fi
# PyTorch's own runs in the precisions asked for (bf16-naive beside bf16)
yard=()
for p in ${precisions//,/ }; do
  case $p in tf32 | fp16) yard+=("$p") ;; bf16) yard+=(bf16 bf16-naive) ;; esac
done
yard_args=()
[ ${#yard[@]} -gt 0 ] && yard_args=(--yardsticks "$(IFS=,; echo "${yard[*]}")")
phase reference 300 "$py" scripts/make_golden.py "$ckpt" "$golden" "$work/cases.json" --compact --device "$device" \
  "${yard_args[@]}" "${lora_args[@]}"
# the manifest names the checkpoint relative to the directory (make_golden.py writes "checkpoint")
[ -f "$golden/manifest.json" ] || exit 1
grep -E "frames|tf32|bf16|fp16" "$logs/reference.log" | grep -v "it/s" | head -8

# 3. mm3's stage 1 in every precision, then stage 0, through the device's backend
backend=$device
if [ "$backend" = cuda ]; then
  for p in ${precisions//,/ }; do
    phase "stage1_$p" 90 "$bin/mm3-stage1" --golden "$golden" --backend cuda --precision "$p"
  done
else
  phase stage1_fp32 120 "$bin/mm3-stage1" --golden "$golden" --backend cpu
fi
phase stage0 150 "$bin/mm3-stage0" --golden "$golden" --backend "$backend"
exit 0
