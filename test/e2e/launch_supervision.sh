#!/bin/sh
# The launcher's supervision policy with stand-in stages (no model needed):
#   1. a stage 1 that keeps dying is restarted with back-off, then the launcher gives
#      up after MM3_STAGE1_MAX_RESTARTS deaths within 60 s: stops stage 0, exits 1;
#   2. SIGTERM to the launcher: both stages get SIGTERM, exit 0, no segment left.
# Every wait is for an event (a line in the launcher's output, a file a stage writes)
# with a generous deadline, never a fixed sleep: under a loaded machine the stages
# start late, and the test must not mistake slowness for a policy failure.
# Usage: launch_supervision.sh SOURCE_DIR TMP_DIR
src=$1 tmp=$2
d="$tmp/e2e_launch_supervision.$$"
rm -rf "$d" && mkdir -p "$d/bin" || exit 1
fail() { echo "FAIL: $*" >&2; cat "$d/err" >&2; exit 1; }
deadline_s=120

. "$(dirname "$0")/wait_for.sh"

# Stand-ins: write the ready file like the real stages and leave a fake segment that
# the launcher must clean; both log SIGTERM. While $d/s1-dies exists, stage 1 dies
# (status 3) once the launcher has announced READY: a death after start-up, which is
# what the restart policy is about, however late the stages came up.
cat > "$d/bin/mm3-stage0" <<SH
#!/bin/sh
trap 'echo stage0-term >> "$d/events"; exit 0' TERM
echo "http://127.0.0.1:1" > "\$MM3_READY_FILE"
while :; do sleep 0.1; done
SH
cat > "$d/bin/mm3-stage1" <<SH
#!/bin/sh
trap 'echo stage1-term >> "$d/events"; exit 0' TERM
echo start >> "$d/s1-starts"
: > "/dev/shm/\${MM3_SHM_PREFIX}\${MM3_RUN_ID}-s1_to_s0"
echo "stage1 \$\$" > "\$MM3_READY_FILE"
if [ -e "$d/s1-dies" ]; then
    until grep -q '^READY ' "$d/out" 2>/dev/null; do sleep 0.05; done
    exit 3
fi
while :; do sleep 0.1; done
SH
chmod +x "$d/bin/mm3-stage0" "$d/bin/mm3-stage1"
printf 'pipeline: minimax_music3\n' > "$d/deploy.yaml"
export MM3_BIN_DIR="$d/bin" MM3_SHM_PREFIX="sup$$-" MM3_STAGE1_MAX_RESTARTS=2

# 1. crash loop: three starts (the first and two restarts after 1 s and 2 s), then give up
touch "$d/s1-dies"
timeout $((2 * deadline_s)) bash "$src/scripts/launch.sh" "$d/deploy.yaml" > "$d/out" 2> "$d/err"
rc=$?
test $rc -eq 1 || fail "crash loop: expected exit 1, got $rc"
test "$(wc -l < "$d/s1-starts")" -eq 3 || fail "crash loop: expected 3 starts, got $(wc -l < "$d/s1-starts")"
grep -q "restarting it in 1 s" "$d/err" || fail "no first back-off of 1 s"
grep -q "restarting it in 2 s" "$d/err" || fail "no second back-off of 2 s"
grep -q "giving up, stopping stage 0" "$d/err" || fail "no give-up message"
grep -q stage0-term "$d/events" || fail "stage 0 not stopped"
ls /dev/shm | grep -q "^$MM3_SHM_PREFIX" && fail "segment left after the crash loop"

# 2. SIGTERM once both stages are up
# The crash loop left a READY line in out: remove it, or the wait below can see it
# before the new launcher truncates the file and signal a launcher not yet started.
rm -f "$d/s1-dies" "$d/events" "$d/out"
bash "$src/scripts/launch.sh" "$d/deploy.yaml" > "$d/out" 2> "$d/err" &
pid=$!
wait_for "READY line" grep -q "^READY http://127.0.0.1:1" "$d/out"
kill -TERM $pid
wait $pid
rc=$?
test $rc -eq 0 || fail "SIGTERM: expected exit 0, got $rc"
grep -q stage0-term "$d/events" && grep -q stage1-term "$d/events" || fail "SIGTERM not forwarded to both"
ls /dev/shm | grep -q "^$MM3_SHM_PREFIX" && fail "segment left after SIGTERM"
rm -rf "$d"
exit 0
