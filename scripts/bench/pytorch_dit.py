#!/usr/bin/env python3
"""PyTorch baseline for stage 1: the reference DiT forward (docs/model.md section 7)
in plain PyTorch, timed at the release geometry with random weights on the GPU.

    pytorch_dit.py [--json FILE] [--windows 1,8] [--precisions bf16,tf32,fp32] [--modes eager,graph]
                   [--latents 689] [--steps 30] [--checkpoint DIR] [--tiny] [--reps N]
    pytorch_dit.py --check TRANSFORMER_DIR_OR_FILE --golden CASE.safetensors [--json FILE]

Batch = 2 x windows (the CFG pair of every window in one forward), 689 latents per window.
For each precision (bf16 weights and activations; fp32 weights with TF32 matmuls; fp32 with
TF32 off) and mode (eager; one forward captured in a CUDA graph, CUDA only) it reports
ms/forward, s/window (steps x forward / windows: throughput when the windows run together),
the window latency (steps x forward) and TFLOP/s.

--check loads a (tiny) transformer checkpoint, runs the forward in float32 with TF32 off
on the CPU and compares with the golden dit_call.{0,1}.out: proof that the timed code
computes the reference function. Exit 1 when rel. L2 > 1e-4.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (scripts/bench/common.py)

# The release's transformer/config.json (docs/model.md section 2).
RELEASE = {
    "in_channels": 128, "condition_dim": 2048, "num_layers": 36, "num_attention_heads": 32,
    "attention_head_dim": 64, "ff_inner_dim": 8192, "rotary_dim": 32, "fourier_embedding_dim": 256,
}
# Small enough for a CPU smoke run, odd enough to catch a size taken from the wrong field.
TINY = {
    "in_channels": 128, "condition_dim": 48, "num_layers": 2, "num_attention_heads": 2,
    "attention_head_dim": 32, "ff_inner_dim": 96, "rotary_dim": 16, "fourier_embedding_dim": 16,
}


class Geometry:
    def __init__(self, cfg):
        self.cin = int(cfg["in_channels"])
        self.cond = int(cfg["condition_dim"])
        self.layers = int(cfg["num_layers"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = int(cfg["attention_head_dim"])
        self.ff = int(cfg["ff_inner_dim"])
        self.rotary = int(cfg["rotary_dim"])
        self.fourier = int(cfg["fourier_embedding_dim"])
        self.hidden = self.heads * self.head_dim
        self.pre = 2 * self.cin + self.cond  # [latent | reserved zeros | condition]

    def shapes(self):
        """Every tensor of transformer/ with its shape, checkpoint names."""
        s = {
            "time_proj.weight": (self.fourier // 2, 1),
            "time_embed.linear_1.weight": (self.hidden, self.fourier),
            "time_embed.linear_1.bias": (self.hidden,),
            "time_embed.linear_2.weight": (self.hidden, self.hidden),
            "time_embed.linear_2.bias": (self.hidden,),
            "preprocess_conv.weight": (self.pre, self.pre, 1),
            "proj_in.weight": (self.hidden, self.pre),
            "proj_out.weight": (self.cin, self.hidden),
            "postprocess_conv.weight": (self.cin, self.cin, 1),
        }
        for i in range(self.layers):
            p = f"transformer_blocks.{i}."
            for n in ("norm1", "norm2"):
                s[p + n + ".weight"] = (self.hidden,)
                s[p + n + ".bias"] = (self.hidden,)
            for n in ("to_q", "to_k", "to_v", "to_out.0"):
                s[p + "attn." + n + ".weight"] = (self.hidden, self.hidden)
            s[p + "ff_in.weight"] = (2 * self.ff, self.hidden)
            s[p + "ff_in.bias"] = (2 * self.ff,)
            s[p + "ff_out.weight"] = (self.hidden, self.ff)
            s[p + "ff_out.bias"] = (self.hidden,)
        return s

    def flops(self, batch, latents):
        """FLOP of one forward (2 per multiply-add): linears, attention, the input/output convs."""
        T = latents + 1
        per_tok_block = 4 * self.hidden ** 2 + 2 * self.ff * self.hidden + self.ff * self.hidden
        mac = batch * T * self.layers * per_tok_block
        mac += batch * self.layers * 2 * T * T * self.hidden  # q k^T and p v
        mac += batch * latents * (self.pre * self.pre + self.pre * self.hidden
                                  + self.hidden * self.cin + self.cin * self.cin)
        return 2.0 * mac


def random_weights(g, device, dtype, seed=0):
    """Random weights drawn on the device: timing needs the shapes, not trained values.
    Scales keep activations finite in bf16 (1/sqrt(fan_in) linears, unit norms)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    w = {}
    for name, shape in g.shapes().items():
        if name.endswith("norm1.weight") or name.endswith("norm2.weight"):
            t = torch.ones(shape, device=device, dtype=dtype)
        elif name.endswith(".bias"):
            t = torch.zeros(shape, device=device, dtype=dtype)
        else:
            fan_in = shape[1] if len(shape) > 1 else 1
            t = torch.randn(shape, device=device, dtype=dtype, generator=gen) / math.sqrt(fan_in)
        w[name] = t
    return w


