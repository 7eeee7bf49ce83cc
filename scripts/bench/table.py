#!/usr/bin/env python3
"""Merge the JSON files of one benchmark run into bench.json and print ONE table.

    table.py --dir RESULTS_DIR [--out RESULTS_DIR/bench.json] [--markdown FILE]

Reads, from RESULTS_DIR, whichever of these exist (written by scripts/bench.sh):
  meta.json            run description (date, host, dry run, ...)
  load.json            mm3-bench-load, parsed (parse_tools.py load)
  ops.json             mm3-bench-ops, parsed (parse_tools.py ops)
  stage0.json          mm3-bench-stage0 (stage 0 through the scheduler), parsed (parse_tools.py stage0)
  dit.json             mm3-bench-dit, parsed or its own JSON
  pytorch_stage0.json  pytorch_stage0.py
  pytorch_dit.json     pytorch_dit.py
  pytorch_dit_check.json  pytorch_dit.py --check (golden comparison)
  e2e.json             e2e.py (both stages through the HTTP API)
  e2e_config.json      bench.sh: the stage-1 precision of the end-to-end run
and, from beside this script, reference.json: the previous end-to-end figures and each
precision's audio SNR against float32 at the release geometry (the parity table), shown in
the end-to-end rows' notes.
A missing file, or one with "ok": false, turns its rows into "n/a (reason)"; no figure is
ever left out. Columns: figure | mm3 | bound (the physical floor of a time, the ceiling of a
rate) | PyTorch (the baseline on the same machine and shapes) | mm3/bound | mm3/PyTorch |
goal | met?.
"""
import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# Dense tensor-core peaks in TFLOP/s (vendor data sheets, SXM parts), by device-name substring.
PEAKS = {
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
}

SONG_S = 30.0          # the goal's song length
# Issue 40's end-to-end goals (one H200, 30 s songs, at a precision >= 40 dB from float32)
GOAL_SINGLE_S, GOAL_TTFA_S, GOAL_AUDIO_S_PER_S, GOAL_MIN_DB = 6.5, 2.0, 9.0, 40.0
FRAMES_PER_S = 25      # AR frames per second of audio
WINDOW_FRAMES, HOP_FRAMES = 200, 100
CONCURRENT = 8


