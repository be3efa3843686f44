// TrainConfig loading: one key table drives defaults, parsing, validation, docs and suggestions.
#include "train/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <variant>

#include "core/error.h"
#include "core/mode_names.h"
#include "core/strings.h"
#include "model/modes.h"
#include "text/unicode.h"
#include "train/config_keys.h"

namespace qlora {
namespace {

using namespace train_keys;

// Optimal string alignment distance: a transposition counts as one typo.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  size_t limit = std::clamp<size_t>(word.size() / 4, 1, 4);
  return best_d <= limit ? best : std::string();
}

// ---------------------------------------------------------------------------------------------
// Conversion of one value into one field.

std::string fmt_double(double x) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x);
  std::string s(buf, res.ptr);
  return s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + (v[i].empty() ? std::string("\"\"") : v[i]);
  return s;
}


std::string range_text(const Range& r) {
  std::string lo = std::isinf(r.lo) ? "" : (r.lo_open ? "> " : ">= ") + fmt_double(r.lo);
  std::string hi = std::isinf(r.hi) ? "" : (r.hi_open ? "< " : "<= ") + fmt_double(r.hi);
  if (!lo.empty() && !hi.empty()) return lo + " and " + hi;
  return lo + hi;
}

struct Setter {
  const KeyRow& row;
  const Loc& loc;
  Notes& notes;

  [[noreturn]] void bad(const std::string& what, const std::string& hint) const {
    std::string key = "'" + std::string(row.name) + "'";
    if (loc.given != row.name) key += " (given as '" + loc.given + "')";
    fail(ErrorKind::Config, loc.where, "key " + key + ": " + what, hint);
  }

  std::string allowed_hint(const std::string& value) const {
    if (*row.bad_value_hint) return row.bad_value_hint;
    const std::vector<std::string> choices = row_choices(row);
    std::string hint = "allowed: " + join(choices, ", ");
    std::string near = closest(value, choices);
    if (!near.empty()) hint = "did you mean '" + near + "'? " + hint;
    return hint;
  }

  // Maps a value alias to its canonical spelling and checks it against the choices.
  std::string canonical_value(const std::string& raw) const {
    std::string v = raw;
    for (const auto& [from, to] : row.value_aliases)
      if (ascii_lower(raw) == ascii_lower(from)) {
        notes.push_back(std::string(row.name) + ": " + raw + " -> " + (to.empty() ? "\"\"" : to));
        v = to;
      }
    const std::vector<std::string> choices = row_choices(row);
    if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end())
      bad("'" + raw + "' is not allowed", allowed_hint(raw));
    return v;
  }

  std::string scalar(const YAML::Node& n, const char* expected) const {
    if (!n.IsScalar()) bad(std::string("expected ") + expected + ", got a " + (n.IsMap() ? "map" : "list"),
                           "write it as key: value");
    return trim(n.Scalar());
  }

  void check_range(double x, const std::string& text) const {
    const Range& r = row.range;
    bool low = r.lo_open ? x <= r.lo : x < r.lo;
    bool high = r.hi_open ? x >= r.hi : x > r.hi;
    if (low || high) bad(text + " is out of range", "must be " + range_text(r));
  }

  void operator()(std::string TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    c.*f = canonical_value(n.IsNull() ? std::string() : scalar(n, "a string"));
  }

  void operator()(const ModeField& f, TrainConfig& c, const YAML::Node& n) const {
    f.set(c, canonical_value(n.IsNull() ? std::string() : scalar(n, "a string")));
  }

  void operator()(int64_t TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    std::string s = scalar(n, "an integer");
    int64_t x = 0;
    auto res = std::from_chars(s.data() + (s.size() && s[0] == '+'), s.data() + s.size(), x);
    if (s.empty() || res.ec != std::errc() || res.ptr != s.data() + s.size())
      bad("'" + s + "' is not an integer", "write a whole number like 8");
    if (!row.choices.empty()) canonical_value(std::to_string(x));
    check_range(double(x), s);
    c.*f = x;
  }

  void operator()(double TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    std::string s = scalar(n, "a number");
    char* end = nullptr;
    double x = s.empty() ? 0 : std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(x))
      bad("'" + s + "' is not a number", "write a number like 2e-4 or 0.05");
    check_range(x, s);
    c.*f = x;
  }

  void operator()(bool TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    std::string s = scalar(n, "true or false");
    for (const auto& [from, to] : row.value_aliases)
      if (ascii_lower(s) == ascii_lower(from)) {
        notes.push_back(std::string(row.name) + ": " + s + " -> " + to);
        s = to;
      }
    std::string l = ascii_lower(s);
    if (l == "true" || l == "yes" || l == "on") c.*f = true;
    else if (l == "false" || l == "no" || l == "off") c.*f = false;
    else bad("'" + s + "' is not a boolean", "write true or false");
  }

  void operator()(std::vector<std::string> TrainConfig::*f, TrainConfig& c, const YAML::Node& n) const {
    std::vector<std::string> items;
    if (n.IsSequence()) {
      for (const YAML::Node& e : n) items.push_back(scalar(e, row.list_of_text ? "a list of texts" : "a list of names"));
    } else if (n.IsScalar() && row.list_of_text) {
      if (!trim(n.Scalar()).empty()) items.push_back(trim(n.Scalar()));
    } else if (n.IsScalar()) {
      // LLaMA-Factory style "q_proj,v_proj"
      items = split_commas(n.Scalar());
    } else if (!n.IsNull()) {
      bad("expected a list, got a map", "write [a, b] or a, b");
    }
    for (std::string& it : items) it = canonical_value(it);
    c.*f = items;
  }
};

