#!/usr/bin/env python3
"""Generates tests/fixtures/io/: safetensors files written by the Python `safetensors` package and by
transformers' save_pretrained (sharded, with an index), transformers-written config.json files with the
parameter counts of the instantiated models, and RoPE inverse frequencies as transformers computes them.

Run with the fixture venv:  /opt/fixenv/bin/python tools/make_io_fixtures.py
"""
import json
import math
import os
import shutil

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "io")


def values(t):
    """Tensor values as Python numbers, after the dtype's own rounding."""
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return t.float().flatten().tolist()
    return t.flatten().tolist()


def make_single():
    n = torch.arange(15, dtype=torch.float64)
    tensors = {
        "a.f32": (torch.sin(n * 0.7) * 3).reshape(3, 5).float(),
        "b.f16": ((torch.arange(12, dtype=torch.float64) - 5) * 0.33).reshape(4, 3).half(),
        "c.bf16": (torch.exp(torch.arange(12, dtype=torch.float64) * 0.1) - 1.3).reshape(2, 2, 3).bfloat16(),
        "d.i64": torch.tensor([-3, 0, 7, 1 << 40, -(1 << 35)], dtype=torch.int64),
        "e.scalar": torch.tensor(2.5, dtype=torch.float32),
        "f.empty": torch.zeros(0, 4, dtype=torch.float32),
    }
    meta = {"format": "pt", "note": "qlora fixture"}
    save_file(tensors, os.path.join(ROOT, "py_single.safetensors"), metadata=meta)
    dtype_names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
    expected = {
        "metadata": meta,
        "tensors": {
            k: {"dtype": dtype_names[t.dtype], "shape": list(t.shape), "values": values(t)} for k, t in tensors.items()
        },
    }
    with open(os.path.join(ROOT, "py_single.json"), "w") as f:
        json.dump(expected, f, indent=1)


def tiny_llama_config(**kw):
    base = dict(vocab_size=64, hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2)
    base.update(kw)
    return base


def make_sharded():
    torch.manual_seed(0)
    out = os.path.join(ROOT, "sharded")
    shutil.rmtree(out, ignore_errors=True)
    cfg = transformers.LlamaConfig(**tiny_llama_config())
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="8KB", safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(out, extra)
        if os.path.exists(p):
            os.remove(p)
    sd = model.state_dict()
    expected = {
        "n_params": sum(p.numel() for p in model.parameters()),
        "tensors": {k: {"shape": list(v.shape), "sum": float(v.float().sum()), "first": values(v)[:4]} for k, v in sd.items()},
    }
    with open(os.path.join(ROOT, "sharded_expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    assert os.path.exists(os.path.join(out, "model.safetensors.index.json")), os.listdir(out)


def make_configs():
    """config.json as transformers writes it, plus the parameter count of the model it builds."""
    out = os.path.join(ROOT, "hf_configs")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cases = {
        "llama31": transformers.LlamaConfig(**tiny_llama_config(
            rope_theta=500000.0,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64})),
        "llama_tied": transformers.LlamaConfig(**tiny_llama_config(tie_word_embeddings=True, head_dim=8)),
        "qwen2": transformers.Qwen2Config(**tiny_llama_config(tie_word_embeddings=True, rms_norm_eps=1e-6,
                                                              rope_theta=1000000.0)),
        "mistral": transformers.MistralConfig(**tiny_llama_config(num_key_value_heads=1, sliding_window=32)),
    }
    counts = {}
    for name, cfg in cases.items():
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        counts[name] = sum(p.numel() for p in model.parameters())  # tied weights are counted once
        cfg.to_json_file(os.path.join(out, name + ".json"))
    with open(os.path.join(out, "n_params.json"), "w") as f:
        json.dump(counts, f, indent=1)


def make_rope():
    """inv_freq as the transformers rotary embedding module holds it (float32), plus a float64 numpy
    evaluation of the published formula."""
    cases = {
        "default": dict(head_dim=16, rope_theta=10000.0, rope_scaling=None),
        "linear": dict(head_dim=32, rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0}),
        "llama3_1b": dict(head_dim=64, rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        "llama3_8b": dict(head_dim=128, rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    }
    out = {}
    for name, c in cases.items():
        cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=c["head_dim"] * 2, intermediate_size=8,
                                       num_hidden_layers=1, num_attention_heads=2, head_dim=c["head_dim"],
                                       max_position_embeddings=131072, rope_theta=c["rope_theta"],
                                       rope_scaling=c["rope_scaling"])
        emb = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
        hf = emb.inv_freq.double().tolist()
        D = c["head_dim"]
        inv = 1.0 / c["rope_theta"] ** (np.arange(0, D, 2, dtype=np.float64) / D)
        rs = c["rope_scaling"]
        if rs and rs["rope_type"] == "linear":
            inv = inv / rs["factor"]
        elif rs and rs["rope_type"] == "llama3":
            lo, hi, old, fac = rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"], rs["factor"]
            wl = 2 * math.pi / inv
            smooth = (old / wl - lo) / (hi - lo)
            inv = np.where(wl > old / lo, inv / fac, np.where(wl < old / hi, inv, (1 - smooth) * inv / fac + smooth * inv))
        out[name] = {"config": {"model_type": "llama", "vocab_size": 32, "hidden_size": D * 2, "intermediate_size": 8,
                                "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": D,
                                "max_position_embeddings": 131072, "rope_theta": c["rope_theta"],
                                "rope_scaling": rs},
                     "inv_freq_transformers_f32": hf, "inv_freq_f64": inv.tolist()}
    with open(os.path.join(ROOT, "rope_inv_freq.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    os.makedirs(ROOT, exist_ok=True)
    make_single()
    make_sharded()
    make_configs()
    make_rope()
    print("transformers", transformers.__version__, "torch", torch.__version__)
