#!/bin/sh
# The negative of a golden geometry with LoRA adapters (test/data/golden-geometries/NAME with
# lora.args): for each adapter of the manifest's "lora" list in turn, a copy of the golden
# directory whose manifest sets that adapter's scale to 0 (loaded, validated, merged as zero)
# must fail every case of the stage that loads its component (language_model and
# rvq_depth_decoder: stage 0, transformer: stage 1). So every adapter's effect is larger
# than the replay's bounds, and the geometry's passing replays show that mm3 merges each
# adapter as PEFT does.
# Usage: golden_unadapted.sh BIN_DIR GOLDEN_DIR WORK_DIR   (GOLDEN_DIR from golden-geometry.sh)
bin=$1 golden=$2 work=$3
if [ ! -f "$golden/manifest.json" ] || [ ! -d "$golden/lora" ]; then echo "$golden: no manifest.json or lora/"; exit 1; fi
n_cases=$(find "$golden"/ -maxdepth 1 -name 'case*.safetensors' | wc -l)
fail=0 n=0
for dir in "$golden"/lora/*/; do
  c=$(basename "$dir")
  case $c in
    language_model | rvq_depth_decoder) s=0 ;;
    transformer) s=1 ;;
    *) echo "$c: not a component with adapters"; exit 1 ;;
  esac
  w=$work/$c
  rm -rf "$w" && mkdir -p "$w" || exit 1
  for f in "$golden"/checkpoint "$golden"/lora "$golden"/case*.safetensors; do ln -s "$(readlink -f "$f")" "$w/"; done
  # make_golden.py's manifest: each "lora" entry spans lines, "component" before "scale"
  awk -v c="$c" '/"component":/ { cur = index($0, "\"" c "\"") > 0 }
                 cur && /"scale":/ { sub(/"scale":[^,]*/, "\"scale\": 0"); cur = 0; n++ }
                 { print } END { exit n != 1 }' "$golden/manifest.json" > "$w/manifest.json" ||
    { echo "$c: the manifest has no single \"scale\" for it"; exit 1; }
  "$bin/mm3-stage$s" --golden "$w" > "$w/replay.txt" 2>&1
  if ! grep -q "^0 passed, $n_cases failed$" "$w/replay.txt"; then
    echo "stage $s with $c's adapter at scale 0: expected all $n_cases cases to fail"
    tail -5 "$w/replay.txt"
    fail=1
  elif ! grep -q "scale 0 merged into $c" "$w/replay.txt"; then
    echo "stage $s: $c's adapter was not loaded at scale 0"
    fail=1
  else
    echo "stage $s with $c's adapter at scale 0: $n_cases of $n_cases cases fail"
  fi
  n=$((n + 1))
done
[ $n -gt 0 ] || { echo "$golden/lora: no adapter"; exit 1; }
[ $fail = 0 ] && [ -z "$KEEP" ] && rm -rf "$work"
exit $fail
