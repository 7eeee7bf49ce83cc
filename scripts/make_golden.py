#!/usr/bin/env python3
"""Reference outputs for a checkpoint of any geometry, in golden tiny-a's format.

Runs diffusers' MiniMaxMusic3 pipeline (the reference) in float32 on the CPU (or the GPU
with --device cuda) over the checkpoint at CKPT and writes OUT/caseN.safetensors and OUT/manifest.json with the keys
that `mm3-stage0 --golden` and `mm3-stage1 --golden` replay (../shared/golden/README.md):
the prompt's ids, every draw (forced in the replay), the first guided logits, the frame
hiddens, and per window the condition, noise and latents, the first two DiT calls, the
audio. CASES is a JSON file {"cases": [{prompt, lyrics, audio_duration,
num_inference_steps, seed}, ...]} (tiny-a's manifest.json is one).

Not part of the build or the tests (they never need Python): it made the stored outputs
of test/data/golden-geometries (docs/checkpoint.md). Run on tiny-a's checkpoint with
tiny-a's manifest it reproduces the shipped goldens to rel 4e-7 (the shipped ones ran on
CUDA). Setup, outside the repository:

    python3 -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.11.0 transformers==5.17.0 \\
        'diffusers>=0.40' safetensors accelerate
    /tmp/ref/bin/python scripts/make_golden.py CKPT OUT CASES [--compact] [--device cpu|cuda]
        [--yardsticks tf32,bf16,fp16,bf16-naive]

--lora COMPONENT=DIR[:SCALE] (repeatable; COMPONENT language_model, rvq_depth_decoder or
transformer) applies a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, e.g.
from `mm3-mkckpt --lora`) to the reference with PEFT itself (`pip install peft`): the adapter
is injected into the float32 module (peft.inject_adapter_in_model, set_peft_model_state_dict,
every adapter key must be consumed), its scaling multiplied by SCALE, and merged with PEFT's
merge_and_unload; the talker and the depth decoder are then rounded to bf16 once, as their
bf16 checkpoints load (mm3 merges the same way: docs/checkpoint.md, "LoRA adapters"). The
adapters are copied to OUT/lora/COMPONENT and listed in the manifest's "lora", so the replays
(`mm3-stage0 --golden`, `mm3-stage1 --golden`) merge them too.

--compact leaves out the keys the replays can do without (window.0.waveform and the
per-window frame_hiddens, which repeat audio and frame_hiddens).

--device cuda runs the reference on the GPU, still float32: TF32 is switched off for
matmuls and for cuDNN's convolutions (torch.backends.cuda.matmul.allow_tf32 = False,
torch.backends.cudnn.allow_tf32 = False, float32 matmul precision "highest"), so every
product keeps float32's 24 bits.

--yardsticks P,... reruns stage 1 of each case (condition encoder, DiT flow loop, vocoder)
on the same draws (the float32 run's frame hiddens and noise) with the DiT and the
vocoder in PyTorch's own reduced precision P, and writes OUT/yardsticks.json: per
precision the rel error ||x - ref|| / ||ref|| and SNR -20 log10(rel) in dB of the first
two DiT calls (the worse of the two), the latents after the flow loop (the worst window)
and the audio, against the float32 run. The condition encoder and everything outside the
DiT and vocoder stay float32, as in mm3. Precisions: tf32 (allow_tf32 on, inside the DiT
and vocoder only), bf16 and fp16 (torch.autocast: GEMM and convolution inputs in that
type, float32 accumulation and activations between layers; outputs taken back to
float32, the Euler state stays float32 - mm3's scheme), bf16-naive (copies of the DiT
and vocoder cast to bf16, inputs cast to bf16: every activation in bf16). The replay
(`mm3-stage1 --golden --backend cuda`) bounds precision P by max(its tiny bound, 1.25x
PyTorch's figure in P) when the file is there (stage1/golden_bounds.h).
"""
import argparse
import copy
import json
import math
import os
import time

import diffusers
import torch
from diffusers import (FlowMatchEulerDiscreteScheduler, MiniMaxMusic3ConditionEncoder,
                       MiniMaxMusic3RVQDepthDecoder, MiniMaxMusic3Transformer1DModel, MiniMaxMusic3Vocoder)
