#!/usr/bin/env python3
"""A byte-level BPE GGUF vocabulary with pre-tokenizer "gpt-4o" and how llama.cpp tokenizes with it.

    /opt/llamaenv/bin/python tools/make_gpt4o_vocab_fixtures.py          (llama-cpp-python, gguf, numpy)
    /opt/fixenv/bin/python tools/make_gpt4o_vocab_fixtures.py --hf      (tokenizers, gguf)

The first run writes into tests/fixtures/gguf/:
  gpt4o_vocab.gguf    a vocabulary-only GGUF (arch llama, no tensors) with tokenizer.ggml.model "gpt2"
                      and tokenizer.ggml.pre "gpt-4o" (Phi-4-mini's and gpt-oss's o200k split): the 256
                      byte tokens in GPT-2's byte-to-unicode alphabet, the tokens of merges learnt from
                      the texts below (see learn_merges), and <|endoftext|> (control; bos and eos,
                      add_bos_token false).
  gpt4o_tokens.json   llama.cpp's ids for TEXTS with and without add_bos, special tokens parsed, from
                      llama_tokenize through llama-cpp-python's Llama(vocab_only=True).tokenize.
The --hf run adds to each case of gpt4o_tokens.json "hf_ids": what HF tokenizers gives with the
same vocabulary and merges and the pipeline o200k tokenizer.json files carry (Split of the o200k
regex, Isolated; ByteLevel without its regex), i.e. what transformers computes for the
tokenizer.json `qlora merge` writes from this GGUF.
The C++ test (tests/text/tokenizer_gguf_test.cpp) loads the GGUF with Tokenizer::from_gguf and
requires llama.cpp's ids, and the written tokenizer.json and requires the hf_ids.
"""
import json
import os
import re
import sys
from collections import Counter

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gguf_fixtures import finish, vocab_only_writer  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
GGUF = os.path.join(OUT, "gpt4o_vocab.gguf")
TOKENS = os.path.join(OUT, "gpt4o_tokens.json")
EOT = "<|endoftext|>"
N_MERGES = 330

# The tokenizer.json regex of o200k vocabularies (as in src/text/tokenizer_pretok.cpp, kO200kPattern).
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
         r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello World",
    "camelCaseWord and HTTPServer XMLHttpRequest",
    "it's IT'S we'll WE'LL they're THEY'RE i'd I'D you've",
    "\u00c9COLE \u00e9cole \u00c9cole",                             # ÉCOLE école École
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0391\u0398\u0397\u039d\u0391",  # Ελληνικά ΑΘΗΝΑ
    "\u041c\u043e\u0441\u043a\u0432\u0430 \u041c\u041e\u0421\u041a\u0412\u0410",      # Москва МОСКВА
    "Stra\u00dfe STRASSE \u00dcBER \u00fcber",                      # Straße STRASSE ÜBER über
    "hello\u041c\u043e\u0441\u043a\u0432\u0430 foo\u00c9cole mIXed\u00c9A",  # a non-ASCII capital inside a word
    "cafe\u0301 e\u0301cole E\u0301COLE",                           # combining acute accents
    "\u5317\u4eac\u6b22\u8fce\u4f60 \u6771\u4eac",                  # CJK
    "1234567 and 12 345 \u0661\u0662\u0663\u0664 x\u00b2\u00b3",    # digits, Arabic-Indic digits, superscripts
    "wait...!!!\n\nnext/\n/path//x ?/\r\n",                         # punctuation runs with newlines and slashes
    "a   b    c  ",                                                 # runs of spaces
    "\tindent\t\ttabs \t x",
    "line\r\nnext\r\n\r\nend",
    "nbsp\u00a0here\u3000ideo \u00a0 x",                             # NBSP, ideographic space
    "emoji \U0001F600\U0001F44D\U0001F3FD end",
    "before" + EOT + "after " + EOT + " x",
    "\u0130stanbul \u01c5emal \u01c6",                              # İstanbul, titlecase ǅ, lowercase ǆ
    "it'\u017f fine IT'\u017f",                                     # 'ſ: a contraction only under Unicode case folding
    "\u041c\u041e\u0421\u041a\u0412\u0410'S ATHENS'LL",
    "x\u0085y\u2028z",                                              # NEL and LINE SEPARATOR
    "  leading and trailing  ",
    "MIXEDcase \u00e9\u00c9\u00e9 \u00c9\u00c9 A\u00e9B",
    "",
    "\n\n\n",
    "Phi-4-mini's o200k: \u00c9T\u00c9 vs \u00e9t\u00e9!",
]


