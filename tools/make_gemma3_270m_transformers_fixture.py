#!/usr/bin/env python3
"""Logits of the real Gemma 3 270M GGUF as transformers computes them (fp32, eager attention).

    /opt/fixenv/bin/python tools/make_gemma3_270m_transformers_fixture.py [PATH.gguf]

transformers reads gemma-3-270m-q4_k_m.gguf (tests/fetch_real_models.sh; see
tools/make_gemma3_270m_fixtures.py) with gguf_file=, dequantizing every tensor with gguf-py, and runs
Gemma3ForCausalLM in float32 on a 520-token sequence: BOS and the ids llama.cpp gave the first
corpus lines (tests/fixtures/gguf/gemma3_270m_llama_cpp.json), repeated from the start once they
run out, so the last positions attend past
the sliding window of 512 keys on the local layers. Writes
tests/fixtures/gguf/gemma3_270m_transformers.json: the ids and, at positions 0-19 and 500-519, the
top-8 ids and logits and the logsumexp. tests/model/test_real_gemma3.cpp runs the engine on the same
file and ids.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FX = os.path.join(ROOT, "tests", "fixtures", "gguf")
OUT = os.path.join(FX, "gemma3_270m_transformers.json")
DEFAULT = os.path.join(ROOT, ".cache", "qlora", "gemma-3-270m-q4_k_m.gguf")
T = 520
POSITIONS = list(range(20)) + list(range(T - 20, T))
TOPK = 8


def main():
    path = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
    if not os.path.exists(path):
        sys.exit(f"{path} not found: run tests/fetch_real_models.sh first")
    lc = json.load(open(os.path.join(FX, "gemma3_270m_llama_cpp.json"), encoding="utf-8"))
    lines = [i for line in lc["corpus_tokens"] if "ids" in line for i in line["ids"]]
    ids = [2] + (lines * (1 + T // len(lines)))[: T - 1]  # the first lines' ids, again from the start
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32, attn_implementation="eager").eval()
    assert type(model).__name__ == "Gemma3ForCausalLM", type(model).__name__
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].to(torch.float64).numpy()
    rows = []
    for t in POSITIONS:
        row = logits[t]
        top = np.argsort(-row, kind="stable")[:TOPK]
        m = row.max()
        rows.append({"position": t, "top_ids": [int(i) for i in top], "top_logits": [float(row[i]) for i in top],
                     "logsumexp": float(m + np.log(np.exp(row - m).sum()))})
    out = {"generator": "tools/make_gemma3_270m_transformers_fixture.py",
           "source": f"gemma-3-270m-q4_k_m.gguf loaded by transformers {transformers.__version__} with gguf_file=, "
                     f"torch {torch.__version__.split('+')[0]}, float32, eager attention",
           "config": {k: getattr(model.config, k) for k in ("sliding_window", "query_pre_attn_scalar", "rope_local_base_freq")
                      if hasattr(model.config, k)},
           "ids": ids, "rows": rows}
    with open(OUT, "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")
    print(f"wrote {os.path.relpath(OUT, ROOT)}: {len(ids)} ids, {len(rows)} rows")


if __name__ == "__main__":
    main()
