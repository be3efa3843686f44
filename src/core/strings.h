// Small string helpers shared by the config parser, the CLI and the planner.
#pragma once
#include <charconv>
#include <string>
#include <string_view>
#include <vector>

namespace qlora {

// Without leading/trailing spaces, tabs, CR and LF.
inline std::string trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

// ASCII letters lower-cased, every other byte kept (names, keys and units, not text).
inline std::string ascii_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return s;
}

// The shortest decimal that reads back as this float (1.702, not 1.7020000219345093), for messages.
inline std::string float_decimal(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// {"a", "b"} -> "a, b", for messages listing names.
inline std::string join_commas(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// "q_proj, v_proj,,o_proj" -> {"q_proj", "v_proj", "o_proj"}: items trimmed, empty ones dropped.
inline std::vector<std::string> split_commas(std::string_view s) {
  std::vector<std::string> out;
  while (true) {
    const size_t c = s.find(',');
    std::string item = trim(s.substr(0, c));
    if (!item.empty()) out.push_back(std::move(item));
    if (c == std::string_view::npos) break;
    s.remove_prefix(c + 1);
  }
  return out;
}

}  // namespace qlora
