#!/usr/bin/env bash
# Stage 1 slower than stage 0 (backpressure): stage 1 runs 8 Euler steps per window
# and one request at a time, stage 0 produces frames for 4 songs at once. 6 streamed
# songs of one seed are sent together. Checks: every song completes and equals, byte
# for byte, the same song made alone (no chunk dropped or repeated, right length);
# queue depth sampled on /health never exceeds api.max_queue_depth; stage 0's RSS
# (sampled every 0.2 s) stays within 20 % (+8 MiB) of its level after the lone song.
# Usage: slow_stage1.sh SOURCE_DIR BIN_DIR CKPT_DIR TMP_DIR
src=$1 bin=$2 ckpt=$3 tmp=$4
d="$tmp/fault_slow_stage1.$$"
. "$src/test/load/lib.sh"
skip_unless_ready
rm -rf "$d" && mkdir -p "$d" || exit 1
trap cleanup_replica EXIT
start_watchdog ${MM3_TEST_WATCHDOG_S:-100}
export MM3_SHM_PREFIX="fs$$-"
write_deploy "$d/deploy.yaml" 8 8 8 1
start_replica "$d/deploy.yaml"

song() { # song OUT
    "$bin/mm3" generate --url "$url" --caption "a slow ambient drone" --lyrics "[verse]
breathe in slowly" --duration 2 --seed 11 --steps 8 --quiet -o "$1"
}
song "$d/alone.wav" 2> "$d/alone.err" || { cat "$d/alone.err"; fail "the lone song failed"; }
base=$(rss_kb "$s0")
for i in 1 2 3 4 5 6; do
    song "$d/song$i.wav" 2> "$d/song$i.err" &
    eval "c$i=\$!"
done
max=$base maxq=0
while :; do
    busy=0
    for i in 1 2 3 4 5 6; do eval "kill -0 \$c$i 2>/dev/null" && busy=1; done
    [ $busy = 1 ] || break
    r=$(rss_kb "$s0"); [ "$r" -gt "$max" ] && max=$r
    q=$(gauge queue_depth); [ "$q" -gt "$maxq" ] && maxq=$q
    sleep 0.2
done
for i in 1 2 3 4 5 6; do
    eval "wait \$c$i" || { cat "$d/song$i.err"; fail "song $i failed"; }
    cmp -s "$d/alone.wav" "$d/song$i.wav" || fail "song $i differs from the lone song ($(stat -c %s "$d/song$i.wav") vs $(stat -c %s "$d/alone.wav") bytes)"
done
echo "stage 0 RSS $base -> max $max kB; max queue depth $maxq; song $(stat -c %s "$d/alone.wav") bytes"
[ "$maxq" -le 8 ] || fail "queue depth $maxq over max_queue_depth 8"
[ $((max * 100)) -lt $((base * 120 + 819200)) ] || fail "stage 0 RSS grew $base -> $max kB"
kill -0 "$s0" && kill -0 "$s1" || fail "a stage died"
wait_idle 20 || fail "not idle after the songs"
stop_replica
rm -rf "$d"
exit 0
