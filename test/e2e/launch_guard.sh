#!/bin/sh
# What the launcher may remove, with stand-in stages (no model needed):
#   1. an MM3_SHM_PREFIX that is not one plain name part (../../tmp/x-) is refused with
#      exit 2 before anything starts, and no file it points at is deleted;
#   2. a second launcher with the prefix of a running replica refuses to start (exit 2)
#      and the running replica's segments survive; once the first stops, the prefix is
#      free again;
#   3. both stages get the same 32-hex-digit run id (in the segment names) and token,
#      fresh for every launch.
# Every wait is for an event with a generous deadline, never a fixed sleep.
# Usage: launch_guard.sh SOURCE_DIR TMP_DIR
src=$1 tmp=$2
d="$tmp/e2e_launch_guard.$$"
rm -rf "$d" && mkdir -p "$d/bin" || exit 1
d=$(cd "$d" && pwd)
fail() { echo "FAIL: $*" >&2; cat "$d"/err* >&2 2>/dev/null; exit 1; }
deadline_s=120

. "$(dirname "$0")/wait_for.sh"

# Stand-ins: each leaves its segment name the way the real stages do and records the
# run id and token it was given.
for s in 0 1; do
    if [ $s = 0 ]; then ch=s0_to_s1 ready='echo "http://127.0.0.1:1" > "$MM3_READY_FILE"'; else ch=s1_to_s0 ready='echo "stage1 $$" > "$MM3_READY_FILE"'; fi
    cat > "$d/bin/mm3-stage$s" <<SH
#!/bin/sh
trap 'exit 0' TERM
echo "stage$s \$MM3_RUN_ID \$MM3_RUN_TOKEN" >> "$d/ids"
: > "/dev/shm/\${MM3_SHM_PREFIX}\${MM3_RUN_ID}-$ch"
$ready
while :; do sleep 0.1; done
SH
    chmod +x "$d/bin/mm3-stage$s"
done
printf 'pipeline: minimax_music3\n' > "$d/deploy.yaml"
export MM3_BIN_DIR="$d/bin" MM3_LOCK_DIR="$d/locks"
launcher="$src/scripts/launch.sh"

# Runs the launcher with prefix $1 that must be refused: exit 2 and a message naming
# the variable, within the deadline (a launcher that starts instead is stopped).
expect_refused() {
    MM3_SHM_PREFIX=$1 bash "$launcher" "$d/deploy.yaml" > "$d/out.bad" 2> "$d/err.bad" &
    p=$!
    end=$(($(date +%s) + deadline_s))
    while kill -0 $p 2>/dev/null; do
        if grep -q '^READY ' "$d/out.bad" 2>/dev/null || [ "$(date +%s)" -ge "$end" ]; then
            kill -TERM $p
            wait $p
            fail "prefix '$1': the launcher started instead of refusing"
        fi
        sleep 0.05
    done
    wait $p
    rc=$?
    test $rc -eq 2 || fail "prefix '$1': expected exit 2, got $rc"
    grep -q "MM3_SHM_PREFIX" "$d/err.bad" || fail "prefix '$1': no message naming MM3_SHM_PREFIX"
}

# 1. prefixes that leave /dev/shm, or are not one name part
mkdir -p "$d/victim" && : > "$d/victim/x-s0_to_s1" && : > "$d/victim/x-s1_to_s0"
expect_refused "../..$d/victim/x-"
test -e "$d/victim/x-s0_to_s1" && test -e "$d/victim/x-s1_to_s0" || fail "a file outside /dev/shm was deleted"
expect_refused "../../tmp/x-"
expect_refused ".."
expect_refused "a b"
test ! -e "$d/ids" || fail "a stage was started for a refused prefix"

# 2. one replica per prefix
P="grd$$-"
export MM3_SHM_PREFIX=$P
bash "$launcher" "$d/deploy.yaml" > "$d/out.a" 2> "$d/err.a" &
a=$!
wait_for "READY line of the first launcher" grep -q "^READY " "$d/out.a"
wait_for "both segments of the first replica" test "$(ls /dev/shm | grep -c "^$P")" -eq 2
bash "$launcher" "$d/deploy.yaml" > "$d/out.b" 2> "$d/err.b"
rc=$?
test $rc -eq 2 || { kill -TERM $a; fail "second launcher: expected exit 2, got $rc"; }
grep -q "another replica with MM3_SHM_PREFIX '$P' is running (launcher pid $a," "$d/err.b" ||
    { kill -TERM $a; fail "second launcher: no message naming the running replica"; }
test "$(ls /dev/shm | grep -c "^$P")" -eq 2 || { kill -TERM $a; fail "the running replica's segments were removed"; }
test "$(wc -l < "$d/ids")" -eq 2 || { kill -TERM $a; fail "the second launcher started a stage"; }
kill -0 $a || fail "the first launcher died"
kill -TERM $a
wait $a
rc=$?
test $rc -eq 0 || fail "first launcher: SIGTERM: expected exit 0, got $rc"
ls /dev/shm | grep -q "^$P" && fail "segment left after SIGTERM"

# 3. run ids: one per launch, the same for both stages, 32 hex digits
bash "$launcher" "$d/deploy.yaml" > "$d/out.c" 2> "$d/err.c" &
c=$!
wait_for "READY line of the third launcher" grep -q "^READY " "$d/out.c"
wait_for "the third launch's stages" test "$(wc -l < "$d/ids")" -eq 4
kill -TERM $c
wait $c
test "$(grep -cE '^stage[01] [0-9a-f]{32} [0-9a-f]{32}$' "$d/ids")" -eq 4 || fail "run id or token is not 32 hex digits"
test "$(sed -n '1,2p' "$d/ids" | cut -d' ' -f2,3 | sort -u | wc -l)" -eq 1 || fail "the stages got different ids"
test "$(cut -d' ' -f2 "$d/ids" | sort -u | wc -l)" -eq 2 || fail "two launches got the same run id"
test "$(cut -d' ' -f3 "$d/ids" | sort -u | wc -l)" -eq 2 || fail "two launches got the same token"
ls /dev/shm | grep -q "^$P" && fail "segment left after the third launch"
rm -rf "$d"
exit 0
