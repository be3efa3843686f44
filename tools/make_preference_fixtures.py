#!/usr/bin/env python3
# Preference-training fixtures: TRL's DPO / ORPO / SimPO (CPO) / KTO trainers on a tiny model, two steps each.
"""Generate the preference-training fixtures that the C++ tests compare against.

    /opt/fixenv/bin/python tools/make_preference_fixtures.py              # everything
    /opt/fixenv/bin/python tools/make_preference_fixtures.py --case kto   # one case (model, data, adapter too)

Writes
    tests/fixtures/models/pref_tiny/          tiny LlamaForCausalLM + byte-level BPE tokenizer (ChatML template)
    tests/fixtures/preference/*.jsonl         the four datasets
    tests/fixtures/preference/init_adapter/   the LoRA adapter every case starts from
    tests/fixtures/preference/<case>.json     token ids, losses, logged metrics, per-sequence log-probs
    tests/fixtures/preference/<case>.safetensors   step-0 LoRA gradients and LoRA weights after one step

Every case runs TRL's own trainer (`trainer.train()`, 2 optimizer steps, one micro-batch holding the
whole dataset) on CPU in fp32; a callback records the gradients before and the weights after the first
AdamW step, and `compute_loss` is wrapped to record the loss and the exact batch. Independently of
TRL, the script then recomputes every per-sequence log-probability with plain transformers (one
unpadded sequence at a time, adapters disabled for the reference), rebuilds each loss and metric with
the formulas documented in tests/fixtures/preference/README.md, and asserts that they reproduce TRL's
numbers (and, at step 0, TRL's gradients) before anything is written. Reruns are byte-identical
(fixed seeds, one CPU thread, sorted JSON keys, floats written as Python's repr).
"""
import argparse
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import warnings

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import datasets
import peft
import tokenizers
import transformers
import trl
from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PrinterCallback, TrainerCallback
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer
from trl.experimental.cpo import CPOConfig, CPOTrainer
from trl.experimental.orpo import ORPOConfig, ORPOTrainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "tests", "fixtures", "models", "pref_tiny")
PREF = os.path.join(ROOT, "tests", "fixtures", "preference")
ADAPTER_DIR = os.path.join(PREF, "init_adapter")
TOK_SRC = os.path.join(ROOT, "tests", "fixtures", "text", "tok", "bytelevel_gpt2", "tokenizer.json")
MODEL_REL = "tests/fixtures/models/pref_tiny"

SEED_MODEL, SEED_ADAPTER, SEED_TRAIN = 3101, 3102, 42
LORA_R, LORA_ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR, BETA1, BETA2, EPS = 1e-2, 0.9, 0.999, 1e-8
TRUNC_MAX_LENGTH = 24  # dpo_truncated: cuts 2 of the 4 pairs_text rows, longer than every prompt

EOS, PAD = "<|im_end|>", "<|endoftext|>"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# ----------------------------------------------------------------------------------------------
# Datasets (short English strings; completions 3-20 tokens, prompts 5-30 tokens with this tokenizer)

PAIRS_TEXT = [
    {"prompt": "Question: What is the capital of France?",
     "chosen": " The capital is Paris.",
     "rejected": " France has no capital, it is run from a village."},
    {"prompt": "Translate to French: good morning",
     "chosen": " Bonjour.",
     "rejected": " Good night."},
    {"prompt": "Write a short greeting for a new neighbor who just moved in next door.",
     "chosen": " Welcome to the street! Let us know if you need help.",
     "rejected": " Go away."},
    {"prompt": "How many legs does a spider have?",
     "chosen": " Eight legs.",
     "rejected": " Six legs."},
]

PAIRS_CHAT = [
    {"prompt": [{"role": "user", "content": "What is the boiling point of water at sea level?"}],
     "chosen": [{"role": "assistant", "content": "It is one hundred degrees Celsius."}],
     "rejected": [{"role": "assistant", "content": "It is ten degrees."}]},
    {"prompt": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello."}],
     "chosen": [{"role": "assistant", "content": "Hello!"}],
     "rejected": [{"role": "assistant", "content": "No."}]},
    {"prompt": [{"role": "user", "content": "Name a primary color."}],
     "chosen": [{"role": "assistant", "content": "Red is a primary color."}],
     "rejected": [{"role": "assistant", "content": "Green, I think."}]},
    {"prompt": [{"role": "user", "content": "What is the opposite of hot?"}],
     "chosen": [{"role": "assistant", "content": "Cold."}],
     "rejected": [{"role": "assistant", "content": "The opposite of hot is warm."}]},
]


def _conv(user, answer):
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


