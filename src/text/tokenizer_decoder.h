// Decoders of tokenizer.json (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace, Sequence).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qlora {

// HF's decode_chain: token strings in, token strings out; the caller concatenates the result.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// nullptr for JSON null; unknown types -> Error(Unsupported) naming where + ".type".
std::unique_ptr<Decoder> parse_decoder(const nlohmann::json& j, const std::string& where);

}  // namespace qlora
