#!/usr/bin/env python3
"""Optimised PyTorch baseline for stage 0 (docs/performance.md, "The PyTorch baselines").

    pytorch_stage0.py [--json FILE] [--contexts 1000,5000] [--pairs 1,8] [--modes graph,eager]
                      [--frames N] [--checkpoint DIR] [--tiny] [--cache-len N]

transformers' Qwen3ForCausalLM built from a config (the release geometry by default, or
DIR/language_model/config.json; random bf16 weights drawn on the device, nothing is
downloaded), a StaticCache, the CFG pairs as one batch (rows: every conditional row, then
every unconditional row), the LM head sliced to the drawable rows (stop + the c0 codes), and
the depth decoder of docs/model.md section 4.4 in plain PyTorch, run as the reference runs
it: 7 passes per frame, each over the whole prefix, no cache. On CUDA the LM step (with the
head and the c0 draw) is captured in one CUDA graph and the 7 depth passes (with their
draws and the feedback embedding) in a second one; eager is the same code launched op by op.

Sampling is CFG + top-50 + a Gumbel-max draw on the device. The stop column is masked: a
benchmark must run the frames it asked for, and random weights would otherwise stop early.

Per (context, pairs, mode): ms per frame (mean over --frames frames), its LM and depth parts
(medians), the weight-streaming floor (bf16 weight bytes of one frame + the live KV cache of
all rows, over the device-to-device copy bandwidth measured here) and the ratio.
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# Contract constants of the model (docs/model.md 2, 4.3): not geometry.
STOP_ID = 151670
CODE_BASE = 151675
N_SEMANTIC = 16384
TEXT_IDS = 151643  # prompt ids are drawn below this (ordinary text tokens)
CFG_SCALE = 1.5
TOP_K = 50
DECODE_TOL = 2e-2  # bf16 end to end: cached vs uncached differ by rounding only

RELEASE_LM = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 12288, "hidden_act": "silu", "vocab_size": 200000,
    "max_position_embeddings": 10240, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
    "rms_norm_eps": 1e-06, "attention_bias": False, "tie_word_embeddings": False,
}
RELEASE_DEPTH = {
    "hidden_size": 4096, "num_layers": 4, "num_attention_heads": 16, "intermediate_size": 6144,
    "audio_vocab_size": 1024, "num_codebooks": 8, "max_position_embeddings": 16,
}
TINY_LM = dict(RELEASE_LM, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=24, intermediate_size=96, vocab_size=168064)
TINY_DEPTH = dict(RELEASE_DEPTH, hidden_size=64, num_layers=2, num_attention_heads=2, intermediate_size=80)


class DepthGeometry:
    def __init__(self, cfg):
        self.hidden = int(cfg["hidden_size"])
        self.layers = int(cfg["num_layers"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.inter = int(cfg["intermediate_size"])
        self.vocab = int(cfg["audio_vocab_size"])
        self.codebooks = int(cfg["num_codebooks"])
        self.positions = int(cfg["max_position_embeddings"])

    def shapes(self):
        H, I = self.hidden, self.inter
        s = {"audio_embeddings.weight": ((self.codebooks - 1) * self.vocab, H), "projection.weight": (H, H),
             "pos_embedding.weight": (self.positions, H), "norm.weight": (H,)}
        for l in range(self.layers):
            p = f"layers.{l}."
            s[p + "input_layernorm.weight"] = (H,)
            s[p + "post_attention_layernorm.weight"] = (H,)
            for n in ("to_q", "to_k", "to_v", "to_out"):
                s[p + "attn." + n + ".weight"] = (H, H)
            s[p + "gate_proj.weight"] = (I, H)
            s[p + "up_proj.weight"] = (I, H)
            s[p + "down_proj.weight"] = (H, I)
        for k in range(self.codebooks - 1):
            s[f"audio_heads.{k}.weight"] = (self.vocab, H)
        return s


def depth_weights(g, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    w = {}
    for name, shape in g.shapes().items():
        if len(shape) == 1:
            w[name] = torch.ones(shape, device=device, dtype=torch.bfloat16)
        else:
            w[name] = (torch.randn(shape, device=device, dtype=torch.float32, generator=gen)
                       / math.sqrt(shape[1])).to(torch.bfloat16)
    return w


def rmsnorm(x, w, eps=1e-6):
    """Variance and x*rsqrt in fp32, rounded to bf16, times the weight in bf16 (docs/model.md 4.4)."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return w * y


