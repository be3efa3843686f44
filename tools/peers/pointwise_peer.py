"""PyTorch eager peers for RMSNorm (F.rms_norm) and SwiGLU (F.silu(g) * u), bf16, same shapes.
Usage: pointwise_peer.py OURS.jsonl"""
import sys

import torch
import torch.nn.functional as F

from peer_common import cases, emit, randn, time_ms, torch_info


def main(path):
    torch.manual_seed(0)
    for c in cases(path, {"rmsnorm_fwd", "swiglu_fwd"}):
        cfg = c["config"]
        if c["kind"] == "rmsnorm_fwd":
            x, w = randn(cfg["n"], cfg["c"]), randn(cfg["c"])
            fn = lambda: F.rms_norm(x, (cfg["c"],), w, eps=1e-5)
            impl = "F.rms_norm bf16 (eager)"
        else:
            g, u = randn(cfg["n"], cfg["f"]), randn(cfg["n"], cfg["f"])
            fn = lambda: F.silu(g) * u
            impl = "F.silu(g) * u bf16 (eager, two kernels)"
        ms = time_ms(fn)
        emit(c["name"], {"ms": ms, "gbps": cfg["min_bytes"] / (ms * 1e6)}, dict(torch_info(), impl=impl))


if __name__ == "__main__":
    main(sys.argv[1])
