#!/usr/bin/env python3
"""Tests of the benchmark harness that need no GPU and no torch:

    python3 scripts/bench/test_harness.py

- parse_tools against text in the exact printf formats of tools/mm3_bench_ops.c,
  tools/mm3_bench_load.c and tools/mm3_bench_stage0.c (and the "no CUDA" exit 77 path);
- table.py on a synthetic H200 run: bounds, ratios, goals met / missed "by how much", and
  "n/a (reason)" rows for everything that is missing;
- e2e.py's measuring code against a local fake streaming server;
- ncu_step.py on a CSV in ncu's --csv layout;
- kernel_trace.py on a trace in tools/kernel_trace's layout.
"""
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e  # noqa: E402
import kernel_trace  # noqa: E402
import ncu_step  # noqa: E402
import parse_tools  # noqa: E402
import table  # noqa: E402

# The lines below are printf'd with the formats of tools/mm3_bench_ops.c (main()).
OPS_TEXT = "".join([
    "device: %s; median of %d samples\n" % ("NVIDIA H200 (132 SMs)", 15),
    "device-to-device copy: %.1f GB/s (read + write, 1 GiB, median)\n\n" % 4213.0,
    "%-28s %13s %4d %10.1f %8.0f %6.0f%%\n" % ("attention_decode", "10240 pos", 2, 45.2, 1858, 44),
    "%-28s %13s %4d %10.1f %8.0f %6.0f%%\n" % ("attention_decode", "10240 pos", 16, 274.8, 2442, 58),
    "\nFrame (weights only: %.2f GB of bf16 matmul weights, KV and small ops excluded):\n" % 22.31,
    "  floor = bytes / copy bandwidth      %8.2f ms\n" % 5.29,
    "  (kernel times from graph replays; back-to-back launches instead: %.2f ms at 2 rows, %.2f ms at 16)\n"
    % (7.29, 11.89),
    "  %2d rows: sum of kernels %8.2f ms (%.0f%% of floor speed), fused qkv/gate_up %8.2f ms (%.0f%%)\n"
    % (2, 6.76, 78, 6.36, 83),
    "  %2d rows: sum of kernels %8.2f ms (%.0f%% of floor speed), fused qkv/gate_up %8.2f ms (%.0f%%)\n"
    % (16, 11.28, 47, 10.10, 52),
    "  %2d rows: float32 kernel only %8.2f ms, tensor-core kernel only (better MT) %8.2f ms, best per shape "
    "%8.2f ms\n" % (2, 6.80, 7.10, 6.75),
])
# tools/mm3_bench_load.c: header, one row per component, the total; log lines interleaved.
LOAD_FMT = "%-20s %14d %9.3f %9.2f %9.3f %9.2f %7.2f  %s\n"
LOAD_TEXT = ("%-20s %14s %9s %9s %9s %9s %7s  %s\n" % ("component", "bytes", "seq_s", "seq_GB/s", "load_s",
                                                         "load_GB/s", "ratio", "reader")
             + "bench-load[1] 2955.336 INFO  checkpoint.c:399: language_model: loaded 36 tensors\n"
             + LOAD_FMT % ("language_model", 17168997392, 6.1, 2.81, 6.5, 2.64, 0.94, "io_uring")
             + LOAD_FMT % ("transformer", 9727623680, 3.4, 2.86, 3.6, 2.70, 0.94, "io_uring")
             + LOAD_FMT % ("total", 26896621072, 9.5, 2.83, 10.1, 2.66, 0.94, "cold"))

