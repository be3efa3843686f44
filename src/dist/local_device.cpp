// GPU choice per local rank through CUDA_VISIBLE_DEVICES (read by the CUDA runtime when it starts).
#include "dist/local_device.h"

#include <cstdlib>
#include <vector>

namespace qlora {

std::string bind_local_gpu(int local_rank, int local_size) {
  if (local_size <= 1) return "";
  const char* cur = std::getenv("CUDA_VISIBLE_DEVICES");
  std::string pick;
  if (!cur) {
    pick = std::to_string(local_rank);
  } else {
    std::vector<std::string> list;
    std::string item;
    for (const char* p = cur;; p++) {
      if (*p == ',' || *p == '\0') {
        if (!item.empty()) list.push_back(item);
        item.clear();
        if (*p == '\0') break;
      } else if (*p != ' ') {
        item += *p;
      }
    }
    if (list.size() <= 1) return "";  // none visible, or already one device for this rank
    pick = list[size_t(local_rank) % list.size()];
  }
  setenv("CUDA_VISIBLE_DEVICES", pick.c_str(), 1);
  return pick;
}

}  // namespace qlora
