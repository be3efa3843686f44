#!/usr/bin/env python3
"""Hugging Face peer of `qlora bench`: end-to-end LoRA/QLoRA fine-tuning throughput with
transformers + peft (+ bitsandbytes for 4-bit bases) on the same shapes and settings, printing the
same JSON fields.

    hf_peft_bench.py --model llama3-8b --method qlora --base-precision nf4 --double-quant \
        --r 16 --target-modules all-linear --seq-len 2048 --micro-batch 4 \
        --gradient-checkpointing full --steps 6 --warmup-steps 2 --json
    hf_peft_bench.py --device cpu --method lora --model smollm2-135m --seq-len 32 --steps 2 --json

What it runs (the stock QLoRA recipe, as the QLoRA paper's qlora.py, the peft docs and TRL run it):
 - LlamaForCausalLM built from a LlamaConfig with the real shape (presets below, cross-checked
   with src/model/llama_presets.cpp), attn_implementation="sdpa", random weights; nothing is
   downloaded. The skeleton is made on the meta device and each tensor is materialized on the
   target device one at a time: bf16 normal(0, 0.02) for embeddings and projections, ones for
   RMSNorm weights. For a 4-bit base, each decoder projection (q/k/v/o/gate/up/down, as
   BitsAndBytesConfig(load_in_4bit) quantizes every nn.Linear but lm_head) is replaced by a
   bitsandbytes Linear4bit whose Params4bit is quantized on the device straight from its random
   bf16 weight (blocksize 64, nested absmax with --double-quant), then the bf16 copy is freed. That
   is what from_pretrained(quantization_config=BitsAndBytesConfig(...)) does tensor by tensor, minus
   the checkpoint: peak memory during load is the 4-bit model plus one bf16 projection, host memory
   stays small, so Llama-3-70B loads on one 80 GB GPU without writing a 140 GB checkpoint.
 - 4-bit base: peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=...,
   gradient_checkpointing_kwargs={"use_reentrant": False}). As shipped it freezes the base and
   upcasts EVERY bf16 parameter that is not Params4bit to fp32: the RMSNorm weights, embed_tokens
   and lm_head (--kbit-prep peft, the default). --kbit-prep trl then casts embed_tokens/lm_head
   back to bf16 and keeps the norms in fp32 (what TRL's SFTTrainer does for bf16 runs);
   --kbit-prep none skips the call. bf16 base (--method lora): no prepare_model_for_kbit_training
   (it would upcast the whole model); gradient checkpointing through gradient_checkpointing_enable.
 - peft LoraConfig(r, lora_alpha, target_modules, lora_dropout=0, bias="none"); adapters in fp32
   (peft's autocast_adapter_dtype default), base frozen; LoRA B then set to normal(0, 0.02), as
   qlora bench does, instead of PEFT's zeros.
 - bf16 autocast around forward + loss (HF Trainer with bf16=True); loss from the model
   (labels = input_ids, shifted inside, fp32 cross-entropy over the full logits).
 - torch.optim.AdamW(lr, betas (0.9, 0.999), eps 1e-8, weight_decay 0; fused=True on CUDA),
   gradient clipping at max norm 1.0: the defaults of qlora's trainer (src/train/train_config.cpp)
   and of HF Trainer. lr defaults to 2e-4, qlora bench's BenchOptions.learning_rate.
 - Random tokens from a seeded generator, a fresh batch every step; warm-up steps are not timed;
   each timed step is split forward / backward / optimizer with torch.cuda.synchronize() between
   phases (host clock read after the synchronize).

FLOPs: the same counter as qlora.cpp (src/plan/flops.cpp, flops_per_token and shape_sums; the
formula is in src/plan/flops.h and perf_anchors.md §10), attention over the whole sequence (one
document per row), recompute counted when checkpointing, as bench_flop_counts() in
src/tasks/bench_run.cpp. As qlora bench (and the planner's speed model): flops_per_token =
FlopCounts::total() = forward + backward (+ recompute); achieved_flops = tokens/s *
flops_per_token; mfu = tokens/s * model FLOPs (forward + backward, no recompute,
FlopCounts::model()) / peak_flops, so checkpointing lowers MFU but not achieved_flops. The parts
are in setup.flops_per_token_parts.
peak_flops: the bf16 dense peak of the GPU catalog (src/plan/gpu_catalog.cpp), chosen from the
device name as gpu_for_device_name() there does; null on the CPU or an unlisted GPU.

Memory: peak_memory_bytes = torch.cuda.max_memory_allocated() over the whole run (load included),
peak_memory_reserved_bytes = max_memory_reserved(); peak_device_used_bytes = the largest
total - free of cudaMemGetInfo sampled after every phase of every step, which is how qlora bench
measures its own peak (CUDA context and allocator slack included).

Out of memory (torch.cuda.OutOfMemoryError, or bitsandbytes' CUDA "out of memory"): prints the
JSON with "error": "oom", the phase and the memory at failure, and exits 0 so a device run goes on.
Other failures print "error": "exception" and exit 1.
"""
import argparse
import gc
import json
import math
import os
import resource
import sys
import time
import traceback
import warnings

