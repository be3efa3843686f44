"""PyTorch peer for the fused cross-entropy case: F.cross_entropy(reduction='sum') forward plus
its gradient w.r.t. the f32 logits, same (n, vocab). Usage: ce_peer.py OURS.jsonl"""
import sys

import torch
import torch.nn.functional as F

from peer_common import cases, emit, randn, time_ms, torch_info


def main(path):
    torch.manual_seed(0)
    for c in cases(path, {"cross_entropy"}):
        cfg = c["config"]
        n, vocab = cfg["n"], cfg["vocab"]
        logits = randn(n, vocab, dtype=torch.float32, sd=2.0).requires_grad_()
        labels = torch.randint(0, vocab, (n,), device="cuda")

        def step():
            loss = F.cross_entropy(logits, labels, reduction="sum")
            return torch.autograd.grad(loss, logits)

        ms = time_ms(step)
        emit(c["name"], {"ms": ms, "gbps": cfg["min_bytes"] / (ms * 1e6)},
             dict(torch_info(), impl="F.cross_entropy + autograd.grad (eager)"))


if __name__ == "__main__":
    main(sys.argv[1])
