#include "io/cache_dir.h"

#include <cstdlib>

namespace qlora {

std::filesystem::path user_cache_dir() {
  if (const char* d = std::getenv("QLORA_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::filesystem::path(d) / "qlora";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "qlora";
  return {};
}

}  // namespace qlora
