#!/usr/bin/env python3
# Hugging Face parity fixtures: tiny random models, base/LoRA logits, LoRA gradients, a 3-step AdamW run.
"""Generate the parity fixtures that the C++ tests compare against.

    /opt/fixenv/bin/python tools/make_parity_fixtures.py            # all variants
    /opt/fixenv/bin/python tools/make_parity_fixtures.py --variant llama_gqa
    /opt/fixenv/bin/python tools/make_parity_fixtures.py --check-engine-adapter DIR --variant V --out F

Writes tests/fixtures/models/<variant>/ and tests/fixtures/parity/<variant>{.safetensors,_adapter/}.
The file format and every key are documented in tests/fixtures/parity/README.md.
The tiny_byte demo model is made by tools/make_demo_data.py, not here.
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import transformers
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3Config, Gemma3TextConfig, GptOssConfig,
                          LlamaConfig, MistralConfig, MixtralConfig, Mxfp4Config, Phi3Config, Qwen2Config,
                          Qwen3Config, Qwen3MoeConfig, SiglipVisionConfig, get_cosine_schedule_with_warmup)
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
import peft
from peft import LoraConfig, PeftModel, get_peft_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "fixtures", "models")
PARITY = os.path.join(ROOT, "tests", "fixtures", "parity")

B, T = 2, 12                 # batch and sequence length of every fixture input
N_STEP, N_MICRO = 3, 2       # optimizer steps and micro-batches per step of the training run
LORA_R, LORA_ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR, BETAS, EPS, WD, MAX_NORM = 5e-3, (0.9, 0.999), 1e-8, 0.01, 0.5

DIMS = dict(vocab_size=96, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5,
            bos_token_id=1, eos_token_id=2)

# variant -> (config, seed, config.json style). "legacy" rewrites rope_parameters into the
# rope_theta + rope_scaling keys that checkpoints on the Hub carry; "v5" keeps what transformers 5
# writes (rope_parameters holding rope_type/rope_theta/...), so the engine's reader sees both.
def gemma3_text_config():
    return Gemma3TextConfig(**{**DIMS, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=24,
                            query_pre_attn_scalar=20, sliding_window=5, tie_word_embeddings=True,
                            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                            rope_parameters={
                                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})


def variant_configs():
    return {
        "llama_gqa": (LlamaConfig(**DIMS, num_key_value_heads=2, tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                   "factor": 8.0, "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16}),
                      1001, "legacy"),
        "mistral": (MistralConfig(**DIMS, num_key_value_heads=1, tie_word_embeddings=False,
                                  sliding_window=None,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                    1002, "legacy"),
        "qwen2": (Qwen2Config(**DIMS, num_key_value_heads=2, tie_word_embeddings=False,
                              use_sliding_window=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                  1003, "legacy"),
        "llama_tied": (LlamaConfig(**DIMS, num_key_value_heads=4, tie_word_embeddings=True,
                                   rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                    "rope_theta": 10000.0}),
                       1004, "v5"),
        # Qwen3: q_norm/k_norm per head before RoPE, head_dim (24) not hidden/heads (16), so the
        # attention width (96) differs from hidden_size; tied head as on the small Qwen3 sizes.
        "qwen3": (Qwen3Config(**DIMS, num_key_value_heads=2, head_dim=24, tie_word_embeddings=True,
                              use_sliding_window=False, attention_bias=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                  1005, "legacy"),
        # Sliding windows shorter than the 12-token rows: Mistral v0.1's on every layer (5 keys),
        # Qwen3's use_sliding_window on the layers from max_window_layers on (layer 1, 4 keys).
        "mistral_sw": (MistralConfig(**DIMS, num_key_value_heads=2, tie_word_embeddings=False,
                                     sliding_window=5,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                       1006, "legacy"),
        "qwen3_sw": (Qwen3Config(**DIMS, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                                 use_sliding_window=True, sliding_window=4, max_window_layers=1,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                     1007, "legacy"),
        # Gemma 3 text: (1 + w) norms before and after attention and MLP, q/k norms, embeddings
        # times sqrt(64), GeGLU, query_pre_attn_scalar 20 (not head_dim 24), two sliding layers
        # (window 5 on 12-token rows, RoPE base 1e4) and a global one (base 1e6, linear scaling 2).
        "gemma3": (gemma3_text_config(), 1009, "v5"),
        # Gemma 3's multimodal checkpoints (4b/12b/27b): Gemma3ForConditionalGeneration with the
        # text model above under text_config and a small SigLIP vision tower; weights saved under
        # language_model.* and LoRA on the language model only (a regex target_modules).
        "gemma3_mm": (Gemma3Config(text_config=gemma3_text_config(),
                                   vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=48,
                                                                    num_hidden_layers=1, num_attention_heads=2,
                                                                    image_size=28, patch_size=14,
                                                                    vision_use_head=False),
                                   mm_tokens_per_image=4),
                      1017, "v5"),
        # Gemma 2: Gemma 3's norms, scaling and GeGLU without q/k norms, every other layer sliding
        # (window 5 on 12-token rows) and soft-capping small enough to bend the scores (cap 3) and
        # the logits (cap 2) well away from the identity.
        "gemma2": (Gemma2Config(**{**DIMS, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=24,
                                query_pre_attn_scalar=20, sliding_window=5, tie_word_embeddings=True,
                                attn_logit_softcapping=3.0, final_logit_softcapping=2.0,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                   1012, "v5"),
        # Phi-3 / Phi-4: q, k, v in one qkv_proj and gate, up in one gate_up_proj, so PEFT's LoRA
        # on them shares one A across the fused outputs; a sliding window of 5 on every layer
        # (Phi-3-mini-4k's 2047, scaled down).
        "phi3": (Phi3Config(**DIMS, num_key_value_heads=2, tie_word_embeddings=False, sliding_window=5,
                            pad_token_id=0, original_max_position_embeddings=64,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                 1011, "legacy"),
        # Phi-3.5-mini / Phi-4-mini's RoPE: LongRoPE over a partial rotary embedding (the first 8 of
        # 16 dims of each head, Phi-4-mini's partial_rotary_factor scaled down), pretrained on 8
        # positions and stretched to 64: the 12-token rows rotate with the long factors, the first
        # 8 tokens alone (short_logits) with the short ones; cos and sin times sqrt(1 + ln 8 / ln 8).
        # config.json as the Hub's Phi files have it: partial_rotary_factor and
        # original_max_position_embeddings at the top level, rope_scaling with type "longrope".
        "phi3_longrope": (Phi3Config(**DIMS, num_key_value_heads=2, tie_word_embeddings=False, sliding_window=None,
                                     pad_token_id=0, original_max_position_embeddings=8, partial_rotary_factor=0.5,
                                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                      "short_factor": [1.0, 1.3, 2.1, 3.7],
                                                      "long_factor": [1.5, 4.0, 11.0, 27.0]}),
                          1019, "hub_phi"),
        # Qwen3 with YaRN as Qwen's documentation sets it for long context (factor 4 over the
        # original context, 4096 here): the ramp blends frequencies 2..6 of 8, cos and sin times
        # 0.1 ln 4 + 1. rope_inv_freq / rope_inv_freq_untruncated hold transformers' frequencies
        # with the ramp's ends floored and ceiled (the default) and not (gpt-oss's truncate false).
        "qwen3_yarn": (Qwen3Config(**{**DIMS, "max_position_embeddings": 16384}, num_key_value_heads=2, head_dim=16,
                                   tie_word_embeddings=False, use_sliding_window=False,
                                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                    "original_max_position_embeddings": 4096}),
                       1020, "legacy"),
        # Mixture of experts: 16 experts of 32, two per token (softmax, top-2, renormalised), so
        # over the fixture's 24 tokens some experts get several tokens and some none.
        "mixtral": (MixtralConfig(**{**DIMS, "intermediate_size": 32}, num_key_value_heads=2, num_local_experts=16,
                                  num_experts_per_tok=2, router_jitter_noise=0.0, sliding_window=None,
                                  tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                    1014, "legacy"),
        # Mixtral with output_router_logits: the loss adds router_aux_loss_coef (0.1, five times the
        # default so that it moves the gradients clearly) times transformers' load-balancing loss
        # over both layers' routing; the training run's objective is the token mean plus the
        # coefficient times the mean of its micro-batches' aux losses.
        "mixtral_aux": (MixtralConfig(**{**DIMS, "intermediate_size": 32}, num_key_value_heads=2, num_local_experts=16,
                                      num_experts_per_tok=2, router_jitter_noise=0.0, sliding_window=None,
                                      tie_word_embeddings=False, output_router_logits=True, router_aux_loss_coef=0.1,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                        1023, "legacy"),
        # Qwen3-MoE: Qwen3's attention (q/k norms, head_dim 16) and 32 experts of 24, four per token,
        # the chosen probabilities not renormalised (norm_topk_prob false: the other router branch).
        "qwen3_moe": (Qwen3MoeConfig(**DIMS, num_key_value_heads=2, head_dim=16, num_experts=32,
                                     num_experts_per_tok=4, moe_intermediate_size=24, norm_topk_prob=False,
                                     tie_word_embeddings=False, use_sliding_window=False,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                      1015, "legacy"),
        # Qwen3-MoE as Qwen3-30B-A3B routes: the chosen probabilities renormalised (norm_topk_prob
        # true), 16 experts of 24, four per token; also exported to GGUF and run by llama.cpp.
        "qwen3_moe_norm": (Qwen3MoeConfig(**DIMS, num_key_value_heads=2, head_dim=16, num_experts=16,
                                          num_experts_per_tok=4, moe_intermediate_size=24, norm_topk_prob=True,
                                          tie_word_embeddings=False, use_sliding_window=False,
                                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                           1028, "legacy"),
        # LoRA on the experts too (PEFT's target_parameters on the stacked mlp.experts.gate_up_proj
        # and down_proj, one rank-r factor pair per expert, plus q_proj and v_proj): Qwen3-MoE with
        # renormalised routing, experts of 24 (gate_up's 48 rows differ from the hidden 64, so each
        # factor's orientation shows).
        "qwen3_moe_experts": (Qwen3MoeConfig(**DIMS, num_key_value_heads=2, head_dim=16, num_experts=16,
                                             num_experts_per_tok=4, moe_intermediate_size=24, norm_topk_prob=True,
                                             tie_word_embeddings=False, use_sliding_window=False,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                              1029, "legacy"),
        # gpt-oss: attention with biases and a learned sink logit per head, sliding (window 4) and
        # full layers alternating, YaRN with truncate false (factor 4 over 32 positions, as the Hub's
        # config has it); a router with a bias, softmax over the top-4 of 16 experts' logits; experts
        # with biases, gate and up interleaved in gate_up_proj and the clamped SwiGLU (gate clamped
        # above, up both sides at swiglu_limit 1, so that clamping is active: (up + 1) * gate *
        # sigmoid(1.702 gate)); the load-balancing loss as mixtral_aux. The experts are stored as
        # the Hub's checkpoints ship them, MXFP4 (*_blocks, *_scales, quantization_config), and
        # loaded through transformers' own dequantization; LoRA on q, v, o and the experts.
        "gpt_oss": (GptOssConfig(**{**DIMS, "intermediate_size": 32, "num_hidden_layers": 3,
                                    "max_position_embeddings": 128},
                                 num_key_value_heads=2, head_dim=16, num_local_experts=16, num_experts_per_tok=4,
                                 sliding_window=4, layer_types=["sliding_attention", "full_attention",
                                                                "sliding_attention"],
                                 attention_bias=True, tie_word_embeddings=False, output_router_logits=True,
                                 router_aux_loss_coef=0.1, swiglu_limit=1.0, swiglu_alpha=1.702,
                                 rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                                                  "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                  "original_max_position_embeddings": 32}),
                    1064, "legacy"),
    }

# PEFT's target module names where a family fuses projections, and PEFT's all-linear in the
# mixture-of-experts families (their experts are stacked parameters, not Linear modules).
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
FUSED_TARGETS = {"phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], "mixtral_aux": ATTENTION,
                 "phi3_longrope": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], "mixtral": ATTENTION,
                 "qwen3_moe": ATTENTION, "qwen3_moe_norm": ATTENTION,
                 # the language model's projections, not the vision tower's q/k/v (PEFT: re.fullmatch)
                 "gemma3_mm": r".*language_model.*\.(" + "|".join(TARGETS) + ")"}
# PEFT's target_parameters (stacked expert weights, lora.ParamWrapper) beside target_modules.
TARGET_PARAMETERS = {"qwen3_moe_experts": ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]}
FUSED_TARGETS["qwen3_moe_experts"] = ["q_proj", "v_proj"]
TARGET_PARAMETERS["gpt_oss"] = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
FUSED_TARGETS["gpt_oss"] = ["q_proj", "v_proj", "o_proj"]
ROUTER_SCALE = 1.0  # router weights: logits spread enough that no top-k choice is a near tie
MIN_LOGIT_GAP = 2e-3  # the f32 logits of engine and transformers differ by ~1e-5
CLAMP_GAP = 1e-5  # gpt-oss: no gate or up this close to where it is clamped (the gradient jumps there)


class RoutingWatch:
    """Every routing decision of a MoE model's forwards: tokens per expert per call, and the
    smallest gap between the k-th and the (k+1)-th largest router logit (rounding must not be able
    to flip a choice: the engine has to choose the same experts)."""

    def __init__(self, model):
        self.counts, self.min_gap = [], float("inf")
        for name, mod in model.named_modules():
            if name.endswith(("mlp.gate", "mlp.router")):  # gpt-oss: mlp.router
                mod.register_forward_hook(self.hook)

    def hook(self, mod, inp, out):
        logits, _, idx = out
        p = logits.detach().float().sort(dim=-1, descending=True).values
        k = idx.shape[-1]
        self.min_gap = min(self.min_gap, float((p[:, k - 1] - p[:, k]).min()))
        self.counts.append(torch.bincount(idx.flatten(), minlength=logits.shape[-1]).tolist())


def init_weights(model, gen):
    """Random weights large enough that every term of the forward pass matters (never zeros).
    Norms multiply by 1 + 0.2 N(0, 1): Gemma's store that as w (its norms compute x (1 + w))."""
    offset = 0.0 if model.config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(offset + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("mlp.gate.weight", "mlp.router.weight")):  # a MoE router
                p.copy_(ROUTER_SCALE * torch.randn(p.shape, generator=gen))
            elif name.endswith((".bias", "_bias")):  # gpt-oss: experts.{gate_up,down}_proj_bias too
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("self_attn.sinks"):  # gpt-oss: a sink logit per head, large enough to matter
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=gen))