# ---------------------------------------------------------------------------------------------------
# Model presets: the llama-type rows of kPresets in src/model/llama_presets.cpp (HF config.json
# values). rope: None or the llama3 scaling (low 1, high 4, original 8192, as preset_config() sets).

PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _p(V, C, F, L, H, KV, hd, max_pos, eps, theta, rope_factor, tie):
    return dict(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                num_key_value_heads=KV, head_dim=hd, max_position_embeddings=max_pos, rms_norm_eps=eps,
                rope_theta=float(theta), rope_llama3_factor=rope_factor, tie_word_embeddings=tie)


PRESETS = {
    #                 V       C      F      L    H    KV  hd   max_pos  eps   theta   llama3   tie
    "llama2-7b":     _p(32000, 4096, 11008, 32, 32, 32, 128, 4096, 1e-5, 10000, None, False),
    "llama3-8b":     _p(128256, 4096, 14336, 32, 32, 8, 128, 8192, 1e-5, 500000, None, False),
    "llama3-70b":    _p(128256, 8192, 28672, 80, 64, 8, 128, 8192, 1e-5, 500000, None, False),
    "llama3.1-8b":   _p(128256, 4096, 14336, 32, 32, 8, 128, 131072, 1e-5, 500000, 8.0, False),
    "llama3.1-70b":  _p(128256, 8192, 28672, 80, 64, 8, 128, 131072, 1e-5, 500000, 8.0, False),
    "llama3.1-405b": _p(128256, 16384, 53248, 126, 128, 8, 128, 131072, 1e-5, 500000, 8.0, False),
    "llama3.2-1b":   _p(128256, 2048, 8192, 16, 32, 8, 64, 131072, 1e-5, 500000, 32.0, True),
    "llama3.2-3b":   _p(128256, 3072, 8192, 28, 24, 8, 128, 131072, 1e-5, 500000, 32.0, True),
    "smollm2-135m":  _p(49152, 576, 1536, 30, 9, 3, 64, 8192, 1e-5, 100000, None, True),
    "smollm2-360m":  _p(49152, 960, 2560, 32, 15, 5, 64, 8192, 1e-5, 100000, None, True),
    "smollm2-1.7b":  _p(49152, 2048, 8192, 24, 32, 32, 64, 8192, 1e-5, 130000, None, True),
    "tinyllama-1.1b": _p(32000, 2048, 5632, 22, 32, 4, 64, 2048, 1e-5, 10000, None, False),
}

# bf16 dense tensor peaks, TFLOP/s, from src/plan/gpu_catalog.cpp (fp32 accumulate).
GPU_BF16_TFLOPS = {
    "a100-40gb": 312.0, "a100-80gb": 312.0, "h100-sxm": 989.4, "h100-nvl": 835.5, "h200": 989.4,
    "b200": 2250.0, "b200-180gb": 2250.0, "b300": 2250.0, "gb200": 2500.0, "gb300": 2500.0,
    "rtx4090": 165.2, "rtx5090": 209.5,
}


