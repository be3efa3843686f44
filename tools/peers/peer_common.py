"""Shared helpers for the PyTorch peer benchmarks: read the cases bench_cuda_kernels printed,
time a CUDA callable with events (median after warm-up), print one JSON line per case."""
import json
import sys

import torch


def cases(path, kinds):
    """The cases of the given kinds from bench_cuda_kernels' JSON-lines output."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                c = json.loads(line)
                if c.get("kind") in kinds:
                    out.append(c)
    return out


def time_ms(fn, warmup=3, iters=20):
    """Median device time of fn() in milliseconds, measured with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return t[len(t) // 2]


def randn(*shape, dtype=torch.bfloat16, sd=1.0):
    """Normal values on the GPU, never exactly zero (zeros run faster than real data)."""
    x = torch.randn(*shape, device="cuda", dtype=torch.float32) * sd
    x[x == 0] = 1e-3
    return x.to(dtype)


def emit(name, peer, info=None):
    rec = {"name": name, "peer": peer}
    if info:
        rec["peer_info"] = info
    print(json.dumps(rec))
    sys.stdout.flush()


def torch_info():
    return {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
