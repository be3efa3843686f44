// JSON helpers: located parse errors, typed getters with key names, edit-distance suggestions.
#include "io/json_util.h"

#include <gtest/gtest.h>

#include "tmp_dir.h"

using namespace qlora;
using qlora::test::catch_error;
using qlora::test::TmpDir;
using qlora::test::write_bytes;

TEST(JsonUtil, ParseErrorHasLineAndColumn) {
  // The stray ']' is on line 3, column 8 (counted by hand).
  Error e = catch_error([] { parse_json("{\n  \"a\": 1,\n  \"b\": ]\n}", "cfg.json"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), "cfg.json:3:8");
  EXPECT_NE(e.message().find("invalid JSON"), std::string::npos);
  e = catch_error([] { parse_json("[1, 2", "x.json"); }, ErrorKind::Format);
  EXPECT_EQ(e.where().rfind("x.json:1:", 0), 0u);
}

TEST(JsonUtil, NumberTooLargeForADoubleIsAFormatError) {
  Error e = catch_error([] { parse_json("{\"rope_theta\": -4e44444}", "m/config.json"); }, ErrorKind::Format);
  EXPECT_EQ(e.where(), "m/config.json");
  EXPECT_EQ(e.message(), "invalid JSON: number overflow parsing '-4e44444'");
}

TEST(JsonUtil, ReadFile) {
  TmpDir tmp;
  write_bytes(tmp / "a.json", R"({"n": 3})");
  EXPECT_EQ(read_json_file(tmp / "a.json")["n"], 3);
  Error e = catch_error([&] { read_json_file(tmp / "missing.json"); }, ErrorKind::Io);
  EXPECT_EQ(e.where(), tmp / "missing.json");
}

TEST(JsonUtil, TypedGetters) {
  json j = json::parse(R"({"i": 7, "big": 18446744073709551615, "f": 0.5, "s": "x", "b": true, "n": null, "fi": 3.0})");
  EXPECT_EQ(json_int(j, "i", "c"), 7);
  EXPECT_EQ(json_number(j, "i", "c"), 7.0);  // integers are numbers
  EXPECT_EQ(json_number(j, "f", "c"), 0.5);
  EXPECT_EQ(json_string(j, "s", "c"), "x");
  EXPECT_TRUE(json_bool_or(j, "b", false, "c"));
  EXPECT_EQ(json_int_or(j, "n", 42, "c"), 42);  // null counts as absent
  EXPECT_EQ(json_int_or(j, "absent", 42, "c"), 42);
  EXPECT_EQ(json_find(j, "n"), nullptr);

  Error e = catch_error([&] { json_int(j, "absent", "config.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.where(), "config.json: key 'absent'");
  e = catch_error([&] { json_int(j, "s", "config.json"); }, ErrorKind::Config);
  EXPECT_EQ(e.message(), "expected an integer, got string \"x\"");
  e = catch_error([&] { json_int(j, "f", "c"); }, ErrorKind::Config);
  EXPECT_NE(e.message().find("got number 0.5"), std::string::npos);
  catch_error([&] { json_int(j, "fi", "c"); }, ErrorKind::Config);  // 3.0 is not an integer in JSON terms
  catch_error([&] { json_int(j, "big", "c"); }, ErrorKind::Config);  // does not fit int64
  catch_error([&] { json_string(j, "i", "c"); }, ErrorKind::Config);
  catch_error([&] { json_bool_or(j, "i", false, "c"); }, ErrorKind::Config);
}

TEST(JsonUtil, EditDistanceAndClosest) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
  std::vector<std::string> c = {"learning_rate", "lr_scheduler_type", "warmup_ratio"};
  EXPECT_EQ(closest_name(c, "learning_rat"), "learning_rate");
  EXPECT_EQ(closest_name(c, "warmup_ration"), "warmup_ratio");
  EXPECT_EQ(closest_name(c, "zzzzzzzzzzzzzzzzzzzzzz", 3), "");
  EXPECT_EQ(closest_name({}, "x"), "");
}