def gpu_for_device_name(name, mem_bytes):
    """Catalog key for a CUDA device name, as src/plan/gpu_catalog.cpp gpu_for_device_name()."""
    n = "".join(ch for ch in name.lower() if ch not in " -_")
    gib = 1 << 30
    if "gb300" in n:
        return "gb300"
    if "gb200" in n:
        return "gb200"
    if "b300" in n:
        return "b300"
    if "b200" in n:
        return "b200" if mem_bytes > 185 * gib else "b200-180gb"
    if "h200" in n:
        return None if "nvl" in n else "h200"  # H200 NVL: lower clocks, not catalogued
    if "h100" in n:
        if "nvl" in n:
            return "h100-nvl"
        if "pcie" in n:
            return None  # H100 PCIe (756 TFLOP/s) is not catalogued
        return "h100-sxm"  # "NVIDIA H100 80GB HBM3" is the SXM part
    if "a100" in n:
        return "a100-80gb" if mem_bytes > 48 * gib else "a100-40gb"
    if "rtx4090" in n:
        return "rtx4090"
    if "rtx5090" in n:
        return "rtx5090"
    return None


# ---------------------------------------------------------------------------------------------------
# FLOPs: a port of src/plan/flops.cpp (flops_per_token, shape_sums) and model_plan.cpp
# projection_shape(); formula in src/plan/flops.h.

def projection_shape(p, proj):
    C, F = p["hidden_size"], p["intermediate_size"]
    q_dim = p["num_attention_heads"] * p["head_dim"]
    kv_dim = p["num_key_value_heads"] * p["head_dim"]
    return {"q_proj": (q_dim, C), "k_proj": (kv_dim, C), "v_proj": (kv_dim, C), "o_proj": (C, q_dim),
            "gate_proj": (F, C), "up_proj": (F, C), "down_proj": (C, F)}[proj]  # (out, in)


def flop_counts(p, method, r, targets, attn_len, recompute):
    """Per-token FLOPs {forward, backward, recompute, total, model} exactly as flops_per_token():
    forward  = 2 n_lin + 2 n_head + 2 r p_l + A,   A = 4 q_dim (D+1)/2 L
    backward = 2 n_lin + 2 n_head + 4 r p_l + 2.5 A     (frozen base; full: 4 n_lin + 4 n_head + 2.5 A)
    recompute = 2 n_lin + 2 r p_l + A                   (when checkpointing; LM head not recomputed)"""
    full = method == "full"
    L = float(p["num_hidden_layers"])
    n_lin = p_l = 0.0
    for t in PROJ:
        out, inp = projection_shape(p, t)
        n_lin += float(out) * float(inp) * L
        if not full and t in targets:
            p_l += float(inp + out) * L
    n_head = float(p["vocab_size"]) * float(p["hidden_size"])
    rr = 0.0 if full else float(r)
    D = float(max(attn_len, 1))
    A = 4.0 * float(p["num_attention_heads"] * p["head_dim"]) * (D + 1.0) / 2.0 * L
    fwd = 2 * n_lin + 2 * n_head + 2 * rr * p_l + A
    bwd = (4 * n_lin + 4 * n_head + 2.5 * A) if full else (2 * n_lin + 2 * n_head + 4 * rr * p_l + 2.5 * A)
    rec = (2 * n_lin + 2 * rr * p_l + A) if recompute else 0.0
    return {"forward": fwd, "backward": bwd, "recompute": rec, "total": fwd + bwd + rec, "model": fwd + bwd}


def n_params(p):
    """Base parameter count as LlamaConfig::n_params() (logical elements, not packed 4-bit bytes)."""
    C, F, V = p["hidden_size"], p["intermediate_size"], p["vocab_size"]
    q_dim = p["num_attention_heads"] * p["head_dim"]
    kv_dim = p["num_key_value_heads"] * p["head_dim"]
    layer = C * q_dim + 2 * C * kv_dim + q_dim * C + 3 * C * F + 2 * C
    return V * C + p["num_hidden_layers"] * layer + C + (0 if p["tie_word_embeddings"] else V * C)


