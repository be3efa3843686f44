// Text normalizers of tokenizer.json (NFC/NFKC, Lowercase, Strip, Prepend, Replace, Sequence ...).
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace qlora {

// Normalized text plus the one piece of alignment the pipeline needs: whether its first
// character still maps to offset 0 of the input (Metaspace prepend_scheme "first" asks that).
struct NormText {
  std::string text;
  bool at_origin = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(NormText& t) const = 0;
};

// Builds the normalizer described by `j` (nullptr for JSON null). `where` is the JSON path used
// in errors; unknown types are Error(Unsupported) naming where + ".type".
std::unique_ptr<Normalizer> parse_normalizer(const nlohmann::json& j, const std::string& where);

}  // namespace qlora
