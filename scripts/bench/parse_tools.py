#!/usr/bin/env python3
"""Turn the text output of the mm3 benchmark programs into JSON for table.py.

    parse_tools.py ops  LOG [--rc N] --json OUT     mm3-bench-ops
    parse_tools.py load LOG [--rc N] --json OUT     mm3-bench-load
    parse_tools.py dit  LOG [--rc N] --json OUT     mm3-bench-dit (free format: best effort)
    parse_tools.py stage0 LOG [--rc N] --json OUT   mm3-bench-stage0 (its S0BENCH lines)

The programs print tables for people and have no JSON output; the formats parsed here are
the printf formats of tools/mm3_bench_ops.c and tools/mm3_bench_load.c; mm3-bench-stage0 prints
one machine-readable `S0BENCH kind=... key=value` line per figure. A program that exited
77 (no CUDA device) or whose output did not parse gives {"ok": false, "reason": ...}, which
the table shows as "n/a (reason)".
"""
import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

NUM = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"


def _status(tool, text, rc):
    doc = {"tool": tool, "rc": rc, "ok": False}
    if rc == 77 or re.search(r"(^|: )(no CUDA|built without CUDA)", text, re.M):
        doc["reason"] = "no CUDA device"
    elif rc not in (0, None):
        last = [l for l in text.strip().splitlines() if l.strip()][-1:] or ["no output"]
        doc["reason"] = f"exit {rc}: {last[0][:160]}"
    return doc


def parse_ops(text, rc=0):
    doc = _status("mm3-bench-ops", text, rc)
    if "reason" in doc:
        return doc
    m = re.search(r"^device: (.*?); median of (\d+) samples", text, re.M)
    if m:
        doc["device"] = m.group(1)
    m = re.search(r"device-to-device copy: " + NUM + " GB/s", text)
    if m:
        doc["copy_GBps"] = float(m.group(1))
    m = re.search(r"Frame \(weights only: " + NUM + " GB", text)
    if m:
        doc["frame_weight_GB"] = float(m.group(1))
    m = re.search(r"floor = bytes / copy bandwidth\s+" + NUM + " ms", text)
    if m:
        doc["floor_ms"] = float(m.group(1))
    m = re.search(r"back-to-back launches instead: " + NUM + " ms at 2 rows, " + NUM + " ms at 16", text)
    if m:
        doc["launch_ms"] = {"2": float(m.group(1)), "16": float(m.group(2))}
    frame = {}
    for m in re.finditer(r"^\s*(\d+) rows: sum of kernels\s+" + NUM + r" ms \(" + NUM
                         + r"% of floor speed\), fused qkv/gate_up\s+" + NUM + " ms", text, re.M):
        frame.setdefault(m.group(1), {}).update(
            {"kernel_sum_ms": float(m.group(2)), "floor_speed_pct": float(m.group(3)),
             "fused_ms": float(m.group(4))})
    for m in re.finditer(r"^\s*(\d+) rows: float32 kernel only\s+" + NUM + r" ms, tensor-core kernel only "
                         r"\(better MT\)\s+" + NUM + r" ms, best per shape\s+" + NUM + " ms", text, re.M):
        frame.setdefault(m.group(1), {}).update(
            {"f32_only_ms": float(m.group(2)), "mma_only_ms": float(m.group(3)), "best_ms": float(m.group(4))})
    doc["frame"] = frame
    att = {}
    for m in re.finditer(r"^attention_decode\s+(\d+) pos\s+(\d+)\s+" + NUM + r"\s+" + NUM, text, re.M):
        att[m.group(2)] = {"positions": int(m.group(1)), "us": float(m.group(3)), "GBps": float(m.group(4))}
    doc["attention"] = att
    if "copy_GBps" in doc and frame and "floor_ms" in doc:
        doc["ok"] = True
    else:
        doc["reason"] = "output did not parse (format of mm3-bench-ops changed?)"
    return doc