def depth_forward(w, g, seq):
    """seq [B, S, H] (projected inputs) -> final-normed hidden of the last position [B, H]."""
    B, S, H = seq.shape
    h = seq + w["pos_embedding.weight"][:S]
    for l in range(g.layers):
        p = f"layers.{l}."
        a = rmsnorm(h, w[p + "input_layernorm.weight"])
        q = F.linear(a, w[p + "attn.to_q.weight"]).view(B, S, g.heads, g.head_dim).transpose(1, 2)
        k = F.linear(a, w[p + "attn.to_k.weight"]).view(B, S, g.heads, g.head_dim).transpose(1, 2)
        v = F.linear(a, w[p + "attn.to_v.weight"]).view(B, S, g.heads, g.head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + F.linear(o.transpose(1, 2).reshape(B, S, H), w[p + "attn.to_out.weight"])
        m = rmsnorm(h, w[p + "post_attention_layernorm.weight"])
        h = h + F.linear(F.silu(F.linear(m, w[p + "gate_proj.weight"])) * F.linear(m, w[p + "up_proj.weight"]),
                         w[p + "down_proj.weight"])
    return rmsnorm(h[:, -1], w["norm.weight"])


def cfg_sample(logits, n, cond_topk):
    """logits [2n, V] fp32 (conditional rows first) -> one column per pair [n]: CFG blend,
    optional conditional top-k restriction, top-k, Gumbel-max draw (all on the device)."""
    c, u = logits[:n], logits[n:]
    g = u + (c - u) * CFG_SCALE
    k = min(TOP_K, g.shape[-1])
    if cond_topk:
        g = g.masked_fill(c < c.topk(k, dim=-1).values[:, -1:], float("-inf"))
    v = torch.nan_to_num(g, nan=-1e9, posinf=1e9, neginf=-1e9)
    v = v.masked_fill(v < v.topk(k, dim=-1).values[:, -1:], float("-inf"))
    uni = torch.rand_like(v).clamp_(1e-12, 1.0 - 1e-7)
    return (v - torch.log(-torch.log(uni))).argmax(dim=-1)


class Stage0:
    """The static state of one (context, pairs) run: cache, mask, positions, buffers."""

    def __init__(self, lm, head_w, dw, dg, n_pairs, ctx, cache_len, device):
        from transformers import StaticCache
        self.lm, self.head_w, self.dw, self.dg = lm, head_w, dw, dg
        self.n, self.B, self.ctx, self.device = n_pairs, 2 * n_pairs, ctx, device
        H = lm.config.hidden_size
        self.cache = StaticCache(config=lm.config, max_cache_len=cache_len)
        self.neg = torch.finfo(torch.bfloat16).min
        self.mask = torch.full((self.B, 1, 1, cache_len), self.neg, dtype=torch.bfloat16, device=device)
        self.pos = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.hidden = torch.zeros((self.B, H), dtype=torch.bfloat16, device=device)
        self.embeds = torch.zeros((self.B, 1, H), dtype=torch.bfloat16, device=device)
        self.c0 = torch.zeros((self.n,), dtype=torch.long, device=device)
        self.seq = torch.zeros((self.B, dg.codebooks, dg.hidden), dtype=torch.bfloat16, device=device)
        self.embed = lm.model.embed_tokens.weight
        self.n_codes = head_w.shape[0] - 1

    @torch.no_grad()
    def prefill(self):
        gen = torch.Generator(device=self.device).manual_seed(7)
        ids = torch.randint(0, TEXT_IDS, (self.n, self.ctx), generator=gen, device=self.device)
        uncond = ids.clone()
        if self.ctx > 3:
            uncond[:, 1:-2] = 151654  # <|audio_cfg|>, the unconditional twin of the prompt
        ids = torch.cat((ids, uncond))
        self.ids = ids
        out = self.lm.model(input_ids=ids, past_key_values=self.cache, use_cache=True)
        self.hidden.copy_(out.last_hidden_state[:, -1])
        self.reset()

    def reset(self):
        """Back to 'prompt prefilled': later frames overwrite the same cache slots."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.ctx)
        self.pos.fill_(self.ctx)
        self.mask.fill_(self.neg)
        self.mask[..., : self.ctx] = 0

    def lm_step(self):
        """Feed the frame embedding at position pos, then the sliced head and the c0 draw."""
        self.mask.index_fill_(3, self.pos.view(-1), 0.0)
        out = self.lm.model(inputs_embeds=self.embeds, position_ids=self.pos, past_key_values=self.cache,
                            attention_mask={"full_attention": self.mask}, use_cache=True)
        self.hidden.copy_(out.last_hidden_state[:, -1])
        self.pos.add_(1)
        logits = F.linear(self.hidden, self.head_w).float()
        logits[:, 0] = float("-inf")  # column 0 = stop: never drawn in a benchmark
        self.c0.copy_(cfg_sample(logits, self.n, cond_topk=True) - 1)

    def depth_step(self):
        """The 7 depth passes of the reference, then the feedback embedding of both rows."""
        dw, dg = self.dw, self.dg
        P = dw["projection.weight"]
        e0 = self.embed[self.c0 + CODE_BASE]  # [n, H]
        self.seq[:, 0] = F.linear(self.hidden, P)
        self.seq[:, 1] = F.linear(torch.cat((e0, e0)), P)
        acc = torch.zeros((self.n, dg.hidden), dtype=torch.float32, device=self.device)
        for j in range(1, dg.codebooks):
            y = depth_forward(dw, dg, self.seq[:, : j + 1])
            lg = F.linear(y, dw[f"audio_heads.{j - 1}.weight"]).float()
            cj = cfg_sample(lg, self.n, cond_topk=False)
            ae = dw["audio_embeddings.weight"][(j - 1) * dg.vocab + cj]
            acc += ae.float()
            if j < dg.codebooks - 1:
                self.seq[:, j + 1] = F.linear(torch.cat((ae, ae)), P)
        f = ((e0 + acc.to(torch.bfloat16)) * (dg.codebooks ** -0.5)).to(torch.bfloat16)
        self.embeds.copy_(torch.cat((f, f)).unsqueeze(1))


@torch.no_grad()
def verify_decode(st, lm_step):
    """One decode step through the static cache, the 4D mask and (graph mode) the captured
    graph, against an uncached forward over prompt + that embedding: rel. L2 of the hiddens."""
    st.reset()
    gen = torch.Generator(device=st.device).manual_seed(3)
    st.embeds.copy_(torch.randn(st.embeds.shape, generator=gen, device=st.device).to(torch.bfloat16) * 0.02)
    lm_step()
    common.sync(st.device)
    got = st.hidden.float().clone()
    full = torch.cat((st.lm.model.embed_tokens(st.ids), st.embeds), dim=1)
    want = st.lm.model(inputs_embeds=full, use_cache=False).last_hidden_state[:, -1].float()
    st.reset()
    return (torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)).item()


def capture(fn, warmup):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def frame_bytes(cfg, dg, n_codes, rows, ctx):
    """bf16 bytes one frame must read: LM body, sliced head, 7 depth passes (layers +
    projection + head), and the live KV cache of all rows."""
    H, L = cfg.hidden_size, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
    q, kv, I = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, cfg.intermediate_size
    lm = L * (H * q + 2 * H * kv + q * H + 3 * H * I)
    head = (1 + n_codes) * H
    Hd = dg.hidden
    depth = (dg.codebooks - 1) * (dg.layers * (4 * Hd * Hd + 3 * Hd * dg.inter) + Hd * Hd + dg.vocab * Hd)
    weights = 2 * (lm + head + depth)
    kv_bytes = L * 2 * kv * 2 * rows * ctx
    return weights, kv_bytes


def run_one(st, mode, frames, warmup, device):
    cuda = device.startswith("cuda")
    with torch.no_grad():
        if mode == "graph":
            g_lm = capture(st.lm_step, warmup)
            g_depth = capture(st.depth_step, warmup)
            lm, depth = g_lm.replay, g_depth.replay
        else:
            lm, depth = st.lm_step, st.depth_step
            for _ in range(warmup):
                lm()
                depth()
        verify_rel = verify_decode(st, lm)
        lm_s, depth_s, frame_s = [], [], []
        if cuda:
            ev = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(frames)]
            for i in range(frames):
                ev[i][0].record()
                lm()
                ev[i][1].record()
                depth()
                ev[i][2].record()
            torch.cuda.synchronize()
            for e in ev:
                lm_s.append(e[0].elapsed_time(e[1]) * 1e-3)
                depth_s.append(e[1].elapsed_time(e[2]) * 1e-3)
                frame_s.append(e[0].elapsed_time(e[2]) * 1e-3)
        else:
            import time
            for _ in range(frames):
                t0 = time.perf_counter()
                lm()
                t1 = time.perf_counter()
                depth()
                t2 = time.perf_counter()
                lm_s.append(t1 - t0)
                depth_s.append(t2 - t1)
                frame_s.append(t2 - t0)
        finite = bool(torch.isfinite(st.hidden.float()).all().item())
        codes_ok = bool(((st.c0 >= 0) & (st.c0 < st.n_codes)).all().item())
    import statistics
    return {"ms_per_frame": 1e3 * sum(frame_s) / len(frame_s), "lm_ms": 1e3 * statistics.median(lm_s),
            "depth_ms": 1e3 * statistics.median(depth_s), "frames": frames,
            "hidden_finite": finite, "codes_in_range": codes_ok, "decode_vs_uncached_rel_l2": verify_rel,
            "decode_ok": verify_rel < DECODE_TOL}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tiny", action="store_true", help="small geometry on the CPU (smoke test)")
    ap.add_argument("--checkpoint", help="read the geometry from DIR/{language_model,rvq_depth_decoder}/config.json")
    ap.add_argument("--contexts", default="1000,5000")
    ap.add_argument("--pairs", default="1,8")
    ap.add_argument("--modes", default="graph,eager")
    ap.add_argument("--frames", type=int, default=32, help="timed frames per configuration")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cache-len", type=int, default=0,
                    help="StaticCache length (default: context + warm-up + frames + 16)")
    ap.add_argument("--device", default=None)
    args = ap.parse_args()

    from transformers import Qwen3Config, Qwen3ForCausalLM
    device = args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.tiny:
        lm_cfg, d_cfg, source = TINY_LM, TINY_DEPTH, "built-in tiny geometry"
        if args.contexts == "1000,5000":
            args.contexts = "40,100"
        if args.frames == 32:
            args.frames = 4
    elif args.checkpoint:
        lm_path = os.path.join(args.checkpoint, "language_model", "config.json")
        d_path = os.path.join(args.checkpoint, "rvq_depth_decoder", "config.json")
        lm_cfg, d_cfg, source = common.read_json(lm_path), common.read_json(d_path), args.checkpoint
    else:
        lm_cfg, d_cfg, source = RELEASE_LM, RELEASE_DEPTH, "built-in release geometry (docs/model.md 2)"
    cfg = Qwen3Config(**{k: v for k, v in lm_cfg.items() if not k.startswith("_")})
    cfg._attn_implementation = "sdpa"
    dg = DepthGeometry(d_cfg)
    if dg.hidden != cfg.hidden_size:
        raise SystemExit(f"pytorch_stage0: depth hidden_size {dg.hidden} != LM hidden_size {cfg.hidden_size}")
    n_codes = min(N_SEMANTIC, cfg.vocab_size - CODE_BASE)
    if n_codes < TOP_K:
        raise SystemExit(f"pytorch_stage0: vocab_size {cfg.vocab_size} leaves {n_codes} c0 codes after id {CODE_BASE}")

    contexts = [int(v) for v in args.contexts.split(",") if v]
    pairs = [int(v) for v in args.pairs.split(",") if v]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in ("eager", "graph"):
            ap.error(f"--modes: unknown mode '{m}' (eager, graph)")

    torch.manual_seed(0)
    with torch.device(device):
        lm = Qwen3ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    if next(lm.parameters()).device.type != torch.device(device).type:
        lm.to(device)  # in case the library built it elsewhere: the weights must live on the device
    lm.eval()
    rows = torch.cat((torch.tensor([STOP_ID]), torch.arange(CODE_BASE, CODE_BASE + n_codes))).to(device)
    head_w = lm.lm_head.weight.detach()[rows].contiguous()  # the drawable rows only
    lm.lm_head = None  # the full head is never read
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    dw = depth_weights(dg, device)
    bw = common.copy_bandwidth(device)

    doc = {"tool": "pytorch_stage0", "geometry_source": source, "lm_config": lm_cfg, "depth_config": d_cfg,
           "device": common.device_info(device), "torch": torch.__version__,
           "copy_GBps": bw * 1e-9 if bw else None, "results": [], "skipped": []}
    import transformers
    doc["transformers"] = transformers.__version__
    print(f"pytorch_stage0: {doc['device']['name']}, {source}"
          + (f", copy {bw * 1e-9:.0f} GB/s" if bw else ""))
    print(f"{'context':>7} {'pairs':>5} {'mode':>6} {'LM ms':>8} {'depth ms':>8} {'ms/frame':>9} "
          f"{'floor ms':>8} {'ratio':>6}")
    for ctx in contexts:
        for n in pairs:
            cache_len = args.cache_len or ctx + 2 * args.warmup + args.frames + 16
            for mode in modes:
                if mode == "graph" and not device.startswith("cuda"):
                    doc["skipped"].append({"context": ctx, "pairs": n, "mode": mode,
                                           "reason": "CUDA graphs need a GPU"})
                    continue
                try:
                    if device.startswith("cuda"):
                        torch.cuda.reset_peak_memory_stats()
                    st = Stage0(lm, head_w, dw, dg, n, ctx, cache_len, device)
                    st.prefill()
                    r = run_one(st, mode, args.frames, args.warmup, device)
                    if device.startswith("cuda"):
                        r["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
                except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                    doc["skipped"].append({"context": ctx, "pairs": n, "mode": mode, "reason": str(e)[:300]})
                    print(f"{ctx:>7} {n:>5} {mode:>6}  failed: {str(e)[:160]}")
                    st = None
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                    continue
                del st
                wb, kvb = frame_bytes(cfg, dg, n_codes, 2 * n, ctx)
                r.update({"context": ctx, "pairs": n, "rows": 2 * n, "mode": mode, "cache_len": cache_len,
                          "weight_bytes": wb, "kv_bytes": kvb})
                if bw:
                    r["floor_ms"] = (wb + kvb) / bw * 1e3
                    r["ratio_to_floor"] = r["ms_per_frame"] / r["floor_ms"]
                doc["results"].append(r)
                fl = f"{r['floor_ms']:8.2f} {r['ratio_to_floor']:5.1f}x" if bw else f"{'n/a':>8} {'':>6}"
                print(f"{ctx:>7} {n:>5} {mode:>6} {r['lm_ms']:8.2f} {r['depth_ms']:8.2f} "
                      f"{r['ms_per_frame']:9.2f} {fl}")
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
    doc["ok"] = bool(doc["results"])
    common.write_json(args.json, doc)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
