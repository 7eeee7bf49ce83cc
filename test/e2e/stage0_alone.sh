#!/bin/sh
# mm3-stage0 --config without stage 1: it still comes up (READY line), /health says
# stage1 down (503), a request fails fast with 503 "stage 1 unavailable", SIGTERM
# exits 0 and leaves no segment; `backend: cuda` without a GPU is refused with a
# clear message.
# Usage: stage0_alone.sh BIN_DIR GOLDEN_DIR TMP_DIR
bin=$1 golden=$2 tmp=$3
test -d "$golden/checkpoint" || exit 77
d="$tmp/e2e_stage0_alone.$$"
rm -rf "$d" && mkdir -p "$d" || exit 1
export MM3_SHM_PREFIX="s0alone$$-"
export MM3_STAGE1_WAIT_S=0.3
fail() { echo "FAIL: $*" >&2; cat "$d/err" >&2; kill -9 "$pid" 2>/dev/null; exit 1; }
deploy() {
    dtype=float32
    test "$1" = cuda && dtype=bfloat16
    cat > "$d/deploy.yaml" <<YAML
pipeline: minimax_music3
model: $golden/checkpoint
backend: $1
api:
  host: 127.0.0.1
  port: 0
stages:
  - stage_id: 0
    max_num_seqs: 2
    dtype: $dtype
    max_model_len: 2048
    max_num_batched_tokens: 64
  - stage_id: 1
    max_num_seqs: 1
YAML
}

# Where a GPU is visible a CUDA build would serve instead; the refusal is for the rest.
if ! nvidia-smi -L >/dev/null 2>&1; then
    deploy cuda
    "$bin/mm3-stage0" --config "$d/deploy.yaml" > "$d/out" 2> "$d/err"
    test $? -eq 1 || fail "backend cuda: expected exit 1"
    grep -q "backend cuda: not available in this build or on this machine" "$d/err" ||
        fail "backend cuda: no clear message"
fi

deploy cpu
"$bin/mm3-stage0" --config "$d/deploy.yaml" > "$d/out" 2> "$d/err" &
pid=$!
i=0
until grep -q "^READY stage0 http://" "$d/out"; do
    i=$((i + 1)); test $i -lt 300 || fail "no READY line"
    kill -0 $pid 2>/dev/null || fail "exited while starting"
    sleep 0.1
done
url=$(sed -n 's/^READY stage0 //p' "$d/out")
"$bin/mm3" health --url "$url" > "$d/health" 2>&1 && fail "health: expected not ready"
grep -q '"stage1":{"state":"down"' "$d/health" || fail "health: stage1 not down: $(cat "$d/health")"
grep -q '"stage0":{"state":"ready"' "$d/health" || fail "health: stage0 not ready"
"$bin/mm3" generate --url "$url" --caption pop --lyrics la --duration 2 --quiet -o "$d/x.wav" > "$d/gen" 2>&1 &&
    fail "generate: expected an error"
grep -q "503" "$d/gen" && grep -q "stage 1 unavailable" "$d/gen" || fail "generate: $(cat "$d/gen")"
kill -TERM $pid
wait $pid
test $? -eq 0 || fail "SIGTERM: exit status not 0"
ls /dev/shm | grep -q "^$MM3_SHM_PREFIX" && fail "segment left in /dev/shm"
grep -q "Sanitizer\|runtime error:" "$d/err" && fail "sanitizer report"
rm -rf "$d"
exit 0