from diffusers.modular_pipelines.minimax_music3 import denoise, encoders
from diffusers.modular_pipelines.minimax_music3.modular_blocks_minimax_music3 import MiniMaxMusic3Blocks
from safetensors.torch import save_file
from transformers import AutoTokenizer, Qwen3ForCausalLM

AUDIO_END_ID = 151670
LM_GUIDED_KEPT, DEPTH_GUIDED_KEPT = 6, 14


def float32_exact():
    """Every float32 product in float32 (no TF32 in matmuls or cuDNN convolutions)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def apply_lora(module, component, adapter_dir, scale):
    """PEFT's own LoRA on module (float32): injected, loaded, scaled, merged and unloaded."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from peft.tuners.lora import LoraLayer
    from safetensors.torch import load_file
    cfg = LoraConfig.from_pretrained(adapter_dir)
    sd = load_file(f"{adapter_dir}/adapter_model.safetensors")
    prefixes = ("base_model.model.", f"{component}.")
    sd = {next((k[len(p):] for p in prefixes if k.startswith(p)), k): v for k, v in sd.items()}
    module = inject_adapter_in_model(cfg, module, adapter_name="golden")
    res = set_peft_model_state_dict(module, sd, adapter_name="golden")
    unexpected = [k for k in getattr(res, "unexpected_keys", []) if "lora_" in k]
    if unexpected:
        raise SystemExit(f"--lora {component}={adapter_dir}: keys PEFT did not take: {unexpected[:4]}")
    n = 0
    for m in module.modules():
        if isinstance(m, LoraLayer):
            m.scaling["golden"] *= scale
            m.merge(adapter_names=["golden"])
            n += 1
    if n == 0:
        raise SystemExit(f"--lora {component}={adapter_dir}: no module of {component} was adapted")
    # unload: put each merged base layer back in its LoRA wrapper's place
    for name, m in list(module.named_modules()):
        if isinstance(m, LoraLayer):
            parent = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
            setattr(parent, name.rpartition(".")[2], m.get_base_layer())
    print(f"lora {component}: {n} modules merged by PEFT (scale {scale})", flush=True)
    return module


LORA = {}  # component -> (dir, scale), from --lora


def load_pipeline(ck, device):
    f32 = torch.float32
    # As tiny-a's reference: the LM cast to bf16 and back, which rounds its rotary inv_freq
    # buffer to bf16 (weights are bf16 on disk, so they come back exact); float32 compute.
    # On the device first: the cast then needs no float32 copy in host memory.
    lm = Qwen3ForCausalLM.from_pretrained(f"{ck}/language_model", torch_dtype=torch.bfloat16).to(device)
    lm = lm.to(torch.bfloat16).float().eval()
    dd = MiniMaxMusic3RVQDepthDecoder.from_pretrained(f"{ck}/rvq_depth_decoder", torch_dtype=torch.bfloat16)
    dd = dd.to(device).float().eval()
    # Adapters merged in float32 by PEFT, then the bf16 components rounded once to bf16.
    if "language_model" in LORA:
        lm = apply_lora(lm, "language_model", *LORA["language_model"]).to(torch.bfloat16).float().eval()
    if "rvq_depth_decoder" in LORA:
        dd = apply_lora(dd, "rvq_depth_decoder", *LORA["rvq_depth_decoder"]).to(torch.bfloat16).float().eval()

    def load(cls, sub):
        return cls.from_pretrained(f"{ck}/{sub}", torch_dtype=f32).to(device).eval()

    pipe = MiniMaxMusic3Blocks().init_pipeline()
    pipe.update_components(
        language_model=lm, rvq_depth_decoder=dd,
        condition_encoder=load(MiniMaxMusic3ConditionEncoder, "condition_encoder"),
        transformer=(apply_lora(load(MiniMaxMusic3Transformer1DModel, "transformer"), "transformer",
                                *LORA["transformer"]) if "transformer" in LORA
                     else load(MiniMaxMusic3Transformer1DModel, "transformer")),
        vocoder=load(MiniMaxMusic3Vocoder, "vocoder"),
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(f"{ck}/scheduler"),
        tokenizer=AutoTokenizer.from_pretrained(f"{ck}/tokenizer"))
    return pipe


