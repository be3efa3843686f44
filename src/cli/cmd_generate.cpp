// `qlora generate --model M [--adapter DIR] --prompt TEXT`: greedy answers from a model, optionally
// with a trained PEFT adapter, through the training forward with a KV cache (CPU or CUDA).
#include <CLI/CLI.hpp>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "core/error.h"
#include "io/json_util.h"
#include "tasks/generate_answers.h"

namespace qlora {

int cmd_generate(int argc, char** argv) {
  CLI::App app{"Answer prompts greedily with a model and, optionally, a trained LoRA adapter.\n"
               "Prompts are user messages rendered with the model's chat template when it has one.\n"
               "Example: qlora generate --model M.gguf --adapter runs/my-run --prompt \"What is a fjord?\"",
               "qlora generate"};
  GenerateOptions o;
  app.add_option("--model", o.model, "Hugging Face model directory or .gguf file")->required();
  app.add_option("--adapter", o.adapter, "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)");
  auto* prompt = app.add_option("--prompt", o.prompts, "prompt text (repeat for several prompts)");
  auto* file = app.add_option("--file", o.file, "read one prompt from a file (its whole text)");
  prompt->excludes(file);
  auto* chat = app.add_flag("--chat", o.chat, "render the prompt as a user turn with the chat template (default when there is one)");
  auto* raw = app.add_flag("--raw", o.raw, "feed the prompt text as it is, without a chat template");
  chat->excludes(raw);
  app.add_option("--chat-template", o.chat_template,
                 "chat template when the model has none: chatml, llama3, mistral, alpaca, gemma, a .jinja file or Jinja text");
  app.add_option("--max-new-tokens", o.max_new_tokens, "most tokens per answer (stops earlier at EOS / end of turn)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--base-precision", o.base_precision, "store the base as fp32 | bf16 | nf4 | fp4 | nvfp4 | mxfp4 | fp8 "
                                                       "(default: as the checkpoint stores it)")
      ->check(CLI::IsMember({"fp32", "bf16", "nf4", "fp4", "nvfp4", "mxfp4", "fp8"}));
  app.add_option("--device", o.device, "cpu | cuda | auto (cuda when built in and a GPU is present)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--threads", o.threads, "CPU threads (0 = all)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!o.file.empty()) o.prompts = {read_text_file(o.file)};
  if (o.prompts.empty()) fail(ErrorKind::Config, "--prompt", "no prompt given", "pass --prompt TEXT or --file F");
  for (const std::string& p : o.prompts)
    if (p.empty()) fail(ErrorKind::Config, o.file.empty() ? "--prompt" : o.file, "the prompt is empty");

  generate_answers(o, [&] { return select_backend(o.device, o.threads); });
  return 0;
}

}  // namespace qlora
