// Safetensors: header validation, sharded checkpoints, f32 reads and the atomic writer.
#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/json_util.h"

namespace fs = std::filesystem;

namespace qlora {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; so must the host be");

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

static std::string tensor_where(const std::string& file, const std::string& name) {
  return file + ": tensor '" + name + "'";
}

static const char* kKnownDTypes = "F32, F16, BF16, F64, I8, U8, I16, I32, I64, BOOL, F8_E4M3, F8_E5M2";

// Parses one header entry; `data_size` is the byte length of the data section.
static TensorInfo parse_entry(const std::string& path, const std::string& name, const json& e,
                              const uint8_t* data_begin, uint64_t data_size) {
  const std::string where = tensor_where(path, name);
  const char* bad = "the file is corrupt or was not written by a safetensors writer";
  if (!e.is_object()) fail(ErrorKind::Format, where, std::string("header entry is a ") + json_type_name(e) + ", expected an object", bad);
  TensorInfo t;
  t.name = name;
  t.file = path;

  auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) fail(ErrorKind::Format, where, "missing or non-string 'dtype'", bad);
  auto dtype = dtype_from_safetensors(dt->get<std::string>());
  if (!dtype)
    fail(ErrorKind::Format, where, "unknown dtype '" + dt->get<std::string>() + "'",
         std::string("supported dtypes: ") + kKnownDTypes);
  t.dtype = *dtype;

  auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) fail(ErrorKind::Format, where, "missing or non-array 'shape'", bad);
  int64_t numel = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      fail(ErrorKind::Format, where, "shape " + sh->dump() + " has an entry that is not a non-negative integer", bad);
    int64_t v = d.get<int64_t>();
    if (v > 0 && numel > INT64_MAX / v) fail(ErrorKind::Format, where, "shape " + sh->dump() + " overflows int64", bad);
    numel *= v;
    t.shape.push_back(v);
  }

  auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_integer() ||
      !(*off)[1].is_number_integer() || (*off)[0].get<int64_t>() < 0 || (*off)[1].get<int64_t>() < 0)
    fail(ErrorKind::Format, where, "'data_offsets' must be [begin, end] with non-negative integers", bad);
  uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
  std::string offs = "data_offsets [" + std::to_string(begin) + "," + std::to_string(end) + "]";
  if (begin > end) fail(ErrorKind::Format, where, offs + " has begin > end", bad);
  if (end > data_size)
    fail(ErrorKind::Format, where,
         offs + " exceed the file's data section of " + std::to_string(data_size) + " bytes",
         "the file is truncated or corrupt; copy or download it again");
  int64_t size = dtype_size(t.dtype);
  if (numel > INT64_MAX / size) fail(ErrorKind::Format, where, "byte size overflows int64", bad);
  if (int64_t(end - begin) != numel * size)
    fail(ErrorKind::Format, where,
         offs + " span " + std::to_string(end - begin) + " bytes but " + dt->get<std::string>() + " " +
             sh->dump() + " needs " + std::to_string(numel * size),
         bad);
  t.nbytes = int64_t(end - begin);
  t.data = data_begin + begin;
  return t;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : map_(path) {
  const uint64_t file_size = map_.size();
  if (file_size < 8)
    fail(ErrorKind::Format, path,
         "file is " + std::to_string(file_size) + " bytes, too small for a safetensors header",
         "the file is truncated or not a safetensors file");
  uint64_t n = 0;
  std::memcpy(&n, map_.data(), 8);
  if (n > file_size - 8)
    fail(ErrorKind::Format, path,
         "header length " + std::to_string(n) + " exceeds the file size of " + std::to_string(file_size) + " bytes",
         "the file is truncated or not a safetensors file");
  std::string_view text(reinterpret_cast<const char*>(map_.data()) + 8, size_t(n));
  json header;
  std::string duplicate;  // a tensor named twice: JSON parsers keep one entry silently
  std::set<std::string> keys_seen;
  const json::parser_callback_t seen = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && !keys_seen.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  try {
    header = json::parse(text.begin(), text.end(), seen);
  } catch (const json::parse_error& e) {
    fail(ErrorKind::Format, path + ": header", std::string("invalid JSON at byte ") + std::to_string(e.byte),
         "the file is corrupt or not a safetensors file");
  } catch (const json::exception& e) {  // out_of_range: a number too large for a double
    fail(ErrorKind::Format, path + ": header", std::string("invalid JSON: ") + json_error_reason(e),
         "the file is corrupt or not a safetensors file");
  }
  if (!header.is_object())
    fail(ErrorKind::Format, path + ": header", std::string("is a JSON ") + json_type_name(header) + ", expected an object");
  if (!duplicate.empty())
    fail(ErrorKind::Format, tensor_where(path, duplicate), "is listed twice in the header",
         "the file is corrupt or was not written by a safetensors writer");

  const uint8_t* data_begin = map_.data() + 8 + n;
  const uint64_t data_size = file_size - 8 - n;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail(ErrorKind::Format, path + ": __metadata__", "must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail(ErrorKind::Format, path + ": __metadata__ key '" + mk + "'",
               std::string("value is a ") + json_type_name(mv) + ", the format allows only strings");
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    tensors_.emplace(key, parse_entry(path, key, value, data_begin, data_size));
  }
  // No two tensors may share bytes (a lying data_offsets would alias another tensor's data).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& kv : tensors_)
    if (kv.second.nbytes > 0) by_offset.push_back(&kv.second);
  auto offset = [&](const TensorInfo& t) { return uint64_t(static_cast<const uint8_t*>(t.data) - data_begin); };
  std::sort(by_offset.begin(), by_offset.end(),
            [&](const TensorInfo* a, const TensorInfo* b) { return offset(*a) < offset(*b); });
  for (size_t i = 1; i < by_offset.size(); i++) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (offset(cur) < offset(prev) + uint64_t(prev.nbytes)) {
      auto span = [&](const TensorInfo& t) {
        const uint64_t b = offset(t);
        return std::string("[").append(std::to_string(b)).append(",").append(std::to_string(b + uint64_t(t.nbytes))).append("]");
      };
      fail(ErrorKind::Format, tensor_where(path, cur.name),
           "data_offsets " + span(cur) + " overlap tensor '" + prev.name + "' at " + span(prev),
           "the file is corrupt or was not written by a safetensors writer");
    }
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> v;
  for (const auto& kv : tensors_) v.push_back(kv.first);
  return v;
}

