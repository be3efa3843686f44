// `qlora generate` on the tiny byte-level fixture model: answers with and without an adapter, and
// clear errors for a missing model, an adapter made for another model and --chat without a template.
#include <gtest/gtest.h>

#include "cli_util.h"
#include "core/rng.h"
#include "model/peft_io.h"
#include "train/model_source.h"

using namespace qlora;
using namespace qlora::cli_test;

namespace {

const std::string kModel = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/models/tiny_byte";

// The text after "  answer: " (first line).
std::string answer_of(const std::string& out) {
  const size_t at = out.find("  answer: ");
  if (at == std::string::npos) return "";
  const size_t b = at + 10;
  return out.substr(b, out.find('\n', b) - b);
}

// A PEFT adapter for tiny_byte with random (non-zero) B, written as training would write it.
std::string make_adapter(const std::string& dir) {
  auto be = make_cpu_backend();
  ModelSource src = open_model_source(kModel);
  LoraSpec lora;
  lora.r = 4;
  lora.alpha = 8;
  lora.targets = LoraSpec::resolve_targets({"q_proj", "v_proj", "down_proj"});
  ModelPlanOptions po;
  po.micro_batch = 1;
  po.seq_len = 1;
  DecoderModel m(src.config, *be, po, lora);
  m.load_base(src.tensors);
  m.init_trainable(3);
  Rng rng(5);
  for (auto& p : m.trainable_params()) {
    if (p.name.find("lora_B") == std::string::npos) continue;
    std::vector<float> h(size_t(p.w.numel()));
    for (float& x : h) x = rng.uniform(-0.5f, 0.5f);
    be->copy_to_device(p.w.data, h.data(), h.size() * 4);
  }
  write_peft_adapter(dir, m, kModel);
  return dir;
}

}  // namespace

TEST(GenerateCli, AnswersAPromptWithAndWithoutAnAdapter) {
  RunResult base = run_qlora("generate --model " + kModel + " --prompt 'The ocean' --max-new-tokens 12");
  ASSERT_EQ(base.code, 0) << base.output;
  EXPECT_NE(base.output.find("  prompt: The ocean"), std::string::npos) << base.output;
  EXPECT_NE(base.output.find("raw prompt (no chat template)"), std::string::npos) << base.output;
  EXPECT_NE(base.output.find("backend cpu"), std::string::npos) << base.output;
  EXPECT_NE(base.output.find("1 prompts, 12 new tokens"), std::string::npos) << base.output;
  EXPECT_FALSE(answer_of(base.output).empty()) << base.output;

  const std::string adapter = make_adapter(temp_dir("gen_adapter"));
  RunResult tuned = run_qlora("generate --model " + kModel + " --adapter " + adapter +
                              " --prompt 'The ocean' --max-new-tokens 12 --base-precision nf4");
  ASSERT_EQ(tuned.code, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("+ adapter"), std::string::npos) << tuned.output;
  EXPECT_NE(answer_of(tuned.output), answer_of(base.output)) << "the adapter should change the answer";

  // A model without a template can be given one.
  RunResult chat = run_qlora("generate --model " + kModel + " --chat-template chatml --prompt 'The ocean' --max-new-tokens 4");
  ASSERT_EQ(chat.code, 0) << chat.output;
  EXPECT_NE(chat.output.find("chat template: built-in chatml"), std::string::npos) << chat.output;
}

TEST(GenerateCli, BadInputIsAClearError) {
  RunResult r = run_qlora("generate --model /nonexistent/model --prompt hi");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("qlora generate: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model path does not exist"), std::string::npos) << r.output;

  // An adapter trained for another model (llama_gqa: hidden size 64, tiny_byte: 128).
  const std::string other = std::string(QLORA_SOURCE_DIR) + "/tests/fixtures/parity/llama_gqa_adapter";
  r = run_qlora("generate --model " + kModel + " --adapter " + other + " --prompt hi");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("the adapter does not fit model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("has shape"), std::string::npos) << r.output;

  r = run_qlora("generate --model " + kModel + " --adapter /nonexistent/adapter --prompt hi");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("adapter directory does not exist"), std::string::npos) << r.output;

  r = run_qlora("generate --model " + kModel + " --chat --prompt hi");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("no chat template"), std::string::npos) << r.output;
}
