#!/usr/bin/env bash
# Unwritable output and a full disk for the mm3 client, against a live replica:
#   - -o /dev/full/x.wav (a path under a file) and -o into a folder it cannot write:
#     exit 1 with a message naming the path, nothing created;
#   - the disk filling up mid-song (RLIMIT_FSIZE of 64 KiB with SIGXFSZ ignored, so
#     writes fail with EFBIG like ENOSPC): exit 1, no OUT and no OUT.part left, the
#     server cancels the song and frees its rows, and the next song works.
# Usage: client_output.sh SOURCE_DIR BIN_DIR CKPT_DIR TMP_DIR
src=$1 bin=$2 ckpt=$3 tmp=$4
d="$tmp/fault_client_output.$$"
. "$src/test/load/lib.sh"
skip_unless_ready
rm -rf "$d" && mkdir -p "$d" || exit 1
trap cleanup_replica EXIT
start_watchdog ${MM3_TEST_WATCHDOG_S:-100}
export MM3_SHM_PREFIX="fo$$-"
write_deploy "$d/deploy.yaml" 4 2 4 2
start_replica "$d/deploy.yaml"
song() { # song OUT SECONDS
    "$bin/mm3" generate --url "$url" --caption "a quiet folk song" --lyrics "[verse]
no room left" --duration "$2" --seed 9 --steps 2 --quiet -o "$1"
}
expect_exit1() { # expect_exit1 WHAT OUT STATUS [named]: stderr is in $d/err
    [ "$3" -eq 1 ] || { cat "$d/err"; fail "$1: exit $3, expected 1"; }
    grep -q . "$d/err" || fail "$1: no message"
    [ "${4:-}" = named ] && ! grep -q "$2" "$d/err" && { cat "$d/err"; fail "$1: the message does not name $2"; }
    [ -e "$2" ] || [ -e "$2.part" ] && fail "$1: a file was left at $2"
    echo "$1: $(head -n 1 "$d/err")"
}

song /dev/full/x.wav 2 2> "$d/err"; expect_exit1 "under /dev/full" /dev/full/x.wav $? named

if [ "$(id -u)" = 0 ]; then
    ro=/proc # root writes through permission bits; /proc refuses new files to anyone
else
    ro="$d/ro"; mkdir "$ro" && chmod 0555 "$ro"
fi
song "$ro/x$$.wav" 2 2> "$d/err"; expect_exit1 "read-only folder" "$ro/x$$.wav" $? named

# The client's message for a failed write does not name the file yet (reported), so
# only the status and the cleanup are checked here.
(ulimit -f 64; trap '' XFSZ; song "$d/big.wav" 8) 2> "$d/err"; expect_exit1 "disk full" "$d/big.wav" $?
wait_idle 20 || fail "the abandoned song still holds rows: active_rows $(gauge active_rows)"
song "$d/ok.wav" 2 2> "$d/err" || { cat "$d/err"; fail "a song after the faults failed"; }
[ "$(stat -c %s "$d/ok.wav")" -gt 44 ] || fail "empty song after the faults"
stop_replica
rm -rf "$d"
exit 0
