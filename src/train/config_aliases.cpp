// The alias table: other tools' spellings of the config keys (axolotl, LLaMA-Factory, torchtune,
// older TRL), plain renames and expansions into canonical entries.
#include "train/config_keys.h"

#include "core/error.h"
#include "core/strings.h"

namespace qlora::train_keys {
namespace {

std::string scalar_text(const YAML::Node& n) { return n.IsScalar() ? n.Scalar() : std::string(); }

Entry make_entry(const std::string& key, const std::string& value, const Loc& loc) {
  return {key, YAML::Node(value), loc};
}

std::vector<Entry> expand_lora_target_linear(const YAML::Node& v, const Loc& loc, Notes& notes) {
  std::string s = ascii_lower(scalar_text(v));
  if (s == "true") {
    notes.push_back("lora_target_linear: true -> target_modules: all-linear");
    return {make_entry("target_modules", "all-linear", loc)};
  }
  if (s == "false" || v.IsNull()) {
    notes.push_back("lora_target_linear: false ignored (set target_modules)");
    return {};
  }
  fail(ErrorKind::Config, loc.where, "lora_target_linear: '" + s + "' is not true/false",
       "use target_modules: all-linear");
}

std::vector<Entry> expand_adapter(const YAML::Node& v, const Loc& loc, Notes& notes) {
  std::string s = ascii_lower(scalar_text(v));
  if (s == "lora") {
    notes.push_back("adapter: lora (the default)");
    return {};
  }
  if (s == "qlora") {
    notes.push_back("adapter: qlora -> load_in_4bit: true");
    return {make_entry("load_in_4bit", "true", loc)};
  }
  fail(ErrorKind::Config, loc.where, "adapter: '" + scalar_text(v) + "' is not supported",
       "use adapter: lora or adapter: qlora (DoRA/full fine-tuning are not implemented)");
}

std::vector<Entry> expand_quantization_bit(const YAML::Node& v, const Loc& loc, Notes& notes) {
  std::string s = scalar_text(v);
  if (s == "4") {
    notes.push_back("quantization_bit: 4 -> load_in_4bit: true");
    return {make_entry("load_in_4bit", "true", loc)};
  }
  fail(ErrorKind::Config, loc.where, "quantization_bit: '" + s + "' is not supported",
       "use quantization_bit: 4 (bitsandbytes 4-bit), or base_precision: fp8 for 8-bit weights");
}

// axolotl: message_property_mappings: {role: from, content: value}
std::vector<Entry> expand_message_property_mappings(const YAML::Node& v, const Loc& loc, Notes& notes) {
  if (!v.IsMap()) fail(ErrorKind::Config, loc.where, loc.given + " must be a map like {role: from, content: value}");
  std::vector<Entry> out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (k != "role" && k != "content")
      fail(ErrorKind::Config, loc.where, loc.given + ": unsupported key '" + k + "'", "supported: role, content");
    notes.push_back(loc.given + "." + k + " -> message_field_" + k);
    out.push_back({"message_field_" + k, it->second, loc});
  }
  return out;
}

// TRL: completion_only_loss / assistant_only_loss: true == train_on_inputs: false.
std::vector<Entry> expand_only_loss(const YAML::Node& v, const Loc& loc, Notes& notes) {
  const std::string s = ascii_lower(scalar_text(v));
  if (s != "true" && s != "false")
    fail(ErrorKind::Config, loc.where, loc.given + ": '" + scalar_text(v) + "' is not true/false");
  const std::string inv = s == "true" ? "false" : "true";
  notes.push_back(loc.given + ": " + s + " -> train_on_inputs: " + inv);
  return {make_entry("train_on_inputs", inv, loc)};
}

// axolotl: datasets: [{path: data.jsonl, type: alpaca, weight: 2}, ...]. One plain entry sets
// train_file (+ dataset_format); several (or a weight) become dataset_mix entries.
std::vector<Entry> expand_datasets(const YAML::Node& v, const Loc& loc, Notes& notes) {
  if (!v.IsSequence() || v.size() == 0)
    fail(ErrorKind::Config, loc.where, "datasets must be a list of {path: ..., type: ..., weight: ...} entries",
         "or set train_file: data.jsonl and dataset_format: alpaca");
  std::vector<Entry> out;
  std::vector<std::string> mix;
  bool weighted = false;
  for (size_t i = 0; i < v.size(); i++) {
    const YAML::Node& d = v[i];
    const std::string at = "datasets[" + std::to_string(i) + "]";
    if (d.IsScalar() && v.size() == 1) {
      notes.push_back("datasets[0] -> train_file");
      return {{"train_file", d, loc}};
    }
    if (d.IsScalar()) {
      mix.push_back(d.Scalar());
      continue;
    }
    if (!d.IsMap()) fail(ErrorKind::Config, loc.where, at + " must be a map like {path: data.jsonl, type: alpaca}");
    std::string path, type, weight;
    for (auto it = d.begin(); it != d.end(); ++it) {
      std::string k = it->first.as<std::string>();
      Loc sub{loc.where, at + "." + k};
      if (k == "path" || k == "data_files") {
        path = scalar_text(it->second);
      } else if (k == "type") {
        type = scalar_text(it->second);
        for (const auto& [from, to] : find_row("dataset_format")->value_aliases)
          if (ascii_lower(type) == ascii_lower(from)) type = to;
      } else if (k == "weight") {
        weight = scalar_text(it->second);
        char* end = nullptr;
        const double w = std::strtod(weight.c_str(), &end);
        if (weight.empty() || *end != '\0' || !(w > 0) || !std::isfinite(w))
          fail(ErrorKind::Config, loc.where, at + ".weight: '" + weight + "' is not a positive number",
               "weight 2 = every row twice per epoch, 0.5 = a seeded half");
        weighted = true;
      } else if (k == "ds_type") {
        std::string t = ascii_lower(scalar_text(it->second));
        if (t != "json" && t != "jsonl")
          fail(ErrorKind::Config, loc.where, at + ".ds_type: '" + t + "' is not supported", "only JSON / JSONL files are read");
      } else if (k == "field_messages" || k == "roles_to_train" || k == "train_on_inputs") {
        notes.push_back(at + "." + k + " -> " + k + " (applies to every dataset)");
        out.push_back({k, it->second, sub});
      } else if (k == "message_property_mappings") {
        for (Entry& e : expand_message_property_mappings(it->second, sub, notes)) out.push_back(std::move(e));
      } else {
        fail(ErrorKind::Config, loc.where, at + ": unsupported key '" + k + "'",
             "supported: path, type, weight, ds_type: json, field_messages, message_property_mappings, roles_to_train");
      }
    }
    if (path.empty()) fail(ErrorKind::Config, loc.where, at + " has no path");
    if (v.size() == 1 && !weighted) {
      notes.push_back("datasets[0].path -> train_file");
      out.push_back({"train_file", YAML::Node(path), {loc.where, at + ".path"}});
      if (!type.empty()) {
        notes.push_back("datasets[0].type -> dataset_format");
        out.push_back({"dataset_format", d["type"], {loc.where, at + ".type"}});
      }
      return out;
    }
    mix.push_back(path + (weight.empty() ? "" : " weight=" + weight) + (type.empty() ? "" : " format=" + type));
  }
  notes.push_back("datasets -> dataset_mix (" + std::to_string(mix.size()) + " files)");
  YAML::Node list(YAML::NodeType::Sequence);
  for (const std::string& m : mix) list.push_back(m);
  out.push_back({"dataset_mix", list, loc});
  return out;
}

// torchtune: optimizer.betas: [0.9, 0.999]
std::vector<Entry> expand_betas(const YAML::Node& v, const Loc& loc, Notes& notes) {
  if (!v.IsSequence() || v.size() != 2)
    fail(ErrorKind::Config, loc.where, loc.given + " must be a list of two numbers like [0.9, 0.999]");
  notes.push_back(loc.given + " -> adam_beta1, adam_beta2");
  return {{"adam_beta1", v[0], loc}, {"adam_beta2", v[1], loc}};
}

// transformers >= 5 spells warmup_ratio as a fractional warmup_steps.
std::vector<Entry> expand_warmup_steps(const YAML::Node& v, const Loc& loc, Notes& notes) {
  std::string s = scalar_text(v);
  char* end = nullptr;
  double x = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  if (end && *end == '\0' && x > 0 && x < 1) {
    notes.push_back("warmup_steps: " + s + " is a ratio -> warmup_ratio: " + s);
    return {{"warmup_ratio", v, loc}};
  }
  return {{"warmup_steps", v, loc}};
}

// LLaMA-Factory's stage: sft, dpo or kto (reward modelling and PPO are not implemented).
std::vector<Entry> expand_stage(const YAML::Node& v, const Loc& loc, Notes& notes) {
  const std::string s = ascii_lower(scalar_text(v));
  if (s == "sft" || s == "dpo" || s == "kto") {
    notes.push_back("stage: " + s + " -> rl: " + s);
    return {make_entry("rl", s, loc)};
  }
  fail(ErrorKind::Config, loc.where, "stage: '" + scalar_text(v) + "' is not supported",
       "use stage: sft, dpo or kto (pt, rm and ppo are not implemented)");
}

// LLaMA-Factory's pref_loss: sigmoid/hinge/ipo are DPO's loss types; orpo and simpo are methods.
std::vector<Entry> expand_pref_loss(const YAML::Node& v, const Loc& loc, Notes& notes) {
  const std::string s = ascii_lower(scalar_text(v));
  if (s == "sigmoid" || s == "hinge" || s == "ipo") {
    notes.push_back("pref_loss: " + s + " -> loss_type: " + s);
    return {make_entry("loss_type", s, loc)};
  }
  if (s == "orpo" || s == "simpo") {
    notes.push_back("pref_loss: " + s + " -> rl: " + s);
    return {make_entry("rl", s, loc)};
  }
  fail(ErrorKind::Config, loc.where, "pref_loss: '" + scalar_text(v) + "' is not supported",
       "use sigmoid, hinge, ipo (DPO), orpo or simpo; robust: loss_type: robust");
}

// TRL's truncation_mode: keep_start cuts the end of each sequence, keep_end its start.
std::vector<Entry> expand_truncation_mode(const YAML::Node& v, const Loc& loc, Notes& notes) {
  const std::string s = ascii_lower(scalar_text(v));
  const char* to = s == "keep_start" ? "truncate_right" : s == "keep_end" ? "truncate_left" : nullptr;
  if (!to)
    fail(ErrorKind::Config, loc.where, "truncation_mode: '" + scalar_text(v) + "' is not keep_start or keep_end",
         "or set truncation: drop | truncate_left | truncate_right | error");
  notes.push_back("truncation_mode: " + s + " -> truncation: " + to);
  return {make_entry("truncation", to, loc)};
}

// LLaMA-Factory keys that only confirm what qlora does anyway.
Expand accept_only(const char* key, const char* ok, const char* hint) {
  return [=](const YAML::Node& v, const Loc& loc, Notes& notes) -> std::vector<Entry> {
    if (ascii_lower(scalar_text(v)) != ok)
      fail(ErrorKind::Config, loc.where, std::string(key) + ": '" + scalar_text(v) + "' is not supported", hint);
    notes.push_back(std::string(key) + ": " + ok + " (the default)");
    return {};
  };
}

}  // namespace

