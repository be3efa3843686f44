// `qlora data` and `qlora tokenize` end to end: statistics against the fixture reference, the label
// preview, JSON output, and errors that name the row.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

using namespace qlora::cli_test;
using json = nlohmann::json;

namespace {

const std::string kText = std::string(QLORA_FIXTURES) + "/text";
const std::string kSets = kText + "/datasets";

std::string write_config(const std::string& dir, const std::string& body) {
  const std::string path = dir + "/cfg.yaml";
  std::ofstream(path) << "model_name_or_path: " << kText << "/tok/smollm2\n" << body;
  return path;
}

json expected_case(const std::string& name) {
  std::ifstream in(kSets + "/expected.json");
  json e = json::parse(in);
  for (const json& c : e["cases"])
    if (c["name"] == name) return c;
  return json();
}

TEST(DataCli, JsonStatsMatchTheReference) {
  const std::string dir = temp_dir("data_json");
  const std::string cfg = write_config(dir, "train_file: " + kSets + "/text.jsonl\nmax_length: 16\n");
  RunResult r = run_qlora("data " + cfg + " --json");
  ASSERT_EQ(r.code, 0) << r.output;
  json j = json::parse(r.output.substr(r.output.find('{')));
  const json c = expected_case("text");
  // Reference lengths 11, 14, 17: the last is cut to 16 (truncate_right), so it loses one token.
  int64_t tokens = 0, trained = 0;
  for (const json& row : c["rows"]) {
    const int64_t n = std::min<int64_t>(16, int64_t(row["ids"].size()));
    tokens += n;
    trained += n - 1;  // text rows: every token after the first is a target
  }
  EXPECT_EQ(j["rows"], 3);
  EXPECT_EQ(j["examples"], 3);
  EXPECT_EQ(j["tokens"], tokens);
  EXPECT_EQ(j["trained_tokens"], trained);
  EXPECT_EQ(j["truncated"], 1);
  EXPECT_EQ(j["longest"], 16);
  int64_t in_hist = 0;
  for (const json& b : j["histogram"]) in_hist += b["count"].get<int64_t>();
  EXPECT_EQ(in_hist, 3);
  EXPECT_EQ(j["files"][0]["format"], "text");
  // 11 + 14 + 16 tokens need 3 rows of 16 when packed.
  EXPECT_EQ(j["packing"]["rows"], 3);
  std::filesystem::remove_all(dir);
}

TEST(DataCli, ShowMarksTrainedTokens) {
  const std::string dir = temp_dir("data_show");
  const std::string cfg = write_config(dir, "train_file: " + kSets + "/prompt_completion.jsonl\n");
  RunResult r = run_qlora("data " + cfg + " --show 2");
  ASSERT_EQ(r.code, 0) << r.output;
  // Not a TTY: brackets, not colours.
  EXPECT_NE(r.output.find("The sky is[[ blue.<|im_end|>]]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Q: What is 2+2?\nA:[[ 4<|im_end|>]]"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\x1b["), std::string::npos);
  EXPECT_NE(r.output.find("length histogram"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(DataCli, BadRowsStopWithTheirLocationOrAreCounted) {
  const std::string dir = temp_dir("data_bad");
  const std::string data = dir + "/d.jsonl";
  std::ofstream(data) << "{\"text\": \"fine\"}\n{\"text\": \"broken\"\n{\"text\": \"also fine\"}\n";
  RunResult r = run_qlora("data " + write_config(dir, "train_file: " + data + "\n"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find(data + ":2:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("malformed JSON"), std::string::npos) << r.output;
  RunResult s = run_qlora("data " + write_config(dir, "train_file: " + data + "\n") + " skip_bad_rows=true --json");
  ASSERT_EQ(s.code, 0) << s.output;
  json j = json::parse(s.output.substr(s.output.find('{')));
  EXPECT_EQ(j["bad_rows"], 1);
  EXPECT_EQ(j["examples"], 2);
  std::filesystem::remove_all(dir);
}

TEST(TokenizeCli, IdsMatchTheReference) {
  const json c = expected_case("text");
  std::vector<int32_t> ref = c["rows"][0]["ids"].get<std::vector<int32_t>>();
  ref.pop_back();  // the data layer's EOS
  RunResult r = run_qlora("tokenize --model " + kText + "/tok/smollm2 --text \"The quick brown fox jumps over the lazy dog.\" --json");
  ASSERT_EQ(r.code, 0) << r.output;
  json j = json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), ref);
  EXPECT_EQ(j["count"], ref.size());
  EXPECT_EQ(j["tokens"][1], "Ġquick");
  EXPECT_EQ(j["pieces"][1], " quick");
  RunResult plain = run_qlora("tokenize --model " + kText + "/tok/smollm2 --text \"<|im_end|>\"");
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_NE(plain.output.find("1 tokens"), std::string::npos) << plain.output;
  EXPECT_NE(plain.output.find("ids: 2"), std::string::npos) << plain.output;
  RunResult missing = run_qlora("tokenize --model /nonexistent --text hi");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("/nonexistent"), std::string::npos);
}

}  // namespace
