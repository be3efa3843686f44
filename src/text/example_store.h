// Prepared examples as one flat byte layout, held in memory or memory-mapped from a file: the
// records (ids, labels, document lengths, roles), their index, the train and eval row plans (which
// records each row concatenates, for packing) and a JSON note. The same layout serves the dataset
// cache (train/data_cache.h) and a run without one, so a cached run reads exactly what a fresh
// preparation would have given it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/mmap_file.h"
#include "text/dataset.h"

namespace qlora {

// Which records a set's rows are: row r concatenates items[row_off[r] .. row_off[r+1]). A packed
// set's rows are packed rows (pack_examples: doc_lens per record, each record's first label
// kNoLoss); otherwise each row is one record, as stored.
struct RowPlan {
  std::vector<int64_t> row_off{0};  // (rows + 1)
  std::vector<int64_t> items;
  bool packed = false;
  size_t rows() const { return row_off.size() - 1; }
  void add_row(const std::vector<int64_t>& records);
};

// Immutable records, read in place from the bytes (a string in memory or a mapped file).
class ExampleStore {
 public:
  size_t count() const { return n_; }
  int64_t tokens(size_t rec) const;  // tokens of record `rec`
  int64_t docs(size_t rec) const;    // documents (doc_lens entries; 0 = one plain document)
  Example get(size_t rec) const;
  // Appends record `rec` to `row` as a packed document (pack_examples' rule).
  void append_packed(size_t rec, Example& row) const;
  const RowPlan& plan(int set) const { return plans_[set]; }  // 0 = train, 1 = eval
  const nlohmann::json& meta() const { return meta_; }
  size_t bytes() const { return size_; }
  const std::string& path() const { return path_; }  // "" = in memory

  // Reads a store made by ExampleWriter::finish. The file form maps it and first checks it whole:
  // magic, version, `key` (empty: any), every offset in bounds and the checksum of every byte
  // (read through a small buffer, so the check does not make the file resident). Returns null and
  // says why in `why` when the file is not one of ours, is damaged, truncated or made for another key.
  static std::shared_ptr<const ExampleStore> open(const std::string& path, const std::string& key, std::string* why);
  static std::shared_ptr<const ExampleStore> from_bytes(std::string bytes);

 private:
  bool parse(std::string* why, const std::string& key);
  std::string owned_;
  MappedFile map_;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0, n_ = 0;
  const uint8_t* index_ = nullptr;
  RowPlan plans_[2];
  nlohmann::json meta_;
};

// Writes records one at a time (in memory, or to a file that appears under its name only at
// finish), then the row plans and the note. Memory held: 16 bytes of index per record.
class ExampleWriter {
 public:
  // path empty: in memory. `key` is stored in the header and checked by open().
  ExampleWriter(const std::string& path, const std::string& key);
  ~ExampleWriter();
  ExampleWriter(const ExampleWriter&) = delete;
  ExampleWriter& operator=(const ExampleWriter&) = delete;
  int64_t add(const Example& ex);  // -> record number
  size_t count() const { return index_.size() / 2; }
  int64_t tokens(size_t rec) const { return int64_t(uint32_t(index_[2 * rec + 1])); }
  // Reads a record back (KTO pairs completions after the split; rare, so a slow path is fine).
  Example get(size_t rec);
  std::shared_ptr<const ExampleStore> finish(const RowPlan& train, const RowPlan& eval, const nlohmann::json& meta);

 private:
  void put(const void* p, size_t n);
  std::unique_ptr<AtomicFile> file_;
  std::string buf_;  // in memory: every byte; to a file: the bytes not yet appended
  std::string path_, key_;
  uint64_t at_ = 0;
  std::vector<uint64_t> index_;  // per record: offset, then ntok | ndoc << 32 | has_roles << 63
  void* hash_ = nullptr;         // XXH3 state over every byte written
};

// The rows of one set (train or eval) over a store. Rows are made on access (operator[] returns a
// new Example), so a set over a mapped file holds in memory only its plan. Reference log-probs
// computed before training are kept beside the store, per row.
class ExampleSet {
 public:
  ExampleSet() = default;
  ExampleSet(std::shared_ptr<const ExampleStore> store, RowPlan plan);
  // A store in memory holding these rows, one record each (doc_lens, roles and ref_logps kept).
  static ExampleSet of(const std::vector<Example>& rows);

  size_t size() const { return plan_.rows(); }
  bool empty() const { return size() == 0; }
  int64_t length(size_t row) const;  // tokens
  int64_t docs(size_t row) const;    // documents of an unpacked row (doc_lens entries, at least 1)
  Example operator[](size_t row) const;
  std::vector<Example> materialize() const;
  const RowPlan& plan() const { return plan_; }
  const std::shared_ptr<const ExampleStore>& store() const { return store_; }
  void set_ref_logps(size_t row, std::vector<double> v);
  void clear_ref_logps() { ref_.clear(); }

  class iterator {
   public:
    using value_type = Example;
    using difference_type = std::ptrdiff_t;
    iterator(const ExampleSet* s, size_t i) : s_(s), i_(i) {}
    Example operator*() const { return (*s_)[i_]; }
    iterator& operator++() { ++i_; return *this; }
    bool operator!=(const iterator& o) const { return i_ != o.i_; }
    bool operator==(const iterator& o) const { return i_ == o.i_; }
   private:
    const ExampleSet* s_;
    size_t i_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size()}; }

 private:
  std::shared_ptr<const ExampleStore> store_;
  RowPlan plan_;
  std::vector<std::vector<double>> ref_;  // per row, when set
};

}  // namespace qlora
