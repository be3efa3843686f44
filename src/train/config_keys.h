// The config key table and the alias table behind TrainConfig: one row per key (type, default,
// allowed values, help, value aliases) and one per other tool's spelling of a key. train_config.cpp
// parses, checks, dumps and documents a config with them; nothing else reads them.
#pragma once
#include <yaml-cpp/yaml.h>

#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/mode_names.h"
#include "train/train_config.h"

namespace qlora::train_keys {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A mode key: an enum field of TrainConfig (train_modes.h, model/modes.h, text/dataset.h) read and
// written through its names, which are the key's allowed values.
struct ModeField {
  std::string (*get)(const TrainConfig&);
  void (*set)(TrainConfig&, const std::string& name);  // name: one of names()
  std::vector<std::string> (*names)();
};

// The ModeField of member M, whose enum has the name function NameOf and the values Values().
template <auto M, auto NameOf, auto Values>
ModeField mode_field() {
  return {[](const TrainConfig& c) { return std::string(NameOf(c.*M)); },
          [](TrainConfig& c, const std::string& name) {
            if (const auto v = mode_by_name(Values(), NameOf, name)) c.*M = *v;
          },
          [] {
            std::vector<std::string> n;
            for (auto v : Values()) n.push_back(NameOf(v));
            return n;
          }};
}

using Field = std::variant<std::string TrainConfig::*, int64_t TrainConfig::*, double TrainConfig::*,
                           bool TrainConfig::*, std::vector<std::string> TrainConfig::*, ModeField>;
enum FieldType { kStr, kInt, kFloat, kBool, kList, kMode };  // order = Field alternatives
inline constexpr const char* kTypeNames[] = {"string", "int", "float", "bool", "list", "string"};

struct Range {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
};

struct KeyRow {
  const char* name;
  Field field;
  const char* def;  // default, written as it would be in YAML
  std::vector<std::string> choices = {};  // allowed values ({} = any; a mode's: its names); for lists: per element
  Range range = {};
  const char* help = "";
  // Spellings of a value that mean a canonical one (YAML true -> "full", "unsloth" -> "offload").
  std::vector<std::pair<std::string, std::string>> value_aliases = {};
  const char* null_as = nullptr;    // what YAML null means (strings: always "")
  const char* bad_value_hint = "";  // replaces the generic "allowed: ..." hint
  bool list_of_text = false;  // lists: a scalar is one item, never split at commas
};


// The seven projections LoRA can target, in layer order (all-linear).
const std::vector<std::string>& linear_modules();
// Every key, in the order of dump_train_config and the docs.
const std::vector<KeyRow>& key_table();
// The values a key allows: the row's, or a mode's names.
std::vector<std::string> row_choices(const KeyRow& row);
// A string or a mode: a value is text, YAML null is "".
bool takes_text(const KeyRow& row);
const KeyRow* find_row(const std::string& name);

// ---------------------------------------------------------------------------------------------
// Aliases. A plain alias renames the key; an expanding one turns one entry into canonical entries.

struct Loc {
  std::string where;  // "cfg.yaml:3:5" or "override 'lr=1'"
  std::string given;  // the key as the user spelled it
};

struct Entry {
  std::string key;  // canonical
  YAML::Node value;
  Loc loc;
};

using Notes = std::vector<std::string>;
using Expand = std::function<std::vector<Entry>(const YAML::Node&, const Loc&, Notes&)>;

struct AliasRow {
  const char* alias;
  const char* canonical;  // for docs, and the target of plain aliases
  Expand expand = nullptr;
};

const std::vector<AliasRow>& alias_table();
const AliasRow* find_alias(const std::string& name);

}  // namespace qlora::train_keys