# tools/mm3_bench_dit.c's closing table (its printf formats).
DIT_ROW_FMT = "| DiT forward | %s | %s | %d (%d) | %.1f, %.1f | %.3f | %.3f | %.1f | %.1f | %.2f |\n"
DIT_TEXT = ("device: NVIDIA H200\nFLOP per sequence forward: %.4g T\n" % 3.489
            + "bf16: dense GEMM 8192^3 %.1f TFLOP/s\n" % 780.1
            + "\n| figure | precision | attention | windows (B) | ms / forward (eager, graph) | s / window (30 steps, CFG) "
            "| GPU s per audio s | TFLOP/s | dense GEMM peak | ratio |\n|---|---|---|---|---|---|---|---|---|---|\n"
            + DIT_ROW_FMT % ("bf16", "auto", 1, 2, 15.1, 13.2, 0.396, 0.099, 528.6, 780.1, 0.68)
            + DIT_ROW_FMT % ("bf16", "auto", 8, 16, 99.0, 98.0, 0.368, 0.092, 570.1, 780.1, 0.73)
            + DIT_ROW_FMT % ("fp32", "SIMT", 1, 2, 180.2, 0.0, 5.406, 1.352, 38.7, 50.1, 0.77)
            + "| drift vs fp32 | %s | auto | 1 (2) | first guided velocity rel %.3g | latents after %d Euler steps "
            "rel %.3g | | | | |\n" % ("bf16", 0.0123, 30, 0.0456))
# The same table as the tool printed it before the attention and GPU-s columns (older logs).
DIT_TEXT_OLD = ("| DiT forward | %s | %d (%d) | %.1f, %.1f | %.3f | %.1f | %.1f | %.2f |\n"
                % ("tf32", 8, 16, 209.4, 197.0, 0.739, 283.3, 414.0, 0.68))

# tools/mm3_bench_stage0.c's S0BENCH lines (its printf formats), a run cut short by --time-limit.
S0_FRAME_FMT = ("S0BENCH kind=frame context=%d pairs=%d prompt_tokens=%d ms_median=%.4f ms_mean=%.4f ms_min=%.4f "
                "ms_max=%.4f steps=%d mean_pos=%.1f weight_bytes=%.0f kv_bytes=%.0f floor_ms=%.4f ratio=%.4f "
                "prefill_s=%.4f prefill_tokens=%.0f\n")
S0_TEXT = ("bench-s0[1] 12.000 INFO  mm3_bench_stage0.c:700: checkpoint /tmp/ck loaded in 20.1 s\n"
           "| ms per frame | 1000 | 1 | 20.00 | 5.43 | 3.68 | ... |\n"
           + "S0BENCH kind=setup backend=%s load_s=%.3f weight_bytes=%.0f kv_bytes_per_pos=%.0f max_rows=%d "
           "max_ctx=%d max_batched_tokens=%d frames=%d warmup=%d\n"
           % ("cuda", 20.1, 22.31e9, 294912, 16, 5400, 10240, 16, 2)
           + "S0BENCH kind=copy GBps=%.2f bytes=%zu\n".replace("%zu", "%d") % (4213.5, 1 << 30)
           + S0_FRAME_FMT % (1000, 1, 998, 20.0, 20.5, 19.0, 25.0, 16, 1010.0, 22.31e9, 595722240, 5.4365, 3.6788,
                             0.8, 1996)
           + S0_FRAME_FMT % (1000, 8, 998, 80.0, 81.0, 78.0, 90.0, 16, 1020.0, 22.31e9, 4812963840, 6.4374, 12.4274,
                             4.1, 7984)
           + S0_FRAME_FMT % (5000, 1, 4999, 24.0, 24.5, 23.0, 30.0, 16, 5010.0, 22.31e9, 2955018240, 5.9963,
                             4.0025, 6.0, 9998)
           + "S0BENCH kind=skipped context=%d pairs=%d prompt_tokens=%d reason=\"%s\"\n"
           % (5000, 8, 4999, "time limit 120 s reached while prefilling context 5000, 8 pairs, 40.2 s after its "
              "submit (at 121.0 s)")
           + "S0BENCH kind=ttff prompt_tokens=%d s=%.4f\n" % (998, 0.9)
           + "S0BENCH kind=memory peak_used_bytes=%.0f after_start_bytes=%.0f plan_bytes=%zu total_bytes=%.0f "
           "utilization=%.3f budget_bytes=%.0f\n".replace("%zu", "%d")
           % (52e9, 50e9, 49e9, 150e9, 0.6, 90e9)
           + "mm3-bench-stage0 exit 0, wall 130 s\n")