# ---------------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", "-m", default="llama3-8b", help="preset: " + ", ".join(PRESETS))
    ap.add_argument("--method", default="", help="lora | qlora (default: qlora for nf4/fp4, else lora)")
    ap.add_argument("--base-precision", default="",
                    help="bf16 | fp32 | nf4 | fp4 (default nf4 for qlora; lora: bf16 on CUDA, fp32 on the CPU)")
    dq = ap.add_mutually_exclusive_group()
    dq.add_argument("--double-quant", dest="double_quant", action="store_true", default=None)
    dq.add_argument("--no-double-quant", dest="double_quant", action="store_false")
    ap.add_argument("--r", "--lora-r", "-r", dest="r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("--target-modules", "--targets", dest="target_modules", default="all-linear",
                    help="all-linear or a comma list of " + ",".join(PROJ))
    ap.add_argument("--seq-len", "-t", type=int, default=2048)
    ap.add_argument("--micro-batch", "-b", type=int, default=4)
    ap.add_argument("--gradient-checkpointing", "--checkpointing", dest="gradient_checkpointing", default="none",
                    help="none | full")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", "--learning-rate", dest="lr", type=float, default=2e-4)
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="0 = no clipping")
    ap.add_argument("--kbit-prep", default="peft", choices=["peft", "trl", "none"],
                    help="4-bit bases: peft = prepare_model_for_kbit_training as shipped (norms, embeddings, "
                         "lm_head in fp32); trl = then embeddings/lm_head back to bf16; none = skip it")
    ap.add_argument("--device", default="cuda", help="cuda | cpu")
    ap.add_argument("--json", action="store_true", help="print only the JSON on stdout")
    a = ap.parse_args(argv)
    if a.model not in PRESETS:
        ap.error(f"unknown model preset '{a.model}'; presets: {', '.join(PRESETS)}")
    bp = a.base_precision.lower()
    if not a.method:
        a.method = "qlora" if bp in ("nf4", "fp4") else "lora"
    if a.method not in ("lora", "qlora"):
        ap.error("--method: lora | qlora")
    if not bp:  # as normalize_bench_options(): the backend's compute dtype (fp32 on the CPU, bf16 on CUDA)
        bp = "nf4" if a.method == "qlora" else ("fp32" if a.device == "cpu" else "bf16")
    if bp not in ("bf16", "fp32", "nf4", "fp4"):
        ap.error("--base-precision: bf16 | fp32 | nf4 | fp4 (bitsandbytes has no nvfp4/mxfp4/fp8 training path)")
    if a.method == "qlora" and bp not in ("nf4", "fp4"):
        ap.error("--method qlora needs --base-precision nf4 or fp4")
    if a.method == "lora" and bp in ("nf4", "fp4"):
        a.method = "qlora"  # a 4-bit base is QLoRA, as qlora bench normalizes it
    a.base_precision = bp
    if a.double_quant is None:
        a.double_quant = bp in ("nf4", "fp4")
    if bp not in ("nf4", "fp4"):
        a.double_quant = False
    t = a.target_modules.replace(" ", "")
    a.targets = list(PROJ) if t == "all-linear" else [x for x in t.split(",") if x]
    bad = [x for x in a.targets if x not in PROJ]
    if bad or not a.targets:
        ap.error(f"--target-modules: unknown {bad}; use all-linear or a comma list of {','.join(PROJ)}")
    if a.gradient_checkpointing not in ("none", "full"):
        ap.error("--gradient-checkpointing: none | full (offload has no stock HF equivalent)")
    for k in ("r", "seq_len", "micro_batch", "steps"):
        if getattr(a, k) <= 0:
            ap.error(f"--{k.replace('_', '-')} must be positive")
    if a.warmup_steps < 0:
        ap.error("--warmup-steps must be >= 0")
    return a