def install_recorders(pipe, rec):
    """Wraps the pipeline's sampler, noise draw, AR step and models to record into rec.
    With rec["replay"] set ({"frame_hiddens", "noise"} of an earlier run) the AR step and
    the noise draws return those instead of computing them (the yardstick reruns)."""
    vocab = pipe.language_model.config.vocab_size
    sample, randn, ar_step = encoders._sample_top_k, denoise.randn_tensor, encoders.MiniMaxMusic3AutoregressiveStep.__call__

    def sample_recorded(logits, generator):
        drawn = sample(logits, generator)
        t = rec["t"]
        if logits.shape[-1] == vocab:
            i = len(rec["lm"])
            rec["lm"].append(int(drawn.item()))
            if i < LM_GUIDED_KEPT:
                g = logits[0].float()
                support = torch.nonzero(torch.isfinite(g)).squeeze(-1)
                t[f"lm_guided_support.{i}"] = support.to(torch.int64)
                t[f"lm_guided_logits.{i}"] = g[support]
        else:
            i = len(rec["depth"])
            rec["depth"].append(int(drawn.item()))
            if i < DEPTH_GUIDED_KEPT:
                t[f"depth_guided_logits.{i}"] = logits[0].float()
        return drawn

    def randn_recorded(shape, *args, **kwargs):
        if rec.get("replay"):
            noise = rec["replay"]["noise"][len(rec["noise"])]
            noise = noise[None].to(device=kwargs.get("device"), dtype=kwargs.get("dtype"))
            assert tuple(noise.shape) == tuple(shape), (noise.shape, shape)
        else:
            noise = randn(shape, *args, **kwargs)
        rec["noise"].append(noise[0].clone())
        return noise

    def ar_recorded(self, components, state):
        rec["text_ids"] = state.get("text_ids").clone()
        if rec.get("replay"):
            block_state = self.get_block_state(state)
            block_state.frame_hiddens = rec["replay"]["frame_hiddens"][None].to(components._execution_device)
            self.set_block_state(state, block_state)
        else:
            components, state = ar_step(self, components, state)
        rec["frame_hiddens"] = state.get("frame_hiddens")[0].clone()
        return components, state

    def dit_recorded(module, args, kwargs, out):
        if len(rec["dit"]) < 2:
            rec["dit"].append({"hidden_states": kwargs["hidden_states"], "timestep": kwargs["timestep"].reshape(-1),
                               "encoder_hidden_states": kwargs["encoder_hidden_states"], "out": out[0]})

    # the text the tokenizer step assembled (the prompt contract's output)
    tokenizer = pipe.tokenizer
    tokenize = type(tokenizer).__call__

    def tokenize_recorded(self, text, *args, **kwargs):
        rec["assembled_prompt"] = text
        return tokenize(self, text, *args, **kwargs)

    tokenizer.__class__ = type("Recorded" + type(tokenizer).__name__, (type(tokenizer),), {"__call__": tokenize_recorded})
    encoders._sample_top_k = sample_recorded
    denoise.randn_tensor = randn_recorded
    encoders.MiniMaxMusic3AutoregressiveStep.__call__ = ar_recorded
    pipe.condition_encoder.register_forward_hook(lambda m, i, o: rec["condition"].append(o[0].clone()))
    pipe.vocoder.register_forward_hook(lambda m, i, o: rec["vocoder"].append((i[0][0].clone(), o[0].clone())))
    pipe.transformer.register_forward_hook(dit_recorded, with_kwargs=True)


def render(pipe, rec, case, replay=None):
    """One run of the pipeline on case; replay: the draws of an earlier run (stage 1 only)."""
    rec.clear()
    rec.update(lm=[], depth=[], t={}, noise=[], condition=[], vocoder=[], dit=[], replay=replay)
    with torch.no_grad():
        return pipe(prompt=case["prompt"], lyrics=case["lyrics"], audio_duration=case["audio_duration"],
                    num_inference_steps=case["num_inference_steps"],
                    generator=torch.Generator().manual_seed(case["seed"]), output_type="pt", output="audios")[0]