def synthetic_run(d, with_e2e):
    """A run as bench.sh leaves it on an H200, PyTorch figures as docs/performance.md quotes them."""
    def put(name, doc):
        with open(os.path.join(d, name + ".json"), "w") as f:
            json.dump(doc, f)
    put("meta", {"date": "2026-11-30", "device": "NVIDIA H200", "dry_run": False,
                 "stage0_na": "stage 0 has no CUDA backend yet"})
    put("ops", parse_tools.parse_ops(OPS_TEXT))
    put("load", parse_tools.parse_load(LOAD_TEXT))
    if with_e2e:
        put("stage0", parse_tools.parse_stage0(S0_TEXT))
    put("dit", parse_tools.parse_dit(DIT_TEXT) if with_e2e else
        {"tool": "mm3-bench-dit", "ok": False, "reason": "mm3-bench-dit not built"})
    wb = 22.31e9
    s0 = []
    for ctx, pairs, ms in ((1000, 1, 15.8), (1000, 8, 28.7), (5000, 1, 21.5), (5000, 8, 74.4)):
        for mode, f in (("graph", 1.0), ("eager", 5.0)):
            s0.append({"context": ctx, "pairs": pairs, "rows": 2 * pairs, "mode": mode, "ms_per_frame": ms * f,
                       "lm_ms": 0.7 * ms * f, "depth_ms": 0.3 * ms * f, "weight_bytes": wb,
                       "kv_bytes": 147456 * 2 * pairs * ctx, "decode_vs_uncached_rel_l2": 1e-3,
                       "peak_mem_gib": 30.0})
    put("pytorch_stage0", {"tool": "pytorch_stage0", "ok": True, "copy_GBps": 4100.0, "results": s0})
    dit = []
    for prec, ms1 in (("bf16", 23.3), ("tf32", 40.1), ("fp32", 175.0)):
        for w, scale in ((1, 1.0), (8, 6.0)):
            for mode, f in (("graph", 1.0), ("eager", 1.05)):
                ms = ms1 * scale * f
                flop = 6.977e12 * w / 1e12
                dit.append({"precision": prec, "mode": mode, "windows": w, "batch": 2 * w, "latents": 689,
                            "ms_per_forward": ms, "s_per_window": 30 * ms / 1e3 / w, "window_latency_s": 30 * ms / 1e3,
                            "tflop_per_forward": flop, "tflops": flop / (ms / 1e3), "peak_mem_gib": 12.0})
    put("pytorch_dit", {"tool": "pytorch_dit", "ok": True, "steps": 30, "device": {"name": "NVIDIA H200"},
                        "results": dit})
    if with_e2e:
        put("e2e", {"tool": "e2e", "ok": True,
                    "single": {"ok": True, "wall_s": 8.0, "rtf": 8.0 / 30.0, "ttfa_s": 2.0, "audio_s": 30.0},
                    "concurrent": {"ok": 8, "audio_s_per_s": 12.0, "latency_p50_s": 18.0, "latency_p95_s": 20.0},
                    "gpu_peak_gib": {"mm3-stage0": 25.0, "mm3-stage1": 12.5}})
        put("e2e_config", {"stage1_precision": "fp16", "config": "configs/minimax_music3.yaml"})


def by_figure(rows, prefix):
    hits = [r for r in rows if r.figure.startswith(prefix)]
    assert len(hits) >= 1, prefix
    return hits[0]


