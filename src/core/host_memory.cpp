#include "core/host_memory.h"

#include <fstream>
#include <string>

namespace qlora {

int64_t available_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

}  // namespace qlora
