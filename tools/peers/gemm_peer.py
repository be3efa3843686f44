"""torch.matmul peer for the GEMM cases: bf16 operands and output, C = A B^T (trans_b) or A B.
Usage: gemm_peer.py OURS.jsonl"""
import sys

import torch

from peer_common import cases, emit, randn, time_ms, torch_info


def main(path):
    torch.manual_seed(0)
    for c in cases(path, {"gemm"}):
        cfg = c["config"]
        m, n, k = cfg["m"], cfg["n"], cfg["k"]
        a = randn(m, k)
        if cfg["trans_b"]:
            w = randn(n, k)
            fn = lambda: torch.matmul(a, w.t())
        else:
            w = randn(k, n)
            fn = lambda: torch.matmul(a, w)
        ms = time_ms(fn)
        emit(c["name"], {"ms": ms, "tflops": cfg["flops"] / (ms * 1e9)}, dict(torch_info(), impl="torch.matmul bf16"))


if __name__ == "__main__":
    main(sys.argv[1])