class ParseTest(unittest.TestCase):
    def test_ops(self):
        d = parse_tools.parse_ops(OPS_TEXT)
        self.assertTrue(d["ok"])
        self.assertEqual(d["copy_GBps"], 4213.0)
        self.assertEqual(d["floor_ms"], 5.29)
        self.assertEqual(d["frame"]["2"]["kernel_sum_ms"], 6.76)
        self.assertEqual(d["frame"]["16"]["fused_ms"], 10.10)
        self.assertEqual(d["frame"]["2"]["best_ms"], 6.75)
        self.assertEqual(d["attention"]["16"]["us"], 274.8)

    def test_ops_no_cuda(self):
        d = parse_tools.parse_ops("no CUDA\n", 77)
        self.assertFalse(d["ok"])
        self.assertEqual(d["reason"], "no CUDA device")

    def test_ops_changed_format(self):
        d = parse_tools.parse_ops("something else entirely\n", 0)
        self.assertFalse(d["ok"])
        self.assertIn("did not parse", d["reason"])

    def test_ops_crash(self):
        d = parse_tools.parse_ops("device: x; median of 15 samples\nerror: cuda_malloc: out of memory\n", 1)
        self.assertFalse(d["ok"])
        self.assertIn("exit 1", d["reason"])
        self.assertIn("out of memory", d["reason"])

    def test_load(self):
        d = parse_tools.parse_load(LOAD_TEXT)
        self.assertTrue(d["ok"])
        self.assertEqual(d["cache"], "cold")
        self.assertEqual(d["total"]["load_GBps"], 2.66)
        self.assertEqual(set(d["components"]), {"language_model", "transformer"})

    def test_dit_table(self):
        d = parse_tools.parse_dit(DIT_TEXT)
        self.assertTrue(d["ok"])
        self.assertEqual(len(d["results"]), 3)
        r = d["results"][0]
        self.assertEqual((r["precision"], r["windows"], r["batch"]), ("bf16", 1, 2))
        self.assertEqual(r["ms_per_forward"], 13.2)  # the graph, faster than eager
        self.assertEqual(d["results"][2]["ms_per_forward"], 180.2)  # no graph figure (0.0): eager
        self.assertEqual(d["drift"]["bf16"]["latents_rel"], 0.0456)
        self.assertEqual((r["attention"], r["gpu_s_per_audio_s"]), ("auto", 0.099))
        old = parse_tools.parse_dit(DIT_TEXT_OLD)["results"][0]
        self.assertEqual((old["windows"], old["s_per_window"], old["fraction_of_peak"]), (8, 0.739, 0.68))
        self.assertNotIn("gpu_s_per_audio_s", old)
        self.assertEqual(parse_tools.parse_dit("mm3-bench-dit: built without CUDA\n", 77)["reason"],
                         "no CUDA device")

    def test_dit_heuristic(self):
        d = parse_tools.parse_dit("bf16: 21.5 ms/forward, 0.645 s/window, 324.5 TFLOP/s\n"
                                  "tf32: 38.0 ms/forward, 1.14 s/window, 183.6 TFLOP/s\n")
        self.assertTrue(d["ok"])
        self.assertEqual(d["ms_per_forward"], 21.5)
        self.assertEqual(d["tflops"], 324.5)
        self.assertFalse(parse_tools.parse_dit("nothing here\n")["ok"])


    def test_stage0(self):
        d = parse_tools.parse_stage0(S0_TEXT)
        self.assertTrue(d["ok"])
        self.assertEqual(d["copy_GBps"], 4213.5)
        self.assertEqual([(r["context"], r["pairs"]) for r in d["results"]], [(1000, 1), (1000, 8), (5000, 1)])
        r = d["results"][1]
        self.assertEqual((r["ms_per_frame"], r["floor_ms"], r["prompt_tokens"], r["steps"]), (80.0, 6.4374, 998, 16))
        self.assertEqual(r["kv_bytes"], 4812963840)
        self.assertEqual(d["skipped"][0]["pairs"], 8)
        self.assertIn("40.2 s after its submit", d["skipped"][0]["reason"])
        self.assertEqual((d["ttff_s"], d["ttff_prompt_tokens"]), (0.9, 998))
        self.assertEqual(d["memory"]["budget_bytes"], 90e9)
        self.assertEqual(d["setup"]["backend"], "cuda")

    def test_stage0_failures(self):
        self.assertEqual(parse_tools.parse_stage0("mm3-bench-stage0: no CUDA device (or built without CUDA)\n", 77)
                         ["reason"], "no CUDA device")
        # exit 1 (one configuration failed): the others' figures stay, with a warning
        d = parse_tools.parse_stage0(S0_TEXT + "mm3-bench-stage0: context 5000, 8 pairs: out of memory\n", 1)
        self.assertTrue(d["ok"])
        self.assertIn("exit 1", d["warning"])
        # everything skipped: not ok, and the reason is the skip's
        only_skip = "\n".join(l for l in S0_TEXT.splitlines() if "kind=frame" not in l)
        d = parse_tools.parse_stage0(only_skip, 0)
        self.assertFalse(d["ok"])
        self.assertIn("time limit", d["reason"])
        self.assertIn("did not parse", parse_tools.parse_stage0("garbage\n", 0)["reason"])
        d = parse_tools.parse_stage0("error: cannot load\n", 1)
        self.assertFalse(d["ok"])
        self.assertIn("exit 1", d["reason"])


