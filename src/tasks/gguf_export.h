// `qlora export`: a base model with an optional PEFT adapter merged, written as a GGUF that llama.cpp
// loads (metadata, tokenizer and tensors as convert_hf_to_gguf.py writes them), or the adapter alone
// in llama.cpp's LoRA-adapter GGUF layout (as convert_lora_to_gguf.py writes it).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace qlora {

class GgufWriter;

struct GgufExportOptions {
  std::string format = "gguf";  // gguf | gguf-lora
  std::string model;            // HF directory, GGUF file or bnb-4bit checkpoint (gguf-lora: a GGUF file)
  std::string adapter;          // PEFT adapter directory; "" for the base alone (required for gguf-lora)
  std::string out;
  std::string outtype;          // f32 | f16 | bf16 | q8_0 | q4_0 (gguf-lora: not q4_0); "" = default
  std::string name;             // general.name; "" = the base's name
};

struct GgufExportResult {
  std::string path;
  uint64_t bytes = 0;
  std::string outtype;
  size_t n_tensors = 0;
  std::vector<std::string> notes;  // tensors kept in another type than the outtype asks, and why
};

// Called after each tensor: tensors done / total, its name, bytes written so far / file size.
using GgufExportProgress = std::function<void(size_t done, size_t total, const std::string& tensor, uint64_t bytes_done,
                                              uint64_t bytes_total)>;

// "f16" for gguf, "f32" for gguf-lora (the converters' defaults).
std::string default_export_outtype(const std::string& format);

// Writes opt.out atomically (temporary file, renamed when complete). Errors: Config (bad format /
// outtype / missing --adapter, a non-GGUF base for gguf-lora), Io (unreadable input, disk full: the
// temporary file is removed), Shape/Format (an adapter that does not fit the base, missing tensors),
// Unsupported (a tokenizer llama.cpp cannot be told about).
GgufExportResult export_gguf(const GgufExportOptions& opt, const GgufExportProgress& progress = {});

// tokenizer.ggml.* and tokenizer.chat_template from a Hugging Face model directory (tokenizer.json,
// tokenizer_config.json), as convert_hf_to_gguf.py writes them for a BPE vocabulary: tokens padded
// to vocab_size with [PADi] (type unused), token types (normal / control / user-defined), merges,
// special ids, add_bos/add_eos, the chat template, and tokenizer.ggml.pre named after the
// tokenizer's pre-tokenizer (gpt-2, smollm, llama-bpe, qwen2; Error(Unsupported) for others).
// A SentencePiece vocabulary in tokenizers' Metaspace layout adds a note to `notes` on where
// llama.cpp tokenizes it differently.
void hf_tokenizer_gguf_metadata(const std::string& dir, int64_t vocab_size, GgufWriter& w,
                                std::vector<std::string>* notes = nullptr);

}  // namespace qlora
