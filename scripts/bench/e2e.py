#!/usr/bin/env python3
"""End-to-end benchmark through the HTTP API (both processes running, e.g. scripts/launch.sh).

    e2e.py --url URL [--duration 30] [--concurrency 8] [--json FILE] [--no-warmup] [--allow-stall]
    e2e.py --compare A.json B.json   the figures of two runs side by side (e.g. window_order
                                     deadline vs fifo: scripts/bench.sh --e2e-orders deadline,fifo)
    e2e.py --selftest        checks the measuring code against a local fake server

1. One song alone, streamed (`stream: true`, raw PCM): wall time from sending the request
   to the last byte, real-time factor (wall / audio seconds), time to the first audio byte.
2. --concurrency songs sent at once: aggregate audio seconds per wall second (first send
   to last byte), p50 / p95 of the per-song wall time and of the time to first audio.
While both run, nvidia-smi is polled (0.5 s) for the peak GPU memory of every process.

Every streamed song has a listener: it starts playing at 1x when the first byte arrives and
stalls whenever it has played everything received so far (the same arithmetic as the
server's stall metrics, stage0/playback.c). Per song: stalls and seconds stalled; per run:
songs that stalled, total stall time, first audio p50 / p95. --allow-stall sends
"allow_stall": true (the server starts every stream at once instead of holding those its
real-time capacity cannot keep fed).

Every song is sent with "ignore_eos": true (the server never draws the stop code), so random
weights give songs of the full length; --allow-stop sends the model's own stop. A song that
still ends before its cap is reported with its real audio length and "stopped_early": true.
"""
import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CAPTION = "an upbeat synth-pop song, female vocals, 120 BPM, bright pads and punchy drums"
LYRICS = ("[verse]\nneon rivers in the night\nwe are running out of time\n"
          "[chorus]\nhold on, hold on\nthe city sings our song")


def listen(arrivals):
    """A listener playing at 1x from the first arrival: arrivals is [(time_s, audio_s)] in
    order; returns (stalls, seconds stalled). A piece arriving after everything before it
    has played ended a stall of the difference; playback resumes with it."""
    stalls, stalled, runs_dry = 0, 0.0, None
    for t, audio in arrivals:
        if runs_dry is None:
            runs_dry = t
        elif t > runs_dry:
            stalls += 1
            stalled += t - runs_dry
            runs_dry = t
        runs_dry += audio
    return stalls, stalled


def one_song(url, duration, seed, timeout=1800.0, ignore_eos=True, allow_stall=False):
    """POST one streamed song; returns timings, sizes and its listener's stalls (never raises)."""
    u = urllib.parse.urlsplit(url)
    req = {"caption": CAPTION, "lyrics": LYRICS, "duration_s": duration, "seed": seed,
           "stream": True, "response_format": "pcm", "ignore_eos": ignore_eos}
    if allow_stall:
        req["allow_stall"] = True
    body = json.dumps(req).encode()
    r = {"duration_s": duration, "seed": seed, "ok": False}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        r["status"] = resp.status
        if resp.status != 200:
            r["error"] = resp.read(500).decode("utf-8", "replace")
            return r
        rate = int(resp.getheader("X-Sample-Rate", "44100"))
        channels = int(resp.getheader("X-Channels", "2"))
        n, first, arrivals = 0, None, []
        while True:
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            t = time.perf_counter() - t0
            if first is None:
                first = t
            n += len(chunk)
            arrivals.append((t, len(chunk) / (2 * channels) / rate))
        wall = time.perf_counter() - t0
        audio_s = n / (2 * channels) / rate
        stalls, stalled = listen(arrivals)
        r.update({"ok": n > 0, "wall_s": wall, "ttfa_s": first, "bytes": n, "audio_s": audio_s,
                  "rtf": wall / audio_s if audio_s > 0 else None, "sample_rate": rate,
                  "stopped_early": audio_s < 0.95 * duration, "stalls": stalls, "stall_s": stalled})
    except (OSError, http.client.HTTPException) as e:  # IncompleteRead: stream cut after audio began
        r["error"] = f"{type(e).__name__}: {e}"
        r["wall_s"] = time.perf_counter() - t0
    finally:
        conn.close()
    return r


