#!/bin/sh
# launch.sh --mps with stand-in stages and a stand-in nvidia-cuda-mps-control (no GPU):
#   1. the daemon is started (-d) before the stages, both stages see the replica's own
#      CUDA_MPS_PIPE_DIRECTORY (inside the run folder), and SIGTERM ends with 'quit';
#   2. a daemon that fails to start: exit 2 naming it, no stage started.
# Usage: launch_mps.sh SOURCE_DIR TMP_DIR
src=$1 tmp=$2
d="$tmp/e2e_launch_mps.$$"
rm -rf "$d" && mkdir -p "$d/bin" "$d/fakebin" || exit 1
fail() { echo "FAIL: $*" >&2; cat "$d/err" >&2; exit 1; }
deadline_s=120
. "$(dirname "$0")/wait_for.sh"

for s in 0 1; do
    cat > "$d/bin/mm3-stage$s" <<SH
#!/bin/sh
trap 'exit 0' TERM
echo "\${CUDA_MPS_PIPE_DIRECTORY:-unset}" > "$d/stage$s.pipe"
echo "http://127.0.0.1:1" > "\$MM3_READY_FILE"
while :; do sleep 0.1; done
SH
done
# The daemon stand-in: records its calls; '-d' fails while $d/mps-broken exists.
cat > "$d/fakebin/nvidia-cuda-mps-control" <<SH
#!/bin/sh
if [ "\$1" = -d ]; then
    echo "start \$CUDA_MPS_PIPE_DIRECTORY" >> "$d/mps-calls"
    test -e "$d/mps-broken" && exit 1
    exit 0
fi
echo "stdin \$(cat)" >> "$d/mps-calls"
SH
chmod +x "$d/bin/mm3-stage0" "$d/bin/mm3-stage1" "$d/fakebin/nvidia-cuda-mps-control"
printf 'pipeline: minimax_music3\n' > "$d/deploy.yaml"
export MM3_BIN_DIR="$d/bin" MM3_SHM_PREFIX="mps$$-" MM3_RUN_DIR="$d/run" PATH="$d/fakebin:$PATH"

# 1. started, seen by both stages, quit at SIGTERM
bash "$src/scripts/launch.sh" "$d/deploy.yaml" --mps > "$d/out" 2> "$d/err" &
pid=$!
wait_for "READY line" grep -q "^READY http://127.0.0.1:1" "$d/out"
wait_for "stage pipe files" test -s "$d/stage0.pipe" -a -s "$d/stage1.pipe"
grep -q "^start $d/run/mps-pipe\$" "$d/mps-calls" || fail "daemon not started with the run folder's pipe"
test "$(cat "$d/stage0.pipe")" = "$d/run/mps-pipe" || fail "stage 0 pipe: $(cat "$d/stage0.pipe")"
test "$(cat "$d/stage1.pipe")" = "$d/run/mps-pipe" || fail "stage 1 pipe: $(cat "$d/stage1.pipe")"
kill -TERM $pid
wait $pid
rc=$?
test $rc -eq 0 || fail "SIGTERM: expected exit 0, got $rc"
grep -q "^stdin quit\$" "$d/mps-calls" || fail "the daemon was not told to quit"

# 2. a daemon that does not start
rm -f "$d/mps-calls" "$d/stage0.pipe" "$d/stage1.pipe"
touch "$d/mps-broken"
timeout $deadline_s bash "$src/scripts/launch.sh" "$d/deploy.yaml" --mps > "$d/out" 2> "$d/err"
rc=$?
test $rc -eq 2 || fail "broken daemon: expected exit 2, got $rc"
grep -q "nvidia-cuda-mps-control -d failed" "$d/err" || fail "no message naming the daemon"
test -e "$d/stage0.pipe" -o -e "$d/stage1.pipe" && fail "a stage started without its daemon"
rm -rf "$d"
exit 0
