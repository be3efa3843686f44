// The prepared-examples layout (little-endian, every section 8-byte aligned):
//   header  64 bytes: "QLORAPD\0", u32 version, u32 0, the key (<= 48 bytes, NUL-padded)
//   records each: i32 ids[ntok], labels, i32 doc_lens[ndoc], i8 roles[ntok or 0], padding; labels
//           are i32[ntok], or (when every label is its token or -100, as the data layer makes them)
//           one bit per token, set where the label is the token
//   index   per record: u64 offset, u64 ntok | ndoc << 32 | masked_labels << 62 | has_roles << 63
//   plans   per set (train, eval): u64 rows, u64 items, u64 packed, i64 row_off[rows + 1], i64 items[]
//   note    JSON text, padded
//   footer  64 bytes: u64 records, index, plans, note offsets, note length, XXH3-64 of every byte
//           before the footer, u64 0, "QLORAEND"
#include "text/example_store.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <fstream>

#include "core/error.h"

namespace qlora {

namespace {

constexpr char kMagic[8] = {'Q', 'L', 'O', 'R', 'A', 'P', 'D', '\0'};
constexpr char kEnd[8] = {'Q', 'L', 'O', 'R', 'A', 'E', 'N', 'D'};
constexpr uint32_t kVersion = 2;
constexpr size_t kHeader = 64, kFooter = 64, kKeyMax = 48;
constexpr uint64_t kRolesBit = 1ull << 63, kMaskBit = 1ull << 62;

// Where a record's parts are, from its index word.
struct Layout {
  uint64_t ntok, ndoc, labels_at, docs_at, roles_at, bytes;
  bool masked, roles;
  explicit Layout(uint64_t w)
      : ntok(uint32_t(w)), ndoc((w >> 32) & 0x3fffffffu), masked(w & kMaskBit), roles(w & kRolesBit) {
    labels_at = ntok * 4;
    docs_at = labels_at + (masked ? (ntok + 7) / 8 : ntok * 4);
    roles_at = docs_at + ndoc * 4;
    bytes = roles_at + (roles ? ntok : 0);
  }
  // labels[at..at+ntok) from the record at p
  void labels(const uint8_t* p, int32_t* out) const {
    if (!masked) {
      std::memcpy(out, p + labels_at, ntok * 4);
      return;
    }
    for (uint64_t t = 0; t < ntok; t++) {
      int32_t id;
      std::memcpy(&id, p + 4 * t, 4);
      out[t] = (p[labels_at + t / 8] >> (t % 8)) & 1 ? id : kNoLoss;
    }
  }
};

uint64_t pad8(uint64_t n) { return (n + 7) & ~uint64_t(7); }

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A record's bytes (at p) -> Example; `w` is its index word.
Example decode_record(const uint8_t* p, uint64_t w) {
  const Layout L(w);
  Example e;
  e.ids.resize(L.ntok);
  e.labels.resize(L.ntok);
  e.doc_lens.resize(L.ndoc);
  std::memcpy(e.ids.data(), p, L.ntok * 4);
  L.labels(p, e.labels.data());
  std::memcpy(e.doc_lens.data(), p + L.docs_at, L.ndoc * 4);
  if (L.roles) {
    e.roles.resize(L.ntok);
    std::memcpy(e.roles.data(), p + L.roles_at, L.ntok);
  }
  return e;
}

}  // namespace

void RowPlan::add_row(const std::vector<int64_t>& records) {
  items.insert(items.end(), records.begin(), records.end());
  row_off.push_back(int64_t(items.size()));
}

// ---------------------------------------------------------------------------------------------
// Writer

ExampleWriter::ExampleWriter(const std::string& path, const std::string& key) : path_(path), key_(key) {
  if (key.size() > kKeyMax) fail(ErrorKind::Internal, "ExampleWriter", "key longer than " + std::to_string(kKeyMax));
  if (!path.empty()) file_ = std::make_unique<AtomicFile>(path);
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  hash_ = st;
  char header[kHeader] = {};
  std::memcpy(header, kMagic, 8);
  std::memcpy(header + 8, &kVersion, 4);
  std::memcpy(header + 16, key.data(), key.size());
  put(header, kHeader);
}

ExampleWriter::~ExampleWriter() {
  if (hash_) XXH3_freeState(static_cast<XXH3_state_t*>(hash_));
}

void ExampleWriter::put(const void* p, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(hash_), p, n);
  buf_.append(static_cast<const char*>(p), n);
  at_ += n;
  if (file_ && buf_.size() >= (8u << 20)) {
    file_->append(buf_);
    buf_.clear();
  }
}