static std::string missing_hint(const std::vector<std::string>& names, const std::string& name) {
  if (names.empty()) return "the checkpoint holds no tensors";
  return "closest existing name: '" + closest_name(names, name) + "'";
}

const TensorInfo& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    fail(ErrorKind::Format, "tensor '" + name + "'",
         "not found in " + path() + " (" + std::to_string(tensors_.size()) + " tensors)", missing_hint(names(), name));
  return it->second;
}

// ---------------------------------------------------------------------------------------------------
// SafetensorsArchive

void SafetensorsArchive::add_file(const std::string& file) {
  owned_.push_back(std::make_unique<SafetensorsFile>(file));
  const SafetensorsFile& f = *owned_.back();
  files_.push_back(file);
  for (const auto& [name, info] : f.tensors()) {
    auto [it, inserted] = index_.emplace(name, &info);
    if (!inserted)
      fail(ErrorKind::Format, "tensor '" + name + "'", "appears in both " + it->second->file + " and " + file,
           "the checkpoint directory mixes two models; keep only one set of shards");
  }
  for (const auto& kv : f.metadata()) metadata_.emplace(kv.first, kv.second);
}

void SafetensorsArchive::release_pages(const std::string& prefix) const noexcept {
  for (auto it = index_.lower_bound(prefix); it != index_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    for (const auto& f : owned_)
      if (f->path() == it->second->file) f->release_pages(*it->second);
}

void SafetensorsArchive::open_index(const std::string& index_path) {
  json j = read_json_file(index_path);
  const json* wm = json_find(j, "weight_map");
  if (!wm || !wm->is_object())
    fail(ErrorKind::Format, index_path, "has no 'weight_map' object",
         "a sharded checkpoint index maps each tensor name to its shard file");
  std::string dir = fs::path(index_path).parent_path().string();
  std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensors the index puts there
  for (const auto& [name, shard] : wm->items()) {
    if (!shard.is_string())
      fail(ErrorKind::Format, index_path + ": weight_map['" + name + "']",
           std::string("is a ") + json_type_name(shard) + ", expected a shard file name");
    by_shard[shard.get<std::string>()].push_back(name);
  }
  if (by_shard.empty()) fail(ErrorKind::Format, index_path, "'weight_map' is empty");
  for (const auto& [shard, names] : by_shard) {
    std::string file = (dir.empty() ? fs::path(shard) : fs::path(dir) / shard).string();
    if (!fs::exists(file))
      fail(ErrorKind::Io, file,
           "shard named by " + index_path + " is missing (" + std::to_string(names.size()) +
               " tensors map to it, e.g. '" + names.front() + "')",
           "copy or download the complete checkpoint");
    add_file(file);
    const SafetensorsFile& f = *owned_.back();
    for (const auto& name : names)
      if (!f.has(name))
        fail(ErrorKind::Format, "tensor '" + name + "'", index_path + " places it in " + file + ", which lacks it",
             "the index and the shards come from different checkpoints");
  }
}

void SafetensorsArchive::open(const std::string& path) {
  path_ = path;
  files_.clear();
  owned_.clear();
  index_.clear();
  metadata_.clear();
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    fs::path dir(path);
    if (fs::exists(dir / "model.safetensors.index.json")) {
      open_index((dir / "model.safetensors.index.json").string());
    } else if (fs::exists(dir / "model.safetensors")) {
      add_file((dir / "model.safetensors").string());
    } else {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
      if (found.empty())
        fail(ErrorKind::Io, path, "no .safetensors files in this directory",
             "expected model.safetensors, model.safetensors.index.json or *.safetensors shards");
      std::sort(found.begin(), found.end());
      for (const auto& f : found) add_file(f);
    }
  } else if (!fs::exists(path, ec)) {
    fail(ErrorKind::Io, path, "no such file or directory", "pass a model directory or a .safetensors file");
  } else if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    open_index(path);
  } else {
    add_file(path);
  }
}