def run_case(pipe, rec, case, compact):
    audio = render(pipe, rec, case)
    t = rec["t"]
    t["text_ids"] = rec["text_ids"][0]
    t["text_ids_pair"] = rec["text_ids"]
    t["lm_sampled"] = torch.tensor(rec["lm"], dtype=torch.int64)
    t["depth_sampled"] = torch.tensor(rec["depth"], dtype=torch.int64)
    fh = rec["frame_hiddens"]
    t["frame_hiddens"] = fh
    frames = fh.shape[0]
    starts = [0] if frames <= 200 else list(range(0, frames - 100, 100))  # the reference's windows
    for w, s in enumerate(starts):
        if not compact:
            t[f"window.{w}.frame_hiddens"] = fh[s:s + 200]
        t[f"window.{w}.condition"] = rec["condition"][w]
        t[f"window.{w}.noise"] = rec["noise"][w]
        t[f"window.{w}.latents"] = rec["vocoder"][w][0]
    if len(starts) == 1 and not compact:
        t["window.0.waveform"] = rec["vocoder"][0][1]
    for k, call in enumerate(rec["dit"]):
        for name, v in call.items():
            t[f"dit_call.{k}.{name}"] = v
    t["audio"] = audio
    tensors = {k: (v.clone() if v.dtype == torch.int64 else v.float()).contiguous().cpu() for k, v in t.items()}
    entry = {k: case[k] for k in ("prompt", "lyrics")}
    entry["assembled_prompt"] = rec["assembled_prompt"]
    entry.update({k: case[k] for k in ("audio_duration", "num_inference_steps", "seed")})
    entry.update(cfg_scale_ar=encoders._AR_CFG_SCALE, guidance_scale_dit=1.7, num_frames=frames,
                 chunk_starts=starts, num_windows=len(starts), lm_draws=len(rec["lm"]),
                 ended_by_audio_end=rec["lm"][-1] == AUDIO_END_ID, audio_samples=int(audio.shape[-1]))
    return tensors, entry


YARDSTICKS = ("tf32", "bf16", "fp16", "bf16-naive")


