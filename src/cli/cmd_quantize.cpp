// `qlora quantize --model IN --quant FMT --out DIR`: writes a pre-quantized checkpoint. nf4/fp4 use
// the bitsandbytes-4bit layout transformers loads unchanged; other formats the layout documented in
// model/bnb_checkpoint.h. Prints size and error per layer, and perplexity before/after on request.
#include <CLI/CLI.hpp>

#include "cli/backend_select.h"
#include "cli/commands.h"
#include "tasks/quantize_model.h"

namespace qlora {

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Quantize a model's frozen projections into a pre-quantized checkpoint.\n"
               "nf4/fp4: the bitsandbytes-4bit layout (transformers + bitsandbytes load it unchanged);\n"
               "nvfp4/mxfp4/fp8: qlora.cpp's layout (see model/bnb_checkpoint.h). Embeddings, norms and\n"
               "lm_head stay unquantized. Example: qlora quantize --model M --quant nf4 --double-quant --out M-nf4",
               "qlora quantize"};
  QuantizeOptions o;
  app.add_option("--model", o.model, "Hugging Face model directory or .gguf file")->required();
  app.add_option("--quant", o.quant, "nf4 | fp4 | nvfp4 | mxfp4 | fp8")->required();
  app.add_option("--out", o.out, "output directory (written atomically; replaced if it exists)")->required();
  app.add_flag("--double-quant", o.double_quant, "nf4/fp4: quantize the block scales too (QLoRA's double quant)");
  app.add_option("--blocksize", o.blocksize, "nf4/fp4 block size: 32..4096, power of two (default 64)");
  app.add_option("--dtype", o.dtype, "dtype of the unquantized tensors: auto (as the source) | float32 | bfloat16 | float16")
      ->capture_default_str();
  app.add_option("--eval-text", o.eval_text, "text file: print perplexity before and after quantization (CPU)");
  app.add_option("--eval-seq-len", o.eval_seq_len, "tokens per evaluation row")->capture_default_str();
  app.add_option("--eval-max-tokens", o.eval_max_tokens, "evaluate at most this many tokens of the text")->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads (0 = all)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  quantize_model(o, [&] { return select_backend("cpu", o.threads); });
  return 0;
}

}  // namespace qlora
