// GGUF reader: bounds-checked parse of header, metadata and tensor infos over a read-only mapping.
#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>

#include "core/error.h"
#include "io/json_util.h"
#include "io/mmap_file.h"

namespace qlora {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "?";
}

int64_t GgufTensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensorInfo::shape() const { return {ne.rbegin(), ne.rend()}; }

namespace {

constexpr uint32_t kMaxDims = 4;        // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;       // nested arrays deeper than this are surely corrupt

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}

// Smallest encoded size of a value of type t, to reject counts the file cannot hold.
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 12;
  }
  return 1;
}

// Cursor over the mapped bytes; every read is bounds-checked and errors carry the byte offset.
struct Reader {
  const uint8_t* p;
  uint64_t size;
  uint64_t pos = 0;
  const std::string& path;

  std::string at(uint64_t off) const { return path + ":offset " + std::to_string(off); }
  uint64_t left() const { return size - pos; }

  void need(uint64_t n, const char* what) const {
    if (n > left())
      fail(ErrorKind::Format, at(pos),
           std::string("file is truncated: ") + what + " needs " + std::to_string(n) + " bytes, " +
               std::to_string(left()) + " left",
           "the download or copy was probably cut short; fetch the file again");
  }
  template <class T>
  T pod(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p + pos, sizeof(T));  // GGUF is little-endian, as is every host we build for
    pos += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    uint64_t start = pos;
    uint64_t n = pod<uint64_t>(what);
    if (n > left())
      fail(ErrorKind::Format, at(start),
           std::string(what) + " claims " + std::to_string(n) + " bytes but only " + std::to_string(left()) +
               " are left in the file",
           "corrupt or truncated GGUF");
    std::string s(reinterpret_cast<const char*>(p + pos), size_t(n));
    pos += n;
    return s;
  }
};

GgufType read_type(Reader& r, const std::string& where, const char* what) {
  uint64_t off = r.pos;
  uint32_t t = r.pod<uint32_t>(what);
  if (t > uint32_t(GgufType::F64))
    fail(ErrorKind::Format, where + " (offset " + std::to_string(off) + ")",
         std::string("unknown ") + what + " " + std::to_string(t), "valid GGUF value types are 0..12");
  return GgufType(t);
}

GgufValue read_value(Reader& r, GgufType t, const std::string& where, int depth) {
  GgufValue v;
  v.type = t;
  switch (t) {
    case GgufType::U8: v.i = r.pod<uint8_t>("u8 value"); break;
    case GgufType::I8: v.i = r.pod<int8_t>("i8 value"); break;
    case GgufType::U16: v.i = r.pod<uint16_t>("u16 value"); break;
    case GgufType::I16: v.i = r.pod<int16_t>("i16 value"); break;
    case GgufType::U32: v.i = r.pod<uint32_t>("u32 value"); break;
    case GgufType::I32: v.i = r.pod<int32_t>("i32 value"); break;
    case GgufType::U64: v.u = r.pod<uint64_t>("u64 value"); v.i = int64_t(v.u); break;
    case GgufType::I64: v.i = r.pod<int64_t>("i64 value"); break;
    case GgufType::F32: v.f = r.pod<float>("f32 value"); break;
    case GgufType::F64: v.f = r.pod<double>("f64 value"); break;
    case GgufType::BOOL: {
      uint64_t off = r.pos;
      uint8_t b = r.pod<uint8_t>("bool value");
      if (b > 1)
        fail(ErrorKind::Format, where + " (offset " + std::to_string(off) + ")",
             "bool value is " + std::to_string(b) + ", expected 0 or 1");
      v.i = b;
      break;
    }
    case GgufType::STRING: v.s = r.str("string value"); break;
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        fail(ErrorKind::Format, where + " (offset " + std::to_string(r.pos) + ")",
             "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
      v.elem_type = read_type(r, where, "array element type");
      uint64_t off = r.pos;
      uint64_t n = r.pod<uint64_t>("array length");
      if (n > r.left() / min_value_bytes(v.elem_type))
        fail(ErrorKind::Format, where + " (offset " + std::to_string(off) + ")",
             "array claims " + std::to_string(n) + " " + gguf_type_name(v.elem_type) + " elements, more than the " +
                 std::to_string(r.left()) + " bytes left can hold",
             "corrupt or truncated GGUF");
      v.arr.reserve(size_t(n));
      for (uint64_t k = 0; k < n; k++) v.arr.push_back(read_value(r, v.elem_type, where, depth + 1));
      break;
    }
  }
  return v;
}

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path) {
  map_ = std::make_unique<MappedFile>(path);
  data_ = map_->data();
  size_ = map_->size();
  parse();
}