class TableTest(unittest.TestCase):
    def test_windows(self):
        self.assertEqual(table.windows_for(750), 7)
        self.assertEqual(table.windows_for(9000), 89)
        self.assertEqual(table.windows_for(200), 1)
        self.assertEqual(table.windows_for(201), 2)

    def test_full_run(self):
        with tempfile.TemporaryDirectory() as d:
            synthetic_run(d, with_e2e=True)
            docs = table.load_dir(d)
            rows = table.build_rows(docs)
            # stage 0: PyTorch graph (the faster) in the cell, floor from mm3-bench-ops' copy bandwidth
            # ... and mm3's figure through the scheduler, its bound mm3's own floor (float32 KV)
            r = by_figure(rows, "ms per frame, context 1000, 1 CFG pair")
            self.assertAlmostEqual(r.pytorch, 15.8)
            self.assertEqual((r.mm3, r.bound), (20.0, 5.4365))
            self.assertAlmostEqual(r.ratio(r.bound), 20.0 / 5.4365)
            r = by_figure(rows, "ms per frame, context 5000, 8 CFG pairs")
            self.assertTrue(r.mm3.startswith("n/a (time limit 120 s reached while prefilling"), r.mm3)
            self.assertAlmostEqual(r.bound, (22.31e9 + 147456 * 2 * 8 * 5000) / 4213e9 * 1e3)  # PyTorch's bytes
            self.assertEqual(by_figure(rows, "time to first frame, 998-token prompt").mm3, 0.9)
            r = by_figure(rows, "peak GPU memory, stage 0 benchmark")
            self.assertAlmostEqual(r.mm3, 52e9 / 2 ** 30)
            self.assertAlmostEqual(r.bound, 90e9 / 2 ** 30)
            self.assertAlmostEqual(by_figure(rows, "prefill through the scheduler, context 1000").mm3,
                                   (1996 + 7984) / (0.8 + 4.1))
            # stage 1: bound = FLOP at the bf16 dense peak
            r = by_figure(rows, "DiT s per window, bf16, 1 window")
            self.assertAlmostEqual(r.pytorch, 0.699, places=3)
            # stage 1, mm3 side: bound from the GEMM peak mm3-bench-dit measured, not the data sheet
            r = by_figure(rows, "DiT s per window, bf16, 1 window")
            self.assertEqual(r.mm3, 0.396)
            self.assertAlmostEqual(r.bound, 30 * 6.977 / 780.1, places=4)
            self.assertAlmostEqual(r.ratio(r.pytorch), 0.396 / 0.699, places=3)
            r = by_figure(rows, "DiT TFLOP/s, bf16, batch 16")
            self.assertEqual((r.mm3, r.bound), (570.1, 780.1))
            # GPU seconds per audio second: the tool's own column for mm3, s/window over 4 s for PyTorch
            r = by_figure(rows, "DiT GPU seconds per second of audio, bf16, batch 16")
            self.assertEqual(r.mm3, 0.092)
            pt8 = by_figure(rows, "DiT s per window, bf16, 8 windows").pytorch
            self.assertAlmostEqual(r.pytorch, pt8 / 4.0, places=6)
            self.assertTrue(by_figure(rows, "DiT s per window, tf32, 1 window").mm3.startswith("n/a (not in"))
            # goals: wall 8 s vs <= 6.5 -> missed by 23%; aggregate 12 >= 9 met
            r = by_figure(rows, "one 30 s song alone, wall time")
            met, text = r.met()
            self.assertFalse(met)
            self.assertIn("23% over", text)
            # beside it the previous figure and the precision's parity dB (fp16: 40.1 dB)
            self.assertIn("stage 1 fp16, audio 40.1 dB from float32", r.note)
            self.assertIn("previous 11.3 s (tf32", r.note)
            self.assertTrue(by_figure(rows, "8 concurrent 30 s songs").met()[0])
            self.assertTrue(by_figure(rows, "time to first audio").met()[0])
            # speed-up over the composed PyTorch baseline: 751 frames x 15.8 ms + 7 x 0.699 s
            want = (751 * 15.8e-3 + 7 * 0.699) / 8.0
            self.assertAlmostEqual(by_figure(rows, "end-to-end speed-up").mm3, want, places=2)
            self.assertEqual(by_figure(rows, "peak GPU memory, stage 1").mm3, 12.5)
            # load: mm3 rate over the disk's
            r = by_figure(rows, "checkpoint load, 26.9 GB")
            self.assertAlmostEqual(r.ratio(r.bound), 2.66 / 2.83)
            text = table.render(rows, docs)
            self.assertIn("no: 8.00 vs 6.50, 23% over", text)

    def test_precision_under_40_db_counts_toward_no_goal(self):
        with tempfile.TemporaryDirectory() as d:
            synthetic_run(d, with_e2e=True)
            with open(os.path.join(d, "e2e_config.json"), "w") as f:
                json.dump({"stage1_precision": "bf16"}, f)
            r = by_figure(table.build_rows(table.load_dir(d)), "8 concurrent 30 s songs")
            self.assertIsNone(r.goal)
            self.assertIn("23.4 dB", r.note)
            self.assertIn("does not count toward the goals", r.note)

    def test_missing_everything(self):
        with tempfile.TemporaryDirectory() as d:
            rows = table.build_rows(table.load_dir(d))
            self.assertGreater(len(rows), 15)
            for r in rows:
                # every row states a value or why there is none
                self.assertTrue(isinstance(r.mm3, (int, float)) or str(r.mm3).startswith(("n/a (", "—")), r.figure)
            self.assertTrue(any("not run" in str(r.mm3) for r in rows))

    def test_without_e2e(self):
        with tempfile.TemporaryDirectory() as d:
            synthetic_run(d, with_e2e=False)
            with open(os.path.join(d, "meta.json"), "w") as f:
                json.dump({"e2e_na": "the stages have no CUDA backend yet"}, f)
            rows = table.build_rows(table.load_dir(d))
            r = by_figure(rows, "one 30 s song alone, wall time")
            self.assertEqual(r.mm3, "n/a (the stages have no CUDA backend yet)")
            self.assertIsNone(r.met()[0])
            self.assertIsInstance(r.pytorch, float)  # the derived PyTorch figure is still there
            # no mm3-bench-dit: the bound comes from the data-sheet peak of the device
            r = by_figure(rows, "DiT s per window, bf16, 1 window")
            self.assertAlmostEqual(r.bound, 30 * 6.977 / 989.4, places=4)
            self.assertEqual(r.mm3, "n/a (mm3-bench-dit not built)")
            # no mm3-bench-stage0 run: its rows say so, the PyTorch floor stays the bound
            r = by_figure(rows, "ms per frame, context 1000, 1 CFG pair")
            self.assertEqual(r.mm3, "n/a (mm3-bench-stage0: not run)")
            self.assertAlmostEqual(r.bound, (22.31e9 + 147456 * 2 * 1000) / 4213e9 * 1e3)
            self.assertEqual(by_figure(rows, "time to first frame").mm3, "n/a (mm3-bench-stage0: not run)")