PAIRS_IMPLICIT = [
    {"chosen": _conv("How many days are in a week?", "There are seven days in a week."),
     "rejected": _conv("How many days are in a week?", "Ten.")},
    {"chosen": _conv("What do cats drink?", "Cats drink water."),
     "rejected": _conv("What do cats drink?", "Cats drink oil from the car.")},
    {"chosen": _conv("Is ice cold?", "Yes, ice is cold."),
     "rejected": _conv("Is ice cold?", "No, ice is hot.")},
    {"chosen": _conv("Spell the word cat.", "C, A, T."),
     "rejected": _conv("Spell the word cat.", "D, O, G.")},
]

# 4 desirable / 2 undesirable: with equal counts the mean over rows equals the mean of the two group
# means, which would leave KTO's reduction untested; the long desirable completions make the KL
# estimate positive after the first step (it is negative, hence clamped to 0, at step 0).
KTO_ROWS = [
    {"prompt": "Is the sky blue on a clear day?", "completion": " Yes, on a clear day the sky looks blue to us.",
     "label": True},
    {"prompt": "Name a fruit that is yellow.", "completion": " A carrot.", "label": False},
    {"prompt": "What do bees make?", "completion": " Bees make honey and wax in their hive.", "label": True},
    {"prompt": "What is two plus two?", "completion": " Two plus two is four, of course.", "label": True},
    {"prompt": "What color is grass?", "completion": " Purple.", "label": False},
    {"prompt": "Which animal says moo?", "completion": " A cow says moo on the farm.", "label": True},
]

DATASETS = {"pairs_text": PAIRS_TEXT, "pairs_chat": PAIRS_CHAT, "pairs_implicit": PAIRS_IMPLICIT,
            "kto": KTO_ROWS}

# case -> (method, dataset, extra config)
CASES = {
    "dpo_sigmoid_text": ("dpo", "pairs_text", dict(beta=0.1, loss_type=["sigmoid"])),
    "dpo_sigmoid_chat": ("dpo", "pairs_chat", dict(beta=0.1, loss_type=["sigmoid"])),
    "dpo_sigmoid_implicit": ("dpo", "pairs_implicit", dict(beta=0.1, loss_type=["sigmoid"])),
    "dpo_ipo": ("dpo", "pairs_text", dict(beta=0.1, loss_type=["ipo"])),
    "dpo_hinge": ("dpo", "pairs_text", dict(beta=0.1, loss_type=["hinge"])),
    "dpo_robust": ("dpo", "pairs_text", dict(beta=0.1, loss_type=["robust"], label_smoothing=0.1)),
    "dpo_truncated": ("dpo", "pairs_text", dict(beta=0.1, loss_type=["sigmoid"],
                                                 max_length=TRUNC_MAX_LENGTH)),
    "orpo": ("orpo", "pairs_text", dict(beta=0.1)),
    "simpo": ("simpo", "pairs_text", dict(beta=2.0, loss_type="simpo", simpo_gamma=0.5, cpo_alpha=0.0)),
    "kto": ("kto", "kto", dict(beta=0.1, desirable_weight=1.0, undesirable_weight=1.0)),
}

# ----------------------------------------------------------------------------------------------
# Output helpers


def fmt_json(obj, indent=0):
    """JSON with sorted keys, lists of scalars on one line, floats as Python's repr (byte-stable)."""
    pad, pad1 = "  " * indent, "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = ["%s%s: %s" % (pad1, json.dumps(k), fmt_json(obj[k], indent + 1)) for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, (list, tuple)):
        if all(not isinstance(x, (dict, list, tuple)) for x in obj):
            return "[" + ", ".join(fmt_json(x) for x in obj) + "]"
        return "[\n" + ",\n".join(pad1 + fmt_json(x, indent + 1) for x in obj) + "\n" + pad + "]"
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return json.dumps(obj, ensure_ascii=False)
    if isinstance(obj, float):
        assert math.isfinite(obj), obj
        return repr(obj)
    raise TypeError(type(obj))


