#!/usr/bin/env bash
# The include graph keeps its layers: no module (a .c and its .h) is in an
# include cycle anywhere in the tree; the source folders only include the folders
# below them in LAYERS (common/ < shmconn/ < pipe/ < the two stages, which share
# only what lies below them); and inside stage0/ the rooms below the core loop
# (api/, recovery/, text/, model/ with its cuda/) never include the core loop at
# the root, and only include the rooms listed after them in ROOMS.
# Usage: scripts/check-layers.sh [repo root]; exit 0 when clean, 1 naming the
# offending includes.
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
ROOMS="recovery api text model" # top to bottom
LAYERS="common shmconn pipe stage0|stage1" # bottom to top; tools/ and test/ stand above them all
layer() { # rank of the folder a path starts with; -1 for a folder outside LAYERS
  local i=0 l top=${1%%/*}
  for l in $LAYERS; do case "|$l|" in *"|$top|"*) echo $i; return ;; esac; i=$((i + 1)); done
  echo -1
}
rank() { local i=0 r; for r in $ROOMS; do [ "$r" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo -1; }
room() { # stage0/<room>/... -> room; stage0/x.c -> root
  local rest=${1#stage0/}
  case "$rest" in */*) echo "${rest%%/*}" ;; *) echo root ;; esac
}
bad=0 edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for f in $(git ls-files '*.c' '*.h' '*.cu' '*.cuh'); do
  from=${f%.*}
  for inc in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
    to=${inc%.*}
    # A private header of the same folder that extends this file's own header
    # (x.c including x_region.h or y_internal.h, which include x.h) is one
    # module with it, not a cycle.
    case "$to" in "$from"_* | "$(dirname "$from")"/*_internal)
      [ "$(dirname "$to")" = "$(dirname "$from")" ] && [ -f "$inc" ] &&
        grep -q "^#include \"$from\.h\"" "$inc" && continue ;;
    esac
    [ "$to" != "$from" ] && echo "$from $to" >>"$edges"
    lf=$(layer "$f") li=$(layer "$inc")
    if [ "$lf" -ge 0 ] && [ "$li" -ge 0 ] && [ "${f%%/*}" != "${inc%%/*}" ] && [ "$li" -ge "$lf" ]; then
      echo "check-layers: $f includes $inc: ${f%%/*}/ may only include the folders below it (bottom to top: $LAYERS)" >&2; bad=1
    fi
    case "$f" in stage0/*) ;; *) continue ;; esac
    case "$inc" in stage0/*) ;; *) continue ;; esac
    rf=$(room "$f") ri=$(room "$inc")
    [ "$rf" = root ] || [ "$rf" = "$ri" ] && continue
    if [ "$ri" = root ]; then
      echo "check-layers: $f includes $inc: a room includes the core loop above it" >&2; bad=1
    elif [ "$(rank "$ri")" -le "$(rank "$rf")" ]; then
      echo "check-layers: $f includes $inc: room $rf may only include rooms below it ($ROOMS)" >&2; bad=1
    fi
  done
done
if ! tsort "$edges" >/dev/null 2>"$edges.loop"; then
  echo "check-layers: modules in an include cycle:" >&2
  grep -v 'input contains a loop' "$edges.loop" | sed 's/^tsort: /  /' >&2
  bad=1
fi
rm -f "$edges.loop"
exit $bad