def config_json(a):
    return {"method": a.method, "base_precision": a.base_precision, "double_quant": a.double_quant, "r": a.r,
            "lora_alpha": a.lora_alpha, "target_modules": a.target_modules, "seq_len": a.seq_len,
            "micro_batch": a.micro_batch, "gradient_checkpointing": a.gradient_checkpointing, "steps": a.steps,
            "warmup_steps": a.warmup_steps, "seed": a.seed}


def versions():
    v = {}
    for name in ("torch", "transformers", "peft", "bitsandbytes"):
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = __import__(name)
            except Exception:  # bitsandbytes is optional on the bf16/CPU path
                mod = None
        v[name] = getattr(mod, "__version__", None) if mod else None
    return v


def log(msg):
    print(f"[hf_peft_bench +{time.perf_counter() - T0:.1f}s] {msg}", file=sys.stderr, flush=True)


T0 = time.perf_counter()


# ---------------------------------------------------------------------------------------------------

def make_config(p, seq_len):
    import inspect

    from transformers import LlamaConfig
    kw = dict(vocab_size=p["vocab_size"], hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
              num_hidden_layers=p["num_hidden_layers"], num_attention_heads=p["num_attention_heads"],
              num_key_value_heads=p["num_key_value_heads"], head_dim=p["head_dim"],
              max_position_embeddings=max(p["max_position_embeddings"], seq_len), rms_norm_eps=p["rms_norm_eps"],
              tie_word_embeddings=p["tie_word_embeddings"], hidden_act="silu", attention_bias=False, mlp_bias=False,
              use_cache=False)
    rope = {"rope_type": "default", "rope_theta": p["rope_theta"]}
    if p["rope_llama3_factor"]:
        rope = {"rope_type": "llama3", "rope_theta": p["rope_theta"], "factor": p["rope_llama3_factor"],
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:  # transformers >= 5
        kw["rope_parameters"] = rope
    else:
        kw["rope_theta"] = p["rope_theta"]
        if p["rope_llama3_factor"]:
            kw["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    cfg = LlamaConfig(**kw)
    cfg._attn_implementation = "sdpa"
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", None))
    assert theta == p["rope_theta"], f"rope_theta not applied: {theta}"
    return cfg


def build_model(a, p, dev):
    """Meta-device skeleton, then each tensor made on `dev`; 4-bit projections quantized one by one."""
    import torch
    from torch import nn
    from transformers import LlamaForCausalLM

    cfg = make_config(p, a.seq_len)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    wdt = torch.float32 if a.base_precision == "fp32" else torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(a.seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=wdt).mul_(0.02)

    quant = a.base_precision in ("nf4", "fp4")
    if quant:
        import bitsandbytes as bnb
    base = model.model
    base.embed_tokens.weight = nn.Parameter(rand(p["vocab_size"], p["hidden_size"]), requires_grad=False)
    for i, layer in enumerate(base.layers):
        for mod_name in ("self_attn", "mlp"):
            parent = getattr(layer, mod_name)
            for proj in PROJ:
                lin = getattr(parent, proj, None)
                if lin is None:
                    continue
                w = rand(lin.out_features, lin.in_features)
                if quant:
                    q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=False, compute_dtype=torch.bfloat16,
                                          compress_statistics=a.double_quant, quant_type=a.base_precision,
                                          quant_storage=torch.uint8, device="meta")
                    q.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type=a.base_precision,
                                                 compress_statistics=a.double_quant, blocksize=64,
                                                 quant_storage=torch.uint8).to(dev)
                    setattr(parent, proj, q)
                else:
                    lin.weight = nn.Parameter(w, requires_grad=False)
                del w
        for norm in ("input_layernorm", "post_attention_layernorm"):
            n = getattr(layer, norm)
            n.weight = nn.Parameter(torch.ones(p["hidden_size"], device=dev, dtype=wdt), requires_grad=False)
        if dev.type == "cuda" and (i + 1) % 8 == 0:
            log(f"layer {i + 1}/{len(base.layers)} built; allocated {torch.cuda.memory_allocated() / 2**30:.1f} GiB")
    base.norm.weight = nn.Parameter(torch.ones(p["hidden_size"], device=dev, dtype=wdt), requires_grad=False)
    if p["tie_word_embeddings"]:
        model.lm_head.weight = base.embed_tokens.weight
    else:
        model.lm_head.weight = nn.Parameter(rand(p["vocab_size"], p["hidden_size"]), requires_grad=False)
    # Buffers made at construction (RoPE inverse frequencies) are meta too: rebuild on the device.
    import inspect
    rot_cls = type(base.rotary_emb)
    with torch.device(dev):  # transformers 5.2x takes no device argument; older ones do
        kw = {"device": dev} if "device" in inspect.signature(rot_cls.__init__).parameters else {}
        base.rotary_emb = rot_cls(config=cfg, **kw)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.device.type == "meta"]
    assert not left, f"tensors left on the meta device: {left[:5]}"
    model.config.use_cache = False
    if quant:
        # What from_pretrained(quantization_config=BitsAndBytesConfig(load_in_4bit=True)) marks; peft's
        # LoRA dispatch (loaded_in_4bit) and prepare_model_for_kbit_training read these.
        for attr, val in (("is_loaded_in_4bit", True), ("is_quantized", True), ("quantization_method", "bitsandbytes")):
            try:
                setattr(model, attr, val)
            except (AttributeError, TypeError):  # a read-only property in some transformers version
                pass
        assert getattr(model, "is_loaded_in_4bit", False), "peft would not see the 4-bit base"
    return model