def write_text(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def generator_note():
    # One metadata key only: safetensors orders several keys at random (see make_parity_fixtures.py).
    return "tools/make_preference_fixtures.py; torch %s, transformers %s, peft %s, trl %s" % (
        torch.__version__.split("+")[0], transformers.__version__, peft.__version__, trl.__version__)


# ----------------------------------------------------------------------------------------------
# Tokenizer, model, adapter


def make_tokenizer():
    os.makedirs(MODEL_DIR, exist_ok=True)
    shutil.copyfile(TOK_SRC, os.path.join(MODEL_DIR, "tokenizer.json"))
    cfg = {"bos_token": None, "eos_token": EOS, "pad_token": PAD, "chat_template": CHAT_TEMPLATE,
           "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    write_text(os.path.join(MODEL_DIR, "tokenizer_config.json"), json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    raw = tokenizers.Tokenizer.from_file(os.path.join(MODEL_DIR, "tokenizer.json"))
    assert len(tok) == raw.get_vocab_size(with_added_tokens=True) == 3000, (len(tok), raw.get_vocab_size())
    assert tok.bos_token is None and tok.bos_token_id is None
    assert (tok.eos_token_id, tok.pad_token_id) == (2, 0), (tok.eos_token_id, tok.pad_token_id)
    s = "Question: What is two plus two? Four." + EOS
    assert tok(s)["input_ids"] == raw.encode(s).ids  # nothing prepended or appended
    assert tok(s)["input_ids"][-1] == 2
    return tok


def load_base():
    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, attn_implementation="eager", dtype=torch.float32)


def load_policy():
    return PeftModel.from_pretrained(load_base(), ADAPTER_DIR, is_trainable=True)


def make_model(tok):
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, initializer_range=0.2,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(SEED_MODEL)
    gen = torch.Generator().manual_seed(SEED_MODEL)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():  # N(0, initializer_range^2) for every matrix and embedding, norms 1
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(cfg.initializer_range * torch.randn(p.shape, generator=gen))
    model.eval()
    for f in ("model.safetensors", "config.json", "generation_config.json"):
        if os.path.exists(os.path.join(MODEL_DIR, f)):
            os.remove(os.path.join(MODEL_DIR, f))
    model.save_pretrained(MODEL_DIR, safe_serialization=True)
    path = os.path.join(MODEL_DIR, "config.json")
    with open(path) as f:
        saved = json.load(f)
    saved.pop("transformers_version", None)  # keeps regenerated files identical across versions
    write_text(path, json.dumps(saved, indent=2, sort_keys=True) + "\n")
    os.remove(os.path.join(MODEL_DIR, "generation_config.json"))  # not read by the engine

    ids = torch.tensor([tok("Reload check: the cat sat on the mat." + EOS)["input_ids"]])
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        again = load_base()(input_ids=ids).logits
    torch.testing.assert_close(again, ref, rtol=0, atol=0)
    assert float(ref.std()) > 0.5, float(ref.std())  # large init: log-probs differ between sequences


def lora_params(model):
    """(adapter key as saved by PEFT, parameter) for every trainable LoRA tensor, in a fixed order."""
    return [(n.replace(".default.", "."), p) for n, p in model.named_parameters()
            if (".lora_A." in n or ".lora_B." in n) and ".default." in n]


def make_adapter(tok):
    base = load_base()
    torch.manual_seed(SEED_ADAPTER)  # PEFT's kaiming-uniform init of lora_A draws from the global RNG
    lcfg = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                      task_type="CAUSAL_LM")
    pm = get_peft_model(base, lcfg)
    gen = torch.Generator().manual_seed(SEED_ADAPTER)
    with torch.no_grad():
        for key, p in lora_params(pm):
            if ".lora_B." in key:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    pm.eval()
    shutil.rmtree(ADAPTER_DIR, ignore_errors=True)
    pm.save_pretrained(ADAPTER_DIR, safe_serialization=True)
    path = os.path.join(ADAPTER_DIR, "adapter_config.json")
    with open(path) as f:
        acfg = json.load(f)
    acfg["base_model_name_or_path"] = MODEL_REL
    acfg["target_modules"] = sorted(acfg["target_modules"])  # PEFT stores a set: fix the order
    write_text(path, json.dumps(acfg, indent=2, sort_keys=True) + "\n")
    readme = os.path.join(ADAPTER_DIR, "README.md")  # PEFT's model-card boilerplate
    if os.path.exists(readme):
        os.remove(readme)

    saved = load_file(os.path.join(ADAPTER_DIR, "adapter_model.safetensors"))
    params = lora_params(pm)
    assert len(params) == 28 and sorted(saved) == sorted(k for k, _ in params)
    for k, p in params:
        assert torch.equal(saved[k], p.detach()), k
    ids = torch.tensor([tok("Adapter check: a dog ran in the park." + EOS)["input_ids"]])
    with torch.no_grad():
        ref = pm(input_ids=ids).logits
        fresh = load_policy()
        fresh.eval()
        torch.testing.assert_close(fresh(input_ids=ids).logits, ref, rtol=0, atol=0)
        with fresh.disable_adapter():
            base_logits = fresh(input_ids=ids).logits
    assert float((base_logits - ref).abs().max()) > 0.1  # policy differs from the reference


def write_datasets():
    for name, rows in DATASETS.items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        write_text(os.path.join(PREF, name + ".jsonl"), text)


