// Typed access to tokenizer.json nodes; errors name the JSON path ("tokenizer.json: model.vocab").
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/tokenizer_regex.h"

namespace qlora::tokjson {

using json = nlohmann::json;

// `where` is the node's path; child paths are where + "." + key or where + "[i]".
std::string child(const std::string& where, std::string_view key);
std::string index(const std::string& where, size_t i);

// Error(Format) unless j is an object.
void need_object(const json& j, const std::string& where);
// Member lookup; nullptr when absent or null.
const json* find(const json& j, std::string_view key);
// Required member of any type (Format error naming the path when missing).
const json& need(const json& j, std::string_view key, const std::string& where);
std::string need_string(const json& j, std::string_view key, const std::string& where);
std::string string_or(const json& j, std::string_view key, const std::string& def,
                      const std::string& where);
bool bool_or(const json& j, std::string_view key, bool def, const std::string& where);
int64_t int_or(const json& j, std::string_view key, int64_t def, const std::string& where);
// A JSON string holding exactly one Unicode character (Metaspace replacement, Strip content).
uint32_t need_char(const json& j, std::string_view key, const std::string& where);
// j[key] as {"String": s} or {"Regex": r} (a bare string counts as String).
Pattern need_pattern(const json& j, std::string_view key, const std::string& where);
// The "type" member; a Format error when missing.
std::string type_of(const json& j, const std::string& where);
// Error(Unsupported, where + ".type") listing what is supported.
[[noreturn]] void unsupported_type(const std::string& where, const std::string& type,
                                   const char* supported);

}  // namespace qlora::tokjson