def load_weights(path, g, device):
    from safetensors.torch import load_file
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        w = {}
        for f in files:
            w.update(load_file(os.path.join(path, f)))
    else:
        w = load_file(path)
    want = g.shapes()
    for name, shape in want.items():
        if name not in w:
            raise SystemExit(f"pytorch_dit: {path}: tensor '{name}' missing")
        if tuple(w[name].shape) != tuple(shape):
            raise SystemExit(f"pytorch_dit: {path}: '{name}' has shape {tuple(w[name].shape)}, expected {shape}")
    return {k: w[k].to(device=device, dtype=torch.float32) for k in want}


def rope_tables(g, T, device, dtype):
    """cos/sin [T, rotary] over positions 0..T-1 (time token = 0), built in fp32 then cast."""
    half = g.rotary // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, g.rotary, 2, dtype=torch.float32, device=device) / g.rotary))
    pos = torch.arange(T, dtype=torch.float32, device=device)
    theta = torch.outer(pos, inv_freq)  # [T, half]
    emb = torch.cat((theta, theta), dim=-1)
    assert emb.shape[-1] == 2 * half
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(u, cos, sin, rotary):
    """NeoX rotate_half on the first `rotary` dims of u [B, H, T, D]; the rest untouched."""
    r, rest = u[..., :rotary], u[..., rotary:]
    h = rotary // 2
    x1, x2 = r[..., :h], r[..., h:]
    rot = torch.cat((-x2, x1), dim=-1)
    return torch.cat((r * cos + rot * sin, rest), dim=-1)


def dit_forward(w, g, x, t, c, cos, sin):
    """x [B, cin, L] noisy latents, t [B] flow time, c [B, L, cond] aligned condition -> v [B, cin, L]."""
    B, _, L = x.shape
    dt = x.dtype
    h0 = torch.cat((x, torch.zeros(B, g.cin, L, device=x.device, dtype=dt), c.transpose(1, 2)), dim=1)
    h1 = h0 + F.conv1d(h0, w["preprocess_conv.weight"])
    h = F.linear(h1.transpose(1, 2), w["proj_in.weight"])  # [B, L, hidden]

    ang = 2 * math.pi * t.view(B, 1).to(dt) * w["time_proj.weight"].view(1, -1)
    tf = torch.cat((ang.cos(), ang.sin()), dim=-1)
    temb = F.linear(F.silu(F.linear(tf, w["time_embed.linear_1.weight"], w["time_embed.linear_1.bias"])),
                    w["time_embed.linear_2.weight"], w["time_embed.linear_2.bias"])
    X = torch.cat((temb.view(B, 1, g.hidden), h), dim=1)  # [B, T, hidden]
    T = L + 1

    for i in range(g.layers):
        p = f"transformer_blocks.{i}."
        a = F.layer_norm(X, (g.hidden,), w[p + "norm1.weight"], w[p + "norm1.bias"], 1e-5)
        q = F.linear(a, w[p + "attn.to_q.weight"]).view(B, T, g.heads, g.head_dim).transpose(1, 2)
        k = F.linear(a, w[p + "attn.to_k.weight"]).view(B, T, g.heads, g.head_dim).transpose(1, 2)
        v = F.linear(a, w[p + "attn.to_v.weight"]).view(B, T, g.heads, g.head_dim).transpose(1, 2)
        if g.rotary > 0:
            q = apply_rope(q, cos, sin, g.rotary)
            k = apply_rope(k, cos, sin, g.rotary)
        o = F.scaled_dot_product_attention(q, k, v)
        X = X + F.linear(o.transpose(1, 2).reshape(B, T, g.hidden), w[p + "attn.to_out.0.weight"])
        a = F.layer_norm(X, (g.hidden,), w[p + "norm2.weight"], w[p + "norm2.bias"], 1e-5)
        gg = F.linear(a, w[p + "ff_in.weight"], w[p + "ff_in.bias"])
        val, gate = gg[..., :g.ff], gg[..., g.ff:]
        X = X + F.linear(val * F.silu(gate), w[p + "ff_out.weight"], w[p + "ff_out.bias"])

    y = F.linear(X[:, 1:], w["proj_out.weight"]).transpose(1, 2)  # [B, cin, L]
    return y + F.conv1d(y, w["postprocess_conv.weight"])