def read_jsonl(name):
    with open(os.path.join(PREF, name + ".jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------------------------
# Independent per-sequence computation (plain transformers, one unpadded sequence at a time)


def seq_stats(model, ids, n_prompt):
    """Per predicted position t = 1..L-1 (token ids[t] given ids[:t]): log-prob, entropy, mean logit, is-argmax.

    Returns a dict of 1-D tensors of length L-1 and the boolean completion mask (t >= n_prompt)."""
    x = torch.tensor([ids])
    logits = model(input_ids=x).logits[0, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    tgt = x[0, 1:]
    lp = logp.gather(1, tgt[:, None])[:, 0]
    with torch.no_grad():
        ent = -(logp.exp() * logp).sum(-1)
        mean_logit = logits.mean(-1)
        top1 = logits.argmax(-1) == tgt
    comp = torch.arange(1, len(ids)) >= n_prompt
    return {"lp": lp, "ent": ent, "mean_logit": mean_logit, "top1": top1, "comp": comp}


def comp_sum(s):
    return (s["lp"] * s["comp"]).sum()


def fclose(a, b, rtol=2e-5, atol=2e-6, what=""):
    assert abs(float(a) - float(b)) <= atol + rtol * abs(float(b)), (what, float(a), float(b))


# ----------------------------------------------------------------------------------------------
# Running TRL


class Recorder(TrainerCallback):
    def __init__(self):
        self.logs, self.grads, self.after1, self.before = [], None, None, None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        if state.global_step == 0:
            self.grads = {k: p.grad.detach().clone() for k, p in lora_params(model)}
            self.before = {k: p.detach().clone() for k, p in lora_params(model)}

    def on_optimizer_step(self, args, state, control, model=None, **kw):
        if state.global_step == 0:
            self.after1 = {k: p.detach().clone() for k, p in lora_params(model)}

    def on_log(self, args, state, control, logs=None, **kw):
        if logs is not None and "loss" in logs:
            self.logs.append(dict(logs))


def common_args(out_dir, n_rows):
    return dict(output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, report_to="none", seed=SEED_TRAIN,
                gradient_checkpointing=False, per_device_train_batch_size=n_rows,
                gradient_accumulation_steps=1, max_grad_norm=1e9, learning_rate=LR,
                lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, optim="adamw_torch",
                adam_beta1=BETA1, adam_beta2=BETA2, adam_epsilon=EPS, dataloader_drop_last=False,
                logging_steps=1, max_steps=2, save_strategy="no", disable_tqdm=True,
                train_sampling_strategy="sequential", disable_dropout=True)


def run_trl(method, rows, extra, tok):
    """Train 2 steps with TRL's trainer; returns the trainer, recorder, recorded losses and batches."""
    out_dir = tempfile.mkdtemp(prefix="pref_fixture_")
    policy = load_policy()
    kw = common_args(out_dir, len(rows))
    kw.update(extra)
    ds = Dataset.from_list(rows)
    # DPO / KTO get an explicit reference model, the base: with ref_model=None and a PeftModel that
    # already has an adapter, TRL 1.16 would use a frozen copy of the initial adapter as the reference
    # (dpo_trainer.py 666-694), making every step-0 log-ratio 0. Base = policy with adapters off.
    if method == "dpo":
        trainer = DPOTrainer(model=policy, ref_model=load_base(), args=DPOConfig(**kw), train_dataset=ds,
                             processing_class=tok)
    elif method == "kto":
        trainer = KTOTrainer(model=policy, ref_model=load_base(), args=KTOConfig(**kw), train_dataset=ds,
                             processing_class=tok)
    elif method == "orpo":
        trainer = ORPOTrainer(model=policy, args=ORPOConfig(**kw), train_dataset=ds, processing_class=tok)
    elif method == "simpo":
        trainer = CPOTrainer(model=policy, args=CPOConfig(**kw), train_dataset=ds, processing_class=tok)
    else:
        raise ValueError(method)
    rec = Recorder()
    trainer.add_callback(rec)
    trainer.remove_callback(PrinterCallback)
    losses, batches = [], []
    orig = trainer.compute_loss

    def compute_loss(model, inputs, return_outputs=False, num_items_in_batch=None):
        batches.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in inputs.items()})
        loss = orig(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)
        losses.append(float((loss[0] if return_outputs else loss).detach()))
        return loss

    trainer.compute_loss = compute_loss
    trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)
    assert len(losses) == 2 and len(rec.logs) == 2, (losses, rec.logs)
    assert rec.grads is not None and rec.after1 is not None
    for s in range(2):
        assert rec.logs[s]["loss"] == losses[s], (rec.logs[s]["loss"], losses[s])
        assert rec.logs[s]["learning_rate"] == LR
    return trainer, rec, losses, batches


def unpad(row_ids, mask):
    return [int(t) for t, m in zip(row_ids.tolist(), mask.tolist()) if m]


# ----------------------------------------------------------------------------------------------
# Per-method: token ids from TRL, independent recomputation, comparison


def pair_examples_dpo(trainer, batch, max_length):
    """prompt/chosen/rejected ids as TRL tokenized them, and the sequences the model saw (after truncation)."""
    ds = trainer.train_dataset
    n = len(ds)
    ex = []
    for i in range(n):
        p, c, r = list(ds[i]["prompt_ids"]), list(ds[i]["chosen_ids"]), list(ds[i]["rejected_ids"])
        e = {"prompt_ids": p, "chosen_ids": c, "rejected_ids": r}
        for side, comp, j in (("chosen", c, i), ("rejected", r, n + i)):
            seq = (p + comp)[:max_length] if max_length is not None else p + comp
            am, cm = batch["attention_mask"][j], batch["completion_mask"][j]
            assert unpad(batch["input_ids"][j], am) == seq, (i, side)
            assert unpad(cm, am) == [0] * len(p) + [1] * (len(seq) - len(p)), (i, side)
            e[side + "_input_ids"] = seq
            e[side + "_n_completion"] = len(seq) - len(p)
        ex.append(e)
    return ex