# gpt-oss's MXFP4 experts (OCP Microscaling FP4), as the Hub's checkpoints store them: the
# transposed (E, out, in) matrix in blocks of 32 along `in`, per block an E8M0 scale byte s
# (2^(s - 127)) and 16 bytes of 4-bit e2m1 codes, the even element in the low nibble; codes 0-7 are
# 0, 0.5, 1, 1.5, 2, 3, 4, 6 and bit 3 is the sign.
MXFP4_EXPERTS = ["gate_up_proj", "down_proj"]
MXFP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MXFP4_MIDPOINTS = (MXFP4_VALUES[:-1] + MXFP4_VALUES[1:]) / 2  # 0.25 .. 5: between codes i and i + 1
MXFP4_CONFIG = {"quant_method": "mxfp4",  # config.json's quantization_config, as the Hub's gpt-oss has it
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}


def mxfp4_quantize(w):
    """transformers' (E, in, out) expert weight -> (blocks (E, out, in/32, 16) U8, scales
    (E, out, in/32) U8, the (E, in, out) F32 values they encode), by the OCP MX rule: the block's
    exponent e = floor(log2(amax of its 32)) - 2, each x / 2^e rounded to the nearest e2m1 value,
    ties to the even code, saturating at 6 (an all-zero block gets e = -3: any e would do)."""
    wt = w.detach().transpose(1, 2).contiguous()
    x = wt.reshape(*wt.shape[:2], wt.shape[2] // 32, 32)
    _, ex = torch.frexp(x.abs().amax(-1))  # amax = m 2^ex with m in [0.5, 1): floor(log2(amax)) = ex - 1
    e = ex.to(torch.int32) - 3
    pow2 = ((e + 127) << 23).view(torch.float32)[..., None]  # 2^e from its bits: exact
    a = (x.abs() / pow2).contiguous()  # exact: a power of two
    lo = torch.searchsorted(MXFP4_MIDPOINTS, a, right=False)  # a on a midpoint: the code below it
    hi = torch.searchsorted(MXFP4_MIDPOINTS, a, right=True)   # ... and the one above it
    mag = torch.where((hi != lo) & (hi % 2 == 0), hi, lo)  # ties to even; a >= 5 gives 7 (6)
    sign = torch.signbit(x)
    code = (mag | (sign.to(torch.int64) << 3)).to(torch.uint8)
    values = torch.where(sign, -MXFP4_VALUES[mag], MXFP4_VALUES[mag]) * pow2
    return (code[..., 0::2] | (code[..., 1::2] << 4), (e + 127).to(torch.uint8),
            values.reshape(wt.shape).transpose(1, 2).contiguous())


def quantize_experts_mxfp4(model):
    """Round every expert weight to MXFP4 and set it to transformers' own dequantization of the
    bytes, so that the model computes with what the checkpoint stores; returns those bytes under
    the checkpoint's names (*_blocks, *_scales)."""
    packed = {}
    with torch.no_grad():
        for l, layer in enumerate(model.model.layers):
            for proj in MXFP4_EXPERTS:
                p = getattr(layer.mlp.experts, proj)
                blocks, scales, values = mxfp4_quantize(p)
                deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # (E, in, out)
                assert deq.shape == p.shape and torch.equal(deq, values)  # it reads the bytes as meant
                p.copy_(deq)
                key = "model.layers.%d.mlp.experts.%s" % (l, proj)
                packed[key + "_blocks"], packed[key + "_scales"] = blocks, scales
    return packed


def write_mxfp4_checkpoint(model_dir, packed):
    """model.safetensors with the experts' weights replaced by their *_blocks and *_scales (the
    biases stay F32), and config.json's quantization_config."""
    path = os.path.join(model_dir, "model.safetensors")
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    for key in packed:
        if key.endswith("_blocks"):
            del tensors[key[:-len("_blocks")]]
    save_file({**tensors, **packed}, path, metadata=metadata)
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = MXFP4_CONFIG
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def load_base(model_dir):
    """The fixture's model from its directory (F32, eager attention), for every load. An MXFP4
    checkpoint (gpt-oss) goes through transformers' own dequantization on the CPU:
    Mxfp4Config(dequantize=True) makes the experts plain parameters of the loaded dtype (F32) and
    drops the quantization_config from the loaded model's config."""
    with open(os.path.join(model_dir, "config.json")) as f:
        quant = (json.load(f).get("quantization_config") or {}).get("quant_method")
    kwargs = {"quantization_config": Mxfp4Config(dequantize=True)} if quant == "mxfp4" else {}
    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32,
                                                **kwargs)


