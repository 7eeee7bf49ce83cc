#!/usr/bin/env bash
# kill -9 of stage 0 mid-song.
#  1. The stages run on their own (no launcher): stage 1 notices within 5 s (its log:
#     "stage 0 went away"), stays up, the client's song fails (mm3 exits 1 and leaves
#     no partial file), a new stage 0 is served by the same stage 1 process, and SIGTERM
#     to both leaves no segment.
#  2. Under scripts/launch.sh: the launcher stops stage 1 and exits 1 (its policy:
#     the replica is restarted as a whole), leaving no segment.
# Usage: kill_stage0.sh SOURCE_DIR BIN_DIR CKPT_DIR TMP_DIR
src=$1 bin=$2 ckpt=$3 tmp=$4
d="$tmp/fault_kill_stage0.$$"
. "$src/test/load/lib.sh"
skip_unless_ready
rm -rf "$d" && mkdir -p "$d" || exit 1
export MM3_SHM_PREFIX="fk$$-"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16"
write_deploy "$d/deploy.yaml" 4 2 4 2
p0= p1=
cleanup() {
    for p in $p0 $p1; do kill -KILL "$p" 2>/dev/null; done
    cleanup_replica
    rm -f "/dev/shm/${MM3_SHM_PREFIX}"*  # the test's own prefix: any run id
}
trap cleanup EXIT
wait_file() { # wait_file FILE PID: until FILE is not empty, while PID lives (60 s)
    local i=0
    until [ -s "$1" ]; do
        kill -0 "$2" 2>/dev/null || fail "pid $2 exited before $1 appeared"
        i=$((i + 1)); [ $i -lt 600 ] || fail "$1 did not appear within 60 s"
        sleep 0.1
    done
}
start_stage0() {
    rm -f "$d/s0.ready"
    MM3_READY_FILE="$d/s0.ready" "$bin/mm3-stage0" --config "$d/deploy.yaml" >> "$d/s0.log" 2>&1 &
    p0=$!
    wait_file "$d/s0.ready" $p0
    url=$(head -n 1 "$d/s0.ready")
}
song() { # song OUT SECONDS
    "$bin/mm3" generate --url "$url" --caption "a fast punk song" --lyrics "[verse]
run run run" --duration "$2" --seed 4 --steps 2 --quiet -o "$1"
}

# 1. on their own
MM3_READY_FILE="$d/s1.ready" "$bin/mm3-stage1" --config "$d/deploy.yaml" > "$d/s1.log" 2>&1 &
p1=$!
wait_file "$d/s1.ready" $p1
start_stage0
song "$d/long.wav" 120 2> "$d/long.err" &
client=$!
i=0
until [ "$(stat -c %s "$d/long.wav.part" 2>/dev/null || echo 0)" -gt 44 ]; do
    kill -0 $client 2>/dev/null || { cat "$d/long.err"; fail "the song ended before any audio"; }
    i=$((i + 1)); [ $i -lt 600 ] || fail "no audio within 60 s"
    sleep 0.05
done
kill -KILL $p0
t0=$SECONDS
wait $p0 2>/dev/null
p0=
i=0
until grep -q "stage 0 went away" "$d/s1.log"; do
    i=$((i + 1)); [ $i -lt 50 ] || { tail "$d/s1.log"; fail "stage 1 did not notice within 5 s"; }
    sleep 0.1
done
echo "stage 1 noticed after $((SECONDS - t0)) s: $(grep -m1 'stage 0 went away' "$d/s1.log")"
wait $client && fail "the client succeeded although stage 0 died mid-song"
[ -e "$d/long.wav" ] || [ -e "$d/long.wav.part" ] && fail "the client left a partial file"
grep -q . "$d/long.err" || fail "the client said nothing"
echo "client: $(head -n 1 "$d/long.err")"
kill -0 $p1 2>/dev/null || fail "stage 1 exited after stage 0 died"
start_stage0
i=0
until grep -c "stage 0 connected" "$d/s1.log" | grep -q '^2$'; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "stage 1 did not attach to the new stage 0 within 30 s"
    sleep 0.1
done
song "$d/after.wav" 2 2> "$d/after.err" || { cat "$d/after.err"; tail "$d/s0.log"; fail "the song after the restart failed"; }
[ "$(stat -c %s "$d/after.wav")" -gt 44 ] || fail "empty song after the restart"
kill -0 $p1 || fail "stage 1 is not the same process"
kill -TERM $p0 $p1
wait $p0; rc0=$?
wait $p1; rc1=$?
p0= p1=
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "SIGTERM: stage 0 exited $rc0, stage 1 $rc1"
[ "$(segments)" -eq 0 ] || fail "segments left: $(ls /dev/shm | grep "^$MM3_SHM_PREFIX")"
grep -q -e 'Sanitizer' -e 'runtime error:' "$d/s0.log" "$d/s1.log" && fail "sanitizer report"

# 2. under the launcher
start_replica "$d/deploy.yaml"
kill -KILL "$s0"
i=0
while kill -0 "$lpid" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 400 ] || fail "the launcher did not exit within 40 s of stage 0's death"
    sleep 0.1
done
wait "$lpid"; rc=$?
lpid=
[ $rc -eq 1 ] || fail "the launcher exited $rc, expected 1"
grep -q "stage 0 died" "$d/launch.err" || fail "the launcher did not say that stage 0 died"
kill -0 "$s1" 2>/dev/null && fail "stage 1 still runs after the launcher exited"
[ "$(segments)" -eq 0 ] || fail "segments left after the launcher exited: $(ls /dev/shm | grep "^$MM3_SHM_PREFIX")"
rm -rf "$d"
exit 0