def pair_examples_cpo(trainer, batch):
    """ORPO / CPO tokenization: prompt part = positions where the row's labels are -100."""
    ds = trainer.train_dataset
    ex = []
    for i in range(len(ds)):
        e = {}
        for side in ("chosen", "rejected"):
            ids, labels = list(ds[i][side + "_input_ids"]), list(ds[i][side + "_labels"])
            n_p = sum(1 for x in labels if x == -100)
            assert labels[n_p:] == ids[n_p:] and all(x == -100 for x in labels[:n_p])
            am = batch[side + "_attention_mask"][i]
            assert unpad(batch[side + "_input_ids"][i], am) == ids
            if "prompt_ids" in e:
                assert e["prompt_ids"] == ids[:n_p]
            e["prompt_ids"] = ids[:n_p]
            e[side + "_ids"] = ids[n_p:]
            e[side + "_input_ids"] = ids
            e[side + "_n_completion"] = len(ids) - n_p
        assert e["prompt_ids"] == list(ds[i]["prompt_input_ids"])
        ex.append(e)
    return ex


def kto_examples(trainer, batch):
    ds = trainer.train_dataset
    n = len(ds)
    ex = []
    for i in range(n):
        p, c = list(ds[i]["prompt_ids"]), list(ds[i]["completion_ids"])
        kl = list(ds[i]["KL_completion_ids"])
        src = (i - 1) % n
        assert kl == list(ds[src]["completion_ids"]), i  # rotation by +1 within the batch
        assert unpad(batch["input_ids"][i], batch["attention_mask"][i]) == p + c
        assert unpad(batch["KL_input_ids"][i], batch["KL_attention_mask"][i]) == p + kl
        assert bool(batch["label"][i]) == bool(ds[i]["label"])
        ex.append({"prompt_ids": p, "completion_ids": c, "label": bool(ds[i]["label"]),
                   "kl_completion_ids": kl, "kl_completion_from": src,
                   "input_ids": p + c, "kl_input_ids": p + kl, "n_completion": len(c)})
    return ex


def dpo_compute(policy, ref, ex, cfg):
    """Loss and logged metrics of DPOTrainer._compute_loss, from unpadded per-sequence forwards."""
    beta, lt, ls = cfg["beta"], cfg["loss_type"][0], cfg.get("label_smoothing", 0.0)
    n_p = [len(e["prompt_ids"]) for e in ex]
    pol = {s: [seq_stats(policy, e[s + "_input_ids"], k) for e, k in zip(ex, n_p)] for s in ("chosen", "rejected")}
    with torch.no_grad(), ref.disable_adapter():
        refs = {s: [seq_stats(ref, e[s + "_input_ids"], k) for e, k in zip(ex, n_p)] for s in ("chosen", "rejected")}
    pc = torch.stack([comp_sum(s) for s in pol["chosen"]])
    pr = torch.stack([comp_sum(s) for s in pol["rejected"]])
    rc = torch.stack([comp_sum(s) for s in refs["chosen"]])
    rr = torch.stack([comp_sum(s) for s in refs["rejected"]])
    cl, rl = pc - rc, pr - rr
    d = cl - rl
    if lt == "sigmoid":
        per = -F.logsigmoid(beta * d)
    elif lt == "hinge":
        per = torch.relu(1 - beta * d)
    elif lt == "ipo":
        nc = torch.tensor([float(e["chosen_n_completion"]) for e in ex])
        nr = torch.tensor([float(e["rejected_n_completion"]) for e in ex])
        per = (cl / nc - rl / nr - 1 / (2 * beta)) ** 2
    elif lt == "robust":
        per = (-(1 - ls) * F.logsigmoid(beta * d) + ls * F.logsigmoid(-beta * d)) / (1 - 2 * ls)
    else:
        raise ValueError(lt)
    loss = per.mean()
    allc = pol["chosen"] + pol["rejected"]
    n_comp = sum(int(s["comp"].sum()) for s in allc)
    n_ch = sum(int(s["comp"].sum()) for s in pol["chosen"])
    n_rj = sum(int(s["comp"].sum()) for s in pol["rejected"])
    m = {
        "rewards/chosen": float((beta * cl).mean()), "rewards/rejected": float((beta * rl).mean()),
        "rewards/accuracies": float((beta * cl > beta * rl).float().mean()),
        "rewards/margins": float((beta * cl - beta * rl).mean()),
        "logps/chosen": float(pc.mean()), "logps/rejected": float(pr.mean()),
        "entropy": sum(float((s["ent"] * s["comp"]).sum()) for s in allc) / n_comp,
        "logits/chosen": sum(float((s["mean_logit"] * s["comp"]).sum()) for s in pol["chosen"]) / n_ch,
        "logits/rejected": sum(float((s["mean_logit"] * s["comp"]).sum()) for s in pol["rejected"]) / n_rj,
        "mean_token_accuracy": sum(int((s["top1"] & s["comp"]).sum()) for s in pol["chosen"]) / n_ch,
        "num_tokens": float(sum(len(e["chosen_input_ids"]) + len(e["rejected_input_ids"]) for e in ex)),
    }  # num_tokens is cumulative over steps: the caller scales it
    logps = {"chosen_logps": pc, "rejected_logps": pr, "ref_chosen_logps": rc, "ref_rejected_logps": rr}
    return loss, m, logps