def windows_for(frames):
    """Stage-1 windows of a song of `frames` frames (docs/model.md 6.2)."""
    if frames <= WINDOW_FRAMES:
        return 1
    return -(-(frames - HOP_FRAMES) // HOP_FRAMES)


def device_peaks(docs):
    """Dense peaks of the GPU the run used, or None when it is not in PEAKS (or a CPU)."""
    pd, ops = docs.get("pytorch_dit") or {}, docs.get("ops") or {}
    name = (pd.get("device") or {}).get("name", "") or ops.get("device", "") or docs.get("meta", {}).get("device", "")
    return next((v for k, v in PEAKS.items() if k in (name or "")), None)


def load_dir(d):
    docs = {}
    for name in ("meta", "load", "ops", "stage0", "dit", "pytorch_stage0", "pytorch_dit", "pytorch_dit_check", "e2e",
                 "e2e_config"):
        p = os.path.join(d, name + ".json")
        if os.path.exists(p):
            try:
                with open(p, encoding="utf-8") as f:
                    docs[name] = json.load(f)
            except (OSError, ValueError) as e:
                docs[name] = {"ok": False, "reason": f"{name}.json unreadable: {e}"}
    ref = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.json")
    try:
        with open(ref, encoding="utf-8") as f:
            docs.setdefault("reference", json.load(f))
    except (OSError, ValueError):
        pass
    return docs


def why(doc, name):
    """Reason a source has no figures, or None when it has."""
    if doc is None:
        return f"{name}: not run"
    if doc.get("ok"):
        return None
    return doc.get("reason") or f"{name} failed"


class Row:
    def __init__(self, section, figure, unit, better, mm3=None, bound=None, pytorch=None, goal=None, note=""):
        self.section, self.figure, self.unit, self.better = section, figure, unit, better
        self.mm3, self.bound, self.pytorch, self.goal, self.note = mm3, bound, pytorch, goal, note

    @staticmethod
    def value(v):
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def ratio(self, other):
        a, b = self.value(self.mm3), self.value(other)
        if a is None or b is None or b == 0:
            return None
        return a / b

    def met(self):
        if self.goal is None:
            return None, "—"
        op, target = self.goal
        v = self.value(self.mm3)
        if v is None:
            return None, "n/a"
        ok = v <= target if op == "<=" else v >= target
        if ok:
            return True, "yes"
        if op == "<=":
            return False, f"no: {fmt(v)} vs {fmt(target)}, {100 * (v / target - 1):.0f}% over"
        return False, f"no: {fmt(v)} vs {fmt(target)}, {100 * (1 - v / target):.0f}% short"

    def to_json(self):
        met, text = self.met()
        return {"section": self.section, "figure": self.figure, "unit": self.unit, "better": self.better,
                "mm3": self.mm3, "bound": self.bound, "pytorch": self.pytorch,
                "mm3_over_bound": self.ratio(self.bound), "mm3_over_pytorch": self.ratio(self.pytorch),
                "goal": None if self.goal is None else {"op": self.goal[0], "value": self.goal[1]},
                "met": met, "met_text": text, "note": self.note}


def fmt(v):
    if isinstance(v, str):
        return v
    if v is None:
        return "—"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if a < 0.1 else f"{v:.2f}"


def fmt_ratio(r, better, unit=""):
    if r is None:
        return "—"
    if better == "lower" and unit in ("s", "ms"):
        hint = f"{1 / r:.1f}x faster" if r < 1 else f"{r:.1f}x slower"
    elif better == "lower":
        hint = f"{1 / r:.1f}x less" if r < 1 else f"{r:.1f}x more"
    else:
        hint = f"{r:.1f}x more" if r >= 1 else f"{1 / r:.1f}x less"
    return f"{r:.2f} ({hint})"


def na(reason):
    return f"n/a ({reason})"


def best(results, **match):
    """The fastest result (lowest ms) among those matching every key."""
    c = [r for r in results if all(r.get(k) == v for k, v in match.items())]
    if not c:
        return None
    key = "ms_per_frame" if "ms_per_frame" in c[0] else "ms_per_forward"
    return min(c, key=lambda r: r[key])


def build_rows(docs):
    rows = []
    ops, load, dit = docs.get("ops"), docs.get("load"), docs.get("dit")
    s0, pd, e2e = docs.get("pytorch_stage0"), docs.get("pytorch_dit"), docs.get("e2e")
    meta = docs.get("meta", {})
    ops_na, load_na, dit_na = why(ops, "mm3-bench-ops"), why(load, "mm3-bench-load"), why(dit, "mm3-bench-dit")
    s0_na, pd_na, e2e_na = why(s0, "pytorch_stage0"), why(pd, "pytorch_dit"), why(e2e, "end-to-end run")
    m0 = docs.get("stage0")
    m0_na = why(m0, "mm3-bench-stage0")

    # ---- load --------------------------------------------------------------------------
    sec = "load"
    if load_na:
        rows.append(Row(sec, "checkpoint load", "GB/s", "higher", na(load_na), na(load_na), "—"))
    else:
        t = load["total"]
        rows.append(Row(sec, f"checkpoint load, {t['bytes'] / 1e9:.1f} GB ({load.get('cache', '?')} cache), "
                        "bound = disk sequential read", "GB/s", "higher", t["load_GBps"], t["seq_GBps"], "—"))
        rows.append(Row(sec, "checkpoint load time", "s", "lower", t["load_s"], t["seq_s"], "—"))

    # ---- stage 0 -----------------------------------------------------------------------
    sec = "stage 0"
    copy_bw = (ops or {}).get("copy_GBps") if not ops_na else None
    if copy_bw is None and not m0_na and m0.get("copy_GBps"):
        copy_bw = m0["copy_GBps"]
    if copy_bw is None and s0 and s0.get("copy_GBps"):
        copy_bw = s0["copy_GBps"]
    mm3_bw = (ops or {}).get("copy_GBps") if not ops_na else None
    if mm3_bw is None and not m0_na:
        mm3_bw = m0.get("copy_GBps")
    rows.append(Row(sec, "device-to-device copy bandwidth (read + write)", "GB/s", "higher",
                    mm3_bw if mm3_bw else na(ops_na or m0_na or "not measured"), "—",
                    s0["copy_GBps"] if not s0_na and s0.get("copy_GBps") else "—"))
    for rws, pairs in (("2", 1), ("16", 8)):
        fig = f"kernels of one frame, weights only, {pairs} pair{'s' * (pairs > 1)} (mm3-bench-ops)"
        if ops_na:
            rows.append(Row(sec, fig, "ms", "lower", na(ops_na), na(ops_na), "—"))
        else:
            f = ops.get("frame", {}).get(rws, {})
            rows.append(Row(sec, fig, "ms", "lower", f.get("kernel_sum_ms", na("not in output")),
                            ops.get("floor_ms"), "—", note="sum of graph-replayed matmuls; KV, norms, sampling excluded"))
    m0_res = (m0 or {}).get("results", []) if not m0_na else []
    m0_skip = (m0 or {}).get("skipped", []) if m0 else []
    contexts = sorted({r["context"] for r in (s0 or {}).get("results", [])} | {r["context"] for r in m0_res}
                      | {r["context"] for r in m0_skip}) or [1000, 5000]
    for ctx in contexts:
        for pairs in (1, 8):
            fig = f"ms per frame, context {ctx}, {pairs} CFG pair{'s' * (pairs > 1)}"
            pt, bound = na(s0_na) if s0_na else na("not measured"), na("no copy bandwidth")
            if not s0_na:
                r = best(s0["results"], context=ctx, pairs=pairs)
                if r:
                    pt = r["ms_per_frame"]
                    fig += f" (PyTorch: {r['mode']})"
                    if copy_bw:
                        bound = (r["weight_bytes"] + r["kv_bytes"]) / (copy_bw * 1e9) * 1e3
            mr = next((r for r in m0_res if r["context"] == ctx and r["pairs"] == pairs), None)
            note = ""
            if mr:
                mm3 = mr["ms_per_frame"]
                # mm3's own bytes per step (its KV cache dtype included) over the copy bandwidth
                # measured in the same run: the floor of what mm3 reads.
                bound = mr["floor_ms"]
                note = (f"through the scheduler; bound = mm3's {(mr['weight_bytes'] + mr['kv_bytes']) / 1e9:.2f} GB "
                        "per step (weights + KV as cached) / copy bandwidth")
            else:
                sk = next((r for r in m0_skip if r.get("context") == ctx and r.get("pairs") == pairs), None)
                mm3 = na(sk["reason"] if sk else m0_na or "not in the mm3-bench-stage0 run")
            rows.append(Row(sec, fig, "ms", "lower", mm3, bound, pt, note=note))
    for ctx in contexts:
        lv = [r for r in m0_res if r["context"] == ctx and r.get("prefill_s")]
        tok, sec_s = sum(r["prefill_tokens"] for r in lv), sum(r["prefill_s"] for r in lv)
        rows.append(Row(sec, f"prefill through the scheduler, context {ctx} (every song's prompt pair)", "tokens/s",
                        "higher", tok / sec_s if sec_s > 0 else na(m0_na or "not measured"), "—", "—"))
    ttff = (m0 or {}).get("ttff_s") if not m0_na else None
    rows.append(Row(sec, f"time to first frame, {(m0 or {}).get('ttff_prompt_tokens') or 1000}-token prompt, "
                    "one song alone", "s", "lower",
                    ttff if ttff is not None else na(m0_na or (m0 or {}).get("ttff_reason", "not measured")), "—", "—"))
    mem = (m0 or {}).get("memory", {}) if not m0_na else {}
    if mem.get("peak_used_bytes"):
        rows.append(Row(sec, f"peak GPU memory, stage 0 benchmark (device-wide; bound = "
                        f"{mem['utilization']:g} x {mem['total_bytes'] / 2 ** 30:.0f} GiB)", "GiB", "lower",
                        mem["peak_used_bytes"] / 2 ** 30, mem["budget_bytes"] / 2 ** 30, "—",
                        note=f"plan {mem['plan_bytes'] / 2 ** 30:.1f} GiB"))
    else:
        rows.append(Row(sec, "peak GPU memory, stage 0 benchmark", "GiB", "lower",
                        na(m0_na or "no GPU in that run"), "—", "—"))

    # ---- stage 1 -----------------------------------------------------------------------
    sec = "stage 1"
    sheet = device_peaks(docs)
    steps = (pd or {}).get("steps", 30)
    pres = (pd or {}).get("results", []) if not pd_na else []
    mres = (dit or {}).get("results", []) if not dit_na else []

    def mm3_row(prec, w):
        return next((r for r in mres if r["precision"] == prec and r["windows"] == w), None)

    def peak_of(prec):
        """The measured dense-GEMM peak of mm3-bench-dit when there is one, else the data sheet."""
        r = next((r for r in mres if r["precision"] == prec and r.get("gemm_peak_tflops")), None)
        if r:
            return r["gemm_peak_tflops"], "measured GEMM peak"
        if sheet:
            return sheet[prec], "data-sheet peak"
        return None, None

    combos = sorted({(r["precision"], r["windows"]) for r in pres} | {(r["precision"], r["windows"]) for r in mres},
                    key=lambda pw: (("bf16", "tf32", "fp32").index(pw[0]) if pw[0] in ("bf16", "tf32", "fp32") else 9,
                                    pw[1]))
    if pres:  # the PyTorch run decides which window counts the table shows
        combos = [c for c in combos if any(r["windows"] == c[1] for r in pres)]
    if not combos:
        combos = [(p, w) for p in ("bf16", "tf32", "fp32") for w in (1, 8)]
    mm3_missing = na(dit_na) if dit_na else na("not in the mm3-bench-dit run")
    for prec, w in combos:
        pr, mr = best(pres, precision=prec, windows=w) if pres else None, mm3_row(prec, w)
        peak, kind = peak_of(prec)
        flop = pr["tflop_per_forward"] if pr else (mr and dit.get("tflop_per_sequence", 0) * mr["batch"])
        bound = steps * flop / peak / w if peak and flop else na("unknown device peak" if not peak else "no FLOP count")
        rows.append(Row(sec, f"DiT s per window, {prec}, {w} window{'s' * (w > 1)} in one batch of {2 * w}"
                        + (f" (PyTorch: {pr['mode']})" if pr else ""), "s", "lower",
                        mr["s_per_window"] if mr else mm3_missing, bound,
                        pr["s_per_window"] if pr else na(pd_na or "not run"),
                        note=f"bound = FLOP at the {kind}" if kind else ""))
    for prec in sorted({p for p, _ in combos}, key=lambda p: ("bf16", "tf32", "fp32").index(p)
                       if p in ("bf16", "tf32", "fp32") else 9):
        w = max(ww for p, ww in combos if p == prec)
        pr, mr = best(pres, precision=prec, windows=w) if pres else None, mm3_row(prec, w)
        peak, kind = peak_of(prec)
        rows.append(Row(sec, f"DiT TFLOP/s, {prec}, batch {2 * w} (bound = {kind or 'peak'}; "
                        "mm3/bound = fraction of peak)", "TFLOP/s", "higher",
                        mr["tflops"] if mr else mm3_missing, peak if peak else na("unknown device peak"),
                        pr["tflops"] if pr else na(pd_na or "not run")))
        # issue 8: seconds of GPU time per second of audio (a window adds one hop of audio)
        hop_s = HOP_FRAMES / FRAMES_PER_S
        rows.append(Row(sec, f"DiT GPU seconds per second of audio, {prec}, batch {2 * w}", "s/s", "lower",
                        mr.get("gpu_s_per_audio_s", mr["s_per_window"] / hop_s) if mr else mm3_missing, None,
                        pr["s_per_window"] / hop_s if pr else na(pd_na or "not run"),
                        note=f"s per window / {hop_s:g} s of new audio per window"))
    # ---- end to end ----------------------------------------------------------------------
    sec = "end to end"
    # PyTorch has no serving path here: its end-to-end figures are composed from the two
    # baselines (stage 0 then stage 1, no overlap, vocoder not counted): derived, not measured.
    frames = int(SONG_S * FRAMES_PER_S)
    K = windows_for(frames)
    pt_single = pt_ttfa = pt_agg = None
    pt_note = ""
    if not s0_na and not pd_na:
        r1 = best(s0["results"], context=min(contexts), pairs=1)
        r8 = best(s0["results"], context=min(contexts), pairs=8)
        d1 = best(pd["results"], windows=1)
        d8 = best(pd["results"], windows=max(r["windows"] for r in pd["results"]))
        if r1 and d1:
            pt_single = (frames + 1) * r1["ms_per_frame"] * 1e-3 + K * d1["window_latency_s"]
            pt_ttfa = (WINDOW_FRAMES + 1) * r1["ms_per_frame"] * 1e-3 + d1["window_latency_s"]
            pt_note = (f"PyTorch derived: {frames + 1} frames x {r1['ms_per_frame']:.1f} ms + {K} windows x "
                       f"{d1['window_latency_s']:.2f} s ({d1['precision']} {d1['mode']})")
        if r8 and d8 and d8["windows"] > 1:
            t = (frames + 1) * r8["ms_per_frame"] * 1e-3 + K * d8["window_latency_s"] * CONCURRENT / d8["windows"]
            pt_agg = CONCURRENT * SONG_S / t
    pt_na = na("needs both PyTorch baselines") if (s0_na or pd_na) else na("not derivable")
    # The goals are for a 30 s song and 8 at once; a run at other sizes is shown without them.
    song_s = float((e2e or {}).get("duration_s", SONG_S)) if not e2e_na else SONG_S
    n_conc = int((e2e or {}).get("concurrency", CONCURRENT)) if not e2e_na else CONCURRENT
    goals = song_s == SONG_S and n_conc == CONCURRENT

    def goal(op, v):
        return (op, v) if goals else None
    single = (e2e or {}).get("single", {}) if not e2e_na else {}
    conc = (e2e or {}).get("concurrent", {}) if not e2e_na else {}
    e2e_reason = meta.get("e2e_na") or e2e_na or "song failed"

    def m(d, k):
        v = d.get(k) if d else None
        return v if v is not None else na(e2e_reason)

    if not goals:  # the derived PyTorch figures are for 30 s / 8 songs too
        pt_single = pt_ttfa = pt_agg = None
        pt_na = na(f"derived for {SONG_S:.0f} s songs only")
    # Beside each goal: the previous figure and the precision's distance from float32; a
    # precision under GOAL_MIN_DB does not count toward the goals.
    ref = docs.get("reference") or {}
    prev, parity = ref.get("previous") or {}, ref.get("parity_audio_db") or {}
    prec = (docs.get("e2e_config") or {}).get("stage1_precision")
    db = parity.get(prec) if prec else None
    if prec:
        prec_note = f"stage 1 {prec}" + (f", audio {db:.1f} dB from float32 (parity {parity.get('date', '?')})"
                                          if isinstance(db, (int, float)) else ", no parity figure")
        if isinstance(db, (int, float)) and db < GOAL_MIN_DB:
            prec_note += f": under {GOAL_MIN_DB:g} dB, does not count toward the goals"
            goals = False
    else:
        prec_note = "stage-1 precision unknown"

    def note_with(key, unit, extra=""):
        parts = [p for p in (extra, prec_note) if p]
        if isinstance(prev.get(key), (int, float)):
            parts.append(f"previous {prev[key]:g} {unit} ({prev.get('stage1_precision', '?')}, "
                         f"{prev.get('commit', '?')} {prev.get('date', '?')})")
        return "; ".join(parts)
    rows.append(Row(sec, f"one {song_s:g} s song alone, wall time", "s", "lower", m(single, "wall_s"), "—",
                    pt_single if pt_single else pt_na, goal=goal("<=", GOAL_SINGLE_S),
                    note=note_with("single_wall_s", "s", pt_note)))
    rows.append(Row(sec, "one song, real-time factor (wall / audio)", "", "lower", m(single, "rtf"), "—",
                    pt_single / SONG_S if pt_single else pt_na, goal=goal("<=", GOAL_SINGLE_S / SONG_S)))
    rows.append(Row(sec, "time to first audio, streaming", "s", "lower", m(single, "ttfa_s"), "—",
                    pt_ttfa if pt_ttfa else pt_na, goal=goal("<=", GOAL_TTFA_S), note=note_with("ttfa_s", "s")))
    rows.append(Row(sec, f"{n_conc} concurrent {song_s:g} s songs, aggregate", "audio s/s", "higher",
                    m(conc, "audio_s_per_s"), "—", pt_agg if pt_agg else pt_na, goal=goal(">=", GOAL_AUDIO_S_PER_S),
                    note=note_with("audio_s_per_s", "audio s/s")))
    rows.append(Row(sec, f"{n_conc} concurrent songs, latency p50", "s", "lower", m(conc, "latency_p50_s"),
                    "—", "—"))
    rows.append(Row(sec, f"{n_conc} concurrent songs, latency p95", "s", "lower", m(conc, "latency_p95_s"),
                    "—", "—"))
    stopped = (single.get("stopped_early") and 1 or 0) + (conc.get("stopped_early") or 0)
    if stopped:
        rows.append(Row(sec, "songs that ended before their cap (random weights drew the stop code)", "songs",
                        "lower", stopped, "—", "—", note="their figures count the audio they really have"))
    speed = None
    if isinstance(single.get("wall_s"), (int, float)) and pt_single:
        speed = pt_single / single["wall_s"]
    rows.append(Row(sec, "end-to-end speed-up over PyTorch (PyTorch wall / mm3 wall)", "x", "higher",
                    speed if speed is not None else na(e2e_reason if e2e_na or not single.get("ok")
                                                       else "no PyTorch figure"),
                    "—", "—", goal=goal(">=", 3.0)))
    mem = (e2e or {}).get("gpu_peak_gib") if not e2e_na else None
    for stage, prog in (("stage 0", "mm3-stage0"), ("stage 1", "mm3-stage1")):
        v = None
        if mem:
            v = next((g for name, g in mem.items() if name.startswith(prog)), None)
        pt = "—"
        if stage == "stage 0" and not s0_na:
            pm = [r.get("peak_mem_gib") for r in s0["results"] if r.get("peak_mem_gib")]
            pt = max(pm) if pm else "—"
        if stage == "stage 1" and not pd_na:
            pm = [r.get("peak_mem_gib") for r in pd["results"] if r.get("peak_mem_gib")]
            pt = max(pm) if pm else "—"
        rows.append(Row(sec, f"peak GPU memory, {stage}", "GiB", "lower",
                        v if v is not None else na(e2e_reason if e2e_na else "no nvidia-smi" if mem is None
                                                   else "process not seen by nvidia-smi"), "—", pt))
    return rows


def render(rows, docs):
    head = ["figure", "unit", "mm3", "bound", "PyTorch", "mm3/bound", "mm3/PyTorch", "goal", "met?"]
    table = []
    for r in rows:
        j = r.to_json()
        goal = "—" if r.goal is None else f"{r.goal[0]} {fmt(r.goal[1])}"
        table.append([f"[{r.section}] {r.figure}", r.unit, fmt(r.mm3), fmt(r.bound), fmt(r.pytorch),
                      fmt_ratio(j["mm3_over_bound"], r.better, r.unit), fmt_ratio(j["mm3_over_pytorch"], r.better, r.unit),
                      goal, j["met_text"]])
    width = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(width[i]) for i, h in enumerate(head)),
           "  ".join("-" * w for w in width)]
    for t in table:
        out.append("  ".join(c.ljust(width[i]) for i, c in enumerate(t)).rstrip())
    return "\n".join(out)


