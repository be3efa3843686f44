#!/usr/bin/env python3
"""QLoRA fixtures: transformers + bitsandbytes 4-bit references (CPU) for the engine's quantized base.

Run with the fixture venv (torch, transformers, peft, bitsandbytes 0.50 whose CPU path works):

  /opt/fixenv/bin/python tools/make_qlora_fixtures.py
      writes tests/fixtures/qlora/llama_gqa_nf4.safetensors (reference logits / loss / LoRA gradients)
      and tests/fixtures/qlora/llama_gqa_bnb_nf4/ (the 4-bit model as transformers saves it)

  /opt/fixenv/bin/python tools/make_qlora_fixtures.py --check-quantize BUILD/qlora
      runs `qlora quantize` on tests/fixtures/models/llama_gqa (nf4 + double quant, and fp4), loads
      each output with transformers + bitsandbytes, compares the dequantized weights with
      bitsandbytes' own quantization of the original weights and the logits with a model quantized
      by transformers on load, and writes tests/fixtures/qlora/quantize_check.json

See tests/fixtures/qlora/README.md for the keys. Reruns are byte-identical (fixed seeds, CPU only).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
import peft
import transformers
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIX, "qlora")
MODEL = os.path.join(FIX, "models", "llama_gqa")
ADAPTER = os.path.join(FIX, "parity", "llama_gqa_adapter")


def bnb_config(quant_type, double_quant):
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                              bnb_4bit_use_double_quant=double_quant, bnb_4bit_compute_dtype=torch.float32)


def cpu_default_path(model):
    """Forces bitsandbytes' portable CPU path (dequantize in f32 + torch linear). On CPUs with
    AVX512-BF16 it would otherwise repack weights for its own kernel, which is not reproducible."""
    for m in model.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = False
    return model


def load_4bit(path, quant_type="nf4", double_quant=True):
    kw = {} if quant_type is None else {"quantization_config": bnb_config(quant_type, double_quant)}
    m = AutoModelForCausalLM.from_pretrained(path, device_map="cpu", attn_implementation="eager",
                                             dtype=torch.float32, **kw)
    return cpu_default_path(m).eval()


def dequantized_linears(model):
    """{module name: f32 weight} for every Linear4bit, through bitsandbytes' own dequantize_4bit."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, bnb.nn.Linear4bit):
            out[name] = F.dequantize_4bit(m.weight.data, m.weight.quant_state).float()
    return out


def parity_inputs():
    f = safe_open(os.path.join(FIX, "parity", "llama_gqa.safetensors"), "pt")
    return f.get_tensor("input_ids").long(), f.get_tensor("labels").long()


def hf_loss(model, ids, labels):
    return model(input_ids=ids, labels=labels).loss


MM_MODEL = os.path.join(FIX, "models", "gemma3_mm")


def portable_cpu_dequantize():
    """bitsandbytes 0.50.2's native CPU dequantize_4bit kernel (taken on AVX512 CPUs) reads the blocks
    of a row that is not whole blocks (in_features % blocksize != 0: the fixture's o_proj 64x96 and
    down_proj 64x160) differently from how quantize_4bit wrote them (blocks over the flattened weight,
    as its CUDA kernels read them); its portable kernel reads them as written. Registers the portable
    one for CPU tensors."""
    import bitsandbytes.backends.default.ops as default_ops
    from bitsandbytes.backends.utils import _get_4bit_code

    @torch.library.register_kernel("bitsandbytes::dequantize_4bit", "cpu")
    def _(A, absmax, blocksize, quant_type, shape, dtype):
        if A.dtype != torch.uint8:
            A = A.view(torch.uint8)
        return default_ops._dequantize_4bit_compute(A.reshape(-1), absmax, _get_4bit_code(quant_type, A.device),
                                                    blocksize, shape, dtype)


def flattened_dequantize(weight):
    """NF4 + double quant dequantized by the layout's definition: code[nibble] * absmax of the
    element's block over the flattened weight, absmax = code8[q] * nested_absmax + offset."""
    qs = weight.quant_state
    s2 = qs.state2
    absmax = s2.code[qs.absmax.long()] * s2.absmax.repeat_interleave(s2.blocksize)[: qs.absmax.numel()] + qs.offset
    b = weight.data.flatten()
    nib = torch.stack([b >> 4, b & 15], 1).flatten().long()
    n = int(torch.Size(qs.shape).numel())
    return (qs.code[nib][:n] * absmax.repeat_interleave(qs.blocksize)[:n]).reshape(qs.shape)