def cpo_compute(policy, ex, cfg, method):
    """ORPOTrainer / CPOTrainer(simpo) loss and metrics from unpadded per-sequence forwards."""
    beta = cfg["beta"]
    n_p = [len(e["prompt_ids"]) for e in ex]
    pol = {s: [seq_stats(policy, e[s + "_input_ids"], k) for e, k in zip(ex, n_p)] for s in ("chosen", "rejected")}
    sc = torch.stack([comp_sum(s) for s in pol["chosen"]])
    sr = torch.stack([comp_sum(s) for s in pol["rejected"]])
    nc = torch.tensor([float(e["chosen_n_completion"]) for e in ex])
    nr = torch.tensor([float(e["rejected_n_completion"]) for e in ex])
    ac, ar = sc / nc, sr / nr  # average log-prob per completion token
    all_c = torch.stack([s["lp"].sum() for s in pol["chosen"]])  # every predicted token, prompt included
    n_all = sum(len(e["chosen_input_ids"]) - 1 for e in ex)
    m = {"rewards/chosen": float((beta * ac).mean()), "rewards/rejected": float((beta * ar).mean()),
         "rewards/accuracies": float((beta * ac > beta * ar).float().mean()),
         "rewards/margins": float((beta * ac - beta * ar).mean()),
         "logps/chosen": float(ac.mean()), "logps/rejected": float(ar.mean())}
    if method == "orpo":
        nll = -all_c.sum() / n_all

        def log1mexp(x):
            return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))

        log_odds = (ac - ar) - (log1mexp(ac) - log1mexp(ar))
        ratio = F.logsigmoid(log_odds)
        loss = nll - (beta * ratio).mean()
        m.update({"nll_loss": float(nll), "log_odds_ratio": float(ratio.mean()),
                  "log_odds_chosen": float(log_odds.mean())})
    else:
        assert cfg["cpo_alpha"] == 0.0 and cfg.get("label_smoothing", 0.0) == 0.0
        logits = ac - ar - cfg["simpo_gamma"] / beta
        loss = (-F.logsigmoid(beta * logits)).mean()
        m["nll_loss"] = 0.0
    logps = {"chosen_logps": sc, "rejected_logps": sr, "chosen_all_logps": all_c.detach()}
    return loss, m, logps


def kto_compute(policy, ref, ex, cfg):
    beta, dw, uw = cfg["beta"], cfg["desirable_weight"], cfg["undesirable_weight"]
    n_p = [len(e["prompt_ids"]) for e in ex]
    pol = [seq_stats(policy, e["input_ids"], k) for e, k in zip(ex, n_p)]
    with torch.no_grad():
        pol_kl = [seq_stats(policy, e["kl_input_ids"], k) for e, k in zip(ex, n_p)]
        with ref.disable_adapter():
            refs = [seq_stats(ref, e["input_ids"], k) for e, k in zip(ex, n_p)]
            ref_kl = [seq_stats(ref, e["kl_input_ids"], k) for e, k in zip(ex, n_p)]
    pl = torch.stack([comp_sum(s) for s in pol])
    rl = torch.stack([comp_sum(s) for s in refs])
    kpl = torch.stack([comp_sum(s) for s in pol_kl])
    krl = torch.stack([comp_sum(s) for s in ref_kl])
    kl_raw = float((kpl - krl).mean())
    kl = max(kl_raw, 0.0)
    lab = torch.tensor([e["label"] for e in ex])
    lr_ = pl - rl
    losses = torch.where(lab, dw * (1 - torch.sigmoid(beta * (lr_ - kl))),
                         uw * (1 - torch.sigmoid(beta * (kl - lr_))))
    loss = losses.mean()
    ch, rj = lab, ~lab
    nch, nrj = int(ch.sum()), int(rj.sum())
    m = {"kl": kl,
         "rewards/chosen": float((beta * lr_)[ch].sum()) / nch, "rewards/rejected": float((beta * lr_)[rj].sum()) / nrj,
         "logps/chosen": float(pl[ch].sum()) / nch, "logps/rejected": float(pl[rj].sum()) / nrj,
         "entropy": sum(float((s["ent"] * s["comp"]).sum()) for s in pol) / sum(int(s["comp"].sum()) for s in pol),
         "logits/chosen": sum(float((s["mean_logit"] * s["comp"]).sum()) for s, c in zip(pol, ch) if c)
         / sum(int(s["comp"].sum()) for s, c in zip(pol, ch) if c),
         "logits/rejected": sum(float((s["mean_logit"] * s["comp"]).sum()) for s, c in zip(pol, rj) if c)
         / sum(int(s["comp"].sum()) for s, c in zip(pol, rj) if c),
         "num_tokens": float(sum(len(e["input_ids"]) for e in ex))}  # cumulative: the caller scales it
    m["rewards/margins"] = m["rewards/chosen"] - m["rewards/rejected"]
    logps = {"policy_logps": pl, "ref_logps": rl, "kl_policy_logps": kpl, "kl_ref_logps": krl}
    return loss, m, logps, kl_raw


