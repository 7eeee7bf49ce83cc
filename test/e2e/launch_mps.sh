#!/bin/sh
# launch.sh --mps with stand-in stages and a stand-in nvidia-cuda-mps-control (no GPU):
#   1. the daemon is started (-d) before the stages, both stages see the replica's own
#      CUDA_MPS_PIPE_DIRECTORY (inside the run folder), and SIGTERM ends with 'quit';
#   2. a daemon that fails to start: exit 2 naming it, no stage started.
# With the real mm3-deploy reading the deploy file's keys:
#   3. mps: auto with stages[1].mps_thread_percentage 55: the daemon starts, stage 1 alone
#      gets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=55 (stage 0 has no limit);
#   4. mps: auto where MPS cannot start (no control program; -d fails; no server comes up):
#      one "MPS unavailable" line, the stages start without MPS (no pipe, no percentage);
#   5. MM3_MPS=0 overrides mps: on; backend cpu skips MPS; a bad percentage is refused (exit 2).
# Usage: launch_mps.sh SOURCE_DIR TMP_DIR
src=$1 tmp=$2
real_bin=${MM3_BIN_DIR:-$src/build/bin}
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
echo "\${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-unset}" > "$d/stage$s.pct"
echo "http://127.0.0.1:1" > "\$MM3_READY_FILE"
while :; do sleep 0.1; done
SH
done
# The daemon stand-in: records its calls; '-d' fails while $d/mps-broken exists; it lists
# a server once asked to start one, unless $d/mps-noserver exists.
cat > "$d/fakebin/nvidia-cuda-mps-control" <<SH
#!/bin/sh
if [ "\$1" = -d ]; then
    echo "start \$CUDA_MPS_PIPE_DIRECTORY" >> "$d/mps-calls"
    test -e "$d/mps-broken" && exit 1
    exit 0
fi
cmd=\$(cat)
echo "stdin \$cmd" >> "$d/mps-calls"
case "\$cmd" in
    start_server*) test -e "$d/mps-noserver" || : > "$d/mps-server" ;;
    get_server_list) test -e "$d/mps-server" && echo 4242 ;;
    quit) rm -f "$d/mps-server" ;;
esac
exit 0
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
rm -f "$d/mps-broken"

# From here on the deploy file's keys are read by the real mm3-deploy.
test -x "$real_bin/mm3-deploy" || fail "$real_bin/mm3-deploy not built"
ln -s "$real_bin/mm3-deploy" "$d/bin/mm3-deploy"
cat > "$d/auto.yaml" <<Y
mps: auto
stages:
  - {stage_id: 0}
  - {stage_id: 1, mps_thread_percentage: 55}
Y

# Runs the launcher on $1 until READY, then SIGTERM; the stages' files are fresh.
run_until_ready() {
    rm -f "$d/mps-calls" "$d/stage0.pipe" "$d/stage1.pipe" "$d/stage0.pct" "$d/stage1.pct"
    bash "$src/scripts/launch.sh" "$1" > "$d/out" 2> "$d/err" &
    pid=$!
    wait_for "READY line" grep -q "^READY http://127.0.0.1:1" "$d/out"
    wait_for "stage files" test -s "$d/stage0.pct" -a -s "$d/stage1.pct"
    kill -TERM $pid
    wait $pid
    rc=$?
    test $rc -eq 0 || fail "$1: SIGTERM: expected exit 0, got $rc"
}
expect_no_mps() {
    for s in 0 1; do
        test "$(cat "$d/stage$s.pipe")" = unset || fail "$1: stage $s pipe: $(cat "$d/stage$s.pipe")"
        test "$(cat "$d/stage$s.pct")" = unset || fail "$1: stage $s percentage: $(cat "$d/stage$s.pct")"
    done
}

# 3. auto, the percentage on stage 1 only
run_until_ready "$d/auto.yaml"
test "$(cat "$d/stage1.pct")" = 55 || fail "stage 1 percentage: $(cat "$d/stage1.pct")"
test "$(cat "$d/stage0.pct")" = unset || fail "stage 0 percentage: $(cat "$d/stage0.pct")"
test "$(cat "$d/stage1.pipe")" = "$d/run/mps-pipe" || fail "stage 1 pipe: $(cat "$d/stage1.pipe")"
grep -q "^stdin start_server -uid" "$d/mps-calls" || fail "no server probe"
grep -q "^stdin quit\$" "$d/mps-calls" || fail "auto: the daemon was not told to quit"

# 4. auto where MPS cannot start: each time one line and no MPS
touch "$d/mps-broken"
run_until_ready "$d/auto.yaml"
expect_no_mps "-d fails"
test "$(grep -c "MPS unavailable (nvidia-cuda-mps-control -d failed" "$d/err")" -eq 1 || fail "-d fails: no single line"
rm -f "$d/mps-broken"
touch "$d/mps-noserver"
run_until_ready "$d/auto.yaml"
expect_no_mps "no server"
grep -q "MPS unavailable (the MPS server did not start" "$d/err" || fail "no server: no line"
grep -q "^stdin quit\$" "$d/mps-calls" || fail "no server: the daemon was not told to quit"
rm -f "$d/mps-noserver"
if ! PATH="$(echo "$PATH" | sed "s|$d/fakebin:||")" command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    PATH="$(echo "$PATH" | sed "s|$d/fakebin:||")" run_until_ready "$d/auto.yaml"
    expect_no_mps "no control program"
    grep -q "MPS unavailable (nvidia-cuda-mps-control not found" "$d/err" || fail "no control program: no line"
fi

# 5. overrides and refusals
printf 'mps: on\nstages:\n  - {stage_id: 0}\n  - {stage_id: 1, mps_thread_percentage: 40}\n' > "$d/on.yaml"
MM3_MPS=0 run_until_ready "$d/on.yaml"
expect_no_mps "MM3_MPS=0"
test -e "$d/mps-calls" && fail "MM3_MPS=0: the daemon was called"
printf 'backend: cpu\nmps: auto\nstages:\n  - {stage_id: 0, dtype: float32}\n  - {stage_id: 1, mps_thread_percentage: 40}\n' > "$d/cpu.yaml"
run_until_ready "$d/cpu.yaml"
expect_no_mps "backend cpu"
grep -q "MPS: off (backend cpu)" "$d/err" || fail "backend cpu: no line"
printf 'mps: auto\nstages:\n  - {stage_id: 0}\n  - {stage_id: 1, mps_thread_percentage: 101}\n' > "$d/bad.yaml"
rm -f "$d/stage0.pct" "$d/stage1.pct"
timeout $deadline_s bash "$src/scripts/launch.sh" "$d/bad.yaml" > "$d/out" 2> "$d/err"
rc=$?
test $rc -eq 2 || fail "bad percentage: expected exit 2, got $rc"
grep -q "stages\[1\].mps_thread_percentage" "$d/err" || fail "bad percentage: the key is not named"
test -e "$d/stage0.pct" -o -e "$d/stage1.pct" && fail "bad percentage: a stage started"
rm -rf "$d"
exit 0