def check_against_dequantized(m4, plain, run, logits):
    """The 4-bit model's `logits` are those of the f32 model `plain` holding bitsandbytes' dequantized
    weights, and those weights are the layout's own reading (flattened_dequantize), which the engine's
    is. Returns {module name: dequantized weight}."""
    deq = dequantized_linears(m4)
    for name, w in deq.items():
        assert torch.equal(w, flattened_dequantize(m4.get_submodule(name).weight)), name
    with torch.no_grad():
        for name, w in deq.items():
            plain.get_submodule(name).weight.copy_(w)
        d = (run(plain) - logits).abs().max().item()
    assert d < 1e-5, f"4-bit logits differ from the dequantized f32 model by {d}"
    return deq


def save_checkpoint(model, ck):
    """The model as transformers saves it, without generation_config.json and the version stamp
    (reruns stay byte-identical across transformers patch releases)."""
    shutil.rmtree(ck, ignore_errors=True)
    model.save_pretrained(ck)
    gen = os.path.join(ck, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    cfg_path = os.path.join(ck, "config.json")
    cfg = json.load(open(cfg_path))
    cfg.pop("transformers_version", None)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def make_reference():
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one summation order, so reruns are byte-identical
    ids, labels = parity_inputs()
    t = {"input_ids": ids.int(), "labels": labels.int()}

    m4 = load_4bit(MODEL, "nf4", True)
    with torch.no_grad():
        t["logits"] = m4(ids).logits.float().contiguous()
        t["loss"] = hf_loss(m4, ids, labels).reshape(1).float()

    # The reference means "f32 model whose projections are bitsandbytes' dequantized weights":
    # check that before trusting it.
    plain = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="eager").eval()
    deq = check_against_dequantized(m4, plain, lambda m: m(ids).logits, t["logits"])
    assert len(deq) == 14, len(deq)

    m_fp4 = load_4bit(MODEL, "fp4", False)
    with torch.no_grad():
        t["fp4_logits"] = m_fp4(ids).logits.float().contiguous()

    # QLoRA: the parity adapter on the 4-bit base, logits / loss / LoRA gradients of the mean loss.
    ml = PeftModel.from_pretrained(load_4bit(MODEL, "nf4", True), ADAPTER, is_trainable=True)
    cpu_default_path(ml)
    with torch.no_grad():
        t["lora_logits"] = ml(input_ids=ids).logits.float().contiguous()
    loss = hf_loss(ml, ids, labels)
    loss.backward()
    t["lora_loss"] = loss.detach().reshape(1).float()
    n_grads = 0
    for name, p in ml.named_parameters():
        if "lora_" not in name:
            continue
        key = name.replace(".default", "")
        assert p.grad is not None and p.grad.abs().max() > 0, key
        t["grad." + key] = p.grad.detach().float().contiguous()
        n_grads += 1
    assert n_grads == 28, n_grads
    os.makedirs(OUT, exist_ok=True)
    # One metadata key: safetensors writes several in random order, and reruns should be byte-identical.
    save_file(t, os.path.join(OUT, "llama_gqa_nf4.safetensors"), metadata={
        "generator": f"tools/make_qlora_fixtures.py (bitsandbytes {bnb.__version__}, torch {torch.__version__}, "
                     f"transformers {transformers.__version__}, peft {peft.__version__})"})

    # The 4-bit model as transformers saves it (nf4 + double quant, blocksize 64).
    ck = os.path.join(OUT, "llama_gqa_bnb_nf4")
    save_checkpoint(m4, ck)
    again = load_4bit(ck, None)
    with torch.no_grad():
        d = (again(ids).logits - t["logits"]).abs().max().item()
    assert d == 0.0, f"reloaded checkpoint changes the logits by {d}"
    print("wrote", OUT, {k: os.path.getsize(os.path.join(ck, k)) for k in os.listdir(ck)})


