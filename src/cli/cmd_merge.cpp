// `qlora merge --model BASE --adapter DIR --out DIR`: the base with a PEFT adapter folded in, written
// as a Hugging Face model directory (config.json, generation_config.json, tokenizer files,
// safetensors sharded past --max-shard-size with transformers' index). The merge runs on the
// dequantized base in fp32 (model/merge.h) and is cast to --dtype; a quantized base is never
// re-quantized. Tensor by tensor: each shard's header is known from the config before any data, so
// every merged tensor is appended to its file as soon as it exists and memory stays near one tensor.
// The directory is built under a temporary name and renamed: it appears complete or not at all.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "tasks/merge_model.h"
#include "train/trainer.h"

namespace qlora {

int cmd_merge(int argc, char** argv) {
  CLI::App app{"Fold a PEFT LoRA adapter into its base model and write a Hugging Face model directory\n"
               "(config.json, generation_config.json, tokenizer files, safetensors; sharded with\n"
               "model.safetensors.index.json past --max-shard-size) that transformers loads.\n"
               "The merge is computed on the dequantized base in fp32, then cast to --dtype. A quantized\n"
               "base (bnb NF4/FP4, qlora quantize output, quantized GGUF) is written dequantized, not\n"
               "re-quantized. Example: qlora merge --model M --adapter runs/x --out M-merged",
               "qlora merge"};
  MergeOptions o;
  app.add_option("--model", o.model, "base: Hugging Face model directory, bnb-4bit checkpoint or .gguf file")->required();
  app.add_option("--adapter", o.adapter, "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)")
      ->required();
  app.add_option("--out", o.out, "output directory (built under a temporary name, then renamed)")->required();
  app.add_option("--dtype", o.dtype,
                 "bf16 | fp16 | fp32 (default: the base's float dtype; bf16 for a quantized base)");
  app.add_option("--max-shard-size", o.max_shard_size, "largest safetensors file before sharding (5GB, 500MB, 2GiB)")
      ->capture_default_str();
  app.add_flag("--force", o.force, "replace --out when it exists and is not empty (its files are deleted)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Ctrl-C / SIGTERM stop at the next tensor, so the temporary output is removed on the way out.
  install_stop_signal_handlers();
  merge_model(o);
  return 0;
}

}  // namespace qlora
