// `qlora train` with gradient_checkpointing: offload on the CPU: the trainer's whole run (data,
// steps, eval, checkpoint, adapter) gives the same metrics and a byte-identical adapter as full
// checkpointing, since the offload copies are memcpy on the CPU and the arithmetic is the same.
#include <gtest/gtest.h>

#include "cli_util.h"

using namespace qlora::cli_test;

TEST(TrainCliOffload, OffloadTrainsExactlyAsFullCheckpointing) {
  std::string out[2];
  const char* ckpt[2] = {"full", "offload"};
  for (int i = 0; i < 2; i++) {
    out[i] = temp_dir(std::string("train_offload_") + ckpt[i]);
    const RunResult r = run_qlora("train " + std::string(QLORA_SOURCE_DIR) + "/examples/tiny.yaml output_dir=" + out[i] +
                                  " max_steps=6 logging_steps=1 eval_steps=3 threads=1 device=cpu gradient_checkpointing=" + ckpt[i]);
    ASSERT_EQ(r.code, 0) << r.output;
  }
  // Per-step lines equal except the measured speed and step time.
  auto strip_speed = [](std::string s) {
    for (const char* key : {"\"tokens_per_second\":", "\"step_seconds\":"}) {
      std::string o;
      for (size_t at = 0;;) {
        const size_t t = s.find(key, at);
        if (t == std::string::npos) {
          s = o + s.substr(at);
          break;
        }
        o += s.substr(at, t - at);
        at = s.find_first_of(",}", t);
      }
    }
    return s;
  };
  const std::string a = read_file(out[0] + "/metrics.jsonl"), b = read_file(out[1] + "/metrics.jsonl");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(strip_speed(a), strip_speed(b));
  const std::string wa = read_file(out[0] + "/adapter_model.safetensors"), wb = read_file(out[1] + "/adapter_model.safetensors");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "the adapters differ";
}