const std::vector<AliasRow>& alias_table() {
  static const std::vector<AliasRow> rows = {
      {"base_model", "model_name_or_path"},
      {"micro_batch_size", "per_device_train_batch_size"},
      {"batch_size", "per_device_train_batch_size"},
      {"num_epochs", "num_train_epochs"},
      {"epochs", "num_train_epochs"},
      {"lr", "learning_rate"},
      {"lr_scheduler", "lr_scheduler_type"},
      {"sequence_len", "max_length"},
      {"cutoff_len", "max_length"},
      {"max_seq_length", "max_length"},
      {"max_seq_len", "max_length"},
      {"lora_r", "r"},
      {"lora_rank", "r"},
      {"lora_target_modules", "target_modules"},
      {"lora_target", "target_modules"},
      {"lora_target_linear", "target_modules", expand_lora_target_linear},
      {"sample_packing", "packing"},
      {"val_size", "val_set_size"},
      {"evaluation_strategy", "eval_strategy"},
      {"optimizer", "optim"},
      {"clip_grad_norm", "max_grad_norm"},
      {"log_every_n_steps", "logging_steps"},
      {"enable_activation_checkpointing", "gradient_checkpointing"},
      {"datasets", "dataset_mix", expand_datasets},
      {"message_property_mappings", "message_field_role", expand_message_property_mappings},
      {"completion_only_loss", "train_on_inputs", expand_only_loss},
      {"assistant_only_loss", "train_on_inputs", expand_only_loss},
      {"train_on_prompt", "train_on_inputs"},
      {"train_on_input", "train_on_inputs"},
      {"dataset_type", "dataset_format"},
      {"adapter", "load_in_4bit", expand_adapter},
      {"quantization_bit", "load_in_4bit", expand_quantization_bit},
      {"quantization_method", "load_in_4bit",
       accept_only("quantization_method", "bitsandbytes", "only bitsandbytes-style 4-bit (nf4/fp4) is implemented")},
      // torchtune component fields, as dotted overrides or nested maps
      {"optimizer.lr", "learning_rate"},
      {"optimizer._component_", "optim"},
      {"optimizer.weight_decay", "weight_decay"},
      {"optimizer.eps", "adam_epsilon"},
      {"optimizer.betas", "adam_beta1", expand_betas},
      {"lr_scheduler._component_", "lr_scheduler_type"},
      {"lr_scheduler.num_warmup_steps", "warmup_steps"},
      {"warmup_steps", "warmup_steps", expand_warmup_steps},
      // preference training: axolotl (rl_beta, kto_*_weight), LLaMA-Factory (stage, pref_*), TRL
      {"rl_beta", "beta"},
      {"moe_aux_loss_coef", "router_aux_loss_coef"},  // LLaMA-Factory
      {"pref_beta", "beta"},
      {"dpo_beta", "beta"},
      {"dpo_label_smoothing", "label_smoothing"},
      {"dpo_loss_type", "loss_type"},
      {"kto_desirable_weight", "desirable_weight"},
      {"kto_chosen_weight", "desirable_weight"},
      {"kto_undesirable_weight", "undesirable_weight"},
      {"kto_rejected_weight", "undesirable_weight"},
      {"stage", "rl", expand_stage},
      {"pref_loss", "loss_type", expand_pref_loss},
      {"truncation_mode", "truncation", expand_truncation_mode},
  };
  return rows;
}

const AliasRow* find_alias(const std::string& name) {
  for (const AliasRow& a : alias_table())
    if (name == a.alias) return &a;
  return nullptr;
}

}  // namespace qlora::train_keys
