// Jinja value and Python-string helpers against hand-checked Python facts (repr, json.dumps, str methods).
#include <gtest/gtest.h>

#include "text/jinja_pystr.h"
#include "text/jinja_value.h"

namespace qlora::jinja {
namespace {

TEST(JinjaValues, FloatReprFollowsPython) {
  // Python: repr(0.1), repr(1e16), repr(1e15), repr(123.0), repr(1e-5), repr(0.0001), repr(5e-324), repr(-2.5)
  EXPECT_EQ(py_float_repr(0.1), "0.1");
  EXPECT_EQ(py_float_repr(1e16), "1e+16");
  EXPECT_EQ(py_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(py_float_repr(123.0), "123.0");
  EXPECT_EQ(py_float_repr(1e-5), "1e-05");
  EXPECT_EQ(py_float_repr(0.0001), "0.0001");
  EXPECT_EQ(py_float_repr(5e-324), "5e-324");
  EXPECT_EQ(py_float_repr(-2.5), "-2.5");
  EXPECT_EQ(py_float_repr(1.0 / 3.0), "0.3333333333333333");
}

TEST(JinjaValues, PrintingAndEquality) {
  Value l = Value::list({Value(1), Value("it's"), Value::none(), Value(true)});
  EXPECT_EQ(l.to_str(), "[1, \"it's\", None, True]");
  EXPECT_EQ(Value::list({Value(1)}, true).to_str(), "(1,)");
  EXPECT_EQ(Value().to_str(), "");  // Undefined prints nothing
  EXPECT_FALSE(Value().truthy());
  EXPECT_TRUE(values_equal(Value(1), Value(1.0)));
  EXPECT_TRUE(values_equal(Value(true), Value(1)));
  EXPECT_FALSE(values_equal(Value::list({Value(1)}, true), Value::list({Value(1)})));  // (1,) != [1]
  EXPECT_TRUE(Value::sequence({}, Value::Seq::Generator).truthy());  // a generator is always true
  EXPECT_THROW(values_less(Value(1), Value("a")), TemplateError);
}

TEST(JinjaValues, JsonDumpsSettings) {
  Dict d;
  d.set("b", Value::list({Value(1), Value(2.5)}));
  d.set("a", Value("é😀\n"));
  Value v = Value::dict(d);
  // json.dumps(v, ensure_ascii=False) keeps insertion order and the characters.
  EXPECT_EQ(to_json(v, false, Value::none(), Value::none(), false), "{\"b\": [1, 2.5], \"a\": \"é😀\\n\"}");
  EXPECT_EQ(to_json(v, true, Value::none(), Value::none(), true), "{\"a\": \"\\u00e9\\ud83d\\ude00\\n\", \"b\": [1, 2.5]}");
  EXPECT_EQ(to_json(v, false, Value(1), Value::none(), false), "{\n \"b\": [\n  1,\n  2.5\n ],\n \"a\": \"é😀\\n\"\n}");
  EXPECT_EQ(to_json(v, false, Value::none(), Value::list({Value(","), Value(":")}, true), false),
            "{\"b\":[1,2.5],\"a\":\"é😀\\n\"}");
  EXPECT_THROW(to_json(Value(), false, Value::none(), Value::none(), false), TemplateError);
}

TEST(JinjaPyStr, StripSplitAndCase) {
  // "\u00a0x\u3000".strip() == "x": Python strips Unicode whitespace.
  EXPECT_EQ(pystr::strip("\xc2\xa0x\xe3\x80\x80", std::nullopt, true, true), "x");
  EXPECT_EQ(pystr::strip("xxhixx", std::string("x"), true, false), "hixx");
  EXPECT_EQ(pystr::split(" a  b ", std::nullopt, -1), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(pystr::split("a,b,c", std::string(","), 1), (std::vector<std::string>{"a", "b,c"}));
  EXPECT_EQ(pystr::rsplit("a,b,c", std::string(","), 1), (std::vector<std::string>{"a,b", "c"}));
  EXPECT_EQ(pystr::splitlines("a\r\nb\nc\n", false), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(pystr::title("hello wORLD-foo"), "Hello World-Foo");
  EXPECT_EQ(pystr::upper("stra\xc3\x9f" "e"), "STRASSE");
  EXPECT_EQ(pystr::capitalize("hELLO"), "Hello");
  EXPECT_EQ(pystr::length("h\xc3\xa9llo"), 5u);
  EXPECT_EQ(pystr::slice("h\xc3\xa9llo", 1, 3, std::nullopt), "\xc3\xa9l");
  EXPECT_EQ(pystr::slice("abc", std::nullopt, std::nullopt, -1), "cba");
  EXPECT_EQ(pystr::replace("abc", "", "-", -1), "-a-b-c-");
  EXPECT_EQ(pystr::repr("it's"), "\"it's\"");
  EXPECT_EQ(pystr::repr("a\"b\n"), "'a\"b\\n'");
}

}  // namespace
}  // namespace qlora::jinja
