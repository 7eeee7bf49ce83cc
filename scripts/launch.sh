#!/usr/bin/env bash
# Start one mm3 replica (stage 1, then stage 0) from a deploy file and supervise it.
#
#   scripts/launch.sh DEPLOY.yaml [--model DIR] [--port N] [--mps]
#
# MPS: the deploy file's `mps: off|auto|on` (read with mm3-deploy --launch-env) says whether
# both stages run under a private CUDA Multi-Process Service daemon (nvidia-cuda-mps-control
# -d, pipe and log folders in the run folder, stopped at exit); --mps or MM3_MPS=1 means `on`,
# MM3_MPS=0 means `off`, whatever the file says. Two processes on one GPU otherwise
# time-slice: their kernels never run at the same time, so stage 0's decode steps wait
# behind stage 1's DiT (docs/operations.md, "Both stages on one GPU"). Under MPS each
# stage's `mps_thread_percentage` becomes its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE.
# `auto` and `on` first check that the daemon can serve the GPU: the control program is
# on PATH, the GPU is neither in MIG mode nor compute-prohibited, the daemon starts and a
# server comes up (the last check is skipped with MM3_MPS_PROBE=0). Where one fails, `auto`
# logs one line "MPS unavailable (...)" and starts the stages without MPS; `on` exits 2.
#
# Prints "READY http://HOST:PORT" on stdout once both stages are ready (their logs go
# to stderr). Supervision (docs/operations.md, "The launcher"):
#   - stage 1 dies: its in-flight requests fail in stage 0 (which stays up and says
#     "stage1 down" on /health); stage 1 is restarted after a back-off of 1, 2, 4, ...
#     up to 10 s, at most MM3_STAGE1_MAX_RESTARTS times (default 5) per 60 s; beyond
#     that the launcher stops stage 0 and exits 1.
#   - several stage-1 workers (stage 1's `devices: "1,2,3"` or `replicas: N`, read with
#     mm3-deploy --launch-env): the launcher starts one mm3-stage1 per worker with
#     MM3_STAGE1_WORKER=k (its own channels and device), pid and ready files stage1.pid,
#     stage1.ready for worker 0 and stage1-k.pid, stage1-k.ready for worker k; each is
#     supervised and restarted on its own as above, while stage 0 re-sends a dead
#     worker's journaled songs to a live one.
#   - stage 0 dies: stage 1 is stopped and the launcher exits 1 (the operator's
#     supervisor restarts the pair).
#   - SIGINT / SIGTERM: forwarded to stage 0, which drains (api.drain_timeout_s) and
#     exits, then to stage 1; the launcher exits 0 and leaves no /dev/shm segment of its run.
# Segments (docs/operations.md, "Shared memory"): the launcher gives both stages a
# fresh random run id (part of every segment name, so no other user can take the names
# first) and run token (each stage refuses a segment without it), as MM3_RUN_ID and
# MM3_RUN_TOKEN. It holds an exclusive lock on <lock dir>/<prefix>lock for the replica's
# life (the stages inherit it): a second launcher with the same prefix refuses to start
# (exit 2) and removes nothing.
# Environment: MM3_BIN_DIR (default <repo>/build/bin), MM3_SHM_PREFIX (default mm3-;
# 1-31 characters of [A-Za-z0-9._-], no ".."), MM3_LAUNCH_TIMEOUT_S (start-up limit,
# default 300), MM3_STAGE1_MAX_RESTARTS, MM3_RUN_DIR (where the launcher keeps ready
# files and stageN.pid; default a fresh temporary folder, removed at exit),
# MM3_LOCK_DIR (default $XDG_RUNTIME_DIR/mm3, else /tmp/mm3-locks-<uid>; created 0700,
# refused unless it is ours and private), MM3_MPS, MM3_MPS_PROBE.
set -u

