// The bounded JSON reader: values nested deeper than the bound and NUL bytes are refused with the
// byte offset, strings are respected by the depth count, and a message never carries a long value.
#include <gtest/gtest.h>

#include <string>

#include "core/json_read.h"
#include "expect_error.h"
#include "test_util.h"

namespace lt = longtron;
using lt::testing::expect_error;

namespace {

std::string nested(int depth, const std::string& inner = "") {
  return std::string(size_t(depth), '[') + inner + std::string(size_t(depth), ']');
}

}  // namespace

TEST(JsonRead, DepthBoundIsExact) {
  ASSERT_TRUE(lt::try_parse_json(nested(lt::kJsonMaxDepth)));
  lt::JsonProblem p;
  EXPECT_FALSE(lt::try_parse_json(nested(lt::kJsonMaxDepth + 1), &p));
  EXPECT_EQ(p.byte, size_t(lt::kJsonMaxDepth));  // the '[' that opens one level too many
  EXPECT_NE(p.what.find("nested deeper than 128"), std::string::npos) << p.what;
  // Objects count as levels too, and the limit is a parameter.
  EXPECT_TRUE(lt::try_parse_json(R"({"a": {"b": [1]}})", nullptr, 3));
  EXPECT_FALSE(lt::try_parse_json(R"({"a": {"b": [1]}})", nullptr, 2));
}

TEST(JsonRead, TwoHundredThousandLevelsAreRefusedWithAShortMessage) {
  const std::string deep = R"({"input_ids": [1], "labels": [5, )" + nested(200000) + "]}";
  try {
    lt::parse_json(deep, "rows.jsonl, line 1");
    ADD_FAILURE() << "accepted";
  } catch (const lt::Error& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), 300u) << what.substr(0, 400);
    EXPECT_NE(what.find("rows.jsonl, line 1, byte 159: "), std::string::npos) << what;
  }
}

TEST(JsonRead, BracketsInsideStringsDoNotCount) {
  const std::string text = R"({"s": ")" + std::string(1000, '[') + R"(\"[{", "t": [1, 2]})";
  const auto j = lt::try_parse_json(text);
  ASSERT_TRUE(j);
  EXPECT_EQ((*j)["t"].size(), 2u);
  EXPECT_EQ((*j)["s"].get<std::string>().size(), 1003u);
}

TEST(JsonRead, NulByteIsAnErrorAtItsOffset) {
  // nlohmann's lexer alone takes the NUL for the end of the text and returns the first object.
  const std::string line = std::string(R"({"input_ids": [5, 6]})") + '\0' + R"({"input_ids": [7]})";
  lt::JsonProblem p;
  EXPECT_FALSE(lt::try_parse_json(line, &p));
  EXPECT_EQ(p.byte, 21u);
  EXPECT_NE(p.what.find("NUL"), std::string::npos) << p.what;
  // Inside a string too.
  EXPECT_FALSE(lt::try_parse_json(std::string("[\"a") + '\0' + "b\"]", &p));
  EXPECT_EQ(p.byte, 3u);
}

TEST(JsonRead, OtherBadBytesNameTheirOffset) {
  lt::JsonProblem p;
  EXPECT_FALSE(lt::try_parse_json("[1, \x01 2]", &p));
  EXPECT_EQ(p.byte, 4u) << p.what;
  EXPECT_FALSE(lt::try_parse_json("{\"a\": \"x\ty\"}", &p));  // a raw tab inside a string
  EXPECT_EQ(p.byte, 8u) << p.what;
  EXPECT_FALSE(lt::try_parse_json("[1] [2]", &p));  // two values
  EXPECT_EQ(p.byte, 4u) << p.what;
  // nlohmann's "last read" quotes the token: a long one is cut.
  EXPECT_FALSE(lt::try_parse_json("[\"" + std::string(100000, 'x') + "\x02\"]", &p));
  EXPECT_LT(p.what.size(), 300u);
  expect_error([] { lt::parse_json("[1,]", "f.json"); }, {"f.json, byte 3: not valid JSON"});
  // Errors other than syntax (a number too large for a double) lose nlohmann's prefix too.
  EXPECT_FALSE(lt::try_parse_json("[1e999999]", &p));
  EXPECT_EQ(p.what.find("[json.exception"), std::string::npos) << p.what;
}

TEST(JsonRead, FileErrorsNameTheFile) {
  lt::testing::TempDir dir;
  expect_error([&] { lt::read_json_file(dir / "missing.json"); }, {"missing.json: cannot open"});
  lt::testing::write_file(dir / "a.json", std::string("{\"vocab_size\": 8}") + '\0' + "garbage");
  expect_error([&] { lt::read_json_file(dir / "a.json"); }, {"a.json, byte 17: ", "NUL"});
  lt::testing::write_file(dir / "b.json", " {\"vocab_size\": 8}\n");
  EXPECT_EQ(lt::read_json_file(dir / "b.json")["vocab_size"], 8);
}

TEST(JsonRead, ExcerptIsShort) {
  const auto j = lt::parse_json(nested(100, '"' + std::string(10000, '7') + '"'), "x");
  EXPECT_LE(lt::json_excerpt(j).size(), 80u + 24u);
}
