#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets (test/fuzz/corpus/<target>/).

Deterministic; run from anywhere: python3 test/fuzz/make_seeds.py [GOLDEN_DIR].
Seeds are a few valid inputs plus interesting invalid ones; the input format of
each target is described at the top of test/fuzz/fuzz_<target>.c. GOLDEN_DIR
(default ../shared/golden/tiny-a) supplies real tensor names and configs when present.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEP = b"\n--\n"
GOLDEN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "..", "shared", "golden", "tiny-a")
CKPT = os.path.join(GOLDEN, "checkpoint")

DT_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1, "F64": 8}


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def st_bytes(tensors, meta=None, pad_to=8):
    """tensors: list of (name, dtype, shape); data is a deterministic byte pattern."""
    header, blobs, off = {}, [], 0
    if meta is not None:
        header["__metadata__"] = meta
    for i, (name, dt, shape) in enumerate(tensors):
        n = DT_SIZE[dt]
        for s in shape:
            n *= s
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        blobs.append(bytes(((i * 37 + k * 11) % 251) & 0x7F for k in range(n)))
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % pad_to)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def st_raw(header_obj_or_bytes, data=b"", hlen=None):
    h = header_obj_or_bytes if isinstance(header_obj_or_bytes, bytes) else json.dumps(header_obj_or_bytes).encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def golden_tensors(component, limit=None):
    """Real names and dtypes of a tiny-a component, shapes shrunk to at most 3 per dim."""
    path = os.path.join(CKPT, component)
    if not os.path.isdir(path):
        return [("proj_in.weight", "F32", [3, 2]), ("proj_in.bias", "F32", [3])]
    res = []
    for fn in sorted(os.listdir(path)):
        if not fn.endswith(".safetensors"):
            continue
        with open(os.path.join(path, fn), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
        for k, v in sorted(h.items()):
            if k == "__metadata__":
                continue
            res.append((k, v["dtype"], [min(s, 3) for s in v["shape"]]))
    return res[:limit] if limit else res


def golden_config(component, fallback):
    p = os.path.join(CKPT, component, "config.json")
    if os.path.exists(p):
        with open(p, "rb") as f:
            return f.read()
    return json.dumps(fallback).encode()


def seeds_safetensors():
    t = "safetensors"
    out(t, "valid_dtypes", st_bytes([("a", "F32", [2, 3]), ("b", "BF16", [4]), ("c", "F16", [1, 1, 2]),
                                     ("d", "I64", [2]), ("scalar", "F32", [])], meta={"format": "pt"}))
    out(t, "valid_empty_tensor", st_bytes([("e", "F32", [0, 5]), ("f", "F32", [1])]))
    out(t, "valid_no_tensors", st_raw(b"{}"))
    out(t, "valid_golden_transformer", st_bytes(golden_tensors("transformer", 40)))
    ce = os.path.join(CKPT, "condition_encoder", "diffusion_pytorch_model.safetensors")
    if os.path.exists(ce) and os.path.getsize(ce) < 20000:
        with open(ce, "rb") as f:
            out(t, "valid_golden_condition_encoder", f.read())
    good = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    out(t, "bad_header_len_past_end", st_raw(good, b"\0" * 8, hlen=1 << 40))
    out(t, "bad_header_len_short", st_raw(good, b"\0" * 8, hlen=3))
    out(t, "bad_truncated_u64", b"\x10\x00\x00")
    out(t, "bad_empty", b"")
    out(t, "bad_json", st_raw(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]', b"\0" * 8))
    out(t, "bad_dtype", st_raw({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8))
    out(t, "bad_size_mismatch", st_raw({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8))
    out(t, "bad_overlap", st_raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12))
    out(t, "bad_out_of_range", st_raw({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8))
    out(t, "bad_negative", st_raw({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [-8, 0]}}, b"\0" * 8))
    out(t, "bad_shape_overflow", st_raw({"a": {"dtype": "F32", "shape": [1 << 31, 1 << 31, 1 << 31],
                                               "data_offsets": [0, 8]}}, b"\0" * 8))
    out(t, "bad_too_many_dims", st_raw({"a": {"dtype": "F16", "shape": [1] * 9, "data_offsets": [0, 2]}}, b"\0\0"))
    out(t, "bad_not_object", st_raw(b"[1,2,3]"))
    out(t, "bad_duplicate_key", st_raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                       b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8))
    out(t, "gap_and_trailing_bytes", st_raw({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 12))


def seeds_checkpoint():
    t = "checkpoint"
    cfg = golden_config("transformer", {"num_layers": 2, "rope_theta": 10000.0})
    tens = golden_tensors("transformer", 12)
    single = st_bytes(tens)

    def join(*parts):
        for p in parts[2:]:
            assert SEP not in p, "separator inside a shard"
        return SEP.join(parts)

    out(t, "valid_single_file", join(cfg, b"", single))
    a, b = tens[: len(tens) // 2], tens[len(tens) // 2:]
    wm = {n: "s0.safetensors" for n, _, _ in a}
    wm.update({n: "s1.safetensors" for n, _, _ in b})
    index = json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}, indent=2).encode()
    out(t, "valid_sharded", join(cfg, index, st_bytes(a), st_bytes(b)))
    lm_cfg = golden_config("language_model", {"num_hidden_layers": 2, "rope_parameters": {"rope_theta": 1e6}})
    out(t, "valid_lm_config", join(lm_cfg, b"", st_bytes([("x", "BF16", [2, 2])])))
    voc = golden_config("vocoder", {"upsampling_ratios": [2, 2]})
    out(t, "valid_vocoder_config", join(voc, b"", st_bytes([("y", "F32", [1])])))
    wm_missing = dict(wm)
    wm_missing["ghost.weight"] = "s2.safetensors"
    out(t, "bad_index_missing_shard", join(cfg, json.dumps({"weight_map": wm_missing}).encode(), st_bytes(a), st_bytes(b)))
    wm_wrong = {n: "s0.safetensors" for n, _, _ in tens}
    out(t, "bad_index_wrong_shard", join(cfg, json.dumps({"weight_map": wm_wrong}).encode(), st_bytes(a), st_bytes(b)))
    out(t, "bad_index_path", join(cfg, json.dumps({"weight_map": {"a": "../s0.safetensors"}}).encode(), single))
    out(t, "bad_index_not_object", join(cfg, b'{"weight_map": ["s0.safetensors"]}', single))
    out(t, "bad_duplicate_across_shards", join(cfg, json.dumps({"weight_map": {"a": "s0.safetensors"}}).encode(),
                                               st_bytes([("a", "F32", [1])]), st_bytes([("a", "F32", [1])])))
    out(t, "bad_two_files_no_index", join(cfg, b"", single, single))
    out(t, "bad_config_malformed", join(b'{"num_layers": ', b"", single))
    out(t, "bad_config_array", join(b"[1]", b"", single))
    out(t, "bad_no_shard", join(cfg, b""))
    mi = os.path.join(CKPT, "modular_model_index.json")
    root_index = open(mi, "rb").read() if os.path.exists(mi) else b'{"transformer": ["mm3", "X", {}]}'
    out(t, "root_index_as_config", join(root_index, b"", single))


def seeds_deploy():
    t = "deploy"
    for d in (os.path.join(ROOT, "configs"), os.path.join(ROOT, "test", "data", "deploy")):
        if not os.path.isdir(d):
            continue
        for fn in sorted(os.listdir(d)):
            if fn.endswith((".yaml", ".yml")):
                with open(os.path.join(d, fn), "rb") as f:
                    out(t, os.path.basename(d) + "_" + fn, f.read())
    out(t, "empty", b"")
    out(t, "anchors", "a: &x {b: 1}\nc: *x\n")
    out(t, "tags_and_flow", "!!map {stage_args: [!!str x, {stage_id: 0}]}\n")
    out(t, "multi_doc", "model: a\n---\nmodel: b\n")


def seeds_tokenizer():
    t = "tokenizer"
    enc, pair, clean = b"\x00", b"\x01", b"\x02"
    texts = {
        "ascii": "Hello, world! It's 2024: 12345 apples.",
        "special": "<|im_start|><|caption_start|>pop<|caption_end|><|lyrics_start|>[verse]\nla la<|lyrics_end|><|im_end|><|audio_start|>",
        "cjk": "古琴与电子合成器，夜晚的城市",
        "nfc": "Cafe\u0301 A\u030a \uac00\u11a8 \u1e9b\u0323",
        "emoji": "🎵🎶 music 👩‍👩‍👧",
        "spaces": "  \t\n\n  a   b\r\n\u3000c\u00a0",
        "numbers": "1234567890 ٣٤٥ ①②",
    }
    for k, v in texts.items():
        out(t, "encode_" + k, enc + v.encode())
    for name, raw in {"invalid_lone_cont": b"ab\x80cd", "invalid_overlong": b"\xc0\xaf",
                      "invalid_surrogate": b"\xed\xa0\x80", "invalid_truncated": b"\xe4\xb8",
                      "invalid_too_big": b"\xf4\x90\x80\x80", "nul": b"a\x00b"}.items():
        out(t, "encode_" + name, enc + raw)
    out(t, "pair_basic", pair + b"pop, upbeat, female vocals" + SEP + b"[verse]\nhello world\n[chorus]\nla la la")
    out(t, "pair_cjk", pair + "抒情 流行".encode() + SEP + "[verse]\n我爱你\n".encode())
    out(t, "pair_blank", pair + b"   " + SEP + b"\n\n")
    out(t, "pair_invalid", pair + b"pop\xff" + SEP + b"la")
    out(t, "clean_markup", clean + b"  Pop   song.. with <b>tags</b>!!  " + SEP + b"[Verse 1]\r\n  line one  \n\n\n[chorus]\nx")
    path = os.path.join(ROOT, "test", "data", "tokenizer", "prompt_cases.json")
    if os.path.exists(path):
        with open(path) as f:
            cases = json.load(f)
        items = cases if isinstance(cases, list) else cases.get("cases", [])
        for i, c in enumerate(items[:4]):
            if isinstance(c, dict) and "caption" in c and "lyrics" in c:
                out(t, "pair_case%d" % i, pair + c["caption"].encode() + SEP + c["lyrics"].encode())


def seeds_api_request():
    t = "api_request"
    base = {"input": "[verse]\nhello", "instructions": "pop"}
    bodies = {
        "minimal": base,
        "ours": {"lyrics": "[verse]\nla", "caption": "rock", "duration_s": 12.5, "seed": 7,
                 "response_format": "flac", "sample_rate": 32000, "num_inference_steps": 10,
                 "guidance_scale": 1.7, "cfg_scale": 1.5, "stream": True},
        "vllm": dict(base, model="MiniMax-Music3", voice="default", speed=1.0, stream_format="audio",
                     max_new_tokens=500, response_format="pcm"),
        "both_names": dict(base, lyrics="x"),
        "both_lengths": dict(base, duration_s=3, max_new_tokens=10),
        "out_of_range": dict(base, max_new_tokens=90000, sample_rate=8000, num_inference_steps=0, guidance_scale=-1),
        "wrong_types": {"input": 5, "instructions": ["pop"], "seed": -1, "stream": "yes"},
        "unknown_field": dict(base, temperature=0.7),
        "continuation": {"continue_from": "0123456789abcdef0123456789abcdef", "duration_s": 20,
                         "return": "whole", "min_duration_s": 5},
        # an uploaded journal (base64 that need not be a journal: the engine checks it) and no caption
        "continuation_journal": {"input": "se]", "continue_journal": "p" + "b" * 71, "model": "pcm"},
        # adapters: fuzz_api_request's limits load "rock" and "jazz"; "pop" is unknown (404)
        "lora": dict(base, model="rock", lora="rock"),
        "lora_unknown": dict(base, lora="pop", model="jazz"),
    }
    for k, v in bodies.items():
        out(t, k, json.dumps(v))
    out(t, "not_object", "[1, 2]")
    out(t, "truncated", '{"input": "la", "instr')
    out(t, "nul_escape", '{"input":"\\u0000","instructions":"pop"}')
    out(t, "invalid_utf8", b'{"input":"\xff","instructions":"pop"}')
    out(t, "lone_surrogate", '{"input":"\\ud800","instructions":"pop"}')
    out(t, "duplicate_key", '{"input":"a","input":"b","instructions":"pop"}')
    out(t, "big_numbers", '{"input":"a","instructions":"b","seed":18446744073709551616,"duration_s":1e999}')
    out(t, "empty", b"")


# ---- shmconn: offsets of the ABI in shmconn/shmconn_region.h ----
PROD_LINE, CONS_LINE, SLOTS, SLOT_BYTES = 192, 320, 8192, 768 + 256
INLINE = (1 << 64) - 1


def patch(off, data):
    recs = b""
    while data:
        chunk, data = data[:255], data[255:]
        recs += struct.pack("<HB", off, len(chunk)) + chunk
        off += len(chunk)
    return recs


def slot(seq, req_id, flags, tensors, pos, plen, pend, stored_seq=None):
    stored = seq if stored_seq is None else stored_seq
    head = struct.pack("<QIIIIQQQQ", req_id, seq, 0, flags, len(tensors), pos, plen, pend, stored)
    head += b"\0" * (64 - len(head))
    body = b""
    for name, dtype, shape, offset, nbytes in tensors:
        dims = list(shape) + [0] * (4 - len(shape))
        body += name.encode().ljust(16, b"\0") + struct.pack("<II4qQQQ", dtype, len(shape), *dims, offset, nbytes, 0)
    return patch(SLOTS + (seq % 4) * SLOT_BYTES, head + body)


def seeds_shmconn():
    t = "shmconn"
    u8, f32 = 102, 0  # SHMCONN_DTYPE_U8; MM3_DTYPE_F32 is 0 in common/dtype.h
    tail = lambda n: patch(PROD_LINE, struct.pack("<I", n))
    inline_msg = slot(0, 1, 3, [("x", u8, [16], 0, 16)], INLINE, 64, INLINE)
    out(t, "consumer_empty", b"\x00")
    out(t, "consumer_inline", b"\x00" + tail(1) + inline_msg)
    out(t, "consumer_inline_tracked", b"\x04" + tail(1) + inline_msg)
    pay = slot(0, 1, 1, [("lat", u8, [64, 16], 0, 1024)], 0, 1024, 1024)
    out(t, "consumer_payload", b"\x00" + tail(1) + pay)
    two = slot(0, 1, 1, [("a", u8, [8], 0, 8), ("b", u8, [4, 2], 64, 8)], INLINE, 128, INLINE)
    two += slot(1, 1, 2, [("c", u8, [3000], 0, 3000)], 1024, 3008, 4032)
    out(t, "consumer_two_messages", b"\x04" + tail(2) + two)
    out(t, "consumer_tail_ahead", b"\x00" + tail(9) + inline_msg)
    out(t, "consumer_bad_seq", b"\x00" + tail(1) + slot(0, 1, 3, [("x", u8, [16], 0, 16)], INLINE, 64, INLINE, 5))
    out(t, "consumer_tensor_past_payload", b"\x00" + tail(1) + slot(0, 1, 3, [("x", u8, [16], 250, 16)], INLINE, 256, INLINE))
    out(t, "consumer_payload_past_area", b"\x00" + tail(1) + slot(0, 1, 3, [("x", u8, [64], 0, 64)], 4090, 64, 4154))
    out(t, "consumer_bad_dtype", b"\x00" + tail(1) + slot(0, 1, 3, [("x", 77, [16], 0, 16)], INLINE, 64, INLINE))
    out(t, "consumer_f32", b"\x00" + tail(1) + slot(0, 9, 3, [("x", f32, [2, 2], 0, 16)], INLINE, 64, INLINE))
    out(t, "consumer_truncated", b"\x02")
    out(t, "consumer_bad_magic", b"\x00" + patch(0, b"XSHMCON1"))
    out(t, "consumer_bad_geometry", b"\x00" + patch(20, struct.pack("<I", 8)))
    out(t, "consumer_has_consumer", b"\x00" + patch(CONS_LINE + 12, struct.pack("<i", 1)))
    out(t, "consumer_counters_set", b"\x00" + patch(CONS_LINE, struct.pack("<I", 3)))
    out(t, "consumer_producer_closed", b"\x04" + patch(PROD_LINE + 8, struct.pack("<I", 2)) + tail(1) + inline_msg)
    # Producer mode: offsets are into [consumer line (64 bytes)][cancel ring (4096 bytes)].
    cancels = struct.pack("<QII", 1, 1, 0) + struct.pack("<QII", 2, 2, 0)
    out(t, "producer_idle", b"\x01")
    out(t, "producer_cancels", b"\x01" + patch(20, struct.pack("<I", 2)) + patch(64, cancels))
    out(t, "producer_cancel_flood", b"\x01" + patch(20, struct.pack("<I", 0xFFFFFFF0)))
    out(t, "producer_head_ahead", b"\x01" + patch(0, struct.pack("<I", 7)))
    out(t, "producer_payload_tail_far", b"\x01" + patch(24, struct.pack("<Q", 1 << 63)))
    out(t, "producer_consumer_closed", b"\x01" + patch(8, struct.pack("<I", 2)))


if __name__ == "__main__":
    seeds_safetensors()
    seeds_checkpoint()
    seeds_deploy()
    seeds_tokenizer()
    seeds_api_request()
    seeds_shmconn()
    # corpus/journal/ is not made here: "finished" is a journal mm3 wrote (a 60-frame song of
    # test_e2e_continue on tiny-a), "cut_in_codes" and "cut_in_header" its first 300 and 100 bytes.
