#!/usr/bin/env bash
# Whether a change left the GPU kernels' machine code alone: every .cu file that differs
# between two commits is compiled at both (sm_90a cubin, the build's flags that shape
# device code) and the code of each kernel (the cubin's .text sections, names with the
# anonymous-namespace hashes removed) is compared byte for byte. Needs nvcc, no GPU.
# A host-side refactor (parameter structs, launchers) should report every file identical.
# Usage: scripts/kernel-code-diff.sh BASE [HEAD]   (HEAD: the working tree when omitted)
# Exit 0 when every kernel is identical, 1 naming the files and kernels that differ.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/kernel-code-diff.sh BASE [HEAD]}
head=${2:-}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ARCH=${ARCH:-90a}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/a" "$tmp/b"
git archive "$base" | tar -x -C "$tmp/a"
if [ -n "$head" ]; then
  git archive "$head" | tar -x -C "$tmp/b"
  files=$(git diff --name-only "$base" "$head" -- '*.cu' '*.cuh' '*.h')
else
  git ls-files -z | xargs -0 tar -cf - | tar -x -C "$tmp/b"
  files=$(git diff --name-only "$base" -- '*.cu' '*.cuh' '*.h')
fi
# a changed header may reach any .cu: compare them all then (slow: every file twice)
if echo "$files" | grep -qv '\.cu$'; then
  cus=$(cd "$tmp/b" && find common stage0 stage1 -name '*.cu' | sort)
else
  cus=$(echo "$files" | grep '\.cu$' | grep -v '^tools/' || true)
fi
[ -n "$cus" ] || { echo "no CUDA sources differ"; exit 0; }

cubin() { # root file out
  "$NVCC" -DMM3_HAVE_CUDA=1 -D_GNU_SOURCE -I"$1" -O2 -DNDEBUG -std=c++17 \
    --generate-code=arch=compute_$ARCH,code=sm_$ARCH -x cu -cubin "$1/$2" -o "$3"
}

status=0
for f in $cus; do
  [ -f "$tmp/a/$f" ] && [ -f "$tmp/b/$f" ] || { echo "$f: only on one side"; continue; }
  cubin "$tmp/a" "$f" "$tmp/a.cubin" && cubin "$tmp/b" "$f" "$tmp/b.cubin" || { echo "$f: does not compile"; status=1; continue; }
  python3 - "$f" "$tmp/a.cubin" "$tmp/b.cubin" <<'EOF' || status=1
import re, struct, sys

def kernels(path):
    """name -> machine code of every .text.* section of an ELF64 cubin"""
    d = open(path, 'rb').read()
    shoff, = struct.unpack_from('<Q', d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', d, 0x3A)
    hdrs = [struct.unpack_from('<IIQQQQIIQQ', d, shoff + i * shentsize) for i in range(shnum)]
    names = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name = d[names + h[0]:d.index(b'\0', names + h[0])].decode()
        if name.startswith('.text.'):
            name = re.sub(r'_INTERNAL_[0-9a-f]+_', '_INTERNAL_', name)
            name = re.sub(r'_GLOBAL__N__[0-9a-f]+_([0-9]+_\w+?_cu)_[0-9a-f]+', r'_GLOBAL__N_\1', name)
            out[name] = d[h[4]:h[4] + h[5]]
    return out

f, a, b = sys.argv[1], kernels(sys.argv[2]), kernels(sys.argv[3])
differ = sorted(set(a) ^ set(b)) + sorted(k for k in a if k in b and a[k] != b[k])
print(f"{f}: {len(b)} kernels, " + ("identical" if not differ else "DIFFER: " + " ".join(differ)))
sys.exit(1 if differ else 0)
EOF
done
exit $status