def percentile(v, p):
    v = sorted(v)
    if not v:
        return None
    k = (len(v) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


class GpuMemPoller:
    """Peak used GPU memory per process name, from nvidia-smi every `period` seconds."""

    def __init__(self, period=0.5):
        self.period, self.peak, self.stop = period, {}, threading.Event()
        self.smi = shutil.which("nvidia-smi")
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            try:
                out = subprocess.run([self.smi, "--query-compute-apps=pid,process_name,used_memory",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                     timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                out = ""
            for line in out.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 3 and parts[2].isdigit():
                    name = os.path.basename(parts[1])
                    self.peak[name] = max(self.peak.get(name, 0), int(parts[2]))
            self.stop.wait(self.period)

    def __enter__(self):
        if self.smi:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.smi:
            self.thread.join()

    def result(self):
        if not self.smi:
            return None
        return {k: v / 1024.0 for k, v in self.peak.items()}  # MiB -> GiB


def server_gauges(url):
    """The server's own mm3_* figures from /metrics (capacity, stalls, queue): {name: value}, {} on failure."""
    u = urllib.parse.urlparse(url)
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("mm3_") and "{" not in line:
            name, _, value = line.partition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def concurrent(url, duration, n, seed0, ignore_eos=True, allow_stall=False):
    res = [None] * n
    start = threading.Barrier(n)

    def worker(i):
        start.wait()
        res[i] = one_song(url, duration, seed0 + i, ignore_eos=ignore_eos, allow_stall=allow_stall)

    t0 = time.perf_counter()
    th = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in res if r["ok"]]
    audio = sum(r["audio_s"] for r in ok)
    lat = [r["wall_s"] for r in ok]
    ttfa = [r["ttfa_s"] for r in ok]
    return {"songs": n, "ok": len(ok), "wall_s": wall, "audio_s": audio,
            "audio_s_per_s": audio / wall if wall > 0 else None,
            "latency_p50_s": percentile(lat, 50), "latency_p95_s": percentile(lat, 95),
            "ttfa_p50_s": percentile(ttfa, 50), "ttfa_p95_s": percentile(ttfa, 95),
            "stopped_early": sum(1 for r in ok if r["stopped_early"]),
            "stalls_per_stream": [r["stalls"] for r in ok], "streams_stalled": sum(1 for r in ok if r["stalls"]),
            "stalls_total": sum(r["stalls"] for r in ok), "stall_s_total": sum(r["stall_s"] for r in ok),
            "server": server_gauges(url), "requests": res}


def bench(args):
    doc = {"tool": "e2e", "url": args.url, "duration_s": args.duration, "concurrency": args.concurrency,
           "allow_stall": args.allow_stall, "label": args.label}
    ignore_eos, stall = not args.allow_stop, args.allow_stall
    with GpuMemPoller() as mem:
        if not args.no_warmup:
            doc["warmup"] = one_song(args.url, min(4.0, args.duration), 1, ignore_eos=ignore_eos)
        doc["single"] = one_song(args.url, args.duration, 7, ignore_eos=ignore_eos, allow_stall=stall)
        s = doc["single"]
        if s["ok"]:
            print(f"e2e: one {s['audio_s']:.1f} s song: wall {s['wall_s']:.2f} s, RTF {s['rtf']:.3f}, "
                  f"first audio {s['ttfa_s']:.2f} s" + (" (stopped early)" if s["stopped_early"] else ""))
        else:
            print(f"e2e: one song failed: {s.get('status', '')} {s.get('error', '')[:200]}")
        if args.concurrency > 0:
            c = concurrent(args.url, args.duration, args.concurrency, 100, ignore_eos=ignore_eos, allow_stall=stall)
            doc["concurrent"] = c
            if c["ok"]:
                print(f"e2e: {c['ok']}/{c['songs']} concurrent songs: {c['audio_s_per_s']:.2f} audio s per s, "
                      f"latency p50 {c['latency_p50_s']:.2f} s p95 {c['latency_p95_s']:.2f} s, "
                      f"first audio p50 {c['ttfa_p50_s']:.2f} s p95 {c['ttfa_p95_s']:.2f} s, "
                      f"{c['streams_stalled']} stalled ({c['stalls_total']} stalls, {c['stall_s_total']:.1f} s), "
                      f"stalls per stream {c['stalls_per_stream']}")
            else:
                print("e2e: every concurrent song failed")
    doc["gpu_peak_gib"] = mem.result()
    doc["ok"] = bool(doc["single"]["ok"])
    common.write_json(args.json, doc)
    return 0 if doc["ok"] else 1


COMPARE_ROWS = [
    ("aggregate audio s per s", "audio_s_per_s", "{:.2f}"),
    ("latency p50 s", "latency_p50_s", "{:.2f}"),
    ("latency p95 s", "latency_p95_s", "{:.2f}"),
    ("first audio p50 s", "ttfa_p50_s", "{:.2f}"),
    ("first audio p95 s", "ttfa_p95_s", "{:.2f}"),
    ("streams that stalled", "streams_stalled", "{}"),
    ("stalls", "stalls_total", "{}"),
    ("seconds stalled", "stall_s_total", "{:.1f}"),
]


def compare(paths):
    """The concurrent figures of runs side by side, plus each one's throughput against the first."""
    docs = []
    for p in paths:
        with open(p) as f:
            docs.append(json.load(f))
    names = [d.get("label") or os.path.basename(p) for d, p in zip(docs, paths)]
    conc = [d.get("concurrent") or {} for d in docs]
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for title, key, fmt in COMPARE_ROWS:
        cells = [fmt.format(c[key]) if c.get(key) is not None else "n/a" for c in conc]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    base = conc[0].get("audio_s_per_s")
    cells = [f"{100.0 * (c['audio_s_per_s'] / base - 1):+.1f} %" if base and c.get("audio_s_per_s") else "n/a"
             for c in conc]
    lines.append(f"| throughput vs {names[0]} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return 0


def selftest():
    """A fake server that streams 1 s of PCM in 4 chunks 0.1 s apart after a 0.3 s delay:
    the measured time to first audio, wall time and audio length must come out right."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    rate, delay, gap, chunks = 8000, 0.3, 0.1, 4

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert req["stream"] is True and req["response_format"] == "pcm"
            samples = int(req["duration_s"] * rate)
            time.sleep(delay)
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("X-Sample-Rate", str(rate))
            self.send_header("X-Channels", "2")
            self.end_headers()
            per = samples // chunks
            for i in range(chunks):
                if i:
                    time.sleep(gap)
                n = per if i < chunks - 1 else samples - per * (chunks - 1)
                data = b"\0" * (4 * n)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        s = one_song(url, 1.0, 0)
        c = concurrent(url, 1.0, 3, 0)
    finally:
        srv.shutdown()
        srv.server_close()
    want_wall = delay + gap * (chunks - 1)
    # the listener: arrivals at 0 (2 s), 1.5 (1 s: early), 4 (due 3: 1 s stall), 4.5 (due 5: early)
    st, st_s = listen([(0.0, 2.0), (1.5, 1.0), (4.0, 1.0), (4.5, 0.5)])
    st2, st2_s = listen([(10.0, 1.0), (12.0, 1.0), (13.5, 1.0)])  # two stalls: 1 s and 0.5 s
    checks = [
        ("listener: one stall of 1 s", st == 1 and abs(st_s - 1.0) < 1e-9),
        ("listener: two stalls, 1.5 s", st2 == 2 and abs(st2_s - 1.5) < 1e-9),
        ("listener: nothing, no stall", listen([]) == (0, 0.0)),
        ("one song ok", s["ok"]),
        ("audio length 1.0 s", abs(s["audio_s"] - 1.0) < 1e-9),
        ("first audio ~0.3 s", abs(s["ttfa_s"] - delay) < 0.08),
        ("wall ~0.6 s", abs(s["wall_s"] - want_wall) < 0.1),
        ("3 concurrent ok", c["ok"] == 3),
        ("aggregate ~3/0.6 audio s per s", abs(c["audio_s_per_s"] - 3.0 / want_wall) < 1.0),
        ("p95 >= p50", c["latency_p95_s"] >= c["latency_p50_s"]),
        # 1 s of audio in 4 pieces 0.1 s apart: each is early (0.25 s of audio per 0.1 s)
        ("fake server's stream never stalls", s["stalls"] == 0 and c["stalls_total"] == 0),
        ("stalls per stream listed", c["stalls_per_stream"] == [0, 0, 0]),
    ]
    bad = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    print("e2e selftest: " + ("passed" if not bad else "FAILED: " + ", ".join(bad)))
    return 0 if not bad else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("MM3_URL", "http://127.0.0.1:8000"))
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--allow-stop", action="store_true", help="let the model end songs early (no ignore_eos)")
    ap.add_argument("--allow-stall", action="store_true",
                    help="send allow_stall: true (streams start at once, past the real-time capacity)")
    ap.add_argument("--label", help="name of this run in --compare tables (e.g. the window order)")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="print the runs' figures side by side")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if args.compare:
        return compare(args.compare)
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