GgufFile GgufFile::from_bytes(std::vector<uint8_t> bytes, const std::string& name) {
  GgufFile f;
  f.path_ = name;
  f.owned_ = std::move(bytes);
  f.data_ = f.owned_.data();
  f.size_ = f.owned_.size();
  f.parse();
  return f;
}

GgufFile::~GgufFile() = default;

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;

void GgufFile::release_pages(const std::string& tensor_name) const noexcept {
  const auto it = tensor_index_.find(tensor_name);
  if (map_ && it != tensor_index_.end()) {
    const GgufTensorInfo& t = tensors_[it->second];
    map_->release_pages(data_ + data_offset_ + t.offset, size_t(t.n_bytes));
  }
}

void GgufFile::release_rows(const std::string& tensor_name, int64_t first_row, int64_t n_rows) const noexcept {
  const auto it = tensor_index_.find(tensor_name);
  if (!map_ || it == tensor_index_.end()) return;
  const GgufTensorInfo& t = tensors_[it->second];
  const int64_t row = t.ne.empty() ? 1 : t.ne[0];
  if (row == 0 || first_row < 0 || n_rows <= 0 || first_row + n_rows > t.n_elements() / row) return;
  const int64_t row_bytes = ggml_row_bytes(t.type, row);
  map_->release_pages(data_ + data_offset_ + t.offset + first_row * row_bytes, size_t(n_rows * row_bytes));
}