int64_t ExampleWriter::add(const Example& ex) {
  const uint64_t ntok = ex.ids.size(), ndoc = ex.doc_lens.size();
  if (ex.labels.size() != ntok || (!ex.roles.empty() && ex.roles.size() != ntok) || ntok >= (1ull << 32) ||
      ndoc >= (1ull << 30))
    fail(ErrorKind::Internal, "ExampleWriter::add", "inconsistent example");
  bool masked = true;
  for (uint64_t t = 0; t < ntok && masked; t++) masked = ex.labels[t] == kNoLoss || ex.labels[t] == ex.ids[t];
  index_.push_back(at_);
  index_.push_back(ntok | ndoc << 32 | (masked ? kMaskBit : 0) | (ex.roles.empty() ? 0 : kRolesBit));
  put(ex.ids.data(), ntok * 4);
  if (masked) {
    std::string bits((ntok + 7) / 8, '\0');
    for (uint64_t t = 0; t < ntok; t++)
      if (ex.labels[t] != kNoLoss) bits[t / 8] = char(uint8_t(bits[t / 8]) | (1u << (t % 8)));
    put(bits.data(), bits.size());
  } else {
    put(ex.labels.data(), ntok * 4);
  }
  put(ex.doc_lens.data(), ndoc * 4);
  put(ex.roles.data(), ex.roles.size());
  static const char zeros[8] = {};
  put(zeros, pad8(at_) - at_);
  return int64_t(count() - 1);
}

Example ExampleWriter::get(size_t rec) {
  const uint64_t off = index_[2 * rec], w = index_[2 * rec + 1];
  const uint64_t flushed = at_ - buf_.size();
  if (off >= flushed) return decode_record(reinterpret_cast<const uint8_t*>(buf_.data() + (off - flushed)), w);
  // Written out already: what is pending follows it into the file, and the record is read back.
  file_->append(buf_);
  buf_.clear();
  std::string bytes(size_t(Layout(w).bytes), '\0');
  std::ifstream in(file_->temp_path(), std::ios::binary);
  in.seekg(std::streamoff(off));
  if (!in.read(bytes.data(), std::streamsize(bytes.size())))
    fail(ErrorKind::Io, file_->temp_path(), "cannot read back the prepared data");
  return decode_record(reinterpret_cast<const uint8_t*>(bytes.data()), w);
}

std::shared_ptr<const ExampleStore> ExampleWriter::finish(const RowPlan& train, const RowPlan& eval,
                                                          const nlohmann::json& meta) {
  const uint64_t index_off = at_;
  put(index_.data(), index_.size() * 8);
  const uint64_t plans_off = at_;
  for (const RowPlan* p : {&train, &eval}) {
    const uint64_t head[3] = {p->rows(), p->items.size(), p->packed ? 1u : 0u};
    put(head, sizeof head);
    put(p->row_off.data(), p->row_off.size() * 8);
    put(p->items.data(), p->items.size() * 8);
  }
  const uint64_t meta_off = at_;
  const std::string text = meta.dump();
  put(text.data(), text.size());
  static const char zeros[8] = {};
  put(zeros, pad8(at_) - at_);
  const uint64_t sum = XXH3_64bits_digest(static_cast<XXH3_state_t*>(hash_));
  XXH3_freeState(static_cast<XXH3_state_t*>(hash_));
  hash_ = nullptr;
  uint64_t foot[8] = {count(), index_off, plans_off, meta_off, text.size(), sum, 0, 0};
  std::memcpy(&foot[7], kEnd, 8);
  buf_.append(reinterpret_cast<const char*>(foot), sizeof foot);
  if (!file_) return ExampleStore::from_bytes(std::move(buf_));
  file_->append(buf_);
  buf_.clear();
  file_->commit();
  std::string why;
  auto store = ExampleStore::open(path_, key_, &why);
  if (!store) fail(ErrorKind::Io, path_, "the prepared data just written does not read back: " + why);
  return store;
}

// ---------------------------------------------------------------------------------------------
// Store

std::shared_ptr<const ExampleStore> ExampleStore::from_bytes(std::string bytes) {
  auto s = std::make_shared<ExampleStore>();
  s->owned_ = std::move(bytes);
  s->base_ = reinterpret_cast<const uint8_t*>(s->owned_.data());
  s->size_ = s->owned_.size();
  std::string why;
  if (!s->parse(&why, ""))
    fail(ErrorKind::Internal, "ExampleStore", "prepared data in memory does not parse: " + why);
  return s;
}