class E2eTest(unittest.TestCase):
    def test_selftest(self):
        self.assertEqual(e2e.selftest(), 0)

    def test_percentile(self):
        self.assertEqual(e2e.percentile([1, 2, 3, 4, 5], 50), 3)
        self.assertAlmostEqual(e2e.percentile([1, 2, 3, 4, 5], 95), 4.8)
        self.assertIsNone(e2e.percentile([], 50))

    def test_refused(self):
        r = e2e.one_song("http://127.0.0.1:9", 1.0, 0, timeout=2)  # discard port: nothing listens
        self.assertFalse(r["ok"])
        self.assertIn("error", r)

    def test_listener(self):
        # plays from the first byte: 4 s at 0 runs dry at 4; 4 s at 3.5 (early) -> 8; 4 s at 9
        # (a 1 s stall) -> 13; 4 s at 12 (early) -> 17; 1 s at 20 (a 3 s stall)
        stalls, s = e2e.listen([(0, 4), (3.5, 4), (9, 4), (12, 4), (20, 1)])
        self.assertEqual(stalls, 2)
        self.assertAlmostEqual(s, 4.0)
        self.assertEqual(e2e.listen([(5, 1)]), (0, 0.0))  # a first byte is no stall, however late

    def test_compare(self):
        with tempfile.TemporaryDirectory() as d:
            runs = []
            for label, rate, stalled in (("deadline", 5.1, 0), ("fifo", 5.2, 16)):
                p = os.path.join(d, label + ".json")
                with open(p, "w") as f:
                    json.dump({"label": label, "concurrent": {"audio_s_per_s": rate, "ttfa_p95_s": 1.5,
                                                              "streams_stalled": stalled}}, f)
                runs.append(p)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(e2e.compare(runs), 0)
            text = out.getvalue()
            self.assertIn("| | deadline | fifo |", text)
            self.assertIn("| streams that stalled | 0 | 16 |", text)
            self.assertIn("| throughput vs deadline | +0.0 % | +2.0 % |", text)
            self.assertIn("| latency p50 s | n/a | n/a |", text)


