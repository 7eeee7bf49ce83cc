#!/usr/bin/env python3
"""The parity table of scripts/device-parity.sh, from its work directory.

DIR/golden/yardsticks.json (PyTorch's rel errors against its float32 run, make_golden.py),
DIR/golden/manifest.json, DIR/logs/stage1_<precision>.log (mm3-stage1 --golden) and
DIR/logs/stage0.log (mm3-stage0 --golden). Prints a markdown table: per precision the rel
error and SNR of the DiT calls, the latents and the audio, PyTorch's figure in the same
precision beside each, and the verdict of the bounds; then stage 0's guided-logit and
frame-hidden errors, its c0 and depth edge flips and c0 edge swaps, and the lines that
describe each flip and each differing candidate set. Standard library only.

    python3 scripts/parity_table.py --dir /tmp/parity-work [--markdown table.md]
"""
import argparse
import glob
import json
import math
import os
import re

QUANTITIES = (("dit_call", "DiT calls"), ("latents", "latents"), ("audio", "audio"))
S1_FIGURE = re.compile(r"\b(dit_call|latents|audio) (\S+) \((\S+) dB; bound (\S+)\)")
S0_LINE = re.compile(r"lm_guided rel (\S+) \((\S+) dB; bound (\S+);.*frame_hiddens rel (\S+) \((\S+) dB; bound (\S+)\) "
                     r"c0 edge flips (\d+) \(bound (\d+)\)"
                     r"(?: depth edge flips (\d+) \(bound (\d+)\) c0 edge swaps (\d+) in (\d+) draws \(bound (\d+)\))?")
S0_DETAIL = ("c0 flip", "depth flip", "c0 draw", "... and")


def fmt(rel, db=None):
    if rel is None or (isinstance(rel, float) and math.isnan(rel)):
        return "-"
    if db is None:
        db = -20 * math.log10(rel) if rel > 0 else math.inf
    return f"{rel:.2e} ({db:.1f} dB)"


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def why_not(text):
    """The last informative line of a failed log."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip() and "INFO" not in ln]
    return lines[-1][:160] if lines else "no output"


def stage1_row(text):
    """{quantity: (rel, dB, bound)} of the worst case, and the verdict."""
    figures, verdict = {}, None
    for line in (text or "").splitlines():
        found = S1_FIGURE.findall(line)
        if not found:
            continue
        for q, rel, db, bound in found:
            rel, bound = float(rel), float(bound)
            if q not in figures or not (rel <= figures[q][0]):
                figures[q] = (rel, float(db), bound)
        ok = line.rstrip().endswith(": ok")
        verdict = ok if verdict is None else verdict and ok
    return figures, verdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--markdown")
    a = ap.parse_args()
    ys = json.loads(read(os.path.join(a.dir, "golden", "yardsticks.json")) or "{}").get("precisions", {})
    man = json.loads(read(os.path.join(a.dir, "golden", "manifest.json")) or "{}")
    out = []
    case = (man.get("cases") or [{}])[0]
    out.append(f"Reference: diffusers {man.get('diffusers_version', '?')}, torch {man.get('torch', '?')}, float32 on "
               f"{man.get('device', '?')} (TF32 off); case: {case.get('audio_duration', '?')} s, "
               f"{case.get('num_frames', '?')} frames, {case.get('num_windows', '?')} windows, "
               f"{case.get('num_inference_steps', '?')} steps. Bound: max(tiny bound, 1.25x PyTorch).")
    out.append("")
    head = "| precision |" + "".join(f" {name} mm3 | {name} PyTorch |" for _, name in QUANTITIES) + " bounds | result |"
    out += [head, "|" + "---|" * (3 + 2 * len(QUANTITIES))]
    logs = sorted(glob.glob(os.path.join(a.dir, "logs", "stage1_*.log")))
    order = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3, "fp8": 4}
    logs.sort(key=lambda p: order.get(os.path.basename(p)[7:-4], 9))
    seen = set()
    for path in logs:
        p = os.path.basename(path)[len("stage1_"):-len(".log")]
        seen.add(p)
        text = read(path)
        figures, verdict = stage1_row(text)
        cells = []
        for q, _ in QUANTITIES:
            y = ys.get(p, {}).get(q, {})
            cells += [fmt(*figures[q][:2]) if q in figures else "-", fmt(y.get("rel"), y.get("snr_db"))]
        bounds = " / ".join(f"{figures[q][2]:.1e}" for q, _ in QUANTITIES if q in figures) or "-"
        result = "pass" if verdict else ("FAIL" if verdict is False else f"not run: {why_not(text)}")
        out.append(f"| {p} | " + " | ".join(cells) + f" | {bounds} | {result} |")
    for p in ys:
        if p not in seen:  # PyTorch only (bf16-naive, or a precision mm3 did not replay)
            cells = []
            for q, _ in QUANTITIES:
                y = ys[p].get(q, {})
                cells += ["-", fmt(y.get("rel"), y.get("snr_db"))]
            out.append(f"| {p} (PyTorch only) | " + " | ".join(cells) + " | - | - |")
    out.append("")
    text = read(os.path.join(a.dir, "logs", "stage0.log"))
    m = S0_LINE.search(text or "")
    if m:
        line = text[text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0]
        passed = line.rstrip().endswith("PASS")
        out.append("| stage 0 | guided logits | frame hiddens | c0 edge flips | depth edge flips | c0 edge swaps "
                   "| result |")
        out.append("|---|---|---|---|---|---|---|")
        depth = f"{m[9]} (bound {m[10]})" if m[9] else "-"
        swaps = f"{m[11]} in {m[12]} draws (bound {m[13]})" if m[11] else "-"
        out.append(f"| {man.get('device', '?')} replay vs float32 | {fmt(float(m[1]), float(m[2]))}, bound {m[3]} | "
                   f"{fmt(float(m[4]), float(m[5]))}, bound {m[6]} | {m[7]} (bound {m[8]}) | {depth} | {swaps} | "
                   f"{'pass' if passed else 'FAIL'} |")
        details = [ln.strip() for ln in text.splitlines() if ln.strip().startswith(S0_DETAIL)]
        out += [f"- {ln}" for ln in details[:16]]
    else:
        out.append(f"stage 0: not run: {why_not(text)}")
    table = "\n".join(out) + "\n"
    print(table, end="")
    if a.markdown:
        with open(a.markdown, "w", encoding="utf-8") as f:
            f.write(table)


if __name__ == "__main__":
    main()
