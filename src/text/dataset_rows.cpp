// Dataset row formats: names, detection by keys, and JSON object -> Row with field/role mapping.
#include <algorithm>
#include <map>

#include "core/error.h"
#include "text/dataset.h"

namespace qlora {

using json = nlohmann::ordered_json;

namespace {

struct FormatName {
  DatasetFormat f;
  const char* name;
  const char* fields;  // for error messages
};

const FormatName kFormats[] = {
    {DatasetFormat::Auto, "auto", ""},
    {DatasetFormat::Text, "text", "a string field 'text' (dataset_text_field)"},
    {DatasetFormat::Pretokenized, "pretokenized", "'input_ids' (int list), optional 'labels', 'attention_mask'"},
    {DatasetFormat::Alpaca, "alpaca", "'instruction' and 'output' strings, optional 'input', 'system', 'history'"},
    {DatasetFormat::ShareGpt, "sharegpt", "'conversations': [{\"from\": ..., \"value\": ...}], optional 'system', 'tools'"},
    {DatasetFormat::Messages, "messages", "'messages': [{\"role\": ..., \"content\": ...}], optional 'tools'"},
    {DatasetFormat::PromptCompletion, "prompt_completion",
     "'prompt' and 'completion', both strings or both message lists"},
    {DatasetFormat::Segments, "segments", "'segments': [{\"label\": true|false, \"text\": ...}]"},
    {DatasetFormat::Preference, "preference",
     "'chosen' and 'rejected' (strings or message lists), optional 'prompt' (else the shared start)"},
    {DatasetFormat::Unpaired, "unpaired_preference", "'prompt', 'completion' and a boolean 'label'"},
};

const FormatName& entry(DatasetFormat f) {
  for (const auto& e : kFormats)
    if (e.f == f) return e;
  return kFormats[0];
}

std::string keys_of(const json& obj) {
  std::string k;
  for (auto it = obj.begin(); it != obj.end(); ++it) k += (k.empty() ? "" : ", ") + it.key();
  return k.empty() ? "none" : k;
}

[[noreturn]] void missing(DatasetFormat f, const std::string& where, const std::string& what, const json& obj) {
  fail(ErrorKind::Data, where, "row " + what + " (format " + std::string(format_name(f)) + ", which needs " +
                                   entry(f).fields + "; row keys: " + keys_of(obj) + ")",
       "fix the row, set dataset_format if the format was detected wrongly, or skip_bad_rows: true");
}

const json* field(const json& obj, const std::string& key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

const std::string& need_string(const json& obj, const std::string& key, DatasetFormat f, const std::string& where) {
  const json* v = field(obj, key);
  if (!v) missing(f, where, "has no '" + key + "'", obj);
  if (!v->is_string()) missing(f, where, "has '" + key + "' that is not a string", obj);
  return v->get_ref<const std::string&>();
}

std::string opt_string(const json& obj, const std::string& key, DatasetFormat f, const std::string& where) {
  const json* v = field(obj, key);
  if (!v) return "";
  if (!v->is_string()) missing(f, where, "has '" + key + "' that is not a string", obj);
  return v->get<std::string>();
}

// ShareGPT / LLaMA-Factory role names -> the roles chat templates know.
const std::map<std::string, std::string>& sharegpt_roles() {
  static const std::map<std::string, std::string> m = {
      {"human", "user"},          {"user", "user"},           {"gpt", "assistant"},   {"assistant", "assistant"},
      {"model", "assistant"},     {"bot", "assistant"},       {"chatgpt", "assistant"}, {"system", "system"},
      {"function_call", "assistant"}, {"tool", "tool"},       {"observation", "tool"}, {"function_response", "tool"},
  };
  return m;
}

bool trains(const MaskOptions& mask, const std::string& role) {
  return std::find(mask.roles_to_train.begin(), mask.roles_to_train.end(), role) != mask.roles_to_train.end();
}

// A list of message objects under `key`, with roles mapped and per-message trained flags.
void read_messages(const json& obj, const std::string& key, DatasetFormat f, const FieldMap& fm, bool map_roles,
                   const std::string& where, Row& r) {
  const json* list = field(obj, key);
  if (!list) missing(f, where, "has no '" + key + "'", obj);
  if (!list->is_array()) missing(f, where, "has '" + key + "' that is not a list of messages", obj);
  if (list->empty()) missing(f, where, "has an empty '" + key + "'", obj);
  const std::string role_key_pref = !fm.role.empty() ? fm.role : (map_roles ? "from" : "role");
  const std::string content_key_pref = !fm.content.empty() ? fm.content : (map_roles ? "value" : "content");
  for (size_t i = 0; i < list->size(); i++) {
    const json& m = (*list)[i];
    const std::string at = key + "[" + std::to_string(i) + "]";
    if (!m.is_object()) missing(f, where, "has " + at + " that is not an object", obj);
    // Accept either spelling so that {"role","content"} under "conversations" works too.
    std::string rk = role_key_pref, ck = content_key_pref;
    if (!m.contains(rk)) rk = m.contains("role") ? "role" : "from";
    if (!m.contains(ck)) ck = m.contains("content") ? "content" : "value";
    if (!m.contains(rk) || !m[rk].is_string())
      missing(f, where, "has " + at + " without a string '" + role_key_pref + "'", obj);
    std::string role = m[rk].get<std::string>();
    if (map_roles) {
      auto it = sharegpt_roles().find(role);
      if (it == sharegpt_roles().end()) {
        std::string known;
        for (const auto& [k, v] : sharegpt_roles()) known += (known.empty() ? "" : ", ") + k;
        fail(ErrorKind::Data, where, at + " has role '" + role + "', which ShareGPT does not define",
             "known roles: " + known);
      }
      role = it->second;
    }
    json out = m;
    out.erase(rk);
    if (ck != "content") out.erase(ck);
    out["role"] = role;
    if (m.contains(ck)) {
      const json& c = m[ck];
      if (!c.is_string() && !c.is_null() && !c.is_array())
        missing(f, where, "has " + at + "." + ck + " that is neither a string nor a list of parts", obj);
      out["content"] = c;
    } else if (!m.contains("tool_calls")) {
      missing(f, where, "has " + at + " without '" + content_key_pref + "'", obj);
    }
    r.messages.push_back(std::move(out));
  }
}

}  // namespace

void read_template_context(const json& obj, Row& r, const std::string& where) {
  if (const json* t = field(obj, "tools")) {
    if (t->is_string()) {
      // ShareGPT keeps tools as a JSON string; templates expect the parsed list.
      json parsed = json::parse(t->get<std::string>(), nullptr, false);
      r.extra["tools"] = parsed.is_discarded() ? *t : parsed;
    } else {
      r.extra["tools"] = *t;
    }
  }
  // TRL's per-row chat_template_kwargs: more variables for the template (enable_thinking,
  // reasoning_effort, ...), given to apply_chat_template beside the messages and tools.
  if (const json* k = field(obj, "chat_template_kwargs")) {
    if (!k->is_object())
      fail(ErrorKind::Data, where, "row has 'chat_template_kwargs' that is not an object",
           "give the template's variables as an object, e.g. {\"enable_thinking\": false}, or skip_bad_rows: true");
    for (const auto& [key, value] : k->items()) {
      if (key == "messages" || key == "add_generation_prompt" || key == "tools" || key == "documents")
        fail(ErrorKind::Data, where, "row has chat_template_kwargs." + key + ", which the renderer sets itself",
             key == "tools" ? "put the tools in the row's own 'tools' field" : "remove it from chat_template_kwargs");
      r.extra[key] = value;
    }
  }
}

namespace {

std::vector<int32_t> int_list(const json& obj, const std::string& key, DatasetFormat f, const std::string& where) {
  const json& j = obj[key];
  if (!j.is_array()) missing(f, where, "has '" + key + "' that is not a list of integers", obj);
  std::vector<int32_t> v;
  v.reserve(j.size());
  for (const auto& x : j) {
    if (!x.is_number_integer()) missing(f, where, "has a non-integer in '" + key + "'", obj);
    v.push_back(x.get<int32_t>());
  }
  return v;
}

// Pretokenized: 'input_ids', optional 'labels' (else the ids) and 'attention_mask'.
void read_pretokenized(const json& obj, DatasetFormat f, const std::string& where, Row& r) {
  if (!field(obj, "input_ids")) missing(f, where, "has no 'input_ids'", obj);
  r.kind = Row::Tokens;
  r.ids = int_list(obj, "input_ids", f, where);
  r.labels = field(obj, "labels") ? int_list(obj, "labels", f, where) : r.ids;
  if (r.labels.size() != r.ids.size())
    fail(ErrorKind::Data, where, "'labels' has " + std::to_string(r.labels.size()) + " entries but 'input_ids' has " +
                                     std::to_string(r.ids.size()));
  if (field(obj, "attention_mask")) {
    // Padding positions (mask 0) carry nothing; batches are padded again later.
    std::vector<int32_t> am = int_list(obj, "attention_mask", f, where);
    if (am.size() != r.ids.size())
      fail(ErrorKind::Data, where, "'attention_mask' has " + std::to_string(am.size()) +
                                       " entries but 'input_ids' has " + std::to_string(r.ids.size()));
    std::vector<int32_t> ids, labels;
    for (size_t i = 0; i < am.size(); i++)
      if (am[i]) ids.push_back(r.ids[i]), labels.push_back(r.labels[i]);
    r.ids = std::move(ids);
    r.labels = std::move(labels);
  }
}

// Segments: [{"label": bool, "text": ...}], each piece trained by its label.
void read_segments(const json& obj, DatasetFormat f, const std::string& where, Row& r) {
  const json* segs = field(obj, "segments");
  if (!segs) missing(f, where, "has no 'segments'", obj);
  if (!segs->is_array() || segs->empty()) missing(f, where, "has 'segments' that is not a non-empty list", obj);
  for (size_t i = 0; i < segs->size(); i++) {
    const json& s = (*segs)[i];
    const std::string at = "segments[" + std::to_string(i) + "]";
    if (!s.is_object() || !s.contains("text") || !s["text"].is_string())
      missing(f, where, "has " + at + " without a string 'text'", obj);
    if (s.contains("label") && !s["label"].is_boolean())
      missing(f, where, "has " + at + ".label that is not a bool", obj);
    r.pieces.push_back({s["text"].get<std::string>(), s.value("label", true)});
  }
  // axolotl input_output: the segments carry their own BOS/EOS.
  r.add_special = false;
  r.append_eos = false;
}

// Alpaca: system, history pairs, then instruction (+ input) as the user turn and output as the reply.
void read_alpaca(const json& obj, DatasetFormat f, const std::string& where, Row& r) {
  r.kind = Row::Chat;
  const std::string sys = opt_string(obj, "system", f, where);
  const std::string& instr = need_string(obj, "instruction", f, where);
  const std::string input = opt_string(obj, "input", f, where);
  const std::string& output = need_string(obj, "output", f, where);
  if (!sys.empty()) r.messages.push_back({{"role", "system"}, {"content", sys}});
  if (const json* h = field(obj, "history")) {  // LLaMA-Factory: [[query, response], ...]
    if (!h->is_array()) missing(f, where, "has 'history' that is not a list of [query, response] pairs", obj);
    for (const json& p : *h) {
      if (!p.is_array() || p.size() != 2 || !p[0].is_string() || !p[1].is_string())
        missing(f, where, "has a 'history' entry that is not a [query, response] pair of strings", obj);
      r.messages.push_back({{"role", "user"}, {"content", p[0]}});
      r.messages.push_back({{"role", "assistant"}, {"content", p[1]}});
    }
  }
  r.messages.push_back({{"role", "user"}, {"content", input.empty() ? instr : instr + "\n" + input}});
  r.messages.push_back({{"role", "assistant"}, {"content", output}});
}

// ShareGPT / messages: the message list, an optional 'system' put first, and the template context.
void read_conversation(const json& obj, DatasetFormat f, const FieldMap& fm, const std::string& where, Row& r) {
  r.kind = Row::Chat;
  const bool sg = f == DatasetFormat::ShareGpt;
  const std::string key = !fm.messages.empty() ? fm.messages : (sg ? "conversations" : "messages");
  read_messages(obj, key, f, fm, sg, where, r);
  const std::string sys = opt_string(obj, "system", f, where);
  if (!sys.empty() && r.messages[0]["role"] != "system")
    r.messages.insert(r.messages.begin(), json{{"role", "system"}, {"content", sys}});
  read_template_context(obj, r, where);
}

// Prompt/completion: two strings (plain pieces) or two message lists (chat, the completion trained).
Row parse_prompt_completion(const json& obj, DatasetFormat f, const FieldMap& fm, const std::string& where) {
  Row r;
  const json* p = field(obj, "prompt");
  const json* c = field(obj, "completion");
  if (!p) missing(f, where, "has no 'prompt'", obj);
  if (!c) missing(f, where, "has no 'completion'", obj);
  if (p->is_string() && c->is_string()) {
    r.pieces = {{p->get<std::string>(), false}, {c->get<std::string>(), true}};
    return r;
  }
  if (!p->is_array() || !c->is_array())
    missing(f, where, "has 'prompt' and 'completion' that are not both strings or both message lists", obj);
  r.kind = Row::Chat;
  Row tmp;
  read_messages(obj, "prompt", f, fm, false, where, tmp);
  const size_t n_prompt = tmp.messages.size();
  read_messages(obj, "completion", f, fm, false, where, tmp);
  r.messages = std::move(tmp.messages);
  read_template_context(obj, r, where);
  // The completion is trained whatever its roles are (TRL's completion_only_loss).
  r.trained.assign(r.messages.size(), 0);
  for (size_t i = n_prompt; i < r.trained.size(); i++) r.trained[i] = 1;
  return r;
}

// Chat rows: each message trained when its role is in roles_to_train.
void mark_trained_roles(const MaskOptions& mask, Row& r) {
  r.trained.resize(r.messages.size());
  for (size_t i = 0; i < r.messages.size(); i++) r.trained[i] = trains(mask, r.messages[i]["role"].get<std::string>());
}

}  // namespace

const char* format_name(DatasetFormat f) { return entry(f).name; }

const char* truncation_name(Truncation t) {
  switch (t) {
    case Truncation::Drop: return "drop";
    case Truncation::TruncateLeft: return "truncate_left";
    case Truncation::TruncateRight: return "truncate_right";
    case Truncation::Error: return "error";
  }
  return "truncate_right";
}

const std::vector<Truncation>& truncations() {
  static const std::vector<Truncation> v = {Truncation::Drop, Truncation::TruncateLeft, Truncation::TruncateRight,
                                            Truncation::Error};
  return v;
}

DatasetFormat parse_format(const std::string& name, const std::string& where) {
  for (const auto& e : kFormats)
    if (name == e.name) return e.f;
  std::string all;
  for (const auto& e : kFormats) all += (all.empty() ? "" : ", ") + std::string(e.name);
  fail(ErrorKind::Config, where, "unknown dataset format '" + name + "'", "use one of: " + all);
}

DatasetFormat detect_format(const json& row, const FieldMap& fm) {
  if (!row.is_object()) return DatasetFormat::Auto;
  auto has = [&](const std::string& k) { return field(row, k) != nullptr; };
  if (has("input_ids")) return DatasetFormat::Pretokenized;
  if (has("segments")) return DatasetFormat::Segments;
  const std::string mk = fm.messages;
  if (!mk.empty() && has(mk)) {
    const json& l = row[mk];
    const bool from_value = l.is_array() && !l.empty() && l[0].is_object() && l[0].contains("from");
    return from_value ? DatasetFormat::ShareGpt : DatasetFormat::Messages;
  }
  if (has("messages")) return DatasetFormat::Messages;
  if (has("conversations")) return DatasetFormat::ShareGpt;
  if (has("chosen") && has("rejected")) return DatasetFormat::Preference;
  if (has("prompt") && has("completion") && has("label")) return DatasetFormat::Unpaired;
  if (has("prompt") && has("completion")) return DatasetFormat::PromptCompletion;
  if (has("instruction") && has("output")) return DatasetFormat::Alpaca;
  if (has(fm.text)) return DatasetFormat::Text;
  return DatasetFormat::Auto;
}

Row parse_row(const json& obj, DatasetFormat f, const FieldMap& fm, const MaskOptions& mask, const std::string& where) {
  if (!obj.is_object()) fail(ErrorKind::Data, where, "row is not a JSON object", "each line must hold one {...} object");
  Row r;
  switch (f) {
    case DatasetFormat::Text:
      r.pieces.push_back({need_string(obj, fm.text, f, where), true});
      break;
    case DatasetFormat::Pretokenized:
      read_pretokenized(obj, f, where, r);
      break;
    case DatasetFormat::Segments:
      read_segments(obj, f, where, r);
      break;
    case DatasetFormat::Alpaca:
      read_alpaca(obj, f, where, r);
      break;
    case DatasetFormat::ShareGpt:
    case DatasetFormat::Messages:
      read_conversation(obj, f, fm, where, r);
      break;
    case DatasetFormat::PromptCompletion:
      return parse_prompt_completion(obj, f, fm, where);
    case DatasetFormat::Preference:
    case DatasetFormat::Unpaired:
      return parse_preference_row(obj, f, where);
    case DatasetFormat::Auto:
      fail(ErrorKind::Internal, where, "parse_row called with format auto");
  }
  if (r.kind == Row::Chat) mark_trained_roles(mask, r);
  return r;
}

}  // namespace qlora