def enable_gc(model):
    kw = {"use_reentrant": False}
    fn = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2x renamed it
    if fn is not None:
        fn(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def prepare(a, model):
    import torch
    from peft import LoraConfig, get_peft_model

    gc_on = a.gradient_checkpointing == "full"
    if a.base_precision in ("nf4", "fp4") and a.kbit_prep != "none":
        from peft import prepare_model_for_kbit_training
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gc_on,
                                                    gradient_checkpointing_kwargs={"use_reentrant": False})
        if a.kbit_prep == "trl":
            for m in (model.get_input_embeddings(), model.get_output_embeddings()):
                m.to(torch.bfloat16)
    else:
        for prm in model.parameters():
            prm.requires_grad_(False)
        if gc_on:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                enable_gc(model)
    lcfg = LoraConfig(r=a.r, lora_alpha=a.lora_alpha, target_modules=list(a.targets), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lcfg)
    # As qlora bench (src/tasks/bench_run.cpp): LoRA B ~ normal(0, 0.02) instead of PEFT's zeros, so
    # every adapter matmul works on real numbers from the first step.
    gen = torch.Generator(device="cpu").manual_seed(a.seed + 2)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if "lora_B" in name:
                prm.copy_(torch.randn(prm.shape, generator=gen, dtype=torch.float32).mul_(0.02).to(prm.dtype))
    if gc_on and a.base_precision not in ("nf4", "fp4"):
        model.base_model.model.config.use_cache = False
    return model


