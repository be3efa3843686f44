// JSON helpers: file reading with path:line:col parse errors, typed key access, closest-name hints.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace qlora {

using json = nlohmann::json;

// Whole file as bytes; Error(Io, path) with the errno text when it cannot be read.
std::string read_text_file(const std::string& path);
// Parses JSON text; syntax errors -> Error(Format, "<where>:<line>:<col>").
json parse_json(std::string_view text, const std::string& where);
// An nlohmann exception's text without its "[json.exception.x.N] " prefix ("number overflow parsing '1e999'").
std::string json_error_reason(const json::exception& e);
json read_json_file(const std::string& path);

// "integer", "number", "string", "boolean", "null", "array", "object".
const char* json_type_name(const json& j);

// Typed access to an object's keys. Errors are Error(Config, "<where>: key '<key>'") naming the
// expected type. A key that is absent or null counts as missing (HF configs write null for "default").
const json* json_find(const json& obj, std::string_view key);  // nullptr when absent or null
int64_t json_int(const json& obj, std::string_view key, const std::string& where);
int64_t json_int_or(const json& obj, std::string_view key, int64_t def, const std::string& where);
double json_number(const json& obj, std::string_view key, const std::string& where);
double json_number_or(const json& obj, std::string_view key, double def, const std::string& where);
bool json_bool_or(const json& obj, std::string_view key, bool def, const std::string& where);
std::string json_string(const json& obj, std::string_view key, const std::string& where);
std::string json_string_or(const json& obj, std::string_view key, const std::string& def,
                           const std::string& where);

// Levenshtein distance (insert/delete/substitute, each cost 1).
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate with the smallest edit distance to `name` ("" when there are no candidates or the best
// is farther than max_distance); ties go to the earlier candidate.
std::string closest_name(const std::vector<std::string>& candidates, std::string_view name,
                         size_t max_distance = SIZE_MAX);

}  // namespace qlora