# ncu --csv --metrics gpu__time_duration.sum, as scripts/device-stage0.sh NCU=1 writes it.
NCU_HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
            '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def ncu_row(i, name, grid, unit, value, metric="gpu__time_duration.sum"):
    return (f'"{i}","1","mm3-bench-stage0","h","{name}","1","7","(256, 1, 1)","{grid}","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"\n')


class CsvFileTest(unittest.TestCase):
    """A test that writes its input files (removed afterwards)."""

    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name


class NcuStepTest(CsvFileTest):
    def test_summary(self):
        path = self.write("==PROF== Connected to process 1\n" + NCU_HEAD +
                          ncu_row(0, "void gemv_mma_kernel<2, 2, 0, 1, 3>(float *, const float *)", "(192, 1, 1)",
                                  "ns", "26,496") +
                          ncu_row(1, "attn_combine_kernel(float *, const float *, int, int, int)", "(32, 16, 1)",
                                  "ns", "3296") +
                          ncu_row(2, "void gemv_mma_kernel<2, 2, 0, 1, 3>(float *, const float *)", "(192, 1, 1)",
                                  "us", "21.5"))
        launches = ncu_step.read_launches(path)
        self.assertEqual([k for k, _, _ in launches],
                         ["gemv_mma_kernel<2, 2, 0, 1, 3>", "attn_combine_kernel", "gemv_mma_kernel<2, 2, 0, 1, 3>"])
        self.assertAlmostEqual(launches[0][2], 26.496)
        rows = ncu_step.summarize(launches)
        self.assertEqual(rows[0][:3], ("gemv_mma_kernel<2, 2, 0, 1, 3>", "(192, 1, 1)", 2))
        self.assertAlmostEqual(rows[0][3], 47.996)
        self.assertEqual(rows[1][2], 1)

    def test_smem_configs(self):
        """The L1/shared split per launch and how often it changes, in ID order (not file order)."""
        cfg = "launch__shared_mem_config_size"
        gemv, att = "void gemv_bf16_kernel<2, 4, 1, 0, 1>(float *)", "attn_combine_kernel(float *)"
        path = self.write(NCU_HEAD + ncu_row(0, gemv, "(1536, 1, 1)", "ns", "19,520") +
                          ncu_row(0, gemv, "(1536, 1, 1)", "byte", "16,384", cfg) +
                          ncu_row(2, gemv, "(1536, 1, 1)", "byte", "16,384", cfg) +
                          ncu_row(1, att, "(32, 2, 1)", "byte", "32,768", cfg) +
                          ncu_row(3, gemv, "(1536, 1, 1)", "byte", "16,384", cfg))
        configs = ncu_step.read_smem_configs(path)
        self.assertEqual(configs["1"], ("attn_combine_kernel", 32768))
        self.assertEqual(configs["3"], ("gemv_bf16_kernel<2, 4, 1, 0, 1>", 16384))
        self.assertEqual(ncu_step.config_changes(configs), 2)  # 16K -> 32K -> 16K, then 16K again
        self.assertEqual(ncu_step.read_smem_configs(self.write(NCU_HEAD + ncu_row(0, gemv, "(1, 1, 1)", "ns", "5"))),
                         {})
        with self.assertRaisesRegex(ValueError, "unit 'cycle' of launch__shared_mem_config_size"):
            ncu_step.read_smem_configs(self.write(NCU_HEAD + ncu_row(0, gemv, "(1, 1, 1)", "cycle", "5", cfg)))

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "no gpu__time_duration.sum rows"):
            ncu_step.read_launches(self.write(NCU_HEAD))
        with self.assertRaisesRegex(ValueError, "unit 'cycle'"):
            ncu_step.read_launches(self.write(NCU_HEAD + ncu_row(0, "k(int)", "(1, 1, 1)", "cycle", "5")))
        self.assertEqual(ncu_step.main([self.write(NCU_HEAD)]), 1)


