// `qlora train CONFIG.yaml [key=value ...]`: fine-tune and write a PEFT adapter.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace qlora {

int cmd_train(int argc, char** argv) {
  CLI::App app{"Fine-tune a Llama-family model with LoRA/QLoRA.\n"
               "Keys use Hugging Face TrainingArguments/PEFT names; axolotl, LLaMA-Factory and torchtune\n"
               "aliases are accepted and reported. Example: qlora train examples/tiny.yaml max_steps=20",
               "qlora train"};
  std::string config;
  std::vector<std::string> overrides;
  bool help_config = false;
  app.add_option("config", config, "YAML config file");
  app.add_option("overrides", overrides, "key=value overrides, applied after the file");
  app.add_flag("--help-config", help_config, "print every config key with its default and aliases");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (help_config) {
    std::printf("%s", config_reference_markdown().c_str());
    return 0;
  }
  if (config.empty()) {
    std::fprintf(stderr, "%s", app.help().c_str());
    return 2;
  }
  std::vector<std::string> notes;
  TrainConfig cfg = load_train_config(config, overrides, &notes);
  for (const auto& n : notes) std::fprintf(stderr, "config: %s\n", n.c_str());
  auto be = select_backend(cfg.device, int(cfg.threads));
  Trainer trainer(cfg, *be);
  TrainSummary s = trainer.run();
  return s.interrupted ? 130 : 0;
}

}  // namespace qlora
