#!/usr/bin/env bash
# Scale-out measurements on the GPU machine (docs/operations.md, "Scale out"), from the
# packed tree (scripts/device-pack.sh -o .device mm3-stage0 mm3-stage1 mm3-deploy mm3-mkckpt
# mm3-load, carried as .device; MM3_BIN_DIR overrides where the programs are):
#
#   scripts/device-scaleout.sh rehearsal   one H200: one stage 0 + one stage-1 worker
#                                          (configs/minimax_music3.yaml) against the same
#                                          file with `replicas: 2` (two workers on the GPU)
#   scripts/device-scaleout.sh multi       2 or more GPUs: configs/minimax_music3_2gpu.yaml,
#                                          and with 4 or more configs/minimax_music3_4gpu.yaml
#
# Each configuration: scripts/bench.sh --only e2e (random weights at the release geometry,
# stage 1 at the file's precision), one 30 s song and 8 at once, then 32 at once; results
# under $OUT/<name>-c8 and $OUT/<name>-c32 (e2e.json: audio s/s, first audio, per-GPU busy).
# Environment: OUT (default results/scaleout-<UTC date>), MM3_BENCH_CKPT (bench.sh's),
# MM3_SCALEOUT_BASE (the rehearsal's one-GPU file, default configs/minimax_music3.yaml: an
# H100 needs a smaller max_model_len), MM3_SCALEOUT_CONCURRENCY (default "8 32").
set -eu
mode=${1:-}
case "$mode" in rehearsal | multi) ;; *) echo "usage: device-scaleout.sh rehearsal|multi" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/results/scaleout-$(date -u +%Y%m%d-%H%M)}
mkdir -p "$out"
bin=${MM3_BIN_DIR:-$root/.device/bin}
[ -x "$bin/mm3-deploy" ] || bin=$root/build/bin
export LD_LIBRARY_PATH="$root/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 1 ] || { echo "device-scaleout.sh: no GPU visible" >&2; exit 77; }

run() { # NAME CONFIG
    local name=$1 config=$2 c
    "$bin/mm3-deploy" --check "$config" >/dev/null
    for c in ${MM3_SCALEOUT_CONCURRENCY:-8 32}; do
        echo "== $name: $config, $c at once"
        "$root/scripts/bench.sh" --only e2e --bin "$bin" --config "$config" --e2e-concurrency "$c" --out "$out/$name-c$c" ||
            echo "== $name ($c at once) failed: see $out/$name-c$c" >&2
    done
}

if [ "$mode" = rehearsal ]; then
    base=${MM3_SCALEOUT_BASE:-$root/configs/minimax_music3.yaml}
    run one-worker "$base"
    # The one-GPU file with two stage-1 workers on the same GPU (0.6 + 2 x 0.2 of its memory).
    two=$out/minimax_music3_2workers.yaml
    sed 's/^  - stage_id: 1$/  - stage_id: 1\n    replicas: 2/' "$base" > "$two"
    grep -q '^    replicas: 2$' "$two" || { echo "device-scaleout.sh: could not add replicas to $two" >&2; exit 1; }
    run two-workers "$two"
else
    [ "$gpus" -ge 2 ] || { echo "device-scaleout.sh multi: $gpus GPU(s) visible, need 2 or more" >&2; exit 77; }
    run one-gpu "$root/configs/minimax_music3.yaml"
    run 2gpu "$root/configs/minimax_music3_2gpu.yaml"
    [ "$gpus" -ge 4 ] && run 4gpu "$root/configs/minimax_music3_4gpu.yaml"
fi
echo "results in $out"
