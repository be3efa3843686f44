#!/usr/bin/env python3
"""SentencePiece ("llama") GGUF vocabularies and how llama.cpp tokenizes with them.

    /opt/llamaenv/bin/python tools/make_spm_vocab_fixtures.py     (llama-cpp-python, gguf, numpy)

Writes into tests/fixtures/gguf/:
  spm_vocab.gguf           a vocabulary-only GGUF (arch llama, no tensors) with tokenizer.ggml.model
                           "llama": <unk> (unknown), <s> and </s> (control), the 256 byte tokens,
                           single characters and pieces whose scores tie across different pieces
                           (so that llama.cpp's "leftmost pair among equal scores" decides), an unused piece (still merged
                           by llama.cpp's SPM session, which does not look at types), a control token
                           and a user-defined token; add_space_prefix true (Llama 2, Mistral, Phi-3).
  spm_vocab_noprefix.gguf  the same with add_space_prefix false (Gemma).
  spm_vocab_phi3.gguf      the first with general.name "Phi-3 vocabulary": llama.cpp then strips the
                           whitespace after every unknown, control and user-defined token but <unk>,
                           <s> and <|endoftext|> (its token attributes set by model name), as Phi-3's
                           tokenizer.json marks its chat tokens rstrip; it also holds <|endoftext|>
                           (control), which llama.cpp requires of a Phi-3-named vocabulary.
  spm_tokens.json          llama.cpp's ids for a set of texts with and without add_bos, special tokens
                           parsed (as transformers and the engine always do), from llama_tokenize
                           through llama-cpp-python's Llama(vocab_only=True).tokenize.
The C++ test (tests/text/tokenizer_gguf_test.cpp) loads both files with Tokenizer::from_gguf and
requires the same ids.
"""
import json
import os
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gguf_fixtures import finish, vocab_only_writer  # noqa: E402
from llama_cpp import Llama, __version__ as llama_cpp_version

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
SP = "\u2581"

# (piece, score, type); type 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
SPECIALS = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
CHARS = [SP] + list("abcdefghilnorstuwxyz.,!?'")
PIECES = [
    # "bc" before "ab" in id order with the same score: llama.cpp merges the leftmost pair of "abcd"
    # first (ab), a rank-by-id rule would merge bc and then reach "bcd".
    ("bc", -1.0, 1), ("ab", -1.0, 1), ("abc", -2.0, 1), ("bcd", -0.5, 1), ("cd", -3.0, 1),
    ("\u2581t", -4.0, 1), ("th", -4.0, 1), ("he", -5.0, 1), ("\u2581th", -6.0, 1), ("the", -6.0, 1),
    ("\u2581the", -7.0, 1), ("\u2581a", -8.0, 1), ("an", -8.0, 1), ("nd", -8.0, 1), ("and", -9.0, 1),
    ("\u2581and", -10.0, 1), ("ll", -11.0, 1), ("o\u2581", -12.0, 1), ("\u2581\u2581", -13.0, 1),
    ("\u2581\u2581\u2581\u2581", -14.0, 1), ("zz", -0.25, 5), ("lo", -15.0, 1), ("ello", -16.0, 1), ("el", -15.5, 1),
    ("<start_of_turn>", 0.0, 3), ("<|tool|>", 0.0, 4), ("og", -17.0, 4),
]

TEXTS = [
    "abc", "abcd", "bcd", "xabcd abcd", "the and the", "  the  and   ", "hello\nworld", "zzz zz",
    "cd cd", "<s>the</s> and<unk>x", "a<|tool|>b the", "<start_of_turn>user\nthe dog", "dog og fog",
    "\u00e9t\u00e9 \u2603 \U0001F600", "", " ", "The AND", "hello world", "\t\ttabs  and\n\nnewlines ",
    # whitespace after special tokens: kept, but after the Phi-3-named file's rstrip tokens
    "<start_of_turn> \n the</s>\n\n<s> and", "x<|tool|>\t b <unk> a</s>", "<s>  the", "</s> ", "<|endoftext|> the",
]


def vocab_gguf(path, add_space_prefix, name="spm vocabulary"):
    entries = SPECIALS + [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    entries += [(c, -100.0 - i, 1) for i, c in enumerate(CHARS)] + PIECES
    if "phi-3" in name.lower():  # llama.cpp looks this token up by text for a Phi-3 name (and fails without it)
        entries.append(("<|endoftext|>", 0.0, 3))
    w = vocab_only_writer(path, name)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([e[0] for e in entries])
    w.add_token_scores([float(e[1]) for e in entries])
    w.add_token_types([e[2] for e in entries])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(add_space_prefix)
    finish(w)


def main():
    cases = []
    for name, prefix, model_name in (("spm_vocab.gguf", True, "spm vocabulary"),
                                     ("spm_vocab_noprefix.gguf", False, "spm vocabulary"),
                                     ("spm_vocab_phi3.gguf", True, "Phi-3 vocabulary")):
        path = os.path.join(OUT, name)
        vocab_gguf(path, prefix, model_name)
        llm = Llama(model_path=path, vocab_only=True, verbose=False)
        for text in TEXTS:
            for add_bos in (False, True):
                ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
                cases.append({"file": name, "text": text, "add_bos": add_bos, "ids": [int(i) for i in ids]})
        print(f"{name}: {len(TEXTS) * 2} tokenizations")
    with open(os.path.join(OUT, "spm_tokens.json"), "w", encoding="utf-8") as f:
        json.dump({"llama_cpp_python": llama_cpp_version, "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
