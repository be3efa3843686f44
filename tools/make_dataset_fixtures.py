#!/usr/bin/env python3
"""Generates dataset-format fixtures under tests/fixtures/text/datasets/: small JSONL files in every
row format qlora reads, and the ids + labels a transformers-based reference computes for them with
SmolLM2's tokenizer (tests/fixtures/text/tok/smollm2) and its chat template.

Run with the fixture venv:  /opt/fixenv/bin/python tools/make_dataset_fixtures.py

The reference (written independently of the C++ code, which renders prefixes and tokenizes turn by
turn) works on character offsets of ONE tokenization of the whole rendered text:
  * text: tokenizer(text) (add_special_tokens=True) + EOS; every token gets loss.
  * prompt/completion strings: tokenizer(prompt + completion) + EOS; tokens that start at or after
    len(prompt) get loss, and the EOS too (TRL's completion-only loss).
  * chat rows (alpaca / sharegpt / messages / conversational prompt-completion) are rendered with
    tokenizer.apply_chat_template. A trained turn k covers the characters
        [len(render(messages[:k], add_generation_prompt=True)), len(render(messages[:k+1])))
    for assistant turns (for other roles: from where the content appears). Inside it, tokens get loss
    up to and including the last special added token (the template's end of turn, <|im_end|>); the
    "\\n" after it gets none. A turn without a special token (the plain template case) gets loss on
    its text minus trailing whitespace and an EOS inserted right after it.
    alpaca -> [system] + history pairs + user(instruction + "\\n" + input) + assistant(output);
    sharegpt roles human->user, gpt->assistant, function_call->assistant, observation->tool.
    Trained turns: role in roles_to_train (default [assistant]); conversational prompt-completion
    trains the completion messages.
  * segments: the concatenated text, loss on tokens inside segments with label true; no EOS.
  * pretokenized: input_ids without attention_mask==0 positions; labels as given (default ids).
  train_on_inputs: every token's label is its id (inserted EOS included).
The script asserts that every boundary falls between tokens, so the reference is well defined.
"""
import json
import os

import tokenizers
import transformers
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures", "text")
OUT = os.path.join(FIX, "datasets")

# A template without special tokens: every trained turn needs an inserted EOS.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ 'User:\\n' + m['content'] + '\\n' }}"
    "{% elif m['role'] == 'assistant' %}{{ 'Bot:\\n' + m['content'] + '\\n\\n' }}"
    "{% else %}{{ m['role'] + ':\\n' + m['content'] + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Bot:\\n' }}{% endif %}")

