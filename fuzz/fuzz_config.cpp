// The YAML training config: syntax, every key's type and range, aliases, cross-field checks. A
// config that loads must also survive its own dump: dump_train_config() read back gives the same
// config.
#include "fuzz_common.h"
#include "train/train_config.h"

using namespace qlora;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::expect_clean_error([&] {
    std::vector<std::string> notes;
    TrainConfig cfg = parse_train_config(std::string(fuzz::as_text(data, size)), "fuzz.yaml", {}, &notes, false);
    const std::string dumped = dump_train_config(cfg);
    TrainConfig again = parse_train_config(dumped, "dumped.yaml", {}, nullptr, false);
    if (!(again == cfg)) {
      std::fprintf(stderr, "dump_train_config does not round-trip:\n%s\n", dumped.c_str());
      __builtin_trap();
    }
  });
  return 0;
}