class KernelTraceTest(CsvFileTest):
    def test_replays(self):
        """Two replays of a 3-node graph (the second overlapped by PDL, with a gap) and one eager kernel."""
        gemv, att = "_Z16gemv_bf16_kernelILi2ELi4ELb1ELi0ELb1EEvPfPKfPKtiiS3_f", "attn_combine_kernel"
        path = self.write(f"0,5000,0,0,7,1x1x1,{att}\n"  # outside any graph: ignored
                          f"10000,20000,3,101,7,1536x1x1,{gemv}\n"
                          f"19000,25000,3,102,7,32x2x1,{att}\n"
                          f"24000,30000,3,103,7,1536x1x1,{gemv}\n"
                          f"40000,50000,3,101,7,1536x1x1,{gemv}\n"
                          f"49000,52000,3,102,7,32x2x1,{att}\n"
                          f"53000,60000,3,103,7,1536x1x1,{gemv}\n")
        reps = kernel_trace.replays(kernel_trace.read_trace(path))
        self.assertEqual(list(reps), [3])
        self.assertEqual(len(reps[3]), 2)
        contrib = kernel_trace.contributions(reps[3][-1])
        kind = contrib[0][0]
        self.assertTrue(kind.startswith("gemv_bf16_kernel" if shutil.which("c++filt") else "_Z16gemv"), kind)
        # run, added (idle before it included), overlap with what ran before
        self.assertEqual([c[2:] for c in contrib], [(10.0, 10.0, 0.0), (3.0, 2.0, 1.0), (7.0, 8.0, 0.0)])
        rows = kernel_trace.summarize(contrib)
        self.assertEqual((rows[0][1], rows[0][2], rows[0][3]), ("1536x1x1", 2, 18.0))
        self.assertEqual(kernel_trace.main([path]), 0)

    def test_bad_input(self):
        with self.assertRaisesRegex(ValueError, "no kernel"):
            kernel_trace.read_trace(self.write(""))
        with self.assertRaisesRegex(ValueError, ":2: expected start,end"):
            kernel_trace.read_trace(self.write("1,2,0,0,7,1x1x1,k\n1,2,3\n"))
        with self.assertRaisesRegex(ValueError, ":1: start, end, graph and node must be integers"):
            kernel_trace.read_trace(self.write("a,2,0,0,7,1x1x1,k\n"))
        self.assertEqual(kernel_trace.main([self.write("1,2,0,0,7,1x1x1,k\n")]), 1)  # no graph replayed twice


if __name__ == "__main__":
    unittest.main()