void set_field(TrainConfig& c, const KeyRow& row, YAML::Node value, const Loc& loc, Notes& notes) {
  if (value.IsNull() && row.null_as) value = YAML::Node(std::string(row.null_as));
  if (value.IsNull() && !takes_text(row) && !std::holds_alternative<std::vector<std::string> TrainConfig::*>(row.field))
    Setter{row, loc, notes}.bad("has no value", std::string("expected ") + kTypeNames[row.field.index()]);
  Setter s{row, loc, notes};
  std::visit([&](auto f) { s(f, c, value); }, row.field);
}

// ---------------------------------------------------------------------------------------------
// Collecting entries from the file and the overrides.

std::string mark_where(const std::string& origin, const YAML::Mark& m) {
  return origin + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

std::vector<std::string> all_key_names() {
  std::vector<std::string> names;
  for (const KeyRow& r : key_table()) names.push_back(r.name);
  for (const AliasRow& a : alias_table()) names.push_back(a.alias);
  return names;
}

[[noreturn]] void unknown_key(const std::string& key, const std::string& where) {
  std::string near = suggest_config_key(key);
  fail(ErrorKind::Config, where, "unknown key '" + key + "'",
       near.empty() ? "run `qlora train --help-config` for the list of keys" : "did you mean '" + near + "'?");
}

// Resolves aliases (recursively through expansions) into canonical entries.
void resolve(const std::string& key, const YAML::Node& value, const Loc& loc, Notes& notes,
             std::vector<Entry>& out) {
  if (value.IsNull()) {
    // An empty value keeps the default (axolotl configs list unset keys that way), unless null
    // means something for that key (torchtune clip_grad_norm: null = no clipping).
    const AliasRow* a = find_alias(key);
    const KeyRow* row = find_row(a && !a->expand ? a->canonical : key);
    if (!a && !row) unknown_key(key, loc.where);
    if (!row || !row->null_as || (a && a->expand)) return;
  }
  // torchtune nests component fields: optimizer: {_component_: ..., lr: ...}
  if (value.IsMap() && (key == "optimizer" || key == "lr_scheduler")) {
    for (auto it = value.begin(); it != value.end(); ++it)
      resolve(key + "." + it->first.as<std::string>(), it->second, {loc.where, key + "." + it->first.as<std::string>()},
              notes, out);
    return;
  }
  if (const AliasRow* a = find_alias(key)) {
    if (a->expand) {
      for (Entry& e : a->expand(value, loc, notes)) out.push_back(std::move(e));
    } else {
      notes.push_back(key + " -> " + a->canonical);
      out.push_back({a->canonical, value, loc});
    }
    return;
  }
  if (!find_row(key)) unknown_key(key, loc.where);
  out.push_back({key, value, loc});
}

YAML::Node parse_yaml_text(const std::string& text, const std::string& origin) {
  auto reject = [&](size_t bad, const char* what, const char* hint) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < bad; i++) text[i] == '\n' ? (line++, col = 1) : col++;
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(text[bad]));
    fail(ErrorKind::Config, origin + ":" + std::to_string(line) + ":" + std::to_string(col),
         std::string(what) + " (byte " + byte + ")", hint);
  };
  // YAML is UTF-8 text; yaml-cpp would pass other bytes through into paths and names.
  if (size_t bad = 0; !unicode::is_valid_utf8(text, &bad)) reject(bad, "invalid UTF-8", "save the file as UTF-8");
  // YAML streams hold printable characters only (YAML 1.2, 5.1 c-printable): of the C0 controls
  // just tab, line feed and carriage return. A NUL or \x01 would otherwise end up inside a path.
  for (size_t i = 0; i < text.size(); i++) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    if ((ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') || ch == 0x7f)
      reject(i, "a control character, which YAML does not allow", "remove it");
  }
  try {
    return YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail(ErrorKind::Config, mark_where(origin, e.mark), "YAML syntax error: " + e.msg,
         "check indentation and that every key is followed by ': '");
  }
}

