// Test helper: writes GGUF bytes in memory (independent of the reader) so tests can craft any file.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace qlora::testing {

// Value type ids of the GGUF spec, spelled out here so the builder does not lean on gguf.h.
enum : uint32_t { kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64 };

class GgufBuilder {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;  // padding used when writing; add general.alignment yourself to change it

  template <class X>
  static void put(std::vector<uint8_t>& b, X v) {
    uint8_t tmp[sizeof(X)];
    std::memcpy(tmp, &v, sizeof(X));
    b.insert(b.end(), tmp, tmp + sizeof(X));
  }
  static void put_str(std::vector<uint8_t>& b, const std::string& s) {
    put<uint64_t>(b, s.size());
    b.insert(b.end(), s.begin(), s.end());
  }

  // Raw KV: key, type id, then the already-encoded value bytes.
  GgufBuilder& kv_raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& value) {
    put_str(kv_, key);
    put<uint32_t>(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
    n_kv_++;
    return *this;
  }
  template <class X>
  GgufBuilder& kv(const std::string& key, uint32_t type, X v) {
    std::vector<uint8_t> b;
    put<X>(b, v);
    return kv_raw(key, type, b);
  }
  GgufBuilder& u32(const std::string& k, uint32_t v) { return kv<uint32_t>(k, kU32, v); }
  GgufBuilder& i32(const std::string& k, int32_t v) { return kv<int32_t>(k, kI32, v); }
  GgufBuilder& f32(const std::string& k, float v) { return kv<float>(k, kF32, v); }
  GgufBuilder& boolean(const std::string& k, bool v) { return kv<uint8_t>(k, kBool, v ? 1 : 0); }
  GgufBuilder& str(const std::string& k, const std::string& v) {
    std::vector<uint8_t> b;
    put_str(b, v);
    return kv_raw(k, kString, b);
  }
  GgufBuilder& arr_str(const std::string& k, const std::vector<std::string>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kString);
    put<uint64_t>(b, v.size());
    for (const auto& s : v) put_str(b, s);
    return kv_raw(k, kArray, b);
  }
  GgufBuilder& arr_bool(const std::string& k, const std::vector<bool>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kBool);
    put<uint64_t>(b, v.size());
    for (bool x : v) put<uint8_t>(b, x ? 1 : 0);
    return kv_raw(k, kArray, b);
  }
  GgufBuilder& arr_u32(const std::string& k, const std::vector<uint32_t>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kU32);
    put<uint64_t>(b, v.size());
    for (uint32_t x : v) put<uint32_t>(b, x);
    return kv_raw(k, kArray, b);
  }

  // Tensor with explicit ggml dims (ne[0] fastest), ggml type id and data bytes. `offset` overrides
  // the aligned running offset (to make broken files).
  GgufBuilder& tensor_raw(const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::vector<uint8_t> data,
                          std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, std::move(ne), type, std::move(data), offset});
    return *this;
  }
  GgufBuilder& tensor_f32(const std::string& name, std::vector<uint64_t> ne, const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return tensor_raw(name, std::move(ne), 0, std::move(b));
  }

  std::vector<uint8_t> build() const {
    std::vector<uint8_t> b{'G', 'G', 'U', 'F'};
    put<uint32_t>(b, version);
    put<uint64_t>(b, tensors_.size());
    put<uint64_t>(b, n_kv_);
    b.insert(b.end(), kv_.begin(), kv_.end());
    std::vector<uint64_t> offs;
    uint64_t off = 0;
    for (const auto& t : tensors_) {
      put_str(b, t.name);
      put<uint32_t>(b, uint32_t(t.ne.size()));
      for (uint64_t d : t.ne) put<uint64_t>(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, t.offset ? *t.offset : off);
      offs.push_back(off);
      off += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (b.size() % alignment) b.push_back(0);
    size_t data_start = b.size();
    for (size_t i = 0; i < tensors_.size(); i++) {
      b.resize(data_start + offs[i], 0);
      b.insert(b.end(), tensors_[i].data.begin(), tensors_[i].data.end());
    }
    return b;
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
    std::optional<uint64_t> offset;
  };
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace qlora::testing