usage() { echo "usage: launch.sh DEPLOY.yaml [--model DIR] [--port N] [--mps]" >&2; }
log() { echo "launch: $*" >&2; }

[ $# -ge 1 ] || { usage; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
deploy=$1
shift
[ -r "$deploy" ] || { log "deploy file $deploy: cannot read it"; exit 2; }
model_args=()
port_args=()
case "${MM3_MPS:-}" in
    1) mps=on ;;
    0) mps=off ;;
    "") mps="" ;;
    *) log "MM3_MPS=$MM3_MPS: expected 0 or 1"; exit 2 ;;
esac
while [ $# -gt 0 ]; do
    case "$1" in
        --model) [ $# -ge 2 ] || { usage; exit 2; }; model_args=(--model "$2"); shift 2 ;;
        --port) [ $# -ge 2 ] || { usage; exit 2; }; port_args=(--port "$2"); shift 2 ;;
        --mps) mps=on; shift ;;
        *) log "unknown option $1"; usage; exit 2 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${MM3_BIN_DIR:-$root/build/bin}
for p in mm3-stage0 mm3-stage1; do
    [ -x "$bin/$p" ] || { log "$bin/$p not found: build first or set MM3_BIN_DIR"; exit 2; }
done
# What the launcher applies from the deploy file (mm3-deploy validates it first).
backend=auto
deploy_mps=off
stage0_device=0
stage0_pct=0
stage1_pct=0
stage1_workers=1
if [ -x "$bin/mm3-deploy" ]; then
    launch_env=$("$bin/mm3-deploy" --launch-env "$deploy") || { log "deploy file $deploy: refused (see above)"; exit 2; }
    while read -r k v; do
        case "$k" in
            backend) backend=$v ;;
            mps) deploy_mps=$v ;;
            stage0_device) stage0_device=$v ;;
            stage0_mps_thread_percentage) stage0_pct=$v ;;
            stage1_mps_thread_percentage) stage1_pct=$v ;;
            stage1_workers) stage1_workers=$v ;;
        esac
    done <<< "$launch_env"
else
    log "$bin/mm3-deploy not found: the deploy file's mps keys are not applied (MPS only with --mps)"
fi
[ -n "$mps" ] || mps=$deploy_mps
export MM3_SHM_PREFIX=${MM3_SHM_PREFIX:-mm3-}
# The prefix becomes part of /dev/shm and lock file paths: one plain file name part only.
if ! [[ $MM3_SHM_PREFIX =~ ^[A-Za-z0-9._-]{1,31}$ ]] || [[ $MM3_SHM_PREFIX == *..* ]]; then
    log "MM3_SHM_PREFIX '$MM3_SHM_PREFIX': expected 1-31 characters of [A-Za-z0-9._-] without '..'"
    exit 2