ROWS = {
    "alpaca.jsonl": [
        {"instruction": "Give three tips for staying healthy.", "input": "",
         "output": "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Sleep at least 7 hours."},
        {"instruction": "Translate to French.", "input": "The cat sleeps on the mat.",
         "output": "Le chat dort sur le tapis."},
        {"system": "You answer in one word.", "instruction": "What colour is the sky?", "output": "Blue."},
        {"instruction": "And of Italy?", "input": "", "output": "Rome.",
         "history": [["What is the capital of France?", "Paris."]]},
        {"instruction": "Say hello in Japanese.", "output": "こんにちは 👋"},
    ],
    "sharegpt.jsonl": [
        {"conversations": [{"from": "human", "value": "Hi there!"},
                           {"from": "gpt", "value": "Hello! How can I help you today?"}]},
        {"conversations": [{"from": "system", "value": "You are terse."},
                           {"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4."},
                           {"from": "human", "value": "And 3*3?"}, {"from": "gpt", "value": "9."}]},
        {"system": "Be kind.", "conversations": [{"from": "human", "value": "I failed my exam."},
                                                 {"from": "gpt", "value": "I'm sorry. You can try again."}]},
        {"conversations": [{"from": "human", "value": "Weather in Oslo?"},
                           {"from": "function_call", "value": "{\"name\": \"weather\", \"city\": \"Oslo\"}"},
                           {"from": "observation", "value": "{\"temp_c\": -3}"},
                           {"from": "gpt", "value": "It is -3 °C in Oslo."}]},
    ],
    "messages.jsonl": [
        {"messages": [{"role": "user", "content": "Name a prime number."},
                      {"role": "assistant", "content": "Seven."}]},
        {"messages": [{"role": "system", "content": "You write haiku."},
                      {"role": "user", "content": "Autumn?"},
                      {"role": "assistant", "content": "Red leaves drift and fall\nquiet rivers carry them\nthe year exhales slow"},
                      {"role": "user", "content": "Winter?"},
                      {"role": "assistant", "content": "White silence settles"}]},
        {"messages": [{"role": "user", "content": "What is 12345 * 2?"},
                      {"role": "assistant", "content": "The answer is 24690."}]},
        {"messages": [{"role": "user", "content": "Look it up."},
                      {"role": "tool", "content": "result: 42"},
                      {"role": "assistant", "content": "It is 42."}]},
    ],
    "prompt_completion.jsonl": [
        {"prompt": "The sky is", "completion": " blue."},
        {"prompt": "Q: What is 2+2?\nA:", "completion": " 4"},
        {"prompt": [{"role": "user", "content": "Capital of Peru?"}],
         "completion": [{"role": "assistant", "content": "Lima."}]},
        {"prompt": [{"role": "system", "content": "Reply in German."}, {"role": "user", "content": "Thank you"}],
         "completion": [{"role": "assistant", "content": "Danke schön"}]},
    ],
    "text.jsonl": [
        {"text": "The quick brown fox jumps over the lazy dog."},
        {"text": "Line one\nLine two\n\tindented 123"},
        {"text": "Ünïcödé and emoji 🚀 too."},
    ],
    "segments.jsonl": [
        {"segments": [{"label": False, "text": "<|im_start|>user\nhi<|im_end|>\n"},
                      {"label": True, "text": "<|im_start|>assistant\nhello<|im_end|>"}]},
        {"segments": [{"label": False, "text": "Question: why?\n"}, {"label": True, "text": "Answer: because."}]},
    ],
    "pretokenized.jsonl": [
        {"input_ids": [504, 2444, 314, 3789, 30, 2]},
        {"input_ids": [1, 4093, 198, 19556, 2, 0, 0], "labels": [-100, -100, -100, 19556, 2, -100, -100],
         "attention_mask": [1, 1, 1, 1, 1, 0, 0]},
    ],
}

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant", "bot": "assistant", "chatgpt": "assistant", "system": "system",
                  "function_call": "assistant", "tool": "tool", "observation": "tool",
                  "function_response": "tool"}


def special_ids(tok):
    return {i for i, t in tok.added_tokens_decoder.items() if t.special}


def aligned(offsets, pos):
    return pos == 0 or any(s == pos for s, _ in offsets) or any(e == pos for _, e in offsets)


