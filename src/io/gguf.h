// GgufFile: a validated, memory-mapped GGUF v2/v3 file: metadata, tensor infos and f32 reads.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/ggml_quants.h"

namespace qlora {

class MappedFile;

// Metadata value types as stored on disk (gguf_type).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);  // "u32", "string", "array" ...

// One metadata value. Integers and bools sit in `i` (or `u` for u64 values above INT64_MAX),
// floats in `f`, strings in `s`, arrays in `arr` with `elem_type` (arrays may nest).
struct GgufValue {
  GgufType type = GgufType::U8;
  GgufType elem_type = GgufType::U8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  std::vector<GgufValue> arr;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the fastest-varying (contiguous) dim
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;      // from the start of the data section
  uint64_t n_bytes = 0;

  int64_t n_elements() const;
  // PyTorch/HF shape: ne reversed (a ggml [in, out] matrix is a row-major [out, in] matrix).
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  // Maps and validates `path`. Errors: Io (cannot open), Format (bad magic, truncated or
  // inconsistent header/metadata/tensor infos, offsets outside the file), Unsupported (version 1,
  // version > 3, big-endian files, unknown ggml type ids). `where` names path:offset, key or tensor.
  explicit GgufFile(const std::string& path);
  // Same, from bytes in memory (copied); `name` stands in for the path in messages.
  static GgufFile from_bytes(std::vector<uint8_t> bytes, const std::string& name);
  ~GgufFile();
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section in the file
  uint64_t file_size() const { return size_; }
  // The mapped pages holding one tensor's bytes back to the OS (MappedFile::release_pages; a loader
  // calls it once it has copied them); no-op when absent or built from bytes.
  void release_pages(const std::string& tensor_name) const noexcept;
  // The same for rows [first_row, first_row + n_rows) of it (rows of ne[0] elements).
  void release_rows(const std::string& tensor_name, int64_t first_row, int64_t n_rows) const noexcept;

  // Metadata. Keys keep file order in keys(). Typed getters convert between integer widths when
  // the value fits and accept f32/f64 for floats; a missing key or a wrong type is Error(Format)
  // naming the key.
  const std::vector<std::string>& keys() const { return key_order_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue& get(const std::string& key) const;
  GgufType type_of(const std::string& key) const { return get(key).type; }
  std::string get_string(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  uint32_t get_u32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int64_t get_i64(const std::string& key) const;
  float get_f32(const std::string& key) const;
  double get_f64(const std::string& key) const;
  uint64_t get_array_size(const std::string& key) const;
  GgufType get_array_type(const std::string& key) const;
  std::vector<std::string> get_array_strings(const std::string& key) const;
  std::vector<int64_t> get_array_i64(const std::string& key) const;  // integer or bool elements
  std::vector<double> get_array_f64(const std::string& key) const;   // float or integer elements

  // Tensors, in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  bool has_tensor(const std::string& name) const { return tensor_index_.count(name) != 0; }
  // Error(Format) naming the tensor when absent, with the closest existing name as hint.
  const GgufTensorInfo& tensor(const std::string& name) const;
  // The tensor's bytes inside the mapping (valid while this object lives).
  const uint8_t* tensor_data(const std::string& name) const;
  // Dequantizes the whole tensor into dst (n_elements floats) in PyTorch/HF orientation, which
  // is the stored order: rows of ne[0] elements. Error(Unsupported) names tensor and type.
  void read_tensor_f32(const std::string& name, float* dst) const;
  std::vector<float> read_tensor_f32(const std::string& name) const;
  // Rows [first_row, first_row + n_rows) of it (rows of ne[0] elements: expert e of a 3-D expert
  // stack is rows [e * ne[1], (e + 1) * ne[1])) into dst. Error(Shape) for rows outside the tensor.
  void read_rows_f32(const std::string& name, int64_t first_row, int64_t n_rows, float* dst) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<uint8_t> owned_;  // from_bytes storage
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<std::string> key_order_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace qlora