fi
# 128 random bits each: the run id goes into the segment names, the token into their headers.
random_hex() { od -An -tx1 -N16 /dev/urandom | tr -d ' \n'; }
MM3_RUN_ID=$(random_hex) && MM3_RUN_TOKEN=$(random_hex) || { log "cannot read /dev/urandom"; exit 2; }
[ ${#MM3_RUN_ID} -eq 32 ] && [ ${#MM3_RUN_TOKEN} -eq 32 ] || { log "cannot read /dev/urandom"; exit 2; }
export MM3_RUN_ID MM3_RUN_TOKEN

# One replica per prefix: an exclusive lock in a private folder, held (by this shell
# and, inherited, by both stages) for the replica's life.
uid=$(id -u)
if [ -n "${MM3_LOCK_DIR:-}" ]; then
    lock_dir=$MM3_LOCK_DIR
elif [ -n "${XDG_RUNTIME_DIR:-}" ] && [ -d "$XDG_RUNTIME_DIR" ]; then
    lock_dir=$XDG_RUNTIME_DIR/mm3
else
    lock_dir=/tmp/mm3-locks-$uid
fi
mkdir -p -m 0700 "$lock_dir" 2>/dev/null
if [ -L "$lock_dir" ] || [ ! -d "$lock_dir" ] || [ "$(stat -c '%u %a' "$lock_dir")" != "$uid 700" ]; then
    log "lock folder $lock_dir: expected a directory of uid $uid with mode 0700 (set MM3_LOCK_DIR)"
    exit 2
fi
lock_file=$lock_dir/${MM3_SHM_PREFIX}lock
exec {lock_fd}<>"$lock_file" || { log "cannot open the lock file $lock_file"; exit 2; }
if ! flock -n "$lock_fd"; then
    holder=$(head -c 32 "$lock_file" 2>/dev/null | tr -cd '0-9')
    log "another replica with MM3_SHM_PREFIX '$MM3_SHM_PREFIX' is running (launcher pid ${holder:-unknown}," \
        "lock $lock_file): refusing to start; stop it first or set another MM3_SHM_PREFIX"
    exit 2
fi
echo $$ > "$lock_file"
timeout_s=${MM3_LAUNCH_TIMEOUT_S:-300}
max_restarts=${MM3_STAGE1_MAX_RESTARTS:-5}
if [ -n "${MM3_RUN_DIR:-}" ]; then
    run=$MM3_RUN_DIR
    mkdir -p "$run" || exit 2
    own_run=0
else
    run=$(mktemp -d "${TMPDIR:-/tmp}/mm3-launch.XXXXXX") || exit 2
    own_run=1
fi

s0=0
# Stage-1 worker k: its pid (0 = not running) and the times of its recent restarts.
s1=()
s1_restarts=()
for ((k = 0; k < stage1_workers; k++)); do s1[k]=0; s1_restarts[k]=""; done
stopping=0
mps_up=0

# A private MPS daemon for this replica: its pipe folder is what the stages' CUDA
# runtime finds through CUDA_MPS_PIPE_DIRECTORY. On failure mps_why says why (one line)
# and nothing of the daemon is left running or exported.
mps_why=""
start_mps() {
    command -v nvidia-cuda-mps-control >/dev/null 2>&1 || {
        mps_why="nvidia-cuda-mps-control not found (it comes with the NVIDIA driver utilities)"
        return 1
    }
    local q t
    if command -v nvidia-smi >/dev/null 2>&1 &&
        q=$(nvidia-smi -i "$stage0_device" --query-gpu=compute_mode,mig.mode.current --format=csv,noheader 2>/dev/null); then
        case "$q" in
            *Prohibited*) mps_why="GPU $stage0_device is in compute mode Prohibited"; return 1 ;;
            *", Enabled"*) mps_why="GPU $stage0_device is in MIG mode"; return 1 ;;
        esac
    fi
    export CUDA_MPS_PIPE_DIRECTORY=$run/mps-pipe CUDA_MPS_LOG_DIRECTORY=$run/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" || { mps_why="cannot make $run/mps-*"; unset_mps; return 1; }
    nvidia-cuda-mps-control -d {lock_fd}>&- || {
        mps_why="nvidia-cuda-mps-control -d failed (see $CUDA_MPS_LOG_DIRECTORY)"
        unset_mps
        return 1
    }
    mps_up=1
    if [ "${MM3_MPS_PROBE:-1}" != 0 ]; then
        # The daemon starts its server at the first client; starting it now shows whether
        # it can own the GPU (exclusive use by another process, MIG, a driver mismatch).
        echo "start_server -uid $(id -u)" | nvidia-cuda-mps-control >/dev/null 2>&1
        for t in $(seq 50); do
            [ -n "$(echo get_server_list | nvidia-cuda-mps-control 2>/dev/null)" ] && break
            sleep 0.1
        done
        if [ -z "$(echo get_server_list | nvidia-cuda-mps-control 2>/dev/null)" ]; then
            mps_why="the MPS server did not start within 5 s (see $CUDA_MPS_LOG_DIRECTORY/control.log)"
            stop_mps
            unset_mps
            return 1
        fi
    fi
    log "MPS daemon started (pipe $CUDA_MPS_PIPE_DIRECTORY; thread percentage: stage 0 $(pct_text "$stage0_pct"), stage 1 $(pct_text "$stage1_pct"))"
}

