// Streaming GGUF v3 writer and the F16/BF16/Q8_0/Q4_0 encoders (ggml's reference quantizers).
#include "io/gguf_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "io/atomic_file.h"

namespace qlora {

GgufValue gguf_u32(uint32_t v) { GgufValue g; g.type = GgufType::U32; g.i = v; return g; }
GgufValue gguf_i32(int32_t v) { GgufValue g; g.type = GgufType::I32; g.i = v; return g; }
GgufValue gguf_u64(uint64_t v) { GgufValue g; g.type = GgufType::U64; g.u = v; g.i = int64_t(v); return g; }
GgufValue gguf_f32(float v) { GgufValue g; g.type = GgufType::F32; g.f = v; return g; }
GgufValue gguf_bool(bool v) { GgufValue g; g.type = GgufType::BOOL; g.i = v ? 1 : 0; return g; }
GgufValue gguf_str(std::string v) { GgufValue g; g.type = GgufType::STRING; g.s = std::move(v); return g; }
namespace {
// An array of `elem` values made one by one by `one`.
template <class T, class Make>
GgufValue gguf_array(GgufType elem, const std::vector<T>& v, Make one) {
  GgufValue g;
  g.type = GgufType::ARRAY;
  g.elem_type = elem;
  g.arr.reserve(v.size());
  for (const auto& x : v) g.arr.push_back(one(x));
  return g;
}
}  // namespace
GgufValue gguf_str_array(const std::vector<std::string>& v) { return gguf_array(GgufType::STRING, v, gguf_str); }
GgufValue gguf_i32_array(const std::vector<int32_t>& v) { return gguf_array(GgufType::I32, v, gguf_i32); }
GgufValue gguf_f32_array(const std::vector<float>& v) { return gguf_array(GgufType::F32, v, gguf_f32); }

namespace {

constexpr int QK = 32;

// ggml quantize_row_q8_0_ref: d = max|x| / 127, q = roundf(x / d) (half away from zero).
void q8_0_block(const float* x, uint8_t* y) {
  float amax = 0.0f;
  for (int j = 0; j < QK; j++) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = f32_to_f16(d);
  std::memcpy(y, &h, 2);
  for (int j = 0; j < QK; j++) y[2 + j] = uint8_t(int8_t(std::roundf(x[j] * id)));
}

// ggml quantize_row_q4_0_ref: d = (the value of largest magnitude, first one on ties) / -8,
// q = min(15, trunc(x / d + 8.5)); element j in the low nibble of byte j, j + 16 in the high one.
void q4_0_block(const float* x, uint8_t* y) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < QK; j++)
    if (amax < std::fabs(x[j])) amax = std::fabs(x[j]), max = x[j];
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t h = f32_to_f16(d);
  std::memcpy(y, &h, 2);
  for (int j = 0; j < QK / 2; j++) {
    const uint8_t lo = uint8_t(std::min(15, int(int8_t(x[j] * id + 8.5f))));
    const uint8_t hi = uint8_t(std::min(15, int(int8_t(x[j + QK / 2] * id + 8.5f))));
    y[2 + j] = uint8_t(lo | (hi << 4));
  }
}

template <class V>
void put(std::string& b, V v) {
  char tmp[sizeof(V)];
  std::memcpy(tmp, &v, sizeof(V));
  b.append(tmp, sizeof(V));
}
void put_str(std::string& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b += s;
}

