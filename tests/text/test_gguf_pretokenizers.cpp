// The one table of llama.cpp's pre-tokenizer names (text/gguf_pretokenizers.h): every name and alias
// import reads maps to a pipeline, and export names each written pipeline back by the same row.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "text/gguf_pretokenizers.h"

namespace qlora {
namespace {

TEST(GgufPreTokenizers, ExportNamesEachPipelineByItsRow) {
  std::set<std::string> names;
  for (const GgufPreTokenizer& p : gguf_pre_tokenizers()) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name << " twice";
    for (const char* a : p.aliases) EXPECT_TRUE(names.insert(a).second) << a << " twice";
    const std::string back = gguf_pre_tokenizer_name(pre_tokenizer_json(p), "tokenizer.json");
    if (p.written) EXPECT_EQ(back, p.name);
    else EXPECT_NE(back, p.name);  // a read-only name: its split is written under another row's name
  }
  // dbrx is Llama 3's split merging by rank; export writes that split as llama-bpe.
  EXPECT_EQ(gguf_pre_tokenizer_name(pre_tokenizer_json(*gguf_pre_tokenizer_named("dbrx")), "t"), "llama-bpe");
  EXPECT_FALSE(gguf_pre_tokenizer_named("dbrx")->ignore_merges);
  EXPECT_TRUE(gguf_pre_tokenizer_named("llama-bpe")->ignore_merges);
}

TEST(GgufPreTokenizers, AliasesReadAsTheirRow) {
  EXPECT_STREQ(gguf_pre_tokenizer_named("default")->name, "gpt-2");
  EXPECT_STREQ(gguf_pre_tokenizer_named("starcoder")->name, "smollm");
  EXPECT_STREQ(gguf_pre_tokenizer_named("llama3")->name, "llama-bpe");
  EXPECT_STREQ(gguf_pre_tokenizer_named("deepseek-r1-qwen")->name, "qwen2");
  EXPECT_STREQ(gguf_pre_tokenizer_named("llama4")->name, "gpt-4o");
  EXPECT_EQ(gguf_pre_tokenizer_named("bloom"), nullptr);
  EXPECT_NE(known_gguf_pre_tokenizers().find("tekken"), std::string::npos);
}

TEST(GgufPreTokenizers, APipelineWithoutANameIsRefusedNamingTheFile) {
  const nlohmann::json whitespace = {{"type", "Whitespace"}};
  try {
    gguf_pre_tokenizer_name(whitespace, "model/tokenizer.json");
    FAIL() << "a pre-tokenizer llama.cpp has no name for must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_EQ(e.where(), "model/tokenizer.json: pre_tokenizer");
  }
}

}  // namespace
}  // namespace qlora
