#!/usr/bin/env python3
# Demo data (examples/data/*.jsonl from Debian's fortune files) and the pretrained tiny_byte model.
"""Build the data and base model of the examples/tiny.yaml demo.

    apt-get install -y fortunes-min fortunes        # the text source (BSD licensed)
    /opt/fixenv/bin/python tools/make_demo_data.py               # data + pretrain + fixture + check
    /opt/fixenv/bin/python tools/make_demo_data.py --data-only   # only examples/data/*.jsonl

Two slices of the same package, in two styles, so that fine-tuning has something to learn:
  - pretraining (base model): every fortune file except `fortunes` and `wisdom`, each quotation
    flattened into one line of running prose (whitespace collapsed, no line breaks, no tabs);
  - fine-tuning (examples/data): quotations from `fortunes` (fortunes-min) and `wisdom` in their
    original layout: short lines and tab-indented "-- Author" attributions, which the base model
    has never seen.
Tokens are bytes (ids 0..255), BOS = 256, EOS = 257: the engine's byte-level tokenizer.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORTUNE_DIR = "/usr/share/games/fortunes"
DATA_DIR = os.path.join(ROOT, "examples", "data")
MODEL_DIR = os.path.join(ROOT, "tests", "fixtures", "models", "tiny_byte")
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "parity", "tiny_byte.safetensors")

FINETUNE_FILES = ["fortunes", "wisdom"]
# ascii art is not language; the rest are left out only to keep the demo text inoffensive.
EXCLUDED = {"art", "ascii-art", "ethnic", "men-women", "drugs", "politics"}
MAX_ROW_BYTES = 320          # every row fits a 384-token window with BOS/EOS
N_TRAIN, N_EVAL = 400, 40
BOS, EOS, VOCAB = 256, 257, 258
SEQ, BATCH, STEPS, PEAK_LR, WARMUP = 128, 16, 600, 4e-3, 30
SEED = 2024


def read_fortunes(name):
    path = os.path.join(FORTUNE_DIR, name)
    if not os.path.exists(path):
        sys.exit("%s missing: run `apt-get install -y fortunes-min fortunes` first" % path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for entry in re.split(r"\n%\n", text):
        lines = [ln.rstrip() for ln in entry.strip("\n").split("\n")]
        entry = "\n".join(lines).strip("\n")
        if entry and entry != "%":
            out.append(entry)
    return out


def flatten(entry):
    """Prose style of the pretraining slice: one line, single spaces."""
    return " ".join(entry.split())


def make_data():
    rows = []
    for name in FINETUNE_FILES:
        rows += [e for e in read_fortunes(name) if len(e.encode("utf-8")) <= MAX_ROW_BYTES]
    rows = sorted(set(rows))                   # stable order before the seeded shuffle
    random.Random(SEED).shuffle(rows)
    assert len(rows) >= N_TRAIN + N_EVAL, len(rows)
    train, evals = rows[:N_TRAIN], rows[N_TRAIN:N_TRAIN + N_EVAL]
    os.makedirs(DATA_DIR, exist_ok=True)
    for fname, part in (("tiny_train.jsonl", train), ("tiny_eval.jsonl", evals)):
        with open(os.path.join(DATA_DIR, fname), "w", encoding="utf-8") as f:
            for text in part:
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    pretrain = []
    for name in sorted(os.listdir(FORTUNE_DIR)):
        path = os.path.join(FORTUNE_DIR, name)
        if (name.endswith((".dat", ".u8")) or os.path.islink(path) or name in EXCLUDED
                or name in FINETUNE_FILES):
            continue
        pretrain += [flatten(e) for e in read_fortunes(name)]
    print("data: %d train rows, %d eval rows (of %d candidates); pretraining: %d quotations, %d bytes"
          % (len(train), len(evals), len(rows), len(pretrain), sum(len(p) for p in pretrain)))
    return train, evals, pretrain


def encode(text):
    return [BOS] + list(text.encode("utf-8")) + [EOS]


def tiny_config():
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=344,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=False)


def pretrain(docs):
    """Full training of the tiny model on random 128-token windows of the packed prose stream."""
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(SEED)
    stream = torch.tensor([t for d in docs for t in encode(d)], dtype=torch.long)
    model = AutoModelForCausalLM.from_config(tiny_config(), attn_implementation="sdpa",
                                             dtype=torch.float32)
    print("tiny_byte: %d parameters" % sum(p.numel() for p in model.parameters()))
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_at(step):  # linear warmup, cosine to 10% of peak
        if step < WARMUP:
            return PEAK_LR * (step + 1) / WARMUP
        p = (step - WARMUP) / max(1, STEPS - WARMUP)
        return PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    gen = torch.Generator().manual_seed(SEED)
    model.train()
    t0 = time.time()
    for step in range(STEPS):
        starts = torch.randint(0, len(stream) - SEQ - 1, (BATCH,), generator=gen)
        batch = torch.stack([stream[s:s + SEQ] for s in starts.tolist()])  # (B,T)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == STEPS - 1:
            print("  pretrain step %4d loss %.4f (%.0fs)" % (step, float(loss.detach()), time.time() - t0))
    model.eval()
    return model


def save_model(model):
    shutil.rmtree(MODEL_DIR, ignore_errors=True)
    model.save_pretrained(MODEL_DIR, safe_serialization=True)
    path = os.path.join(MODEL_DIR, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    # Hub-style keys (transformers 4.x spelling), as for the parity models.
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["rope_scaling"] = None
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg.pop("transformers_version", None)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    gen_cfg = os.path.join(MODEL_DIR, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)


def load_model():
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, attn_implementation="eager",
                                                 dtype=torch.float32)
    model.eval()
    return model


def row_batches(rows, batch, gen):
    """Right-padded (B,T) batches of whole rows; pad labels are -100 (the engine packs instead)."""
    import torch
    order = torch.randperm(len(rows), generator=gen).tolist()
    for i in range(0, len(order), batch):
        enc = [encode(rows[j]) for j in order[i:i + batch]]
        t = max(len(e) for e in enc)
        ids = torch.full((len(enc), t), EOS, dtype=torch.long)
        labels = torch.full((len(enc), t), -100, dtype=torch.long)
        mask = torch.zeros((len(enc), t), dtype=torch.long)
        for b, e in enumerate(enc):
            ids[b, :len(e)] = torch.tensor(e)
            labels[b, :len(e)] = torch.tensor(e)
            mask[b, :len(e)] = 1
        yield ids, labels, mask


def mean_loss(model, rows):
    """Token-weighted mean next-byte loss over rows (nats per byte)."""
    import torch
    tot, n = 0.0, 0
    with torch.no_grad():
        for ids, labels, mask in row_batches(rows, 20, torch.Generator().manual_seed(0)):
            k = int((labels[:, 1:] != -100).sum())
            tot += float(model(input_ids=ids, attention_mask=mask, labels=labels).loss) * k
            n += k
    return tot / n


def write_fixture(model, evals):
    """Logits and loss of tiny_byte on the first eval row, for the engine's load+forward check."""
    import torch
    from safetensors.torch import save_file
    ids = torch.tensor([encode(evals[0])[:64]])  # (1,T)
    with torch.no_grad():
        res = model(input_ids=ids, labels=ids)
    save_file({"input_ids": ids.to(torch.int32), "logits": res.logits.contiguous(),
               "loss": res.loss.reshape(1)}, FIXTURE,
              metadata={"generator": "tools/make_demo_data.py; first row of "
                                     "examples/data/tiny_eval.jsonl, BOS + bytes, first 64 tokens"})
    print("tiny_byte fixture: T=%d loss %.4f" % (ids.shape[1], float(res.loss)))


