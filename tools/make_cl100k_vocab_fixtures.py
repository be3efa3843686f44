#!/usr/bin/env python3
"""Byte-level BPE GGUF vocabularies with the Llama 3 / cl100k split under llama.cpp's two names for
it, and how llama.cpp tokenizes with each.

    /opt/llamaenv/bin/python tools/make_cl100k_vocab_fixtures.py      (llama-cpp-python, gguf, numpy)

llama.cpp (llama-vocab.cpp) runs the same regex for both names; they differ in one flag:
  "llama-bpe"  (Llama 3) ignore_merges: a pre-token that is itself a vocabulary entry is that one
               token, as tiktoken encodes (Llama 3's tokenizer.json sets ignore_merges);
  "dbrx"       (DBRX, and to our knowledge Phi-4 14B, whose cl100k vocabulary convert_hf_to_gguf.py
               recognises by the same hash) merges by rank always (tokenizer.json without it).
Writes into tests/fixtures/gguf/:
  cl100k_llama_bpe_vocab.gguf, cl100k_dbrx_vocab.gguf
                      vocabulary-only GGUFs (arch llama, no tensors), identical but for
                      tokenizer.ggml.pre: make_gpt4o_vocab_fixtures.py's 256 byte tokens and merges
                      learnt from its texts, whole-word tokens no merge reaches (WHOLE), and
                      <|endoftext|> (control; bos and eos, add_bos_token false).
  cl100k_tokens.json  llama.cpp's ids for each text under each name (llama_tokenize through
                      llama-cpp-python's Llama(vocab_only=True).tokenize, special tokens parsed); the
                      script asserts the names give different ids on the texts with WHOLE words;
                      adds_bos_without_key: whether llama.cpp adds BOS to a file without
                      tokenizer.ggml.add_bos_token, for these names and tekken, gpt-4o, qwen2.
The C++ test (tests/text/tokenizer_gguf_test.cpp) loads each GGUF with Tokenizer::from_gguf and
requires llama.cpp's ids.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt4o_vocab_fixtures import TEXTS, write_vocab_gguf  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
TOKENS = os.path.join(OUT, "cl100k_tokens.json")
NAMES = ["llama-bpe", "dbrx"]
# Entries no merge of the learnt list reaches (x, y, z, p, l, u, g, h stay apart in it).
WHOLE = ["\u0120xyzzy", "xyzzy", "\u0120plugh"]
EXTRA_TEXTS = [" xyzzy plugh", "xyzzy xyzzy'S plughs", "say XYZZY, then xyzzy.\n plugh"]


def path(name):
    return os.path.join(OUT, f"cl100k_{name.replace('-', '_')}_vocab.gguf")


def write_gguf(name, path_=None, add_bos_key=True):
    return write_vocab_gguf(path_ or path(name), name, f"cl100k-split vocabulary ({name})", WHOLE, add_bos_key)


def bos_without_key(Llama, tmp):
    """Whether llama.cpp adds BOS (llama_tokenize's add_special) to a file without
    tokenizer.ggml.add_bos_token: its default for the pre-tokenizer's name."""
    out = {}
    for name in NAMES + ["tekken", "gpt-4o", "qwen2"]:
        p = os.path.join(tmp, f"nokey_{name}.gguf")
        bos = write_gguf(name, p, add_bos_key=False)
        ids = Llama(model_path=p, vocab_only=True, verbose=False).tokenize(b"hello", add_bos=True, special=True)
        out[name] = ids[0] == bos
    return out


def main():
    from llama_cpp import Llama, __version__ as llama_cpp_version
    cases = []
    runs = {}
    for name in NAMES:
        write_gguf(name)
        runs[name] = Llama(model_path=path(name), vocab_only=True, verbose=False)
    differ = 0
    for text in TEXTS + EXTRA_TEXTS:
        ids = {n: [int(i) for i in runs[n].tokenize(text.encode(), add_bos=False, special=True)] for n in NAMES}
        if text in EXTRA_TEXTS:
            assert ids["llama-bpe"] != ids["dbrx"], text  # ignore_merges decides these
        differ += ids["llama-bpe"] != ids["dbrx"]
        cases.append({"text": text, "ids": ids})
    with tempfile.TemporaryDirectory() as tmp:
        bos = bos_without_key(Llama, tmp)
    with open(TOKENS, "w", encoding="utf-8") as f:
        json.dump({"llama_cpp_python": llama_cpp_version, "differ": differ, "adds_bos_without_key": bos,
                   "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{TOKENS}: {len(cases)} texts, {differ} tokenized differently under the two names")


if __name__ == "__main__":
    main()
