// The emulated GPU architecture for one scope: the harness reads QLORA_CUDA_EMU_ARCH on every call.
#pragma once
#include <cstdlib>
#include <string>

namespace qlora::emu_test {

struct ArchScope {
  std::string old;
  bool had = false;
  explicit ArchScope(const char* a) {
    if (const char* e = std::getenv("QLORA_CUDA_EMU_ARCH")) had = true, old = e;
    setenv("QLORA_CUDA_EMU_ARCH", a, 1);
  }
  ~ArchScope() { had ? (void)setenv("QLORA_CUDA_EMU_ARCH", old.c_str(), 1) : (void)unsetenv("QLORA_CUDA_EMU_ARCH"); }
  ArchScope(const ArchScope&) = delete;
  ArchScope& operator=(const ArchScope&) = delete;
};

}  // namespace qlora::emu_test
