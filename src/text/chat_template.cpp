// Chat template rendering with transformers' context (messages, tools, kwargs) and the built-ins.
#include "text/chat_template.h"

#include "core/error.h"
#include "io/json_util.h"

namespace qlora {

namespace {

using jinja::Dict;
using jinja::Value;

// ChatML as in the Hugging Face chat-templating docs (Qwen/SmolLM style without a default system).
constexpr const char* kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Meta-Llama-3-8B-Instruct's tokenizer_config.json chat_template.
constexpr const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

// Mistral-7B-Instruct-v0.3's chat_template: [INST] turns, the system prompt joined to the last user
// turn, tool calls.
constexpr const char* kMistral = R"JINJA({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)JINJA";

// Stanford Alpaca's prompt, turned into turns: the system message (or Alpaca's preamble), then
// "### Instruction:" for each user turn and "### Response:" for each assistant turn.
constexpr const char* kAlpaca = R"JINJA({{- bos_token }}
{%- if messages and messages[0]['role'] == 'system' %}
    {{- messages[0]['content'] + '\n\n' }}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {{- 'Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n' }}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {{- '### Instruction:\n' + message['content'] + '\n\n' }}
    {%- elif message['role'] == 'assistant' %}
        {{- '### Response:\n' + message['content'] }}{{ eos_token }}{{ '\n\n' }}
    {%- else %}
        {{- raise_exception('The alpaca template supports system, user and assistant messages only') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '### Response:\n' }}
{%- endif %}
)JINJA";

// Gemma 3's template (the *-it checkpoints' tokenizer_config.json), for the base checkpoints that
// ship none (gemma-3-270m, the -pt models): BOS, each turn as <start_of_turn>user|model, a newline,
// its text trimmed and <end_of_turn> with a newline; a system message at the head of the first user
// turn, a blank line after it (Gemma has no system role); the generation prompt opens a model turn.
// The format Google documents at ai.google.dev/gemma/docs/formatting.
constexpr const char* kGemma = R"JINJA({{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
)JINJA";

const std::vector<std::pair<std::string, const char*>>& builtins() {
  static const std::vector<std::pair<std::string, const char*>> b = {
      {"chatml", kChatml}, {"llama3", kLlama3}, {"mistral", kMistral}, {"alpaca", kAlpaca}, {"gemma", kGemma}};
  return b;
}

// transformers copies a message's reasoning (reasoning_content / thinking / reasoning) so templates
// can read it under `thinking` and `reasoning_content` (render_jinja_template's
// _alias_reasoning_fields).
Value alias_reasoning(const Value& message) {
  if (!message.is_dict()) return message;
  const Dict& d = message.get_dict();
  const Value* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    const Value* v = d.find(key);
    if (v && !v->is_none()) {
      reasoning = v;
      break;
    }
  }
  if (!reasoning) return message;
  Dict out;
  out.entries.emplace_back("thinking", *reasoning);
  for (const auto& [k, v] : d.entries) out.set(k, v);
  out.set("reasoning_content", *reasoning);
  return Value::dict(std::move(out));
}

Value make_context(const Value& messages, bool add_generation_prompt, const Value& extra, const std::string& name) {
  if (!messages.is_list())
    fail(ErrorKind::Data, "chat template '" + name + "'", "messages must be a JSON array of message objects");
  jinja::ValueList msgs;
  for (size_t i = 0; i < messages.get_list().size(); ++i) {
    const Value& m = messages.get_list()[i];
    if (!m.is_dict())
      fail(ErrorKind::Data, "messages[" + std::to_string(i) + "]",
           std::string("a message must be a JSON object, got ") + m.type_name(),
           "use {\"role\": ..., \"content\": ...}");
    msgs.push_back(alias_reasoning(m));
  }
  if (!extra.is_dict() && !extra.is_none())
    fail(ErrorKind::Config, "chat template '" + name + "'", "extra context must be a JSON object");
  Dict ctx;
  ctx.set("messages", Value::list(std::move(msgs)));
  const Dict empty;
  const Dict& ex = extra.is_dict() ? extra.get_dict() : empty;
  const Value* tools = ex.find("tools");
  const Value* documents = ex.find("documents");
  ctx.set("tools", tools ? *tools : Value::none());
  ctx.set("documents", documents ? *documents : Value::none());
  ctx.set("add_generation_prompt", Value(add_generation_prompt));
  for (const auto& [k, v] : ex.entries)
    if (k != "tools" && k != "documents" && k != "messages" && k != "add_generation_prompt") ctx.set(k, v);
  return Value::dict(std::move(ctx));
}

}  // namespace

ChatTemplate ChatTemplate::from_source(std::string jinja_source, std::string name) {
  jinja::Template t = jinja::Template::parse(jinja_source, name);
  return ChatTemplate(std::move(jinja_source), std::move(name), std::move(t));
}

ChatTemplate ChatTemplate::builtin(const std::string& name) {
  for (const auto& [n, src] : builtins())
    if (n == name) return from_source(src, "builtin:" + n);
  std::string list;
  for (const auto& n : builtin_names()) list += (list.empty() ? "" : ", ") + n;
  std::string close = closest_name(builtin_names(), name, 3);
  fail(ErrorKind::Config, "chat_template '" + name + "'", "unknown built-in chat template",
       (close.empty() ? "" : "did you mean '" + close + "'? ") + "built-ins: " + list +
           "; or give a Jinja template file");
}

const std::vector<std::string>& ChatTemplate::builtin_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [name, src] : builtins()) n.push_back(name);
    return n;
  }();
  return names;
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra_context) const {
  Value ctx = make_context(Value::from_json(messages), add_generation_prompt, Value::from_json(extra_context), name_);
  return tmpl_.render(ctx, opts_);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra_context) const {
  return render_with_spans(messages, add_generation_prompt, extra_context).text;
}

ChatTemplate::Rendered ChatTemplate::render_with_spans(const nlohmann::ordered_json& messages,
                                                       bool add_generation_prompt,
                                                       const nlohmann::ordered_json& extra_context) const {
  Value ctx = make_context(Value::from_json(messages), add_generation_prompt, Value::from_json(extra_context), name_);
  Rendered r;
  r.text = tmpl_.render(ctx, opts_, &r.generation);
  r.marks_generation = tmpl_.marks_generation();
  return r;
}


}  // namespace qlora
