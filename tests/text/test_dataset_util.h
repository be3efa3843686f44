// Helpers for dataset tests: fixture paths, temp files, and hand-written stand-ins for the two chat
// templates the fixtures use (SmolLM2's ChatML and a template without special tokens), so the
// masking logic is tested independently of the Jinja engine.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace qlora::dataset_test {

// A chat template as the data pipeline calls it (text and {% generation %} spans).
inline ChatRenderFn render_with(std::shared_ptr<const ChatTemplate> t) {
  return [t](const RowJson& m, bool g, const RowJson& e) { return t->render_with_spans(m, g, e); };
}

inline std::string fixtures() { return std::string(QLORA_FIXTURES) + "/text"; }
inline std::string datasets() { return fixtures() + "/datasets"; }

inline const Tokenizer& smollm2() {
  static const Tokenizer tok = Tokenizer::from_file(fixtures() + "/tok/smollm2");
  return tok;
}

inline std::string temp_file(const std::string& name, const std::string& content) {
  auto dir = std::filesystem::temp_directory_path() / ("qlora_dataset_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// SmolLM2-135M-Instruct's template, written out by hand (tokenizer_config.json has the Jinja).
inline std::string smollm2_chatml(const RowJson& msgs, bool gen, const RowJson&) {
  std::string s;
  for (size_t i = 0; i < msgs.size(); i++) {
    if (i == 0 && msgs[0]["role"] != "system")
      s += "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";
    s += "<|im_start|>" + msgs[i]["role"].get<std::string>() + "\n" + msgs[i]["content"].get<std::string>() +
         "<|im_end|>\n";
  }
  if (gen) s += "<|im_start|>assistant\n";
  return s;
}

// tools/make_dataset_fixtures.py PLAIN_TEMPLATE by hand: no special tokens anywhere.
inline std::string plain_template(const RowJson& msgs, bool gen, const RowJson&) {
  std::string s;
  for (const auto& m : msgs) {
    const std::string role = m["role"], content = m["content"];
    if (role == "user") s += "User:\n" + content + "\n";
    else if (role == "assistant") s += "Bot:\n" + content + "\n\n";
    else s += role + ":\n" + content + "\n";
  }
  if (gen) s += "Bot:\n";
  return s;
}

// Like Mistral's template: roles must alternate user/assistant, else raise_exception.
inline std::string strict_template(const RowJson& msgs, bool gen, const RowJson& extra) {
  for (size_t i = 0; i < msgs.size(); i++)
    if ((msgs[i]["role"] == "user") != (i % 2 == 0))
      fail(ErrorKind::Format, "chat template", "Conversation roles must alternate user/assistant/user/assistant/...");
  return plain_template(msgs, gen, extra);
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline Error expect_error(const std::function<void()>& f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
    return e;
  }
  ADD_FAILURE() << "no error thrown";
  return Error(ErrorKind::Internal, "", "");
}

}  // namespace qlora::dataset_test
