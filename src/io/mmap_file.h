// MappedFile: read-only memory map of a whole file, unmapped when the object dies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace qlora {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only; Error(Io, path) when it cannot be opened, is not a regular file, or mmap fails.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the mapping's resident pages from this process (madvise MADV_DONTNEED); the mapping stays
  // valid and a later read faults the pages in again from the file.
  void release_pages() const noexcept;
  // The same for the pages holding bytes [p, p + n) of the mapping (rounded out to whole pages, so
  // a neighbour's edge page may go too and be faulted in again); no-op outside the mapping.
  void release_pages(const void* p, size_t n) const noexcept;

 private:
  void release() noexcept;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace qlora
