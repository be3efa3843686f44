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

// A raw control character (here \x01 then a NUL inside a path, a fuzzer finding) is an error at its
// line and column; YAML allows only printable characters, tab, LF and CR.
TEST(TrainConfigEncoding, ControlCharacterNamesLineAndColumn) {
  const std::string yaml = std::string("seed: 1\nmodel_name_or_path: m.\x01") + std::string(1, '\0') + "_1.gguf\n";
  try {
    parse_train_config(yaml, "run.yaml", {}, nullptr, false);
    FAIL() << "a control character was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_EQ(e.where(), "run.yaml:2:23");
    EXPECT_NE(e.message().find("a control character, which YAML does not allow (byte 0x01)"), std::string::npos)
        << e.message();
  }
  // Tabs and CRLF line ends stay accepted.
  EXPECT_EQ(parse_train_config("seed: 7\r\noutput_dir:\tout\r\n", "run.yaml", {}, nullptr, false).seed, 7);
}

// A NUL written as a double-quoted escape is a value like any other: the dump keeps it and reads back.
TEST(TrainConfigEncoding, EscapedNulRoundTrips) {
  TrainConfig c = parse_train_config("eval_file: \"a\\0b.jsonl\"\n", "run.yaml", {}, nullptr, false);
  ASSERT_EQ(c.eval_file, std::string("a\0b.jsonl", 9));
  EXPECT_EQ(parse_train_config(dump_train_config(c), "dump.yaml", {}, nullptr, false), c);
}