pct_text() { if [ "$1" -gt 0 ]; then echo "$1%"; else echo "no limit"; fi; }

unset_mps() { unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }

stop_mps() {
    [ "$mps_up" = 1 ] || return 0
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || log "MPS: the daemon did not take 'quit'"
    mps_up=0
}

# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P for a stage with a limit, only under MPS.
mps_env() {
    if [ "$mps_up" = 1 ] && [ "$1" -gt 0 ]; then echo "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$1"; fi
}

alive() { [ "$1" -gt 0 ] && kill -0 "$1" 2>/dev/null; }

# Worker k's file name stem in the run folder: stage1 for worker 0, stage1-k after it.
s1_name() { if [ "$1" -eq 0 ]; then echo stage1; else echo "stage1-$1"; fi; }

start_stage1() {
    local k=$1 name
    name=$(s1_name "$k")
    rm -f "$run/$name.ready"
    env MM3_READY_FILE="$run/$name.ready" MM3_STAGE1_WORKER="$k" $(mps_env "$stage1_pct") "$bin/mm3-stage1" \
        --config "$deploy" "${model_args[@]}" >&2 &
    s1[k]=$!
    echo "${s1[k]}" > "$run/$name.pid"
    if [ "$stage1_workers" -gt 1 ]; then
        log "stage-1 worker $k started (pid ${s1[k]})"
    else
        log "stage 1 started (pid ${s1[k]})"
    fi
}

any_s1_alive() {
    local p
    for p in "${s1[@]}"; do alive "$p" && return 0; done
    return 1
}

start_stage0() {
    rm -f "$run/stage0.ready"
    env MM3_READY_FILE="$run/stage0.ready" $(mps_env "$stage0_pct") "$bin/mm3-stage0" --config "$deploy" \
        "${model_args[@]}" "${port_args[@]}" >&2 &
    s0=$!
    echo "$s0" > "$run/stage0.pid"
    log "stage 0 started (pid $s0)"
}

# TERM stage 0 first and let it drain (the songs it lets finish need stage 1), then
# stage 1; whatever still runs 30 s after the first TERM is killed. Remove what a
# killed stage left in /dev/shm.
stop_all() {
    local p t=0
    alive "$s0" && kill -TERM "$s0" 2>/dev/null
    while [ $t -lt 300 ] && alive "$s0"; do
        sleep 0.1
        t=$((t + 1))
    done
    for p in "${s1[@]}"; do alive "$p" && kill -TERM "$p" 2>/dev/null; done
    while [ $t -lt 300 ] && { alive "$s0" || any_s1_alive; }; do
        sleep 0.1
        t=$((t + 1))
    done
    for p in $s0 "${s1[@]}"; do
        if alive "$p"; then
            log "pid $p did not stop within 30 s: killing it"
            kill -KILL "$p" 2>/dev/null
        fi
    done
    wait 2>/dev/null
    # Both stages are gone, so this run's segments are stale (no other run has its id).
    rm -f "/dev/shm/${MM3_SHM_PREFIX}${MM3_RUN_ID}-s0_to_s1" "/dev/shm/${MM3_SHM_PREFIX}${MM3_RUN_ID}-s1_to_s0" \
        "/dev/shm/${MM3_SHM_PREFIX}${MM3_RUN_ID}-s0_to_s1.w"* "/dev/shm/${MM3_SHM_PREFIX}${MM3_RUN_ID}-s1_to_s0.w"*
    stop_mps
    [ "$own_run" = 1 ] && rm -rf "$run"
}