std::shared_ptr<const ExampleStore> ExampleStore::open(const std::string& path, const std::string& key,
                                                       std::string* why) {
  // The checksum first, through a buffer: a damaged file is never mapped into the run.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot open it";
    return nullptr;
  }
  const off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < off_t(kHeader + kFooter)) {
    ::close(fd);
    *why = "it is " + std::to_string(int64_t(end)) + " bytes, shorter than any prepared dataset";
    return nullptr;
  }
  uint64_t foot[8];
  if (::pread(fd, foot, sizeof foot, end - off_t(kFooter)) != off_t(kFooter) || std::memcmp(&foot[7], kEnd, 8) != 0) {
    ::close(fd);
    *why = "it has no end marker (cut short, or not a prepared dataset)";
    return nullptr;
  }
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  std::string buf(size_t(4) << 20, '\0');
  const uint64_t body = uint64_t(end) - kFooter;
  bool io_ok = true;
  for (uint64_t at = 0; at < body && io_ok;) {
    const size_t want = size_t(std::min<uint64_t>(buf.size(), body - at));
    const ssize_t r = ::pread(fd, buf.data(), want, off_t(at));
    if (r <= 0) io_ok = false;
    else XXH3_64bits_update(st, buf.data(), size_t(r)), at += uint64_t(r);
  }
  const uint64_t sum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  ::close(fd);
  if (!io_ok) {
    *why = "it cannot be read";
    return nullptr;
  }
  if (sum != foot[5]) {
    *why = "its checksum does not match its bytes (damaged)";
    return nullptr;
  }
  auto s = std::make_shared<ExampleStore>();
  try {
    s->map_ = MappedFile(path);
  } catch (const Error& e) {
    *why = e.message();
    return nullptr;
  }
  s->path_ = path;
  s->base_ = s->map_.data();
  s->size_ = s->map_.size();
  if (s->size_ != size_t(end)) {
    *why = "it changed while being read";
    return nullptr;
  }
  if (!s->parse(why, key)) return nullptr;
  return s;
}

bool ExampleStore::parse(std::string* why, const std::string& key) {
  if (size_ < kHeader + kFooter || std::memcmp(base_, kMagic, 8) != 0) {
    *why = "it is not a prepared dataset (no header)";
    return false;
  }
  if (load<uint32_t>(base_ + 8) != kVersion) {
    *why = "it was written in format version " + std::to_string(load<uint32_t>(base_ + 8)) + ", this build reads " +
           std::to_string(kVersion);
    return false;
  }
  const std::string stored(reinterpret_cast<const char*>(base_ + 16), strnlen(reinterpret_cast<const char*>(base_ + 16), kKeyMax));
  if (!key.empty() && stored != key) {
    *why = "it was made for other inputs (key " + stored + ")";
    return false;
  }
  const uint8_t* f = base_ + size_ - kFooter;
  n_ = size_t(load<uint64_t>(f));
  const uint64_t index_off = load<uint64_t>(f + 8), plans_off = load<uint64_t>(f + 16), meta_off = load<uint64_t>(f + 24),
                 meta_len = load<uint64_t>(f + 32);
  const uint64_t body = size_ - kFooter;
  auto bad = [&](const std::string& what) {
    *why = "its " + what + " is out of bounds";
    return false;
  };
  if (index_off < kHeader || index_off > body || n_ > (body - index_off) / 16 || plans_off != index_off + n_ * 16)
    return bad("index");
  index_ = base_ + index_off;
  for (size_t r = 0; r < n_; r++) {
    const uint64_t off = load<uint64_t>(index_ + 16 * r), w = load<uint64_t>(index_ + 16 * r + 8);
    if (off < kHeader || off % 8 || off + Layout(w).bytes > index_off) return bad("record " + std::to_string(r));
  }
  uint64_t at = plans_off;
  for (RowPlan& p : plans_) {
    if (at + 24 > meta_off) return bad("row plan");
    const uint64_t rows = load<uint64_t>(base_ + at), items = load<uint64_t>(base_ + at + 8);
    p.packed = load<uint64_t>(base_ + at + 16) != 0;
    at += 24;
    if (rows > (meta_off - at) / 8 || items > (meta_off - at) / 8 || at + (rows + 1 + items) * 8 > meta_off)
      return bad("row plan");
    p.row_off.resize(size_t(rows + 1));
    p.items.resize(size_t(items));
    std::memcpy(p.row_off.data(), base_ + at, (rows + 1) * 8);
    at += (rows + 1) * 8;
    std::memcpy(p.items.data(), base_ + at, items * 8);
    at += items * 8;
    if (p.row_off.front() != 0 || p.row_off.back() != int64_t(items)) return bad("row plan");
    for (size_t r = 0; r < rows; r++)
      if (p.row_off[r] > p.row_off[r + 1] || (!p.packed && p.row_off[r + 1] - p.row_off[r] != 1)) return bad("row plan");
    for (int64_t i : p.items)
      if (i < 0 || uint64_t(i) >= n_) return bad("row plan");
  }
  if (at != meta_off || meta_off + meta_len > body) return bad("note");
  try {
    meta_ = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(base_ + meta_off), size_t(meta_len)));
  } catch (const std::exception&) {
    *why = "its note is not JSON";
    return false;
  }
  return true;
}