# Metrics whose value depends on the padded batch layout (mean over every logit of the padded
# (rows, width, vocab) tensor in ORPO / CPO): recorded, not recomputed.
PADDING_DEPENDENT = {"orpo": {"logits/chosen", "logits/rejected"}, "simpo": {"logits/chosen", "logits/rejected"}}
NOT_METRICS = {"epoch"}


def adam_replay(before, grads):
    """One torch.optim.AdamW step from zero moments (k = 1, weight_decay 0)."""
    out = {}
    for k, p in before.items():
        g = grads[k]
        m = (1 - BETA1) * g
        v = (1 - BETA2) * g * g
        bc1, bc2 = 1 - BETA1, 1 - BETA2
        out[k] = p - (LR / bc1) * m / (v.sqrt() / math.sqrt(bc2) + EPS)
    return out


def check_lengths(name, method, ex):
    """Dataset sizes as documented (prompts 5-30 tokens, completions 3-20), and dpo_truncated's cut."""
    sides = ("completion",) if method == "kto" else ("chosen", "rejected")
    for e in ex:
        assert 5 <= len(e["prompt_ids"]) <= 30, (name, len(e["prompt_ids"]))
        for side in sides:
            assert 3 <= len(e[side + "_ids"]) <= 20, (name, side, len(e[side + "_ids"]))
    if name == "dpo_truncated":
        cut = [any(len(e[s + "_input_ids"]) < len(e["prompt_ids"]) + len(e[s + "_ids"]) for s in sides)
               for e in ex]
        assert sum(cut) == 2, cut
        assert all(len(e["prompt_ids"]) < TRUNC_MAX_LENGTH for e in ex)
        # one row loses only its rejected completion's tail, the other both tails
        assert sorted(sum(len(e[s + "_input_ids"]) == TRUNC_MAX_LENGTH for s in sides) for e in ex) == [0, 0, 1, 2]


