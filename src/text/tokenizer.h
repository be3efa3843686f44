// Tokenizer: HF tokenizer.json (BPE) with exact `tokenizers` encode/decode parity, GGUF vocab,
// and a byte-level fallback for models that ship none.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qlora {

class GgufFile;

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one. tokenizer_config.json,
  // special_tokens_map.json and chat_template.jinja next to it are read when present (bos/eos/
  // pad/unk tokens, add_bos_token/add_eos_token, chat_template).
  // Errors: Io (unreadable), Format (bad JSON: path:line:col; bad structure: the JSON path),
  // Unsupported (a component type or model we do not implement, naming its JSON path).
  static Tokenizer from_file(const std::string& path);
  // tokenizer.json text; `name` stands in for the file name in errors. `config_json` is the
  // optional tokenizer_config.json text.
  static Tokenizer from_json(std::string_view tokenizer_json, const std::string& name = "tokenizer.json",
                             std::string_view config_json = {});
  // GPT-2 style BPE from GGUF metadata (tokenizer.ggml.model == "gpt2": tokens, merges,
  // token_type, bos/eos/pad ids, chat_template). Error(Unsupported) for other vocab models.
  static Tokenizer from_gguf(const GgufFile& gguf);
  // tokenizer.json + tokenizer_config.json text that Hugging Face `tokenizers` / transformers
  // load as the tokenizer from_gguf builds (same ids; BOS/EOS added by a TemplateProcessing
  // post-processor when the GGUF's add_bos_token/add_eos_token say so; special tokens and the
  // chat template in the config). What `qlora merge` writes for a GGUF base.
  struct HfFiles {
    std::string tokenizer_json, tokenizer_config_json;
  };
  static HfFiles hf_files_from_gguf(const GgufFile& gguf);
  // ids 0..255 are the bytes, 256 is BOS "<s>", 257 is EOS "</s>"; encode adds BOS when asked.
  static Tokenizer byte_level();

  // Text -> ids as HF `Tokenizer.encode(text, add_special_tokens).ids`. Invalid UTF-8 in `text`
  // is read as U+FFFD per bad sequence (Python's errors="replace"), never an error.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids -> text as HF `Tokenizer.decode(ids, skip_special_tokens)`. Unknown ids are skipped.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // Empties the model's per-word encode cache. Results never depend on it; benchmarks use this
  // to time a cold cache.
  void clear_cache() const;

  // Added tokens first, then the model vocab (HF order). nullopt when the id/token is unknown.
  std::optional<std::string> id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Largest id + 1 over the model vocab and added tokens (the embedding rows a model needs).
  int32_t vocab_size() const;
  bool is_special(int32_t id) const;  // an added token marked special

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  std::optional<int32_t> unk_id() const;
  // From tokenizer_config.json when it says so; the post-processor decides what encode adds.
  std::optional<bool> add_bos_token() const;
  std::optional<bool> add_eos_token() const;
  // Ids encode(text, true) puts around the text (from the post-processor).
  const std::vector<int32_t>& special_prefix() const;
  const std::vector<int32_t>& special_suffix() const;
  const std::string& chat_template() const;  // "" when none
  // tokenizer_config.json "clean_up_tokenization_spaces" (transformers applies it after decode).
  bool clean_up_tokenization_spaces() const;
  // transformers' clean-up: " ." -> ".", " n't" -> "n't", ...
  static std::string clean_up_tokenization(std::string text);

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace qlora