bool same_value(const YAML::Node& a, const YAML::Node& b) {
  if (a.IsScalar() && b.IsScalar()) return ascii_lower(trim(a.Scalar())) == ascii_lower(trim(b.Scalar()));
  if (a.IsSequence() && b.IsSequence() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size(); ++i)
      if (!same_value(a[i], b[i])) return false;
    return true;
  }
  return false;
}

std::vector<Entry> file_entries(const YAML::Node& root, const std::string& origin, Notes& notes) {
  std::vector<Entry> out;
  if (!root || root.IsNull()) return out;
  if (!root.IsMap())
    fail(ErrorKind::Config, mark_where(origin, root.Mark()), "the config must be a YAML map of key: value",
         "for example `learning_rate: 2e-4` on its own line");
  struct Seen {
    Loc loc;
    YAML::Node value;
  };
  std::map<std::string, Seen> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (!it->first.IsScalar())
      fail(ErrorKind::Config, mark_where(origin, it->first.Mark()), "keys must be plain names");
    std::string key = it->first.Scalar();
    Loc loc{mark_where(origin, it->second.IsNull() ? it->first.Mark() : it->second.Mark()), key};
    std::vector<Entry> resolved;
    try {
      resolve(key, it->second, loc, notes, resolved);
    } catch (const Error& e) {
      // unknown keys point at the key, not its value
      if (e.message().rfind("unknown key", 0) == 0)
        fail(e.kind(), mark_where(origin, it->first.Mark()), e.message(), e.hint());
      throw;
    }
    for (Entry& e : resolved) {
      auto [prev, fresh] = seen.emplace(e.key, Seen{e.loc, e.value});
      // `adapter: qlora` next to `load_in_4bit: true` says the same thing twice; that is fine
      if (!fresh && same_value(prev->second.value, e.value)) continue;
      if (!fresh)
        fail(ErrorKind::Config, e.loc.where,
             "'" + e.loc.given + "' sets '" + e.key + "', already set by '" + prev->second.loc.given + "' at " +
                 prev->second.loc.where + " to a different value",
             "keep only one of them");
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::vector<Entry> override_entries(const std::vector<std::string>& overrides, Notes& notes) {
  std::vector<Entry> out;
  for (const std::string& raw : overrides) {
    std::string ov = raw.rfind("--", 0) == 0 ? raw.substr(2) : raw;
    size_t eq = ov.find('=');
    std::string where = "override '" + raw + "'";
    if (eq == std::string::npos || eq == 0)
      fail(ErrorKind::Config, where, "overrides are key=value", "for example learning_rate=1e-4");
    std::string key = trim(ov.substr(0, eq)), text = trim(ov.substr(eq + 1));
    // Strings are taken verbatim (chat templates and paths are not YAML); the rest parse as YAML
    // so that lists like [q_proj,v_proj] work.
    std::string target = key;
    if (const AliasRow* a = find_alias(key); a && !a->expand) target = a->canonical;
    const KeyRow* row = find_row(target);
    YAML::Node value;
    if (row && takes_text(*row)) {
      value = YAML::Node(text);
    } else if (text.empty()) {
      value = YAML::Node(YAML::NodeType::Null);
    } else {
      value = parse_yaml_text(text, where);
    }
    resolve(key, value, {where, key}, notes, out);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Cross-field checks and derived values, after every entry is applied.

std::optional<double> parse_router_aux_loss_coef(const std::string& v, const std::string& where) {
  if (v == "auto" || v.empty()) return std::nullopt;
  double x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x) || x < 0)
    fail(ErrorKind::Config, where, "router_aux_loss_coef '" + v + "' is not auto or a number >= 0",
         "e.g. router_aux_loss_coef: 0.001 (Qwen3-MoE's and gpt-oss's own), 0.02 (Mixtral's), 0 for none");
  return x;
}

// Whether c holds the key table's default for key (the one place defaults are written).
bool at_default(const TrainConfig& c, const char* key) {
  const KeyRow& row = *find_row(key);
  TrainConfig d = c;
  Notes ignored;
  set_field(d, row, YAML::Node(std::string(row.def)), {"default of " + std::string(row.name), row.name}, ignored);
  return d == c;
}

namespace {

// finalize's stages over one config, with where each key was set (for messages).
struct Finalizer {
  TrainConfig& c;
  const std::map<std::string, Loc>& set_at;
  Notes& notes;

  std::string where(const std::string& key) const {
    auto it = set_at.find(key);
    return it != set_at.end() ? it->second.where : "config key '" + key + "'";
  }
  bool is_set(const std::string& key) const { return set_at.count(key) > 0; }

  void check_inputs(bool require_inputs) const {
    if (require_inputs && c.model_name_or_path.empty())
      fail(ErrorKind::Config, "config key 'model_name_or_path'", "model_name_or_path is required",
           "set model_name_or_path: path/to/hf_model_dir (axolotl: base_model)");
    if (require_inputs && c.train_file.empty() && c.dataset_mix.empty())
      fail(ErrorKind::Config, "config key 'train_file'", "train_file is required",
           "set train_file: data.jsonl (axolotl: datasets: [{path: data.jsonl, type: alpaca}])");
    if (!c.train_file.empty() && !c.dataset_mix.empty())
      fail(ErrorKind::Config, where("dataset_mix"), "both train_file and dataset_mix (datasets) are set",
           "list every training file in dataset_mix / datasets, or use train_file alone");
  }

  void resolve_target_modules() {
    // target_modules: explicit names in Llama order, all-linear expanded
    auto& tm = c.target_modules;
    bool all = std::find(tm.begin(), tm.end(), "all-linear") != tm.end();
    if (tm.empty() && c.target_parameters.empty())  // LoRA on the experts alone leaves it empty (PEFT: null)
      fail(ErrorKind::Config, where("target_modules"), "target_modules is empty",
           "list modules like [q_proj, v_proj] or use all-linear");
    if (all && tm.size() > 1)
      fail(ErrorKind::Config, where("target_modules"), "all-linear cannot be combined with other modules",
           "use either all-linear or a list of modules");
    std::vector<std::string> ordered;
    for (const std::string& m : linear_modules())
      if (all || std::find(tm.begin(), tm.end(), m) != tm.end()) ordered.push_back(m);
    tm = ordered;
  }

  void check_eval_and_steps() const {
    if (c.val_set_size >= 1 && c.val_set_size != std::floor(c.val_set_size))
      fail(ErrorKind::Config, where("val_set_size"), "val_set_size " + fmt_double(c.val_set_size) +
           " is neither a fraction below 1 nor a whole row count", "use e.g. 0.05 or 200");
    if (c.val_set_size > 0 && !c.eval_file.empty())
      fail(ErrorKind::Config, where("val_set_size"), "both eval_file and val_set_size are set",
           "use eval_file for a separate file, or val_set_size to split train_file, not both");
    for (size_t i = 0; i < c.sample_prompts.size(); i++)
      if (c.sample_prompts[i].empty())
        fail(ErrorKind::Config, where("sample_prompts"),
             "sample_prompts entry " + std::to_string(i + 1) + " is empty",
             "remove it, or write the question the model should answer");
    if (c.max_steps == 0)
      fail(ErrorKind::Config, where("max_steps"), "max_steps 0 would train nothing",
           "use -1 to derive steps from num_train_epochs, or a positive count");
  }

  void resolve_4bit() {
    // Base precision and bitsandbytes-style 4-bit flags must describe one format.
    const std::string base = base_storage_name(c.base_precision), bnb = base_precision_name(c.bnb_4bit_quant_type);
    const bool bp_4bit = c.base_precision && is_bnb_4bit(*c.base_precision);
    if (bp_4bit && !c.load_in_4bit) {
      if (is_set("bnb_4bit_quant_type") && c.bnb_4bit_quant_type != *c.base_precision)
        fail(ErrorKind::Config, where("bnb_4bit_quant_type"),
             "base_precision " + base + " conflicts with bnb_4bit_quant_type " + bnb, "set only one of them");
      c.load_in_4bit = true;
      c.bnb_4bit_quant_type = *c.base_precision;
      notes.push_back("base_precision: " + base + " -> load_in_4bit: true");
    } else if (c.load_in_4bit) {
      if (c.base_precision && *c.base_precision != c.bnb_4bit_quant_type)
        fail(ErrorKind::Config, where("base_precision"),
             "load_in_4bit quantizes the base to " + bnb + ", but base_precision is " + base,
             "drop load_in_4bit (and adapter: qlora / quantization_bit) to keep " + base + ", or drop base_precision");
      if (!c.base_precision) notes.push_back("load_in_4bit: base_precision -> " + bnb);
      c.base_precision = c.bnb_4bit_quant_type;
      if (!is_set("bnb_4bit_use_double_quant"))
        notes.push_back("load_in_4bit: bnb_4bit_use_double_quant defaults to true (QLoRA)");
    }
  }

  // finetuning_type full: the LoRA keys change nothing, and what full training does not implement yet.
  void check_full_training_keys() const {
    if (c.finetuning_type != FinetuningType::Full) return;
    for (const char* key : {"r", "lora_alpha", "lora_dropout", "use_rslora", "target_modules", "target_parameters"})
      if (is_set(key))
        fail(ErrorKind::Config, where(key), std::string(key) + " applies to finetuning_type: lora, not full",
             std::string("remove ") + key + ", or set finetuning_type: lora");
    if (c.load_in_4bit || (c.base_precision && is_quantized(*c.base_precision)))
      fail(ErrorKind::Config, where(c.load_in_4bit ? "load_in_4bit" : "base_precision"),
           "finetuning_type full trains the weights themselves, and a quantized base cannot be trained",
           "QLoRA is LoRA on a quantized base: set finetuning_type: lora, or drop the quantization");
    if (c.rl != Objective::Sft)
      fail(ErrorKind::Config, where("rl"), std::string("rl: ") + objective_name(c.rl) +
           " with finetuning_type full is not implemented yet (the frozen reference of a fully trained policy)",
           "use finetuning_type: lora for preference training");
  }

  void check_preference_keys() const {
    // Preference keys only where the objective uses them: a value that would change nothing is refused.
    const Objective o = c.rl;
    const std::string m = objective_name(o);
    auto only_for = [&](const char* key, bool applies, const std::string& who) {
      if (!applies && !at_default(c, key))
        fail(ErrorKind::Config, where(key), std::string(key) + " applies to " + who + ", not to rl: " + m,
             std::string("remove ") + key + " or set rl accordingly");
    };
    const bool pref = is_preference(o);
    const bool dpo_smoothed = o == Objective::Dpo && (c.loss_type == DpoLoss::Sigmoid || c.loss_type == DpoLoss::Robust);
    only_for("loss_type", o == Objective::Dpo, "rl: dpo");
    only_for("beta", pref, "the preference objectives (rl: dpo, orpo, simpo, kto)");
    only_for("label_smoothing", dpo_smoothed || o == Objective::Simpo,
             "rl: dpo with loss_type sigmoid or robust, and rl: simpo");
    only_for("simpo_gamma", o == Objective::Simpo, "rl: simpo");
    only_for("cpo_alpha", o == Objective::Simpo, "rl: simpo");
    only_for("desirable_weight", o == Objective::Kto, "rl: kto");
    only_for("undesirable_weight", o == Objective::Kto, "rl: kto");
    only_for("precompute_ref_log_probs", uses_reference(o), "rl: dpo and kto (the objectives with a reference)");
    if (o == Objective::Kto && c.per_device_train_batch_size < 2)
      fail(ErrorKind::Config, where("per_device_train_batch_size"),
           "rl: kto needs per_device_train_batch_size of at least 2: each row's KL probe pairs its prompt with "
           "another row's completion of the same batch",
           "set per_device_train_batch_size: 2 or more (TRL refuses 1 too)");
    if (pref && c.packing)
      fail(ErrorKind::Config, where("packing"), "packing is not implemented for rl: " + m,
           "remove packing: each preference row already holds its completions back to back, unpadded");
    if (pref && c.train_on_inputs)
      fail(ErrorKind::Config, where("train_on_inputs"), "train_on_inputs does not apply to rl: " + m,
           "preference objectives score the completions only; remove train_on_inputs");
  }

  void note_warmup() {
    if (c.warmup_steps > 0 && c.warmup_ratio > 0)
      notes.push_back("warmup_steps " + std::to_string(c.warmup_steps) + " wins over warmup_ratio " +
                      fmt_double(c.warmup_ratio));
    if (c.lr_scheduler_type == LrScheduler::Constant && (c.warmup_steps > 0 || c.warmup_ratio > 0))
      notes.push_back("lr_scheduler_type constant ignores warmup (use constant_with_warmup)");
  }
};

}  // namespace

void finalize(TrainConfig& c, const std::map<std::string, Loc>& set_at, Notes& notes, bool require_inputs) {
  Finalizer f{c, set_at, notes};
  f.check_inputs(require_inputs);
  if (c.per_device_eval_batch_size == 0) c.per_device_eval_batch_size = c.per_device_train_batch_size;
  f.resolve_target_modules();
  f.check_eval_and_steps();
  parse_router_aux_loss_coef(c.router_aux_loss_coef, f.where("router_aux_loss_coef"));  // auto or a number >= 0
  f.resolve_4bit();
  f.check_full_training_keys();
  f.check_preference_keys();
  f.note_warmup();
}

// Table defaults before derivation: eval batch size 0 and target_modules all-linear still unresolved.
void apply_table_defaults(TrainConfig& c) {
  Notes ignored;
  for (const KeyRow& row : key_table())
    set_field(c, row, YAML::Node(std::string(row.def)), {"default of " + std::string(row.name), row.name}, ignored);
}

TrainConfig build(const YAML::Node& root, const std::string& origin, const std::vector<std::string>& overrides,
                  Notes* notes_out, bool require_inputs) {
  Notes notes;
  std::vector<Entry> entries = file_entries(root, origin, notes);
  for (Entry& e : override_entries(overrides, notes)) entries.push_back(std::move(e));
  TrainConfig c;
  apply_table_defaults(c);
  std::map<std::string, Loc> set_at;
  for (const Entry& e : entries) {
    set_field(c, *find_row(e.key), e.value, e.loc, notes);
    set_at[e.key] = e.loc;
  }
  finalize(c, set_at, notes, require_inputs);
  if (notes_out) notes_out->insert(notes_out->end(), notes.begin(), notes.end());
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TrainConfig::TrainConfig() {
  Notes ignored;
  apply_table_defaults(*this);
  finalize(*this, {}, ignored, false);
}

void finalize_train_config(TrainConfig& cfg, std::vector<std::string>* notes) {
  Notes local;
  finalize(cfg, {}, notes ? *notes : local, false);
}

TrainConfig parse_train_config(const std::string& yaml_text, const std::string& origin,
                               const std::vector<std::string>& overrides, std::vector<std::string>* notes,
                               bool require_train_inputs) {
  return build(parse_yaml_text(yaml_text, origin), origin, overrides, notes, require_train_inputs);
}

TrainConfig load_train_config(const std::string& yaml_path, const std::vector<std::string>& overrides,
                              std::vector<std::string>* notes, bool require_train_inputs) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(yaml_path, ec))
    fail(ErrorKind::Io, yaml_path, "config file not found",
         "pass the path of a YAML file, e.g. qlora train examples/smollm2_qlora.yaml");
  std::ifstream in(yaml_path, std::ios::binary);
  if (!in) fail(ErrorKind::Io, yaml_path, "cannot read config file", "check its permissions");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_train_config(ss.str(), yaml_path, overrides, notes, require_train_inputs);
}

std::string dump_train_config(const TrainConfig& c) {
  YAML::Emitter out;
  out << YAML::Comment("effective qlora training config (every key, defaults included)") << YAML::Newline;
  out << YAML::BeginMap;
  for (const KeyRow& row : key_table()) {
    out << YAML::Key << row.name << YAML::Value;
    std::visit(
        [&](auto f) {
          using F = decltype(f);
          if constexpr (std::is_same_v<F, double TrainConfig::*>) out << fmt_double(c.*f);
          else if constexpr (std::is_same_v<F, std::vector<std::string> TrainConfig::*>)
            out << YAML::Flow << c.*f;
          else if constexpr (std::is_same_v<F, std::string TrainConfig::*>) out << YAML::DoubleQuoted << c.*f;
          else if constexpr (std::is_same_v<F, ModeField>) out << YAML::DoubleQuoted << f.get(c);
          else out << c.*f;
        },
        row.field);
  }
  out << YAML::EndMap;
  return std::string(out.c_str(), out.size()) + "\n";  // a value may hold a NUL (a "\0" escape)
}

std::vector<ConfigKeyDoc> config_key_docs() {
  std::vector<ConfigKeyDoc> docs;
  for (const KeyRow& row : key_table()) {
    ConfigKeyDoc d{row.name, kTypeNames[row.field.index()], row.def, "", row.help, {}};
    if (!row_choices(row).empty()) d.allowed = join(row_choices(row), ", ");
    else if (!std::isinf(row.range.lo) || !std::isinf(row.range.hi)) d.allowed = range_text(row.range);
    for (const auto& [from, to] : row.value_aliases)
      d.allowed += std::string(d.allowed.empty() ? "" : "; ") + from + " = " + (to.empty() ? "\"\"" : to);
    for (const AliasRow& a : alias_table())
      if (a.canonical == d.name && a.alias != d.name) d.aliases.push_back(a.alias);
    docs.push_back(std::move(d));
  }
  return docs;
}

std::string config_reference_markdown() {
  std::string md = "| key | type | default | allowed | description | aliases |\n|---|---|---|---|---|---|\n";
  auto cell = [](std::string s) {
    std::string out;
    for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  for (const ConfigKeyDoc& d : config_key_docs()) {
    std::string aliases;
    for (const std::string& a : d.aliases) aliases += (aliases.empty() ? "`" : ", `") + a + "`";
    md += "| `" + d.name + "` | " + d.type + " | " + (d.default_value.empty() ? "\"\"" : "`" + d.default_value + "`") +
          " | " + cell(d.allowed) + " | " + cell(d.help) + " | " + aliases + " |\n";
  }
  md += "\nAlso accepted: `adapter: lora|qlora` (qlora = `load_in_4bit: true`), `quantization_bit: 4`, "
        "`lora_target_linear: true` (= `target_modules: all-linear`), axolotl `datasets: [{path, type, weight}]` "
        "(one entry = train_file, several = dataset_mix), `message_property_mappings: {role, content}`, TRL "
        "`completion_only_loss` / `assistant_only_loss` (= `train_on_inputs: false`), torchtune `optimizer.*` / `lr_scheduler.*` fields, and `warmup_steps` below 1 as a ratio.\n";
  return md;
}

std::string suggest_config_key(const std::string& key) { return closest(key, all_key_names()); }

bool reports_to_tensorboard(const TrainConfig& cfg) { return writes_tensorboard(cfg.report_to); }

std::optional<double> router_aux_loss_coef_value(const TrainConfig& c) {
  return parse_router_aux_loss_coef(c.router_aux_loss_coef, "config key 'router_aux_loss_coef'");
}

}  // namespace qlora