void put_value(std::string& b, const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufType::U8: put<uint8_t>(b, uint8_t(v.i)); return;
    case GgufType::I8: put<int8_t>(b, int8_t(v.i)); return;
    case GgufType::U16: put<uint16_t>(b, uint16_t(v.i)); return;
    case GgufType::I16: put<int16_t>(b, int16_t(v.i)); return;
    case GgufType::U32: put<uint32_t>(b, uint32_t(v.i)); return;
    case GgufType::I32: put<int32_t>(b, int32_t(v.i)); return;
    case GgufType::U64: put<uint64_t>(b, v.u ? v.u : uint64_t(v.i)); return;
    case GgufType::I64: put<int64_t>(b, v.i); return;
    case GgufType::F32: put<float>(b, float(v.f)); return;
    case GgufType::F64: put<double>(b, v.f); return;
    case GgufType::BOOL: put<uint8_t>(b, v.i ? 1 : 0); return;
    case GgufType::STRING: put_str(b, v.s); return;
    case GgufType::ARRAY:
      put<uint32_t>(b, uint32_t(v.elem_type));
      put<uint64_t>(b, v.arr.size());
      for (const auto& e : v.arr) {
        if (e.type != v.elem_type)
          fail(ErrorKind::Internal, "GGUF key '" + key + "'",
               std::string("array element of type ") + gguf_type_name(e.type) + " in an array of " + gguf_type_name(v.elem_type));
        put_value(b, e, key);
      }
      return;
  }
  fail(ErrorKind::Internal, "GGUF key '" + key + "'", "unknown value type");
}

uint64_t pad_to(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

}  // namespace

bool can_quantize(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || t == GgmlType::Q8_0 || t == GgmlType::Q4_0;
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  if (!can_quantize(t))
    fail(ErrorKind::Unsupported, std::string("ggml type ") + ggml_type_name(t), "cannot be written",
         "writable types: F32 F16 BF16 Q8_0 Q4_0");
  const int64_t bytes = ggml_row_bytes(t, n);  // checks whole blocks
  switch (t) {
    case GgmlType::F32: if (n) std::memcpy(dst, src, size_t(bytes)); return;
    case GgmlType::F16: convert_from_f32(DType::F16, src, dst, n); return;
    case GgmlType::BF16: convert_from_f32(DType::BF16, src, dst, n); return;
    case GgmlType::Q8_0: {
      auto* y = static_cast<uint8_t*>(dst);
      for (int64_t b = 0; b < n / QK; b++) q8_0_block(src + b * QK, y + b * (2 + QK));
      return;
    }
    case GgmlType::Q4_0: {
      auto* y = static_cast<uint8_t*>(dst);
      for (int64_t b = 0; b < n / QK; b++) q4_0_block(src + b * QK, y + b * (2 + QK / 2));
      return;
    }
    default: break;
  }
}

GgufWriter::GgufWriter() = default;
GgufWriter::~GgufWriter() = default;

