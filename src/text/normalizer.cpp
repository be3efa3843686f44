// Normalizers, each matching the HF `tokenizers` (Rust) behaviour on the normalized string.
#include "text/normalizer.h"

#include <vector>

#include "core/error.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_regex.h"
#include "text/unicode.h"

namespace qlora {
namespace {

using tokjson::json;

class SequenceNorm : public Normalizer {
 public:
  std::vector<std::unique_ptr<Normalizer>> parts;
  void normalize(NormText& t) const override {
    for (const auto& p : parts) p->normalize(t);
  }
};

class UnicodeNorm : public Normalizer {
 public:
  explicit UnicodeNorm(unicode::NormForm f) : form(f) {}
  unicode::NormForm form;
  void normalize(NormText& t) const override { t.text = unicode::normalize(t.text, form); }
};

class LowercaseNorm : public Normalizer {
 public:
  void normalize(NormText& t) const override {
    std::string out;
    out.reserve(t.text.size());
    for (size_t i = 0; i < t.text.size();) unicode::append_lowercase(out, unicode::next_cp(t.text, i));
    t.text = std::move(out);
  }
};

class StripNorm : public Normalizer {
 public:
  bool left = true, right = true;
  void normalize(NormText& t) const override {
    const std::string& s = t.text;
    size_t a = 0, b = s.size();
    if (left) {
      for (size_t i = 0; i < s.size();) {
        if (!unicode::is_whitespace(unicode::next_cp(s, i))) break;
        a = i;
      }
    }
    if (right) {
      b = a;  // end of the last non-whitespace char
      for (size_t i = a; i < s.size();)
        if (!unicode::is_whitespace(unicode::next_cp(s, i))) b = i;
    }
    if (a > 0) t.at_origin = false;  // the first kept char no longer sits at offset 0
    t.text = s.substr(a, b - a);
  }
};

class PrependNorm : public Normalizer {
 public:
  std::string prepend;
  void normalize(NormText& t) const override {
    if (!t.text.empty()) t.text.insert(0, prepend);
  }
};

class ReplaceNorm : public Normalizer {
 public:
  Pattern pattern;
  std::string content;
  void normalize(NormText& t) const override { t.text = pattern.replace_all(t.text, content); }
};

// Removes nonspacing marks (HF applies it after NFD/NFKD to strip accents).
class StripAccentsNorm : public Normalizer {
 public:
  Regex marks{R"(\p{Mn})", "StripAccents"};
  void normalize(NormText& t) const override {
    std::vector<std::pair<size_t, size_t>> m;
    marks.find_all(t.text, m);
    if (m.empty()) return;
    std::string out;
    size_t last = 0;
    for (auto [a, b] : m) {
      out.append(t.text, last, a - last);
      last = b;
    }
    out.append(t.text, last);
    t.text = std::move(out);
  }
};

class ByteLevelNorm : public Normalizer {
 public:
  void normalize(NormText& t) const override { t.text = unicode::bytes_to_alphabet(t.text); }
};

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  tokjson::need_object(j, where);
  std::string type = tokjson::type_of(j, where);
  auto need_unicode = [&](unicode::NormForm f) -> std::unique_ptr<Normalizer> {
    if (!unicode::has_normalization())
      fail(ErrorKind::Unsupported, tokjson::child(where, "type"),
           "'" + type + "' needs Unicode normalization, which this build lacks",
           "install libutf8proc-dev and rebuild (CMake then defines QLORA_HAVE_UTF8PROC)");
    return std::make_unique<UnicodeNorm>(f);
  };
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceNorm>();
    std::string w = tokjson::child(where, "normalizers");
    const json& arr = tokjson::need(j, "normalizers", where);
    if (!arr.is_array()) fail(ErrorKind::Format, w, "expected an array");
    for (size_t i = 0; i < arr.size(); ++i) {
      auto p = parse_normalizer(arr[i], tokjson::index(w, i));
      if (p) seq->parts.push_back(std::move(p));
    }
    return seq;
  }
  if (type == "NFC") return need_unicode(unicode::NormForm::NFC);
  if (type == "NFD") return need_unicode(unicode::NormForm::NFD);
  if (type == "NFKC") return need_unicode(unicode::NormForm::NFKC);
  if (type == "NFKD") return need_unicode(unicode::NormForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNorm>();
  if (type == "Strip") {
    auto s = std::make_unique<StripNorm>();
    s->left = tokjson::bool_or(j, "strip_left", true, where);
    s->right = tokjson::bool_or(j, "strip_right", true, where);
    return s;
  }
  if (type == "Prepend") {
    auto p = std::make_unique<PrependNorm>();
    p->prepend = tokjson::need_string(j, "prepend", where);
    return p;
  }
  if (type == "Replace") {
    auto r = std::make_unique<ReplaceNorm>();
    r->pattern = tokjson::need_pattern(j, "pattern", where);
    r->content = tokjson::need_string(j, "content", where);
    return r;
  }
  if (type == "StripAccents") return std::make_unique<StripAccentsNorm>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNorm>();
  tokjson::unsupported_type(where, type,
                            "Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace, "
                            "StripAccents, ByteLevel");
}

}  // namespace qlora
