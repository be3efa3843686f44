// The YAML config must be UTF-8: other bytes are rejected at their line and column instead of
// flowing into paths and names (a fuzzer finding: such a config loaded, but its dump did not read back).
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/train_config.h"

using namespace qlora;

TEST(TrainConfigEncoding, InvalidUtf8NamesLineAndColumn) {
  const std::string yaml = "learning_rate: 2e-4\neval_file: data/ev\x8b.jsonl\n";
  try {
    parse_train_config(yaml, "run.yaml", {}, nullptr, false);
    FAIL() << "invalid UTF-8 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_EQ(e.where(), "run.yaml:2:19");
    EXPECT_NE(e.message().find("invalid UTF-8 (byte 0x8b)"), std::string::npos) << e.message();
  }
}

TEST(TrainConfigEncoding, Utf8PathsLoadAndRoundTrip) {
  const std::string yaml = "eval_file: \"donn\xc3\xa9\x65s/\xe8\xa9\x95\xe4\xbe\xa1.jsonl\"\n";
  TrainConfig c = parse_train_config(yaml, "run.yaml", {}, nullptr, false);
  EXPECT_EQ(c.eval_file, "donn\xc3\xa9\x65s/\xe8\xa9\x95\xe4\xbe\xa1.jsonl");
  EXPECT_EQ(parse_train_config(dump_train_config(c), "dump.yaml", {}, nullptr, false), c);
}
