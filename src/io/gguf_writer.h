// GgufWriter: a streaming GGUF v3 writer (metadata of every value type, tensor infos, aligned data
// written tensor by tensor through AtomicFile), and the ggml encoders an export needs: F16, BF16
// (round to nearest even, as ggml's fp32_to_bf16) and the reference Q8_0 / Q4_0 quantizers
// (ggml's quantize_row_q8_0_ref / quantize_row_q4_0_ref, bit for bit).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"
#include "io/ggml_quants.h"

namespace qlora {

class AtomicFile;

// Metadata values for the writer (GgufValue with its type set).
GgufValue gguf_u32(uint32_t v);
GgufValue gguf_i32(int32_t v);
GgufValue gguf_u64(uint64_t v);
GgufValue gguf_f32(float v);
GgufValue gguf_bool(bool v);
GgufValue gguf_str(std::string v);
GgufValue gguf_str_array(const std::vector<std::string>& v);
GgufValue gguf_i32_array(const std::vector<int32_t>& v);
GgufValue gguf_f32_array(const std::vector<float>& v);

// Encodes n f32 values (n a whole number of blocks for Q8_0/Q4_0) as ggml type t into dst
// (ggml_row_bytes(t, n) bytes). Supported: F32 F16 BF16 Q8_0 Q4_0; Error(Unsupported) otherwise,
// Error(Shape) when n is not a whole number of blocks.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);
bool can_quantize(GgmlType t);

class GgufWriter {
 public:
  // Metadata, in insertion order; setting a key again replaces its value in place.
  void set(const std::string& key, GgufValue v);
  bool has(const std::string& key) const;
  void remove(const std::string& key);
  const std::vector<std::pair<std::string, GgufValue>>& kvs() const { return kv_; }

  // Declares a tensor: ne in ggml order (ne[0] contiguous), stored as `type`. Tensors are then
  // written in this order. Error(Shape) when ne[0] is not a whole number of blocks of `type`.
  void add_tensor(const std::string& name, std::vector<int64_t> ne, GgmlType type);
  size_t n_tensors() const { return tensors_.size(); }
  const GgufTensorInfo& tensor(size_t i) const { return tensors_[i]; }

  // general.alignment (32 when unset); must be a power of two.
  uint64_t alignment() const;
  // Bytes of the whole file once every tensor is written (known before anything is written).
  uint64_t file_size() const;

  // Opens "<path>.tmp-XXXXXX" and writes header, metadata and tensor infos. Then call write_tensor
  // once per declared tensor, in order, and commit() to rename the file into place. Destroyed
  // before commit(), the temporary file is removed and `path` is left untouched.
  void begin(const std::string& path);
  // The tensor's bytes (exactly its size in its type); padding to the alignment is added.
  void write_tensor(const void* data, size_t n_bytes);
  // Encodes f32 values (n_elements of the next tensor) into its type and writes them.
  void write_tensor_f32(const float* data, int64_t n);
  void commit();
  size_t next_tensor() const { return next_; }
  uint64_t bytes_written() const { return written_; }

  GgufWriter();
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // The header bytes (magic .. tensor infos, padded to the alignment).
  std::string header() const;

 private:
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::unique_ptr<AtomicFile> out_;
  size_t next_ = 0;
  uint64_t written_ = 0;
};

}  // namespace qlora
