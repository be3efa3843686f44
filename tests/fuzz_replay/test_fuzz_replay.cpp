// Replays every fuzzer's seeds and kept findings (fuzz/seeds/, fuzz/regressions/) through the fuzz
// targets' own code, built by the project's compiler into this ordinary test: a finding that comes
// back (an exception other than qlora::Error, a trap, or under `make test-sanitize` a sanitizer
// report) fails here without clang or libFuzzer.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define QLORA_FUZZ_TARGET(name) extern "C" int fuzz_##name##_one(const uint8_t* data, size_t size);
QLORA_FUZZ_TARGET(safetensors)
QLORA_FUZZ_TARGET(gguf)
QLORA_FUZZ_TARGET(tokenizer)
QLORA_FUZZ_TARGET(jinja)
QLORA_FUZZ_TARGET(dataset)
QLORA_FUZZ_TARGET(config)
QLORA_FUZZ_TARGET(hf_config)
QLORA_FUZZ_TARGET(bnb)

namespace fs = std::filesystem;

namespace {

using Target = int (*)(const uint8_t*, size_t);

// Runs every file of fuzz/<kind>/<name>/ through `target`; returns how many ran.
int replay(const std::string& kind, const std::string& name, Target target) {
  const fs::path dir = fs::path(QLORA_SOURCE_DIR) / "fuzz" / kind / name;
  if (!fs::is_directory(dir)) return 0;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    SCOPED_TRACE(f.string());
    EXPECT_EQ(target(bytes.data(), bytes.size()), 0);
  }
  return int(files.size());
}

void replay_all(const std::string& name, Target target) {
  EXPECT_GT(replay("seeds", name, target), 0) << "no seeds in fuzz/seeds/" << name;
  replay("regressions", name, target);
}

}  // namespace

TEST(FuzzReplay, Safetensors) { replay_all("safetensors", fuzz_safetensors_one); }
TEST(FuzzReplay, Gguf) { replay_all("gguf", fuzz_gguf_one); }
TEST(FuzzReplay, Tokenizer) { replay_all("tokenizer", fuzz_tokenizer_one); }
TEST(FuzzReplay, Jinja) { replay_all("jinja", fuzz_jinja_one); }
TEST(FuzzReplay, Dataset) { replay_all("dataset", fuzz_dataset_one); }
TEST(FuzzReplay, Config) { replay_all("config", fuzz_config_one); }
TEST(FuzzReplay, HfConfig) { replay_all("hf_config", fuzz_hf_config_one); }
TEST(FuzzReplay, Bnb) { replay_all("bnb", fuzz_bnb_one); }
