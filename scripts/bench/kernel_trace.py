#!/usr/bin/env python3
"""What each kernel adds to a CUDA graph replay: the CSV of tools/kernel_trace
(scripts/device-stage0.sh TRACE=1).

    kernel_trace.py trace1.csv [--seq] [--top N] [--replay K]

The trace holds every kernel as it ran (CUPTI), graph nodes included, with programmatic
dependent launch overlapping neighbours. For each graph replayed at least twice, the
last replay (or the K-th from the end) is read in start order: a kernel "adds" the time
from the latest end before it to its own end (what the replay would lose without it if
the chain is serial), its "overlap" is how long it ran before that end (negative gap).
Prints per graph one row per kernel kind (demangled name with template arguments, grid):
launches, microseconds added and run; with --seq every kernel in order.
"""
import argparse
import shutil
import subprocess
import sys

from ncu_step import kernel_kind


def demangle(names):
    """{mangled: demangled} through c++filt where it exists, else the names as they are."""
    names = sorted(set(names))
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=False).stdout
    lines = out.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def read_trace(path):
    """[(start_ns, end_ns, graph, node, grid, name)]; ValueError naming the file and line if malformed."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            parts = line.rstrip("\n").split(",", 6)
            if len(parts) != 7:
                raise ValueError(f"{path}:{i}: expected start,end,graph,node,stream,grid,name")
            try:
                rows.append((int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[5], parts[6]))
            except ValueError:
                raise ValueError(f"{path}:{i}: start, end, graph and node must be integers") from None
    if not rows:
        raise ValueError(f"{path}: no kernel (a trace of tools/kernel_trace expected)")
    names = demangle(r[5] for r in rows)
    return [(s, e, g, n, grid, kernel_kind(names[name])) for s, e, g, n, grid, name in rows]


def replays(rows):
    """{graph: [replay, ...]} in time order, each replay [(start, end, node, grid, kind)] by start;
    a replay is one run of the graph's distinct nodes."""
    by_graph = {}
    for s, e, g, n, grid, kind in rows:
        if g:
            by_graph.setdefault(g, []).append((s, e, n, grid, kind))
    out = {}
    for g, recs in by_graph.items():
        recs.sort()
        size = len({r[2] for r in recs})
        out[g] = [recs[i:i + size] for i in range(0, len(recs) - size + 1, size)]
    return out


def contributions(replay):
    """[(kind, grid, run_us, added_us, overlap_us)] in start order: added is how far the kernel
    moves the latest end so far (idle before it included), overlap how long it ran before it."""
    out, latest = [], None
    for s, e, _, grid, kind in replay:
        added = e - s if latest is None else max(0, e - latest)
        overlap = 0 if latest is None else max(0, min(latest, e) - s)
        out.append((kind, grid, (e - s) / 1e3, added / 1e3, overlap / 1e3))
        latest = e if latest is None else max(latest, e)
    return out


def summarize(contrib):
    """[(kind, grid, launches, added_us, run_us)], most added first."""
    groups = {}
    for kind, grid, run, added, _ in contrib:
        n, a, r = groups.get((kind, grid), (0, 0.0, 0.0))
        groups[(kind, grid)] = (n + 1, a + added, r + run)
    return sorted(((k, g, n, a, r) for (k, g), (n, a, r) in groups.items()), key=lambda x: -x[3])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--seq", action="store_true", help="every kernel of the replay in order")
    ap.add_argument("--top", type=int, default=0, help="only the N kinds that add most")
    ap.add_argument("--replay", type=int, default=1, help="the K-th replay from the end (1 = last)")
    a = ap.parse_args(argv)
    try:
        reps = replays(read_trace(a.csv))
    except (OSError, ValueError) as e:
        print(f"kernel_trace: {e}", file=sys.stderr)
        return 1
    shown = 0
    for g, rs in sorted(reps.items(), key=lambda kv: kv[1][-1][0][0]):
        if len(rs) < 2 or len(rs) < a.replay:
            continue
        rep = rs[-a.replay]
        contrib = contributions(rep)
        span = (max(r[1] for r in rep) - rep[0][0]) / 1e3
        print(f"\n## graph {g}: replay {len(rs) - a.replay + 1} of {len(rs)}, {len(rep)} kernels, {span:.1f} us "
              f"first start to last end, {sum(c[2] for c in contrib):.1f} us of kernels run")
        if a.seq:
            print("| # | kernel | grid | run us | adds us | overlap us |\n|---|---|---|---|---|---|")
            for i, (kind, grid, run, added, ov) in enumerate(contrib):
                print(f"| {i} | {kind} | {grid} | {run:.1f} | {added:.1f} | {ov:.1f} |")
        else:
            rows = summarize(contrib)
            if a.top > 0:
                rows = rows[: a.top]
            print("| kernel | grid | launches | adds us | adds each | runs us each | share |\n|---|---|---|---|---|---|---|")
            for kind, grid, n, added, run in rows:
                print(f"| {kind} | {grid} | {n} | {added:.1f} | {added / n:.2f} | {run / n:.2f} | "
                      f"{100 * added / span:.1f}% |")
        shown += 1
    if not shown:
        print("kernel_trace: no graph was replayed twice", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