const TensorInfo& SafetensorsArchive::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    fail(ErrorKind::Format, "tensor '" + name + "'",
         "not found in " + path_ + " (" + std::to_string(index_.size()) + " tensors)", missing_hint(names(), name));
  return *it->second;
}

std::vector<std::string> SafetensorsArchive::names() const {
  std::vector<std::string> v;
  v.reserve(index_.size());
  for (const auto& kv : index_) v.push_back(kv.first);
  return v;
}

void SafetensorsArchive::read_f32(const std::string& name, float* dst,
                                  const std::vector<int64_t>& expected_shape) const {
  const TensorInfo& t = get(name);
  if (t.shape != expected_shape)
    fail(ErrorKind::Shape, tensor_where(t.file, name),
         "has shape " + shape_str(t.shape) + ", expected " + shape_str(expected_shape),
         "the checkpoint does not match the model config");
  if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16)
    fail(ErrorKind::Unsupported, tensor_where(t.file, name),
         std::string("dtype ") + dtype_traits(t.dtype).safetensors + " cannot be read as floats here",
         "expected F32, F16 or BF16");
  if (t.nbytes == 0) return;  // an empty tensor may point nowhere
  // Files from other writers may place a 16-bit tensor at an odd offset; read through an aligned copy.
  if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) != 0) {
    std::vector<uint64_t> tmp((size_t(t.nbytes) + 7) / 8);
    std::memcpy(tmp.data(), t.data, size_t(t.nbytes));
    convert_to_f32(t.dtype, tmp.data(), dst, t.numel());
  } else {
    convert_to_f32(t.dtype, t.data, dst, t.numel());
  }
}

