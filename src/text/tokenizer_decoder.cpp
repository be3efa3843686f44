// Decoders, each reproducing the HF `tokenizers` decode_chain on token strings.
#include "text/tokenizer_decoder.h"

#include "core/error.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_regex.h"
#include "text/unicode.h"

namespace qlora {
namespace {

using tokjson::json;

class SequenceDec : public Decoder {
 public:
  std::vector<std::unique_ptr<Decoder>> parts;
  void decode_chain(std::vector<std::string>& t) const override {
    for (const auto& p : parts) p->decode_chain(t);
  }
};

// Maps alphabet characters back to bytes; a token with any other character (an added token
// such as "<|im_start|>" with a space, say) passes through as its own UTF-8 bytes.
class ByteLevelDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      size_t mark = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size();) {
        int b = unicode::cp_to_byte(unicode::next_cp(t, i));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes += static_cast<char>(b);
      }
      if (!ok) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, unicode::utf8_lossy(bytes));
  }
};

class MetaspaceDec : public Decoder {
 public:
  uint32_t replacement = 0x2581;
  bool prepend = true;  // prepend_scheme != never: the first token loses its replacement chars
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      const std::string& t = tokens[k];
      std::string out;
      out.reserve(t.size());
      for (size_t i = 0; i < t.size();) {
        size_t at = i;
        uint32_t cp = unicode::next_cp(t, i);
        if (cp != replacement) out.append(t, at, i - at);
        else if (!(k == 0 && prepend)) out += ' ';
      }
      tokens[k] = std::move(out);
    }
  }
};

// Runs of <0xNN> tokens become their bytes when those form valid UTF-8, else one U+FFFD each.
class ByteFallbackDec : public Decoder {
 public:
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; ++k) {
      char c = t[k];
      int d = (c >= '0' && c <= '9') ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (unicode::is_valid_utf8(pending)) out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.push_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (std::string& t : tokens) {
      int b = byte_of(t);
      if (b >= 0) {
        pending += static_cast<char>(b);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDec : public Decoder {
 public:
  uint32_t content = ' ';
  size_t start = 0, stop = 0;
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<uint32_t> cps;
    for (std::string& t : tokens) {
      cps.clear();
      for (size_t i = 0; i < t.size();) cps.push_back(unicode::next_cp(t, i));
      size_t a = 0, b = cps.size();
      for (size_t i = 0; i < start && i < cps.size() && cps[i] == content; ++i) a = i + 1;
      for (size_t i = 0; i < stop && i < cps.size() && cps[cps.size() - 1 - i] == content; ++i)
        b = cps.size() - 1 - i;
      std::string out;
      for (size_t i = a; i < b; ++i) unicode::append_utf8(out, cps[i]);
      t = std::move(out);
    }
  }
};

class ReplaceDec : public Decoder {
 public:
  Pattern pattern;
  std::string content;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) t = pattern.replace_all(t, content);
  }
};

// Original BPE end-of-word suffix: "</w>" becomes a space, except on the last token.
class BpeDec : public Decoder {
 public:
  Pattern suffix;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k)
      tokens[k] = suffix.replace_all(tokens[k], k + 1 == tokens.size() ? "" : " ");
  }
};

}  // namespace

std::unique_ptr<Decoder> parse_decoder(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  tokjson::need_object(j, where);
  std::string type = tokjson::type_of(j, where);
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceDec>();
    std::string w = tokjson::child(where, "decoders");
    const json& arr = tokjson::need(j, "decoders", where);
    if (!arr.is_array()) fail(ErrorKind::Format, w, "expected an array");
    for (size_t i = 0; i < arr.size(); ++i) {
      auto p = parse_decoder(arr[i], tokjson::index(w, i));
      if (p) seq->parts.push_back(std::move(p));
    }
    return seq;
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
  if (type == "Metaspace") {
    auto m = std::make_unique<MetaspaceDec>();
    m->replacement = tokjson::need_char(j, "replacement", where);
    std::string scheme = tokjson::string_or(j, "prepend_scheme", "always", where);
    m->prepend = scheme != "never";
    if (const json* a = tokjson::find(j, "add_prefix_space"); a && a->is_boolean() && !a->get<bool>())
      m->prepend = false;
    return m;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (type == "Fuse") return std::make_unique<FuseDec>();
  if (type == "Strip") {
    auto s = std::make_unique<StripDec>();
    s->content = tokjson::need_char(j, "content", where);
    s->start = static_cast<size_t>(std::max<int64_t>(0, tokjson::int_or(j, "start", 0, where)));
    s->stop = static_cast<size_t>(std::max<int64_t>(0, tokjson::int_or(j, "stop", 0, where)));
    return s;
  }
  if (type == "Replace") {
    auto r = std::make_unique<ReplaceDec>();
    r->pattern = tokjson::need_pattern(j, "pattern", where);
    r->content = tokjson::need_string(j, "content", where);
    return r;
  }
  if (type == "BPEDecoder") {
    auto b = std::make_unique<BpeDec>();
    b->suffix = Pattern(false, tokjson::string_or(j, "suffix", "</w>", where), where);
    return b;
  }
  tokjson::unsupported_type(where, type,
                            "Sequence, ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, "
                            "BPEDecoder");
}

}  // namespace qlora
