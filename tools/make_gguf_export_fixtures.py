#!/usr/bin/env python3
"""llama.cpp's verdict on `qlora export`: tests/fixtures/export/llama_cpp_logits.json.

Runs our `qlora export` on
  (i)  the real SmolLM2-135M-Instruct Q4_1 GGUF the demo uses (.cache/qlora/, tests/fetch_real_models.sh)
       with a deterministic rank-1 adapter (tests/fixtures/export/smollm2_adapter/, written here:
       q/k/v/down_proj, f16 safetensors) -> merged GGUF at f32 and q8_0, and a gguf-lora adapter;
  (ii) the tiny fixture tests/fixtures/gguf/tiny_llama.gguf (GQA, llama3 rope_freqs) with
       tests/fixtures/parity/llama_gqa_adapter -> merged f32 and q8_0, and a gguf-lora adapter;
  (iii) the same for tests/fixtures/gguf/tiny_qwen3.gguf (arch qwen3: per-head q/k norms) with
       tests/fixtures/parity/qwen3_adapter;
  (iv) the Hugging Face directory tests/fixtures/models/phi3_longrope (arch phi3, LongRoPE, partial
       rotary) with tests/fixtures/parity/phi3_longrope_adapter -> merged f32;
  (vi) Gemma 2 and Gemma 3 text models, and a Llama-layout model with Llama 2's SentencePiece layout, written here (tests/fixtures/export/gemma2, gemma3: random f16
       weights with norm gains away from 0, a SentencePiece-style tokenizer.json with byte fallback,
       query_pre_attn_scalar = head_dim and the layer patterns llama.cpp's gemma2/gemma3 fix, Gemma
       2's caps, Gemma 3's local/global RoPE bases and linear scaling) with rank-2 adapters on all
       seven projections -> merged f32 (arch gemma2/gemma3, the norms stored as 1 + w, the vocabulary
       as llama.cpp's SPM "llama" vocabulary with scores); llama.cpp tokenizes a text with spaces,
       capitals and accented letters (byte fallback) and runs the logits;
  (vii) gpt-oss (tests/fixtures/export/gpt_oss, written here from the parity fixture with llama.cpp's
       SwiGLU limit) with its adapter on attention and experts -> merged f32 and q8_0, and Qwen3 with
       YaRN (tests/fixtures/models/qwen3_yarn, given a tokenizer.json here) -> merged f32;
  (v)  the mixtures of experts tests/fixtures/models/mixtral (arch llama with experts) -> merged f32
       and q8_0, and tests/fixtures/models/qwen3_moe_norm (arch qwen3moe) -> merged f32, each with
       its parity adapter; and tests/fixtures/models/qwen3_moe_experts with its adapter on the
       experts (target_parameters) -> merged f32;
loads each in llama.cpp through llama-cpp-python (its PyPI sdist builds the vendored llama.cpp from
source) and records, for a fixed token sequence, the top-8 logits and logsumexp at every position,
plus the sha256 of each exported file. For every q8_0 export it also quantizes our f32 export of the
same weights with llama.cpp's own quantizer (llama_model_quantize, LLAMA_FTYPE_MOSTLY_Q8_0) and
requires every tensor's bytes to equal ours. llama.cpp runs with its CPU weight-repacking buffers off
(use_extra_bufts = false): with them, the llama-cpp-python 0.3.36 build on the AVX-512 machine the
fixture was made on crashes in decode on any quantized model, the original SmolLM2 Q4_1 file
included; the repacked kernels compute the same products in another layout.
The C++ test (tests/model/test_gguf_export.cpp) re-exports,
requires the same sha256 (so llama.cpp's verdict applies to the bytes it writes) and compares our
engine's logits on the exported files with llama.cpp's.

Run:  /opt/llamaenv/bin/python tools/make_gguf_export_fixtures.py   (llama-cpp-python, numpy, gguf)
      after building ./build/qlora.
"""
import hashlib
import json
import shutil
import os
import struct
import subprocess
import sys
import tempfile

import ctypes