def mem_now(torch, dev):
    if dev.type != "cuda":
        return {"peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    free, total = torch.cuda.mem_get_info()
    return {"allocated_bytes": torch.cuda.memory_allocated(), "reserved_bytes": torch.cuda.memory_reserved(),
            "peak_memory_bytes": torch.cuda.max_memory_allocated(),
            "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
            "device_used_bytes": total - free, "device_total_bytes": total}


def is_oom(e, torch):
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(e, (RuntimeError, MemoryError)) and "out of memory" in str(e).lower()


def run(a):
    import torch
    import transformers  # noqa: F401  (versions)
    import peft  # noqa: F401

    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device (use --device cpu)")
        dev = torch.device("cuda", torch.cuda.current_device())
    p = PRESETS[a.model]
    tokens = a.micro_batch * a.seq_len
    fl = flop_counts(p, a.method, a.r, a.targets, a.seq_len, a.gradient_checkpointing != "none")
    res = {"tool": "hf-peft", "versions": None, "device": None, "model": a.model, "config": config_json(a)}
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        total_mem = torch.cuda.get_device_properties(dev).total_memory
        key = gpu_for_device_name(name, total_mem)
        peak = GPU_BF16_TFLOPS[key] * 1e12 if key else None
    else:
        import platform
        name = "cpu" + (f" ({platform.processor()})" if platform.processor() else "")
        peak = None
    res["device"] = name
    autocast_dtype = None if a.base_precision == "fp32" else torch.bfloat16
    res["setup"] = {
        "attn_implementation": "sdpa",
        "weights": ("random normal(0, 0.02) " + ("fp32" if a.base_precision == "fp32" else "bf16")
                    + ", made on the device tensor by tensor"),
        "quantization": (f"bitsandbytes Linear4bit {a.base_precision}, blocksize 64, "
                         f"double_quant={a.double_quant}, quantized per projection on the device")
        if a.base_precision in ("nf4", "fp4") else None,
        "kbit_prep": a.kbit_prep if a.base_precision in ("nf4", "fp4") else None,
        "autocast": "bf16" if autocast_dtype else None,
        "optimizer": "torch.optim.AdamW" + (" fused" if dev.type == "cuda" else " foreach"),
        "lr": a.lr, "max_grad_norm": a.max_grad_norm,
        "flops_per_token_parts": fl,
        "timing": "torch.cuda.synchronize() between phases; means over the timed steps",
    }
    phase = "load"
    try:
        torch.manual_seed(a.seed)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        peak_used = [0]

        def sync():  # device work done; then sample device memory in use, as qlora bench does
            if dev.type == "cuda":
                torch.cuda.synchronize()
                free, total = torch.cuda.mem_get_info()
                peak_used[0] = max(peak_used[0], total - free)

        t_load = time.perf_counter()
        model = build_model(a, p, dev)
        model = prepare(a, model)
        model.train()
        trainable = [q for q in model.parameters() if q.requires_grad]
        res["trainable_params"] = sum(q.numel() for q in trainable)
        res["base_params"] = n_params(p)
        if dev.type == "cuda":
            opt = torch.optim.AdamW(trainable, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=True)
        else:
            opt = torch.optim.AdamW(trainable, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, foreach=True)
        sync()
        res["setup"]["load_s"] = time.perf_counter() - t_load
        res["setup"]["memory_after_load"] = mem_now(torch, dev)
        log(f"model ready in {res['setup']['load_s']:.1f}s; trainable {res['trainable_params']:,}")

        gen = torch.Generator(device="cpu").manual_seed(a.seed + 1)
        losses, times = [], []
        phase = "train"
        for step in range(a.warmup_steps + a.steps):
            ids = torch.randint(0, p["vocab_size"], (a.micro_batch, a.seq_len), generator=gen).to(dev)
            sync()
            t0 = time.perf_counter()
            with torch.autocast(device_type=dev.type, dtype=autocast_dtype or torch.bfloat16,
                                enabled=autocast_dtype is not None):
                loss = model(input_ids=ids, labels=ids).loss
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            if a.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(trainable, a.max_grad_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            t3 = time.perf_counter()
            losses.append(float(loss.detach()))
            if step >= a.warmup_steps:
                times.append((t1 - t0, t2 - t1, t3 - t2))
            log(f"step {step + 1}/{a.warmup_steps + a.steps}{' (warmup)' if step < a.warmup_steps else ''} "
                f"loss {losses[-1]:.4f} fwd {t1 - t0:.3f}s bwd {t2 - t1:.3f}s opt {t3 - t2:.3f}s")
            del loss, ids
    except Exception as e:  # noqa: BLE001
        if is_oom(e, torch):
            res["error"] = "oom"
            res["phase"] = phase
            res["message"] = str(e).splitlines()[0][:500] if str(e) else type(e).__name__
            m = mem_now(torch, dev)
            res["memory_at_failure"] = m
            res["peak_memory_bytes"] = m.get("peak_memory_bytes", m.get("peak_host_rss_bytes"))
            res["peak_memory_reserved_bytes"] = m.get("peak_memory_reserved_bytes", res["peak_memory_bytes"])
            res["peak_memory_kind"] = "device" if dev.type == "cuda" else "host_rss"
            res["versions"] = versions()
            log(f"out of memory during {phase}: {res['message'][:200]}")
            return res, 0
        res["error"] = "exception"
        res["phase"] = phase
        res["message"] = f"{type(e).__name__}: {e}"[:2000]
        res["traceback"] = traceback.format_exc()[-4000:]
        res["versions"] = versions()
        return res, 1

    n = len(times)
    fwd = sum(t[0] for t in times) / n
    bwd = sum(t[1] for t in times) / n
    optm = sum(t[2] for t in times) / n
    mean = fwd + bwd + optm
    tps = tokens / mean
    res["versions"] = versions()
    res["tokens_per_second"] = tps
    res["step_time_s"] = {"mean": mean, "forward": fwd, "backward": bwd, "optimizer": optm}
    res["flops_per_token"] = fl["total"]  # as qlora bench: forward + backward + recompute
    res["achieved_flops"] = fl["total"] * tps
    res["peak_flops"] = peak
    res["mfu"] = fl["model"] * tps / peak if peak else None  # model FLOPs: no recompute
    if dev.type == "cuda":
        res["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        res["peak_memory_reserved_bytes"] = torch.cuda.max_memory_reserved()
        res["peak_memory_kind"] = "device"
        res["peak_device_used_bytes"] = peak_used[0]
        res["setup"]["memory_at_end"] = mem_now(torch, dev)
    else:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        res["peak_memory_bytes"] = rss
        res["peak_memory_reserved_bytes"] = rss
        res["peak_memory_kind"] = "host_rss"
    res["loss_first"] = losses[0]
    res["loss_last"] = losses[-1]
    if not all(math.isfinite(x) for x in losses):
        res["warning"] = "non-finite loss"
    # Field order as qlora bench prints them; trainable/base counts last.
    order = ["tool", "versions", "device", "model", "config", "tokens_per_second", "step_time_s", "flops_per_token",
             "achieved_flops", "peak_flops", "mfu", "peak_memory_bytes", "peak_memory_reserved_bytes",
             "peak_device_used_bytes", "peak_memory_kind", "loss_first", "loss_last", "trainable_params", "base_params"]
    out = {k: res[k] for k in order if k in res}
    out.update({k: v for k, v in res.items() if k not in out})
    return out, 0


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*use_cache=True.*")
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5.2x renames (checkpointing)
    try:
        res, rc = run(a)
    except Exception as e:  # noqa: BLE001  (imports, no device): still one JSON object on stdout
        res = {"tool": "hf-peft", "versions": versions(), "device": None, "model": a.model, "config": config_json(a),
               "error": "exception", "phase": "setup", "message": f"{type(e).__name__}: {e}"[:2000],
               "traceback": traceback.format_exc()[-4000:]}
        rc = 1
    text = json.dumps(res, indent=None if a.json else 1)
    if not a.json and "error" not in res:
        print(f"{res['model']} {a.method} {a.base_precision} r={a.r} seq {a.seq_len} x {a.micro_batch} "
              f"gc={a.gradient_checkpointing} on {res['device']}: {res['tokens_per_second']:.1f} tok/s, "
              f"step {res['step_time_s']['mean']:.3f}s, peak {res['peak_memory_bytes'] / 2**30:.2f} GiB "
              f"({res['peak_memory_kind']}), MFU "
              + (f"{100 * res['mfu']:.1f}%" if res["mfu"] is not None else "n/a"))
    print(text, flush=True)
    gc.collect()
    return rc


if __name__ == "__main__":
    sys.exit(main())