def set_precision(prec):
    tf32 = prec == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def check(args):
    """One float32 forward on the CPU against the golden reference calls."""
    from safetensors.torch import load_file
    set_precision("fp32")
    path = args.check
    cfg_dir = path if os.path.isdir(path) else os.path.dirname(path)
    g = Geometry(common.read_json(os.path.join(cfg_dir, "config.json")))
    w = load_weights(path, g, "cpu")
    gold = load_file(args.golden)
    results, worst = [], 0.0
    for call in (0, 1):
        key = f"dit_call.{call}."
        if key + "out" not in gold:
            continue
        x = gold[key + "hidden_states"].float()
        t = gold[key + "timestep"].float().reshape(-1).expand(x.shape[0])
        c = gold[key + "encoder_hidden_states"].float()
        cos, sin = rope_tables(g, x.shape[2] + 1, "cpu", torch.float32)
        with torch.no_grad():
            out = dit_forward(w, g, x, t, c, cos, sin)
        ref = gold[key + "out"].float()
        rel = (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()
        worst = max(worst, rel)
        results.append({"call": call, "latents": x.shape[2], "rel_l2": rel})
        print(f"dit_call.{call}: {x.shape[2]} latents, rel. L2 vs golden = {rel:.3e}")
    ok = bool(results) and worst <= 1e-4
    doc = {"tool": "pytorch_dit", "mode": "check", "weights": path, "golden": args.golden,
           "calls": results, "rel_l2_max": worst, "tolerance": 1e-4, "ok": ok}
    common.write_json(args.json, doc)
    print("check: " + ("OK" if ok else "FAILED") + f" (worst {worst:.3e}, tolerance 1e-4)")
    return 0 if ok else 1


def time_variant(g, w, device, prec, mode, windows, latents, steps, reps, warmup):
    dtype = torch.bfloat16 if prec == "bf16" else torch.float32
    B = 2 * windows
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(B, g.cin, latents, device=device, dtype=dtype, generator=gen)
    c = torch.randn(B, latents, g.cond, device=device, dtype=dtype, generator=gen)
    c[windows:] = 0  # the unconditional half of every CFG pair
    t = torch.full((B,), 0.5, device=device, dtype=dtype)
    cos, sin = rope_tables(g, latents + 1, device, dtype)
    fwd = lambda: dit_forward(w, g, x, t, c, cos, sin)  # noqa: E731

    out = None
    graph = None
    with torch.no_grad():
        if mode == "graph":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(warmup):
                    out = fwd()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fwd()
            run = graph.replay
        else:
            for _ in range(warmup):
                out = fwd()
            run = fwd
        sec = common.time_reps(run, device, reps)
    finite = bool(torch.isfinite(out).all().item()) if out is not None else False
    del graph
    flop = g.flops(B, latents)
    med = sec["median_s"]
    return {
        "precision": prec, "mode": mode, "windows": windows, "batch": B, "latents": latents,
        "ms_per_forward": med * 1e3, "ms_per_forward_min": sec["min_s"] * 1e3,
        "s_per_window": steps * med / windows, "window_latency_s": steps * med,
        "tflop_per_forward": flop * 1e-12, "tflops": flop / med * 1e-12, "output_finite": finite,
        "reps": reps,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tiny", action="store_true", help="small geometry on the CPU (smoke test)")
    ap.add_argument("--checkpoint", help="read the geometry from DIR/transformer/config.json (weights stay random)")
    ap.add_argument("--windows", default="1,8")
    ap.add_argument("--precisions", default="bf16,tf32,fp32")
    ap.add_argument("--modes", default="eager,graph")
    ap.add_argument("--latents", type=int, default=689)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default=None)
    ap.add_argument("--check", help="transformer folder or .safetensors file to compare with --golden")
    ap.add_argument("--golden", default=None, help="golden case with dit_call.* tensors")
    args = ap.parse_args()

    if args.check:
        if not args.golden:
            ap.error("--check needs --golden CASE.safetensors")
        return check(args)

    device = args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.tiny:
        cfg, source = TINY, "built-in tiny geometry"
        if args.latents == 689:
            args.latents = 64
    elif args.checkpoint:
        path = os.path.join(args.checkpoint, "transformer", "config.json")
        cfg, source = common.read_json(path), path
    else:
        cfg, source = RELEASE, "built-in release geometry (docs/model.md 2)"
    g = Geometry(cfg)
    windows = [int(v) for v in args.windows.split(",") if v]
    precs = [p for p in args.precisions.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    for p in precs:
        if p not in ("bf16", "tf32", "fp32"):
            ap.error(f"--precisions: unknown precision '{p}' (bf16, tf32, fp32)")
    for m in modes:
        if m not in ("eager", "graph"):
            ap.error(f"--modes: unknown mode '{m}' (eager, graph)")

    doc = {"tool": "pytorch_dit", "mode": "bench", "geometry_source": source, "geometry": cfg,
           "device": common.device_info(device), "torch": torch.__version__, "steps": args.steps,
           "params": sum(math.prod(s) for s in g.shapes().values()), "results": [], "skipped": []}
    print(f"pytorch_dit: {doc['device']['name']}, {source}, {doc['params'] / 1e9:.3f} B params")
    print(f"{'precision':>9} {'mode':>6} {'win':>4} {'batch':>5} {'ms/fwd':>9} {'s/window':>9} "
          f"{'latency s':>9} {'TFLOP/s':>8}")
    for prec in precs:
        set_precision(prec)
        dtype = torch.bfloat16 if prec == "bf16" else torch.float32
        w = random_weights(g, device, dtype)
        for mode in modes:
            if mode == "graph" and device == "cpu":
                doc["skipped"].append({"precision": prec, "mode": mode, "reason": "CUDA graphs need a GPU"})
                continue
            for nw in windows:
                try:
                    if device.startswith("cuda"):
                        torch.cuda.reset_peak_memory_stats()
                    r = time_variant(g, w, device, prec, mode, nw, args.latents, args.steps, args.reps, args.warmup)
                    if device.startswith("cuda"):
                        r["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
                except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # e.g. out of memory at 8 windows fp32
                    doc["skipped"].append({"precision": prec, "mode": mode, "windows": nw, "reason": str(e)[:300]})
                    print(f"{prec:>9} {mode:>6} {nw:>4}  failed: {str(e)[:120]}")
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                    continue
                doc["results"].append(r)
                print(f"{prec:>9} {mode:>6} {nw:>4} {r['batch']:>5} {r['ms_per_forward']:9.2f} "
                      f"{r['s_per_window']:9.3f} {r['window_latency_s']:9.3f} {r['tflops']:8.1f}")
        del w
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    set_precision("fp32")
    doc["ok"] = bool(doc["results"])
    common.write_json(args.json, doc)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
