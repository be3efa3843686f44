// `qlora export --format gguf|gguf-lora --model BASE [--adapter DIR] --out FILE [--outtype T]`: a merged
// GGUF llama.cpp runs, or the adapter alone as a llama.cpp LoRA GGUF (tasks/gguf_export.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "tasks/gguf_export.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace qlora {

int cmd_export(int argc, char** argv) {
  CLI::App app{"Export for llama.cpp.\n"
               "  --format gguf:      base (+ --adapter merged in) as one GGUF with metadata, tokenizer and chat\n"
               "                      template: llama-cli -m FILE\n"
               "  --format gguf-lora: the adapter alone as a llama.cpp LoRA GGUF for a GGUF base:\n"
               "                      llama-cli -m BASE.gguf --lora FILE\n"
               "Example: qlora export --format gguf --model M.gguf --adapter runs/my-run --out my.gguf --outtype q8_0",
               "qlora export"};
  GgufExportOptions o;
  app.add_option("--format", o.format, "gguf | gguf-lora")->capture_default_str();
  app.add_option("--model", o.model, "base model: HF directory, .gguf file or bnb-4bit checkpoint (gguf-lora: a .gguf)")
      ->required();
  app.add_option("--adapter", o.adapter, "PEFT adapter directory (adapter_config.json + adapter_model.safetensors)");
  app.add_option("--out", o.out, "output .gguf file (written to a temporary name, renamed when complete)")->required();
  app.add_option("--outtype", o.outtype,
                 "f32 | f16 | bf16 | q8_0 | q4_0 (default f16; gguf-lora: f32, no q4_0). Norms, biases and rope "
                 "factors stay f32");
  app.add_option("--name", o.name, "general.name in the file (default: the base's name)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const bool tty = isatty(fileno(stderr));
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  size_t last_pct = 0;
  // Ctrl-C / SIGTERM stop at the next tensor; the temporary file is removed on the way out.
  install_stop_signal_handlers();
  auto progress = [&](size_t done, size_t total, const std::string& name, uint64_t bytes, uint64_t total_bytes) {
    if (g_stop_requested) fail(ErrorKind::Io, o.out, "interrupted; nothing was written");
    const double frac = total_bytes ? double(bytes) / double(total_bytes) : 1.0;
    const size_t pct = size_t(frac * 100.0);
    if (!tty && done != total && pct < last_pct + 10) return;
    last_pct = pct;
    const double t = elapsed(), eta = frac > 0 ? t / frac - t : 0;
    std::fprintf(stderr, "%sexport: tensor %zu/%zu %-28s %s / %s (%zu%%) | ETA %s%s", tty ? "\r\033[K" : "", done, total,
                 name.c_str(), format_bytes(double(bytes)).c_str(), format_bytes(double(total_bytes)).c_str(), pct,
                 format_duration(eta).c_str(), tty ? "" : "\n");
    if (tty && done == total) std::fprintf(stderr, "\n");
  };
  std::fprintf(stderr, "export: %s%s -> %s (%s, %s)\n", o.model.c_str(),
               o.adapter.empty() ? "" : (" + adapter " + o.adapter).c_str(), o.out.c_str(), o.format.c_str(),
               (o.outtype.empty() ? default_export_outtype(o.format) : o.outtype).c_str());
  const GgufExportResult r = export_gguf(o, progress);
  for (const auto& n : r.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  std::printf("wrote %s: %s, %zu tensors, outtype %s, in %s\n", r.path.c_str(), format_bytes(double(r.bytes)).c_str(),
              r.n_tensors, r.outtype.c_str(), format_duration(elapsed()).c_str());
  if (o.format == "gguf")
    std::printf("run it with llama.cpp:  llama-cli -m %s\n", r.path.c_str());
  else
    std::printf("run it with llama.cpp:  llama-cli -m %s --lora %s\n", o.model.c_str(), r.path.c_str());
  return 0;
}

}  // namespace qlora