void GgufWriter::set(const std::string& key, GgufValue v) {
  if (out_) fail(ErrorKind::Internal, "GGUF key '" + key + "'", "metadata set after begin()");
  for (auto& [k, old] : kv_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}

bool GgufWriter::has(const std::string& key) const {
  return std::any_of(kv_.begin(), kv_.end(), [&](const auto& p) { return p.first == key; });
}

void GgufWriter::remove(const std::string& key) {
  kv_.erase(std::remove_if(kv_.begin(), kv_.end(), [&](const auto& p) { return p.first == key; }), kv_.end());
}

uint64_t GgufWriter::alignment() const {
  for (const auto& [k, v] : kv_)
    if (k == "general.alignment") {
      if (v.type != GgufType::U32 || v.i <= 0 || (v.i & (v.i - 1)) != 0)
        fail(ErrorKind::Internal, "GGUF key 'general.alignment'", "must be a u32 power of two");
      return uint64_t(v.i);
    }
  return 32;
}

void GgufWriter::add_tensor(const std::string& name, std::vector<int64_t> ne, GgmlType type) {
  if (out_) fail(ErrorKind::Internal, "GGUF tensor '" + name + "'", "declared after begin()");
  for (const auto& t : tensors_)
    if (t.name == name) fail(ErrorKind::Internal, "GGUF tensor '" + name + "'", "declared twice");
  if (ne.empty() || ne.size() > 4) fail(ErrorKind::Internal, "GGUF tensor '" + name + "'", "needs 1 to 4 dimensions");
  GgufTensorInfo ti;
  ti.name = name;
  ti.ne = std::move(ne);
  ti.type = type;
  const int64_t row = ti.ne[0];
  const int64_t bs = ggml_type_traits(type).block_size;
  if (row % bs != 0)
    fail(ErrorKind::Shape, "tensor '" + name + "'",
         "row length " + std::to_string(row) + " is not a multiple of the " + ggml_type_name(type) + " block size " +
             std::to_string(bs));
  ti.n_bytes = uint64_t(ggml_row_bytes(type, row)) * uint64_t(ti.n_elements() / std::max<int64_t>(row, 1));
  const uint64_t a = alignment();
  ti.offset = tensors_.empty() ? 0 : pad_to(tensors_.back().offset + tensors_.back().n_bytes, a);
  tensors_.push_back(std::move(ti));
}

std::string GgufWriter::header() const {
  std::string b = "GGUF";
  put<uint32_t>(b, 3);
  put<uint64_t>(b, tensors_.size());
  put<uint64_t>(b, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_str(b, k);
    put<uint32_t>(b, uint32_t(v.type));
    put_value(b, v, k);
  }
  const uint64_t a = alignment();
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    if (t.offset != off) fail(ErrorKind::Internal, "GGUF tensor '" + t.name + "'", "offsets out of order (alignment changed after add_tensor?)");
    put_str(b, t.name);
    put<uint32_t>(b, uint32_t(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(b, uint64_t(d));
    put<uint32_t>(b, uint32_t(t.type));
    put<uint64_t>(b, t.offset);
    off = pad_to(t.offset + t.n_bytes, a);
  }
  b.resize(size_t(pad_to(b.size(), a)), '\0');
  return b;
}

uint64_t GgufWriter::file_size() const {
  uint64_t data = tensors_.empty() ? 0 : pad_to(tensors_.back().offset + tensors_.back().n_bytes, alignment());
  return header().size() + data;
}

void GgufWriter::begin(const std::string& path) {
  if (out_) fail(ErrorKind::Internal, path, "GgufWriter::begin called twice");
  const std::string h = header();
  out_ = std::make_unique<AtomicFile>(path);
  out_->append(h);
  written_ = h.size();
}

void GgufWriter::write_tensor(const void* data, size_t n_bytes) {
  if (!out_) fail(ErrorKind::Internal, "GGUF writer", "write_tensor before begin()");
  if (next_ >= tensors_.size()) fail(ErrorKind::Internal, out_->path(), "more tensors written than declared");
  const GgufTensorInfo& t = tensors_[next_];
  if (n_bytes != t.n_bytes)
    fail(ErrorKind::Internal, out_->path() + ": tensor '" + t.name + "'",
         std::to_string(n_bytes) + " bytes given, " + std::to_string(t.n_bytes) + " declared");
  out_->append(data, n_bytes);
  const uint64_t padded = pad_to(n_bytes, alignment());
  if (padded > n_bytes) out_->append(std::string(size_t(padded - n_bytes), '\0'));
  written_ += padded;
  next_++;
}

void GgufWriter::write_tensor_f32(const float* data, int64_t n) {
  if (next_ >= tensors_.size()) fail(ErrorKind::Internal, "GGUF writer", "more tensors written than declared");
  const GgufTensorInfo& t = tensors_[next_];
  if (n != t.n_elements())
    fail(ErrorKind::Internal, "tensor '" + t.name + "'", std::to_string(n) + " values for " + std::to_string(t.n_elements()));
  std::vector<uint8_t> buf(size_t(t.n_bytes));
  const int64_t row = t.ne[0], n_rows = row ? n / row : 0, rb = ggml_row_bytes(t.type, row);
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 20))
  for (int64_t r = 0; r < n_rows; r++) quantize_row(t.type, data + r * row, buf.data() + r * rb, row);
  write_tensor(buf.data(), buf.size());
}

void GgufWriter::commit() {
  if (!out_) fail(ErrorKind::Internal, "GGUF writer", "commit before begin()");
  if (next_ != tensors_.size())
    fail(ErrorKind::Internal, out_->path(),
         std::to_string(next_) + " of " + std::to_string(tensors_.size()) + " tensors written before commit");
  out_->commit();
}

}  // namespace qlora