namespace {

// Checks the magic and reads the version (Unsupported for v1, big-endian files and versions past 3);
// r is left at the counts.
uint32_t read_version(Reader& r) {
  const std::string& path = r.path;
  if (r.size < 4 || std::memcmp(r.p, "GGUF", 4) != 0)
    fail(ErrorKind::Format, path + ":offset 0", "not a GGUF file (the first 4 bytes are not 'GGUF')",
         "pass a .gguf file; for a Hugging Face checkpoint pass its directory instead");
  r.pos = 4;
  const uint32_t version = r.pod<uint32_t>("version");
  if (version == 1)
    fail(ErrorKind::Unsupported, path, "GGUF version 1 is not supported (32-bit counts, pre-2023 files)",
         "convert the model again with a current llama.cpp convert_hf_to_gguf.py");
  if ((version & 0xffffu) == 0 && (version >> 24) >= 2 && (version >> 24) <= 3)
    fail(ErrorKind::Unsupported, path, "big-endian GGUF files are not supported",
         "use the little-endian release of the model");
  if (version < 2 || version > 3)
    fail(ErrorKind::Unsupported, path,
         "GGUF version " + std::to_string(version) + " is not supported (2 or 3 expected)");
  return version;
}

struct Counts {
  uint64_t n_tensors, n_kv;
};

// The tensor and metadata counts, each one the rest of the file can hold.
Counts read_counts(Reader& r) {
  uint64_t n_tensors = r.pod<uint64_t>("tensor count");
  uint64_t n_kv = r.pod<uint64_t>("metadata count");
  // Each KV takes >= 8 (key length) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 4 + 8.
  if (n_kv > r.left() / 13)
    fail(ErrorKind::Format, r.at(16), "metadata count " + std::to_string(n_kv) + " cannot fit in the file",
         "corrupt or truncated GGUF");
  if (n_tensors > r.left() / 24)
    fail(ErrorKind::Format, r.at(8), "tensor count " + std::to_string(n_tensors) + " cannot fit in the file",
         "corrupt or truncated GGUF");
  return {n_tensors, n_kv};
}

// n_kv key/value pairs into kv, their keys in file order into key_order.
void read_metadata(Reader& r, uint64_t n_kv, std::map<std::string, GgufValue>& kv,
                   std::vector<std::string>& key_order) {
  for (uint64_t k = 0; k < n_kv; k++) {
    uint64_t off = r.pos;
    std::string key = r.str("metadata key");
    std::string where = r.path + ": key '" + key + "'";
    if (kv.count(key))
      fail(ErrorKind::Format, where + " (offset " + std::to_string(off) + ")", "duplicate metadata key");
    GgufType t = read_type(r, where, "value type");
    try {
      kv.emplace(key, read_value(r, t, where, 0));
    } catch (const Error& e) {  // a cut inside a long array: still say which key it was
      if (e.where().find(": key '") != std::string::npos) throw;
      fail(e.kind(), e.where() + " in key '" + key + "'", e.message(), e.hint());
    }
    key_order.push_back(key);
  }
}

// A tensor info's dims into ti.ne (at most 4); returns their element count (Format where it overflows).
int64_t read_tensor_dims(Reader& r, const std::string& where, GgufTensorInfo& ti) {
  uint32_t n_dims = r.pod<uint32_t>("tensor dim count");
  if (n_dims > kMaxDims)
    fail(ErrorKind::Format, where, std::to_string(n_dims) + " dimensions, at most 4 allowed");
  int64_t n_el = 1;
  for (uint32_t d = 0; d < n_dims; d++) {
    uint64_t ne = r.pod<uint64_t>("tensor dim");
    if (ne > uint64_t(std::numeric_limits<int64_t>::max()) || (ne != 0 && uint64_t(n_el) > uint64_t(std::numeric_limits<int64_t>::max()) / ne))
      fail(ErrorKind::Format, where, "dimension " + std::to_string(d) + " = " + std::to_string(ne) + " overflows the element count");
    ti.ne.push_back(int64_t(ne));
    n_el *= int64_t(ne);
  }
  return n_el;
}

// One tensor info: name (not in `index` yet), dims, ggml type (whole blocks per row) and an offset
// on the alignment.
GgufTensorInfo read_tensor_info(Reader& r, uint64_t alignment, const std::map<std::string, size_t>& index) {
  uint64_t off = r.pos;
  GgufTensorInfo ti;
  ti.name = r.str("tensor name");
  std::string where = r.path + ": tensor '" + ti.name + "'";
  if (index.count(ti.name))
    fail(ErrorKind::Format, where + " (offset " + std::to_string(off) + ")", "duplicate tensor name");
  const int64_t n_el = read_tensor_dims(r, where, ti);
  uint32_t type_id = r.pod<uint32_t>("tensor type");
  const GgmlTypeTraits* tr = ggml_type_traits(type_id);
  if (!tr)
    fail(ErrorKind::Unsupported, where, "unknown ggml tensor type id " + std::to_string(type_id),
         "the file needs a newer reader; re-quantize to Q8_0/Q4_K/Q6_K or F16");
  ti.type = tr->type;
  int64_t row = ti.ne.empty() ? 1 : ti.ne[0];
  if (row % tr->block_size != 0)
    fail(ErrorKind::Format, where,
         std::string("row length ") + std::to_string(row) + " is not a multiple of the " + tr->name + " block size " +
             std::to_string(tr->block_size));
  ti.n_bytes = uint64_t(n_el / tr->block_size) * uint64_t(tr->block_bytes);
  ti.offset = r.pod<uint64_t>("tensor offset");
  if (ti.offset % alignment != 0)
    fail(ErrorKind::Format, where,
         "data offset " + std::to_string(ti.offset) + " is not a multiple of the alignment " +
             std::to_string(alignment));
  return ti;
}

// Every tensor's bytes inside the data section (from data_offset to the file's `size`), none
// overlapping another.
void check_tensor_data(const std::vector<GgufTensorInfo>& tensors, uint64_t data_offset, uint64_t size,
                       const std::string& path) {
  uint64_t data_size = data_offset <= size ? size - data_offset : 0;
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& ti : tensors) {
    if (ti.offset > data_size || ti.n_bytes > data_size - ti.offset)
      fail(ErrorKind::Format, path + ": tensor '" + ti.name + "'",
           "data [" + std::to_string(ti.offset) + ", +" + std::to_string(ti.n_bytes) + ") lies outside the " +
               std::to_string(data_size) + "-byte data section",
           "the file is truncated or its tensor table is corrupt");
    by_offset.push_back(&ti);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); k++) {
    const GgufTensorInfo* a = by_offset[k - 1];
    if (a->offset + a->n_bytes > by_offset[k]->offset && a->n_bytes > 0)
      fail(ErrorKind::Format, path + ": tensor '" + by_offset[k]->name + "'",
           "data overlaps tensor '" + a->name + "'", "corrupt tensor table");
  }
}

}  // namespace

