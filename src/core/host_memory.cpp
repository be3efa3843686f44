#include "core/host_memory.h"

#include <fstream>
#include <string>

namespace qlora {

namespace {

// The value of `key` (in kB) in a /proc file of "Key: value kB" lines, in bytes; 0 when absent.
int64_t proc_kib(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size(), key) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return 0;
}

}  // namespace

int64_t available_host_bytes() { return proc_kib("/proc/meminfo", "MemAvailable:"); }

int64_t resident_host_bytes() { return proc_kib("/proc/self/status", "VmRSS:"); }

}  // namespace qlora