def run_case(name, tok):
    method, dname, extra = CASES[name]
    rows = read_jsonl(dname)
    trainer, rec, losses, batches = run_trl(method, rows, extra, tok)
    args = trainer.args
    for b in batches[1:]:  # both steps saw the same single batch
        for k, v in batches[0].items():
            assert (torch.equal(v, b[k]) if torch.is_tensor(v) else v == b[k]), k
    batch = batches[0]

    if method == "dpo":
        max_length = args.max_length
        ex = pair_examples_dpo(trainer, batch, max_length)
    elif method == "kto":
        ex = kto_examples(trainer, batch)
    else:
        ex = pair_examples_cpo(trainer, batch)

    cfg = {"beta": float(args.beta), "learning_rate": float(args.learning_rate),
           "adam_beta1": float(args.adam_beta1), "adam_beta2": float(args.adam_beta2),
           "adam_epsilon": float(args.adam_epsilon), "weight_decay": float(args.weight_decay),
           "max_grad_norm": float(args.max_grad_norm), "lr_scheduler_type": str(args.lr_scheduler_type.value),
           "optim": str(args.optim.value), "per_device_train_batch_size": int(args.per_device_train_batch_size),
           "gradient_accumulation_steps": int(args.gradient_accumulation_steps),
           "train_sampling_strategy": str(args.train_sampling_strategy), "seed": int(args.seed),
           "max_length": args.max_length}
    if method == "dpo":
        cfg.update(loss_type=list(args.loss_type), label_smoothing=float(args.label_smoothing),
                   truncation_mode=args.truncation_mode, reference="base model (adapters off)")
    elif method == "kto":
        cfg.update(loss_type=args.loss_type, desirable_weight=float(args.desirable_weight),
                   undesirable_weight=float(args.undesirable_weight), reference="base model (adapters off)")
    elif method == "simpo":
        cfg.update(loss_type=args.loss_type, simpo_gamma=float(args.simpo_gamma), cpo_alpha=float(args.cpo_alpha),
                   label_smoothing=float(args.label_smoothing), reference=None)
    else:
        cfg.update(reference=None)

    grads, after1, before = rec.grads, rec.after1, rec.before
    init = load_file(os.path.join(ADAPTER_DIR, "adapter_model.safetensors"))
    for k in init:
        assert torch.equal(before[k], init[k]), k  # TRL started from the committed adapter
        assert float(grads[k].abs().max()) > 0, k
        assert not torch.equal(after1[k], before[k]), k
    replay = adam_replay(before, grads)
    for k in init:
        torch.testing.assert_close(after1[k], replay[k], rtol=0, atol=1e-6)

    steps = {}
    for s in range(2):
        policy = load_policy()
        if s == 1:
            with torch.no_grad():
                for k, p in lora_params(policy):
                    p.copy_(after1[k])
        policy.eval()
        kl_raw = None
        if method == "dpo":
            loss, m, logps = dpo_compute(policy, policy, ex, cfg)
        elif method == "kto":
            loss, m, logps, kl_raw = kto_compute(policy, policy, ex, cfg)
        else:
            loss, m, logps = cpo_compute(policy, ex, cfg, method)
        trl_logs = rec.logs[s]
        if "num_tokens" in m:  # tokens (attention_mask ones) seen so far, this step included
            m["num_tokens"] *= s + 1
        fclose(loss, losses[s], what=(name, s, "loss"))
        for k, v in m.items():
            assert k in trl_logs, (name, k, sorted(trl_logs))
            fclose(v, trl_logs[k], what=(name, s, k))
        unchecked = set(trl_logs) - set(m) - NOT_METRICS - {"loss", "grad_norm", "learning_rate"}
        assert unchecked == PADDING_DEPENDENT.get(method, set()), (name, unchecked)
        if s == 0:  # the gradient of the recomputed loss is TRL's gradient
            loss.backward()
            mine = {k: p.grad for k, p in lora_params(policy)}
            for k in init:
                torch.testing.assert_close(mine[k], grads[k], rtol=1e-4, atol=1e-6)
            gnorm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
            fclose(gnorm, trl_logs["grad_norm"], rtol=1e-5, what=(name, "grad_norm"))
        step = {"loss": losses[s],
                "metrics": {k: float(v) for k, v in trl_logs.items() if k not in NOT_METRICS},
                "logps": {k: [float(x) for x in v.detach()] for k, v in logps.items()}}
        if kl_raw is not None:
            step["kl_unclamped"] = kl_raw
        steps["step%d" % s] = step

    # Sanity of what the fixtures exercise
    p0 = steps["step0"]["logps"]
    if method in ("dpo", "kto"):
        pk, rk = (("chosen_logps", "ref_chosen_logps") if method == "dpo" else ("policy_logps", "ref_logps"))
        assert all(abs(a - b) > 1e-3 for a, b in zip(p0[pk], p0[rk])), (p0[pk], p0[rk])
    if method == "dpo" and cfg["loss_type"] == ["sigmoid"]:
        assert abs(losses[0] - math.log(2)) > 1e-3, losses[0]
    if method == "kto":
        # step 0: the estimate is negative and clamped to 0; step 1: positive, so it enters the loss
        assert steps["step0"]["kl_unclamped"] < 0 and steps["step0"]["metrics"]["kl"] == 0.0, steps["step0"]
        assert steps["step1"]["kl_unclamped"] > 0.1, steps["step1"]["kl_unclamped"]
    assert losses[0] != losses[1]
    check_lengths(name, method, ex)

    n_tiny = sum(int((g.abs() < 1e-6).sum()) for g in grads.values())
    doc = {"case": name, "method": method, "trainer": type(trainer).__name__, "dataset": dname + ".jsonl",
           "config": cfg, "examples": ex, "step0": steps["step0"], "step1": steps["step1"],
           "n_grad_below_1e-6": n_tiny}
    write_text(os.path.join(PREF, name + ".json"), fmt_json(doc) + "\n")
    tensors = {}
    for k in sorted(grads):
        tensors["grad." + k] = grads[k].contiguous()
        tensors["after1." + k] = after1[k].contiguous()
    save_file(tensors, os.path.join(PREF, name + ".safetensors"), metadata={"generator": generator_note()})
    print("%-22s step0 loss %.7f step1 loss %.7f  grad_norm %.5f  tiny grads %d" % (
        name, losses[0], losses[1], rec.logs[0]["grad_norm"], n_tiny))
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--case", help="one case (default: all): " + ", ".join(CASES))
    args = ap.parse_args()
    if args.case and args.case not in CASES:
        sys.exit("unknown case %r; expected one of %s" % (args.case, ", ".join(CASES)))
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    datasets.disable_progress_bars()
    datasets.disable_caching()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("trl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    os.makedirs(PREF, exist_ok=True)

    tok = make_tokenizer()
    make_model(tok)
    make_adapter(tok)
    write_datasets()
    for name in CASES:
        if args.case in (None, name):
            run_case(name, tok)


if __name__ == "__main__":
    main()