void GgufFile::parse() {
  Reader r{data_, size_, 0, path_};
  version_ = read_version(r);
  const Counts counts = read_counts(r);
  read_metadata(r, counts.n_kv, kv_, key_order_);

  if (has("general.alignment")) {
    const GgufValue& a = get("general.alignment");
    if (a.type != GgufType::U32 || a.i == 0 || (a.i & (a.i - 1)) != 0)
      fail(ErrorKind::Format, path_ + ": key 'general.alignment'",
           std::string("must be a non-zero power of two of type u32, got ") + gguf_type_name(a.type) + " " + std::to_string(a.i));
    alignment_ = uint64_t(a.i);
  }

  tensors_.reserve(size_t(counts.n_tensors));
  for (uint64_t k = 0; k < counts.n_tensors; k++) {
    GgufTensorInfo ti = read_tensor_info(r, alignment_, tensor_index_);
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }

  data_offset_ = (r.pos + alignment_ - 1) / alignment_ * alignment_;
  check_tensor_data(tensors_, data_offset_, size_, path_);
}

const GgufValue& GgufFile::get(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) {
    std::string near = closest_name(key_order_, key, 4);
    fail(ErrorKind::Format, path_ + ": key '" + key + "'", "missing metadata key",
         near.empty() ? "" : "did you mean '" + near + "'?");
  }
  return it->second;
}

namespace {

[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GgufValue& v, const char* want) {
  fail(ErrorKind::Format, path + ": key '" + key + "'",
       std::string("has type ") + gguf_type_name(v.type) + ", expected " + want);
}

}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::STRING) wrong_type(path_, key, v, "string");
  return v.s;
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::BOOL) wrong_type(path_, key, v, "bool");
  return v.i != 0;
}

uint64_t GgufFile::get_u64(const std::string& key) const {
  const GgufValue& v = get(key);
  if (!is_integer(v.type)) wrong_type(path_, key, v, "an integer");
  if (v.type == GgufType::U64) return v.u;
  if (v.i < 0) fail(ErrorKind::Format, path_ + ": key '" + key + "'", "is negative (" + std::to_string(v.i) + "), expected >= 0");
  return uint64_t(v.i);
}

uint32_t GgufFile::get_u32(const std::string& key) const {
  uint64_t u = get_u64(key);
  if (u > std::numeric_limits<uint32_t>::max())
    fail(ErrorKind::Format, path_ + ": key '" + key + "'", std::to_string(u) + " does not fit in u32");
  return uint32_t(u);
}

int64_t GgufFile::get_i64(const std::string& key) const {
  const GgufValue& v = get(key);
  if (!is_integer(v.type)) wrong_type(path_, key, v, "an integer");
  if (v.type == GgufType::U64 && v.u > uint64_t(std::numeric_limits<int64_t>::max()))
    fail(ErrorKind::Format, path_ + ": key '" + key + "'", std::to_string(v.u) + " does not fit in i64");
  return v.i;
}

double GgufFile::get_f64(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::F32 && v.type != GgufType::F64) wrong_type(path_, key, v, "f32 or f64");
  return v.f;
}

float GgufFile::get_f32(const std::string& key) const { return float(get_f64(key)); }

uint64_t GgufFile::get_array_size(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::ARRAY) wrong_type(path_, key, v, "array");
  return v.arr.size();
}

GgufType GgufFile::get_array_type(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::ARRAY) wrong_type(path_, key, v, "array");
  return v.elem_type;
}

std::vector<std::string> GgufFile::get_array_strings(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::ARRAY || v.elem_type != GgufType::STRING) wrong_type(path_, key, v, "array of string");
  std::vector<std::string> out;
  out.reserve(v.arr.size());
  for (const auto& e : v.arr) out.push_back(e.s);
  return out;
}

