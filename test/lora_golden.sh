#!/bin/sh
# The golden replays with LoRA adapters listed in the manifest (lora_merge_add_golden):
# tiny-a's goldens were made without an adapter, so with a random adapter at scale 0
# (loaded, validated, merged as zero) both stages still pass, at scale 1 every case must
# fail (the adapter reaches the talker, the depth decoder and the DiT), and an adapter
# whose modules the checkpoint lacks stops the replay with the module named.
# Usage: lora_golden.sh BIN_DIR GOLDEN_DIR WORK_DIR   (77 when GOLDEN_DIR is absent)
bin=$1 golden=$2 work=$3
[ -f "$golden/manifest.json" ] || exit 77
rm -rf "$work" && mkdir -p "$work/lora" || exit 1
ln -s "$golden/checkpoint" "$work/checkpoint"
for f in "$golden"/case*.safetensors; do ln -s "$f" "$work/"; done
for c in language_model rvq_depth_decoder transformer; do
  "$bin/mm3-mkckpt" --lora "$work/lora/$c" --model "$golden/checkpoint" --component "$c" --rank 4 --seed 1 \
    2>/dev/null || exit 1
done
# manifest SCALE [LM_ADAPTER]: tiny-a's manifest with a "lora" list in front of its keys
manifest() {
  lm=${2:-lora/language_model}
  sed "1s|^{|{\"lora\": [{\"component\": \"language_model\", \"path\": \"$lm\", \"scale\": $1}, \
{\"component\": \"rvq_depth_decoder\", \"path\": \"lora/rvq_depth_decoder\", \"scale\": $1}, \
{\"component\": \"transformer\", \"path\": \"lora/transformer\", \"scale\": $1}],|" \
    "$golden/manifest.json" > "$work/manifest.json"
}
n_cases=$(ls "$golden"/case*.safetensors | wc -l)
fail=0
manifest 0
for s in 0 1; do
  "$bin/mm3-stage$s" --golden "$work" > "$work/s$s-zero.txt" 2>&1 || { echo "stage $s, scale 0: failed"; cat "$work/s$s-zero.txt"; fail=1; }
done
manifest 1
for s in 0 1; do
  "$bin/mm3-stage$s" --golden "$work" > "$work/s$s-one.txt" 2>&1
  grep -q "^0 passed, $n_cases failed$" "$work/s$s-one.txt" || { echo "stage $s, scale 1: expected every case to fail"; tail -5 "$work/s$s-one.txt"; fail=1; }
done
manifest 1 lora/transformer
"$bin/mm3-stage0" --golden "$work" > "$work/bad.txt" 2>&1 && { echo "a DiT adapter on the talker was accepted"; fail=1; }
grep -q "does not hold" "$work/bad.txt" || { echo "bad adapter: message lacks the module"; cat "$work/bad.txt"; fail=1; }
[ $fail = 0 ] && [ -z "$KEEP" ] && rm -rf "$work"
exit $fail