def byte_alphabet():
    """GPT-2's bytes_to_unicode: byte -> printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def learn_merges(alphabet):
    """Greedy BPE on the texts' distinct space-separated chunks (a space kept with the chunk after
    it, the special token cut out): the most frequent pair first, ties by the pair. A chunk with a
    non-ASCII character or an apostrophe counts 100 times, so that such chunks merge whole and the
    places inside them where the splits of llama.cpp and transformers may differ show in the ids."""
    chunks = sorted({c for t in TEXTS for part in t.split(EOT) for c in re.findall(r" ?[^ ]+| +", part)})
    words = [[alphabet[b] for b in c.encode()] for c in chunks]
    weight = [100 if any(ord(ch) > 0x7F or ch == "'" for ch in c) else 1 for c in chunks]
    merges = []
    for _ in range(N_MERGES):
        pairs = Counter()
        for w, n in zip(words, weight):
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for w in words:
            i = 0
            while i + 1 < len(w):
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [w[i] + w[i + 1]]
                i += 1
    return merges


def write_vocab_gguf(path, pre, title, whole=(), add_bos_key=True):
    """The byte tokens, the tokens of the learnt merges, `whole` (entries no merge reaches) and EOT
    (control; bos and eos) as a vocabulary-only GGUF with pre-tokenizer `pre`; add_bos_token false
    unless `add_bos_key` is off (then absent). Returns the bos id."""
    alphabet = byte_alphabet()
    tokens = [alphabet[b] for b in range(256)]
    merges = learn_merges(alphabet)
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
    for t in whole:
        assert t not in tokens, t
        tokens.append(t)
    tokens.append(EOT)
    w = vocab_only_writer(path, title)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)
    if add_bos_key:
        w.add_add_bos_token(False)
    finish(w)
    print(f"{path}: {len(tokens)} tokens, {len(merges)} merges, {os.path.getsize(path)} bytes")
    return len(tokens) - 1


def write_gguf():
    write_vocab_gguf(GGUF, "gpt-4o", "gpt-4o vocabulary")


def llama_cpp_cases():
    from llama_cpp import Llama, __version__ as llama_cpp_version
    write_gguf()
    llm = Llama(model_path=GGUF, vocab_only=True, verbose=False)
    cases = []
    for text in TEXTS:
        for add_bos in (False, True):
            ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
            cases.append({"text": text, "add_bos": add_bos, "ids": [int(i) for i in ids]})
    with open(TOKENS, "w", encoding="utf-8") as f:
        json.dump({"llama_cpp_python": llama_cpp_version, "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{TOKENS}: {len(cases)} tokenizations")


def add_hf_ids(gguf_path, tokens_path, regex, ignore_merges=False, record_differ=False):
    """Adds to each case of `tokens_path` "hf_ids": HF tokenizers' ids for the GGUF's vocabulary and
    merges under the tokenizer.json pipeline of a split regex (Split `regex`, Isolated; ByteLevel
    without its regex), as the tokenizer.json `qlora merge` writes for such a vocabulary."""
    import tokenizers
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    r = gguf.GGUFReader(gguf_path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode() for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in strings("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens) if t != EOT}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    assert tok.token_to_id(EOT) == tokens.index(EOT)
    with open(tokens_path, encoding="utf-8") as f:
        fx = json.load(f)
    differ = 0
    for c in fx["cases"]:
        c["hf_ids"] = tok.encode(c["text"], add_special_tokens=False).ids
        differ += c["hf_ids"] != c["ids"]
    fx["tokenizers"] = tokenizers.__version__
    if record_differ:
        fx["differ"] = differ
    with open(tokens_path, "w", encoding="utf-8") as f:
        json.dump(fx, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{tokens_path}: hf_ids added; {differ} of {len(fx['cases'])} differ from llama.cpp's")


def hf_cases():
    add_hf_ids(GGUF, TOKENS, O200K)


if __name__ == "__main__":
    hf_cases() if "--hf" in sys.argv[1:] else llama_cpp_cases()
