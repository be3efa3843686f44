// Shared by the Jinja and chat-template parity tests: fixture loading, the fixed clock the fixtures
// were rendered with, and Python character offsets -> byte offsets.
#pragma once
#include <cstdio>
#include <ctime>
#include <string>

#include <nlohmann/json.hpp>

#include "io/json_util.h"

namespace qlora::chat_test {

using ojson = nlohmann::ordered_json;

inline const std::string kDir = std::string(QLORA_FIXTURES) + "/text/chat_templates";

inline ojson load(const std::string& file) { return ojson::parse(read_text_file(kDir + "/" + file)); }

// "2024-09-05T14:30:00" -> struct tm with weekday/yearday filled in.
inline std::tm parse_now(const std::string& iso) {
  std::tm tm{};
  std::sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
              &tm.tm_sec);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  time_t t = timegm(&tm);
  gmtime_r(&t, &tm);
  return tm;
}

// transformers reports generation ranges in Python character offsets; we report bytes.
inline size_t byte_offset(const std::string& s, size_t chars) {
  size_t i = 0;
  for (size_t c = 0; c < chars && i < s.size(); ++c)
    i += (s[i] & 0x80) == 0 ? 1 : (s[i] & 0xE0) == 0xC0 ? 2 : (s[i] & 0xF0) == 0xE0 ? 3 : 4;
  return i;
}

}  // namespace qlora::chat_test