import gguf
import llama_cpp
import numpy as np
from llama_cpp import Llama, __version__ as llama_cpp_version

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gguf_fixtures import load_safetensors  # noqa: E402

_default_model_params = llama_cpp.llama_model_default_params


def _model_params_without_repacking():  # see the docstring
    p = _default_model_params()
    p.use_extra_bufts = False
    return p


llama_cpp.llama_model_default_params = _model_params_without_repacking
llama_cpp.llama.llama_cpp.llama_model_default_params = _model_params_without_repacking

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FX, "export")
QLORA = os.path.join(ROOT, "build", "qlora")
SMOL = os.environ.get("QLORA_SMOLLM2_GGUF", os.path.join(ROOT, ".cache", "qlora", "SmolLM2-135M-Instruct.Q4_1.gguf"))
TOPK = 8


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name].astype(np.float16))
        b = a.tobytes()
        header[name] = {"dtype": "F16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def smollm2_adapter(path):
    """Rank 1, alpha 2 (scale 2) on q/k/v/down_proj of SmolLM2-135M (hidden 576, 9 heads, 3 kv heads of 64, ffn 1536)."""
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(20240601)
    shapes = {"q_proj": (576, 576), "k_proj": (192, 576), "v_proj": (192, 576), "down_proj": (576, 1536)}
    t = {}
    for layer in range(30):
        for proj, (out, inp) in shapes.items():
            sub = "mlp" if proj == "down_proj" else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{sub}.{proj}"
            t[key + ".lora_A.weight"] = rng.standard_normal((1, inp)) / np.sqrt(inp)
            t[key + ".lora_B.weight"] = rng.standard_normal((out, 1)) * 0.02
    write_safetensors(os.path.join(path, "adapter_model.safetensors"), t)
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 1, "lora_alpha": 2, "lora_dropout": 0.0,
           "target_modules": sorted(shapes), "bias": "none", "use_rslora": False, "use_dora": False,
           "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "fan_in_fan_out": False,
           "modules_to_save": None}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


SPM_SPACE = "\u2581"