def cast_floats(x, dtype):
    if torch.is_tensor(x):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(cast_floats(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: cast_floats(v, dtype) for k, v in x.items()}
    return x


def set_precision(module, precision, device_type):
    """Run module's forward in PyTorch's precision (the docstring's list); returns an undo."""
    orig = module.forward
    if precision == "tf32":
        def forward(*args, **kwargs):
            saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            try:
                return orig(*args, **kwargs)
            finally:
                torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    elif precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16

        def forward(*args, **kwargs):
            with torch.autocast(device_type, dtype=dtype):
                out = orig(*args, **kwargs)
            return cast_floats(out, torch.float32)
    elif precision == "bf16-naive":
        low = copy.deepcopy(module).to(torch.bfloat16)
        for hooks in (low._forward_hooks, low._forward_hooks_with_kwargs, low._forward_pre_hooks):
            hooks.clear()  # the recorders stay on the float32 module only

        def forward(*args, **kwargs):
            bf = torch.bfloat16
            return cast_floats(low(*cast_floats(args, bf), **cast_floats(kwargs, bf)), torch.float32)
    else:
        raise ValueError(f"unknown precision {precision}")
    module.forward = forward

    def undo():
        del module.forward
    return undo


def rel_error(x, ref):
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    den, num = ref.norm().item(), (x - ref).norm().item()
    return num / den if den > 0 else num


def figure(rel):
    """{"rel", "snr_db"}; null where not finite (a run that overflowed) or infinite dB (rel 0)."""
    ok = math.isfinite(rel)
    return {"rel": rel if ok else None, "snr_db": -20 * math.log10(rel) if ok and rel > 0 else None}


def yardstick_case(pipe, rec, case, tensors, precision, device_type):
    """Stage 1 of case in precision, on the float32 run's draws: rel errors against it."""
    windows = len([k for k in tensors if k.startswith("window.") and k.endswith(".noise")])
    replay = {"frame_hiddens": tensors["frame_hiddens"],
              "noise": [tensors[f"window.{w}.noise"] for w in range(windows)]}
    undo = [set_precision(m, precision, device_type) for m in (pipe.transformer, pipe.vocoder)]
    try:
        audio = render(pipe, rec, case, replay)
    finally:
        for u in undo:
            u()
    dit = max(rel_error(call["out"], tensors[f"dit_call.{k}.out"]) for k, call in enumerate(rec["dit"]))
    latents = max(rel_error(rec["vocoder"][w][0], tensors[f"window.{w}.latents"]) for w in range(windows))
    return {"dit_call": dit, "latents": latents, "audio": rel_error(audio, tensors["audio"])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("cases")
    ap.add_argument("--compact", action="store_true")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--yardsticks", default="", help="comma-separated: " + ",".join(YARDSTICKS))
    ap.add_argument("--lora", action="append", default=[], metavar="COMPONENT=DIR[:SCALE]")
    a = ap.parse_args()
    for spec in a.lora:
        comp, _, rest = spec.partition("=")
        path, _, scale = rest.partition(":")
        if comp not in ("language_model", "rvq_depth_decoder", "transformer") or not path:
            ap.error(f"--lora {spec!r}: expected COMPONENT=DIR[:SCALE] with COMPONENT language_model, "
                     "rvq_depth_decoder or transformer")
        LORA[comp] = (path, float(scale) if scale else 1.0)
    yardsticks = [p for p in a.yardsticks.split(",") if p]
    for p in yardsticks:
        if p not in YARDSTICKS:
            ap.error(f"--yardsticks: unknown precision {p!r} (expected some of {','.join(YARDSTICKS)})")
    ck, out = a.ckpt, a.out
    if a.device == "cpu":
        torch.set_num_threads(1)
    float32_exact()
    cases = json.load(open(a.cases, encoding="utf-8"))["cases"]
    os.makedirs(out, exist_ok=True)
    pipe, rec = load_pipeline(ck, a.device), {}
    install_recorders(pipe, rec)
    manifest = {"diffusers_version": diffusers.__version__, "torch": torch.__version__, "device": a.device,
                "tf32": False, "checkpoint": "checkpoint", "cases": []}
    if LORA:
        import shutil
        manifest["lora"] = []
        for comp, (path, scale) in LORA.items():
            shutil.copytree(path, f"{out}/lora/{comp}", dirs_exist_ok=True)
            manifest["lora"].append({"component": comp, "path": f"lora/{comp}", "scale": scale})
    per_case = []
    for i, case in enumerate(cases):
        t0 = time.monotonic()
        tensors, entry = run_case(pipe, rec, case, a.compact)
        entry["file"] = f"case{i}.safetensors"
        # clones: safetensors refuses tensors that share storage (text_ids is a row of the pair)
        save_file({k: v.clone() for k, v in tensors.items()}, f"{out}/{entry['file']}")
        manifest["cases"].append(entry)
        print(entry["file"], "frames", entry["num_frames"], "windows", entry["num_windows"],
              f"float32 {time.monotonic() - t0:.1f} s", flush=True)
        figures = {}
        for p in yardsticks:
            t0 = time.monotonic()
            try:
                figures[p] = yardstick_case(pipe, rec, case, tensors, p, a.device)
            except Exception as e:  # one precision failing must not lose the reference
                print(f"  {p}: failed: {type(e).__name__}: {e}", flush=True)
                figures[p] = {q: math.nan for q in ("dit_call", "latents", "audio")}
            print(f"  {p}: " + "  ".join(f"{q} {r:.2e}" for q, r in figures[p].items()),
                  f"({time.monotonic() - t0:.1f} s)", flush=True)
        per_case.append({"file": entry["file"], "precisions": figures})
    with open(f"{out}/manifest.json", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    if yardsticks:
        # per precision and quantity the worst case (a non-finite figure stays the worst)
        worst = {p: {q: max((c["precisions"][p][q] for c in per_case), key=lambda r: (not math.isfinite(r), r))
                     for q in ("dit_call", "latents", "audio")} for p in yardsticks}
        doc = {"reference": "float32", "device": a.device, "torch": torch.__version__,
               "diffusers_version": diffusers.__version__,
               "scheme": "DiT and vocoder in the precision (tf32 flags / torch.autocast / bf16-naive casts), "
                         "the rest float32; same frame hiddens and noise as the float32 run",
               "rule": "mm3 CUDA bound = max(tiny bound, 1.25 x rel)",
               "precisions": {p: {q: figure(r) for q, r in worst[p].items()} for p in yardsticks},
               "cases": [{"file": c["file"], "precisions": {p: {q: figure(r) for q, r in v.items()}
                                                            for p, v in c["precisions"].items()}} for c in per_case]}
        with open(f"{out}/yardsticks.json", "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, allow_nan=False)
            f.write("\n")


if __name__ == "__main__":
    main()