def parse_load(text, rc=0):
    doc = _status("mm3-bench-load", text, rc)
    if "reason" in doc:
        return doc
    comps = {}
    row = re.compile(r"^(\S+)\s+(\d+)\s+" + r"\s+".join([NUM] * 5) + r"\s+(\S+)\s*$", re.M)
    for m in row.finditer(text):
        comps[m.group(1)] = {"bytes": int(m.group(2)), "seq_s": float(m.group(3)), "seq_GBps": float(m.group(4)),
                             "load_s": float(m.group(5)), "load_GBps": float(m.group(6)),
                             "ratio": float(m.group(7)), "reader": m.group(8)}
    if "total" in comps:
        doc["total"] = comps.pop("total")
        doc["cache"] = doc["total"].pop("reader")
        doc["components"] = comps
        doc["ok"] = True
    else:
        doc["reason"] = "no 'total' line in the output of mm3-bench-load"
    return doc


# The attention column (since the flash kernels) and the GPU-seconds-per-audio-second column
# (third session) are optional so that older logs still parse.
DIT_ROW = re.compile(r"^\| DiT forward \| (?P<prec>\w+) \| (?:(?P<attn>[A-Za-z]\w*) \| )?(?P<w>\d+) \((?P<b>\d+)\) \| "
                     + "(?P<eager>" + NUM + "), (?P<graph>" + NUM + r") \| (?P<sw>" + NUM + r") \| (?:(?P<gpu_s>" + NUM
                     + r") \| )?(?P<tf>" + NUM + r") \| (?P<peak>" + NUM + r") \| (?P<ratio>" + NUM + r") \|", re.M)
DIT_DRIFT = re.compile(r"^\| drift vs fp32 \| (\w+) \|.*?velocity rel " + NUM + r".*?Euler steps rel " + NUM, re.M)


def parse_dit(text, rc=0):
    """The final table of tools/mm3_bench_dit.c, one row per precision and window count:
    | DiT forward | prec | [attention |] W (B) | ms eager, ms graph | s/window | [GPU s per audio s |]
    TFLOP/s | GEMM peak | ratio |.
    Output in another format falls back to a best-effort search for the figures."""
    doc = _status("mm3-bench-dit", text, rc)
    if "reason" in doc:
        return doc
    rows = []
    for m in DIT_ROW.finditer(text):
        eager, graph = float(m.group("eager")), float(m.group("graph"))
        best = graph if 0 < graph < eager else eager
        row = {"precision": m.group("prec"), "windows": int(m.group("w")), "batch": int(m.group("b")),
               "ms_eager": eager, "ms_graph": graph, "ms_per_forward": best,
               "s_per_window": float(m.group("sw")), "tflops": float(m.group("tf")),
               "gemm_peak_tflops": float(m.group("peak")), "fraction_of_peak": float(m.group("ratio"))}
        if m.group("attn"):
            row["attention"] = m.group("attn")
        if m.group("gpu_s"):
            row["gpu_s_per_audio_s"] = float(m.group("gpu_s"))
        rows.append(row)
    if rows:
        doc["results"] = rows
        doc["drift"] = {m.group(1): {"velocity_rel": float(m.group(2)), "latents_rel": float(m.group(3))}
                        for m in DIT_DRIFT.finditer(text)}
        m = re.search(r"FLOP per sequence forward: " + NUM + " T", text)
        if m:
            doc["tflop_per_sequence"] = float(m.group(1))
        doc["ms_per_forward"] = min(r["ms_per_forward"] for r in rows if r["windows"] == min(x["windows"] for x in rows))
        doc["tflops"] = max(r["tflops"] for r in rows)
        doc["ok"] = True
        return doc
    ms = [float(v) for v in re.findall(NUM + r"\s*ms\s*(?:/|per)\s*forward", text, re.I)]
    sw = [float(v) for v in re.findall(NUM + r"\s*s\s*(?:/|per)\s*window", text, re.I)]
    tf = [float(v) for v in re.findall(NUM + r"\s*TFLOP/s", text)]
    if not (ms or sw or tf):
        # A table with a header naming the columns: find the columns by name.
        lines = text.splitlines()
        for i, line in enumerate(lines):
            cols = line.split()
            low = [c.lower() for c in cols]
            if any("tflop" in c for c in low) and any(c.startswith("ms") or "ms/" in c for c in low):
                it = next(j for j, c in enumerate(low) if "tflop" in c)
                im = next(j for j, c in enumerate(low) if c.startswith("ms") or "ms/" in c)
                for row in lines[i + 1:]:
                    vals = row.split()
                    if len(vals) == len(cols):
                        try:
                            tf.append(float(vals[it]))
                            ms.append(float(vals[im]))
                        except ValueError:
                            pass
                break
    if ms:
        doc["ms_per_forward"] = min(ms)
    if sw:
        doc["s_per_window"] = min(sw)
    if tf:
        doc["tflops"] = max(tf)
    doc["parsed"] = "heuristic"
    if ms or sw or tf:
        doc["ok"] = True
    else:
        doc["reason"] = "no ms/forward, s/window or TFLOP/s figure found in its output"
    return doc

