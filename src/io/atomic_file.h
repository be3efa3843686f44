// Crash-safe output: whole files and whole directories appear under their final name complete or not at all.
#pragma once
#include <string>
#include <string_view>

namespace qlora {

// Writes `bytes` to "<path>.tmp-XXXXXX" in the same directory, fsyncs it, renames it over `path`
// and fsyncs the directory. A new file gets mode 0666 & ~umask; a replaced file keeps its mode.
// Errors are Error(Io, path) with the errno text; the temp file is removed on failure.
void write_file_atomic(const std::string& path, std::string_view bytes);

// The streaming form of write_file_atomic, for outputs too large to hold in memory at once
// (merged models): append() any number of times, then commit(). Destroyed without commit(), the
// temporary file is deleted and `path` is left untouched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void append(std::string_view bytes);
  void append(const void* data, size_t n) { append(std::string_view(static_cast<const char*>(data), n)); }
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

 private:
  std::string path_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// A directory built under a temporary name next to its final place:
//   AtomicDir d("out/checkpoint-100");   // creates "out/checkpoint-100.tmp-XXXXXX"
//   d.write("adapter_config.json", text);
//   d.commit();                          // now "out/checkpoint-100" holds exactly these files
// commit() replaces an existing directory: on Linux by an atomic exchange, so readers see either the old
// or the new directory, never neither. Without commit() the destructor deletes the temporary directory.
class AtomicDir {
 public:
  explicit AtomicDir(std::string final_path);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::string& temp_path() const { return temp_; }
  const std::string& final_path() const { return final_; }
  // temp_path() + "/" + name: where to write a file that should end up in the final directory.
  std::string path(const std::string& name) const;
  // Writes (and fsyncs) a file inside the temporary directory; `name` may contain sub-directories.
  void write(const std::string& name, std::string_view bytes) const;
  void commit();
  bool committed() const { return committed_; }

 private:
  std::string final_, temp_;
  bool committed_ = false;
};

}  // namespace qlora