std::vector<float> SafetensorsArchive::read_f32(const std::string& name,
                                                const std::vector<int64_t>& expected_shape) const {
  const TensorInfo& t = get(name);
  int64_t n = 1;
  for (int64_t d : expected_shape) n *= d;
  std::vector<float> out(size_t(t.shape == expected_shape ? n : 0));
  read_f32(name, out.data(), expected_shape);  // throws on a shape mismatch before touching out
  return out;
}

// ---------------------------------------------------------------------------------------------------
// SafetensorsWriter

SafetensorsWriter::Entry& SafetensorsWriter::insert(const std::string& name, DType dtype,
                                                    std::vector<int64_t> shape) {
  if (name.empty() || name == "__metadata__")
    fail(ErrorKind::Internal, "tensor '" + name + "'", "is not a valid safetensors tensor name");
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(ErrorKind::Shape, "tensor '" + name + "'", "negative dimension in " + shape_str(shape));
    numel *= d;
  }
  auto [it, inserted] = entries_.emplace(name, Entry{dtype, std::move(shape), nullptr, numel * dtype_size(dtype), {}});
  if (!inserted) fail(ErrorKind::Internal, "tensor '" + name + "'", "added twice to a SafetensorsWriter");
  return it->second;
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
  Entry& e = insert(name, dtype, std::move(shape));
  auto* p = static_cast<const uint8_t*>(data);
  e.owned.assign(p, p + e.nbytes);
  e.data = e.owned.data();
}

void SafetensorsWriter::add_ref(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                const void* data) {
  insert(name, dtype, std::move(shape)).data = data;
}

void SafetensorsWriter::add_from_f32(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                     const float* src) {
  Entry& e = insert(name, dtype, std::move(shape));
  e.owned.resize(size_t(e.nbytes));
  convert_from_f32(dtype, src, e.owned.data(), e.nbytes / dtype_size(dtype));
  e.data = e.owned.data();
}

void SafetensorsWriter::declare(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  insert(name, dtype, std::move(shape));  // data stays null
}

std::vector<std::string> SafetensorsWriter::data_order_names() const {
  std::vector<std::string> v;
  for (const auto* kv : data_order()) v.push_back(kv->first);
  return v;
}

std::vector<const std::pair<const std::string, SafetensorsWriter::Entry>*> SafetensorsWriter::data_order() const {
  std::vector<const std::pair<const std::string, Entry>*> v;
  for (const auto& kv : entries_) v.push_back(&kv);
  std::stable_sort(v.begin(), v.end(), [](auto* a, auto* b) {
    return dtype_size(a->second.dtype) > dtype_size(b->second.dtype);  // names already sorted by the map
  });
  return v;
}

std::string SafetensorsWriter::header() const {
  json h = json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  int64_t off = 0;
  for (const auto* kv : data_order()) {
    const Entry& e = kv->second;
    h[kv->first] = {{"dtype", dtype_traits(e.dtype).safetensors}, {"shape", e.shape}, {"data_offsets", {off, off + e.nbytes}}};
    off += e.nbytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + text;
}

static void need_data(const std::string& name, const void* data, int64_t nbytes) {
  if (!data && nbytes > 0)
    fail(ErrorKind::Internal, "tensor '" + name + "'", "was declared without data; write it by streaming");
}

std::string SafetensorsWriter::serialize() const {
  std::string out = header();
  for (const auto* kv : data_order()) need_data(kv->first, kv->second.data, kv->second.nbytes);
  for (const auto* kv : data_order()) out.append(static_cast<const char*>(kv->second.data), size_t(kv->second.nbytes));
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  for (const auto* kv : data_order()) need_data(kv->first, kv->second.data, kv->second.nbytes);
  AtomicFile f(path);
  f.append(header());
  for (const auto* kv : data_order()) f.append(kv->second.data, size_t(kv->second.nbytes));
  f.commit();
}

}  // namespace qlora