S0_LINE = re.compile(r"^S0BENCH (.*)$", re.M)
S0_FIELD = re.compile(r'(\w+)=("(?:[^"]*)"|\S+)')


def _s0_value(v):
    if v.startswith('"'):
        return v[1:-1]
    try:
        return int(v)
    except ValueError:
        try:
            return float(v)
        except ValueError:
            return v


def parse_stage0(text, rc=0):
    """tools/mm3_bench_stage0.c: one `S0BENCH kind=K key=value ...` line per figure (kinds setup,
    copy, frame, skipped, ttff, memory). A run cut short still gives the lines it printed; exit 1
    (a configuration failed) keeps the figures of the others."""
    doc = _status("mm3-bench-stage0", text, rc)
    if doc.get("reason") == "no CUDA device":
        return doc
    failed = doc.pop("reason", None)
    doc["results"], doc["skipped"] = [], []
    for m in S0_LINE.finditer(text):
        f = {k: _s0_value(v) for k, v in S0_FIELD.findall(m.group(1))}
        kind = f.pop("kind", None)
        if kind == "frame":
            f["ms_per_frame"] = f.pop("ms_median")
            doc["results"].append(f)
        elif kind == "skipped":
            doc["skipped"].append(f)
        elif kind == "copy":
            doc["copy_GBps"] = f.get("GBps")
        elif kind == "ttff":
            if "s" in f:
                doc["ttff_s"], doc["ttff_prompt_tokens"] = f["s"], f.get("prompt_tokens")
            else:
                doc["ttff_reason"] = f.get("reason", "not measured")
        elif kind in ("setup", "memory"):
            doc[kind] = f
    if doc["results"]:
        doc["ok"] = True
        if failed:
            doc["warning"] = failed
    else:
        why = failed or (doc["skipped"][0]["reason"] if doc["skipped"] else
                         "output did not parse (no S0BENCH frame lines: format of mm3-bench-stage0 changed?)")
        doc["reason"] = why
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=("ops", "load", "dit", "stage0"))
    ap.add_argument("log")
    ap.add_argument("--rc", type=int, default=0, help="exit status of the program")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    try:
        with open(args.log, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        text, args.rc = f"cannot read log: {e}", 1
    doc = {"ops": parse_ops, "load": parse_load, "dit": parse_dit, "stage0": parse_stage0}[args.kind](text, args.rc)
    doc["log"] = args.log
    common.write_json(args.json, doc)
    print(f"parse_tools: {doc['tool']}: " + ("ok" if doc["ok"] else "n/a (" + doc.get("reason", "?") + ")"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
