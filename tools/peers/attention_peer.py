"""PyTorch SDPA peer for the attention cases of bench_cuda_kernels: same shapes (B,T,Hq,Hkv,D),
causal, bf16, GQA through enable_gqa; forward, and backward alone (autograd.grad on a kept graph).
TFLOP/s use the cases' own FLOP counts (perf_anchors.md accounting). Usage: attention_peer.py OURS.jsonl"""
import sys

import torch
import torch.nn.functional as F

from peer_common import cases, emit, randn, time_ms, torch_info


def main(path):
    torch.manual_seed(0)
    for c in cases(path, {"attention_fwd", "attention_bwd"}):
        cfg = c["config"]
        b, t, hq, hkv, d = cfg["b"], cfg["t"], cfg["hq"], cfg["hkv"], cfg["d"]
        q = randn(b, hq, t, d).requires_grad_()
        k = randn(b, hkv, t, d).requires_grad_()
        v = randn(b, hkv, t, d).requires_grad_()
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if c["kind"] == "attention_fwd":
            with torch.no_grad():
                ms = time_ms(sdpa)
        else:
            out = sdpa()
            dout = randn(*out.shape)
            ms = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
        emit(c["name"], {"ms": ms, "tflops": cfg["flops"] / (ms * 1e9)},
             dict(torch_info(), impl="F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), default backend"))


if __name__ == "__main__":
    main(sys.argv[1])
