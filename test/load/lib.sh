# Helpers shared by test/load/*.sh and test/faults/*.sh (bash): start one replica
# with scripts/launch.sh from a deploy file written here, read its pids and gauges.
# The caller sets: src (repository root), bin (programs), ckpt (checkpoint dir),
# d (a fresh work folder). Exit 77 = skipped.

fail() {
    echo "FAIL: $*" >&2
    [ -n "${d:-}" ] && [ -e "$d/watchdog" ] &&
        echo "FAIL: the watchdog stopped the replica after $(cat "$d/watchdog") s (an overloaded machine?)" >&2
    [ -n "${d:-}" ] && [ -f "$d/launch.err" ] && tail -n 40 "$d/launch.err" >&2
    exit 1
}

# skip_unless_ready: the checkpoint and the programs, else exit 77.
skip_unless_ready() {
    [ -f "$ckpt/config.json" ] || [ -d "$ckpt" ] || { echo "skip: no checkpoint at $ckpt"; exit 77; }
    for p in mm3-stage0 mm3-stage1 mm3 mm3-load; do
        [ -x "$bin/$p" ] || { echo "skip: $bin/$p not built"; exit 77; }
    done
}

# write_deploy FILE QUEUE_DEPTH S1_STEPS S0_SEQS S1_SEQS
write_deploy() {
    cat > "$1" <<YAML
pipeline: minimax_music3
async_chunk: true
model: $ckpt
backend: cpu
api:
  host: 127.0.0.1
  port: 0
  max_queue_depth: $2
  max_connections: 64
  max_connections_per_client: 0  # every load client is 127.0.0.1
  request_timeout_s: 120
connectors:
  shm:
    name: SharedMemoryConnector
    extra:
      codec_streaming: true
      connector_get_sleep_s: 0.01
      connector_get_max_wait_first_chunk: 12000
      connector_get_max_wait: 6000
stages:
  - stage_id: 0
    max_num_seqs: $4
    dtype: float32
    max_model_len: 4096
    max_num_batched_tokens: 64
    enforce_eager: true
    output_connectors:
      to_stage_1: shm
    default_sampling_params:
      max_tokens: 4002
  - stage_id: 1
    max_num_seqs: $5
    dtype: float32
    enforce_eager: true
    max_num_batched_tokens: 4
    input_connectors:
      from_stage_0: shm
    matmul_precision: fp32
    num_inference_steps: $3
YAML
}

# start_replica DEPLOY: launcher in the background ($lpid), waits for READY ($url).
# Under ASan a bounded quarantine keeps RSS meaningful.
start_replica() {
    export MM3_SHM_PREFIX=${MM3_SHM_PREFIX:-ld$$-}
    export MM3_RUN_DIR="$d/run" MM3_BIN_DIR="$bin" MM3_LAUNCH_TIMEOUT_S=60
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=16"
    bash "$src/scripts/launch.sh" "$1" > "$d/launch.out" 2> "$d/launch.err" &
    lpid=$!
    mkdir -p "$d/run" && echo "$lpid" > "$d/run/launcher.pid"
    local i=0
    until grep -q '^READY http' "$d/launch.out" 2>/dev/null; do
        kill -0 "$lpid" 2>/dev/null || fail "the launcher exited while starting"
        i=$((i + 1)); [ $i -lt 600 ] || fail "no READY line within 60 s"
        sleep 0.1
    done
    url=$(grep -m1 '^READY http' "$d/launch.out" | cut -d' ' -f2)
    s0=$(cat "$d/run/stage0.pid") s1=$(cat "$d/run/stage1.pid")
}

# stop_replica: SIGTERM to the launcher, exit 0 within 40 s, no segment left.
stop_replica() {
    kill -TERM "$lpid" 2>/dev/null
    local i=0
    while kill -0 "$lpid" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 400 ] || { kill -KILL "$lpid"; fail "the launcher did not stop within 40 s"; }
        sleep 0.1
    done
    wait "$lpid"; local rc=$?
    lpid=
    [ $rc -eq 0 ] || fail "the launcher exited $rc after SIGTERM"
    [ "$(segments)" -eq 0 ] || fail "segments left after SIGTERM: $(ls /dev/shm | grep "^$MM3_SHM_PREFIX")"
    grep -q -e 'Sanitizer' -e 'runtime error:' "$d/launch.err" && fail "sanitizer report in the stages' log"
    return 0
}

# start_watchdog SECONDS: past it, stop the replica through the launcher (which
# removes the segments) so that the test fails cleanly before CTest's timeout kills
# it with SIGKILL, which would leave the stages and their segments behind.
start_watchdog() {
    ( sleep "$1"; echo "$1" > "$d/watchdog"; [ -f "$d/run/launcher.pid" ] && kill -TERM "$(cat "$d/run/launcher.pid")" ) \
        > /dev/null 2>&1 &
    wdog=$!
}

# Kill what is left on any exit (a failed check): no stray stage outlives the test.
cleanup_replica() {
    [ -n "${wdog:-}" ] && kill "$wdog" 2>/dev/null
    if [ -n "${lpid:-}" ]; then
        kill -TERM "$lpid" 2>/dev/null
        sleep 1
        for p in ${s0:-} ${s1:-} $lpid; do kill -KILL "$p" 2>/dev/null; done
        rm -f "/dev/shm/${MM3_SHM_PREFIX}"*  # the test's own prefix: any run id
    fi
}

segments() { ls /dev/shm | grep -c "^$MM3_SHM_PREFIX"; }
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
fd_count() { ls "/proc/$1/fd" | wc -l; }
# gauge NAME: a number from /health ("queue_depth", "active_rows"), -1 if none.
gauge() {
    "$bin/mm3" health --url "$url" 2>/dev/null | grep -o "\"$1\":[0-9]*" | head -n 1 | cut -d: -f2 | grep . || echo -1
}
# wait_idle SECONDS: until queue_depth and active_rows are 0.
wait_idle() {
    local i=0
    while [ "$(gauge queue_depth)" != 0 ] || [ "$(gauge active_rows)" != 0 ]; do
        i=$((i + 1)); [ $i -lt $(($1 * 10)) ] || return 1
        sleep 0.1
    done
}
