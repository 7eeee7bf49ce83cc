#!/usr/bin/env python3
"""Reference outputs for a checkpoint of any geometry, in golden tiny-a's format.

Runs diffusers' MiniMaxMusic3 pipeline (the reference) in float32 on the CPU over the
checkpoint at CKPT and writes OUT/caseN.safetensors and OUT/manifest.json with the keys
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
    /tmp/ref/bin/python scripts/make_golden.py CKPT OUT CASES [--compact]

--compact leaves out the keys the replays can do without (window.0.waveform and the
per-window frame_hiddens, which repeat audio and frame_hiddens).
"""
import json
import os
import sys

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


def load_pipeline(ck):
    f32 = torch.float32
    # As tiny-a's reference: the LM cast to bf16 and back, which rounds its rotary inv_freq
    # buffer to bf16 (weights are bf16 on disk, so they come back exact); float32 compute.
    lm = Qwen3ForCausalLM.from_pretrained(f"{ck}/language_model", torch_dtype=torch.bfloat16)
    lm = lm.to(torch.bfloat16).float().eval()
    dd = MiniMaxMusic3RVQDepthDecoder.from_pretrained(f"{ck}/rvq_depth_decoder", torch_dtype=torch.bfloat16)
    dd = dd.float().eval()
    pipe = MiniMaxMusic3Blocks().init_pipeline()
    pipe.update_components(
        language_model=lm, rvq_depth_decoder=dd,
        condition_encoder=MiniMaxMusic3ConditionEncoder.from_pretrained(f"{ck}/condition_encoder", torch_dtype=f32).eval(),
        transformer=MiniMaxMusic3Transformer1DModel.from_pretrained(f"{ck}/transformer", torch_dtype=f32).eval(),
        vocoder=MiniMaxMusic3Vocoder.from_pretrained(f"{ck}/vocoder", torch_dtype=f32).eval(),
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(f"{ck}/scheduler"),
        tokenizer=AutoTokenizer.from_pretrained(f"{ck}/tokenizer"))
    return pipe


def install_recorders(pipe, rec):
    """Wraps the pipeline's sampler, noise draw, AR step and models to record into rec."""
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

    def randn_recorded(*args, **kwargs):
        noise = randn(*args, **kwargs)
        rec["noise"].append(noise[0].clone())
        return noise

    def ar_recorded(self, components, state):
        rec["text_ids"] = state.get("text_ids").clone()
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


def run_case(pipe, rec, case, compact):
    rec.clear()
    rec.update(lm=[], depth=[], t={}, noise=[], condition=[], vocoder=[], dit=[])
    with torch.no_grad():
        audio = pipe(prompt=case["prompt"], lyrics=case["lyrics"], audio_duration=case["audio_duration"],
                     num_inference_steps=case["num_inference_steps"],
                     generator=torch.Generator().manual_seed(case["seed"]), output_type="pt", output="audios")[0]
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
    tensors = {k: (v.clone() if v.dtype == torch.int64 else v.float()).contiguous() for k, v in t.items()}
    entry = {k: case[k] for k in ("prompt", "lyrics")}
    entry["assembled_prompt"] = rec["assembled_prompt"]
    entry.update({k: case[k] for k in ("audio_duration", "num_inference_steps", "seed")})
    entry.update(cfg_scale_ar=encoders._AR_CFG_SCALE, guidance_scale_dit=1.7, num_frames=frames,
                 chunk_starts=starts, num_windows=len(starts), lm_draws=len(rec["lm"]),
                 ended_by_audio_end=rec["lm"][-1] == AUDIO_END_ID, audio_samples=int(audio.shape[-1]))
    return tensors, entry


def main():
    args = [a for a in sys.argv[1:] if a != "--compact"]
    if len(args) != 3:
        sys.exit(__doc__)
    ck, out, cases_path = args
    torch.set_num_threads(1)
    cases = json.load(open(cases_path, encoding="utf-8"))["cases"]
    os.makedirs(out, exist_ok=True)
    pipe, rec = load_pipeline(ck), {}
    install_recorders(pipe, rec)
    manifest = {"diffusers_version": diffusers.__version__, "torch": torch.__version__, "device": "cpu",
                "checkpoint": "checkpoint", "cases": []}
    for i, case in enumerate(cases):
        tensors, entry = run_case(pipe, rec, case, "--compact" in sys.argv)
        entry["file"] = f"case{i}.safetensors"
        # clones: safetensors refuses tensors that share storage (text_ids is a row of the pair)
        save_file({k: v.clone() for k, v in tensors.items()}, f"{out}/{entry['file']}")
        manifest["cases"].append(entry)
        print(entry["file"], "frames", entry["num_frames"], "windows", entry["num_windows"], flush=True)
    with open(f"{out}/manifest.json", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
