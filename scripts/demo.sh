#!/usr/bin/env bash
# The main job: install dependencies, build, start both stages and make a song.
#
#   scripts/demo.sh                    tiny random-weight checkpoint, CPU, ~10 s song -> demo.wav
#   scripts/demo.sh --model DIR        the real MiniMax-Music3 checkpoint on the GPU
#   options: --no-install  --duration S  --out FILE  --config DEPLOY.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
install=1 model="" duration=10 out=demo.wav config=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-install) install=0 ;;
    --model) model=$2; shift ;;
    --duration) duration=$2; shift ;;
    --out) out=$2; shift ;;
    --config) config=$2; shift ;;
    -h|--help) sed -n 2,7p "$0"; exit 0 ;;
    *) echo "demo.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ "$install" = 1 ] && scripts/install-deps.sh
[ -x /usr/local/cuda/bin/nvcc ] && export CUDACXX=/usr/local/cuda/bin/nvcc
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)"

if [ -z "$model" ]; then
  # A tiny checkpoint in the release layout, random weights: the audio is noise-like,
  # but every stage of the real pipeline runs on it.
  [ -f build/tiny-ckpt/modular_model_index.json ] || build/bin/mm3-mkckpt --preset tiny --out build/tiny-ckpt --seed 1
  config=${config:-configs/tiny-cpu.yaml}
  model=build/tiny-ckpt
elif [ -z "$config" ]; then
  # The one-GPU file is an H200's; a card of less than 100 GiB gets the 80 GB file.
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
  config=configs/minimax_music3.yaml
  [ -n "$mib" ] && [ "$mib" -lt 102400 ] 2>/dev/null && config=configs/minimax_music3_h100.yaml
fi

export MM3_SHM_PREFIX="mm3-demo-$$-"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 8765)
log=$(mktemp -d)/launch.log
scripts/launch.sh "$config" --model "$model" --port "$port" >"$log" 2>&1 &
launcher=$!
trap 'kill -TERM $launcher 2>/dev/null; wait $launcher 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  # the launcher's own line: "READY stage1" (a stage's, in the same log) comes before stage 0 listens
  grep -q "^READY http" "$log" 2>/dev/null && break
  kill -0 $launcher 2>/dev/null || { cat "$log"; echo "demo.sh: the stages did not start" >&2; exit 1; }
  sleep 0.5
done
grep -q "^READY http" "$log" || { cat "$log"; echo "demo.sh: timed out waiting for the stages" >&2; exit 1; }
build/bin/mm3 generate --url "http://127.0.0.1:$port" \
  --caption "a warm acoustic pop song, female vocals, 96 BPM" \
  --lyrics $'[verse]\nmorning light on the water\n[chorus]\nstay with me' \
  --duration "$duration" --seed 7 -o "$out"
echo "demo.sh: wrote $out"
