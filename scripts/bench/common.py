"""Helpers shared by the PyTorch baselines: JSON in/out, device description, timing."""
import json
import os
import statistics
import time


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: {e}")


def write_json(path, doc):
    """Write doc to path (nothing when path is None), via a temporary file so that a
    reader never sees half a file."""
    if not path:
        return
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def device_info(device):
    import torch
    if str(device).startswith("cuda"):
        p = torch.cuda.get_device_properties(device)
        return {"name": p.name, "kind": "cuda", "memory_gib": p.total_memory / 2 ** 30,
                "sm_count": p.multi_processor_count, "capability": f"{p.major}.{p.minor}"}
    return {"name": "cpu", "kind": "cpu", "threads": torch.get_num_threads()}


def sync(device):
    import torch
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_reps(fn, device, reps):
    """Seconds per call of fn: median and min over reps samples of one call each
    (CUDA events on a GPU, so launch queueing is measured as the GPU sees it)."""
    import torch
    samples = []
    if str(device).startswith("cuda"):
        start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda.synchronize()
        for i in range(reps):
            start[i].record()
            fn()
            end[i].record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1e-3 for s, e in zip(start, end)]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "samples": len(samples)}


def copy_bandwidth(device, nbytes=1 << 30, reps=10):
    """Device-to-device copy, (read + written bytes) / time, median: the ceiling that
    every weight-streaming floor is computed against (as mm3-bench-ops does)."""
    import torch
    if not str(device).startswith("cuda"):
        return None
    def timed():
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        return time_reps(lambda: dst.copy_(src), device, reps)["median_s"]
    sec = timed()
    torch.cuda.empty_cache()  # the 2 GiB go back before the model is built
    return 2.0 * nbytes / sec
