// Safetensors reading (mmap, one file or a sharded checkpoint) and atomic writing.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/mmap_file.h"

namespace qlora {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // [] is a scalar
  const void* data = nullptr;  // into the file mapping; not necessarily aligned to the element size
  int64_t nbytes = 0;
  std::string file;            // path of the .safetensors file holding it
  int64_t numel() const;
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[4096, 128]"

// One .safetensors file, mapped read-only and fully validated on open (header length, JSON, dtypes,
// shapes, data_offsets vs the data section and vs each other). Errors: Error(Io|Format, "<path>[: tensor '<name>']").
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return map_.path(); }
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& get(const std::string& name) const;  // Error(Format) with the closest name as hint
  std::vector<std::string> names() const;                 // sorted
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  void release_pages() const noexcept { map_.release_pages(); }  // see MappedFile::release_pages
  void release_pages(const TensorInfo& t) const noexcept { map_.release_pages(t.data, size_t(t.nbytes)); }

 private:
  MappedFile map_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint under one namespace. open() accepts
//   - a model directory: model.safetensors.index.json (-> its shards), else model.safetensors,
//     else every *.safetensors in it (sorted by file name);
//   - a .safetensors file;
//   - a *.index.json file (shards are relative to its directory).
class SafetensorsArchive {
 public:
  SafetensorsArchive() = default;
  explicit SafetensorsArchive(const std::string& path) { open(path); }
  void open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::string>& files() const { return files_; }
  size_t size() const { return index_.size(); }
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  // Missing -> Error(Format) naming the tensor, the checkpoint and the closest existing name.
  const TensorInfo& get(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  // Union of the files' __metadata__ (the first file wins on conflicting keys).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The mapped pages (MappedFile::release_pages) of every tensor whose name starts with `prefix` (a weight and its quantization state,
  // "X.weight", "X.weight.absmax", "X.weight_scale", ...): a loader calls it once it has copied them.
  void release_pages(const std::string& prefix) const noexcept;

  // Converts an F32/F16/BF16 tensor into dst (numel floats) after checking its shape equals
  // expected_shape (Error(Shape) with both shapes otherwise).
  void read_f32(const std::string& name, float* dst, const std::vector<int64_t>& expected_shape) const;
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& expected_shape) const;

 private:
  void add_file(const std::string& file);
  void open_index(const std::string& index_path);

  std::string path_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<SafetensorsFile>> owned_;
  std::map<std::string, const TensorInfo*> index_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors and writes one .safetensors file atomically (temp file + rename). The header lists
// tensors by name (JSON object keys sort); the data section orders them by element size, largest first,
// then by name, so every tensor starts aligned to its element size (the header is padded with spaces to
// a multiple of 8, as the format requires) and tensors stay contiguous with no gaps between them.
class SafetensorsWriter {
 public:
  // Copies numel(shape) * dtype_size(dtype) bytes from data.
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
  // References data, which must stay valid until write()/serialize() returns.
  void add_ref(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
  // Converts f32 values to dtype (F32/F16/BF16) and keeps the converted copy.
  void add_from_f32(const std::string& name, DType dtype, std::vector<int64_t> shape, const float* src);
  void set_metadata(std::map<std::string, std::string> metadata) { metadata_ = std::move(metadata); }
  // Streaming: names a tensor without its data, so header() is known before any tensor exists. The
  // caller writes header() and then each tensor's bytes itself, in data_order_names() order
  // (serialize()/write() refuse a writer holding declared tensors).
  void declare(const std::string& name, DType dtype, std::vector<int64_t> shape);
  std::vector<std::string> data_order_names() const;

  size_t size() const { return entries_.size(); }
  std::string header() const;        // the 8-byte length + padded JSON
  std::string serialize() const;     // the whole file in memory (small files, tests)
  void write(const std::string& path) const;  // streams to a temp file, then renames over path

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    int64_t nbytes;
    std::vector<uint8_t> owned;  // set when the writer holds a copy
  };
  Entry& insert(const std::string& name, DType dtype, std::vector<int64_t> shape);
  std::vector<const std::pair<const std::string, Entry>*> data_order() const;

  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace qlora