int64_t ExampleStore::tokens(size_t rec) const { return int64_t(uint32_t(load<uint64_t>(index_ + 16 * rec + 8))); }

int64_t ExampleStore::docs(size_t rec) const {
  return int64_t(Layout(load<uint64_t>(index_ + 16 * rec + 8)).ndoc);
}

Example ExampleStore::get(size_t rec) const {
  QLORA_ASSERT(rec < n_);
  return decode_record(base_ + load<uint64_t>(index_ + 16 * rec), load<uint64_t>(index_ + 16 * rec + 8));
}

void ExampleStore::append_packed(size_t rec, Example& row) const {
  QLORA_ASSERT(rec < n_ && docs(rec) == 0);
  const uint8_t* p = base_ + load<uint64_t>(index_ + 16 * rec);
  const Layout L(load<uint64_t>(index_ + 16 * rec + 8));
  const size_t ntok = size_t(L.ntok), at = row.ids.size();
  row.ids.resize(at + ntok);
  row.labels.resize(at + ntok);
  std::memcpy(row.ids.data() + at, p, ntok * 4);
  L.labels(p, row.labels.data() + at);
  if (ntok) row.labels[at] = kNoLoss;  // no target reaches back into the previous document
  row.doc_lens.push_back(int32_t(ntok));
}

// ---------------------------------------------------------------------------------------------
// Set

ExampleSet::ExampleSet(std::shared_ptr<const ExampleStore> store, RowPlan plan)
    : store_(std::move(store)), plan_(std::move(plan)) {}

ExampleSet ExampleSet::of(const std::vector<Example>& rows) {
  ExampleWriter w("", "");
  RowPlan plan;
  for (const Example& e : rows) plan.add_row({w.add(e)});
  ExampleSet s(w.finish(plan, RowPlan{}, nlohmann::json::object()), plan);
  for (size_t i = 0; i < rows.size(); i++)
    if (!rows[i].ref_logps.empty()) s.set_ref_logps(i, rows[i].ref_logps);
  return s;
}

int64_t ExampleSet::length(size_t row) const {
  int64_t n = 0;
  for (int64_t k = plan_.row_off[row]; k < plan_.row_off[row + 1]; k++) n += store_->tokens(size_t(plan_.items[size_t(k)]));
  return n;
}

int64_t ExampleSet::docs(size_t row) const {
  if (plan_.packed) return plan_.row_off[row + 1] - plan_.row_off[row];
  return std::max<int64_t>(1, store_->docs(size_t(plan_.items[size_t(plan_.row_off[row])])));
}

Example ExampleSet::operator[](size_t row) const {
  QLORA_ASSERT(row < size());
  Example e;
  if (plan_.packed) {
    for (int64_t k = plan_.row_off[row]; k < plan_.row_off[row + 1]; k++) store_->append_packed(size_t(plan_.items[size_t(k)]), e);
  } else {
    e = store_->get(size_t(plan_.items[size_t(plan_.row_off[row])]));
  }
  if (row < ref_.size()) e.ref_logps = ref_[row];
  return e;
}

std::vector<Example> ExampleSet::materialize() const {
  std::vector<Example> out;
  out.reserve(size());
  for (size_t i = 0; i < size(); i++) out.push_back((*this)[i]);
  return out;
}

void ExampleSet::set_ref_logps(size_t row, std::vector<double> v) {
  if (ref_.size() < size()) ref_.resize(size());
  ref_[row] = std::move(v);
}

}  // namespace qlora
