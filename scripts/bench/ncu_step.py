#!/usr/bin/env python3
"""Where one decode step's time goes: the ncu CSV of scripts/device-stage0.sh NCU=1.

    ncu_step.py ncu1.csv [--seq] [--top N]

The CSV holds one row per kernel launch of the profiled step (`gpu__time_duration.sum`,
`mm3-bench-stage0 --profile-frame K` under `ncu --profile-from-start off --csv`). Kernels
run one at a time under ncu, so each duration includes its own launch ramp and nothing
overlaps: the sum is an upper bound of the step in a graph.

Prints one row per kernel kind (name with its template arguments, and grid): launches,
total and mean microseconds, share of the sum; with --seq every launch in order instead.
Where the CSV also has `launch__shared_mem_config_size` (NCU_METRICS=gpu__time_duration.sum,
launch__shared_mem_config_size), it adds each kind's L1/shared-memory split and how often the
split changes between consecutive launches (a change may make an SM drain first; see
docs/performance.md, sixteenth session).
"""
import argparse
import csv
import re
import sys

UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def kernel_kind(name):
    """'void gemv_mma_kernel<2, 2, 0, 1, 3>(float *, ...)' -> 'gemv_mma_kernel<2, 2, 0, 1, 3>'."""
    m = re.match(r"(?:void )?([\w:]+)(<[^()]*>)?\(", name)
    return m.group(1) + (m.group(2) or "") if m else name


def csv_rows(path):
    """The CSV's rows as dicts, ncu's ==PROF== lines skipped."""
    with open(path, newline="") as f:
        return list(csv.DictReader([line for line in f if line.startswith('"')]))


def read_launches(path):
    """[(kind, grid, us)] in launch order; ValueError naming the file if it has no launch."""
    out = []
    for r in csv_rows(path):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        if unit not in UNIT_US:
            raise ValueError(f"{path}: unit {unit!r} of {r.get('Kernel Name')}: expected one of {sorted(UNIT_US)}")
        us = float(r["Metric Value"].replace(",", "")) * UNIT_US[unit]
        out.append((kernel_kind(r["Kernel Name"]), r.get("Grid Size", ""), us))
    if not out:
        raise ValueError(f"{path}: no gpu__time_duration.sum rows (an ncu --csv log of device-stage0.sh NCU=1 expected)")
    return out


def read_smem_configs(path):
    """{launch ID: (kind, shared-memory configuration in bytes)}, {} if the CSV has no such metric."""
    out = {}
    for r in csv_rows(path):
        if r.get("Metric Name") == "launch__shared_mem_config_size":
            unit = r.get("Metric Unit", "byte")
            scale = {"byte": 1, "Kbyte": 1000, "Mbyte": 1000000}.get(unit)  # ncu's SI prefixes
            if scale is None:
                raise ValueError(f"{path}: unit {unit!r} of launch__shared_mem_config_size: expected byte, Kbyte or Mbyte")
            out[r["ID"]] = (kernel_kind(r["Kernel Name"]), int(float(r["Metric Value"].replace(",", "")) * scale))
    return out


def config_changes(configs):
    """How many consecutive launches (in ID order) run under different configurations."""
    seq = [configs[k][1] for k in sorted(configs, key=int)]
    return sum(1 for a, b in zip(seq, seq[1:]) if a != b)


def summarize(launches):
    """[(kind, grid, launches, total_us)], largest total first."""
    groups = {}
    for kind, grid, us in launches:
        n, t = groups.get((kind, grid), (0, 0.0))
        groups[(kind, grid)] = (n + 1, t + us)
    return sorted(((k, g, n, t) for (k, g), (n, t) in groups.items()), key=lambda r: -r[3])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--seq", action="store_true", help="every launch in order")
    ap.add_argument("--top", type=int, default=0, help="only the N largest kinds")
    a = ap.parse_args(argv)
    try:
        launches = read_launches(a.csv)
        configs = read_smem_configs(a.csv)
    except (OSError, ValueError) as e:
        print(f"ncu_step: {e}", file=sys.stderr)
        return 1
    total = sum(us for _, _, us in launches)
    if a.seq:
        print("| # | kernel | grid | us |\n|---|---|---|---|")
        for i, (kind, grid, us) in enumerate(launches):
            print(f"| {i} | {kind} | {grid} | {us:.1f} |")
    else:
        rows = summarize(launches)
        if a.top > 0:
            rows = rows[: a.top]
        print("| kernel | grid | launches | us total | us each | share |\n|---|---|---|---|---|---|")
        for kind, grid, n, t in rows:
            print(f"| {kind} | {grid} | {n} | {t:.1f} | {t / n:.1f} | {100 * t / total:.1f}% |")
    print(f"\n{len(launches)} launches, serial sum {total:.1f} us")
    if configs:
        kinds = {}
        for kind, size in configs.values():
            kinds[(kind, size)] = kinds.get((kind, size), 0) + 1
        print("\n| kernel | L1/shared split: shared KiB | launches |\n|---|---|---|")
        for (kind, size), n in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"| {kind} | {size // 1024} | {n} |")
        print(f"\nthe split changes {config_changes(configs)} times between {len(configs)} consecutive launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
