// Test helpers for io: a fresh temporary directory per test, file helpers, error capture.
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"

namespace qlora::test {

class TmpDir {
 public:
  TmpDir() {
    std::string t = (std::filesystem::temp_directory_path() / "qlora-io-test-XXXXXX").string();
    path_ = mkdtemp(t.data()) ? t : std::string();
  }
  ~TmpDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs f, expects a qlora::Error of `kind`, returns it (for checks on where/message/hint).
template <class F>
qlora::Error catch_error(F&& f, qlora::ErrorKind kind) {
  try {
    f();
  } catch (const qlora::Error& e) {
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
    return e;
  }
  ADD_FAILURE() << "expected a qlora::Error of kind " << qlora::error_kind_name(kind);
  return qlora::Error(qlora::ErrorKind::Internal, "", "");
}

}  // namespace qlora::test
