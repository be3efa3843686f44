#!/usr/bin/env python3
"""A byte-level BPE GGUF vocabulary with pre-tokenizer "tekken" and how llama.cpp tokenizes with it.

    /opt/llamaenv/bin/python tools/make_tekken_vocab_fixtures.py          (llama-cpp-python, gguf, numpy)
    /opt/fixenv/bin/python tools/make_tekken_vocab_fixtures.py --hf      (tokenizers, gguf)

Mistral's Tekken vocabulary (Mistral NeMo, Mistral Small 3, Ministral, Pixtral) names its split
"tekken" in GGUFs. llama.cpp (llama-vocab.cpp) runs it as it runs "gpt-4o": its own spelling of the
regex on text collapsed to one byte per code point, where a non-ASCII letter is both upper and
lower case and a combining mark no letter; unlike "gpt-4o" there are no contractions, digits split
one by one, and merges are ignored for a pre-token that is a vocabulary entry.
The first run writes into tests/fixtures/gguf/:
  tekken_vocab.gguf    a vocabulary-only GGUF (arch llama, no tensors): make_gpt4o_vocab_fixtures.py's
                       256 byte tokens and merges learnt from its texts, two whole-word entries no
                       merge reaches (WHOLE), and <|endoftext|> (control; bos and eos,
                       add_bos_token false).
  tekken_tokens.json   llama.cpp's ids for the texts with and without add_bos, special tokens parsed.
The --hf run adds "hf_ids": HF tokenizers' ids for the same vocabulary under the tokenizer.json
pipeline Tekken vocabularies carry (Split of the Tekken regex, Isolated; ByteLevel without its
regex; ignore_merges), i.e. what transformers computes for the tokenizer.json `qlora merge` writes.
The C++ test (tests/text/tokenizer_gguf_test.cpp) requires both.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt4o_vocab_fixtures import TEXTS, add_hf_ids, write_vocab_gguf  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
GGUF = os.path.join(OUT, "tekken_vocab.gguf")
TOKENS = os.path.join(OUT, "tekken_tokens.json")

# The tokenizer.json regex of Tekken vocabularies (as in src/text/tokenizer_pretok.cpp, kTekkenPattern).
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
WHOLE = ["\u0120xyzzy", "\u0120plugh"]
EXTRA_TEXTS = [" xyzzy plugh 2024", "Mistral NeMo's tekken: 12345 \u00c9T\u00c9 xyzzy"]


def write_gguf():
    write_vocab_gguf(GGUF, "tekken", "tekken vocabulary", WHOLE)


def llama_cpp_cases():
    from llama_cpp import Llama, __version__ as llama_cpp_version
    write_gguf()
    llm = Llama(model_path=GGUF, vocab_only=True, verbose=False)
    cases = []
    for text in TEXTS + EXTRA_TEXTS:
        for add_bos in (False, True):
            ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
            cases.append({"text": text, "add_bos": add_bos, "ids": [int(i) for i in ids]})
    with open(TOKENS, "w", encoding="utf-8") as f:
        json.dump({"llama_cpp_python": llama_cpp_version, "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{TOKENS}: {len(cases)} tokenizations")


def hf_cases():
    add_hf_ids(GGUF, TOKENS, TEKKEN, ignore_merges=True, record_differ=True)


if __name__ == "__main__":
    hf_cases() if "--hf" in sys.argv[1:] else llama_cpp_cases()
