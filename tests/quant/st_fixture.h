// Minimal reader for the quant fixtures (safetensors layout: u64 header length, JSON header, raw LE data).
// Kept self-contained so the quant tests depend on neither Python nor the io/ library.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qlora::test {

class StFixture {
 public:
  explicit StFixture(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open fixture " + path);
    bytes_.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    if (bytes_.size() < 8) throw std::runtime_error("truncated fixture " + path);
    std::memcpy(&n, bytes_.data(), 8);
    header_ = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + 8 + int64_t(n));
    data_start_ = 8 + n;
  }

  bool has(const std::string& name) const { return header_.contains(name); }

  std::string meta(const std::string& key) const { return header_.at("__metadata__").at(key).get<std::string>(); }

  std::vector<int64_t> shape(const std::string& name) const {
    return header_.at(name).at("shape").get<std::vector<int64_t>>();
  }

  // Copies tensor `name`, checking its dtype ("F32", "U8", "U32", ...) and element size.
  template <class T>
  std::vector<T> get(const std::string& name, const std::string& dtype) const {
    if (!has(name)) throw std::runtime_error("fixture has no tensor " + name);
    const auto& h = header_.at(name);
    if (h.at("dtype").get<std::string>() != dtype)
      throw std::runtime_error("tensor " + name + " is " + h.at("dtype").get<std::string>() + ", expected " + dtype);
    const auto off = h.at("data_offsets").get<std::vector<uint64_t>>();
    const uint64_t nbytes = off[1] - off[0];
    if (nbytes % sizeof(T) != 0) throw std::runtime_error("tensor " + name + " has a partial element");
    std::vector<T> out(nbytes / sizeof(T));
    std::memcpy(out.data(), bytes_.data() + data_start_ + off[0], nbytes);
    return out;
  }

 private:
  std::vector<char> bytes_;
  nlohmann::json header_;
  uint64_t data_start_ = 0;
};

inline uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

}  // namespace qlora::test