class ClampWatch:
    """gpt-oss's clamped SwiGLU over the routed rows of every forward (each experts module's
    _apply_gate): per call the number of (gate, up) pairs and how many gates lie above
    swiglu_limit and ups above it and below -limit (the clamp must be active), and the smallest
    distance of a gate or up to an edge it is clamped at (rounding must not move one across it)."""

    def __init__(self, model):
        self.calls, self.min_gap = [], float("inf")
        for name, mod in model.named_modules():
            if name.endswith("mlp.experts"):
                mod._apply_gate = self.watch(mod.limit, mod._apply_gate)

    def watch(self, limit, apply_gate):
        def watched(gate_up):
            gate, up = gate_up.detach()[..., ::2], gate_up.detach()[..., 1::2]  # interleaved
            self.calls.append((gate.numel(), int((gate > limit).sum()), int((up > limit).sum()),
                               int((up < -limit).sum())))
            self.min_gap = min(self.min_gap, float((gate - limit).abs().min()),
                               float((up.abs() - limit).abs().min()))
            return apply_gate(gate_up)
        return watched


def rewrite_config(model_dir, style):
    """Put config.json into the requested style; the caller reloads it to prove nothing changed."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    if style in ("legacy", "hub_phi"):
        rope = dict(cfg.pop("rope_parameters"))
        cfg["rope_theta"] = rope.pop("rope_theta")
        if style == "hub_phi":  # Phi-3.5/Phi-4-mini: these two at the top level, the scaling's type as "type"
            for key in ("partial_rotary_factor", "original_max_position_embeddings"):
                if key in rope:
                    cfg[key] = rope.pop(key)
            rope["type"] = rope.pop("rope_type")
        cfg["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
        cfg["torch_dtype"] = cfg.pop("dtype")  # the spelling of transformers 4.x checkpoints
    cfg.pop("transformers_version", None)  # keeps regenerated files identical across versions
    gen_cfg = os.path.join(model_dir, "generation_config.json")  # not read by the engine
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def make_labels(input_ids, mask_positions):
    labels = input_ids.clone()
    for b, t in mask_positions:
        labels[b, t] = -100
    return labels


def token_loss_sum(logits, labels):
    """Sum of next-token CE over counted targets, and their count (HF shift: logits[t] vs labels[t+1])."""
    lg = logits[:, :-1, :].reshape(-1, logits.shape[-1])
    tg = labels[:, 1:].reshape(-1)
    return F.cross_entropy(lg, tg, ignore_index=-100, reduction="sum"), int((tg != -100).sum())


def n_counted(labels):
    return int((labels[:, 1:] != -100).sum())


def lora_params(model):
    """(adapter key as saved by PEFT, parameter) for every LoRA tensor, in a fixed order."""
    out = []
    for name, p in model.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            out.append((name.replace(".default.", "."), p))
    return out


def set_lora_random(model, gen):
    with torch.no_grad():
        for key, p in lora_params(model):
            if ".lora_A." in key:
                p.copy_(torch.empty(p.shape).uniform_(-0.3, 0.3, generator=gen))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))


def train_batches(vocab, gen):
    """(N_STEP, N_MICRO, B, T) tokens and labels; prompt-style -100 prefixes of varying length."""
    ids = torch.randint(0, vocab, (N_STEP, N_MICRO, B, T), generator=gen)
    labels = ids.clone()
    for s in range(N_STEP):
        for m in range(N_MICRO):
            for b in range(B):
                n_mask = int(torch.randint(0, 6, (1,), generator=gen))  # 0..5 masked prefix positions
                labels[s, m, b, :n_mask] = -100
            # one masked position inside the sequence so masking is not only a prefix
            t = int(torch.randint(6, T, (1,), generator=gen))
            labels[s, m, (s + m) % B, t] = -100
    return ids, labels


def aux_coef(model):
    """router_aux_loss_coef when the model adds the load-balancing loss, else 0."""
    cfg = model.config
    return cfg.router_aux_loss_coef if getattr(cfg, "output_router_logits", False) else 0.0


def run_training(model, ids, labels):
    """The 3-step accumulate/clip/AdamW/cosine run; returns per-step records. With the router's
    load-balancing loss each micro-batch adds coef * aux / N_MICRO (the mean over micro-batches)."""
    params = [p for _, p in lora_params(model)]
    keys = [k for k, _ in lora_params(model)]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=N_STEP)
    rec = {"loss": [], "norm": [], "lr": [], "grads": [], "n_tok": []}
    for s in range(N_STEP):
        counts = [n_counted(labels[s, m]) for m in range(N_MICRO)]
        assert min(counts) > 0 and counts[0] != counts[1], counts
        n_tok = sum(counts)
        step_loss = 0.0
        for m in range(N_MICRO):
            res = model(input_ids=ids[s, m])
            lsum, _ = token_loss_sum(res.logits, labels[s, m])
            loss = lsum / n_tok
            if aux_coef(model):
                loss = loss + aux_coef(model) * res.aux_loss / N_MICRO
            loss.backward()
            step_loss += float(loss.detach())
        rec["grads"].append({k: p.grad.detach().clone() for k, p in zip(keys, params)})
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm=MAX_NORM)
        rec["lr"].append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        rec["loss"].append(step_loss)
        rec["norm"].append(float(norm))
        rec["n_tok"].append(n_tok)
    return rec


def check_accumulation(model, ids, labels, grads0):
    """Accumulated micro-batch grads of step 0 must equal the grads of the mean loss of the big batch."""
    params = lora_params(model)
    big_ids = ids[0].reshape(N_MICRO * B, T)
    big_labels = labels[0].reshape(N_MICRO * B, T)
    if aux_coef(model):  # the token mean over the big batch, the aux losses of the micro-batches
        lsum, n = token_loss_sum(model(input_ids=big_ids).logits, big_labels)
        aux = sum(model(input_ids=ids[0, m]).aux_loss for m in range(N_MICRO)) / N_MICRO
        loss = lsum / n + aux_coef(model) * aux
    else:
        loss = model(input_ids=big_ids, labels=big_labels).loss
    g = torch.autograd.grad(loss, [p for _, p in params])
    for (k, _), gi in zip(params, g):
        torch.testing.assert_close(gi, grads0[k], rtol=1e-4, atol=1e-6)


def check_replay(adapter, out):
    """Replay the run from the stored pre-clip grads with the formulas of the README, by hand."""
    keys = sorted(adapter)
    p = {k: adapter[k].clone() for k in keys}
    m = {k: torch.zeros_like(p[k]) for k in keys}
    v = {k: torch.zeros_like(p[k]) for k in keys}
    for s in range(N_STEP):
        g = {k: out["train_grad.%d.%s" % (s, k)] for k in keys}
        norm = math.sqrt(sum(float((g[k].double() ** 2).sum()) for k in keys))
        assert abs(norm - float(out["train_grad_norm"][s])) <= 1e-5 * norm
        coef = min(1.0, MAX_NORM / (norm + 1e-6))
        lr = float(out["train_lr"][s])
        for k in keys:
            gk = g[k] * coef
            p[k] = p[k] * (1 - lr * WD)
            m[k] = BETAS[0] * m[k] + (1 - BETAS[0]) * gk
            v[k] = BETAS[1] * v[k] + (1 - BETAS[1]) * gk * gk
            mh = m[k] / (1 - BETAS[0] ** (s + 1))
            vh = v[k] / (1 - BETAS[1] ** (s + 1))
            p[k] = p[k] - lr * mh / (vh.sqrt() + EPS)
    for k in keys:
        torch.testing.assert_close(p[k], out["final." + k], rtol=0, atol=1e-6)
    assert abs(float(out["train_lr"][1]) - LR) < 1e-9 and float(out["train_lr"][0]) == 0.0


# Variants exported to GGUF and run by llama.cpp (tools/make_gguf_export_fixtures.py), which needs
# a vocabulary in the file.
EXPORTED_TO_LLAMA_CPP = ["phi3_longrope", "mixtral", "qwen3_moe_norm", "qwen3_moe_experts"]


def write_byte_level_vocab(model_dir, vocab_size):
    """A GPT-2 style byte-level BPE tokenizer.json of vocab_size tokens and no merges: the bytes
    '!'..'z', Phi-3's four special tokens (llama.cpp sets attributes on them by name for a model
    named phi3), then 'Ġ' (space) and 'Ċ' (newline), as GPT-2 maps them. Only a vocabulary for
    `qlora export` to write; the fixtures feed token ids."""
    specials = ["<unk>", "<s>", "</s>", "<|endoftext|>"]
    symbols = [chr(b) for b in range(33, 123)] + specials + ["\u0120", "\u010a"]
    assert vocab_size == len(symbols), vocab_size
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    added = [{"id": symbols.index(s), "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for s in specials]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                     "vocab": {s: i for i, s in enumerate(symbols)}, "merges": []}}
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, indent=1, sort_keys=True)
        f.write("\n")


def make_variant(name, config, seed, style):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model_dir = os.path.join(MODELS, name)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                             dtype=torch.float32)
    init_weights(model, gen)
    mxfp4 = config.model_type == "gpt_oss"  # its experts stored as MXFP4, as gpt-oss ships them
    if mxfp4:
        packed = quantize_experts_mxfp4(model)
    model.eval()
    shutil.rmtree(model_dir, ignore_errors=True)
    model.save_pretrained(model_dir, safe_serialization=True)
    rewrite_config(model_dir, style)
    if mxfp4:
        write_mxfp4_checkpoint(model_dir, packed)
    if name in EXPORTED_TO_LLAMA_CPP:
        write_byte_level_vocab(model_dir, config.vocab_size)

    # Everything below runs on the model reloaded from disk, so the fixtures describe the files.
    vocab = getattr(config, "text_config", config).vocab_size
    ids = torch.randint(0, vocab, (B, T), generator=gen)
    labels = make_labels(ids, [(0, 0), (0, 1), (0, 2), (0, 3), (1, 7)])
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    built, model = model, load_base(model_dir)
    model.eval()
    moe = getattr(config, "num_experts_per_tok", None) is not None
    watch = RoutingWatch(model) if moe else None
    clamp = ClampWatch(model) if hasattr(config, "swiglu_limit") else None
    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32)}
    if mxfp4:  # transformers' dequantization of the stored bytes, bit for bit what the model computed with
        for l, layer in enumerate(model.model.layers):
            for proj in MXFP4_EXPERTS:
                w, stored = getattr(layer.mlp.experts, proj), getattr(built.model.layers[l].mlp.experts, proj)
                assert w.dtype == torch.float32 and torch.equal(w, stored)
                # Every MXFP4 value (an e2m1 code times a power of two) is a bf16 value: stored so,
                # exactly, in half the bytes.
                w16 = w.detach().to(torch.bfloat16)
                assert torch.equal(w16.float(), w)
                out["mxfp4.layers.%d.%s" % (l, proj)] = w16.clone()
    with torch.no_grad():
        res = model(input_ids=ids, labels=labels)
    if moe:  # uneven loads with an idle expert, and no choice that rounding could flip
        assert any(0 in c for c in watch.counts) and all(max(c) > min(c) for c in watch.counts), watch.counts
        assert watch.min_gap > MIN_LOGIT_GAP, watch.min_gap
    if clamp:  # every layer clamps some gates above the limit and some ups above it and below -limit
        clamped = clamp.calls[:config.num_hidden_layers]
        assert all(min(c[1:]) > 0 for c in clamped), clamped
    torch.testing.assert_close(res.logits, ref, rtol=0, atol=0)  # config rewrite changed nothing
    lsum, n = token_loss_sum(res.logits, labels)
    coef = aux_coef(model)
    if coef:  # transformers' loss adds coef * aux; the fixture's "loss" is the token mean alone
        torch.testing.assert_close(res.loss, lsum / n + coef * res.aux_loss)
        out["aux_loss"] = res.aux_loss.detach().reshape(1)
        assert float(coef * res.aux_loss) > 1e-2 * float(lsum / n)  # large enough to matter
    else:
        torch.testing.assert_close(res.loss, lsum / n)
    out["logits"] = res.logits.contiguous()
    out["loss"] = ((lsum / n) if coef else res.loss).detach().reshape(1)
    rope = model.config.rope_parameters
    if rope.get("rope_type") == "longrope":  # positions within the original context: the short factors
        short = rope["original_max_position_embeddings"]
        assert short < T
        with torch.no_grad():
            out["short_logits"] = model(input_ids=ids[:, :short]).logits.contiguous()
        assert float((out["short_logits"] - res.logits[:, :short]).abs().max()) > 1e-3  # the factors matter
    if rope.get("rope_type") == "yarn":
        emb = model.model.rotary_emb
        out["rope_inv_freq"] = emb.inv_freq.detach().clone()
        out["rope_attention_scaling"] = torch.tensor([emb.attention_scaling], dtype=torch.float32)
        inv = {}  # transformers' frequencies with and without the ramp's ends floored and ceiled
        for truncate in (True, False):
            other = copy.deepcopy(model.config)
            other.rope_parameters = dict(rope, truncate=truncate)
            inv[truncate], _ = ROPE_INIT_FUNCTIONS["yarn"](other, "cpu")
        assert not torch.equal(inv[True], inv[False])  # truncate matters with these numbers
        assert torch.equal(inv[rope.get("truncate", True)], out["rope_inv_freq"])  # gpt-oss: false
        out["rope_inv_freq_untruncated"] = inv[False].detach().clone()

    if name == "llama_gqa":  # same weights as llama_gqa, in >= 3 shards with an index
        shard_dir = os.path.join(MODELS, "llama_gqa_sharded")
        shutil.rmtree(shard_dir, ignore_errors=True)
        model.save_pretrained(shard_dir, safe_serialization=True, max_shard_size="100KB")
        shutil.copy(os.path.join(model_dir, "config.json"), os.path.join(shard_dir, "config.json"))
        os.remove(os.path.join(shard_dir, "generation_config.json"))
        shards = [f for f in os.listdir(shard_dir) if f.endswith(".safetensors")]
        assert len(shards) >= 3 and os.path.exists(
            os.path.join(shard_dir, "model.safetensors.index.json")), shards
        sharded = load_base(shard_dir)
        with torch.no_grad():
            torch.testing.assert_close(sharded(input_ids=ids).logits, res.logits, rtol=0, atol=0)

    lcfg = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules=FUSED_TARGETS.get(name, TARGETS), lora_dropout=0.0,
                      bias="none", task_type="CAUSAL_LM", target_parameters=TARGET_PARAMETERS.get(name))
    pm = get_peft_model(model, lcfg)
    set_lora_random(pm, gen)
    pm.eval()
    adapter_dir = os.path.join(PARITY, name + "_adapter")
    shutil.rmtree(adapter_dir, ignore_errors=True)
    pm.save_pretrained(adapter_dir, safe_serialization=True)
    fix_adapter_config(adapter_dir, name)
    saved = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    params = lora_params(pm)
    assert sorted(saved) == sorted(k for k, _ in params), (sorted(saved)[:3], params[0][0])
    for k, p in params:
        assert torch.equal(saved[k], p.detach())

    res = pm(input_ids=ids, labels=labels)
    res.loss.backward()
    out["lora_logits"] = res.logits.detach().contiguous()
    out["lora_loss"] = res.loss.detach().reshape(1)  # with the aux loss where the model adds it
    if coef:
        out["lora_aux_loss"] = res.aux_loss.detach().reshape(1)
    for k, p in params:
        assert p.grad is not None and float(p.grad.abs().max()) > 0, k
        out["grad." + k] = p.grad.detach().clone()
    pm.zero_grad(set_to_none=True)

    t_ids, t_labels = train_batches(vocab, gen)
    rec = run_training(pm, t_ids, t_labels)
    assert any(n > MAX_NORM for n in rec["norm"]), rec["norm"]  # clipping must trigger
    out["train_input_ids"] = t_ids.to(torch.int32)
    out["train_labels"] = t_labels.to(torch.int32)
    out["train_loss"] = torch.tensor(rec["loss"], dtype=torch.float32)
    out["train_grad_norm"] = torch.tensor(rec["norm"], dtype=torch.float32)
    out["train_lr"] = torch.tensor(rec["lr"], dtype=torch.float32)
    out["train_n_tokens"] = torch.tensor(rec["n_tok"], dtype=torch.int32)
    for s, grads in enumerate(rec["grads"]):
        for k, g in grads.items():
            out["train_grad.%d.%s" % (s, k)] = g
    for k, p in lora_params(pm):
        out["final." + k] = p.detach().clone()

    # Cross-check with an independent route: reload the saved adapter, step 0 as one big batch.
    fresh = PeftModel.from_pretrained(load_base(model_dir), adapter_dir, is_trainable=True)
    fresh.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=ids).logits, out["lora_logits"], rtol=0, atol=0)
    check_accumulation(fresh, t_ids, t_labels, rec["grads"][0])

    check_replay(saved, out)
    if moe:  # the training run's routing too (its gradients are compared)
        assert watch.min_gap > MIN_LOGIT_GAP, watch.min_gap
        print("%s: tokens per expert of the first forward %s" % (name, watch.counts[:len(model.model.layers)]))
    if clamp:  # the training run's too (its gradients are compared)
        assert clamp.min_gap > CLAMP_GAP, clamp.min_gap
        print("%s: of the first forward's routed gate, up pairs per layer, gate > limit, up > limit, up < -limit %s;"
              " min distance to a clamp edge %.2e" % (name, clamped, clamp.min_gap))
    # The per-step gradients served check_replay above; no C++ test reads them, and the files
    # travel with every device call (64 MiB in all), so they are not kept.
    out = {k: v.contiguous() for k, v in out.items() if not k.startswith("train_grad.")}
    save_file(out, os.path.join(PARITY, name + ".safetensors"),
              metadata={"generator": generator_note()})
    print("%-11s loss %.5f lora_loss %.5f train_loss %s grad_norm %s lr %s" % (
        name, float(out["loss"]), float(out["lora_loss"]),
        ["%.5f" % x for x in rec["loss"]], ["%.4f" % x for x in rec["norm"]],
        ["%.2e" % x for x in rec["lr"]]))


def generator_note():
    # One metadata key only: safetensors orders several keys at random, which would make
    # regenerated files differ byte-wise although every tensor is identical.
    return "tools/make_parity_fixtures.py; torch %s, transformers %s, peft %s" % (
        torch.__version__.split("+")[0], transformers.__version__, peft.__version__)


def fix_adapter_config(adapter_dir, name):
    """Replace the absolute base-model path PEFT records with one relative to the repo root."""
    path = os.path.join(adapter_dir, "adapter_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = "tests/fixtures/models/" + name
    if isinstance(cfg["target_modules"], list):
        cfg["target_modules"] = sorted(cfg["target_modules"])  # PEFT stores a set: fix the order
    if cfg.get("target_parameters"):  # also a set (in hash order): the order the LoraConfig gave
        assert sorted(cfg["target_parameters"]) == sorted(TARGET_PARAMETERS[name]), cfg["target_parameters"]
        cfg["target_parameters"] = TARGET_PARAMETERS[name]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    readme = os.path.join(adapter_dir, "README.md")  # PEFT's model-card boilerplate
    if os.path.exists(readme):
        os.remove(readme)


def check_engine_adapter(adapter_dir, variant, out_path):
    """Logits of base model + an adapter (e.g. one the engine wrote) for the fixture's input_ids."""
    fixture = load_file(os.path.join(PARITY, variant + ".safetensors"))
    ids = fixture["input_ids"].to(torch.int64)
    model = PeftModel.from_pretrained(load_base(os.path.join(MODELS, variant)), adapter_dir)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    save_file({"peft_logits": logits.contiguous()}, out_path)
    print("wrote %s: peft_logits %s; max |peft_logits - fixture lora_logits| = %.3g" % (
        out_path, tuple(logits.shape), float((logits - fixture["lora_logits"]).abs().max())))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--variant", help="one variant (default: all)")
    ap.add_argument("--check-engine-adapter", metavar="ADAPTER_DIR",
                    help="write logits of models/VARIANT + ADAPTER_DIR for the fixture input_ids")
    ap.add_argument("--out", help="output .safetensors for --check-engine-adapter")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    configs = variant_configs()
    if args.variant and args.variant not in configs:
        sys.exit("unknown variant %r; expected one of %s" % (args.variant, ", ".join(configs)))
    if args.check_engine_adapter:
        if not args.variant or not args.out:
            sys.exit("--check-engine-adapter needs --variant and --out")
        check_engine_adapter(args.check_engine_adapter, args.variant, args.out)
        return
    os.makedirs(PARITY, exist_ok=True)
    for name, (config, seed, style) in configs.items():
        if args.variant in (None, name):
            make_variant(name, config, seed, style)


if __name__ == "__main__":
    main()