def render_markdown(rows):
    out = ["| figure | unit | mm3 | bound | PyTorch | mm3/bound | mm3/PyTorch | goal | met? |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        j = r.to_json()
        goal = "—" if r.goal is None else f"{r.goal[0]} {fmt(r.goal[1])}"
        cells = [f"{r.section}: {r.figure}", r.unit, fmt(r.mm3), fmt(r.bound), fmt(r.pytorch),
                 fmt_ratio(j["mm3_over_bound"], r.better, r.unit), fmt_ratio(j["mm3_over_pytorch"], r.better, r.unit),
                 goal, j["met_text"]]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(out)


def details(docs):
    """The PyTorch variants behind the best-of cells, and the correctness checks."""
    out = []
    pd = docs.get("pytorch_dit")
    if pd and pd.get("results"):
        peaks = device_peaks(docs)
        out.append("PyTorch DiT variants (ms/forward, s/window, TFLOP/s, fraction of the dense peak):")
        for r in pd["results"]:
            frac = f"{100 * r['tflops'] / peaks[r['precision']]:5.1f}% of peak" if peaks else "peak unknown"
            out.append(f"  {r['precision']:>4} {r['mode']:>5} windows {r['windows']:>2} batch {r['batch']:>2}: "
                       f"{r['ms_per_forward']:9.2f} ms  {r['s_per_window']:8.3f} s/window  {r['tflops']:7.1f}  {frac}")
        for s in pd.get("skipped", []):
            out.append(f"  skipped {s.get('precision')} {s.get('mode')} {s.get('windows', '')}: {s['reason'][:100]}")
    s0 = docs.get("pytorch_stage0")
    if s0 and s0.get("results"):
        out.append("PyTorch stage-0 variants (LM step ms, 7 depth passes ms, ms/frame, x its floor; "
                   "decode check rel. L2):")
        for r in s0["results"]:
            fl = f"{r['ratio_to_floor']:5.1f}x floor" if r.get("ratio_to_floor") else "floor n/a"
            out.append(f"  context {r['context']:>5} pairs {r['pairs']} {r['mode']:>5}: {r['lm_ms']:8.2f} "
                       f"{r['depth_ms']:8.2f} {r['ms_per_frame']:9.2f}  {fl}  "
                       f"check {r['decode_vs_uncached_rel_l2']:.1e}" + ("" if r.get("decode_ok", True) else " FAILED"))
        for s in s0.get("skipped", []):
            out.append(f"  skipped context {s['context']} pairs {s['pairs']} {s['mode']}: {s['reason'][:100]}")
    chk = docs.get("pytorch_dit_check")
    if chk:
        out.append(f"PyTorch DiT vs golden dit_call outputs: rel. L2 {chk.get('rel_l2_max', float('nan')):.2e} "
                   f"({'OK' if chk.get('ok') else 'FAILED'}, tolerance {chk.get('tolerance')})")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--out", help="bench.json (default DIR/bench.json)")
    ap.add_argument("--markdown", help="also write the table as Markdown here")
    args = ap.parse_args()
    docs = load_dir(args.dir)
    rows = build_rows(docs)
    meta = docs.get("meta", {})
    title = (f"mm3 benchmark {meta.get('date', '')} on {meta.get('device', '?')}"
             + (" -- DRY RUN (tiny shapes on the CPU: not a measurement)" if meta.get("dry_run") else ""))
    text = title + "\n\n" + render(rows, docs)
    d = details(docs)
    if d:
        text += "\n\n" + d
    missed = [r for r in rows if r.met()[0] is False]
    if missed:
        text += "\n\nGoals missed: " + "; ".join(r.figure for r in missed) + " (why: docs/performance.md)"
    print(text)
    out = args.out or os.path.join(args.dir, "bench.json")
    common.write_json(out, {"title": title, "meta": meta, "rows": [r.to_json() for r in rows], "inputs": docs})
    with open(os.path.join(os.path.dirname(os.path.abspath(out)), "table.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(render_markdown(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