def sample(model, prompt, n=120):
    import torch
    ids = torch.tensor([encode(prompt)[:-1]])
    torch.manual_seed(SEED)
    with torch.no_grad():  # mild sampling: greedy decoding of a tiny byte model just loops
        out = model.generate(ids, max_new_tokens=n, do_sample=True, temperature=0.7, top_k=20,
                             eos_token_id=EOS, pad_token_id=EOS)
    return bytes(t for t in out[0, ids.shape[1]:].tolist() if t < 256).decode("utf-8", "replace")


def check_finetune(model, train, evals, epochs=3):
    """A LoRA run like the demo's, to show the demo's loss falls; prints, writes nothing."""
    import torch
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(SEED)
    pm = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, bias="none",
                                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"],
                                          task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=2e-3,
                            weight_decay=0.0)
    print("finetune check: eval loss before %.4f, train loss before %.4f"
          % (mean_loss(pm, evals), mean_loss(pm, train)))
    gen = torch.Generator().manual_seed(SEED)
    step = 0
    for ep in range(epochs):
        pm.train()
        for ids, labels, mask in row_batches(train, 8, gen):
            loss = pm(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 25 == 0:
                print("  lora step %3d loss %.4f" % (step, float(loss.detach())))
            step += 1
        pm.eval()
        print("  epoch %d: eval loss %.4f" % (ep + 1, mean_loss(pm, evals)))
    print("  sample after LoRA:", repr(sample(pm, "A ")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data-only", action="store_true", help="write examples/data only")
    ap.add_argument("--skip-pretrain", action="store_true",
                    help="reuse tests/fixtures/models/tiny_byte (fixture + check only)")
    ap.add_argument("--no-check", action="store_true", help="skip the LoRA fine-tune check")
    args = ap.parse_args()
    train, evals, docs = make_data()
    if args.data_only:
        return
    import torch
    torch.set_num_threads(2)
    if not args.skip_pretrain:
        save_model(pretrain(docs))
    model = load_model()
    write_fixture(model, evals)
    print("base eval loss %.4f nats/byte; sample: %r" % (mean_loss(model, evals),
                                                         sample(model, "A ")))
    if not args.no_check:
        check_finetune(model, train, evals)


if __name__ == "__main__":
    main()
