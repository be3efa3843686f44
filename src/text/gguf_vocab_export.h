// A Hugging Face tokenizer written as a GGUF's vocabulary (tokenizer.ggml.* and tokenizer.chat_template),
// as llama.cpp's convert_hf_to_gguf.py writes it: a byte-level BPE vocabulary as llama.cpp's "gpt2"
// one (tokens, token types, merges, the pre-tokenizer's name), a SentencePiece vocabulary carried as
// BPE with byte fallback as its "llama" one (tokens, scores, token types, add_space_prefix).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace qlora {

class GgufWriter;

// Sets the tokenizer keys of `w` from the model directory `dir` (tokenizer.json, tokenizer_config.json,
// config.json for special ids the tokenizer does not name): tokens padded to vocab_size with [PADi]
// (type unused), token types (normal / unknown / control / user-defined / byte), merges or scores,
// special ids, add_bos/add_eos, the chat template, and tokenizer.ggml.pre named after the tokenizer's
// pre-tokenizer. Errors: Unsupported (not a BPE vocabulary, or a pre-tokenizer llama.cpp has no name
// for), Format (a token id past vocab_size), Io / Format (a file that cannot be read or parsed).
// A SentencePiece vocabulary in tokenizers' Metaspace layout adds a note to `notes` (when given) on
// where llama.cpp tokenizes it differently.
void write_gguf_vocab(const std::string& dir, int64_t vocab_size, GgufWriter& w, std::vector<std::string>* notes);

}  // namespace qlora