def make_multimodal():
    """tests/fixtures/qlora/gemma3_mm_bnb_nf4/: the multimodal Gemma 3 fixture (Gemma3ForConditionalGeneration,
    a SigLIP tower) quantized on load by transformers + bitsandbytes (nf4 + double quant, blocksize 64) and
    saved as transformers saves it (the layout of the Hub's "-bnb-4bit" Gemma 3 checkpoints); and
    gemma3_mm_nf4.safetensors: its text-only logits on the parity batch of gemma3_mm, checked equal to
    the reloaded checkpoint's and to an f32 model whose quantized projections are bnb's dequantized weights."""
    from transformers import AutoModelForImageTextToText
    torch.manual_seed(0)
    torch.set_num_threads(1)
    f = safe_open(os.path.join(FIX, "parity", "gemma3_mm.safetensors"), "pt")
    ids = f.get_tensor("input_ids").long()

    def load(path, quant):
        kw = {"quantization_config": bnb_config("nf4", True)} if quant else {}
        m = AutoModelForImageTextToText.from_pretrained(path, device_map="cpu", attn_implementation="eager",
                                                        dtype=torch.float32, **kw)
        return cpu_default_path(m).eval()

    m4 = load(MM_MODEL, True)
    with torch.no_grad():
        logits = m4(input_ids=ids).logits.float().contiguous()
    deq = check_against_dequantized(m4, load(MM_MODEL, False), lambda m: m(input_ids=ids).logits, logits)
    n_text = sum(1 for n in deq if "language_model" in n)
    ck = os.path.join(OUT, "gemma3_mm_bnb_nf4")
    save_checkpoint(m4, ck)
    again = load(ck, False)
    with torch.no_grad():
        d = (again(input_ids=ids).logits - logits).abs().max().item()
    assert d == 0.0, f"reloaded checkpoint changes the logits by {d}"
    save_file({"input_ids": ids.int(), "logits": logits}, os.path.join(OUT, "gemma3_mm_nf4.safetensors"), metadata={
        "generator": f"tools/make_qlora_fixtures.py --multimodal (bitsandbytes {bnb.__version__}, torch {torch.__version__}, "
                     f"transformers {transformers.__version__}; {len(deq)} Linear4bit, {n_text} in the language model)"})
    print("wrote", ck, {k: os.path.getsize(os.path.join(ck, k)) for k in os.listdir(ck)}, "quantized linears", len(deq), n_text)


def check_quantize(binary):
    ids, _ = parity_inputs()
    results = {}
    for tag, quant, dq in (("nf4_double_quant", "nf4", True), ("fp4", "fp4", False)):
        tmp = tempfile.mkdtemp(prefix="qlora_quantize_check_")
        out = os.path.join(tmp, "out")
        args = [binary, "quantize", "--model", MODEL, "--quant", quant, "--out", out] + (["--double-quant"] if dq else [])
        proc = subprocess.run(args, capture_output=True, text=True)
        r = {"args": " ".join(["qlora"] + args[1:]).replace(ROOT + "/", "").replace(out, "OUT"),
             "exit_code": proc.returncode}
        if proc.returncode != 0:
            r["loads"] = False
            r["error"] = proc.stderr[-2000:]
            results[tag] = r
            continue
        try:
            ours = load_4bit(out, None)
            r["loads"] = True
        except Exception as e:  # recorded, not raised: the JSON says what went wrong
            r["loads"] = False
            r["error"] = repr(e)[-2000:]
            results[tag] = r
            continue
        # Reference: bitsandbytes quantizing the original f32 weights itself.
        ref = load_4bit(MODEL, quant, dq)
        a, b = dequantized_linears(ours), dequantized_linears(ref)
        r["n_quantized_linears"] = len(a)
        r["same_modules"] = sorted(a) == sorted(b)
        r["max_abs_diff"] = max((a[k] - b[k]).abs().max().item() for k in b) if r["same_modules"] else None
        with torch.no_grad():
            r["logits_max_abs_diff"] = (ours(ids).logits - ref(ids).logits).abs().max().item()
        results[tag] = r
        shutil.rmtree(tmp, ignore_errors=True)
    rec = {"generator": "tools/make_qlora_fixtures.py --check-quantize", "bitsandbytes": bnb.__version__,
           "transformers": transformers.__version__, "results": results}
    path = os.path.join(OUT, "quantize_check.json")
    with open(path, "w") as f:
        json.dump(rec, f, indent=2, sort_keys=True)
        f.write("\n")
    print(json.dumps(rec, indent=2))
    return 0 if all(r.get("loads") and r.get("max_abs_diff") == 0.0 for r in results.values()) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-quantize", metavar="QLORA_BIN", help="check `qlora quantize` output instead")
    ap.add_argument("--multimodal", action="store_true", help="write only the multimodal Gemma 3 checkpoint")
    a = ap.parse_args()
    portable_cpu_dequantize()
    if a.check_quantize:
        return check_quantize(os.path.abspath(a.check_quantize))
    if a.multimodal:
        make_multimodal()
        return 0
    make_reference()
    return 0


if __name__ == "__main__":
    sys.exit(main())