def to_messages(row, fmt):
    """-> (messages, trained-by-position or None (= by role))"""
    if fmt == "alpaca":
        m = []
        if row.get("system"):
            m.append({"role": "system", "content": row["system"]})
        for q, a in row.get("history", []):
            m += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        user = row["instruction"] + ("\n" + row["input"] if row.get("input") else "")
        m += [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]
        return m, None
    if fmt == "sharegpt":
        m = [{"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in row["conversations"]]
        if row.get("system") and m[0]["role"] != "system":
            m.insert(0, {"role": "system", "content": row["system"]})
        return m, None
    if fmt == "messages":
        return [dict(x) for x in row["messages"]], None
    if fmt == "prompt_completion":
        m = row["prompt"] + row["completion"]
        return m, [i >= len(row["prompt"]) for i in range(len(m))]
    raise ValueError(fmt)


def chat_reference(tok, msgs, trained_by_pos, roles, template, train_on_inputs):
    kw = {"tokenize": False}
    if template:
        kw["chat_template"] = template
    render = lambda ms, gen=False: tok.apply_chat_template(ms, add_generation_prompt=gen, **kw) if ms else ""
    full = render(msgs)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    specials = special_ids(tok)
    trained = [False] * len(ids)
    insert_after = set()  # token index after which EOS is inserted; -1 = before the first token
    for k, m in enumerate(msgs):
        is_tr = trained_by_pos[k] if trained_by_pos is not None else m["role"] in roles
        if not is_tr:
            continue
        lo, end = len(render(msgs[:k])), len(render(msgs[:k + 1]))
        assert full.startswith(render(msgs[:k + 1]))
        start = None
        if m["role"] == "assistant" and k > 0:
            g = render(msgs[:k], True)
            if full.startswith(g) and lo <= len(g) <= end:
                start = len(g)
        if start is None:
            at = full.find(m["content"], lo)
            start = at if at >= 0 and at + len(m["content"]) <= end else lo
        assert aligned(offs, start) and aligned(offs, end), (full, start, end)
        inside = [i for i, (s, e) in enumerate(offs) if s >= start and e <= end]
        sp = [i for i in inside if ids[i] in specials]
        if sp:
            for i in inside:
                trained[i] = i <= sp[-1]
        else:
            core_end = start + len(full[start:end].rstrip(" \n\t\r"))
            assert aligned(offs, core_end)
            core = [i for i in inside if offs[i][1] <= core_end]
            for i in core:
                trained[i] = True
            insert_after.add(core[-1] if core else (inside[0] - 1))
    out_ids, out_labels = [], []
    eos = tok.eos_token_id
    if -1 in insert_after:
        out_ids.append(eos), out_labels.append(eos)
    for i, t in enumerate(ids):
        out_ids.append(t)
        out_labels.append(t if trained[i] or train_on_inputs else -100)
        if i in insert_after:
            out_ids.append(eos), out_labels.append(eos)
    return full, out_ids, out_labels


def plain_reference(tok, pieces, append_eos, add_special, train_on_inputs):
    full = "".join(t for t, _ in pieces)
    enc = tok(full, add_special_tokens=add_special, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    bounds, pos = [], 0
    for t, lab in pieces:
        bounds.append((pos, pos + len(t), lab))
        assert aligned(offs, pos) and aligned(offs, pos + len(t)), (full, pos)
        pos += len(t)
    labels = []
    for i, (s, e) in enumerate(offs):
        lab = any(lab for (a, b, lab) in bounds if s >= a and e <= b and e > s)
        labels.append(ids[i] if lab or train_on_inputs else -100)
    if append_eos and (not ids or ids[-1] != tok.eos_token_id):
        ids = ids + [tok.eos_token_id]
        labels = labels + [tok.eos_token_id if pieces[-1][1] or train_on_inputs else -100]
    return full, ids, labels


def reference(tok, fmt, row, opts):
    toi = opts.get("train_on_inputs", False)
    roles = opts.get("roles_to_train", ["assistant"])
    if fmt == "text":
        return plain_reference(tok, [(row["text"], True)], True, True, toi)
    if fmt == "segments":
        return plain_reference(tok, [(s["text"], s["label"]) for s in row["segments"]], False, False, toi)
    if fmt == "pretokenized":
        am = row.get("attention_mask", [1] * len(row["input_ids"]))
        labels = row.get("labels", row["input_ids"])
        ids = [t for t, a in zip(row["input_ids"], am) if a]
        labels = [t for t, a in zip(labels, am) if a]
        return None, ids, ids if toi else labels
    if fmt == "prompt_completion" and isinstance(row["prompt"], str):
        return plain_reference(tok, [(row["prompt"], False), (row["completion"], True)], True, True, toi)
    msgs, by_pos = to_messages(row, fmt)
    return chat_reference(tok, msgs, by_pos, roles, opts.get("chat_template"), toi)


CASES = [
    ("alpaca", "alpaca.jsonl", "alpaca", {}),
    ("sharegpt", "sharegpt.jsonl", "sharegpt", {}),
    ("sharegpt_user_and_assistant", "sharegpt.jsonl", "sharegpt", {"roles_to_train": ["user", "assistant"]}),
    ("messages", "messages.jsonl", "messages", {}),
    ("messages_train_on_inputs", "messages.jsonl", "messages", {"train_on_inputs": True}),
    ("messages_plain_template", "messages.jsonl", "messages", {"chat_template": PLAIN_TEMPLATE}),
    ("alpaca_plain_template", "alpaca.jsonl", "alpaca", {"chat_template": PLAIN_TEMPLATE}),
    ("prompt_completion", "prompt_completion.jsonl", "prompt_completion", {}),
    ("text", "text.jsonl", "text", {}),
    ("segments", "segments.jsonl", "segments", {}),
    ("pretokenized", "pretokenized.jsonl", "pretokenized", {}),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(os.path.join(FIX, "tok", "smollm2"))
    for name, rows in ROWS.items():
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    cases = []
    for name, file, fmt, opts in CASES:
        out_rows = []
        for row in ROWS[file]:
            text, ids, labels = reference(tok, fmt, row, opts)
            assert len(ids) == len(labels)
            out_rows.append({"ids": ids, "labels": labels, "text": text})
        cases.append({"name": name, "file": file, "format": fmt, "options": opts, "rows": out_rows})
    expected = {
        "generator": "tools/make_dataset_fixtures.py",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "tokenizer": "tok/smollm2",
        "eos_token_id": tok.eos_token_id,
        "cases": cases,
    }
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
    print("wrote", len(cases), "cases to", OUT)


if __name__ == "__main__":
    main()
