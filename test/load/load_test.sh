#!/usr/bin/env bash
# Bounded load on loopback (tiny checkpoint, CPU): scripts/launch.sh starts a replica
# whose queue holds 2 songs (so 503s happen), mm3-load runs 8 clients with a mix of
# valid, invalid and abandoned requests, first a short warm-up pass, then the
# measured pass. Before and after the measured pass: RSS and open fds of both
# stages, /dev/shm segments of the prefix, queue depth and active rows. Checks: both
# stages alive, queue and rows back to 0, fds equal (+-2), RSS growth < 20 % (+4 MiB
# for page granularity), segments unchanged, mm3-load saw no failure nor unexpected
# status, songs completed, 400s and 503s came; then SIGTERM leaves no segment.
# Usage: load_test.sh SOURCE_DIR BIN_DIR CKPT_DIR TMP_DIR [SECONDS]
src=$1 bin=$2 ckpt=$3 tmp=$4 secs=${5:-20}
d="$tmp/load_test.$$"
. "$src/test/load/lib.sh"
skip_unless_ready
rm -rf "$d" && mkdir -p "$d" || exit 1
trap cleanup_replica EXIT
start_watchdog ${MM3_TEST_WATCHDOG_S:-150}
export MM3_SHM_PREFIX="ld$$-"
write_deploy "$d/deploy.yaml" 2 2 4 2
start_replica "$d/deploy.yaml"

"$bin/mm3-load" --url "$url" --clients 8 --seconds 4 --mix 5:3:2 > "$d/warmup.txt" 2> "$d/warmup.err" ||
    { cat "$d/warmup.txt"; head -n 20 "$d/warmup.err" >&2; fail "mm3-load warm-up pass"; }
wait_idle 20 || fail "not idle after the warm-up pass"

rss0_a=$(rss_kb "$s0") rss1_a=$(rss_kb "$s1") fd0_a=$(fd_count "$s0") fd1_a=$(fd_count "$s1") seg_a=$(segments)
[ "$seg_a" -eq 2 ] || fail "expected the 2 channel segments, found $seg_a"

"$bin/mm3-load" --url "$url" --clients 8 --seconds "$secs" --mix 5:3:2 > "$d/load.txt" 2> "$d/load.err"
rc=$?
cat "$d/load.txt"
[ $rc -eq 0 ] || { head -n 20 "$d/load.err" >&2; fail "mm3-load exited $rc"; }
kill -0 "$s0" 2>/dev/null || fail "stage 0 died under load"
kill -0 "$s1" 2>/dev/null || fail "stage 1 died under load"
[ "$(cat "$d/run/stage1.pid")" = "$s1" ] || fail "stage 1 was restarted under load"
wait_idle 20 || fail "queue_depth $(gauge queue_depth), active_rows $(gauge active_rows) 20 s after the load"

count() { awk -v k="$1" '$1 == k {print $2}' "$d/load.txt"; }
[ "$(count completed)" -gt 0 ] || fail "no song completed"
[ "$(count bad)" -gt 0 ] || fail "no invalid request answered 400"
# Abandoned streams need a free queue slot: on an overloaded machine every one of
# them may be rejected, so only their being sent is required here (test_e2e checks
# that a disconnect cancels the song in both stages).
grep -q "abandon 0)" "$d/load.txt" && fail "no abandoned request was sent"
[ "$(count abandoned)" -gt 0 ] || echo "note: every abandoned request was rejected (overloaded machine)"
[ "$(count rejected)" -gt 0 ] || fail "no 503 with 8 clients and a queue of 2"

# Let the server's per-connection threads and sockets wind down.
sleep 1
rss0_b=$(rss_kb "$s0") rss1_b=$(rss_kb "$s1") fd0_b=$(fd_count "$s0") fd1_b=$(fd_count "$s1") seg_b=$(segments)
echo "stage 0: rss ${rss0_a} -> ${rss0_b} kB, fds ${fd0_a} -> ${fd0_b}"
echo "stage 1: rss ${rss1_a} -> ${rss1_b} kB, fds ${fd1_a} -> ${fd1_b}"
echo "segments: ${seg_a} -> ${seg_b}"
[ "$seg_b" -eq "$seg_a" ] || fail "segments ${seg_a} -> ${seg_b}"
for s in "0 $fd0_a $fd0_b" "1 $fd1_a $fd1_b"; do
    set -- $s
    [ $(($3 - $2)) -le 2 ] && [ $(($2 - $3)) -le 2 ] || fail "stage $1 fds $2 -> $3"
done
for s in "0 $rss0_a $rss0_b" "1 $rss1_a $rss1_b"; do
    set -- $s
    [ $(($3 * 100)) -lt $(($2 * 120 + 409600)) ] || fail "stage $1 RSS grew $2 -> $3 kB"
done
stop_replica
rm -rf "$d"
exit 0