std::vector<int64_t> GgufFile::get_array_i64(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufType::ARRAY || !(is_integer(v.elem_type) || v.elem_type == GgufType::BOOL))
    wrong_type(path_, key, v, "array of integers");
  std::vector<int64_t> out;
  out.reserve(v.arr.size());
  for (size_t k = 0; k < v.arr.size(); k++) {
    const GgufValue& e = v.arr[k];
    if (e.type == GgufType::U64 && e.u > uint64_t(std::numeric_limits<int64_t>::max()))
      fail(ErrorKind::Format, path_ + ": key '" + key + "'", "element " + std::to_string(k) + " does not fit in i64");
    out.push_back(e.i);
  }
  return out;
}

std::vector<double> GgufFile::get_array_f64(const std::string& key) const {
  const GgufValue& v = get(key);
  bool fl = v.elem_type == GgufType::F32 || v.elem_type == GgufType::F64;
  if (v.type != GgufType::ARRAY || !(fl || is_integer(v.elem_type))) wrong_type(path_, key, v, "array of numbers");
  std::vector<double> out;
  out.reserve(v.arr.size());
  for (const auto& e : v.arr)
    out.push_back(fl ? e.f : e.type == GgufType::U64 ? double(e.u) : double(e.i));
  return out;
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  if (it == tensor_index_.end()) {
    std::vector<std::string> names;
    for (const auto& t : tensors_) names.push_back(t.name);
    std::string near = closest_name(names, name, 6);
    fail(ErrorKind::Format, path_ + ": tensor '" + name + "'", "no such tensor in the file",
         near.empty() ? "" : "did you mean '" + near + "'?");
  }
  return tensors_[it->second];
}

const uint8_t* GgufFile::tensor_data(const std::string& name) const {
  return data_ + data_offset_ + tensor(name).offset;
}

void GgufFile::read_tensor_f32(const std::string& name, float* dst) const {
  const GgufTensorInfo& ti = tensor(name);
  const int64_t row = ti.ne.empty() ? 1 : ti.ne[0];
  if (ti.n_elements() == 0 || row == 0) return;
  read_rows_f32(name, 0, ti.n_elements() / row, dst);
}

void GgufFile::read_rows_f32(const std::string& name, int64_t first_row, int64_t n_rows, float* dst) const {
  const GgufTensorInfo& ti = tensor(name);
  const GgmlTypeTraits& tr = ggml_type_traits(ti.type);
  if (!tr.can_dequantize)
    fail(ErrorKind::Unsupported, path_ + ": tensor '" + name + "'",
         std::string("ggml type ") + tr.name + " cannot be dequantized yet",
         "supported: " + ggml_dequantizable_types());
  const int64_t row = ti.ne.empty() ? 1 : ti.ne[0];
  const int64_t total = row == 0 ? 0 : ti.n_elements() / row;
  if (first_row < 0 || n_rows < 0 || first_row > total || n_rows > total - first_row)
    fail(ErrorKind::Shape, path_ + ": tensor '" + name + "'",
         "rows " + std::to_string(first_row) + ".." + std::to_string(first_row + n_rows) + " of " + std::to_string(total));
  if (n_rows == 0 || row == 0) return;
  const int64_t row_bytes = ggml_row_bytes(ti.type, row);
  const uint8_t* src = data_ + data_offset_ + ti.offset + first_row * row_bytes;
  // Rows are independent; big embeddings (~30M elements) are worth the threads. An error must not
  // leave the parallel region (that terminates the process): the first is kept and rethrown.
  std::exception_ptr error;
#pragma omp parallel for schedule(static) if (n_rows * row > (int64_t(1) << 20))
  for (int64_t r = 0; r < n_rows; r++) {
    try {
      dequantize_row(ti.type, src + r * row_bytes, dst + r * row, row);
    } catch (...) {
#pragma omp critical(qlora_gguf_read_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

std::vector<float> GgufFile::read_tensor_f32(const std::string& name) const {
  std::vector<float> out(size_t(tensor(name).n_elements()));
  read_tensor_f32(name, out.data());
  return out;
}

}  // namespace qlora