trap 'stopping=1' INT TERM

case "$mps" in
    on)
        start_mps || { log "MPS (mps: on or --mps): $mps_why"; [ "$own_run" = 1 ] && rm -rf "$run"; exit 2; } ;;
    auto)
        if [ "$backend" = cpu ]; then
            log "MPS: off (backend cpu)"
        elif ! start_mps; then
            log "MPS unavailable ($mps_why): starting the stages without it"
        fi ;;
esac
for ((k = 0; k < stage1_workers; k++)); do start_stage1 "$k"; done
start_stage0

# Start-up: both ready files within the limit, or a clear error and cleanup.
deadline=$((SECONDS + timeout_s))
while :; do
    [ "$stopping" = 1 ] && { stop_all; exit 0; }
    ready=1
    [ -s "$run/stage0.ready" ] || ready=0
    for ((k = 0; k < stage1_workers; k++)); do [ -e "$run/$(s1_name "$k").ready" ] || ready=0; done
    [ "$ready" = 1 ] && break
    for ((k = 0; k < stage1_workers; k++)); do
        alive "${s1[k]}" && continue
        wait "${s1[k]}"; rc=$?
        if [ "$stage1_workers" -gt 1 ]; then
            log "stage-1 worker $k exited with status $rc while starting (see its log above)"
        else
            log "stage 1 exited with status $rc while starting (see its log above)"
        fi
        stop_all
        exit 1
    done
    if ! alive "$s0"; then
        wait "$s0"; rc=$?
        log "stage 0 exited with status $rc while starting (see its log above)"
        stop_all
        exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        log "the stages were not ready within ${timeout_s} s (MM3_LAUNCH_TIMEOUT_S)"
        stop_all
        exit 1
    fi
    sleep 0.1
done
url=$(head -n 1 "$run/stage0.ready")
echo "READY $url"
log "API at $url"

while :; do
    if [ "$stopping" = 1 ]; then
        log "stopping both stages"
        stop_all
        exit 0
    fi
    if ! alive "$s0"; then
        wait "$s0" 2>/dev/null; rc=$?
        log "stage 0 died (status $rc): stopping stage 1; the replica must be restarted as a whole"
        s0=0
        stop_all
        exit 1
    fi
    restarted=0
    for ((k = 0; k < stage1_workers; k++)); do
        alive "${s1[k]}" && continue
        wait "${s1[k]}" 2>/dev/null; rc=$?
        now=$SECONDS
        kept=()
        for t in ${s1_restarts[k]}; do [ $((now - t)) -lt 60 ] && kept+=("$t"); done
        if [ "$stage1_workers" -gt 1 ]; then who="stage-1 worker $k"; else who="stage 1"; fi
        if [ "${#kept[@]}" -ge "$max_restarts" ]; then
            log "$who died (status $rc) ${#kept[@]} times within 60 s: giving up, stopping stage 0"
            s1[k]=0
            stop_all
            exit 1
        fi
        backoff=$((1 << ${#kept[@]}))
        [ "$backoff" -gt 10 ] && backoff=10
        if [ "$stage1_workers" -gt 1 ]; then
            log "$who died (status $rc): its journaled songs go to a live worker, the others failed; restarting it in ${backoff} s"
        else
            log "stage 1 died (status $rc): its requests failed; restarting it in ${backoff} s"
        fi
        kept+=("$now")
        s1_restarts[k]="${kept[*]}"
        s1[k]=0
        for t in $(seq $((backoff * 10))); do
            [ "$stopping" = 1 ] && break
            alive "$s0" || break
            sleep 0.1
        done
        [ "$stopping" = 1 ] && break
        alive "$s0" || break
        start_stage1 "$k"
        restarted=1
    done
    [ "$restarted" = 1 ] && continue
    # Wakes on a child's exit or a signal; the timeout keeps the loop honest.
    wait -n 2>/dev/null || sleep 0.1
done