def spm_tokenizer(path, prepend=False, metaspace=False):
    """A SentencePiece-style vocabulary carried as BPE, as transformers converts Gemma's: <pad> <eos>
    <bos> <unk>, the 256 byte pieces <0xNN>, single characters, then pieces learned by BPE over a
    corpus split at spaces (each word with its leading U+2581), most frequent pair first (ties: the
    first in sorted order). Merges list every split of each learned piece into two pieces, in the
    piece's order, as transformers' SentencePiece extractor writes them; a Replace normalizer turns
    spaces into U+2581 and nothing pre-tokenizes (Gemma's layout); prepend: a Prepend of U+2581 first
    (Llama 2's and Mistral's legacy layout, llama.cpp's add_space_prefix); metaspace: no normalizer and
    a Metaspace pre-tokenizer (prepend_scheme first, split false), the layout tokenizers writes for
    Llama 2 and Mistral without legacy."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPM_SPACE}
    chars = [SPM_SPACE] + list("abcdefghijklmnopqrstuvwxyz") + list(".,!?'")
    corpus = ("the quick brown fox jumps over the lazy dog . the dog sleeps in the sun while the fox runs "
              "into the woods , and the birds sing over the river ! where is the dog ? it is there")
    seqs = [[SPM_SPACE] + list(w) for w in corpus.split()]
    learned = []
    for _ in range(40):
        counts = {}
        for s in seqs:
            for a, b in zip(s, s[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        piece = best[0] + best[1]
        learned.append(piece)
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if (s[i], s[i + 1]) == best:
                    s[i:i + 2] = [piece]
                i += 1
    pieces = specials + [f"<0x{b:02X}>" for b in range(256)] + chars + learned
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for p in learned:
        for k in range(1, len(p)):
            if p[:k] in vocab and p[k:] in vocab:
                merges.append([p[:k], p[k:]])
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True} for i, t in enumerate(specials)],
          "normalizer": (None if metaspace else
                         {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPM_SPACE}, replace]}
                         if prepend else replace),
          "pre_tokenizer": ({"type": "Metaspace", "replacement": SPM_SPACE, "prepend_scheme": "first", "split": False}
                            if metaspace else None),
          "post_processor": {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
          "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": SPM_SPACE}, "content": " "},
                                                       {"type": "ByteFallback"}, {"type": "Fuse"}]},
          "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                    "vocab": vocab, "merges": merges}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return len(pieces)


def spm_fixture(kind):
    """tests/fixtures/export/<kind> (gemma2 | gemma3 | llama_spm | llama_metaspace): config.json, model.safetensors (f16),
    tokenizer.json; and <kind>_adapter: rank 2, alpha 4 on q/k/v/o/gate/up/down. Returns (model dir,
    adapter dir). llama_spm: a Llama-layout model (untied head) with Llama 2's SentencePiece layout;
    llama_metaspace: one such layer with the Metaspace layout."""
    d = os.path.join(OUT, kind)
    os.makedirs(d, exist_ok=True)
    gemma = kind not in ("llama_spm", "llama_metaspace")
    vocab = spm_tokenizer(os.path.join(d, "tokenizer.json"), prepend=not gemma, metaspace=kind == "llama_metaspace")
    H, L, nh, nkv, hd, F = 32, {"gemma2": 4, "gemma3": 6, "llama_spm": 2, "llama_metaspace": 1}[kind], 2, 1, 16, 64
    cfg = {"hidden_size": H, "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": nh,
           "num_key_value_heads": nkv, "head_dim": hd, "query_pre_attn_scalar": hd, "vocab_size": vocab,
           "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
           "sliding_window": 4, "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "float16"}
    if not gemma:
        for k in ("head_dim", "query_pre_attn_scalar", "hidden_activation", "sliding_window"):
            del cfg[k]
        cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 10000.0,
                    "hidden_act": "silu", "tie_word_embeddings": False})
    elif kind == "gemma2":  # every other layer sliding, from the first; both caps on
        cfg.update({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "rope_theta": 10000.0,
                    "attn_logit_softcapping": 5.0, "final_logit_softcapping": 8.0,
                    "layer_types": ["sliding_attention" if l % 2 == 0 else "full_attention" for l in range(L)]})
    else:  # five of every six layers sliding at base 10000; the global layer at 1e6, scaled linearly by 2
        cfg.update({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "rope_theta": 1000000.0,
                    "rope_local_base_freq": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                    "attn_logit_softcapping": None, "final_logit_softcapping": None, "sliding_window_pattern": 6,
                    "layer_types": ["sliding_attention" if l % 6 != 5 else "full_attention" for l in range(L)]})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    rng = np.random.default_rng({"gemma2": 2027, "gemma3": 2028, "llama_spm": 2029, "llama_metaspace": 2030}[kind])
    gain = 0.0 if gemma else 1.0  # Gemma's norms scale by 1 + w, Llama's by w
    t = {"model.embed_tokens.weight": rng.standard_normal((vocab, H)) * 0.3,
         "model.norm.weight": gain + rng.standard_normal(H) * 0.2}
    if not gemma:
        t["lm_head.weight"] = rng.standard_normal((vocab, H)) / np.sqrt(H)
    shapes = {"self_attn.q_proj": (nh * hd, H), "self_attn.k_proj": (nkv * hd, H), "self_attn.v_proj": (nkv * hd, H),
              "self_attn.o_proj": (H, nh * hd), "mlp.gate_proj": (F, H), "mlp.up_proj": (F, H), "mlp.down_proj": (H, F)}
    norms = ["input_layernorm", "post_attention_layernorm"] + (["pre_feedforward_layernorm", "post_feedforward_layernorm"]
                                                                if gemma else [])
    for l in range(L):
        p = f"model.layers.{l}."
        for n, (o, i) in shapes.items():
            t[p + n + ".weight"] = rng.standard_normal((o, i)) / np.sqrt(i)
        for n in norms:
            t[p + n + ".weight"] = gain + rng.standard_normal(H) * 0.2
        if kind == "gemma3":
            t[p + "self_attn.q_norm.weight"] = rng.standard_normal(hd) * 0.2
            t[p + "self_attn.k_norm.weight"] = rng.standard_normal(hd) * 0.2
    write_safetensors(os.path.join(d, "model.safetensors"), t)
    ad = os.path.join(OUT, kind + "_adapter")
    os.makedirs(ad, exist_ok=True)
    a = {}
    for l in range(L):
        for n, (o, i) in shapes.items():
            key = f"base_model.model.model.layers.{l}.{n}"
            a[key + ".lora_A.weight"] = rng.standard_normal((2, i)) / np.sqrt(i)
            a[key + ".lora_B.weight"] = rng.standard_normal((o, 2)) * 0.05
    write_safetensors(os.path.join(ad, "adapter_model.safetensors"), a)
    acfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 4, "lora_dropout": 0.0,
            "target_modules": sorted(n.split(".")[1] for n in shapes), "bias": "none", "use_rslora": False,
            "use_dora": False, "base_model_name_or_path": None, "fan_in_fan_out": False, "modules_to_save": None}
    with open(os.path.join(ad, "adapter_config.json"), "w") as f:
        json.dump(acfg, f, indent=2)
        f.write("\n")
    return d, ad


def gemma3_multimodal_fixture(text_dir, text_ad):
    """tests/fixtures/export/gemma3_mm: the gemma3 text fixture inside a Gemma3ForConditionalGeneration
    checkpoint as the Hub ships Gemma 3 4B-27B: config.json with text_config and vision_config, the
    text weights under language_model.model., a (random, 1-layer) SigLIP tower and projector beside
    them that the export must leave out; gemma3_mm_adapter: the gemma3 adapter under PEFT's
    multimodal keys (model.language_model.layers) with its target regex."""
    d = os.path.join(OUT, "gemma3_mm")
    os.makedirs(d, exist_ok=True)
    shutil.copyfile(os.path.join(text_dir, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    text_cfg = json.load(open(os.path.join(text_dir, "config.json")))
    for k in ("architectures", "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"):
        text_cfg.pop(k, None)
    V = 16  # vision width
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "tie_word_embeddings": True,
           "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "mm_tokens_per_image": 4,
           "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144, "torch_dtype": "float16",
           "text_config": text_cfg,
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": V, "intermediate_size": 32,
                             "num_hidden_layers": 1, "num_attention_heads": 2, "num_channels": 3, "image_size": 16,
                             "patch_size": 8, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh",
                             "vision_use_head": False}}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    src = load_safetensors(os.path.join(text_dir, "model.safetensors"))
    t = {"language_model." + k: v for k, v in src.items()}
    rng = np.random.default_rng(2030)
    vt = "vision_tower.vision_model."
    t[vt + "embeddings.patch_embedding.weight"] = rng.standard_normal((V, 3, 8, 8)) * 0.1
    t[vt + "embeddings.position_embedding.weight"] = rng.standard_normal((4, V)) * 0.1
    for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
        t[vt + f"encoder.layers.0.self_attn.{n}.weight"] = rng.standard_normal((V, V)) * 0.1
    t["multi_modal_projector.mm_input_projection_weight"] = rng.standard_normal((V, 32)) * 0.1
    write_safetensors(os.path.join(d, "model.safetensors"), t)
    ad = os.path.join(OUT, "gemma3_mm_adapter")
    os.makedirs(ad, exist_ok=True)
    a = load_safetensors(os.path.join(text_ad, "adapter_model.safetensors"))
    write_safetensors(os.path.join(ad, "adapter_model.safetensors"),
                      {k.replace("base_model.model.model.layers.", "base_model.model.model.language_model.layers."): v
                       for k, v in a.items()})
    acfg = json.load(open(os.path.join(text_ad, "adapter_config.json")))
    acfg["target_modules"] = ".*language_model.*\\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    with open(os.path.join(ad, "adapter_config.json"), "w") as f:
        json.dump(acfg, f, indent=2)
        f.write("\n")
    return d, ad


def hf_fixture_with(kind, base, changes):
    """tests/fixtures/export/<kind>: the parity fixture `base`'s weights, its config.json with `changes`,
    and the Mixtral fixture's byte-level tokenizer.json (the same 96 ids), which a GGUF needs."""
    d = os.path.join(OUT, kind)
    os.makedirs(d, exist_ok=True)
    src = os.path.join(FX, "models", base)
    shutil.copyfile(os.path.join(src, "model.safetensors"), os.path.join(d, "model.safetensors"))
    shutil.copyfile(os.path.join(FX, "models", "mixtral", "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.update(changes)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return d


def attention_only_adapter(src, dst):
    """dst: the adapter src without its LoRA on the experts (target_parameters dropped)."""
    os.makedirs(dst, exist_ok=True)
    t = load_safetensors(os.path.join(src, "adapter_model.safetensors"))
    write_safetensors(os.path.join(dst, "adapter_model.safetensors"), {k: v for k, v in t.items() if ".mlp.experts." not in k})
    cfg = json.load(open(os.path.join(src, "adapter_config.json")))
    cfg["target_parameters"] = None
    with open(os.path.join(dst, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    return dst


def f32_copy(model, tmp):
    """llama.cpp's own F32 copy of a GGUF (llama_model_quantize to ALL_F32, requantizing allowed): every
    tensor dequantized by ggml."""
    out = os.path.join(tmp, os.path.basename(model) + ".all_f32.gguf")
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = 0  # LLAMA_FTYPE_ALL_F32
    p.allow_requantize = True
    p.nthread = 2
    if llama_cpp.llama_model_quantize(model.encode(), out.encode(), ctypes.byref(p)) != 0:
        sys.exit("llama_model_quantize to F32 failed")
    types = {t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    if types != {"F32"}:
        sys.exit(f"the F32 copy holds {sorted(types)}")
    return out


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export(args, out):
    subprocess.run([QLORA, "export", *args, "--out", out], check=True, stdout=subprocess.DEVNULL)
    return sha256(out)


def rows(scores):
    res = []
    for r in scores:
        r = r.astype(np.float64)
        top = np.argsort(-r, kind="stable")[:TOPK]
        m = r.max()
        res.append({"top_ids": [int(i) for i in top], "top_logits": [float(r[i]) for i in top],
                    "logsumexp": float(m + np.log(np.exp(r - m).sum()))})
    return res


def llama_logits(model, ids, lora=None):
    # An f32 KV cache (ggml type 0), so the comparison measures the weights, not llama.cpp's default
    # f16 cache rounding.
    kw = dict(model_path=model, logits_all=True, n_ctx=128, n_batch=128, n_threads=2, verbose=False, seed=0,
              type_k=0, type_v=0)
    if lora:
        kw["lora_path"] = lora
    llm = Llama(**kw)
    llm.eval(ids)
    scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
    return llm, scores


def q8_0_equals_llama_cpp(our_q8, base, ad, tmp):
    """Our q8_0 export's tensors, byte for byte, against llama.cpp quantizing our f32 export."""
    f32 = os.path.join(tmp, "for_quantize.f32.gguf")
    ref = os.path.join(tmp, "llama_cpp.q8_0.gguf")
    export(["--format", "gguf", "--model", base, "--adapter", ad, "--outtype", "f32"], f32)
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    p.nthread = 2
    if llama_cpp.llama_model_quantize(f32.encode(), ref.encode(), ctypes.byref(p)) != 0:
        sys.exit("llama_model_quantize failed")
    ours = {t.name: t for t in gguf.GGUFReader(our_q8).tensors}
    theirs = {t.name: t for t in gguf.GGUFReader(ref).tensors}
    if sorted(ours) != sorted(theirs):
        sys.exit(f"tensor names differ: {sorted(set(ours) ^ set(theirs))}")
    for n in ours:
        a, b = ours[n], theirs[n]
        if a.tensor_type != b.tensor_type or np.asarray(a.data).tobytes() != np.asarray(b.data).tobytes():
            sys.exit(f"{n}: ours {a.tensor_type.name} differs from llama.cpp's {b.tensor_type.name}")
    os.remove(f32)
    os.remove(ref)
    return len(ours)


def rel(p):
    return os.path.relpath(p, ROOT)


def main():
    cases = []
    tmp = tempfile.mkdtemp(prefix="qlora-export-fx-")
    tiny_base = os.path.join(FX, "gguf", "tiny_llama.gguf")
    tiny_ad = os.path.join(FX, "parity", "llama_gqa_adapter")
    tiny_ids = [1, 17, 42, 5, 88, 63, 9, 30, 71, 2, 55, 12]
    jobs = [("tiny_f32", tiny_base, tiny_ad, "gguf", "f32", tiny_ids, None),
            ("tiny_q8_0", tiny_base, tiny_ad, "gguf", "q8_0", tiny_ids, None),
            ("tiny_lora", tiny_base, tiny_ad, "gguf-lora", "f32", tiny_ids, None)]
    # Qwen3 (arch qwen3: attn_q_norm/attn_k_norm, head_dim 24 as key_length, tied head, no permute).
    q3_base = os.path.join(FX, "gguf", "tiny_qwen3.gguf")
    q3_ad = os.path.join(FX, "parity", "qwen3_adapter")
    jobs += [("tinyqwen3_f32", q3_base, q3_ad, "gguf", "f32", tiny_ids, None),
             ("tinyqwen3_q8_0", q3_base, q3_ad, "gguf", "q8_0", tiny_ids, None),
             ("tinyqwen3_lora", q3_base, q3_ad, "gguf-lora", "f32", tiny_ids, None)]
    # Phi-3.5/Phi-4-mini's layout from a Hugging Face directory (arch phi3: attn_qkv and the fused
    # ffn_up, LongRoPE's long/short factor tensors and attn_factor, 8 of 16 dims rotated): the
    # 12 positions pass the 8 it was "pretrained" on and llama.cpp's context (128) too, so both
    # sides take the long factors.
    phi_base = os.path.join(FX, "models", "phi3_longrope")
    phi_ad = os.path.join(FX, "parity", "phi3_longrope_adapter")
    jobs += [("tinyphi3_f32", phi_base, phi_ad, "gguf", "f32", tiny_ids, None)]
    # Mixtures of experts from Hugging Face directories: Mixtral (arch llama with expert_count, 16
    # experts of 32, two per token; Q/K permuted) merged at f32 and q8_0, and Qwen3-MoE with
    # norm_topk_prob (arch qwen3moe, 16 experts of 24, four per token) at f32. Each layer's experts
    # are written as llama.cpp's stacked ffn_{gate,up,down}_exps and its router as ffn_gate_inp.
    mix_base = os.path.join(FX, "models", "mixtral")
    mix_ad = os.path.join(FX, "parity", "mixtral_adapter")
    q3m_base = os.path.join(FX, "models", "qwen3_moe_norm")
    q3m_ad = os.path.join(FX, "parity", "qwen3_moe_norm_adapter")
    jobs += [("tinymixtral_f32", mix_base, mix_ad, "gguf", "f32", tiny_ids, None),
             ("tinymixtral_q8_0", mix_base, mix_ad, "gguf", "q8_0", tiny_ids, None),
             ("tinyqwen3moe_f32", q3m_base, q3m_ad, "gguf", "f32", tiny_ids, None)]
    # With LoRA on the experts (PEFT's target_parameters): every expert's gate, up and down merged
    # before they are stacked.
    q3e_base = os.path.join(FX, "models", "qwen3_moe_experts")
    q3e_ad = os.path.join(FX, "parity", "qwen3_moe_experts_adapter")
    jobs += [("tinyqwen3moeexperts_f32", q3e_base, q3e_ad, "gguf", "f32", tiny_ids, None)]
    # gpt-oss (arch gpt-oss): the parity fixture (16 MXFP4 experts of 32, four per token; sinks;
    # biases on q/k/v/o, the router and the experts; windows of 4 on the even layers; YaRN from 32
    # positions, factor 4) with swiglu_limit 7, the constant llama.cpp's gpt-oss fixes (the fixture's
    # is 1), and its adapter on q/v/o and on every expert's gate_up_proj and down_proj. Its config has
    # YaRN's truncate false, which llama.cpp does not implement: its logits are the model's with
    # truncate true (the engine reads the GGUF so).
    go_base = hf_fixture_with("gpt_oss", "gpt_oss", {"swiglu_limit": 7.0})
    go_ad = os.path.join(FX, "parity", "gpt_oss_adapter")
    jobs += [("tinygptoss_f32", go_base, go_ad, "gguf", "f32", tiny_ids, None),
             ("tinygptoss_q8_0", go_base, go_ad, "gguf", "q8_0", tiny_ids, None)]
    # The same gpt-oss with LoRA on the attention only: its experts, which the adapter leaves alone,
    # are written in MXFP4 as the checkpoint ships them (ggml's MXFP4 blocks, as convert_hf_to_gguf.py
    # repacks them). llama.cpp multiplies MXFP4 weights by activations it rounds to Q8_0, so the case
    # also records llama.cpp on its own F32 copy of the file (f32_copy), whose logits the engine, which
    # dequantizes MXFP4 exactly, must match at f32 tolerance.
    go_attn = attention_only_adapter(go_ad, os.path.join(OUT, "gpt_oss_attn_adapter"))
    jobs += [("tinygptossmxfp4_f32", go_base, go_attn, "gguf", "f32", tiny_ids, None)]
    # Qwen3 with YaRN (factor 4 from 4096 positions): rope.scaling.* as the converter writes them.
    # The parity fixture itself, given the Mixtral fixture's tokenizer.json (the same 96 ids).
    qy_base = os.path.join(FX, "models", "qwen3_yarn")
    shutil.copyfile(os.path.join(FX, "models", "mixtral", "tokenizer.json"), os.path.join(qy_base, "tokenizer.json"))
    qy_ad = os.path.join(FX, "parity", "qwen3_yarn_adapter")
    jobs += [("tinyqwen3yarn_f32", qy_base, qy_ad, "gguf", "f32", tiny_ids, None)]
    # Gemma 2 and Gemma 3 (arch gemma2/gemma3; see gemma_fixture): the text crosses the windows of 4,
    # and its capitals, accents and the snowman are not in the vocabulary (byte fallback).
    gemma_text = "the dog runs over the river, \u00e9t\u00e9 at Where's the fox? \u2603 the sun"
    for kind in ("gemma2", "gemma3"):
        g_base, g_ad = spm_fixture(kind)
        jobs += [(f"tiny{kind}_f32", g_base, g_ad, "gguf", "f32", None, gemma_text)]
    # Gemma 3 4B-27B as shipped (Gemma3ForConditionalGeneration): its text model, the tower left out
    # (llama.cpp reads that from the separate --mmproj file convert_hf_to_gguf.py writes).
    mm_base, mm_ad = gemma3_multimodal_fixture(*spm_fixture("gemma3"))
    jobs += [("tinygemma3mm_f32", mm_base, mm_ad, "gguf", "f32", None, gemma_text)]
    # Llama 2 / Mistral's SentencePiece layout (a Prepend of U+2581: llama.cpp's add_space_prefix) on
    # a Llama-layout model: the vocabulary of a real Mistral or Mixtral checkpoint's tokenizer.json.
    l_base, l_ad = spm_fixture("llama_spm")
    jobs += [("tinyllamaspm_f32", l_base, l_ad, "gguf", "f32", None, gemma_text)]
    # The same vocabulary in tokenizers' newer layout (Metaspace, prepend_scheme first, no split),
    # written with add_space_prefix as convert_hf_to_gguf.py writes such a model: on a text that
    # starts without a space and has no special token inside, llama.cpp's ids are transformers'.
    m_base, m_ad = spm_fixture("llama_metaspace")
    jobs += [("tinyllamametaspace_f32", m_base, m_ad, "gguf", "f32", None, gemma_text)]
    if os.path.exists(SMOL):
        smol_ad = os.path.join(OUT, "smollm2_adapter")
        smollm2_adapter(smol_ad)
        text = "<|im_start|>user\nWhat does \"harbor\" mean?<|im_end|>\n<|im_start|>assistant\n"
        jobs += [("smollm2_f32", SMOL, smol_ad, "gguf", "f32", None, text),
                 ("smollm2_q8_0", SMOL, smol_ad, "gguf", "q8_0", None, text),
                 ("smollm2_lora", SMOL, smol_ad, "gguf-lora", "f32", None, text)]
    else:
        print("SmolLM2 GGUF not found: only the tiny cases are recorded", file=sys.stderr)
    for name, base, ad, fmt, outtype, ids, text in jobs:
        out = os.path.join(tmp, name + ".gguf")
        digest = export(["--format", fmt, "--model", base, "--adapter", ad, "--outtype", outtype], out)
        model, lora = (out, None) if fmt == "gguf" else (base, out)
        checks = {}
        if fmt == "gguf-lora":
            # llama.cpp runs the adapter on our f32 export of the base alone: the same f32 weights our
            # engine uses, so the comparison measures the adapter, not llama.cpp's quantized matmuls
            # (SmolLM2's base is Q4_1; the tiny fixture itself has no tokenizer.ggml.merges key, which
            # llama.cpp requires).
            model = os.path.join(tmp, name + "_base.f32.gguf")
            export(["--format", "gguf", "--model", base, "--outtype", "f32"], model)
            checks["llama_cpp_base"] = "qlora export --format gguf --outtype f32 of the base, no adapter"
        if outtype == "q8_0":
            checks["llama_cpp_quantize_equal_tensors"] = q8_0_equals_llama_cpp(out, base, ad, tmp)
        if ids is None:
            probe = Llama(model_path=model, vocab_only=True, verbose=False)
            ids = probe.tokenize(text.encode(), add_bos=False, special=True)
        _, scores = llama_logits(model, ids, lora)
        if "mxfp4" in name:
            types = {t.tensor_type.name for t in gguf.GGUFReader(out).tensors if "_exps.weight" in t.name}
            if types != {"MXFP4"}:
                sys.exit(f"{name}: expert stacks are {sorted(types)}, not MXFP4")
            checks["experts_mxfp4"] = True
            _, copy_scores = llama_logits(f32_copy(out, tmp), ids)
            checks["rows_llama_cpp_f32_copy"] = rows(copy_scores)
        if "gptoss" in name:
            # YaRN with truncate false (gpt-oss's config): llama.cpp floors and ceils the ramp's ends
            # (ggml_rope_yarn_corr_dims), so its logits are the model's with truncate true, and the
            # merged Hugging Face model's are not llama.cpp's (the export says so in a note).
            checks["llama_cpp_yarn_truncates"] = True
        if "gemma" in name:
            # ggml's CPU GELU (Gemma's GeGLU) reads a float16 table (GGML_GELU_FP16): its input and
            # output are rounded to f16, so llama.cpp's logits are not the f32 model's to 1e-5.
            checks["llama_cpp_gelu_f16_table"] = True
        case = {"name": name, "model": rel(base), "adapter": rel(ad), "format": fmt, "outtype": outtype,
                "sha256": digest, **checks, "ids": [int(i) for i in ids], "rows": rows(scores)}
        if text is not None:
            case["text"] = text
        cases.append(case)
        print(f"{name}: sha256 {digest[:16]}..., {len(ids)} positions, top1 {case['rows'][-1]['top_ids'][0]}")
        if fmt == "gguf":
            os.remove(out)
    with open(os.path.join(OUT, "llama_cpp_logits.json"), "w") as f:
        json.dump({"llama_cpp_python": llama_cpp_version, "llama_cpp_use_extra_bufts": False, "top_k": TOPK,
                   "cases": cases}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
