// qlora entry point: dispatches subcommands; the only place that turns errors into exit codes.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>


#include "cli/commands.h"
#include "backend/cpu/cpu_process.h"
#include "core/error.h"

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"train", qlora::cmd_train, "fine-tune with LoRA/QLoRA: qlora train CONFIG.yaml [key=value ...]"},
    {"plan", qlora::cmd_plan, "memory + speed plan for any model/GPU: qlora plan --model M --gpu G"},
    {"quantize", qlora::cmd_quantize, "pre-quantize a model: qlora quantize --model M --quant nf4 --out DIR"},
    {"merge", qlora::cmd_merge, "fold an adapter into its base, as a HF model dir: qlora merge --model M --adapter A --out DIR"},
    {"eval", qlora::cmd_eval, "eval loss and perplexity, as training measures it: qlora eval CONFIG.yaml [--adapter DIR]"},
    {"plot", qlora::cmd_plot, "loss.svg from a run's metrics.jsonl: qlora plot OUTPUT_DIR [--out FILE]"},
    {"data", qlora::cmd_data, "dataset stats and token/label preview: qlora data CONFIG.yaml [--show N] [--json]"},
    {"generate", qlora::cmd_generate, "greedy answers, with an adapter if given: qlora generate --model M --prompt \"...\""},
    {"bench", qlora::cmd_bench, "synthetic training benchmark of a real model shape: qlora bench --model M [--json]"},
    {"export", qlora::cmd_export, "GGUF for llama.cpp, adapter merged or as a LoRA GGUF: qlora export --format gguf --model M --out F"},
    {"tokenize", qlora::cmd_tokenize, "ids and tokens of a text: qlora tokenize --model M --text \"...\""},
};

void usage(FILE* f) {
  std::fprintf(f, "usage: qlora <command> [args]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-8s %s\n", c.name, c.help);
  std::fprintf(f, "\nqlora <command> --help shows a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // The OpenMP wait policy and the BLAS kernels are read when the libraries load, before main:
  // set them and re-exec once (backend/cpu/cpu_process.h). Measured: `qlora generate` on 2 cores
  // runs 3x slower with spinning OpenMP workers.
  qlora::cpu::reexec_with_runtime_settings(argv);
  // A write past the file size limit (ulimit -f) kills the process with SIGXFSZ by default, halfway
  // through a file; ignored, write() fails with EFBIG and the error path names the file and removes
  // the temporary output, as for a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      return c.fn(argc - 1, argv + 1);
    } catch (const qlora::Error& e) {
      std::fprintf(stderr, "qlora %s: %s\n", c.name, e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "qlora %s: out of host memory\n", c.name);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "qlora %s: unexpected error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "qlora: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
