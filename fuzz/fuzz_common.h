// Shared by the libFuzzer targets: what counts as a finding and how bytes become a file.
//
// A reader may reject any input, but only with qlora::Error (a message naming the file and the
// position). Any other exception escaping a reader (std::out_of_range, a raw nlohmann::json error,
// std::bad_alloc from a length taken on trust) is a finding: it is left uncaught, so libFuzzer
// reports it as a crash with the input that caused it. So are sanitizer reports, leaks and hangs.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/error.h"

namespace qlora::fuzz {

// Runs f; a qlora::Error is the expected way to reject bad input.
template <class F>
void expect_clean_error(F&& f) {
  try {
    f();
  } catch (const qlora::Error& e) {
    // Every rejection must say where: an empty "where" would leave the user guessing.
    if (e.where().empty()) {
      std::fprintf(stderr, "qlora::Error without a location: %s\n", e.what());
      __builtin_trap();
    }
  }
}

// The input as a file of its own (the mmap-based readers take paths): on /dev/shm when it exists,
// one file per process, rewritten for every input.
inline std::string write_input(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  const std::string path = dir + "/qlora-fuzz-" + std::to_string(getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace qlora::fuzz
