# Writes tests/fixtures/backend/hf_ops.json: PyTorch / Hugging Face outputs the CPU backend ops must match.
# Run with the fixture venv: /opt/fixenv/bin/python tools/gen_backend_fixtures.py
import json
import os

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

torch.manual_seed(1234)
OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "backend", "hf_ops.json")


def flat(t):
    # float32 values written as the shortest decimal of the (exact) double: they parse back bit-exactly.
    return [float(x) for x in t.detach().to(torch.float32).reshape(-1).tolist()]


def rope_case():
    # Llama-3 style rope scaling so inv_freq is the scaled one; positions restart like packed docs
    # and reach 4095 where a double-precision angle would differ from HF's f32 angle.
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      rope_theta=500000.0, max_position_embeddings=131072,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    rot = LlamaRotaryEmbedding(cfg)
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 7, 100, 1000, 2047, 3001, 4095, 4094]])
    n, n_head, d = positions.shape[1], 2, 32
    x = torch.randn(1, n_head, n, d)  # HF layout (B,H,T,D)
    cos, sin = rot(x, positions)
    out, _ = apply_rotary_pos_emb(x, x, cos, sin)
    to_ntd = lambda t: t[0].transpose(0, 1).contiguous()  # -> (N,H,D), the engine's layout
    return {"n": n, "n_head": n_head, "head_dim": d, "positions": positions[0].tolist(),
            "inv_freq": flat(rot.inv_freq), "attention_scaling": float(rot.attention_scaling),
            "x": flat(to_ntd(x)), "out": flat(to_ntd(out))}


def rmsnorm_case():
    n, c, eps = 5, 48, 1e-5
    norm = LlamaRMSNorm(c, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(1.0 + 0.3 * torch.randn(c))
    x = torch.randn(n, c) * 2.0
    return {"n": n, "c": c, "eps": eps, "x": flat(x), "w": flat(norm.weight), "out": flat(norm(x))}


def cross_entropy_case():
    n, v, scale = 6, 37, 0.25
    logits = (torch.randn(n, v) * 3.0).requires_grad_()
    labels = torch.tensor([3, -100, 36, 0, 17, -100])
    losses = F.cross_entropy(logits, labels, ignore_index=-100, reduction="none")
    (losses.sum() * scale).backward()
    return {"n": n, "vocab": v, "grad_scale": scale, "logits": flat(logits), "labels": labels.tolist(),
            "losses": flat(losses), "dlogits": flat(logits.grad)}


def swiglu_case():
    gate, up = torch.randn(64) * 3.0, torch.randn(64)
    return {"n": 64, "gate": flat(gate), "up": flat(up), "out": flat(F.silu(gate) * up)}


def adamw_case():
    n, steps = 257, 3
    hp = {"lr": 2e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
    p = torch.nn.Parameter(torch.randn(n) * 0.5)
    opt = torch.optim.AdamW([p], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"], foreach=False, fused=False)
    case = dict(hp, n=n, param0=flat(p), grads=[], param=[], m=[], v=[])
    for _ in range(steps):
        g = torch.randn(n) * 0.1
        # Some tiny gradients so eps and the bias corrections matter.
        g[:16] *= 1e-6
        p.grad = g.clone()
        opt.step()
        st = opt.state[p]
        case["grads"].append(flat(g))
        case["param"].append(flat(p))
        case["m"].append(flat(st["exp_avg"]))
        case["v"].append(flat(st["exp_avg_sq"]))
    return case


def main():
    data = {"generator": "tools/gen_backend_fixtures.py", "torch": torch.__version__,
            "rope": rope_case(), "rmsnorm": rmsnorm_case(), "cross_entropy": cross_entropy_case(),
            "swiglu": swiglu_case(), "adamw": adamw_case()}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print("wrote", os.path.normpath(OUT), os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
