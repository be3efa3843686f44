#!/usr/bin/env python3
"""`qlora merge` checked by transformers: writes tests/fixtures/merge/merge_check.json.

  /opt/fixenv/bin/python tools/make_merge_fixtures.py BUILD/qlora

For each case below it runs `qlora merge` on a fixture base + adapter, loads the output directory
with transformers' AutoModelForCausalLM.from_pretrained (eager attention, CPU), computes the logits
of the fixture input_ids and compares them with PEFT's base + adapter (PeftModel.from_pretrained on
the fixture base, computed here; for the NF4 base, the logits transformers + bitsandbytes + PEFT gave
in tests/fixtures/qlora/llama_gqa_nf4.safetensors). fp32 outputs must agree within 2e-5 of the
largest |logit|; bf16 outputs are also checked weight by weight against PEFT's merge_and_unload()
in fp32 rounded to bf16 by torch. The JSON records, per case, the arguments, the sha256 of every
file of the output and the errors measured. tests/cli/test_merge_cli.cpp re-runs the same merges
and requires the same sha256s, so this verdict applies to what the binary writes now.
Reruns are byte-identical.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import peft
import torch
import transformers
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, Mxfp4Config

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIX, "merge", "merge_check.json")
FP32_TOL = 2e-5  # relative to the largest |logit|, as the parity tests

# name -> (base relative to FIX, adapter, extra arguments, reference)
CASES = {
    "llama_gqa_fp32": ("models/llama_gqa", "parity/llama_gqa_adapter", ["--dtype", "fp32"], "llama_gqa"),
    "llama_gqa_fp32_sharded": ("models/llama_gqa", "parity/llama_gqa_adapter",
                               ["--dtype", "fp32", "--max-shard-size", "100KB"], "llama_gqa"),
    "llama_gqa_bf16": ("models/llama_gqa", "parity/llama_gqa_adapter", ["--dtype", "bf16"], "llama_gqa"),
    "qwen2_fp32": ("models/qwen2", "parity/qwen2_adapter", [], "qwen2"),
    "llama_tied_fp32": ("models/llama_tied", "parity/llama_tied_adapter", [], "llama_tied"),
    "qwen3_fp32": ("models/qwen3", "parity/qwen3_adapter", [], "qwen3"),
    "gguf_qwen3_fp32": ("gguf/tiny_qwen3.gguf", "parity/qwen3_adapter", [], "qwen3"),
    "mistral_fp32": ("models/mistral", "parity/mistral_adapter", [], "mistral"),
    "gemma3_fp32": ("models/gemma3", "parity/gemma3_adapter", [], "gemma3"),
    # Gemma 3 as shipped (Gemma3ForConditionalGeneration): the text model merged under its own
    # names, the SigLIP tower and the projector copied; transformers loads the multimodal model.
    "gemma3_mm_fp32": ("models/gemma3_mm", "parity/gemma3_mm_adapter", [], "gemma3_mm"),
    "phi3_fp32": ("models/phi3", "parity/phi3_adapter", [], "phi3"),
    "gemma2_fp32": ("models/gemma2", "parity/gemma2_adapter", [], "gemma2"),
    "mixtral_fp32": ("models/mixtral", "parity/mixtral_adapter", [], "mixtral"),
    "qwen3_moe_bf16": ("models/qwen3_moe", "parity/qwen3_moe_adapter", ["--dtype", "bf16"], "qwen3_moe"),
    # LoRA on the experts (PEFT's target_parameters): each expert's gate, up and down merged.
    "qwen3_moe_experts_fp32": ("models/qwen3_moe_experts", "parity/qwen3_moe_experts_adapter", [], "qwen3_moe_experts"),
    # gpt-oss shipped with MXFP4 experts: the fused, interleaved stacks written dequantized with each
    # expert's delta; transformers loads them as plain GptOssExperts (quantization_config dropped).
    "gpt_oss_fp32": ("models/gpt_oss", "parity/gpt_oss_adapter", [], "gpt_oss"),
    "gguf_llama_fp32": ("gguf/tiny_llama.gguf", "parity/llama_gqa_adapter", [], "llama_gqa"),
    # Gemma 2, Gemma 3 and Phi-3 GGUFs (`qlora export --outtype f32` of export/gemma2, export/gemma3 and
    # models/phi3_longrope): the family's own config.json and a SentencePiece / BPE tokenizer.json
    # written from the GGUF; the reference is PEFT on the Hugging Face directory they were exported from.
    "gguf_gemma2_fp32": ("gguf/tiny_gemma2.gguf", "export/gemma2_adapter", [], "export/gemma2"),
    "gguf_gemma3_fp32": ("gguf/tiny_gemma3.gguf", "export/gemma3_adapter", [], "export/gemma3"),
    "gguf_phi3_fp32": ("gguf/tiny_phi3.gguf", "parity/phi3_longrope_adapter", [], "phi3_longrope"),
    # Mixtral and Qwen3-MoE GGUFs (`qlora export --outtype f32` of models/mixtral and
    # models/qwen3_moe_norm: llama.cpp's stacked experts): MixtralForCausalLM's / Qwen3MoeForCausalLM's
    # config.json and each expert unstacked under the Hub names.
    "gguf_mixtral_fp32": ("gguf/tiny_mixtral.gguf", "parity/mixtral_adapter", [], "mixtral"),
    "gguf_qwen3moe_fp32": ("gguf/tiny_qwen3moe.gguf", "parity/qwen3_moe_norm_adapter", [], "qwen3_moe_norm"),
    # A gpt-oss GGUF (llama.cpp's gpt-oss: stacks split and transposed, the router and sinks in f32),
    # exported here from export/gpt_oss ("@" + the directory: `qlora export --format gguf --outtype
    # f32`, as the C++ test does before merging, which keeps the file out of the tree): GptOssConfig's
    # config.json with YaRN's truncate true (llama.cpp's ramp, which the GGUF computes) and the fused,
    # interleaved stacks; the reference is PEFT on export/gpt_oss with truncate true.
    "gguf_gptoss_fp32": ("@export/gpt_oss", "parity/gpt_oss_adapter", [], "export/gpt_oss"),
    "bnb_nf4_fp32": ("qlora/llama_gqa_bnb_nf4", "parity/llama_gqa_adapter", ["--dtype", "fp32"], "nf4"),
    "bnb_nf4_bf16": ("qlora/llama_gqa_bnb_nf4", "parity/llama_gqa_adapter", [], "nf4"),
}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# A reference "name" is models/name with parity/name_adapter and the input_ids of parity/name.safetensors;
# "dir/name" (a model outside models/) is dir/name with dir/name_adapter and fixed ids.
FIXED_IDS = [[2, 17, 42, 5, 88, 63, 9, 30, 71, 1, 55, 12]]


# References whose model directory is not <ref> + "_adapter", or whose config.json is read with changes.
REF_ADAPTER = {"export/gpt_oss": "parity/gpt_oss_adapter"}
REF_CONFIG_CHANGES = {"export/gpt_oss": {"rope_scaling": {"truncate": True}}}


def ref_dirs(ref):
    if "/" in ref:
        return ref, REF_ADAPTER.get(ref, ref + "_adapter")
    return f"models/{ref}", f"parity/{ref}_adapter"


def inputs(ref):
    if "/" in ref:
        return torch.tensor(FIXED_IDS, dtype=torch.long), None
    name = "qlora/llama_gqa_nf4.safetensors" if ref == "nf4" else f"parity/{ref}.safetensors"
    with safe_open(os.path.join(FIX, name), "pt") as f:
        return f.get_tensor("input_ids").long(), (f.get_tensor("lora_logits") if ref == "nf4" else None)


def load(path, dtype):
    # MXFP4 experts (gpt-oss as shipped) dequantized to the requested dtype: without this,
    # transformers on a CPU dequantizes them to bf16 and runs the experts there.
    cfg = json.load(open(os.path.join(path, "config.json")))
    mxfp4 = (cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4"
    kw = {"quantization_config": Mxfp4Config(dequantize=True)} if mxfp4 else {}
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager", **kw).eval()


@torch.no_grad()
def peft_reference(ref):
    """PEFT's base + adapter logits, and merge_and_unload()'s fp32 state dict."""
    model_dir, adapter_dir = ref_dirs(ref)
    path = os.path.join(FIX, model_dir)
    if ref in REF_CONFIG_CHANGES:  # a copy of the directory with the config changed
        tmp = tempfile.mkdtemp(prefix="qlora-merge-ref-")
        for f in os.listdir(path):
            shutil.copyfile(os.path.join(path, f), os.path.join(tmp, f))
        cfg = json.load(open(os.path.join(tmp, "config.json")))
        for k, v in REF_CONFIG_CHANGES[ref].items():
            cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
        json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"))
        path = tmp
    base = load(path, torch.float32)
    m = PeftModel.from_pretrained(base, os.path.join(FIX, adapter_dir)).eval()
    ids, _ = inputs(ref)
    logits = m(input_ids=ids).logits
    merged = m.merge_and_unload().state_dict()
    return logits, merged


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("qlora", help="path of the qlora binary")
    args = ap.parse_args()
    torch.manual_seed(0)
    refs = {}
    record = {"generator": "tools/make_merge_fixtures.py",
              "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
                           "peft": peft.__version__},
              "fp32_tolerance": FP32_TOL, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (base, adapter, extra, ref) in CASES.items():
            out = os.path.join(tmp, name)
            model_path, base_sha = os.path.join(FIX, base), None
            if base.startswith("@"):  # a GGUF exported from that directory first
                model_path = os.path.join(tmp, name + "_base.gguf")
                subprocess.run([args.qlora, "export", "--format", "gguf", "--outtype", "f32", "--model",
                                os.path.join(FIX, base[1:]), "--out", model_path], check=True, capture_output=True)
                base_sha = sha256(model_path)
            cmd = [args.qlora, "merge", "--model", model_path, "--adapter", os.path.join(FIX, adapter),
                   "--out", out] + extra
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{name}: qlora merge failed ({r.returncode}):\n{r.stdout}{r.stderr}")
            cfg = json.load(open(os.path.join(out, "config.json")))
            assert "quantization_config" not in cfg, name
            bf16 = "bf16" in name
            model = load(out, "auto")
            want_dtype = torch.bfloat16 if bf16 else torch.float32
            assert model.dtype == want_dtype, (name, model.dtype)
            ids, nf4_logits = inputs(ref)
            with torch.no_grad():
                got = model.float()(input_ids=ids).logits
            if ref == "nf4":
                want, merged_sd = nf4_logits, None
            else:
                if ref not in refs:
                    refs[ref] = peft_reference(ref)
                want, merged_sd = refs[ref]
            scale = want.abs().max().item()
            err = (got - want).abs().max().item()
            case = {"args": ["merge", "--model", base, "--adapter", adapter] + extra,
                    "dtype": str(want_dtype).replace("torch.", ""),
                    "reference": "parity/llama_gqa_nf4 lora_logits (transformers + bitsandbytes + PEFT)" if ref == "nf4"
                    else "PeftModel.from_pretrained(%s, %s)" % ref_dirs(ref),
                    "logits_max_abs_err": float(f"{err:.3e}"), "logits_max_abs": round(scale, 4),
                    "files": {f: sha256(os.path.join(out, f)) for f in sorted(os.listdir(out))}}
            if base_sha:
                case["base_gguf_sha256"] = base_sha
            if not bf16:
                assert err <= FP32_TOL * scale, f"{name}: max |logit error| {err:.3e} > {FP32_TOL} x {scale:.3f}"
            if bf16 and merged_sd is not None:
                # Every weight equals PEFT's fp32 merge rounded to bf16 by torch, but where the two fp32
                # merges (ours sums the rank in double) straddle a rounding boundary: one bf16 ulp there.
                sd = model.state_dict()
                differ, total, worst_ulps = 0, 0, 0
                for k, v in merged_sd.items():
                    if k not in sd:
                        continue
                    w = v.to(torch.bfloat16)
                    d = (sd[k].to(torch.bfloat16).view(torch.int16).int() - w.view(torch.int16).int()).abs()
                    differ += int((d != 0).sum())
                    total += d.numel()
                    worst_ulps = max(worst_ulps, int(d.max()))
                assert worst_ulps <= 1, f"{name}: a weight differs from torch's bf16 rounding by {worst_ulps} ulps"
                case["bf16_weights_differing_from_torch_rounding"] = f"{differ} of {total} (at most {worst_ulps} ulp)"
            if ref == "gemma3_mm":  # every tensor outside the language model is the base's, bit for bit
                base_model = load(os.path.join(FIX, base), torch.float32)
                bsd, osd = base_model.state_dict(), model.state_dict()
                other = [k for k in bsd if "language_model" not in k and not k.startswith("lm_head")]
                assert other and all(torch.equal(bsd[k], osd[k]) for k in other), name
                case["vision_tower_and_projector"] = f"{len(other)} tensors equal to the base's"
            if base.endswith(".gguf") or base.startswith("@"):
                tok = AutoTokenizer.from_pretrained(out)
                assert tok.bos_token_id == cfg["bos_token_id"] and tok.eos_token_id == cfg["eos_token_id"], name
                case["tokenizer"] = f"AutoTokenizer loads it: {type(tok).__name__}, {len(tok)} tokens"
            record["cases"][name] = case
            print(f"{name}: max |logit error| {err:.3e} (largest |logit| {scale:.3f}), {len(case['files'])} files")
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.write("\n")
    print("wrote", os.path.relpath(OUT, ROOT))


if __name__ == "__main__":
    main()
